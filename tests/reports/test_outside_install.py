"""selgate as a kernel author meets it: a wheel built from this tree, installed into a fresh
virtual environment in an empty directory, no checkout anywhere on the path. From there the
pytest plugin runs the matrix on an outside module, and `selgate check` passes a correct
kernel, blocks a broken one, survives one that aborts on one case and hangs on another,
and judges block-index kernels (correct, and with the causal mask wrong inside the block
that holds t). A check whose point is a pass runs the whole matrix; one whose kernel is wrong
alike in every case runs the families that show it, and the test asserts that the kernel's own
failures block it (a check narrowed with -k is BLOCKED whatever the kernel does).

The environment is made with pip from the package index (torch pinned to the version this
process runs), so it is a CPU-machine check: GPU lanes, whose machines have no index, skip it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from tests.helpers import blocked_by_failures

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = Path(__file__).resolve().parents[1] / "outside"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="installs from the package index: a CPU-machine check"),
    pytest.mark.skipif(
        os.environ.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes"),
        reason="PIP_NO_INDEX is set: no package index to install the wheel's dependencies from",
    ),
]


def _run(cmd, cwd, timeout=900, env=None):
    out = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}, **(env or {})},
    )
    return out.returncode, out.stdout + out.stderr


def _shared_dir(tmp_path_factory) -> Path:
    """The folder every xdist worker of this run sees (the parent of each worker's base
    temporary folder, as pytest-xdist's docs do it); the base temporary folder outside xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """(python, bin dir) of a venv holding only the wheel and its dependencies, made once per run
    and shared by the xdist workers (installing torch is most of its cost)."""
    base = _shared_dir(tmp_path_factory) / "outside-install"
    base.mkdir(exist_ok=True)
    env_dir, ready = base / "venv", base / "ready"
    with FileLock(base / "install.lock"):
        if not ready.exists():
            _install(base, env_dir)
            ready.touch()
    return env_dir / "bin" / "python", env_dir / "bin"


def _install(base: Path, env_dir: Path):
    """Build the wheel of this tree and install it, with torch pinned to this process's, into a
    fresh venv at `env_dir`."""
    dist = base / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    shutil.rmtree(env_dir, ignore_errors=True)
    # setuptools builds in the checkout's build/: one process at a time, and from an empty
    # build/lib (setuptools keeps what an earlier build left there, modules since removed included)
    (ROOT / "build").mkdir(exist_ok=True)
    with FileLock(ROOT / "build" / "wheel.lock"):
        shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
        rc, log = _run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)], base
        )
    assert rc == 0, log
    (wheel,) = dist.glob("selgate-*.whl")
    venv.create(env_dir, with_pip=True)
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    rc, log = _run(
        [
            str(env_dir / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-compile",  # bytecode for what the tests import is written as they import it, not for all of torch
            str(wheel),
            torch_pin,
            "triton==3.6.0",
        ],
        base,
        timeout=1500,
    )
    assert rc == 0, log


@pytest.fixture(scope="module")
def outside(installed, tmp_path_factory):
    """(python, bin dir, work dir): the installed venv, and an empty directory of this worker
    holding only the outside kernels."""
    work = tmp_path_factory.mktemp("work")
    for f in OUTSIDE.glob("*.py"):
        shutil.copy(f, work)
    return (*installed, work)


def test_the_wheel_carries_its_configs_and_no_checkout_is_used(outside):
    py, _, work = outside
    rc, log = _run(
        [
            str(py),
            "-c",
            "import selgate, selgate.kernels, torch; "
            "from selgate.kernels import selection_attention; "
            "print(selgate.__file__); print(selgate.kernels.config.CONFIG_DIR)",
        ],
        work,
    )
    assert rc == 0, log
    assert str(ROOT) not in log and "site-packages" in log, log


def test_the_wheel_holds_no_probes(outside):
    """The one-off GPU probes are scripts of the checkout (probes/), not part of what ships."""
    py, _, work = outside
    rc, log = _run([str(py), "-c", "import importlib.metadata as md; print(*md.files('selgate'), sep='\\n')"], work)
    assert rc == 0 and "selgate/bench/__init__.py" in log.splitlines(), log
    assert not [f for f in log.splitlines() if "probes" in f.split("/")], log


def test_the_wheels_selgate_command_offers_what_works_outside_a_checkout(outside):
    """`selgate --help` lists check and bench and exits 0; the checkout's own tools (lanes,
    reports) are not offered: asking for one exits 2 saying what to do instead."""
    _, bin_dir, work = outside
    rc, log = _run([str(bin_dir / "selgate"), "--help"], work)
    assert rc == 0 and "  check " in log and "  bench " in log and "  lanes " not in log, log
    rc, log = _run([str(bin_dir / "selgate"), "lanes", "run", "cpu"], work)
    assert rc == 2 and "installed from a wheel" in log, log
    assert not list(work.glob("reports")), "nothing written"


def test_the_pytest_plugin_runs_the_matrix_from_any_directory(outside):
    py, _, work = outside
    rc, log = _run(
        [
            str(py),
            "-m",
            "pytest",
            "--pyargs",
            "selgate.conformance",
            "-m",
            "conformance and parity",
            "--impl",
            "tokenkernels:gather",
            "--size",
            "tiny",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        work,
    )
    assert rc == 0, log
    assert " passed" in log and "error" not in log.lower(), log


def _check(outside, impl, out, *extra):
    """`selgate check` on one worker (the test runs beside others: each worker more is a process and
    executors more, and what is asserted does not depend on their count)."""
    _, bin_dir, work = outside
    rc, log = _run([str(bin_dir / "selgate"), "check", impl, "--out", out, "--workers", "1", *extra], work)
    report = (work / out / "report.md").read_text() if (work / out / "report.md").exists() else ""
    return rc, log, report


def test_check_passes_a_correct_kernel(outside):
    rc, log, report = _check(outside, "tokenkernels:gather", "gather")
    assert rc == 0, log
    assert "CHECK PASSED" in log and "# selgate check: `tokenkernels:gather`" in report
    assert "| varlen | no: declares no varlen callable |" in report
    env = json.loads((outside[2] / "gather" / "environment.json").read_text())
    assert "tokenkernels:gather" in json.dumps(env), "the stamp records --impl"


def test_check_blocks_a_broken_kernel_with_repro_lines(outside):
    """Wrong alike in every case: the parity family shows it."""
    rc, log, report = _check(outside, "tokenkernels:off_by_a_little", "broken", "-k", "test_parity")
    assert blocked_by_failures(rc, log), log
    assert "max abs err" in report
    assert "--impl tokenkernels:off_by_a_little" in report


def test_check_survives_a_case_that_aborts_and_one_that_hangs(outside):
    """Parity runs the cases in the executors, determinism in its second processes too; an abort
    ends the executor, a hang is killed with it at the case's limit."""
    rc, log, report = _check(
        outside, "tokenkernels:dies_on_one_case", "dies", "--timeout", "10", "-k", "test_parity or test_determinism"
    )
    assert blocked_by_failures(rc, log), log
    from selgate.reports.results import load_lane

    cases = load_lane("check", outside[2] / "dies").cases
    errors = [c for c in cases if c.outcome in ("fail", "error")]
    # each fault once per root of executors (tokenkernels._first_time): once among the cases,
    # once more in the determinism family's second processes
    assert len(errors) == 4, [c.nodeid for c in errors]
    # the abort comes with the first call on 29 keys: a Skv29 case, or a decode row of a longer
    # prefill cut to 29 keys, whichever a worker reaches first
    aborted = [c for c in errors if "killed by SIGABRT during the call" in c.message]  # its executor died
    hung = [c for c in errors if "Skv45" in c.nodeid]
    # a hang is cut at --timeout in its executor: the case fails naming the limit, its worker goes on
    assert len(aborted) == 2 and len(hung) == 2, errors
    assert all("ran past the case's limit of 10 s (the check's --timeout)" in c.message for c in hung), errors
    assert not any("crashed" in c.message for c in cases), errors
    assert sum("test_determinism" in c.nodeid for c in errors) >= 2, errors
    assert sum(c.outcome == "pass" for c in cases) > 150, "every other case still ran and passed"


