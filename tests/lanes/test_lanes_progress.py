"""Progress of a long run: done/total, the rate, the tests running when nothing finishes, and the
time left only once it means something, on the controller of an xdist run or in a run without
xdist."""

from __future__ import annotations

import json
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


def test_a_line_every_five_percent_and_the_time_left_only_after_ten_percent_and_a_minute():
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
    assert due[0] == "progress: 10/200 tests (5 %) in 0m04s, 2.22 tests/s"
    assert not any("left" in line for line in due[:12])  # up to 60 % done, but in under a minute
    assert due[12] == "progress: 130/200 tests (65 %) in 1m04s, 2.02 tests/s, about 0m35s left"
    assert due[-1].startswith("progress: 200/200 tests (100 %) in 1m40s") and due[-1].endswith("about 0m00s left")
    assert progress.finished("t5") is None  # a test reported twice counts once


def test_no_time_left_from_the_first_few_slow_tests():
    clock = Clock()
    progress = Progress(every_s=30, clock=clock)
    progress.total = 4710
    progress.finished("first")
    clock.now += 31
    assert progress.finished("second") == "progress: 2/4710 tests (0 %) in 0m31s, 0.06 tests/s"  # not "about 19h37m left"
    clock.now += 10
    assert progress.finished("third") is None


def test_the_timer_names_the_running_tests_when_nothing_finished():
    clock = Clock()
    recorded = {"compile[sm80-sm89]": 145.0, "compile[sm90]": 114.0}
    progress = Progress(every_s=30, clock=clock, durations=recorded, workers=2)
    assert progress.wait_s() == 30 and progress.tick() is None
    clock.now += 30
    assert progress.tick() == "progress: 0/? tests in 0m30s; collecting"
    progress.collected(["compile[sm80-sm89]", "compile[sm90]", *(f"t{i}" for i in range(98))])
    for nodeid, worker in (("compile[sm80-sm89]", "gw0"), ("compile[sm90]", "gw1")):
        progress.started(nodeid)
        progress.timed(nodeid, 0.01, worker)  # its setup report says which worker runs it
    clock.now += 31
    assert progress.tick() == (
        "progress: 0/100 tests (0 %) in 1m01s; running: "
        "gw0 compile[sm80-sm89] (0m31s of ~2m25s), gw1 compile[sm90] (0m31s of ~1m54s)"
    )
    assert progress.tick() is None and progress.wait_s() == 30
    clock.now += 20
    progress.started("t0")
    progress.timed("t0", 0.2)
    progress.finished("t0")
    progress.ended("t0")
    clock.now += 10
    assert progress.tick() == "progress: 1/100 tests (1 %) in 1m31s, 0.10 tests/s"  # one finished 10 s ago: no list


def test_the_time_left_from_recorded_durations_once_enough_others_are_measured():
    clock = Clock()
    recorded = {"compile[sm80-sm89]": 145.0, "compile[sm90]": 114.0, "not-collected": 999.0}
    progress = Progress(every_s=30, clock=clock, durations=recorded, workers=2)
    others = [f"t{i}" for i in range(98)]
    progress.collected(["compile[sm80-sm89]", "compile[sm90]", *others])
    progress.started("compile[sm80-sm89]")
    progress.started("compile[sm90]")
    clock.now += 114
    progress.finished("compile[sm90]")
    progress.ended("compile[sm90]")
    for i, nodeid in enumerate(others[:20]):
        assert progress.time_left(clock.now) is None, i  # the other tests' cost is not known yet
        progress.timed(nodeid, 0.5)
        progress.finished(nodeid)
    # left: 145 - 114 s of the first compile and 78 others at 0.5 s, at this run's pace: 114 s of
    # wall for 114 + 114 (the compile running) + 20 x 0.5 recorded worker-seconds
    assert progress.time_left(clock.now) == pytest.approx((31 + 78 * 0.5) * 114 / 238)
    clock.now += 30
    assert progress.time_left(clock.now) == pytest.approx((1 + 39) * 144 / (114 + 144 + 10))


