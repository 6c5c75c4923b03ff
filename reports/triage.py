"""The failures of one `selgate check` run as root causes: one cause per bug, each shown
with the SPEC.md rule it broke, its smallest failing case and a short script that
reproduces it. A report read in a pull request stays short whatever the failure count, as
compiler diagnostics group repeats and Hypothesis shrinks to a minimal example; the full
list lives in JUnit.

A broken contract arrives as data (the `failure` property the matrix writes where it raises
it: rule, tensor, kind, error, bound), and failures group by (rule, tensor, kind). What
the matrix did not word (exceptions, timeouts, crashed workers, pytest's own) groups by
its message with what belongs to the case left out. This module never imports the kernel:
the reproducers it writes do, when a person runs them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from selgate.conformance.rules import RULES
from selgate.lanes.check_run import REPRO_DIR
from selgate.reports.results import CaseResult

# `Case.id`: `Shape.tag`, pattern, block size, scale, values, dtype, seed. Read where a result
# carries no facts: a crashed worker's test has no properties in JUnit, only its id.
CASE_ID = re.compile(
    r"(?:(?:decode|prefill)-B(?P<B>\d+)S(?P<S>\d+)Skv(?P<Skv>\d+)|varlen-q(?P<lq>[\d.]+)-k(?P<lk>[\d.]+))"
    r"-G(?P<G>\d+)h(?P<h>\d+)-D(?P<Dk>\d+)x(?P<Dv>\d+)-n\d+-[a-z_]+(?:-bs\d+)?(?:-sc[\d.]+(?:e[-+]\d+)?)?(?:-v[a-z_]+)?"
    r"-(?P<dtype>fp32|fp16|bf16|fp64)-s\d+"
)
MAX_SIGNATURE = 120
MAX_MESSAGE = 300


# --- signatures -------------------------------------------------------------------------------


def _normalise(text: str) -> str:
    """`text` without what differs between cases of one cause: case ids, paths, quoted
    names, addresses, numbers."""
    text = CASE_ID.sub("<case>", text)
    text = re.sub(r"(?<![\w.\-/])(?:/[\w.\-/]+|[\w.\-/]+\.py\b(?::\d+)?)", "<path>", text)
    text = re.sub(r"(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\b0x[0-9a-fA-F]+\b", "0x…", text)
    return re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d*)?(?:e[-+]?\d+)?(?!\w)", "N", text)


def _code(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` on one line as a Markdown code span, cut at `limit` characters."""
    text = " ".join(text.split()).replace("`", "'")
    return f"`{text if len(text) <= limit else text[: limit - 1] + '…'}`"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SIGNATURE else text[: MAX_SIGNATURE - 1] + "…"


def key(result: CaseResult) -> tuple:
    """What one failure groups by: (rule, tensor, kind) for a broken contract, else
    (None, None, the message's signature)."""
    failure = result.facts.get("failure")
    if failure:
        return failure["rule"], failure.get("tensor"), failure["kind"]
    return None, None, _message_signature(result.message)


def _message_signature(message: str) -> str:
    """The signature of a failure the matrix did not word: which exception, timeout or crash."""
    msg = " ".join(message.split()).partition("; then ")[0]  # a test reported twice: its first report
    if re.search(r"worker '[^']*' crashed", msg):  # xdist words it "failed on setup with ..." too
        return "worker crashed while running the case (an abort, segfault or kill, or past its time limit)"
    if re.match(r"(?:Failed: )?Timeout >", msg):
        return "timeout: the case ran past the per-case limit"
    if msg.startswith("[XPASS(strict)]"):
        return "a declared expected failure passed (XPASS strict)"
    m = re.match(r"((?:\w+\.)*[A-Z]\w*): (.*)", msg)
    if m and not m[1].endswith("ConformanceFailure"):
        return _cut(f"{m[1].rsplit('.', 1)[-1]}: {_normalise(m[2])}")
    return _cut(_normalise(re.sub(r"^(?:(?:\w+\.)*ConformanceFailure: )?\[[^\]]*\] ", "", msg)))


