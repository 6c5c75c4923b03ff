"""Family limits (reported with bad_input): a call just beyond what the implementation declares
(an undeclared dtype or mode, heads per group or head dims past a declared bound, Dk != Dv) is
refused or answered right, never answered wrong. Declarations narrow the matrix, so without this
family a kernel declaring head dims up to 64 could return garbage at 128 and still pass: a
caller who never read the declarations gets a silent wrong answer, which SPEC.md's bad-input
rule rules out. Per declared limit, the smallest tiny case that only that limit keeps out, once
with rows that select all their causal keys and once with mixed ranges (a fallback that ignores
the ranges is right on the first alone). Not covered: layouts (the matrix hands a
contiguous-only kernel contiguous copies), block sizes and fp64."""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

from ..cases import Case, make_inputs
from ..compare import ConformanceFailure, fail
from ..evaluation import Unmodified, batched, compare, evaluate, impl_fn, reference_run
from ..family import Family, Requirement, batched_lowp, param_marks
from ..impl import LOW_AND_FP32, Impl, fit, known_bug, skip_reason
from ..remote import ExecutorDied


def _add(field: str, value) -> Callable:
    return lambda i: {field: tuple(dict.fromkeys(getattr(i, field) + (value,)))}


# limit -> the declarations an implementation would make without it (each a bound of its own:
# a kernel right at h = 3 may still drop the heads past 16)
LIMITS = {
    **{f"dtype {d}": _add("dtypes", d) for d in LOW_AND_FP32},
    **{f"mode {m}": _add("modes", m) for m in ("decode", "prefill")},
    "heads above the maximum": lambda i: dict(max_heads=None),
    "heads below the minimum": lambda i: dict(min_heads=1),
    "heads not a multiple": lambda i: dict(heads_multiple_of=1),
    "heads not a power of two": lambda i: dict(heads_power_of_two=False),
    "head dims above the maximum": lambda i: dict(max_head_dim=None),
    "head dims below the minimum": lambda i: dict(min_head_dim=1),
    "head dims not a multiple": lambda i: dict(head_dim_multiple=1),
    "Dk != Dv": lambda i: dict(same_head_dims=False),
}
PATTERNS = ("full", "mixed")  # every causal key selected, then mixed ranges


def _relaxed(impl: Impl, limit: str) -> Impl:
    return dataclasses.replace(impl, **LIMITS[limit](impl))


def declared(impl: Impl) -> list:
    """The limits `impl` declares (those whose relaxing changes it)."""
    return [limit for limit in LIMITS if _relaxed(impl, limit) != impl]


def beyond(impl: Impl, cases, device) -> dict:
    """{(limit, pattern): the case}: per declared limit and pattern of PATTERNS (or, where the
    limit has neither, of any pattern), the smallest tiny batched case with normal values that
    `impl` does not run and would run but for that one limit, and under (limit, "largest") the
    largest such case where it is another (fp32 first, bf16 last: the Triton interpreter
    computes bf16 wrongly)."""
    out = {}
    for limit in declared(impl):
        relaxed = _relaxed(impl, limit)
        found = [
            c
            for c in (fit(c, relaxed) for c in cases if c.size == "tiny" and batched_lowp(c) and c.values == "normal")
            if skip_reason(impl, c, device) and not skip_reason(relaxed, c, device)
        ]
        picks = [c for c in (_smallest([c for c in found if c.pattern == p]) for p in PATTERNS) if c is not None]
        out.update({(limit, c.pattern): c for c in picks or ([_smallest(found)] if found else [])})
        largest = _smallest(found, largest=True)
        if largest is not None and largest not in out.values():
            out[(limit, "largest")] = largest
    return out


def _smallest(cases: list, largest: bool = False) -> Case | None:
    """The case with the fewest elements (with `largest`, the most: a kernel declaring 8 heads a
    group that zeroes every head past 16, or 64-wide head dims that drops dims past 128, answered
    the smallest case beyond its limit right and passed), fp32 first."""
    sign = -1 if largest else 1
    key = lambda c: (c.dtype != torch.float32, c.dtype == torch.bfloat16, sign * c.shape.elements, c.id)  # noqa: E731
    return min(cases, key=key, default=None)


