"""The verdict and Markdown report of `selgate check`: which families the implementation
claims (from its declarations), what ran in each, what was not covered and why, every
failure with a line that reruns it alone."""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from junitparser import Error, JUnitXml, TestCase, TestSuite

from selgate import __version__
from selgate.conformance.check_plugin import CLAIMS_FILE, COLLECTED_FILE
from selgate.conformance.declarations import LAYOUTS
from selgate.conformance.impl import Impl
from selgate.conformance.sizes import SIZES
from selgate.environment import ENV_FILE
from selgate.kernels.served import run_environment
from selgate.reports.results import OUTCOMES, load_lane
from selgate.verdict import Verdict, pytest_exit

from . import triage
from .markdown import duration_summary

SHOWN_SKIPS = 12  # reasons listed under "Not covered"; the rest are counted
SHOWN_NEVER_RAN = 8


@dataclass(kw_only=True)
class CheckVerdict(Verdict):
    subject = "CHECK"
    counts: dict = field(default_factory=dict)  # family -> outcome counts
    claims: dict = field(default_factory=dict)  # family -> None (claimed) or why not
    failures: list = field(default_factory=list)  # CaseResult
    skips: dict = field(default_factory=dict)  # family -> Counter of skip reasons
    environment: dict | None = None
    causes: list = field(default_factory=list)  # triage.RootCause, most failures first
    repros: dict = field(default_factory=dict)  # signature -> reproducer file
    never_ran: list = field(default_factory=list)  # collected ids without a result (a cut run)
    cut: str | None = None  # the signal that cut the run
    size: str | None = None  # the largest case size class run
    xfails: Counter = field(default_factory=Counter)  # dtype (or "bad input") -> declared expected failures
    uncovered: list = field(default_factory=list)  # what no case ran of: "families a, b", "dtype bf16", "mode decode"
    isolation: str = "not started"  # how the kernel's processes were confined, as the probe recorded it
    tf32: bool = False  # fp32 declared as computed with TF32 matmuls: judged by the looser rule, said on the first line
    block_size: int | None = None  # selections of whole blocks (declared): said on the first line
    limits: list = field(default_factory=list)  # declarations that keep cases out (`declared_limits`): said on the first line
    durations: list = field(default_factory=list)  # report lines: test-seconds by family, the slowest cases

    def scope(self) -> str:
        """The claimed families, then what never ran of the kernel (every case skipped)."""
        claimed = [f for f, why in self.claims.items() if why is None]
        never = f"; never ran (every case skipped): {'; '.join(self.uncovered)}" if self.uncovered else ""
        return f"{len(claimed)} claimed families ({', '.join(claimed)}){never}"

    @property
    def headline(self) -> str:
        """A pass says what it covered: `CHECK PASSED at size tiny with 57 declared expected
        failures in fp16: ...`, so a dtype broken behind declared expected failures, or one
        that never ran, is on the first line too."""
        if not self.passed:
            return super().headline
        words = [f"{self.subject} PASSED"] + ([f"at size {self.size}"] if self.size else [])
        words += ["with fp32 judged by the TF32 rule (declared)"] if self.tf32 else []
        words += [f"with selections of whole {self.block_size}-key blocks (declared)"] if self.block_size else []
        words += [f"within declared limits ({'; '.join(self.limits)})"] if self.limits else []
        if self.xfails:
            total = sum(self.xfails.values())
            where = ", ".join(f"{d} {n}" for d, n in self.xfails.most_common())
            where = f"in {next(iter(self.xfails))}" if len(self.xfails) == 1 else f"({where})"
            words.append(f"with {total} declared expected failure{'s' if total > 1 else ''} {where}")
        return " ".join(words) + f": {self.scope()}"

    def summary(self) -> list:
        """What the terminal shows under the headline: the other blocking reasons, then the
        root causes (the report has them in full)."""
        lines = [f"also blocking: {b}" for b in self.blocking[1:6]]
        return lines + [f"cause {i}: {c.count} x {c.signature}" for i, c in enumerate(self.causes[:6], 1)]

    def write_repros(self, out: Path, args) -> None:
        if self.causes:
            device = _device(self.environment)
            kw = dict(impl=args.impl, declare=_declare_path(args), size=args.size, device=device, limit_s=args.timeout)
            paths = triage.write_reproducers(self.causes, out, **kw)
            # as the report shows them: from the folder the check ran in, where the kernel imports
            self.repros = {sig: Path(os.path.relpath(p)) for sig, p in paths.items()}