def test_the_recorded_mean_of_the_other_tests_gives_the_time_left_from_the_start():
    """bin/test showed 0 % and no estimate for minutes while its costly tests ran first: the
    durations file's `others` (count and seconds of the tests it does not list) cost them until
    this run has measured enough of its own."""
    clock = Clock()
    progress = Progress(every_s=30, clock=clock, durations={"compile": 100.0}, workers=2, others_mean=0.25)
    progress.collected(["compile", *(f"t{i}" for i in range(40))])
    progress.started("compile")
    assert progress.time_left(clock.now) == pytest.approx(max((100 + 40 * 0.25) / 2, 100))
    for i in range(20):
        progress.timed(f"t{i}", 1.0)
        progress.finished(f"t{i}")
    assert progress.time_left(clock.now) == pytest.approx(max((100 + 20 * 1.0) / 2, 100))  # its own mean now


def test_the_time_left_follows_the_runs_own_pace():
    """CI's bin/test said "about 16m41s left" with 3m13s to go: the first quick tests to finish
    ran beside the costly ones, 10x slower than the recorded mean, and became the mean of the
    thousands left. The recorded durations stay the unit; the run's own pace (wall seconds per
    recorded worker-second) scales them, however many workers share however many cores."""
    clock = Clock()
    progress = Progress(every_s=30, clock=clock, durations={"costly": 100.0}, workers=2, others_mean=0.05, others_below=5.0)
    others = [f"t{i}" for i in range(3000)]
    progress.collected(["costly", *others])
    progress.started("costly")
    assert progress.time_left(clock.now) == pytest.approx(max((100 + 3000 * 0.05) / 2, 100))  # the plan, from the start
    for nodeid in others[:200]:  # beside the costly test, at 0.5 s each
        progress.started(nodeid)
        clock.now += 0.5
        progress.timed(nodeid, 0.5)
        progress.finished(nodeid)
        progress.ended(nodeid)
    progress.finished("costly")
    progress.ended("costly")
    # 100 s of wall for 100 + 200 x 0.05 recorded worker-seconds; 2800 x 0.05 left (truly 70 s at
    # the recorded speed; the mean of the first 200 would have said 700 s)
    assert progress.time_left(clock.now) == pytest.approx(2800 * 0.05 * 100 / 110)


def test_an_unlisted_test_longer_than_the_files_bound_costs_its_own_time_not_the_others_mean():
    """CI said "about 30m32s left" 4 min into a 9 min run: the slow tests the CPU lane skips (so
    its durations never list them) ran first, took ~60 s each, and became the mean of the
    thousands of quick tests after them. The file lists every test of min_s or more, so an
    unlisted one that takes longer here is a stranger: its own time is the work it did."""
    clock = Clock()
    progress = Progress(every_s=30, clock=clock, durations={"elsewhere": 9.0}, workers=2, others_mean=0.25, others_below=5.0)
    progress.collected([f"t{i}" for i in range(100)])
    progress.started("t0")
    clock.now += 90
    for i in range(3):
        progress.timed(f"t{i}", 60.0)  # slow-marked, unlisted
        progress.finished(f"t{i}")
    progress.ended("t0")
    for i in range(3, 23):
        progress.timed(f"t{i}", 0.5)
        progress.finished(f"t{i}")
    assert progress.strangers == {"t0", "t1", "t2"} and progress.measured == 20
    assert progress.time_left(clock.now) == pytest.approx(77 * 0.25 * 90 / (3 * 60 + 20 * 0.25))


def test_durations_record_the_other_tests_mean(tmp_path):
    from selgate.lanes.ordering import load_min_s, load_others_mean

    path = tmp_path / "d.json"
    path.write_text('{"tests": {}, "min_s": 5.0, "others": {"count": 4, "seconds": 2.0}}')
    assert load_others_mean(path) == 0.5 and load_min_s(path) == 5.0
    path.write_text('{"tests": {}}')
    assert load_others_mean(path) is None and load_min_s(path) is None


def test_clock_text_and_a_bad_interval_is_named():
    assert (clock_text(59.6), clock_text(3725)) == ("1m00s", "1h02m")
    assert interval_from_env({}) == 30.0 and interval_from_env({"SELGATE_PROGRESS_S": "0"}) == 0.0
    with pytest.raises(pytest.UsageError, match="SELGATE_PROGRESS_S: expected seconds >= 0"):
        interval_from_env({"SELGATE_PROGRESS_S": "-1"})


def nested_env(**extra) -> dict:
    """This suite's environment for a nested pytest, without the lane's durations (they name this
    suite's tests) or this worker's xdist variables."""
    env = {k: v for k, v in os.environ.items() if k != "SELGATE_DURATIONS" and not k.startswith("PYTEST_XDIST")}
    return {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **extra}