def _power(order: int) -> str:
    return str(10**order) if order <= 3 else f"10^{order}"


def _title(rule, tensor, kind, results) -> str:
    """A cause's title: the tensor and the kind of failure, with how far over their bounds
    its errors lie, in whole decades (`o: max abs err 1-1000x over its bound`)."""
    if rule == "bad-input":
        return f"bad input {kind}"
    text = kind if tensor is None else f"{tensor}: {kind}"
    orders = sorted(
        {
            math.floor(math.log10(f["error"] / f["bound"]))
            for f in (r.facts["failure"] for r in results)
            if f.get("bound") and f.get("error") is not None and math.isfinite(f["error"] / f["bound"])
        }
    )
    if orders and text.endswith(" over its bound"):
        span = f"{_power(max(orders[0], 0))}-{_power(max(orders[-1], 0) + 1)}x"
        text = text.removesuffix(" over its bound") + f" {span} over its bound"
    return _cut(text)


def signature(result: CaseResult) -> str:
    """The title of one failure's cause, independent of the case it happened on."""
    rule, tensor, kind = key(result)
    return kind if rule is None else _title(rule, tensor, kind, [result])


# --- grouping ---------------------------------------------------------------------------------


def _case_match(result: CaseResult):
    """The case id in the nodeid's parameters (after the implementation's name, which may
    hold anything), else the one a failure message starts with (bad input names its case there)."""
    param = result.nodeid.partition("[")[2].removesuffix("]")
    m = re.search(f"(?:{CASE_ID.pattern})$", param)
    return m or re.match(rf"(?:(?:\w+\.)*\w+: )?\[({CASE_ID.pattern})", result.message)


def case_of(result: CaseResult) -> tuple:
    """(case id, dtype, elements of q, k and v) of a result: its facts, else its test id read
    back (a crashed worker's test); (None, None, inf) for a test that is no case."""
    facts = result.facts
    if "case" in facts:
        return facts["case"], facts.get("dtype"), int(facts.get("elements", 0)) or math.inf
    m = _case_match(result)
    if m is None:
        return None, None, math.inf
    d = {k: int(v) for k, v in m.groupdict().items() if v and v.isdigit()}
    if m["lq"]:
        d |= {"B": 1, "S": sum(map(int, m["lq"].split("."))), "Skv": sum(map(int, m["lk"].split(".")))}
    return m[0], m["dtype"], d["B"] * d["G"] * (d["S"] * d["h"] * d["Dk"] + d["Skv"] * (d["Dk"] + d["Dv"]))


@dataclass
class RootCause:
    """Failures of one (rule, tensor, kind): how many, where (families, dtypes), the SPEC.md
    rule they break (None for a failure the matrix did not word), the smallest of them and its
    message."""

    signature: str
    count: int
    families: tuple
    dtypes: tuple
    smallest: CaseResult
    example: str
    rule: str | None = None


def group(failures: list) -> list:
    """RootCauses of `failures` (CaseResults), most frequent first, then by signature."""
    by_key = defaultdict(list)
    for r in failures:
        by_key[key(r)].append(r)
    causes = []
    for (rule, tensor, kind), results in by_key.items():
        smallest = min(results, key=lambda r: (case_of(r)[2], r.nodeid))
        dtypes = {d for d in (case_of(r)[1] for r in results) if d}
        title = kind if rule is None else _title(rule, tensor, kind, results)
        families = tuple(sorted({r.family for r in results}))
        causes.append(RootCause(title, len(results), families, tuple(sorted(dtypes)), smallest, smallest.message, rule))
    return sorted(causes, key=lambda c: (-c.count, c.signature))


# --- reproducers ------------------------------------------------------------------------------


