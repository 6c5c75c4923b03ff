"""The check's reaper (conformance/reaper.py) against a process chain whose links each start the
next and exit at once: it runs in a subreaper of its own (a child Python), which kills what lies
below it, and the chain's counter must stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHAIN = textwrap.dedent(
    """
    import os, sys, time
    from selgate.conformance.reaper import become_subreaper, kill_descendants

    assert become_subreaper()
    counter = sys.argv[1]
    if os.fork() == 0:  # the chain: each link bumps the counter, starts the next link, exits
        os.setsid()
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        for step in range(5000):
            with open(counter + ".new", "w") as f:  # replaced whole: a read never sees it half-written
                f.write(str(step))
            os.replace(counter + ".new", counter)
            time.sleep(0.001)
            if os.fork():
                os._exit(0)
        os._exit(0)
    time.sleep(0.3)
    killed = kill_descendants()
    before = open(counter).read()
    time.sleep(0.5)
    print(killed, before, open(counter).read())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is Linux's (prctl)")
def test_a_chain_of_processes_each_starting_the_next_is_killed(tmp_path):
    counter = tmp_path / "counter"
    out = subprocess.run([sys.executable, "-c", CHAIN, str(counter)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    killed, before, after = out.stdout.split()
    assert int(killed) >= 1 and before == after, out.stdout