def _broke_cuda(error: Exception, q: torch.Tensor) -> bool:
    """Whether an error left the CUDA context unusable (an illegal memory access raises too):
    the executor marks such an error (`KernelError.broke_cuda`); in this process the context is
    asked."""
    if getattr(error, "broke_cuda", False):
        return True
    if not q.is_cuda:
        return False
    try:
        torch.cuda.synchronize(q.device)
        return False
    except Exception:  # noqa: BLE001 - any error here leaves the context unusable
        return True


def _words(limit: str) -> str:
    """`limit` as an id part: `pytest -k` takes words, digits and dashes."""
    return limit.replace("!=", "ne").replace(" ", "-")


def label(limit: str, case: Case) -> str:
    """The test's id after the implementation's name; what a `limits` xfail's `cases` matches."""
    return f"{_words(limit)}-{case.id}"


def check(impl: Impl, limit: str, case: Case, device) -> None:
    """Refused (an error the kernel raised, leaving its inputs as they were) or right: a result
    beyond a declared limit is judged as parity judges."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    raised = []

    def kernel(*args, **kw):  # the kernel's own errors told apart from the judge's
        try:
            return impl.call(*args, **kw)
        except Exception as e:
            raised.append(e)
            raise

    inputs = Unmodified(q=inp.q, k=inp.k, v=inp.v, ranges=inp.ranges)
    try:
        got = evaluate(impl_fn(dataclasses.replace(impl, call=kernel), inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    except ExecutorDied as e:
        fail(
            case.id,
            f"beyond its declared {limit}: the kernel's process died instead of refusing ({e})",
            rule="bad-input",
            kind="crashed instead of refusing",
        )
    except ConformanceFailure as e:  # it answered, and the answer is wrong on its own (inputs written, dtype)
        fail(case.id, f"beyond its declared {limit}: {e}", **e.facts)
    except Exception as e:
        if not raised or raised[-1] is not e:
            raise  # the judge's error on what the kernel returned (a bare o where lse is declared): no refusal
        if _broke_cuda(e, inp.q):
            fail(
                case.id,
                f"beyond its declared {limit}: the call broke the CUDA context instead of refusing ({type(e).__name__}: {e})",
                rule="bad-input",
                kind="crashed instead of refusing",
            )
        try:
            inputs.check("a call that then refused")
        except ConformanceFailure as written:
            fail(case.id, f"beyond its declared {limit}: {written}", **written.facts)
        return
    gold, plain, _ = reference_run(batched(inp, judged), inp, case, judged, grads=False)
    try:
        compare(case, judged, got, gold, plain)
    except ConformanceFailure as e:
        fail(
            case.id,
            f"beyond its declared {limit}: answered wrong instead of refusing: {e}",
            rule="bad-input",
            tensor=e.facts.get("tensor"),
            kind=f"answered wrong beyond its declared {limit}",
        )


def _params(family, impls, cases, device) -> tuple:
    """Per implementation, each declared limit's cases; a limit no tiny case lies beyond alone is
    a skip saying so (as is an implementation that declares none)."""
    params = []
    for impl in impls:
        why = family.skip(impl, None, device)
        found = {} if why else beyond(impl, cases, device)
        for (limit, _), case in found.items():
            bug = known_bug(impl, "limits", case, label(limit, case))
            params.append(pytest.param(impl, limit, case, id=f"{impl.name}-{label(limit, case)}", marks=param_marks(None, bug)))
        reached = {limit for limit, _ in found}
        for limit in [] if why else [limit for limit in declared(impl) if limit not in reached]:
            reason = f"{impl.name}: no tiny case lies beyond its declared {limit} alone"
            params.append(
                pytest.param(impl, limit, None, id=f"{impl.name}-{_words(limit)}-none", marks=param_marks(reason, None))
            )
        if why:
            params.append(pytest.param(impl, None, None, id=f"{impl.name}-none", marks=param_marks(why, None)))
    return ("impl", "limit", "case"), params


def test_limits(impl, limit, case, device):
    check(impl, limit, case, device)


FAMILY = Family(
    "limits",
    "beyond a declared limit: refused or right",
    rank=12,
    check=check,
    requires=(Requirement(lambda i: bool(declared(i)), "declares no limit (dtypes, modes, heads, head dims, Dk == Dv)"),),
    marker="bad_input",
    tests=(test_limits,),
    parametrize=_params,
)
