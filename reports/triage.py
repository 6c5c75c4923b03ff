"""The failures of one `selgate check` run as root causes: failures grouped by a signature
that leaves out what belongs to the case (its id, seed, shapes, indices, the exact
numbers), each cause shown with its smallest failing case and a short script that
reproduces it. A report read in a pull request stays short whatever the failure count,
as compiler diagnostics group repeats and Hypothesis shrinks to a minimal example; the
full list lives in JUnit.

Signatures are read from the messages `compare.py` and the families write, and from
pytest's and xdist's (exceptions, timeouts, crashed workers). This module never imports
the kernel: the reproducers it writes do, when a person runs them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from selgate.reports.results import CaseResult

from selgate.conformance.cases import Case, select
from selgate.conformance.registry import Impl, fit

# `Case.id`: `Shape.tag`, pattern, block size, scale, values, dtype, seed.
CASE_ID = re.compile(
    r"(?:(?:decode|prefill)-B(?P<B>\d+)S(?P<S>\d+)Skv(?P<Skv>\d+)|varlen-q(?P<lq>[\d.]+)-k(?P<lk>[\d.]+))"
    r"-G(?P<G>\d+)h(?P<h>\d+)-D(?P<Dk>\d+)x(?P<Dv>\d+)-n\d+-[a-z_]+(?:-bs\d+)?(?:-sc[\d.]+(?:e[-+]\d+)?)?(?:-v[a-z_]+)?"
    r"-(?P<dtype>fp32|fp16|bf16|fp64)-s\d+"
)
DIMS = {"o": "B S G h Dv", "lse": "B S G h", "dq": "B S G h Dk", "dk": "B G S_kv Dk", "dv": "B G S_kv Dv"}
GRADCHECK_OUTPUTS, GRADCHECK_INPUTS = ("o", "lse"), ("q", "k", "v")
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


def _special(value: str) -> str:
    """What a printed float is, for a signature: NaN, Inf, -Inf or finite."""
    try:
        x = float(value)
    except ValueError:
        return value
    if math.isnan(x):
        return "NaN"
    return ("-Inf" if x < 0 else "Inf") if math.isinf(x) else "finite"


def _kind(value: str) -> str:
    """As `_special`, with exact zero told apart (empty rows and unread keys must give 0)."""
    kind = _special(value)
    return ("0" if float(value) == 0 else "non-zero") if kind == "finite" else kind


def _tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _shape_diff(name: str, got: str, want: str) -> str:
    """Which dimensions differ, by name (SPEC.md layout): the sizes themselves belong to the case."""
    g, w = _tuple(got), _tuple(want)
    if len(g) != len(w):
        return f"{len(g)} dims, expected {len(w)}"
    names = DIMS.get(name, "").split()
    dims = [names[i] if len(names) == len(w) else f"dim {i}" for i in range(len(w)) if g[i] != w[i]]
    return f"shape differs in {', '.join(dims)}" if dims else "shape differs"


def _order(err: str, lim: str):
    """floor(log10(err / bound)), or None when the numbers do not parse (a cut message)."""
    try:
        return math.floor(math.log10(float(err) / float(lim)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _magnitude(order: int) -> str:
    return "1-10x" if order <= 0 else f"10^{order}x"


def _over(what: str, order) -> str:
    """`what` over its bound by a power of ten: 1-10x, 10^1x, 10^2x, ..."""
    return f"{what} over its bound" if order is None else f"{what} {_magnitude(order)} over its bound"


def _empty_rows(name: str, got: str, want: str) -> str | None:
    """One cause however the families word it: o (or dq) non-finite where it must be exactly 0,
    which only a row that selects nothing has (its own rows, the family's empty ones, the
    bounds family's tail queries)."""
    base = name.split("[")[0]
    if base in ("o", "dq") and _special(got) != "finite" and _special(want) == "finite" and float(want) == 0.0:
        return f"{base}: {_special(got)} on rows that select nothing (where {base} is exactly 0)"
    return None


def _tensor_signature(name: str, what: str) -> str:
    """The signature of one tensor's failure as `compare.assert_close`/`assert_equal` and
    the dtype family word it."""
    m = re.match(r"shape (\(.*?\)), expected (\(.*?\))", what)
    if m:
        return f"{name}: {_shape_diff(name, *m.groups())}"
    m = re.match(r"\d+ non-finite or wrong special values, first at index .*?: got (\S+), reference (\S+)", what)
    if m:
        return _empty_rows(name, *m.groups()) or f"{name}: {_special(m[1])} where the reference is {_special(m[2])}"
    m = re.match(r"max abs err (\S+) \(bound ([^:;)]+)", what)
    if m:
        order = _order(m[1], m[2])
        mean = re.search(r"mean abs err (\S+) \(bound ([^)]+)\)", what)
        if mean is not None and order is not None and order < 0:  # the max is within its bound, the mean is not
            return f"{name}: {_over('mean abs err', _order(*mean.groups()))}"
        return f"{name}: {_over('max abs err', order)}"
    m = re.match(r"\d+ elements differ \((.*?)\)(?:; first at index .*?: (\S+) vs (\S+))?", what)
    if m:
        why, got, want = m.groups()
        if "bitwise identical" in why:
            return f"{name}: not bitwise identical across {'processes' if 'across processes' in why else 'runs'}"
        if got is None or _kind(got) == _kind(want):
            return f"{name}: differs ({why})"
        if _empty_rows(name, got, want):
            return _empty_rows(name, got, want)
        return f"{name}: {_kind(got)} where {_kind(want)} is expected ({why})"
    m = re.match(r"got (\S+) (\(.*?\)) on (\S+), expected (\S+) (\(.*?\)) on (\S+)", what)
    if m:
        dtype, shape, device, want_dtype, want_shape, want_device = m.groups()
        wrong = [f"wrong dtype (got {dtype})"] if dtype != want_dtype else []
        wrong += [_shape_diff(name, shape, want_shape)] if shape != want_shape else []
        wrong += [f"wrong device (got {_normalise(device)})"] if device != want_device else []
        return f"{name}: {'; '.join(wrong)}"
    return f"{name}: {_normalise(what)}"


def _failure_signature(body: str) -> str:
    """The signature of a `ConformanceFailure`'s text after its `[case id]`."""
    m = re.match(r"(\w+(?:\[[^\]]*\])?): (.*)", body)
    if m and m[1] != "gradcheck":
        return _tensor_signature(m[1], m[2])
    m = re.match(r"bad input (\S+): (?:(\w+) does not name ('[^']*')|accepted silently)", body)
    if m:
        name, etype, arg = m.groups()
        return f"bad input {name}: " + (f"{etype} does not name {arg}" if etype else "accepted silently")
    if body.startswith("gradcheck: "):
        body = re.sub(r"output (\d+)", lambda g: GRADCHECK_OUTPUTS[int(g[1])] if int(g[1]) < 2 else g[0], body)
        body = re.sub(r"input (\d+)", lambda g: GRADCHECK_INPUTS[int(g[1])] if int(g[1]) < 3 else g[0], body)
        return _normalise(body).rstrip(",.")
    return _normalise(body)


def signature(result: CaseResult) -> str:
    """The root cause of one failure, independent of the case it happened on: which tensor
    and what went wrong with it, or which exception, timeout or crash. Short: it is the
    title a person reads."""
    msg = " ".join(result.message.split()).partition("; then ")[0]  # a test reported twice: its first report
    if re.search(r"worker '[^']*' crashed", msg):  # xdist words it "failed on setup with ..." too
        sig = "worker crashed while running the case (abort, segfault or kill)"
    elif re.match(r"(?:Failed: )?Timeout >", msg):
        sig = "timeout: the case ran past the per-case limit"
    elif msg.startswith("[XPASS(strict)]"):
        sig = "a declared expected failure passed (XPASS strict)"
    else:
        m = re.match(r"((?:\w+\.)*[A-Z]\w*): (.*)", msg)
        etype, text = (m[1], m[2]) if m else ("", msg)
        case = re.match(r"\[([^\]]*)\] (.*)", text)
        if etype and not etype.endswith("ConformanceFailure"):
            sig = f"{etype.rsplit('.', 1)[-1]}: {_normalise(text)}"
        elif case:
            where = _normalise(CASE_ID.sub("", case[1])).strip(" ()")
            sig = _failure_signature(case[2])
            sig += f" ({where})" if where and " on rows that select nothing" not in sig else ""
        else:
            sig = _failure_signature(text)
    return sig if len(sig) <= MAX_SIGNATURE else sig[: MAX_SIGNATURE - 1] + "…"


# --- grouping ---------------------------------------------------------------------------------


def _case_match(result: CaseResult):
    """The case id in the nodeid's parameters (after the implementation's name, which may
    hold anything), else the one a failure message starts with (bad input names its case there)."""
    param = result.nodeid.partition("[")[2].removesuffix("]")
    m = re.search(f"(?:{CASE_ID.pattern})$", param)
    return m or re.match(rf"(?:(?:\w+\.)*\w+: )?\[({CASE_ID.pattern})", result.message)


def _size(result: CaseResult) -> tuple:
    """(elements of q, k and v, nodeid): the order in which the smallest case is chosen;
    results with no case id come last."""
    m = _case_match(result)
    if m is None:
        return math.inf, result.nodeid
    d = {k: int(v) for k, v in m.groupdict().items() if v and v.isdigit()}
    if m["lq"]:
        d |= {"B": 1, "S": sum(_tuple(m["lq"])), "Skv": sum(_tuple(m["lk"]))}
    return d["B"] * d["G"] * (d["S"] * d["h"] * d["Dk"] + d["Skv"] * (d["Dk"] + d["Dv"])), result.nodeid


@dataclass
class RootCause:
    """Failures of one signature: how many, where (families, dtypes), the smallest of them
    and its message."""

    signature: str
    count: int
    families: tuple
    dtypes: tuple
    smallest: CaseResult
    example: str


_OVER = re.compile(r"(.*) (1-10x|10\^(\d+)x) over its bound(.*)")


def _merge_magnitudes(by_sig: dict) -> dict:
    """Signatures that differ only in adjacent powers of ten over the bound merged into one
    ("o: max abs err 1-10x to 10^1x over its bound"): one cause's errors spread across a
    power of ten (9e-5 and 1.1e-4 over a bound of 1e-5) and stay one cause; 10x and 1000x
    with nothing between stay two."""
    out, spread = {}, defaultdict(dict)  # (text before, text after) -> {order: results}
    for sig, results in by_sig.items():
        m = _OVER.fullmatch(sig)
        if m:
            spread[m[1], m[4]][int(m[3] or 0)] = results
        else:
            out[sig] = results
    for (before, after), by_order in spread.items():
        for start in sorted(o for o in by_order if o - 1 not in by_order):
            end = start
            while end + 1 in by_order:
                end += 1
            label = _magnitude(start) + ("" if end == start else f" to {_magnitude(end)}")
            out[f"{before} {label} over its bound{after}"] = [r for o in range(start, end + 1) for r in by_order[o]]
    return out


def group(failures: list) -> list:
    """RootCauses of `failures` (CaseResults), most frequent first, then by signature."""
    by_sig = defaultdict(list)
    for r in failures:
        by_sig[signature(r)].append(r)
    causes = []
    for sig, results in _merge_magnitudes(by_sig).items():
        smallest = min(results, key=_size)
        dtypes = {m["dtype"] for m in map(_case_match, results) if m}
        causes.append(
            RootCause(
                sig, len(results), tuple(sorted({r.family for r in results})), tuple(sorted(dtypes)), smallest, smallest.message
            )
        )
    return sorted(causes, key=lambda c: (-c.count, c.signature))


# --- reproducers ------------------------------------------------------------------------------


def find_case(impl: Impl, case_id: str, size: str) -> Case:
    """The matrix's case `case_id` as its nodeid shows it: fitted to `impl`."""
    for base in select(size):
        case = fit(base, impl)
        if case.id == case_id:
            return case
    raise LookupError(f"no case {case_id} among the {size} cases fitted to {impl.name}")


def find_bad_input(impl: Impl, name: str) -> tuple:
    """(BadInput, Case): the bad input `name` and the case the matrix calls it on."""
    from selgate.conformance.families import FAMILIES
    from selgate.conformance.plugin import run_device

    for param in FAMILIES["bad_input"].params([impl], select("tiny"), run_device())[1]:
        if param.id == f"{impl.name}-{name}":
            return param.values[1], param.values[2]
    raise LookupError(f"no bad input {name} for {impl.name}")


_HEAD = """# Reproduces root cause {signature} ({count} failure(s)) of `selgate check {impl}`
# on its smallest case, {nodeid}.
# Run it from the directory `selgate check` ran in (where the implementation's module is).
# Exit status 1 while the case fails, 0 once it passes (`git bisect run python <this file>`).
import os
import sys

{imports}

sys.path.insert(0, os.getcwd())
DEVICE = {device!r}
impl = resolve({impl!r}, declare={declare!r})[0]
"""

_CASE = """case = find_case(impl, {case_id!r}, {size!r})
inp = make_inputs(case, DEVICE)
q, k, v, ranges = inp.q, inp.k, inp.v, inp.ranges
{call}
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

_BAD = """bad, case = find_bad_input(impl, {name!r})
try:
    check_bad_input(impl, bad, case, DEVICE)
    print(f"bad input {name}: an error naming {{bad.arg!r}}, as required")
except ConformanceFailure as e:
    print(f"bad_input FAILED: {{e}}")
    sys.exit(1)
"""


def reproducer(cause: RootCause, *, impl: str, declare: str | None, size: str, device: str) -> str:
    """A standalone Python file rerunning the smallest case of `cause`: the kernel called
    directly against the fp64 reference, then the family's check as the matrix runs it.
    ValueError when the failure is not a case of the matrix (a collection error)."""
    from selgate.conformance.families import of_test
    from selgate.conformance.families.bad_input import BAD_INPUTS

    r = cause.smallest
    test, _, param = r.nodeid.partition("::")[2].partition("[")
    fam = of_test(test)
    family, param = (fam.name if fam else test), param.removesuffix("]")
    imports = [
        "from selgate.conformance.compare import ConformanceFailure",
        "from selgate.conformance.registry import resolve",
    ]
    if family == "bad_input":
        name = next((b.name for b in BAD_INPUTS if param == f"{impl}-{b.name}"), None)
        if name is None:
            raise ValueError(f"{r.nodeid}: no bad input of {impl}")
        imports += [
            "from selgate.conformance.families.bad_input import check as check_bad_input",
            "from selgate.reports.triage import find_bad_input",
        ]
        body = _BAD.format(name=name)
    else:
        m = re.search(f"(?:{CASE_ID.pattern})$", param)
        if fam is None or m is None:
            raise ValueError(f"{r.nodeid}: not a case of the matrix")
        varlen = m["lq"] is not None
        imports += [
            "from selgate.conformance.cases import make_inputs",
            "from selgate.conformance.families import FAMILIES",
            "from selgate.reports.triage import find_case",
            f"from selgate.reference import selection_attention_ref{', varlen_to_batched' if varlen else ''}",
        ]
        body = _CASE.format(case_id=m[0], size=size, family=family, call=_VARLEN if varlen else _BATCHED)
    head = _HEAD.format(
        signature=_code(cause.signature),
        count=cause.count,
        impl=impl,
        nodeid=_code(r.nodeid),
        imports="\n".join(sorted(imports)),
        device=device,
        declare=declare and str(Path(declare).resolve()),
    )
    return head + body


def write_reproducers(causes: list, out_dir, **kw) -> dict:
    """`<out_dir>/repro/cause-<n>.py` for the n-th cause that is a case of the matrix (earlier
    runs' files removed); {signature: path}. `kw` as `reproducer`."""
    folder = Path(out_dir) / "repro"
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
    causes, then one line for the rest; at most 5 + 4 * limit lines."""
    if not causes:
        return []
    total = sum(c.count for c in causes)
    lines = [
        "## Root causes",
        "",
        f"{total} failure(s) from {len(causes)} root cause(s), failures grouped by signature; each with its smallest "
        "failing case and a script that reruns it. Every failure is in junit.xml.",
        "",
    ]
    for n, c in enumerate(causes[:limit], 1):
        where = ", ".join(c.families) + (f"; {', '.join(c.dtypes)}" if c.dtypes else "")
        path = repro_paths.get(c.signature)
        lines += [
            f"{n}. {_code(c.signature)}: {c.count} failure(s) in {where}",
            f"   - smallest: {_code(c.smallest.nodeid)}",
            f"   - {_code(c.example)}",
            f"   - reproduce: `python {path}`" if path else "   - no reproducer: not a case of the matrix",
        ]
    rest = causes[limit:]
    if rest:
        lines.append(f"And {len(rest)} more cause(s) covering {sum(c.count for c in rest)} failure(s): see junit.xml.")
    bad = [c for c in causes if c.families == ("bad_input",)]
    if len(bad) > 1:
        lines += [
            "",
            f"{len(bad)} of these causes are bad inputs the kernel accepts: `selgate.reference.check_inputs(q, k, v, "
            "ranges, scale=scale)` at the top of the kernel raises the errors SPEC.md asks for (naming the argument) "
            "and fixes them at once.",
        ]
    return lines
