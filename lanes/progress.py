"""pytest plugin (`-p selgate.lanes.progress`): a long lane says how far it is, how fast it
goes and how long it has left, so that whoever waits (or sets a timeout) can tell a slow lane
from a stuck one. The controller prints one line every SELGATE_PROGRESS_S seconds (default 30)
and each time another STEP_PERCENT of the tests is done:

    progress: 812/3941 tests (20 %) in 4m05s, 3.31 tests/s, about 15m45s left

The rate counts from the first result, so collection and worker start-up do not dilute it."""

from __future__ import annotations

import os
import time

import pytest

from selgate.reports.outcome import outcome_known

INTERVAL_ENV = "SELGATE_PROGRESS_S"
DEFAULT_INTERVAL_S = 30.0
STEP_PERCENT = 5


def clock_text(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
    """Counts finished tests against the collected total and says when a line is due."""

    def __init__(self, every_s: float = DEFAULT_INTERVAL_S, clock=time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.total = 0
        self.done: set = set()
        self.started = self.last_line = None
        self.last_step = 0

    def finished(self, nodeid: str) -> str | None:
        """Record `nodeid` as done; the progress line when one is due, else None."""
        now = self.clock()
        if self.started is None:
            self.started = self.last_line = now
        if nodeid in self.done:
            return None
        self.done.add(nodeid)
        step = len(self.done) * 100 // self.total // STEP_PERCENT if self.total else 0
        if now - self.last_line < self.every_s and step == self.last_step:
            return None
        self.last_line, self.last_step = now, step
        return self.line(now)

    def line(self, now: float) -> str:
        done, elapsed = len(self.done), now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"progress: {done}/{self.total or '?'} tests"
        if self.total:
            text += f" ({100 * done // self.total} %)"
        text += f" in {clock_text(elapsed)}, {rate:.2f} tests/s"
        if self.total and rate > 0:
            text += f", about {clock_text(max(self.total - done, 0) / rate)} left"
        return text


class ProgressPlugin:
    def __init__(self, config, progress: Progress):
        self.config, self.progress = config, progress

    def _write(self, line: str | None) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if line and reporter is not None:
            if reporter._tw.width_of_current_line:  # after xdist's progress characters
                reporter._tw.line()
            reporter.write_line(line)

    def pytest_collection_finish(self, session):
        if session.items:  # under xdist the controller collects nothing; its workers say the total
            self.progress.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.progress.total = len(ids)

    def pytest_runtest_logreport(self, report):
        if outcome_known(report):
            self._write(self.progress.finished(report.nodeid))


def interval_from_env(environ=os.environ) -> float:
    raw = environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise pytest.UsageError(f"{INTERVAL_ENV}: expected seconds >= 0 between progress lines, got {raw!r}")
    return value


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) reports
        config.pluginmanager.register(ProgressPlugin(config, Progress(interval_from_env())), "selgate-progress")