def _device(env) -> str:
    return "cuda" if env and env.get("gpu", "none") != "none" else "cpu"


def _declare_path(args):
    return str(Path(args.declare).resolve()) if args.declare else None


def write_stub_junit(out: Path, name: str, message: str) -> None:
    """JUnit and environment of a run in which no case could start (the import failed or was
    cut): one error, so that CI shows the reason where it shows test results."""
    case = TestCase("import", classname="selgate.check")
    case.result = [Error(message)]
    suite = TestSuite(f"selgate check {name}")
    suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(out / "junit.xml"))
    env = {**run_environment(), "lane": "check", "load_error": message}
    (out / ENV_FILE).write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")


def _status_problem(status) -> str | None:
    """Why pytest's exit status alone blocks (0 and 1 are the verdict's to read)."""
    if status is None or status in (0, 1):
        return None
    if status < 0:
        return f"pytest was killed ({-status}) before it finished writing results"
    return f"run aborted: {pytest_exit(status)}"


def judge(impl, out: Path, status, *, narrowed=False, load_error=None, cut=None, size=None, left_behind=0) -> CheckVerdict:
    """The verdict on the run whose results are in `out` and whose pytest exited `status`
    (None: it never started). `impl` None when the implementation could not be loaded;
    `left_behind`: processes the run started that were alive after its pytest exited. The
    families `impl` claims come from the run's controller beside the JUnit (`read_claims`):
    this process never imports the families, which import torch."""
    if load_error:
        v = CheckVerdict(cut=cut)
        v.blocking.append(f"cut by {cut} while importing the implementation" if cut else f"not loaded: {load_error}")
        return v
    result = load_lane("check", out)
    cases = [c for c in (result.cases if result else []) if c.nodeid != "import"]
    claims = read_claims(out)
    v = CheckVerdict(claims=claims or {}, environment=result.environment if result else None, cut=cut, size=size)
    collected = json.loads((out / COLLECTED_FILE).read_text()) if (out / COLLECTED_FILE).exists() else []
    ran = {c.nodeid for c in cases}
    v.never_ran = [i for i in collected if i not in ran]
    v.durations = duration_summary({"check": result}, ["check"]) if result else []
    if cut or status == pytest.ExitCode.INTERRUPTED:
        done = len(collected) - len(v.never_ran) if collected else len(cases)
        v.blocking.append(
            f"run cut by {cut or 'an interruption'} after {done} of {len(collected) or '?'} cases; {len(v.never_ran)} never ran"
        )
    elif _status_problem(status):
        v.blocking.append(_status_problem(status))
    if left_behind:
        v.blocking.append(
            f"{left_behind} process(es) started by the run were still alive after pytest exited (killed): "
            "they could have changed the results after pytest wrote them"
        )
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
    v.xfails = Counter(_xfail_group(c) for c in cases if c.outcome == "xfail")
    v.uncovered = uncovered(impl, cases, size)
    v.tf32 = impl.fp32_matmul == "tf32" and "fp32" in impl.dtypes
    v.block_size = impl.block_size
    v.limits = declared_limits(impl)
    v.causes = triage.group(v.failures)
    if v.failures:
        v.blocking.append(
            f"{len(v.failures)} failing case(s) from {len(v.causes)} root cause(s); the first: {v.causes[0].signature}"
        )
    elif cases and all(c.outcome == "skip" for c in cases):  # pytest's exit 1 is the plugin's: none of its cases ran
        reason, n = Counter(c.message for c in cases).most_common(1)[0]
        v.blocking.append(f"no case ran: all {len(cases)} were skipped ({n} of them: {reason})")
        return v
    elif status == pytest.ExitCode.TESTS_FAILED and not cut:
        v.blocking.append(
            f"pytest exited 1 (tests failed) but {out / 'junit.xml'} records no failure: "
            "the results were changed after pytest wrote them"
        )
    if claims is None and cases:
        v.blocking.append(f"no family claims in {out / CLAIMS_FILE}: which families a pass needs is unknown")
    for family, why in v.claims.items():
        if why is None and cases and not narrowed and not cut and v.counts.get(family, {}).get("pass", 0) == 0:
            v.blocking.append(f"claimed family {family} has no passing test")
    return v


