"""No process the kernel starts outlives the check. The check is a child subreaper (Linux
prctl PR_SET_CHILD_SUBREAPER): a descendant whose parent dies, in a session of its own or not,
becomes the check's child instead of init's, so once a run's pytest has exited the check kills
every process still below it before it reads a result. A helper the kernel left behind could
otherwise rewrite junit.xml after pytest wrote it."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """True where the kernel granted it (Linux 3.4 and later)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list:
    """`pid`'s live children, from its threads' /proc children lists: a few short reads, where a
    pass over all of /proc took longer than a link of a fork chain lives and saw none of them.
    A kernel without those lists (no CONFIG_PROC_CHILDREN) gets the pass over /proc."""
    lists = list(Path(f"/proc/{pid}/task").glob("*/children"))
    if lists:
        found = []
        for listed in lists:
            try:
                found += [int(c) for c in listed.read_text().split()]
            except OSError:
                continue
    else:
        found = [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if _stat(stat)[1] == pid]
    return [c for c in found if _stat(Path(f"/proc/{c}/stat"))[0] not in ("Z", None)]


def _stat(stat: Path) -> tuple:
    """(state, parent pid) of a process's /proc stat file; (None, None) once it is gone."""
    try:
        state, ppid = stat.read_text().rpartition(")")[2].split()[:2]
        return state, int(ppid)
    except (OSError, ValueError):
        return None, None


def descendants(pid: int) -> list:
    """Live (not zombie) processes below `pid` at any depth."""
    below, level = [], [pid]
    while level:
        level = [c for p in level for c in _children(p)]
        below += level
    return below


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(quiet_s: float = 0.2, limit_s: float = 30.0) -> int:
    """SIGKILL every process below this one, pass after pass (killing a parent hands its own
    children to this subreaper), and reap them, until passes over `quiet_s` find none; how many
    were killed. One empty pass is not enough: a chain of processes that each start the next
    and exit at once was between two links while a single pass read /proc, and lived on. Call
    it only once every child this process waits on itself has been waited for."""
    killed = 0
    start = calm = time.monotonic()
    while time.monotonic() - calm < quiet_s and time.monotonic() - start < limit_s:
        _reap()
        live = descendants(os.getpid())
        if live:
            calm = time.monotonic()
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    _reap()
    return killed
