"""selgate: a CI-gated validation harness and conformance suite for NSA selection attention."""

import os
import sys

__version__ = "0.1.0"


def _off_the_callers_folder() -> None:
    """`python -m selgate...` puts the current folder first on the import path of the process
    that runs the tool, where `selgate check` decides its verdict: a `junitparser.py` (or an
    `argparse.py`) beside the kernel under test then loaded in its place. selgate's tools run
    without it, as the console script does; the check's probe and executors, and bench, import
    the user's module from that folder themselves. Other programs' `-m` runs keep it."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" not in argv[:-1] or argv[argv.index("-m") + 1].partition(".")[0] != "selgate":
        return
    while sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]


_off_the_callers_folder()