_HEAD = """# Reproduces root cause {signature} ({count} failure(s)) of `selgate check {impl}`
# on its smallest case, {nodeid}.
# Run it from the directory `selgate check` ran in (where the implementation's module is).
# Exit status 1 while the case fails, 0 once it passes, 125 when it cannot run here (the module
# does not import, the case cannot be built: `git bisect run python <this file>` skips that commit).
# The case runs in a child process, so an abort or a hang fails it too (`--run-here`: in this one).
import os
import signal
import subprocess
import sys

DEVICE = {device!r}
LIMIT_S = {limit_s!r}  # the check's --timeout, from the child's start: a case still running then has hung
if "--run-here" not in sys.argv:
    try:
        status = subprocess.run([sys.executable, os.path.abspath(__file__), "--run-here"], timeout=LIMIT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"FAILED: the case ran past {{LIMIT_S}} s (the check's --timeout)")
        sys.exit(1)
    if status < 0:
        print(f"FAILED: the case's process was killed by signal {{-status}} ({{signal.strsignal(-status)}})")
    sys.exit(status if status in (0, 125) else 1)
try:
{imports}
    sys.path.insert(0, os.getcwd())
    impl = resolve({impl!r}, declare={declare!r})[0]
{setup}
except Exception as e:
    print(f"cannot run the case here: {{type(e).__name__}}: {{e}}")
    sys.exit(125)
"""

_CASE_SETUP = """    case = find_case(impl, {case_id!r}, {size!r})
    inp = make_inputs(case, DEVICE)
    q, k, v, ranges = inp.q, inp.k, inp.v, inp.ranges"""

_CASE = """{call}
print(f"o {{tuple(o.shape)}} {{o.dtype}}, reference {{tuple(o_ref.shape)}}")
print(f"NaN in o: {{int(o.isnan().sum())}}, in the reference: {{int(o_ref.isnan().sum())}}")
if o.shape == o_ref.shape:
    print(f"o: max abs err {{(o.double() - o_ref).abs().nan_to_num(0.0).max().item():.3e}}")
try:
    FAMILIES[{family!r}].check(impl, case, DEVICE)
    print("{family}: passed on this case")
except ConformanceFailure as e:
    print(f"{family} FAILED: {{e}}")
    sys.exit(1)
"""

_BATCHED = """o, lse = impl.forward(q, k, v, ranges, scale=inp.scale)
o_ref, lse_ref = selection_attention_ref(q.double(), k.double(), v.double(), ranges, scale=inp.scale, return_lse=True)"""

_VARLEN = """o, lse = impl.forward_varlen(q, k, v, ranges, inp.cu_seqlens_q, inp.cu_seqlens_k, scale=inp.scale)
rows, positions = varlen_to_batched(ranges, inp.cu_seqlens_q, inp.cu_seqlens_k)
o_ref, lse_ref = selection_attention_ref(
    q.double(), k.double(), v.double(), rows, scale=inp.scale, positions=positions, return_lse=True
)"""

_PARAM_SETUP = "    {names} = find_param(impl, {family!r}, {param!r})"

_PARAM = """try:
    check(impl, {names}, DEVICE)
    print("{family}: passed on this case")
except ConformanceFailure as e:
    print(f"{family} FAILED: {{e}}")
    sys.exit(1)
"""
# families whose test takes more than (impl, case): the names of its other parameters
_PARAM_NAMES = {"bad_input": "bad, case", "limits": "limit, case"}