def test_check_judges_block_index_kernels(outside):
    rc, log, report = _check(outside, "blockkernels:fla_style", "blocks")
    assert rc == 0, log
    assert "| block size | 8 |" in report
    rc, log, report = _check(outside, "blockkernels:fla_style_broken_causal", "blocks-broken", "-k", "test_parity or test_bounds")
    assert blocked_by_failures(rc, log), log
    assert "## Root causes" in report and "in bounds, parity" in report, report
    assert "smallest: `test_" in report and "reproduce: `python blocks-broken/repro/cause-1.py`" in report
    # each failure's facts came through the workers' JUnit properties, and its cause names its rule
    from selgate.conformance.compare import RULES
    from selgate.reports.results import load_lane

    failed = [c for c in load_lane("check", outside[2] / "blocks-broken").cases if c.outcome == "fail"]
    assert failed and all(c.facts["failure"]["rule"] in RULES for c in failed), [c.facts for c in failed]
    assert all(c.facts["impl"] == "blockkernels:fla_style_broken_causal" and c.facts["case"] in c.nodeid for c in failed)
    assert "   - breaks SPEC.md, " in report, report


def test_check_usage_errors_exit_2(outside, tmp_path):
    declare = tmp_path / "d.yaml"
    declare.write_text("block_sise: 8\n")
    rc, log, _ = _check(outside, "tokenkernels:gather", "usage", "--declare", str(declare))
    assert rc == 2 and "unknown declaration 'block_sise'" in log, log
    rc, log, _ = _check(outside, "nosuchmodule:fn", "usage")
    assert rc == 2 and "nosuchmodule" in log, log
