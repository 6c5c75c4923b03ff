"""One GPU per xdist worker, and a test that kills its worker becomes that test's error
while the lane's other results survive (real pytest -n runs in a subprocess)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from selgate.lanes.xdist_gpu import worker_device
from selgate.reports.results import load_lane


@pytest.mark.parametrize(
    "worker,visible,count,expected",
    [
        ("gw0", "4,5", 0, "4"),  # an inherited CUDA_VISIBLE_DEVICES is honoured, not renumbered
        ("gw1", "4,5", 0, "5"),
        ("gw2", "4,5", 0, "4"),  # more workers than GPUs: wrap around
        ("gw1", " 4, 5 ", 0, "5"),
        ("gw1", "GPU-aa,GPU-bb", 0, "GPU-bb"),
        ("gw3", None, 8, "3"),  # unset: every device
        ("gw0", "", 0, None),  # nothing visible: leave it alone
        (None, "4,5", 0, None),  # not an xdist worker
    ],
)
def test_worker_device_mapping(worker, visible, count, expected):
    assert worker_device(worker, visible, count) == expected


def test_bad_worker_id_is_named():
    with pytest.raises(ValueError, match="PYTEST_XDIST_WORKER: expected 'gw<N>', got 'w1'"):
        worker_device("w1", "0,1", 0)


def outer_env() -> dict:
    """os.environ minus the xdist variables of this suite's own worker (under `bin/test -n`),
    which would make the nested pytest's controller act as a worker."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}


def _run_pytest(tmp_path, source, workers, env=None, plugins=("selgate.lanes.xdist_gpu",), extra=()):
    """pytest -n over `source` with plugin autoloading off and the plugins named, as lanes run
    (and as the lane this suite runs in passes on to it)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "test_synthetic.py").write_text(textwrap.dedent(source))
    named = ("xdist.plugin", "pytest_timeout", *plugins)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            str(workers),
            *(a for p in named for a in ("-p", p)),
            "-p",
            "no:cacheprovider",
            "--junitxml",
            "out/junit.xml",
            *extra,
            "test_synthetic.py",
        ],
        cwd=tmp_path,
        env={**outer_env(), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, load_lane("synthetic", tmp_path / "out")


def test_each_worker_sees_one_gpu_of_the_inherited_set(tmp_path):
    source = """
        import os, pytest
        @pytest.mark.parametrize("i", range(4))
        def test_record(i):
            open(f"seen-{os.environ['PYTEST_XDIST_WORKER']}", "a").write(os.environ["CUDA_VISIBLE_DEVICES"] + "\\n")
    """
    proc, lane = _run_pytest(tmp_path, source, 2, {"CUDA_VISIBLE_DEVICES": "6,3"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    seen = {p.name: set(p.read_text().split()) for p in tmp_path.glob("seen-*")}
    assert seen == {"seen-gw0": {"6"}, "seen-gw1": {"3"}}
    assert lane.counts()["pass"] == 4


def test_a_test_that_kills_or_hangs_its_worker_is_an_error_and_the_rest_survive(tmp_path):
    source = """
        import os, time, pytest
        def log(name):
            open("pids", "a").write(f"{name} {os.getpid()}\\n")
        def test_before(): log("before")
        def test_exit(): os._exit(3)
        def test_abort(): os.abort()
        def test_fault():
            log("fault")
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        def test_after(): log("after")
        @pytest.mark.timeout(1)
        def test_hang(): time.sleep(60)
        def test_failing(): assert 1 == 2
    """
    proc, lane = _run_pytest(
        tmp_path,
        source,
        1,
        plugins=("selgate.lanes.xdist_gpu", "selgate.reports.stamp"),
        extra=("--timeout", "120", "--timeout-method", "thread"),
    )  # as the lanes run
    outcomes = {c.nodeid.split("::")[1]: c.outcome for c in lane.cases}
    assert outcomes == {
        "test_before": "pass",
        "test_exit": "error",
        "test_abort": "error",
        "test_fault": "error",
        "test_after": "pass",
        "test_hang": "error",
        "test_failing": "fail",
    }, proc.stdout[-3000:]
    crashed = {c.nodeid.split("::")[1]: c.message for c in lane.cases if c.outcome == "error"}
    assert all("crashed while running" in m for m in crashed.values())
    assert crashed["test_fault"].startswith("RuntimeError: CUDA error: an illegal memory access")  # cause kept
    pids = dict(line.split() for line in (tmp_path / "pids").read_text().splitlines())
    assert pids["after"] != pids["fault"], "the poisoned worker must be replaced before the next test"
    assert json.loads((tmp_path / "out" / "environment.json").read_text())["pytest_exitstatus"] == 1
    assert [c.family for c in lane.cases] == ["other"] * 7


def test_a_sticky_cuda_error_in_a_strict_xfail_also_replaces_the_worker(tmp_path):
    """A declared known bug (strict xfail) that raised a sticky CUDA error reports as skipped,
    not failed; the worker is poisoned all the same and must not run the next test."""
    source = """
        import os, pytest
        def log(name):
            open("pids", "a").write(f"{name} {os.getpid()}\\n")
        @pytest.mark.xfail(strict=True, reason="known bug")
        def test_known_fault():
            log("fault")
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        def test_after(): log("after")
    """
    proc, lane = _run_pytest(tmp_path, source, 1)
    pids = dict(line.split() for line in (tmp_path / "pids").read_text().splitlines())
    assert pids["after"] != pids["fault"], proc.stdout[-3000:]
    assert {c.nodeid.split("::")[1]: c.outcome for c in lane.cases}["test_after"] == "pass"


CUDA_FAULT = """
    import torch, triton, triton.language as tl

    @triton.jit
    def _store_far_out_of_bounds(x_ptr):
        tl.store(x_ptr + (1 << 40), 1.0)

    def test_fault():
        x = torch.zeros(1, device="cuda")
        _store_far_out_of_bounds[(1,)](x)
        torch.cuda.synchronize()

    def test_after():
        assert torch.ones(4, device="cuda").sum().item() == 4
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: provokes a real illegal memory access")
def test_a_real_cuda_fault_is_contained_to_its_test(tmp_path):
    """Without the plugin the sticky error fails every later test of the worker; with it
    only the faulting test is charged."""
    bare, bare_lane = _run_pytest(tmp_path / "bare", CUDA_FAULT, 1, plugins=())
    assert {c.nodeid.split("::")[1]: c.outcome for c in bare_lane.cases} == {"test_fault": "fail", "test_after": "fail"}, (
        bare.stdout[-3000:]
    )
    proc, lane = _run_pytest(tmp_path / "pinned", CUDA_FAULT, 1)
    outcomes = {c.nodeid.split("::")[1]: c.outcome for c in lane.cases}
    assert outcomes == {"test_fault": "error", "test_after": "pass"}, proc.stdout[-3000:]
    assert "illegal memory access" in proc.stdout
