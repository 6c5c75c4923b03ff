"""The gate on synthetic JUnit files: what passes, and each thing that must block
(a failing case, a missing/skipped/empty/unstamped/narrowed required lane, an expired
quarantine, a required family without a pass, a release of a tree with uncommitted changes).
The tree being gated is a fixed stamp here; tests/reports/test_gate_adversarial.py stamps real trees."""

import datetime
import json
import shutil
import os
import subprocess
import sys
from xml.sax.saxutils import quoteattr

import pytest
import yaml

from selgate.reports.__main__ import main
from selgate.conformance.reported import names

REQUIRED = ["parity", "bounds", "policy"]
TODAY = datetime.datetime.now(datetime.timezone.utc).date()
TREE = {"commit": "4" * 40, "digest": "d" * 64, "files": 3, "untracked": [], "dirty": False}
PYTEST_CONFIG = {
    "args": [],
    "inifile": "pyproject.toml",
    "rootdir": "/src",
    "ini_addopts": [],
    "env_addopts": "",
    "autoload": False,
    "conftests": ["conftest.py"],
    "plugins": [],
}


@pytest.fixture(autouse=True)
def gated_tree(monkeypatch):
    """The gate compares each lane's stamp with TREE, the stamp of the tree it gates."""
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", lambda root: dict(TREE))


def full_selection(lane):
    """What `python -m selgate.lanes run <lane>` selects, as the stamp records it ({} for a
    lane without a YAML)."""
    from selgate.lanes.config import LANE_DIR, load_lane
    from selgate.lanes.runner import POLICY_TESTS

    base = lane.removesuffix("-emulated")
    if not (LANE_DIR / f"{base}.yaml").exists():
        return {}
    cfg = load_lane(base)
    return {
        "paths": [*cfg["paths"], POLICY_TESTS],
        "k": "",
        "m": cfg["markers"] or "",
        "size": cfg["size"],
        "deselect": [],
        "ignore": [],
        "last_failed": False,
    }


def write_lane(root, lane, cases, env=True, exitstatus=0, commit="abc123", selection=None, tree=None, inventory=None, **stamp):
    """A pytest-shaped junit.xml (+ environment.json and inventory.json) under root/lane/, as
    the lane runner leaves them. `cases`: tuples (nodeid, outcome, family, seed) with outcome
    pass/fail/error/skip/xfail. `selection` defaults to the lane's whole one, `tree` to TREE,
    `inventory` to the cases' ids; `stamp` adds or replaces environment.json keys."""
    body = {
        "pass": "",
        "fail": '<failure message="assert 1 == 2">trace</failure>',
        "error": "<error message=\"worker 'gw0' crashed\">crash</error>",
        "skip": '<skipped type="pytest.skip" message="needs a GPU" />',
        "xfail": '<skipped type="pytest.xfail" message="known" />',
    }
    xml = []
    for nodeid, outcome, family, seed in cases:
        module, name = nodeid.split("::")
        props = f'<property name="nodeid" value={quoteattr(nodeid)} /><property name="family" value="{family}" />'
        props += f'<property name="seed" value="{seed}" />' if seed is not None else ""
        xml.append(
            f'<testcase classname="{module[:-3].replace("/", ".")}" name={quoteattr(name)} time="0.1">'
            f"<properties>{props}</properties>{body[outcome]}</testcase>"
        )
    d = root / lane
    d.mkdir(parents=True)
    (d / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" tests="{len(cases)}">{"".join(xml)}</testsuite>'
        "</testsuites>"
    )
    if env:
        (d / "environment.json").write_text(
            json.dumps(
                {
                    "lane": lane,
                    "gpu": "none",
                    "capability": "none",
                    "torch": "2.13.0",
                    "triton": "3.6.0",
                    "commit": commit,
                    "capability_override": "none",
                    "tolerance_overrides": "none",
                    "pytest_exitstatus": exitstatus,
                    "selection": full_selection(lane) if selection is None else selection,
                    "tree": TREE if tree is None else tree,
                    "pytest": PYTEST_CONFIG,
                    **stamp,
                }
            )
        )
        ids = [c[0] for c in cases] if inventory is None else inventory
        (d / "inventory.json").write_text(json.dumps({"command": [], "exitstatus": 0, "ids": ids, "output": ""}))


def passing_cases(
    families=REQUIRED + ["backward", "gradcheck", "determinism", "decode", "group", "varlen", "empty_ranges", "bad_input"],
):
    return [(f"conformance/test_conformance.py::test_{f}[case0]", "pass", f, 7) for f in families]


