"""`selgate check` on outside kernels that each hide one bug (tests/outside/liars.py), run as a
command once per kernel (every assertion of a test is on its one run): a kernel that declares one
support to the probe and another to the workers, one repeatable within a process only, and one
whose fp16 is broken behind declared strict expected failures."""

from __future__ import annotations

import pytest

from selgate.reports.results import load_lane

from .test_check_cli import OUTSIDE, _check


@pytest.fixture
def checked(tmp_path):
    """`checked(spec, *args)`: (exit status, output, out folder) of one check, on two workers."""
    for f in OUTSIDE.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_text(f.read_text())

    def run(spec, *args):
        rc, log = _check(tmp_path, spec, "--out", "out", "--workers", "2", *args)
        return rc, log, tmp_path / "out"

    return run


def test_the_workers_run_what_the_probe_was_declared(checked):
    """Declared fp16 and fp32 to the probe, fp32 alone in the workers: the fp16 cases run (and
    fail: the kernel is 1% off there), and the report's declarations are what ran."""
    rc, log, out = checked("liars:declares_per_process")
    assert rc == 1 and "CHECK BLOCKED" in log, log
    cases = load_lane("check", out).cases
    fp16 = [c for c in cases if "-fp16-" in c.nodeid]
    assert fp16 and not any("does not declare fp16" in c.message for c in fp16)
    assert any(c.outcome == "fail" and c.family == "parity" for c in fp16)
    assert "| dtypes | fp16, fp32 |" in (out / "report.md").read_text()


def test_a_kernel_repeatable_only_within_its_process_fails_determinism(checked):
    rc, log, out = checked("liars:seeded_by_pid")
    assert rc == 1, log
    headline = next(line for line in log.splitlines() if line.startswith("CHECK "))
    assert "o: not bitwise identical across processes" in headline, log
    report = (out / "report.md").read_text()
    assert "claimed family determinism has no passing test" in report
    failed = [c for c in load_lane("check", out).cases if c.outcome == "fail"]
    assert failed and all(c.family == "determinism" and "across processes" in c.message for c in failed), failed
    assert all("prefill-" in c.message for c in failed), "each failure names its case"


def test_a_dtype_broken_behind_strict_expected_failures_is_named_on_the_first_line(checked):
    """Every fp16 failure is a declared strict xfail, so the check passes, saying so; its fp32
    (the correct gather kernel) passes determinism across processes: no false alarm."""
    rc, log, out = checked("liars:nan_in_fp16", "--declare", "nan_in_fp16.yaml")
    assert rc == 0, log
    headline = (out / "report.md").read_text().splitlines()[2]
    xfails = sum(c.outcome == "xfail" for c in load_lane("check", out).cases)
    assert xfails > 10
    assert headline.startswith(f"**CHECK PASSED at size tiny with {xfails} declared expected failures in fp16: "), headline
    assert "never ran (every case skipped): families backward, decode, varlen, gradcheck" in headline


def test_a_helper_that_rewrites_the_results_blocks_and_dies_with_the_check(checked):
    """The helper outlives pytest, in a session of its own: the check kills it before it reads
    a result, and blocks, whether or not the helper got to the results first."""
    import os
    import time

    rc, log, out = checked("liars:strips_its_failures")
    assert rc == 1 and "CHECK BLOCKED" in log, log
    assert "still alive after pytest exited" in log, log
    pid = int((out.parent / "stripper.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the helper {pid} outlived the check")


def test_a_plugin_shadowed_beside_the_kernel_cannot_turn_failures_into_passes(checked, tmp_path):
    """A `pytest_timeout.py` in the kernel's folder (the real plugin plus a hook that passes every
    failed report) is never the plugin the check's pytest loads."""
    (tmp_path / "pytest_timeout.py").write_text((OUTSIDE / "pytest_timeout_shadow.txt").read_text())
    rc, log, out = checked("tokenkernels:off_by_a_little")
    assert rc == 1 and "CHECK BLOCKED" in log, log
    assert any(c.outcome == "fail" for c in load_lane("check", out).cases)
