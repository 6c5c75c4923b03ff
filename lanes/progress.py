"""pytest plugin (`-p selgate.lanes.progress`): a long run says how far it is, what it is running
and how long it has left, so that whoever waits (or sets a timeout) can tell a slow run from a
stuck one. The lanes and bin/test load it. The controller (of an xdist run, or a run without
xdist) prints a line each time another STEP_PERCENT of the tests is done and, from a timer
thread, whenever SELGATE_PROGRESS_S seconds (default 30) passed without a line, whatever the
tests do; when no test finished in that time, the line names the tests running:

    progress: 812/3941 tests (20 %) in 4m05s, 3.31 tests/s, about 15m45s left
    progress: 0/4710 tests (0 %) in 1m07s; running: gw0 tests/kernels/test_cuda_compile.py::test_compile[sm90] (0m31s of ~1m54s)

Each failure is named the moment it is reported, with the first line of its message (the first
FAILURES_SHOWN of them), so a run cut short before pytest's summary still says what failed:

    failed: conformance/test_conformance.py::test_dtype[cuda-...] (call): ConformanceFailure: [...] o: ...

`in` counts from the session's start; the rate counts from the first result, so collection and
worker start-up do not dilute it. The time left is said only once it means something
(`Progress.time_left`), never extrapolated from the first few slow tests."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from selgate.outcome import outcome_known

INTERVAL_ENV = "SELGATE_PROGRESS_S"
DEFAULT_INTERVAL_S = 30.0
STEP_PERCENT = 5
# Without recorded durations, a rate is trusted after this share of the tests and this long.
RATE_MIN_PERCENT = 10
RATE_MIN_S = 60.0
# The tests a durations file does not list (each under its min_s) are costed at the mean of
# at least this many of them measured in this run; before, at the mean the file recorded.
MIN_MEASURED = 20
# The run's own pace (wall time per recorded worker-second) is trusted once this share of the
# recorded work is done (and RATE_MIN_S passed).
PACE_MIN_SHARE = 0.1
RUNNING_SHOWN = 4
ORDERING_PLUGIN = "selgate.lanes.ordering"  # its SELGATE_DURATIONS are the recorded durations
PHASES = ("setup", "call", "teardown")
FAILURES_SHOWN = 20  # failures named as they happen; pytest's summary lists them all


def clock_text(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
    """What the run has done and is doing, and when a line is due; the hooks and the timer
    thread share it, so every method takes the lock. `durations` are recorded seconds per test
    id (the lane's durations file), `workers` the xdist workers that share the tests."""

    def __init__(
        self,
        every_s: float = DEFAULT_INTERVAL_S,
        clock=time.monotonic,
        durations=None,
        workers: int = 1,
        others_mean=None,
        others_below=None,
    ):
        self.every_s, self.clock = every_s, clock
        self.durations, self.workers = durations or {}, max(1, workers)
        self.others_mean = others_mean  # the recorded mean of the tests the durations do not list
        # Those tests each took less than this (the file's min_s) when recorded: an unlisted test
        # that takes longer here (one the recorded run skipped, as the CPU lane skips slow tests)
        # says nothing of the rest, and is kept out of their mean.
        self.others_below = others_below
        self.lock = threading.RLock()
        self.total = 0
        self.ids: set = set()  # the collected ids, where known: the tests left are these less done
        self.done: set = set()
        self.running: dict = {}  # nodeid -> (start, worker id or None)
        self.seconds: dict = {}  # nodeid -> seconds measured so far (its phases' reports)
        self.measured, self.measured_s = 0, 0.0  # the finished tests the durations do not list: count, seconds
        self.strangers: set = set()  # unlisted tests that took the file's min_s or more: their own time is their cost
        self.first_start = None
        self.session_start = self.last_line = clock()
        self.first_result = self.last_result = None
        self.last_step = 0

    def collected(self, ids) -> None:
        with self.lock:
            self.ids, self.total = set(ids), len(ids)

    def started(self, nodeid: str) -> None:
        with self.lock:
            self.running[nodeid] = (self.clock(), None)
            if self.first_start is None:
                self.first_start = self.running[nodeid][0]

    def timed(self, nodeid: str, seconds: float, worker: str | None = None) -> None:
        """A phase of `nodeid` took `seconds`; `worker` runs it."""
        with self.lock:
            self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + seconds
            if worker and nodeid in self.running:
                self.running[nodeid] = (self.running[nodeid][0], worker)

    def ended(self, nodeid: str) -> None:
        with self.lock:
            self.running.pop(nodeid, None)

    def finished(self, nodeid: str) -> str | None:
        """Record `nodeid` as done; the progress line when one is due (another STEP_PERCENT
        done, or every_s since the last line), else None."""
        with self.lock:
            now = self.clock()
            if self.first_result is None:
                self.first_result = now
            if nodeid in self.done:
                return None
            self.done.add(nodeid)
            self.last_result = now
            took = self.seconds.get(nodeid, 0.0)
            if nodeid not in self.durations and (self.others_below is None or took < self.others_below):
                self.measured += 1
                self.measured_s += took
            elif nodeid not in self.durations:
                self.strangers.add(nodeid)
            step = len(self.done) * 100 // self.total // STEP_PERCENT if self.total else 0
            if now - self.last_line < self.every_s and step == self.last_step:
                return None
            self.last_step = step
            return self.line(now)

    def wait_s(self) -> float:
        """Seconds until the timer's next line is due."""
        with self.lock:
            return max(0.0, self.last_line + self.every_s - self.clock())

    def tick(self) -> str | None:
        """The timer's line, when every_s passed without one; it names the running tests when
        none finished in that time."""
        with self.lock:
            now = self.clock()
            if now - self.last_line < self.every_s:
                return None
            quiet = self.last_result is None or now - self.last_result >= self.every_s
            return self.line(now, running=quiet)

    def line(self, now: float, *, running: bool = False) -> str:
        with self.lock:
            self.last_line = now
            done = len(self.done)
            text = f"progress: {done}/{self.total or '?'} tests"
            if self.total:
                text += f" ({100 * done // self.total} %)"
            text += f" in {clock_text(now - self.session_start)}"
            if done and now > self.first_result:
                text += f", {done / (now - self.first_result):.2f} tests/s"
            left = self.time_left(now)
            if left is not None:
                text += f", about {clock_text(left)} left"
            if running and self.running:
                text += "; running: " + self.running_text(now)
            elif running and not self.total:
                text += "; collecting"
            return text

    def running_text(self, now: float) -> str:
        """The longest-running tests, each with its worker, how long it has run and, where
        recorded, how long it took last time."""
        ordered = sorted(self.running.items(), key=lambda kv: kv[1][0])
        shown = []
        for nodeid, (start, worker) in ordered[:RUNNING_SHOWN]:
            recorded = self.durations.get(nodeid)
            took = f" of ~{clock_text(recorded)}" if recorded else ""
            shown.append(f"{worker + ' ' if worker else ''}{nodeid} ({clock_text(now - start)}{took})")
        more = len(ordered) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def time_left(self, now: float) -> float | None:
        """Seconds left, or None while no estimate means anything. From recorded durations,
        where the run has them (`recorded_left`). Otherwise from
        the rate, once RATE_MIN_PERCENT of the tests are done and RATE_MIN_S passed since the
        first result."""
        with self.lock:
            estimate = self.recorded_left(now)
            if estimate is not None:
                return estimate
            done = len(self.done)
            if not self.total or not done or 100 * done < RATE_MIN_PERCENT * self.total:
                return None
            elapsed = now - self.first_result
            if elapsed < RATE_MIN_S:
                return None
            return max(self.total - done, 0) * elapsed / done

    def recorded_left(self, now: float) -> float | None:
        """The recorded worker-seconds left (the recorded tests left, less what they have run,
        and the others at the recorded mean, or the mean measured here where the file has none)
        times this run's pace, once it has one; before that shared over the workers. Never less
        than the longest recorded test left."""
        if not self.durations or not self.ids:
            return None
        left = self.ids - self.done
        recorded = [
            max(self.durations[i] - (now - self.running[i][0] if i in self.running else 0.0), 0.0)
            for i in left
            if i in self.durations
        ]
        others = len(left) - len(recorded)
        if not others:
            mean = 0.0
        elif self.others_mean is not None:
            mean = self.others_mean
        elif self.measured >= MIN_MEASURED:
            mean = self.measured_s / self.measured
        else:
            return None
        work = sum(recorded) + others * mean
        pace = self.pace(now, work, mean)
        return max(work * pace if pace is not None else work / self.workers, max(recorded, default=0.0))

    def pace(self, now: float, work_left: float, mean: float) -> float | None:
        """Wall seconds this run takes per recorded worker-second, once PACE_MIN_SHARE of the
        recorded work is done and RATE_MIN_S have passed: it holds however many workers share
        however many cores, and however much slower this machine is than the recorded run (the
        ETA of bin/test said 16m41s left with 3m13s to go, and 6m00s at the start of an 8m41s run)."""
        if self.first_start is None or now - self.first_start < RATE_MIN_S:
            return None
        done = sum(self.durations.get(i, mean) for i in self.done if i not in self.strangers)
        done += sum(self.seconds.get(i, 0.0) for i in self.strangers)
        done += sum(min(now - start, self.durations.get(i, mean)) for i, (start, _) in self.running.items())
        if done <= 0 or done < PACE_MIN_SHARE * (done + work_left):
            return None
        return (now - self.first_start) / done


class Terminal:
    """Where the lines go, from the hooks and the timer thread alike, flushed (a CI log is a
    pipe). An xdist controller runs no test, so pytest's terminal reporter takes them. Without
    xdist the tests run in this process, and while one runs its output capture holds stdout: the
    lines then go to a copy of stdout's descriptor, taken while nothing captured."""

    def __init__(self, config, *, distributed: bool):
        self.config, self.lock, self.direct = config, threading.Lock(), None
        self.reporter_width = 0  # the reporter's line when we last wrote past it
        if not distributed:
            try:
                self.direct = os.fdopen(os.dup(1), "w", buffering=1)
            except OSError:  # no descriptor 1: the reporter it is
                pass

    def write(self, line: str | None) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if not line or reporter is None:
            return
        with self.lock:
            tw = reporter._tw
            if self.direct is None:
                if tw.width_of_current_line:  # after xdist's progress characters
                    tw.line()
                tw.line(line)
                tw.flush()
            else:  # a new line only where the reporter wrote since our last line
                width = tw.width_of_current_line
                self.direct.write(("\n" if width and width != self.reporter_width else "") + line + "\n")
                self.reporter_width = width

    def close(self) -> None:
        if self.direct is not None:
            self.direct.close()
            self.direct = None


class ProgressPlugin:
    def __init__(self, config, progress: Progress):
        self.config, self.progress = config, progress
        self.terminal = Terminal(config, distributed=distributed(config))
        self.stop = threading.Event()
        self.timer = threading.Thread(target=self._beat, name="selgate-progress", daemon=True)
        self.failures_shown = 0

    def _beat(self) -> None:
        while not self.stop.wait(max(self.progress.wait_s(), 0.05)):
            self.terminal.write(self.progress.tick())

    def pytest_sessionstart(self, session):
        if self.progress.every_s > 0:  # 0: a line for every result, nothing to wait for
            self.timer.start()
        quiet_status_once(self.config)

    def pytest_collection_finish(self, session):
        if session.items:  # under xdist the controller collects nothing; its workers say the total
            self.progress.collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.progress.collected(ids)

    def pytest_runtest_logstart(self, nodeid, location):
        self.progress.started(nodeid)

    def pytest_runtest_logreport(self, report):
        if report.when in PHASES:
            self.progress.timed(report.nodeid, report.duration, getattr(report, "worker_id", None))
        else:  # xdist's report of a test whose worker crashed: nothing runs it any more
            self.progress.ended(report.nodeid)
        if report.failed and self.failures_shown < FAILURES_SHOWN:
            self.failures_shown += 1
            last = self.failures_shown == FAILURES_SHOWN
            self.terminal.write(failure_line(report) + (" (later failures: pytest's summary)" if last else ""))
        if outcome_known(report):
            self.terminal.write(self.progress.finished(report.nodeid))

    def pytest_runtest_logfinish(self, nodeid, location):
        self.progress.ended(nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        """The timer stops before pytest's summary is written."""
        self.stop.set()
        if self.timer.is_alive():
            self.timer.join(timeout=5)

    def pytest_unconfigure(self, config):
        self.pytest_sessionfinish(None)  # a session that never started or finished
        self.terminal.close()


def failure_line(report) -> str:
    """`failed: <test> (<phase>): <the first line of its message>`, at most about 200 characters."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr or "")
    first = next((line.strip() for line in message.splitlines() if line.strip()), "no message")
    return f"failed: {report.nodeid} ({report.when}): {first[:160]}"


def interval_from_env(environ=os.environ) -> float:
    raw = environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise pytest.UsageError(f"{INTERVAL_ENV}: expected seconds >= 0 between progress lines, got {raw!r}")
    return value


def recorded_durations(config) -> tuple[dict, float | None]:
    """The durations the ordering plugin orders this run by, the recorded mean of the tests
    they do not list and the bound each of those was under (min_s), where that plugin is loaded
    and names a readable file; else none (that plugin reports a missing or malformed file)."""
    ordering = config.pluginmanager.get_plugin(ORDERING_PLUGIN)
    path = os.environ.get(ordering.DURATIONS_ENV) if ordering else None
    if not path:
        return {}, None, None
    try:
        full = Path(config.rootpath) / path
        return ordering.load_durations(full), ordering.load_others_mean(full), ordering.load_min_s(full)
    except (OSError, ValueError, TypeError, KeyError):
        return {}, None, None


def distributed(config) -> bool:
    """Whether xdist workers run the tests (this process only collects their results)."""
    return getattr(config.option, "dist", "no") != "no"


def quiet_status_once(config) -> None:
    """xdist's status line, written as a line when the output is not a terminal, reads "bringing
    up nodes..." under -q whatever the state; it is written when the workers start and again when
    their collection ends, where it misleads. Keep the first (this plugin's lines follow)."""
    trdist = config.pluginmanager.get_plugin("terminaldistreporter")
    show = getattr(trdist, "ensure_show_status", None)
    if show is None or getattr(trdist, "_isatty", True) or config.option.verbose >= 0:
        return
    shown = []

    def once():
        if not shown:
            shown.append(True)
            show()

    trdist.ensure_show_status = once


def worker_count(config) -> int:
    """The xdist workers that share the tests (1 without xdist)."""
    if not distributed(config):
        return 1
    return len(getattr(config.option, "tx", None) or []) or 1


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) reports
        durations, others_mean, min_s = recorded_durations(config)
        progress = Progress(
            interval_from_env(),
            durations=durations,
            workers=worker_count(config),
            others_mean=others_mean,
            others_below=min_s,
        )
        config.pluginmanager.register(ProgressPlugin(config, progress), "selgate-progress")
