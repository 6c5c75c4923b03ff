"""The gate holds a lane's results to the run's own account of itself: pytest's exit status
must agree with the JUnit (a quarantined failure is the one reason to pass on exit 1), a
result counts only for a lane that has a lane YAML, and committed evidence (a junit.xml.gz)
must match the plain-text manifest reviewed beside it. Each case here ended GATE PASSED
before the gate checked it."""

import datetime
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from selgate.reports.results import MANIFEST_FILE, load_lane, manifest_mismatch, manifest_text, write_manifests

from tests.reports.test_reports_gate import (
    TODAY,
    gated_tree,  # noqa: F401 (fixture)
    passing_cases,
    run_gate,
    write_lane,
    write_policy,
)

ROOT = Path(__file__).resolve().parents[2]
FAILING = ("conformance/test_conformance.py::test_parity[triton-case0]", "fail", "parity", 0)
QUARANTINE = {
    "test": "conformance/test_conformance.py::test_parity[triton-*]",
    "owner": "kernels-team",
    "reason": "fp32 drift on the interpreter, #12",
    "expires": TODAY + datetime.timedelta(days=7),
    "lanes": ["cpu"],
}


def gate(tmp_path, capsys, *extra, policy=None):
    """(exit status, headline, the report's text)."""
    rc = run_gate(tmp_path, *extra, policy=policy)
    out = capsys.readouterr().out.splitlines()
    report = tmp_path / "out" / "report.md"
    return rc, (out or [""])[0], report.read_text() if report.exists() else ""


def state_counts(lane_dir: Path, failures: int, errors: int = 0) -> None:
    """Give the JUnit's suite the failures and errors attributes pytest writes."""
    junit = lane_dir / "junit.xml"
    junit.write_text(
        junit.read_text().replace(
            '<testsuite name="pytest"', f'<testsuite name="pytest" failures="{failures}" errors="{errors}"', 1
        )
    )


# A lane without a lane YAML ------------------------------------------------------------------


@pytest.mark.parametrize("lane, yaml_name", [("adhoc", "adhoc"), ("adhoc-emulated", "adhoc")])
def test_a_lane_without_a_lane_yaml_blocks_naming_it(tmp_path, capsys, lane, yaml_name):
    """`--lanes adhoc`: the stamp's default lane name has no YAML, so no selection or inventory
    to hold the run to; a hand-picked run passed."""
    write_lane(tmp_path / "res", lane, passing_cases())
    rc, line, _ = gate(tmp_path, capsys, "--lanes", lane)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: required lane {lane} has no lane YAML (lanes/{yaml_name}.yaml)"), line


def test_an_emulated_lane_counts_as_its_lane_yaml(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu-emulated", passing_cases())
    _, _, report = gate(tmp_path, capsys, "--lanes", "cpu-emulated")
    assert "has no lane YAML" not in report


# pytest's exit status ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, expected",
    [
        (1, "required lane cpu: pytest exit 1 (tests failed), but "),
        (5, "required lane cpu: pytest exit 5 (no tests collected)"),
        (7, "required lane cpu: pytest exit 7 (not a pytest exit status)"),
        (True, "required lane cpu: pytest exit True (not an exit status)"),
        ("0", "required lane cpu: pytest exit '0' (not an exit status)"),
        (None, "required lane cpu recorded no pytest exit status"),
    ],
)
def test_an_exit_status_other_than_0_blocks_a_passing_junit(tmp_path, capsys, status, expected):
    """pytest said "283 failed" (exit 1) while its JUnit was rewritten to show every test
    passing: the status blocks, by its number."""
    write_lane(tmp_path / "res", "cpu", passing_cases(), exitstatus=status)
    if status is None:
        env = tmp_path / "res" / "cpu" / "environment.json"
        env.write_text(json.dumps({k: v for k, v in json.loads(env.read_text()).items() if k != "pytest_exitstatus"}))
    rc, line, _ = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith(f"GATE BLOCKED: {expected}"), line


