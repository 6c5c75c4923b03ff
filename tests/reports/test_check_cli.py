"""`selgate check` as a kernel author meets it, run as a command: the process that decides the
verdict never imports the kernel (an import that exits, dies or hangs is a named error), an
interrupted check still writes its results and names the cut, the caller's environment cannot
loosen the verdict, and `--out` never deletes what the check did not write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import running_with

OUTSIDE = Path(__file__).resolve().parents[1] / "outside"
CHECK = [sys.executable, "-m", "selgate", "check"]  # as `selgate check`: a usage error answers before torch is imported


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "SELGATE_TOL_OVERRIDES"}
    return {**env, **extra}


def _check(work: Path, *args, env=None, timeout=300, command=CHECK):
    out = subprocess.run([*command, *args], cwd=work, capture_output=True, text=True, timeout=timeout, env=env or _env())
    return out.returncode, out.stdout + out.stderr


# `selgate check` that says at its end whether its own process imported torch (the probe, workers
# and executors do; the process that judges need not: 1.65 CPU-s of every check on CI's machine)
CHECK_SAYING_TORCH = [
    sys.executable,
    "-c",
    "import sys; from selgate.reports.check_cli import main; rc = main(sys.argv[1:]); "
    "print('torch in the judge:', 'torch' in sys.modules); sys.exit(rc)",
]


@pytest.fixture
def work(tmp_path):
    for f in OUTSIDE.glob("*.py"):
        (tmp_path / f.name).write_text(f.read_text())
    return tmp_path


def _module(work: Path, name: str, body: str) -> str:
    (work / f"{name}.py").write_text(textwrap.dedent(body))
    return f"{name}:fn"


# a module that writes the probe's result itself, then ends the probe (`probe.py SPEC RESULT`)
FORGES_THE_PROBE = (
    "import os, sys\nif sys.argv[0].endswith('probe.py'):\n    open(sys.argv[2], 'w').write('{}')\n    os._exit(0)\n"
)


@pytest.mark.parametrize(
    "body, reason",
    [
        ("import sys\nsys.exit(0)\n", "ended in sys.exit(0)"),
        ("import os\nos._exit(0)\n", "ended the process with exit status 0 before it returned"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "was killed by SIGKILL"),
        ("raise RuntimeError('no GPU here')\n", "ended in RuntimeError: no GPU here"),
        ("import missing_dependency_of_the_kernel\n", "ModuleNotFoundError"),
        ("import os\nos.kill(os.getpid(), 40)\n", "was killed by signal 40"),  # real-time: no name in signal.Signals
        (FORGES_THE_PROBE.format("[]"), "the probe's result is not what the probe writes"),
        (FORGES_THE_PROBE.format('{"ok": true}'), "the probe's result is not what the probe writes"),
    ],
    ids=["sys-exit-0", "os-exit-0", "sigkill", "raises", "missing-dependency", "real-time-signal", "forged-list", "forged-ok"],
)
def test_an_import_that_exits_or_dies_blocks_naming_why(work, body, reason):
    spec = _module(work, "kern", body + "def fn(q, k, v, ranges, *, scale=None):\n    return q\n")
    rc, log = _check(work, spec, "--out", "out")
    assert rc == 1, log
    assert "CHECK BLOCKED: not loaded: " in log and reason in log, log
    report = (work / "out" / "report.md").read_text()
    assert reason in report and "CHECK BLOCKED" in report
    junit = (work / "out" / "junit.xml").read_text()
    assert "<error" in junit and reason.split(" ")[0] in junit


def test_a_declare_file_nested_too_deeply_is_a_usage_error(work):
    """The kernel's process reads the --declare file with a recursion limit of its choosing; the
    judge's reading of a file nested 2000 deep is the usage error, not a traceback."""
    body = "import sys\nsys.setrecursionlimit(200000)\ndef fn(q, k, v, ranges, *, scale=None):\n    return q\n"
    spec = _module(work, "kern", body)
    (work / "deep.yaml").write_text("xfail:\n  - {family: parity, cases: '*', reason: " + "[" * 2000 + "x" + "]" * 2000 + "}\n")
    rc, log = _check(work, spec, "--declare", "deep.yaml", "--out", "out")
    assert rc == 2 and "nested too deeply" in log and "Traceback" not in log, log


