"""The verdict and Markdown report of `selgate check`: which families the implementation
claims (from its declarations), what ran in each, what was not covered and why, every
failure with a line that reruns it alone."""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from selgate import __version__
from selgate.reports.results import OUTCOMES, load_lane

from .cases import DTYPE_NAMES
from .plugin import FAMILY_MARKERS
from .registry import Impl

ABORTED = {2: "interrupted", 3: "pytest internal error", 4: "pytest usage error"}


def claimed_families(impl: Impl) -> dict:
    """{family: None when claimed, else why it is not}: the families a pass requires."""
    claims = {f: None for f in FAMILY_MARKERS if f != "policy"}
    if not impl.backward:
        claims["backward"] = "backward not declared (backward: false)"
    if not impl.backward or torch.float64 not in impl.dtypes:
        claims["gradcheck"] = "needs backward and fp64 declared"
    if not impl.deterministic:
        claims["determinism"] = "declared non-deterministic (deterministic: false)"
    if impl.varlen is None:
        claims["varlen"] = "no varlen callable declared"
    if not {"decode", "prefill"} <= set(impl.modes):
        claims["decode"] = "needs modes decode and prefill"
    return claims


@dataclass
class Verdict:
    counts: dict  # family -> outcome counts
    claims: dict  # family -> None (claimed) or why not
    blocking: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # CaseResult
    skips: dict = field(default_factory=dict)  # family -> Counter of skip reasons
    environment: dict | None = None

    @property
    def passed(self) -> bool:
        return not self.blocking

    @property
    def headline(self) -> str:
        if self.passed:
            claimed = [f for f, why in self.claims.items() if why is None]
            return f"CHECK PASSED: {len(claimed)} claimed families ({', '.join(claimed)})"
        more = f" (and {len(self.blocking) - 1} more)" if len(self.blocking) > 1 else ""
        return f"CHECK BLOCKED: {self.blocking[0]}{more}"


def judge(impl: Impl, out: Path, status: int, *, narrowed: bool = False) -> Verdict:
    """The verdict on the run whose JUnit is in `out` and whose pytest exited `status`."""
    result = load_lane("check", out)
    cases = result.cases if result else []
    claims = claimed_families(impl)
    v = Verdict({}, claims, environment=result.environment if result else None)
    if status in ABORTED:
        v.blocking.append(f"run aborted: pytest exit {status} ({ABORTED[status]})")
    if narrowed:
        v.blocking.append("run narrowed with -k: a verdict needs the whole matrix")
    if not cases:
        v.blocking.append(f"no results: {out / 'junit.xml'} is missing or empty")
    for c in cases:
        v.counts.setdefault(c.family, dict.fromkeys(OUTCOMES, 0))[c.outcome] += 1
        if c.outcome in ("fail", "error"):
            v.failures.append(c)
        elif c.outcome == "skip":
            v.skips.setdefault(c.family, Counter())[c.message] += 1
    for c in v.failures:
        v.blocking.append(f"{c.outcome.upper()} {c.nodeid}: {c.message}")
    for family, why in claims.items():
        ran = family in v.counts
        if why is None and cases and (ran or not narrowed) and v.counts.get(family, {}).get("pass", 0) == 0:
            v.blocking.append(f"claimed family {family} has no passing test")
    return v


def _declared(impl: Impl) -> list:
    dtypes = ", ".join(DTYPE_NAMES[d] for d in impl.dtypes)
    rows = [
        ("dtypes", dtypes),
        ("devices", ", ".join(impl.devices)),
        ("modes", ", ".join(impl.modes)),
        ("lse", impl.lse),
        ("backward", impl.backward),
        ("deterministic", impl.deterministic),
        (
            "head dims",
            f"multiples of {impl.head_dim_multiple} from {impl.min_head_dim}"
            + (f" up to {impl.max_head_dim}" if impl.max_head_dim else ""),
        ),
        (
            "heads per group",
            f"multiple of {impl.heads_multiple_of}, >= {impl.min_heads}"
            + (f", <= {impl.max_heads}" if impl.max_heads else "")
            + (", power of two" if impl.heads_power_of_two else ""),
        ),
        ("block size", impl.block_size or "token ranges"),
        ("layouts", ", ".join(impl.layouts)),
        ("min capability", impl.min_capability or "any"),
        ("max size", impl.max_size),
    ]
    rows += [(f"xfail {x.family}", f"`{x.cases}`: {x.reason}") for x in impl.xfails]
    return rows


def repro(args, nodeid: str) -> str:
    """A pytest line rerunning one case alone, in-process (no workers)."""
    test, _, param = nodeid.partition("::")[2].partition("[")
    expr = f"{test} and {param.rstrip(']').split('-', 1)[-1]}" if param else test
    declare = ["--declare", str(Path(args.declare).resolve())] if args.declare else []
    return shlex.join(
        [
            "python",
            "-m",
            "pytest",
            "--pyargs",
            "selgate.conformance",
            "-m",
            "conformance",
            "--impl",
            args.impl,
            *declare,
            "--size",
            args.size,
            "-k",
            expr,
            "-p",
            "no:xdist",
        ]
    )


def render(impl: Impl, v: Verdict, args) -> str:
    env = v.environment or {}
    lines = [
        f"# selgate check: `{impl.name}`",
        "",
        f"**{v.headline}**",
        "",
        f"Run: size `{args.size}`, {args.workers} isolated worker(s), {args.timeout} s per case"
        + (f", declarations from `{args.declare}`" if args.declare else "")
        + ".",
        f"Environment: GPU {env.get('gpu', '?')} (capability {env.get('capability', '?')}), driver "
        f"{env.get('driver', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
        f"selgate {__version__} (commit {env.get('commit', '?')}).",
        "",
        "## Declared",
        "",
        "| declaration | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {str(val).replace('|', '/')} |" for k, val in _declared(impl)]
    lines += [
        "",
        "## Families",
        "",
        "pass/fail/error/skip/xfail per family; a claimed family needs a pass.",
        "",
        "| family | claimed | " + "/".join(OUTCOMES) + " |",
        "| --- | --- | --- |",
    ]
    for family, why in v.claims.items():
        counts = v.counts.get(family, dict.fromkeys(OUTCOMES, 0))
        cell = "/".join(str(counts[o]) for o in OUTCOMES)
        lines.append(
            f"| {family} | {'yes' if why is None else 'no: ' + why} | "
            f"{'**' + cell + '**' if counts['fail'] or counts['error'] else cell} |"
        )
    if v.blocking:
        lines += ["", "## Blocking", ""] + [f"- {b}" for b in v.blocking[:200]]
    if v.failures:
        lines += ["", "## Failures, each with a line that reruns it", ""]
        for c in v.failures[:200]:
            lines += [f"- `{c.nodeid}` ({c.outcome}): {c.message}", f"  `{repro(args, c.nodeid)}`"]
    if v.skips:
        lines += ["", "## Not covered (declared skips)", "", "| family | cases | reason |", "| --- | --- | --- |"]
        for family, reasons in sorted(v.skips.items()):
            lines += [f"| {family} | {n} | {why.replace('|', '/')} |" for why, n in reasons.most_common()]
    return "\n".join(lines) + "\n"
