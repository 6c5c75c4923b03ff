"""Progress of a long lane: done/total, the rate and the time left, every few seconds or
percent, on the controller of an xdist run."""

from __future__ import annotations

import os
import re

import pytest
from selgate.lanes.progress import Progress, clock_text, interval_from_env
from tests.helpers import run_pytest


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_line_every_interval_and_every_five_percent_with_rate_and_time_left():
    clock = Clock()
    progress = Progress(every_s=30, clock=clock)
    progress.total = 200
    assert progress.finished("t0") is None  # the rate counts from this first result
    lines = []
    for i in range(1, 200):
        clock.now += 0.5
        lines.append(progress.finished(f"t{i}"))
    due = [line for line in lines if line]
    assert len(due) == 20  # every 5 % (10 tests in 5 s, before 30 s pass)
    assert due[0] == "progress: 10/200 tests (5 %) in 0m04s, 2.22 tests/s, about 1m26s left"
    assert due[-1].startswith("progress: 200/200 tests (100 %) in 1m40s") and due[-1].endswith("about 0m00s left")
    assert progress.finished("t5") is None  # a test reported twice counts once


def test_a_slow_lane_gets_a_line_every_interval_between_steps():
    clock = Clock()
    progress = Progress(every_s=30, clock=clock)
    progress.total = 4000
    progress.finished("first")
    clock.now += 31
    assert progress.finished("second") == "progress: 2/4000 tests (0 %) in 0m31s, 0.06 tests/s, about 17h12m left"
    clock.now += 10
    assert progress.finished("third") is None


def test_clock_text_and_a_bad_interval_is_named():
    assert (clock_text(59.6), clock_text(3725)) == ("1m00s", "1h02m")
    assert interval_from_env({}) == 30.0 and interval_from_env({"SELGATE_PROGRESS_S": "0"}) == 0.0
    with pytest.raises(pytest.UsageError, match="SELGATE_PROGRESS_S: expected seconds >= 0"):
        interval_from_env({"SELGATE_PROGRESS_S": "-1"})


@pytest.mark.timeout(180)
def test_an_xdist_run_prints_progress_against_what_its_workers_collected(tmp_path):
    (tmp_path / "test_mod.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(8))\ndef test_x(i):\n    pass\n")
    env = {**os.environ, "SELGATE_PROGRESS_S": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = run_pytest(
        tmp_path, "-p", "xdist.plugin", "-p", "selgate.lanes.progress", "-p", "no:cacheprovider", "-n", "2", "test_mod.py",
        env=env, timeout=170,
    )  # fmt: skip
    lines = re.findall(r"^progress: (\d+)/(\d+) tests \((\d+) %\)", out.stdout, re.MULTILINE)  # on lines of their own
    assert [(int(d), int(t)) for d, t, _ in lines] == [(i, 8) for i in range(1, 9)], out.stdout + out.stderr
    assert "8 passed" in out.stdout
