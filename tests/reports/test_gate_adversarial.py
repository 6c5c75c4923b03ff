"""The gate tried as an adversary would: each way found to make it say PASSED wrongly is a
case here that must end BLOCKED or in a clear error (exit 2) naming the cause. The next
way around the gate is added as a case, beside the harness's own self-test.

Results are synthetic (tests/reports/test_reports_gate.py's helpers) except where the attempt is
the tree itself: those stamp a small git repository for real."""

import datetime
import json
import shutil
import os
import subprocess
import sys

import pytest
import torch
import yaml

from selgate.conformance import tolerances
from selgate.lanes import __main__ as lanes_main
from selgate.lanes import runner
from selgate.lanes.pytest_command import pytest_args
from selgate.lanes.config import load_lane
from selgate import tree as tree_mod

from tests.reports.test_reports_gate import (
    TODAY,
    TREE,
    full_selection,
    gated_tree,  # noqa: F401 (fixture)
    passing_cases,  # noqa: F401 (fixture)
    run_gate,
    write_lane,
    write_policy,
)

TRITON = [(f"conformance/test_conformance.py::test_parity[triton-case{i}]", "pass", "parity", i) for i in range(3)]


def gate_lines(tmp_path, capsys, *extra, policy=None):
    """(exit status, headline, every blocking line of the report)."""
    rc = run_gate(tmp_path, *extra, policy=policy)
    out = capsys.readouterr()
    report = (tmp_path / "out" / "report.md").read_text() if (tmp_path / "out" / "report.md").exists() else ""
    blocking = report.split("## Blocking", 1)[-1].split("##", 1)[0] if report else ""
    return rc, (out.out.splitlines() or [""])[0], blocking, out.err


