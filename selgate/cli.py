"""`selgate <tool> ...`: one console script for the package's command-line modules."""

from __future__ import annotations

import runpy
import sys

TOOLS = {"check": "selgate.conformance.check", "lanes": "selgate.lanes", "reports": "selgate.reports", "bench": "selgate.bench"}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:
        sys.exit(f"usage: selgate {{{','.join(TOOLS)}}} ...  (e.g. `selgate check mypkg.mod:fn`)")
    sys.argv = [f"selgate {argv[0]}", *argv[1:]]
    runpy.run_module(TOOLS[argv[0]], run_name="__main__", alter_sys=True)
