"""A lane cut short (a timeout's SIGINT, a cancelled workflow's SIGINT then SIGTERM, Ctrl-C)
still leaves its results: the first SIGINT or SIGTERM the runner receives reaches pytest as
one SIGINT, on which pytest finishes its session and writes the JUnit of every test done;
later signals are ignored so that they cannot interrupt that write. pytest runs in a session
of its own, so a signal sent to the whole process group (a terminal's Ctrl-C, `timeout`)
reaches it once, through the runner, rather than twice.

The stamp plugin records the cut in environment.json (`cut`: how far the run got); the runner
adds which signal cut it, which pytest itself cannot tell (it only sees KeyboardInterrupt)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from selgate.environment import ENV_FILE

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Cut:
    """While entered, the first SIGINT or SIGTERM calls `on_first()` and is remembered in
    `signal` (its name); later ones only print that the results are being written."""

    def __init__(self, on_first):
        self.on_first = on_first
        self.signal: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, _frame):
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            print(f"lane: {self.signal} received; pytest is writing the results it has", file=sys.stderr, flush=True)
            self.on_first()
        else:
            print(
                f"lane: {signal.Signals(signum).name} ignored: pytest is still writing the results of the cut run",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False


def default_sigint() -> None:
    """`preexec_fn` of the pytest process: SIGINT back to its default disposition, which Python
    turns into KeyboardInterrupt. A runner started with SIGINT ignored (a background job of a
    non-interactive shell, `nohup`) would otherwise pass that on, and the SIGINT it forwards
    would not cut the run: pytest ran all 40 tests of a lane cut after 6."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def raise_interrupt() -> None:
    """`on_first` for a run that stops on KeyboardInterrupt itself (the Docker backend)."""
    raise KeyboardInterrupt


def mark_signal(out_dir: Path, signal_name: str | None) -> None:
    """Name the signal in the `cut` record the stamp plugin left in environment.json; a run
    that finished before the signal reached it (no `cut`) is left as it is."""
    path = Path(out_dir) / ENV_FILE
    if signal_name is None or not path.exists():
        return
    env = json.loads(path.read_text())
    if not env.get("cut"):
        return
    env["cut"]["signal"] = signal_name
    path.write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
