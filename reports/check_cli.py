"""`selgate check` on the command line: the arguments are parsed and checked before anything
heavy (torch, the kernels) is imported, so `--help` and a usage error answer at once and a
usage error writes nothing."""

from __future__ import annotations

import sys

from selgate.cli_args import Parser, seconds, spec_problem, workers
from selgate.conformance.sizes import SIZES

DEFAULT_OUT = "selgate-check"
DESCRIPTION = """\
Runs selgate's conformance matrix on one selection-attention kernel, compared with the fp64
golden reference on fresh random inputs, and decides a verdict: exit 0 PASSED (every claimed
family has a pass), 1 BLOCKED, 2 usage error. The kernel is imported and called only in
processes of their own (an import or a case that crashes, exits or hangs is an error naming
that); an interrupted run still writes its results. Writes junit.xml, environment.json and
report.md (root causes first, each with a reproducer under repro/) into --out.

  selgate check mypkg.kernels:selection [--declare selection.yaml]

The kernel is called fn(q, k, v, ranges, *, scale=None); what it supports (dtypes, head dims,
modes, backward, ...) is declared as attributes of fn or in the --declare YAML file (docs/validate.md).
"""


def parser() -> Parser:
    p = Parser(prog="selgate check", description=DESCRIPTION)
    p.add_argument("impl", help="the kernel, package.module:callable, imported from the current folder")
    p.add_argument("--declare", help="YAML file of declarations and expected failures")
    p.add_argument("--size", default="tiny", choices=SIZES, help="largest case size class (default tiny)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report folder (default ./{DEFAULT_OUT})")
    p.add_argument("--workers", type=workers, default=None, help="isolated worker processes (default: the lanes' sizing)")
    p.add_argument("--timeout", type=seconds, default=300, help="seconds one case may take before it is an error (default 300)")
    p.add_argument(
        "--import-timeout",
        type=seconds,
        default=300,
        help="seconds importing the kernel's module may take, selgate's own start-up not counted (default 300)",
    )
    p.add_argument("-k", help="pytest -k expression (debugging: the verdict is then BLOCKED as narrowed)")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    problem = spec_problem(args.impl, "impl")
    if problem:
        p.error(problem)
    from .check import main as check

    return check(args)


if __name__ == "__main__":
    sys.exit(main())