def test_an_import_that_hangs_is_cut_by_its_timeout_and_its_processes_die(work):
    marker = f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"  # names the kernel's child among processes
    spec = _module(
        work,
        "kern",
        f"""
        import subprocess, time
        child = subprocess.Popen(["sleep", {marker!r}])
        time.sleep(600)
        def fn(q, k, v, ranges, *, scale=None):
            return q
        """,
    )
    start = time.monotonic()
    # the timeout counts from the module's import on: selgate's own start-up (torch), which took
    # more than 5 s on a busy GPU lane host, is not charged to it
    rc, log = _check(work, spec, "--out", "out", "--import-timeout", "3")
    assert rc == 1 and "importing kern did not finish within 3 s" in log, log
    assert time.monotonic() - start < 60
    time.sleep(0.5)
    assert not running_with(marker), "the kernel's own process dies with the check"


def test_a_missing_module_or_a_bad_declaration_is_a_usage_error_leaving_nothing(work):
    rc, log = _check(work, "nosuchmodule:fn", "--out", "usage")
    assert rc == 2 and "no module named 'nosuchmodule'" in log, log
    assert not (work / "usage").exists(), "a usage error leaves no empty report folder"
    (work / "d.yaml").write_text("block_sise: 8\n")
    rc, log = _check(work, "tokenkernels:gather", "--declare", "d.yaml", "--out", "usage")
    assert rc == 2 and "unknown declaration 'block_sise'" in log, log


@pytest.mark.parametrize(
    "args, says",
    [
        (["../k/refk:selection"], "is not a module name"),
        (["tokenkernels:gather", "--timeout", "99999999999999999999"], "--timeout: expected an integer >= 1 and at most 604800"),
        (["tokenkernels:gather", "--import-timeout", "0"], "argument --import-timeout: expected an integer >= 1"),
        # past a C long it overflowed inside xdist: a traceback and exit 1, as if the results were forged
        (["tokenkernels:gather", "--workers", "99999999999999999999"], "argument --workers: expected >= 1 (a crashing test"),
        (["tokenkernels:gather", "--out", "tokenkernels.py/out"], "cannot make the folder"),
    ],
)
def test_a_path_for_a_module_an_unbounded_timeout_or_an_unusable_out_is_a_usage_error(work, args, says):
    rc, log = _check(work, *args)
    assert rc == 2 and says in log, log
    assert "Traceback" not in log


def test_a_heads_declaration_no_case_can_meet_is_a_usage_error(work):
    """It hung collection: the fitting searched every count up to the multiple."""
    (work / "d.yaml").write_text("heads_multiple_of: 1000000007\n")
    rc, log = _check(work, "tokenkernels:gather", "--declare", "d.yaml", "--out", "usage", timeout=60)
    assert rc == 2 and "the fewest they allow is 1000000007; the matrix runs 1 to 256 heads a group" in log, log


@pytest.mark.parametrize("name", ["SELGATE_TOL_OVERRIDES", "PYTEST_ADDOPTS"])
def test_a_setting_that_changes_the_verdict_is_refused(work, name):
    value = "{fp32: {max_abs: 1.0e+30, mean_abs: 1.0e+30}}" if name == "SELGATE_TOL_OVERRIDES" else "-k parity"
    rc, log = _check(work, "tokenkernels:off_by_a_little", "--out", "out", env=_env(**{name: value}))
    assert rc == 2 and name in log and "refuses" in log, log
    assert not (work / "out").exists()


