"""`selgate check` on outside kernels that each hide one bug (tests/outside/liars.py), run as a
command once per kernel (every assertion of a test is on its one run): a kernel that declares one
support to the probe and another to the workers, one repeatable within a process only, one whose
fp16 is broken behind declared strict expected failures, and kernels that attack the judge
(rewrite its results, patch its comparison, behave only while judged, skip where wrong, plant
files beside the results).

A check whose verdict is the point (a pass, a claimed family without a pass, the headline) runs
the whole matrix; one whose attack works alike in every family runs two families (`NARROWED`),
and the test asserts that the kernel's own failures block it."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from selgate.conformance import sandbox
from selgate.reports.results import load_lane

from tests.helpers import blocked_by_failures, running_with
from tests.reports.test_check_cli import OUTSIDE, _check, _env


# The attacks that bend the judge, its declarations or its results act on every case alike, so
# the cases of two families show them caught, in both kinds of process a kernel runs in: the
# executors that run the cases and the determinism family's second processes. Narrowed, the
# verdict is BLOCKED whatever the kernel does (`blocked_by_failures`).
NARROWED = ("-k", "parity or determinism")


@pytest.fixture
def checked(tmp_path):
    """`checked(spec, *args)`: (exit status, output, out folder) of one check, on one worker
    (each worker is a process and an executor more: the attacks do not depend on their count)."""
    for f in OUTSIDE.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_text(f.read_text())

    def run(spec, *args, env_extra=None):
        rc, log = _check(tmp_path, spec, "--out", "out", "--workers", "1", *args, env=_env(**(env_extra or {})))
        return rc, log, tmp_path / "out"

    return run


def test_the_workers_run_what_the_probe_was_declared(checked):
    """Declared fp16 and fp32 to the probe, fp32 alone in the workers: the fp16 cases run (and
    fail: the kernel is 1% off there), and the report's declarations are what ran."""
    rc, log, out = checked("liars:declares_per_process", *NARROWED)
    assert blocked_by_failures(rc, log), log
    cases = load_lane("check", out).cases
    fp16 = [c for c in cases if "-fp16-" in c.nodeid]
    assert fp16 and not any("does not declare fp16" in c.message for c in fp16)
    assert any(c.outcome == "fail" and c.family == "parity" for c in fp16)
    assert "| dtypes | fp16, fp32 |" in (out / "report.md").read_text()


def test_a_kernel_repeatable_only_within_its_process_fails_determinism(checked):
    """Its seed is shared through the folder above its temporary folder: the second run's
    executors have a root of their own, so they seed differently."""
    rc, log, out = checked("liars:seeded_by_pid")
    assert rc == 1, log
    headline = next(line for line in log.splitlines() if line.startswith("CHECK "))
    assert "o: not bitwise identical across processes" in headline, log
    report = (out / "report.md").read_text()
    assert "claimed family determinism has no passing test" in report
    failed = [c for c in load_lane("check", out).cases if c.outcome == "fail"]
    assert failed and all(c.family == "determinism" and "across processes" in c.message for c in failed), failed
    assert all("prefill-" in c.message for c in failed), "each failure names its case"


def test_what_the_probe_says_is_validated_and_its_confinement_comes_from_before_the_kernel(checked):
    """The kernel rewrites the probe's result (an Impl field that drops every family but
    bad_input, which made a kernel 1 off PASS) and its confinement record (a file in its scratch
    folder, which the report used to show): the first blocks naming the key; the second never
    reaches the report, whose line `boot` sent on a pipe it closed before the kernel loaded."""
    rc, log, out = checked("probe_liar:rewrites_what_the_probe_says")
    assert rc == 1 and "the probe's result does not validate" in log, log
    assert "unknown declaration 'unsupported'" in log, log
    isolation = next(line for line in (out / "report.md").read_text().splitlines() if "Isolation:" in line)
    assert "FORGED" not in isolation and ("landlock ABI" in isolation or "no landlock" in isolation), isolation


def test_a_conftest_beside_the_kernel_never_loads(checked, tmp_path):
    """A conftest.py beside a kernel 1 off, turning every failure into a pass: with no test path in
    the caller's folder pytest loaded it from there into the judge's processes (CHECK PASSED).
    The check's pytest runs with --noconftest."""
    (tmp_path / "conftest.py").write_text((OUTSIDE / "conftest_passes_all.txt").read_text())
    (tmp_path / "wrong.py").write_text(
        "from tokenkernels import gather\n\n\ndef selection(q, k, v, ranges, *, scale=None):\n"
        "    return gather(q, k, v, ranges, scale=scale) + 1\n"
    )
    rc, log, out = checked("wrong:selection", *NARROWED)
    assert blocked_by_failures(rc, log), log
    assert not (tmp_path / "conftest-loaded").exists()


