"""No process the kernel starts outlives the check. The check is a child subreaper (Linux
prctl PR_SET_CHILD_SUBREAPER): a descendant whose parent dies, in a session of its own or not,
becomes the check's child instead of init's, so once a run's pytest has exited the check kills
every process still below it before it reads a result. A helper the kernel left behind could
otherwise rewrite junit.xml after pytest wrote it."""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """True where the kernel granted it (Linux 3.4 and later)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list:
    """Live (not zombie) processes whose parent is `pid`, read from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rpartition(")")[2].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid and state != "Z":
            out.append(int(stat.parent.name))
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(rounds: int = 100) -> int:
    """SIGKILL every process below this one, round after round (killing a parent hands its own
    children to this subreaper), and reap them; how many were killed. Call it only once every
    child this process waits on itself has been waited for."""
    killed = 0
    for _ in range(rounds):
        _reap()
        live = children(os.getpid())
        if not live:
            return killed
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    _reap()
    return killed