def reproducer(cause: RootCause, *, impl: str, declare: str | None, size: str, device: str, limit_s: int) -> str:
    """A standalone Python file rerunning the smallest case of `cause`: the kernel called
    directly against the fp64 reference, then the family's check as the matrix runs it, in a
    child process that fails the case when it dies or runs past `limit_s`. ValueError when the
    failure is not a case of the matrix (a collection error)."""
    r = cause.smallest
    test, _, param = r.nodeid.partition("::")[2].partition("[")
    family, param = test.removeprefix("test_"), param.removesuffix("]")  # a family's test is test_<name>
    imports = [
        "from selgate.conformance.compare import ConformanceFailure",
        "from selgate.conformance.registry import resolve",
    ]
    if family in _PARAM_NAMES:
        imports += [
            f"from selgate.conformance.families.{family} import check",
            "from selgate.reports.repro_case import find_param",
        ]
        setup = _PARAM_SETUP.format(names=_PARAM_NAMES[family], family=family, param=param)
        body = _PARAM.format(names=_PARAM_NAMES[family], family=family)
    else:
        case_id = case_of(r)[0]
        if not test.startswith("test_") or case_id is None:
            raise ValueError(f"{r.nodeid}: not a case of the matrix")
        varlen = case_id.startswith("varlen-")
        imports += [
            "from selgate.conformance.cases import make_inputs",
            "from selgate.conformance.families import FAMILIES",
            "from selgate.reports.repro_case import find_case",
            f"from selgate.reference import selection_attention_ref{', varlen_to_batched' if varlen else ''}",
        ]
        setup = _CASE_SETUP.format(case_id=case_id, size=size)
        body = _CASE.format(family=family, call=_VARLEN if varlen else _BATCHED)
    head = _HEAD.format(
        signature=_code(cause.signature),
        count=cause.count,
        impl=impl,
        nodeid=_code(r.nodeid),
        imports="\n".join(f"    {line}" for line in sorted(imports)),
        setup=setup,
        device=device,
        limit_s=limit_s,
        declare=declare and str(Path(declare).resolve()),
    )
    return head + body


def write_reproducers(causes: list, out_dir, **kw) -> dict:
    """`<out_dir>/repro/cause-<n>.py` for the n-th cause that is a case of the matrix (earlier
    runs' files removed); {signature: path}. `kw` as `reproducer`."""
    folder = Path(out_dir) / REPRO_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("cause-*.py"):
        stale.unlink()
    paths = {}
    for n, cause in enumerate(causes, 1):
        try:
            text = reproducer(cause, **kw)
        except ValueError:
            continue
        paths[cause.signature] = folder / f"cause-{n}.py"
        paths[cause.signature].write_text(text)
    return paths


# --- the report's section ---------------------------------------------------------------------


def render(causes: list, repro_paths: dict, *, limit: int = 8) -> list:
    """Markdown lines of the report's "Root causes" section: the `limit` most frequent
    causes, then one line for the rest; at most 7 + 5 * limit lines."""
    if not causes:
        return []
    total = sum(c.count for c in causes)
    lines = [
        "## Root causes",
        "",
        f"{total} failure(s) from {len(causes)} root cause(s), failures grouped by the SPEC.md rule, tensor and kind of "
        "failure they show (or by their message, for errors the matrix did not word); each with its smallest "
        "failing case and a script that reruns it. Every failure is in junit.xml.",
        "",
    ]
    for n, c in enumerate(causes[:limit], 1):
        where = ", ".join(c.families) + (f"; {', '.join(c.dtypes)}" if c.dtypes else "")
        path = repro_paths.get(c.signature)
        lines += [
            f"{n}. {_code(c.signature)}: {c.count} failure(s) in {where}",
            *([f"   - breaks SPEC.md, {RULES[c.rule]}"] if c.rule else []),
            f"   - smallest: {_code(c.smallest.nodeid)}",
            f"   - {_code(c.example)}",
            f"   - reproduce: `python {path}`" if path else "   - no reproducer: not a case of the matrix",
        ]
    rest = causes[limit:]
    if rest:
        lines.append(f"And {len(rest)} more cause(s) covering {sum(c.count for c in rest)} failure(s): see junit.xml.")
    bad = sum(c.count for c in causes if c.rule == "bad-input")
    if bad > 1:
        lines += [
            "",
            f"{bad} of these failures are bad inputs the kernel mishandles: `selgate.reference.check_inputs(q, k, v, "
            "ranges, scale=scale)` at the top of the kernel raises the errors SPEC.md asks for (naming the argument) "
            "and fixes them at once.",
        ]
    return lines