@pytest.mark.timeout(180)
def test_an_xdist_run_prints_progress_against_what_its_workers_collected(tmp_path):
    (tmp_path / "test_mod.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(8))\ndef test_x(i):\n    pass\n")
    out = run_pytest(
        tmp_path, "-p", "xdist.plugin", "-p", "selgate.lanes.progress", "-p", "no:cacheprovider", "-n", "2", "-q",
        "test_mod.py", env=nested_env(SELGATE_PROGRESS_S="0"), timeout=170,
    )  # fmt: skip
    lines = re.findall(r"^progress: (\d+)/(\d+) tests \((\d+) %\)", out.stdout, re.MULTILINE)  # on lines of their own
    assert [(int(d), int(t)) for d, t, _ in lines] == [(i, 8) for i in range(1, 9)], out.stdout + out.stderr
    assert "8 passed" in out.stdout
    # xdist's quiet status line once, when the workers start (it wrote it again after collection)
    assert out.stdout.count("bringing up nodes...") == 1, out.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [["-p", "xdist.plugin", "-n", "1"], []], ids=["xdist", "no-xdist"])
def test_a_test_running_longer_than_the_interval_is_named_while_it_runs(tmp_path, workers):
    (tmp_path / "test_mod.py").write_text("import time\n\ndef test_sleeps():\n    print('its own output')\n    time.sleep(2.5)\n")
    out = run_pytest(
        tmp_path, *workers, "-p", "selgate.lanes.progress", "-p", "no:cacheprovider", "test_mod.py",
        env=nested_env(SELGATE_PROGRESS_S="1"), timeout=110,
    )  # fmt: skip
    worker = "gw0 " if workers else ""
    beats = re.findall(rf"^progress: 0/1 tests \(0 %\) in \dm\d\ds; running: {worker}test_mod.py::test_sleeps \(0m0[1-3]s\)$",
                       out.stdout, re.MULTILINE)  # fmt: skip
    assert beats, out.stdout + out.stderr
    assert "1 passed" in out.stdout and "its own output" not in out.stdout  # the test's capture is its own


@pytest.mark.timeout(120)
def test_a_lane_with_recorded_durations_says_the_time_left_once_the_others_are_measured(tmp_path):
    (tmp_path / "test_mod.py").write_text(
        "import time, pytest\n\n@pytest.mark.parametrize('i', range(25))\ndef test_fast(i):\n    pass\n\n"
        "def test_slow():\n    time.sleep(2.5)\n"
    )
    (tmp_path / "durations.json").write_text(json.dumps({"tests": {"test_mod.py::test_slow": 3.0}}))
    out = run_pytest(
        tmp_path, "-p", "selgate.lanes.ordering", "-p", "selgate.lanes.progress", "-p", "no:cacheprovider", "test_mod.py",
        env=nested_env(SELGATE_PROGRESS_S="1", SELGATE_DURATIONS="durations.json"), timeout=110,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("progress: ")]
    assert "26 passed" in out.stdout, out.stdout + out.stderr
    early = [line for line in lines if int(re.match(r"progress: (\d+)/", line)[1]) < 20]  # under 20 others measured
    assert len(early) > 5 and not any("left" in line for line in early), lines
    beat = next((line for line in lines if "running: test_mod.py::test_slow" in line), None)  # 3 s recorded
    assert beat and re.search(r", about 0m0[0-2]s left; running: test_mod.py::test_slow \(0m0\ds of ~0m03s\)$", beat), lines


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [["-p", "xdist.plugin", "-n", "2"], []], ids=["xdist", "no-xdist"])
def test_each_failure_is_named_when_it_happens(tmp_path, workers):
    """A run cut before pytest's summary (a device call's time limit) still said what failed."""
    (tmp_path / "test_mod.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(4))\ndef test_x(i):\n    assert i % 2 == 0, f'odd {i}'\n"
    )
    out = run_pytest(
        tmp_path, *workers, "-p", "selgate.lanes.progress", "-p", "no:cacheprovider", "-q", "test_mod.py",
        env=nested_env(SELGATE_PROGRESS_S="0"), timeout=110,
    )  # fmt: skip
    line = r"^failed: (test_mod.py::test_x\[\d\]) \(call\): AssertionError: (odd \d)"
    named = sorted(re.findall(line, out.stdout, re.MULTILINE))
    assert named == [("test_mod.py::test_x[1]", "odd 1"), ("test_mod.py::test_x[3]", "odd 3")], out.stdout + out.stderr