def git(repo, *args):
    subprocess.run(
        ["git", "-c", "user.email=gate@example.invalid", "-c", "user.name=gate", *args], cwd=repo, check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A committed tree of one module and a pyproject.toml; stamps name their commit from git."""
    for name in ("SELGATE_COMMIT", "GITHUB_SHA"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "repo"
    (path / "pkg").mkdir(parents=True)
    (path / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "one")
    return path


# Stale results -----------------------------------------------------------------------------


def test_a_lane_refusing_its_argument_leaves_no_stale_pass(tmp_path, capsys, monkeypatch):
    """`lanes run cpu --workers 0` (or past the most) after a good run: the old results are gone
    before the argument is refused, and the note it leaves blocks the gate by name."""
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "res")
    for refused in ("0", "99999999999999999999"):
        shutil.rmtree(tmp_path / "res", ignore_errors=True)
        write_lane(tmp_path / "res", "cpu", passing_cases())
        assert lanes_main.main(["run", "cpu", "--workers", refused]) == 2
        assert (
            f"--workers: expected >= 1 (a crashing test needs a worker to die in) and at most 1024 (each is a process), "
            f"got {refused}" in capsys.readouterr().err
        )
        assert sorted(p.name for p in (tmp_path / "res" / "cpu").iterdir()) == ["refused.json"]
        rc, line, _, _ = gate_lines(tmp_path, capsys)
        assert rc == 1 and line.startswith(
            "GATE BLOCKED: required lane cpu never ran: the lane runner refused it (--workers: expected >= 1"
        ), line


def test_results_of_the_previous_commit_block_a_merge(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree={**TREE, "commit": "5" * 40})
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith(
        f"GATE BLOCKED: required lane cpu ran commit {'5' * 40}, this tree is commit {TREE['commit']}"
    ), line


def test_results_without_a_tree_stamp_block(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree={})
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu has no tree stamp"), line


# Narrowed selections ----------------------------------------------------------------------


def test_an_impl_narrowed_run_blocks_naming_what_it_left_out(tmp_path, capsys):
    """`lanes run cpu -- --impl sdpa`: the recorded --impl and the missing Triton results
    both block; the inventory line names the family and implementation left out."""
    sdpa = [(c[0].replace("[", "[sdpa-"), *c[1:]) for c in passing_cases()]
    write_lane(
        tmp_path / "res",
        "cpu",
        sdpa,
        selection={**full_selection("cpu"), "impl": "sdpa"},
        inventory=[c[0] for c in sdpa + TRITON],
    )
    rc, line, blocking, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu narrowed: run with --impl sdpa"), line
    assert (
        "required lane cpu ran another set than its selection collects: 3 without a result "
        "(parity/triton 3; e.g. conformance/test_conformance.py::test_parity[triton-case0])"
    ) in blocking


def test_a_narrowing_no_option_records_still_blocks_on_the_inventory(tmp_path, capsys):
    """A plugin or addopts that deselects leaves no trace in the recorded options: the
    inventory, collected apart from the run, still names what is missing."""
    write_lane(tmp_path / "res", "cpu", passing_cases(), inventory=[c[0] for c in passing_cases() + TRITON])
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith(
        "GATE BLOCKED: required lane cpu ran another set than its selection collects: 3 without a result (parity/triton 3;"
    ), line


@pytest.mark.parametrize(
    "inventory, expected",
    [
        (None, "required lane cpu has no inventory.json"),
        (
            {"command": [], "exitstatus": 2, "ids": [], "output": "ERROR collecting conformance/test_conformance.py"},
            "required lane cpu: collecting its inventory failed (pytest exit 2): ERROR collecting",
        ),
    ],
)
def test_a_run_without_a_usable_inventory_blocks(tmp_path, capsys, inventory, expected):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = tmp_path / "res" / "cpu" / "inventory.json"
    path.unlink() if inventory is None else path.write_text(json.dumps(inventory))
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: {expected}"), line


def test_the_stamp_records_impl_and_the_runner_names_its_plugins_and_configuration(tmp_path, monkeypatch):
    """The effective --impl reaches environment.json; a lane's pytest autoloads no plugin,
    reads pyproject.toml whatever pytest.ini lies beside it, and ignores PYTEST_ADDOPTS."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k nothing")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *pytest_args(plugins=runner.lane_plugins(("selgate.reports.stamp",)), config=()),
            *runner.CONFIG_ARGS,
            "--collect-only",
            "-q",
            "--impl",
            "sdpa",
            "--junitxml",
            str(tmp_path / "junit.xml"),
            "conformance/test_conformance.py",
        ],
        cwd=runner.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=runner.run_env({}),
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    stamp = json.loads((tmp_path / "environment.json").read_text())
    assert stamp["selection"]["impl"] == "sdpa" and "--impl" in stamp["pytest"]["args"]
    assert stamp["pytest"]["inifile"] == "pyproject.toml" and stamp["pytest"]["autoload"] is False
    assert stamp["pytest"]["env_addopts"] == ""  # the runner's environment drops PYTEST_ADDOPTS
    args = runner.plan_lane(load_lane("cpu"), capability=None).pytest_args
    assert args[args.index("-c") + 1] == "pyproject.toml" and "xdist.plugin" in args and "pytest_timeout" in args


def test_an_untracked_pytest_ini_changes_the_stamp_and_blocks(repo, tmp_path, capsys, monkeypatch):
    clean = tree_mod.tree_stamp(repo)
    (repo / "pytest.ini").write_text("[pytest]\naddopts = --impl sdpa\n")
    dirty = tree_mod.tree_stamp(repo)
    assert dirty["digest"] != clean["digest"] and tree_mod.untracked_config(dirty) == ["pytest.ini"]
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree=dirty)
    rc, line, _, _ = gate_lines(tmp_path, capsys, "--tree", str(repo))
    assert rc == 1 and line.startswith(
        "GATE BLOCKED: required lane cpu ran with untracked pytest configuration ['pytest.ini']"
    ), line


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"inifile": "pytest.ini"}, "required lane cpu read its pytest configuration from 'pytest.ini'"),
        ({"env_addopts": "--impl sdpa"}, "required lane cpu ran under PYTEST_ADDOPTS='--impl sdpa'"),
        ({"autoload": True}, "required lane cpu ran with pytest plugin autoloading on"),
    ],
)
def test_a_run_under_another_pytest_configuration_blocks(tmp_path, capsys, change, expected):
    from tests.reports.test_reports_gate import PYTEST_CONFIG

    write_lane(tmp_path / "res", "cpu", passing_cases(), pytest={**PYTEST_CONFIG, **change})
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: {expected}"), line