def write_policy(tmp_path, quarantine=(), required_lanes=("cpu",)):
    path = tmp_path / "gate.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "default_profile": "merge",
                "profiles": {
                    "merge": {"required_lanes": list(required_lanes)},
                    "release": {"required_lanes": ["cpu", "sm90"], "same_commit": True},
                },
                "required_families": REQUIRED,
                "quarantine": list(quarantine),
            }
        )
    )
    return path


def run_gate(tmp_path, *extra, policy=None, command="gate") -> int:
    """`command` (the gate, or the release report) over tmp_path/res, writing tmp_path/out,
    under `policy` (default: the usual one)."""
    return main(
        [command, "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out"),
         "--policy", str(policy or write_policy(tmp_path)), *extra]
    )  # fmt: skip


def gate(tmp_path, capsys, *extra, policy=None):
    rc = run_gate(tmp_path, *extra, policy=policy)
    return rc, capsys.readouterr().out.splitlines()[0]


def test_the_report_says_why_tests_skipped_and_where_the_time_went(tmp_path, capsys):
    skipped = [(f"tests/test_x.py::test_gpu[{i}]", "skip", "harness", None) for i in range(3)]
    write_lane(tmp_path / "res", "cpu", passing_cases() + skipped)
    assert run_gate(tmp_path) == 0, capsys.readouterr().out
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Skips, by reason" in text and "- cpu: 3 of 14 tests skipped (21 %)\n  - 3 x needs a GPU" in text
    # write_lane records 0.1 s a test: 14 tests, 1.4 test-seconds, the harness's three 0.3 s
    assert "## Durations" in text and "- cpu: 1.4 test-seconds in 14 tests; most in harness 0.3 s, parity 0.1 s" in text
    assert "  - 0.1 s `conformance/test_conformance.py::test_parity[case0]`" in text


def test_all_required_results_pass(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases() + [("tests/test_x.py::test_gpu", "skip", "harness", None)])
    rc, line = gate(tmp_path, capsys)
    assert (rc, line) == (0, "GATE PASSED: required lanes cpu")
    assert (tmp_path / "out" / "report.md").exists() and (tmp_path / "out" / "merged.xml").exists()


def test_a_failing_case_blocks_and_is_named(tmp_path, capsys):
    cases = passing_cases() + [("conformance/test_conformance.py::test_parity[fp16-case3]", "fail", "parity", 3)]
    write_lane(tmp_path / "res", "cpu", cases)
    rc, line = gate(tmp_path, capsys)
    assert rc == 1
    assert line == (
        "GATE BLOCKED: lane cpu: FAIL conformance/test_conformance.py::test_parity[fp16-case3] (seed 3): assert 1 == 2"
    )


def test_a_crashed_case_blocks(tmp_path, capsys):
    write_lane(
        tmp_path / "res", "cpu", passing_cases() + [("conformance/test_conformance.py::test_oob", "error", "bounds", None)]
    )
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and "ERROR conformance/test_conformance.py::test_oob" in line


