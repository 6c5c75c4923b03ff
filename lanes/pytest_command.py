"""The pytest command line of every selgate run, built in one place: a lane, its inventory and
`selgate check` differ in what they select and how they report, not in how pytest runs them
(only the plugins they name, their own ini file and rootdir, workers that may crash and be
replaced, a per-test timeout on a thread, JUnit in the xunit2 form the reports read)."""

from __future__ import annotations

import sys


def pytest_args(
    *,
    plugins,
    config,
    select=(),
    workers: int | None = None,
    dist: str | None = None,
    max_worker_restart: int | None = None,
    timeout: float | None = None,
    junit: str | None = None,
    k: str | None = None,
    output=(),
) -> list:
    """pytest's arguments: `-p` for each of `plugins` (autoloading is off), `config` (the ini
    file and rootdir options), the selection `select`, then the run's workers, timeout, JUnit
    file, `-k` and `output` options where given."""
    args = [*(a for p in plugins for a in ("-p", p)), *config, *select]
    if workers is not None:
        args += ["-n", str(workers)]
        if dist:
            args += ["--dist", dist]
        args += ["--max-worker-restart", str(max_worker_restart)]
    if timeout is not None:
        args += ["--timeout", str(timeout), "--timeout-method", "thread"]
    if junit is not None:
        args += ["--junitxml", str(junit), "-o", "junit_family=xunit2"]
    if k:
        args += ["-k", k]
    return [*args, *output]


def pytest_command(args) -> list:
    """`python -m pytest args` in this interpreter."""
    return [sys.executable, "-m", "pytest", *args]