# Tolerances --------------------------------------------------------------------------------

LOOSE = "{fp32: {o: {max_abs: 5.0e-4, mean_abs: 5.0e-4}}}"


def test_tolerances_from_the_environment_are_refused_by_the_lane(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "res")
    monkeypatch.setenv(tolerances.ENV, LOOSE)
    assert lanes_main.main(["run", "cpu"]) == 2
    assert f"{tolerances.ENV}: set in the environment" in capsys.readouterr().err
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu never ran"), line


def test_tolerances_a_run_took_from_elsewhere_block_at_the_gate(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases(), tolerance_overrides=LOOSE)
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith(
        f"GATE BLOCKED: required lane cpu ran with {tolerances.ENV}={LOOSE!r}, its lane YAML gives 'none'"
    ), line


@pytest.mark.parametrize(
    "raw",
    [
        "{fp32: {max_abs: .nan}}",
        "{fp32: {o: {mean_abs: .inf}}}",
        "{fp16: {grad: {factor: -3}}}",
        "{fp32: {max_abs: true}}",
        "{fp32: {max_abs: '1e-3'}}",
    ],
)
def test_a_non_finite_negative_or_non_numeric_bound_is_an_error(raw, monkeypatch):
    monkeypatch.setenv(tolerances.ENV, raw)
    with pytest.raises(ValueError, match=rf"{tolerances.ENV}: fp\d+\.\w+(\.\w+)?: expected a finite number >= 0"):
        tolerances.tolerance(torch.float32, "o")


def test_a_nan_bound_in_a_lane_yaml_is_an_error(tmp_path):
    lane = yaml.safe_load((runner.LANE_DIR / "cpu.yaml").read_text())
    text = yaml.safe_dump(lane).replace(
        "tolerance_overrides: {}", "tolerance_overrides: {fp32: {max_abs: .nan, reason: r, measured: 1.0e-5}}"
    )
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"tolerance_overrides: .*fp32.max_abs: expected a finite number >= 0"):
        load_lane("x", tmp_path)


# Evidence from another tree ---------------------------------------------------------------


def test_a_commit_prefix_is_not_a_commit(tmp_path, capsys):
    """A stamp of "4" once matched any commit starting with 4."""
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree={**TREE, "commit": "4"})
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu names commit '4', not a full commit id"), line


