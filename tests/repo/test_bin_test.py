"""bin/test as a contributor runs it, on a test file of their own outside the checkout: each xdist
worker's CPU thread pool is its share of the cores, as the lanes size it (torch gives every
process a pool of all the cores; on CI's 2 cores the suite's 2 workers then ran 4 spinning
threads and took 12 minutes instead of 7), and the costly-first ordering finds its durations
file whatever pytest's rootdir is (a relative one crashed every worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bin/test is a bash script")

PROBE = """
import os

def test_threads():
    assert os.environ.get("OMP_NUM_THREADS") == os.environ["EXPECTED_THREADS"], os.environ.get("OMP_NUM_THREADS")
"""


@pytest.mark.parametrize(
    ("workers", "expected"),
    [(None, "1"), ("1", str(len(os.sched_getaffinity(0)))), ("0", str(len(os.sched_getaffinity(0))))],
    ids=["auto-workers-one-thread-each", "one-worker-all-cores", "no-xdist-all-cores"],
)
def test_each_worker_gets_its_share_of_the_cores(tmp_path, workers, expected):
    (tmp_path / "test_threads_probe.py").write_text(PROBE)
    # a contributor's shell: none of the variables a lane running this suite sets
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "OMP_", "SELGATE_"))}
    env.update(EXPECTED_THREADS=expected, **({"SELGATE_WORKERS": workers} if workers else {}))
    out = subprocess.run(
        ["bash", str(ROOT / "bin" / "test"), "-p", "no:cacheprovider", str(tmp_path / "test_threads_probe.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
