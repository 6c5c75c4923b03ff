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
    if _module_run(getattr(sys, "orig_argv", [])).partition(".")[0] != "selgate":
        return
    while sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]


def _module_run(argv: list) -> str:
    """The module `python [options] -m MODULE ...` runs, or "" for a script or `-c`: a `-m` after
    the script is the script's own (`pytest -m selgate_marker`)."""
    i = 1
    while i < len(argv) - 1:
        if argv[i] == "-m":
            return argv[i + 1]
        if argv[i] in ("-c", "-") or not argv[i].startswith("-"):
            return ""
        i += 2 if argv[i] in ("-X", "-W") else 1
    return ""


_off_the_callers_folder()