def test_evidence_of_an_older_commit_blocks_a_release_of_head(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    old = tree_mod.tree_stamp(repo)
    cases = passing_cases() + passing_cases(["dtype"])
    for lane in ("cpu", "sm90"):
        write_lane(tmp_path / "res", lane, cases, tree=old)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    git(repo, "commit", "-q", "-am", "two")
    rc = run_gate(tmp_path, "--tree", str(repo), command="release")
    line = capsys.readouterr().out.splitlines()[0]
    assert rc == 1 and line.startswith(f"GATE BLOCKED: required lane cpu ran commit {old['commit']}, this tree is commit "), line
    text = (tmp_path / "out" / "release.md").read_text()
    assert "required lane sm90 ran other files than this tree has" in text


def test_the_same_commit_with_an_uncommitted_change_is_another_tree(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree=tree_mod.tree_stamp(repo))
    assert gate_lines(tmp_path, capsys, "--tree", str(repo))[0] == 0
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 3\n")
    rc, line, _, _ = gate_lines(tmp_path, capsys, "--tree", str(repo))
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu ran other files than this tree has"), line


def test_a_tree_that_names_no_commit_cannot_be_gated(tmp_path, capsys, monkeypatch):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", lambda root: {**TREE, "commit": "unknown"})
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: the tree being gated names no full commit ('unknown')"), line


# Quarantine -------------------------------------------------------------------------------


def _entry(**change):
    entry = {
        "test": "conformance/test_conformance.py::test_parity[triton-*]",
        "owner": "kernels-team",
        "reason": "fp32 drift on the interpreter, #12",
        "expires": TODAY + datetime.timedelta(days=7),
        "lanes": ["cpu"],
    }
    return {k: v for k, v in {**entry, **change}.items() if v is not ...}


@pytest.mark.parametrize(
    "entry, expected",
    [
        (_entry(test="*"), "test: expected a pytest node id"),
        (_entry(test="conformance/test_conformance.py::*"), "test: a pattern may cover one family and one implementation"),
        (_entry(test="conformance/test_conformance.py::test_parity[*]"), "a pattern may cover one family and one implementation"),
        (_entry(test="conformance/test_*.py::test_parity[triton-*]"), "a pattern may cover one family"),
        (_entry(test="conformance/test_conformance.py::test_parity[tri*-*]"), "a pattern may cover one family"),
        (_entry(test="tests/test_x.py::*"), "a pattern may cover one family and one implementation"),
        (_entry(expires=datetime.date(9999, 12, 31)), "expires: at most 30 days ahead"),
        (_entry(lanes="xcpux"), "lanes: expected a list of lanes among"),
        (_entry(lanes=["xcpux"]), "lanes: expected a list of lanes among"),
        (_entry(test=5), "test: expected a pytest node id (path::name), got 5"),
        (_entry(lanes=None), "missing ['lanes']"),
        (_entry(owner=...), "missing ['owner']"),
        (_entry(reason="flaky"), "reason: expected a link to the tracked problem"),
        (_entry(extra="x"), "unknown ['extra']"),
        ("conformance/test_conformance.py::test_parity[triton-case0]", "quarantine[0]: expected a mapping"),
    ],
)
def test_a_quarantine_entry_outside_the_guard_rails_is_a_policy_error(tmp_path, capsys, entry, expected):
    write_lane(tmp_path / "res", "cpu", passing_cases() + [TRITON[0][:1] + ("fail", "parity", 0)])
    rc, _, _, err = gate_lines(tmp_path, capsys, policy=write_policy(tmp_path, [entry]))
    assert rc == 2 and "quarantine[0]" in err and expected in err, err
    assert "Traceback" not in err


def test_a_narrow_quarantine_still_lets_its_own_failure_through(tmp_path, capsys):
    """The guard rails leave the legitimate use: one implementation's cases of one family."""
    write_lane(tmp_path / "res", "cpu", passing_cases() + [TRITON[0][:1] + ("fail", "parity", 0)])
    rc, line, _, _ = gate_lines(tmp_path, capsys, policy=write_policy(tmp_path, [_entry()]))
    assert (rc, line) == (0, "GATE PASSED: required lanes cpu")


@pytest.mark.parametrize("lanes", [[], None, "cpu"])
def test_a_profile_requiring_no_lane_is_a_policy_error(tmp_path, capsys, lanes):
    path = write_policy(tmp_path)
    policy = yaml.safe_load(path.read_text())
    policy["profiles"]["merge"]["required_lanes"] = lanes
    path.write_text(yaml.safe_dump(policy))
    (tmp_path / "res").mkdir()
    rc, _, _, err = gate_lines(tmp_path, capsys, policy=path)
    assert rc == 2 and "profiles.merge.required_lanes: expected a non-empty list" in err, err


def test_the_shipped_policy_and_lanes_pass_their_own_validation():
    from selgate.reports.gate import load_policy

    policy = load_policy()
    assert all(p["required_lanes"] for p in policy["profiles"].values())
    assert os.path.exists(runner.ROOT / ".github" / "CODEOWNERS")
    owned = (runner.ROOT / ".github" / "CODEOWNERS").read_text()
    assert all(path in owned for path in ("/reports/gate.yaml", "/lanes/*.yaml", "/conformance/tolerances.py"))