def test_exit_1_on_quarantined_failures_alone_passes(tmp_path, capsys):
    """pytest exits 1 when a quarantined test fails: the gate passes when every failure is
    covered and the JUnit's stated counts are the failures it holds."""
    write_lane(tmp_path / "res", "cpu", passing_cases() + [FAILING], exitstatus=1)
    state_counts(tmp_path / "res" / "cpu", 1)
    rc, line, _ = gate(tmp_path, capsys, policy=write_policy(tmp_path, [QUARANTINE]))
    assert (rc, line) == (0, "GATE PASSED: required lanes cpu")


def test_exit_1_with_a_failure_outside_quarantine_blocks_naming_it(tmp_path, capsys):
    other = ("conformance/test_conformance.py::test_parity[sdpa-case0]", "fail", "parity", 0)
    write_lane(tmp_path / "res", "cpu", passing_cases() + [FAILING, other], exitstatus=1)
    state_counts(tmp_path / "res" / "cpu", 2)
    rc, line, _ = gate(tmp_path, capsys, policy=write_policy(tmp_path, [QUARANTINE]))
    assert rc == 1 and line.startswith(f"GATE BLOCKED: lane cpu: FAIL {other[0]}"), line


@pytest.mark.parametrize(
    "failures, errors, stated",
    [(283, 0, "states 283 failures and 0 errors"), (1, 4, "states 1 failures and 4 errors"), (None, None, "states no counts")],
)
def test_exit_1_with_counts_the_junit_does_not_hold_blocks(tmp_path, capsys, failures, errors, stated):
    """A JUnit edited to keep only a quarantined failure of many: its suite still states what
    pytest counted, and the gate compares that with the test cases it holds."""
    write_lane(tmp_path / "res", "cpu", passing_cases() + [FAILING], exitstatus=1)
    if failures is not None:
        state_counts(tmp_path / "res" / "cpu", failures, errors)
    rc, line, _ = gate(tmp_path, capsys, policy=write_policy(tmp_path, [QUARANTINE]))
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu: pytest exit 1 (tests failed), and "), line
    assert f"{stated} where its test cases hold 1 failures and 0 errors" in line