def test_the_users_declare_file_wins_over_what_the_probe_says(checked):
    """The kernel's process rewrites the probe's copy of its `--declare` file (fp32 alone, TF32):
    the judge reads the file itself, so fp16 runs and fp32 is held to IEEE bounds; and adds expected
    failures for every case, which only the file may declare, so none is an expected failure."""
    rc, log, out = checked("probe_liar:narrows_its_declare_file", "--declare", "fp16_ieee.yaml", *NARROWED)
    assert blocked_by_failures(rc, log), log
    report = (out / "report.md").read_text()
    assert "| dtypes | fp16, fp32 |" in report and "| fp32 matmuls | IEEE fp32 |" in report, report
    failed = [c for c in load_lane("check", out).cases if c.outcome == "fail"]
    assert any("-fp16-" in c.nodeid for c in failed) and any("-fp32-" in c.nodeid for c in failed)
    assert not any(c.outcome == "xfail" for c in load_lane("check", out).cases)


def test_a_dtype_broken_behind_strict_expected_failures_is_named_on_the_first_line(checked):
    """Every fp16 failure is a declared strict xfail, so the check passes, saying so; its fp32
    (the correct gather kernel) passes determinism across processes: no false alarm."""
    rc, log, out = checked("liars:nan_in_fp16", "--declare", "nan_in_fp16.yaml")
    assert rc == 0, log
    headline = (out / "report.md").read_text().splitlines()[2]
    xfails = sum(c.outcome == "xfail" for c in load_lane("check", out).cases)
    assert xfails > 10
    want = f"**CHECK PASSED at size tiny within declared limits (prefill only) with {xfails} declared expected failures in fp16: "
    assert headline.startswith(want), headline
    assert "never ran (every case skipped): families backward, decode, varlen, gradcheck" in headline


def test_a_kernel_that_rewrites_the_family_claims_is_still_held_to_them(checked, tmp_path):
    """The claims a pass needs come from beside the results, out of the kernel's reach: with the
    check's temporary folder under /dev/shm (which landlock leaves writable), a kernel rewrote
    them there and PASSED with its determinism claim dropped."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm on this machine")
    tmp = Path(tempfile.mkdtemp(dir=shm, prefix="selgate-test-"))
    try:
        rc, log, out = checked("liars:forges_its_claims", "--declare", "xfail_determinism.yaml", env_extra={"TMPDIR": str(tmp)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert rc == 1 and "claimed family determinism has no passing test" in log, log
    assert "forged" not in (out / "report.md").read_text()


def test_a_helper_that_rewrites_the_results_blocks_and_dies_with_the_check(checked):
    """The helper outlives pytest, in a session of its own: where landlock confines the kernel's
    processes it cannot write the results at all; everywhere the check kills it before it reads a
    result, and blocks."""
    import time

    rc, log, out = checked("liars:strips_its_failures", *NARROWED)
    assert rc == 1 and re.search(r"CHECK BLOCKED: \d+ process\(es\) started by the run were still alive after pytest", log), log
    if sandbox.abi():
        parity = [c for c in load_lane("check", out).cases if c.family == "parity" and c.outcome != "skip"]
        assert len(parity) > 20 and all(c.outcome == "fail" for c in parity), "the failures stand in junit.xml"
    deadline = time.monotonic() + 5
    while running_with(str(out / "junit.xml")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running_with(str(out / "junit.xml")), "the helper outlived the check"


@pytest.mark.parametrize(
    "spec, failing",
    [
        ("liars:right_only_when_judged", "o: max abs err"),
        ("liars:patches_the_comparison", "o: max abs err"),
        ("liars:skips_where_wrong", "Skipped: f"),
    ],
)
def test_a_kernel_that_bends_the_judge_in_its_own_process_fails(checked, spec, failing):
    """The kernel's code runs in executors without pytest, the comparison or the judge's
    variables: what it patches or looks for there is not the judge."""
    rc, log, out = checked(spec, *NARROWED)
    assert blocked_by_failures(rc, log), log
    failed = [c for c in load_lane("check", out).cases if c.outcome in ("fail", "error")]
    assert len(failed) > 20 and any(failing in c.message for c in failed), failed[:3]
    assert not any(c.outcome == "skip" and "not this time" in c.message for c in load_lane("check", out).cases)


@pytest.mark.skipif(
    not sandbox.abi(), reason="this machine's kernel offers no landlock: the kernel's processes can write anywhere"
)
def test_the_kernel_cannot_write_beside_the_results_or_kernel_settings(checked):
    """A kernel right unless it could write into the results folder or (as root) /proc/sys: it
    passes, so no write landed, and the report says which protection the machine gave. A root
    check on a machine that can make no mount namespace (and mounts /proc/sys writable) says so,
    and the kernel's write there fails it."""
    rc, log, out = checked("liars:writes_beside_the_results")
    assert not (out / "planted.txt").exists()
    report = (out / "report.md").read_text()
    assert "Isolation: landlock ABI" in report, report
    if os.geteuid() == 0 and "could write /proc/sys" in report:
        assert rc == 1, log
    else:
        assert rc == 0, log
        assert os.geteuid() != 0 or "/proc/sys and the other kernel settings read-only" in report, report