def read_claims(out: Path) -> dict | None:
    """{report family: None (claimed) or why not} as the run's controller wrote it, in rank
    order; None when it is missing or not such a mapping (a run cut before any worker ended)."""
    try:
        data = json.loads((out / CLAIMS_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data and all(isinstance(v, (str, type(None))) for v in data.values())
    return data if ok else None


def _bad_input(result) -> bool:
    return result.family == "bad_input"


def _xfail_group(result) -> str:
    """Where the headline counts a declared expected failure: its dtype, or bad input."""
    return "bad input" if _bad_input(result) else triage.case_of(result)[1] or "other"


def uncovered(impl, cases: list, size: str | None = None) -> list:
    """What no case ran of (each skipped): families, then the dtypes and modes `impl` declares,
    then the size classes up to `size` (the run's) above the `max_size` it declares, then the
    bug-class case sets."""
    ran = [c for c in cases if c.outcome != "skip"]
    ids = [triage.case_of(c)[:2] for c in ran if not _bad_input(c)]
    ids = [(case, dtype) for case, dtype in ids if case]
    above = SIZES[SIZES.index(impl.max_size) + 1 : SIZES.index(size) + 1] if size in SIZES and impl.max_size in SIZES else ()
    groups = (
        (("family", "families"), [f for f in dict.fromkeys(c.family for c in cases) if not any(r.family == f for r in ran)]),
        (("dtype", "dtypes"), [d for d in impl.dtypes if not any(dtype == d for _, dtype in ids)]),
        (("mode", "modes"), [m for m in impl.modes if not any(case.startswith(f"{m}-") for case, _ in ids)]),
        (("size", "sizes"), [f"{s} (declared max_size {impl.max_size})" for s in above]),
        (("case set", "case sets"), _sets_never_ran(cases, ran)),
    )
    return [f"{what[len(names) > 1]} {', '.join(names)}" for what, names in groups if names]


def declared_limits(impl: Impl) -> list:
    """The declarations that keep cases of the matrix out, in words: a pass says it holds within
    them (head dims 16 to 64, heads a power of two and contiguous inputs alone left 193 of 501
    cases under a headline a full pass's word for word)."""
    heads = [f"a multiple of {impl.heads_multiple_of}"] if impl.heads_multiple_of > 1 else []
    heads += ["a power of two"] if impl.heads_power_of_two else []
    heads += [f"at least {impl.min_heads}"] if impl.min_heads > 1 else []
    heads += [f"at most {impl.max_heads}"] if impl.max_heads else []
    dims = [f"multiples of {impl.head_dim_multiple}"] if impl.head_dim_multiple > 1 else []
    dims += [f"from {impl.min_head_dim}"] if impl.min_head_dim > 1 else []
    dims += [f"up to {impl.max_head_dim}"] if impl.max_head_dim else []
    modes = [m for m in ("decode", "prefill") if m in impl.modes]
    limits = [f"heads a group {', '.join(heads)}"] if heads else []
    limits += [f"head dims {' '.join(dims)}"] if dims else []
    limits += ["Dv == Dk"] if impl.same_head_dims else []
    limits += [f"{' and '.join(modes) or 'no decode or prefill'} only"] if len(modes) < 2 else []
    limits += [f"layouts {', '.join(impl.layouts)}"] if set(impl.layouts) != set(LAYOUTS) else []
    limits += [f"compute capability {impl.min_capability} and up"] if impl.min_capability else []
    return limits


def _sets(results: list) -> set:
    """The bug-class case sets (`Case.sets`, a JUnit fact) of `results`, bad input aside."""
    return {s for c in results if not _bad_input(c) for s in c.facts.get("sets", "").split(",") if s}


def _sets_never_ran(cases: list, ran: list) -> list:
    """The case sets some case of the run belongs to and no case judged against the reference
    did (a declared expected failure, or a determinism case alone, compares no value): what the
    declarations removed (in a review, head dims of 8 alone left 87 of 777 cases and none of four sets)."""
    judged = [c for c in ran if c.outcome in ("pass", "fail", "error") and c.family != "determinism"]
    return sorted(_sets(cases) - _sets(judged))


def _declared(impl: Impl) -> list:
    dtypes = ", ".join(impl.dtypes)
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
        ("same head dims (Dv == Dk)", impl.same_head_dims),
        ("fp32 matmuls", "TF32 (fp32 judged by SPEC.md's TF32 rule)" if impl.fp32_matmul == "tf32" else "IEEE fp32"),
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
    declare = ["--declare", _declare_path(args)] if args.declare else []
    return shlex.join(
        ["python", "-m", "pytest", "--pyargs", "selgate.conformance", "-m", "conformance", "--impl", args.impl, *declare]
        + ["--size", args.size, "-k", expr, "-p", "no:xdist"]
    )


def render(impl, v: CheckVerdict, args) -> str:
    """report.md: the verdict, then root causes first; bounded in length whatever the
    number of failures (the full list is junit.xml)."""
    env = v.environment or {}
    lines = [
        f"# selgate check: `{args.impl}`",
        "",
        f"**{v.headline}**",
        "",
        f"Run: size `{args.size}`, {args.workers} isolated worker(s), {args.timeout} s per case"
        + (f", declarations from `{args.declare}`" if args.declare else "")
        + ".",
        f"Environment: GPU {env.get('gpu', '?')} (capability {env.get('capability', '?')}), driver "
        f"{env.get('driver', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
        f"selgate {__version__} (commit {env.get('commit', '?')}).",
        f"Isolation: {v.isolation}. Out of its reach: the comparison, the reference, the results; "
        "within it: a kernel that recognises the check's inputs by their values.",
    ]
    if len(v.blocking) > 1:
        lines += ["", "Blocking:", ""] + [f"- {b}" for b in v.blocking]
    if v.never_ran:
        lines += _never_ran(v)
    if v.causes:
        lines += ["", *triage.render(v.causes, v.repros)]
        lines += ["", f"Rerun the smallest case of the first cause alone: `{repro(args, v.causes[0].smallest.nodeid)}`"]
    if impl is not None:
        lines += _families(v)
        lines += ["", "## Declared", "", "| declaration | value |", "| --- | --- |"]
        lines += [f"| {k} | {str(val).replace('|', '/')} |" for k, val in _declared(impl)]
    if v.skips:
        rows = [(family, n, why) for family, reasons in sorted(v.skips.items()) for why, n in reasons.most_common()]
        lines += ["", "## Not covered (declared skips)", "", "| family | cases | reason |", "| --- | --- | --- |"]
        lines += [f"| {f} | {n} | {why.replace('|', '/')[:200]} |" for f, n, why in rows[:SHOWN_SKIPS]]
        if len(rows) > SHOWN_SKIPS:
            lines.append(
                f"| ... | {sum(n for _, n, _ in rows[SHOWN_SKIPS:])} | {len(rows) - SHOWN_SKIPS} more reasons: junit.xml |"
            )
    lines += v.durations
    return "\n".join(lines) + "\n"


def _families(v: CheckVerdict) -> list:
    """The families table: each claimed family's counts; after a run cut before any worker ended
    (no claims written), the families that ran, their claims unknown."""
    claims = v.claims or dict.fromkeys(v.counts, "unknown")
    lines = [
        "",
        "## Families",
        "",
        "pass/fail/error/skip/xfail per family; a claimed family needs a pass."
        if v.claims
        else "pass/fail/error/skip/xfail per family; the run wrote no family claims (no worker finished), "
        "so which families a pass needs is unknown.",
        "",
        "| family | claimed | " + "/".join(OUTCOMES) + " |",
        "| --- | --- | --- |",
    ]
    for family, why in claims.items():
        counts = v.counts.get(family, dict.fromkeys(OUTCOMES, 0))
        cell = "/".join(str(counts[o]) for o in OUTCOMES)
        claimed = "yes" if why is None else why if not v.claims else "no: " + why
        lines.append(f"| {family} | {claimed} | {'**' + cell + '**' if counts['fail'] or counts['error'] else cell} |")
    if not claims:
        lines.append("| none ran | unknown | - |")
    return lines


def _never_ran(v: CheckVerdict) -> list:
    """The cases a cut run never reached, counted by family, a few named."""
    from selgate.conformance.reported import family_of

    by_family = Counter(family_of(i) for i in v.never_ran)
    lines = ["", f"## Cut short by {v.cut or 'an interruption'}: {len(v.never_ran)} cases never ran", ""]
    lines += [", ".join(f"{f} {n}" for f, n in by_family.most_common()), ""]
    lines += [f"- `{i}`" for i in v.never_ran[:SHOWN_NEVER_RAN]]
    if len(v.never_ran) > SHOWN_NEVER_RAN:
        lines.append(f"- and {len(v.never_ran) - SHOWN_NEVER_RAN} more (collected.json lists every collected case)")
    return lines
