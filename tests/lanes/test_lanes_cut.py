"""A lane cut short keeps its results: a real lane run (the runner, pytest on two xdist workers,
the stamp plugin) interrupted half way, as a cancelled workflow does it (SIGINT, then SIGTERM),
leaves a JUnit of every test done and a `cut` record, and the gate blocks naming the cut and how
far the run got."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from selgate.lanes import runner
from selgate.reports.__main__ import main as reports_main
from selgate.reports.results import load_lane

TESTS = 40
# The cpu lane's runner, stamp and inventory, on a path set of its own whose tests mark each
# pass in CUT_MARKS.
DRIVER = """
import sys
from pathlib import Path
from selgate.lanes import runner
from selgate.lanes.config import load_lane
out_root, test_file = Path(sys.argv[1]), sys.argv[2]
runner.OUT_ROOT = out_root
plugins = [a for p in runner.lane_plugins() for a in ("-p", p)]
args = [test_file, *plugins, *runner.CONFIG_ARGS, "--rootdir", str(Path(test_file).parent),
        "-p", "no:cacheprovider", "-n", "2",
        "--junitxml", str(out_root / "cpu" / "junit.xml"), "-o", "junit_family=xunit2"]
plan = runner.LanePlan(load_lane("cpu"), "cpu", args, {"SELGATE_LANE": "cpu"}, out_root / "cache", 2)
sys.exit(runner.run_plan(plan))
"""
SLOW_TESTS = f"""
import os, time
from pathlib import Path
import pytest

@pytest.mark.parametrize("i", range({TESTS}))
def test_step(i):
    time.sleep(0.4)
    Path(os.environ["CUT_MARKS"], str(i)).touch()
"""


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.timeout(240)
def test_a_lane_interrupted_half_way_leaves_its_junit_and_the_gate_blocks_naming_the_cut(tmp_path):
    marks, out_root = tmp_path / "marks", tmp_path / "reports" / "out"  # where a lane's inventory starts
    marks.mkdir()
    test_file = tmp_path / "test_slow_lane.py"
    test_file.write_text(SLOW_TESTS)
    # not the durations of a lane this suite may itself run in: they name its tests, relative to its rootdir
    env = {**{k: v for k, v in os.environ.items() if k != "SELGATE_DURATIONS"}, "CUT_MARKS": str(marks)}
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(out_root), str(test_file)],
        cwd=runner.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # the runner started as a background job is (SIGINT ignored, inherited by its children):
        # the SIGINT it forwards must still cut pytest
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        wait_for(lambda: len(list(marks.iterdir())) >= 6 or proc.poll() is not None, 180, "six tests to pass")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)  # a cancelled workflow's second signal: ignored while results are written
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    passed = len(list(marks.iterdir()))
    assert proc.returncode == 2, output[-3000:]
    assert "SIGTERM ignored" in output

    lane = load_lane("cpu", out_root / "cpu")
    assert lane is not None, output[-3000:]
    outcomes = [c.outcome for c in lane.cases]
    assert all(c.nodeid.startswith("test_slow_lane.py::test_step[") for c in lane.cases), lane.cases
    # a test marks itself before its worker reports it: up to one report per worker (2) may be
    # in flight when the signal lands, and the JUnit holds what the controller had received
    assert outcomes.count("pass") >= 6 - 2 and len(outcomes) < TESTS, outcomes
    cut = json.loads((out_root / "cpu" / "environment.json").read_text())["cut"]
    assert not (out_root / "cpu" / "inventory.json").exists()  # its collection is stopped, not waited for
    assert cut["signal"] == "SIGINT" and cut["tests_collected"] == TESTS
    assert outcomes.count("pass") <= cut["tests_done"] <= passed + 2  # a test may finish while pytest stops

    policy = tmp_path / "gate.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "default_profile": "merge",
                "required_families": ["parity"],
                "profiles": {"merge": {"required_lanes": ["cpu"]}},
                "quarantine": [],
            }
        )
    )
    rc = reports_main(["gate", "--policy", str(policy), "--results", str(out_root), "--out", str(tmp_path / "gate")])
    report = (tmp_path / "gate" / "report.md").read_text()
    assert rc == 1
    share = 100 * cut["tests_done"] // TESTS
    assert (
        f"GATE BLOCKED: required lane cpu cut short by SIGINT after {cut['tests_done']} of {TESTS} tests ({share} %)"
    ) in report