def test_the_counts_pytest_writes_agree_with_its_test_cases(tmp_path):
    """No false alarm on a real JUnit: a failure with a teardown error, a setup error, a strict
    xpass and a collection error, each counted as pytest states them."""
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken_teardown():\n    yield\n    raise RuntimeError('teardown')\n"
        "@pytest.fixture\n"
        "def broken_setup():\n    raise RuntimeError('setup')\n"
        "def test_pass(): pass\n"
        "def test_fail(): assert 0\n"
        "def test_fail_then_teardown(broken_teardown): assert 0\n"
        "def test_setup(broken_setup): pass\n"
        "@pytest.mark.xfail(strict=True)\n"
        "def test_xpass(): pass\n"
    )
    (tmp_path / "test_b.py").write_text("import no_such_module\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "--junitxml",
            "out/lane/junit.xml",
            "test_a.py",
            "test_b.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (1, 2), proc.stdout[-2000:]
    lane = load_lane("lane", tmp_path / "out" / "lane")
    assert lane.headers == lane.elements and lane.elements["failures"] >= 3 and lane.elements["errors"] >= 3, lane.elements


def test_an_empty_run_blocks_as_empty_whatever_its_status(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", [], exitstatus=5)
    rc, line, report = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu empty"), line


# Committed evidence and its manifest -----------------------------------------------------------


def pack(lane_dir: Path) -> Path:
    """The lane's junit.xml as committed evidence keeps it (gzip), with its manifest and its
    inventory packed (the gate reads the packed one)."""
    plain = lane_dir / "junit.xml"
    packed = plain.with_name("junit.xml.gz")
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    plain.unlink()
    assert write_manifests([lane_dir.parent]) == [lane_dir / MANIFEST_FILE, lane_dir / "inventory.json.gz"]
    assert not (lane_dir / "inventory.json").exists()
    return packed


def test_the_committed_evidence_matches_its_manifests():
    packed = sorted((ROOT / "evidence").rglob("junit.xml.gz"))
    assert packed, "expected committed junit.xml.gz evidence"
    for junit in packed:
        lane = load_lane(junit.parent.name, junit.parent)
        assert lane.manifest is None, lane.manifest
        text = (junit.parent / MANIFEST_FILE).read_text()
        assert text == manifest_text(junit, lane.cases) and len(text.encode()) < 1 << 20
    owners = (ROOT / ".github" / "CODEOWNERS").read_text().split()
    assert owners[owners.index("/evidence/") + 1] == "@selgate/gate-owners"


def test_committed_evidence_passes_with_its_manifest(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    pack(tmp_path / "res" / "cpu")
    assert gate(tmp_path, capsys)[:2] == (0, "GATE PASSED: required lanes cpu")


def test_a_hand_edited_gz_blocks_naming_its_manifest(tmp_path, capsys):
    """An outcome changed inside the gz, where a diff shows nothing: the manifest reviewed
    beside it no longer matches."""
    write_lane(tmp_path / "res", "cpu", passing_cases() + [FAILING])
    packed = pack(tmp_path / "res" / "cpu")
    text = gzip.decompress(packed.read_bytes()).decode()
    packed.write_bytes(gzip.compress(text.replace('<failure message="assert 1 == 2">trace</failure>', "").encode(), mtime=0))
    rc, line, _ = gate(tmp_path, capsys)
    manifest = tmp_path / "res" / "cpu" / MANIFEST_FILE
    assert rc == 1 and line.startswith(f"GATE BLOCKED: lane cpu: committed evidence {manifest} does not match junit.xml.gz"), line


def test_a_manifest_edited_to_match_an_edited_gz_still_names_the_change(tmp_path):
    """Both edited together: the change is in the plain-text diff, which CODEOWNERS sends to
    the gate owners; the line list alone must also equal the gz's, digest aside."""
    write_lane(tmp_path / "res", "cpu", passing_cases() + [FAILING])
    packed = pack(tmp_path / "res" / "cpu")
    manifest = packed.with_name(MANIFEST_FILE)
    name = FAILING[0].partition("::")[2]  # under its file's `## file` line
    manifest.write_text(manifest.read_text().replace(f"fail {name}\n", f"pass {name}\n"))
    lane = load_lane("cpu", packed.parent)
    assert f"1 lines of the gz missing, 1 not in it (e.g. 'fail {FAILING[0]}')" in manifest_mismatch(packed, lane.cases)


def test_only_the_inventory_is_read_packed(tmp_path, capsys):
    """Committed evidence packs its inventory, and the gate reads it packed; an environment stamp
    left packed beside a run that wrote none is not read: the run blocks as unstamped."""
    write_lane(tmp_path / "res", "cpu", passing_cases())
    env = tmp_path / "res" / "cpu" / "environment.json"
    pack(tmp_path / "res" / "cpu")
    assert load_lane("cpu", tmp_path / "res" / "cpu").inventory, "read from inventory.json.gz"
    env.with_name("environment.json.gz").write_bytes(gzip.compress(env.read_bytes(), mtime=0))
    env.unlink()
    assert load_lane("cpu", tmp_path / "res" / "cpu").environment is None
    rc, line, _ = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED"), line


def test_a_gz_without_its_manifest_blocks(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    pack(tmp_path / "res" / "cpu").with_name(MANIFEST_FILE).unlink()
    rc, line, _ = gate(tmp_path, capsys)
    assert rc == 1 and line.startswith(
        f"GATE BLOCKED: lane cpu: committed evidence {tmp_path / 'res' / 'cpu' / 'junit.xml.gz'} has no"
    ), line