def test_a_kernel_that_loosens_the_tolerances_itself_fails_every_case(work):
    """The other way in: the kernel's module sets the variable as it is imported. That happens in
    the kernel's own processes (the probe, the executors), never in the judge's: the bounds stay
    SPEC.md's."""
    spec = _module(
        work,
        "kern",
        """
        import os
        os.environ["SELGATE_TOL_OVERRIDES"] = "{fp32: {max_abs: 1.0e+30, mean_abs: 1.0e+30}}"
        from tokenkernels import off_by_a_little as fn
        """,
    )
    args = ("--out", "out", "--workers", "1", "-k", "test_parity and mixed and fp32")
    rc, log = _check(work, spec, *args, command=CHECK_SAYING_TORCH)
    assert rc == 1, log
    report = (work / "out" / "report.md").read_text()
    assert "bound 1.000e-05: absolute; SPEC.md" in report, report
    # judged, grouped into causes, reproducers written, reported: without torch in this process
    assert "torch in the judge: False" in log and (work / "out" / "repro" / "cause-1.py").exists(), log
    from selgate.reports.results import load_lane

    failed = [c for c in load_lane("check", work / "out").cases if c.outcome == "fail"]
    assert len(failed) > 20 and all("SPEC.md" in c.message for c in failed), failed[:2]


def test_out_keeps_what_the_check_did_not_write(work):
    out = work / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "junit.xml").write_text("<testsuites/>")
    rc, log = _check(work, "tokenkernels:gather", "--out", "out", "-k", "test_parity and s7")
    assert rc == 2 and "did not write" in log, log
    assert (out / "junit.xml").read_text() == "<testsuites/>"
    (out / "junit.xml").unlink()
    rc, log = _check(work, "tokenkernels:gather", "--out", "out", "--workers", "1", "-k", "test_parity and s7")
    assert rc == 1 and "narrowed" in log, log
    written = json.loads((out / ".selgate-check.json").read_text())
    assert "junit.xml" in written and "notes.txt" not in written
    rc, log = _check(work, "nosuchmodule:fn", "--out", "out")
    assert rc == 2
    assert (out / "notes.txt").read_text() == "mine", "another run's usage error keeps the folder"


def test_a_cut_check_writes_its_results_and_names_what_never_ran(work):
    """SIGINT once, as a CI time limit or Ctrl-C sends it: JUnit, environment and report are
    written, the report names the cut and the cases that never ran, and the exit is 1."""
    proc = subprocess.Popen(
        [*CHECK, "tokenkernels:gather", "--out", "cut", "--workers", "2"],
        cwd=work,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    collected = work / "cut" / "collected.json"
    deadline = time.monotonic() + 120
    while not collected.exists() and time.monotonic() < deadline:  # the run has its cases
        time.sleep(0.2)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    log = proc.communicate(timeout=240)[0]
    assert proc.returncode == 1, log
    out = work / "cut"
    env = json.loads((out / "environment.json").read_text())
    assert env["cut"]["signal"] == "SIGINT"
    assert (out / "junit.xml").exists()
    report = (out / "report.md").read_text()
    assert "CHECK BLOCKED: run cut by SIGINT after" in report
    assert "## Cut short by SIGINT" in report and "never ran" in report
    collected = json.loads((out / "collected.json").read_text())
    assert len(collected) > 300


def test_a_case_that_aborts_every_time_is_reported_once_and_never_handed_out_again(work):
    """A kernel that aborts takes its executor down, not the worker: the case is that crash, and
    a fresh executor serves the next case."""
    spec = _module(
        work,
        "kern",
        """
        import os
        from tokenkernels import gather
        def fn(q, k, v, ranges, *, scale=None):
            if k.shape[2] == 29:
                os.abort()
            return gather(q, k, v, ranges, scale=scale)
        """,
    )
    rc, log = _check(work, spec, "--out", "out", "--workers", "1", "-k", "test_parity and fp32", timeout=240)
    assert rc == 1, log
    from selgate.reports.results import load_lane

    cases = load_lane("check", work / "out").cases
    crashed = [c for c in cases if c.outcome in ("fail", "error")]
    assert crashed and all("Skv29" in c.nodeid and "killed by SIGABRT during the call" in c.message for c in crashed), crashed
    assert len({c.nodeid for c in crashed}) == len(crashed), "each crash reported once"
    assert sum(c.outcome == "pass" for c in cases) > 20