def test_a_failure_in_a_present_optional_lane_blocks(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    write_lane(tmp_path / "res", "sm90", [("conformance/test_conformance.py::test_bf16", "fail", "dtype", 1)])
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: lane sm90: FAIL conformance/test_conformance.py::test_bf16")


def test_a_missing_required_lane_blocks(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    rc, line = gate(tmp_path, capsys, "--profile", "release")
    assert rc == 1
    assert line.startswith("GATE BLOCKED: required lane sm90 missing: no sm90/junit.xml")


def test_lanes_flag_replaces_the_default_profile_and_adds_to_a_release(tmp_path, capsys):
    """`--lanes sm90` gates the lane bin/gate ran on a GPU host; `--lanes cpu` under the release
    profile dropped sm90 from what a release requires: it adds to it instead."""
    write_lane(tmp_path / "res", "cpu", passing_cases())
    write_lane(tmp_path / "res", "sm90", passing_cases() + passing_cases(["dtype"]))
    rc, line = gate(tmp_path, capsys, "--lanes", "sm90")
    assert (rc, line) == (0, "GATE PASSED: required lanes sm90")
    rc, line = gate(tmp_path, capsys, "--profile", "release", "--lanes", "cpu")
    assert (rc, line) == (0, "GATE PASSED: required lanes cpu, sm90")
    shutil.rmtree(tmp_path / "res" / "sm90")
    rc, line = gate(tmp_path, capsys, "--profile", "release", "--lanes", "cpu")
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane sm90 missing"), line


@pytest.mark.parametrize(
    "cases,env,exitstatus,expected",
    [
        ([], True, 5, "required lane cpu empty"),
        ([("conformance/test_conformance.py::test_p", "skip", "parity", None)], True, 0, "required lane cpu skipped: all 1"),
        (passing_cases(), False, 0, "required lane cpu unstamped"),
        (passing_cases(), True, 2, "required lane cpu aborted: pytest exit 2 (interrupted)"),
        (passing_cases(REQUIRED[:-1]), True, 0, "required lane cpu: family policy has no passing test"),
    ],
)
def test_a_lane_without_evidence_blocks(tmp_path, capsys, cases, env, exitstatus, expected):
    write_lane(tmp_path / "res", "cpu", cases, env=env, exitstatus=exitstatus)
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: {expected}"), line


@pytest.mark.parametrize(
    "cut, expected",
    [
        (
            {"signal": "SIGTERM", "reason": "KeyboardInterrupt", "tests_done": 812, "tests_collected": 3941},
            "required lane cpu cut short by SIGTERM after 812 of 3941 tests (20 %)",
        ),
        (
            {"signal": None, "reason": "maximum crashed workers reached: 20", "tests_done": 5, "tests_collected": 0},
            "required lane cpu cut short (maximum crashed workers reached: 20) after 5 of 0 tests: its JUnit",
        ),
    ],
)
def test_a_cut_run_blocks_naming_what_cut_it_and_how_far_it_got(tmp_path, capsys, cut, expected):
    write_lane(tmp_path / "res", "cpu", passing_cases(), exitstatus=2, cut=cut)
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: {expected}"), line


def test_results_written_by_another_lane_block(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    env = tmp_path / "res" / "cpu" / "environment.json"
    env.write_text(env.read_text().replace('"lane": "cpu"', '"lane": "sm90"'))
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu foreign:") and "'sm90'" in line, line


def _quarantine(expires, test="conformance/test_conformance.py::test_parity[fp16-*]", lanes=("cpu",)):
    return {"test": test, "owner": "kernels-team", "reason": "fp16 drift, #12", "expires": expires, "lanes": list(lanes)}


def test_a_live_quarantine_lets_its_failure_through(tmp_path, capsys):
    cases = passing_cases() + [("conformance/test_conformance.py::test_parity[fp16-case3]", "fail", "parity", 3)]
    write_lane(tmp_path / "res", "cpu", cases)
    policy = write_policy(tmp_path, [_quarantine(TODAY + datetime.timedelta(days=7))])
    rc, line = gate(tmp_path, capsys, policy=policy)
    assert rc == 0, line
    assert "owner kernels-team" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize(
    "failing, entry",
    [
        ("conformance/test_conformance.py::test_bounds[fp16-case3]", {}),  # another test than the entry names
        ("conformance/test_conformance.py::test_parity[fp16-case3]", {"lanes": ["sm90"]}),  # the entry covers sm90 only
        ("conformance/test_conformance.py::test_parity[sdpa-case3]", {}),  # another implementation
    ],
)
def test_a_quarantine_lets_through_only_what_it_names(tmp_path, capsys, failing, entry):
    family = failing.split("test_")[1].split(".")[0]
    write_lane(tmp_path / "res", "cpu", passing_cases() + [(failing, "fail", family, 3)])
    policy = write_policy(tmp_path, [{**_quarantine(TODAY + datetime.timedelta(days=7)), **entry}])
    rc, line = gate(tmp_path, capsys, policy=policy)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: lane cpu: FAIL {failing}"), line


def test_an_expired_quarantine_blocks_even_with_every_test_passing(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    policy = write_policy(tmp_path, [_quarantine(TODAY - datetime.timedelta(days=1))])
    rc, line = gate(tmp_path, capsys, policy=policy)
    assert rc == 1
    assert line.startswith(
        "GATE BLOCKED: quarantine of conformance/test_conformance.py::test_parity[fp16-*] (owner kernels-team) expired on"
    )


def test_a_quarantine_entry_without_owner_is_a_policy_error(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    entry = _quarantine(TODAY)
    del entry["owner"]
    rc = run_gate(tmp_path, policy=write_policy(tmp_path, [entry]))
    assert rc == 2
    assert "quarantine[0] ('conformance/test_conformance.py::test_parity[fp16-*]'): missing ['owner']" in capsys.readouterr().err


def test_the_shipped_policy_requires_known_families_and_the_cpu_lane_for_merges():
    from selgate.reports.gate import load_policy, required_lanes

    policy = load_policy()
    assert set(policy["required_families"]) <= set(names())
    assert required_lanes(policy, None, None) == ["cpu"]
    assert required_lanes(policy, "release", None) == ["cpu", "sm90"]


def test_a_collection_error_blocks_under_its_module_path(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    junit = tmp_path / "res" / "cpu" / "junit.xml"
    junit.write_text(
        junit.read_text().replace(
            "</testsuite>",
            '<testcase classname="" name="tests.lanes.test_docker_backend" time="0.0">'
            '<error message="collection failure">ImportError</error></testcase></testsuite>',
        )
    )
    rc, line = gate(tmp_path, capsys)
    assert (rc, line) == (1, "GATE BLOCKED: lane cpu: ERROR tests/lanes/test_docker_backend.py: collection failure")


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"k": "cuda and not compile"}, "-k 'cuda and not compile'"),
        ({"paths": ["tests"]}, "paths without ['conformance', 'lanes/test_lane_policy.py']"),
        ({"m": "not slow and not docker"}, "-m 'not slow and not docker' where the lane has 'not slow'"),
        ({"size": None}, "--size None where the lane has tiny"),
        ({"deselect": ["tests/test_x.py::test_y"]}, "--deselect ['tests/test_x.py::test_y']"),
        ({"last_failed": True}, "--lf"),
    ],
)
def test_a_narrowed_run_cannot_stand_in_for_its_lane(tmp_path, capsys, change, expected):
    write_lane(tmp_path / "res", "cpu", passing_cases(), selection={**full_selection("cpu"), **change})
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: required lane cpu narrowed: run with {expected}"), line


def test_a_wider_run_counts_when_it_ran_the_lanes_inventory(tmp_path, capsys):
    wider = {**full_selection("cpu"), "size": "small", "paths": ["tests", "conformance", "lanes", "docs"]}
    write_lane(tmp_path / "res", "cpu", passing_cases(), selection=wider)
    assert gate(tmp_path, capsys) == (0, "GATE PASSED: required lanes cpu")
    env = tmp_path / "res" / "cpu" / "environment.json"
    env.write_text(json.dumps({k: v for k, v in json.loads(env.read_text()).items() if k != "selection"}))
    rc, line = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu narrowed: run with paths without"), line


@pytest.mark.parametrize(
    "tree, dirty, blocked",
    [
        (TREE, False, None),
        ({**TREE, "commit": "5" * 40}, False, f"required lane sm90 ran commit {'5' * 40}, this tree is commit"),
        (TREE, True, "the tree being gated has uncommitted changes"),
    ],
)
def test_a_release_gates_one_committed_tree(tmp_path, capsys, monkeypatch, tree, dirty, blocked):
    write_lane(tmp_path / "res", "cpu", passing_cases() + passing_cases(["dtype"]))
    write_lane(tmp_path / "res", "sm90", passing_cases() + passing_cases(["dtype"]), tree=tree)
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", lambda root: {**TREE, "dirty": dirty})
    rc = run_gate(tmp_path, command="release")
    line = capsys.readouterr().out.splitlines()[0]
    if blocked:
        assert rc == 1 and line.startswith(f"GATE BLOCKED: {blocked}"), line
    else:
        assert rc == 0, line
    assert gate(tmp_path, capsys, "--lanes", "cpu")[0] == 0  # a merge may gate a work tree it ran


def test_the_stamp_records_what_the_run_selected(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_one(): pass\ndef test_two(): pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -m 'not slow'\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "selgate.reports.stamp",
            "-p",
            "no:cacheprovider",
            "--junitxml",
            "out/junit.xml",
            "-k",
            "one",
            "./test_a.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "SELGATE_LANE", "PYTEST_ADDOPTS"))},
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    stamp = json.loads((tmp_path / "out" / "environment.json").read_text())
    selection = {k: v for k, v in stamp["selection"].items() if k != "size"}  # --size: where the matrix's plugin is installed
    assert selection == {
        "paths": ["test_a.py"],
        "k": "one",
        "m": "not slow",
        "impl": None,
        "deselect": [],
        "ignore": [],
        "last_failed": False,
    }
    assert stamp["pytest"]["inifile"] == "pytest.ini" and stamp["pytest"]["ini_addopts"] == ["-m", "not slow"]
    assert stamp["pytest"]["args"][-3:] == ["-k", "one", "./test_a.py"]
    assert len(stamp["tree"]["digest"]) == 64 and not (tmp_path / "out" / "inventory.json").exists()


@pytest.mark.parametrize("name, text", [("junit.xml", "<testsuites><testsuite"), ("environment.json", "{lane: cpu")])
def test_a_results_file_that_does_not_parse_is_named(tmp_path, capsys, name, text):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    (tmp_path / "res" / "cpu" / name).write_text(text)
    rc = run_gate(tmp_path)
    err = capsys.readouterr().err
    assert rc == 2 and f"{tmp_path / 'res' / 'cpu' / name}: not " in err, err
