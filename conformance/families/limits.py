"""Family limits (reported with bad_input): a call just beyond what the implementation declares
(a dtype, a mode, heads per group, head dims, Dk != Dv) is refused or answered right, never
answered wrong. Declarations narrow the matrix, so without this family a kernel declaring head
dims up to 64 could return garbage at 128 and still pass: a caller who never read the
declarations gets a silent wrong answer, which SPEC.md's bad-input rule rules out. One case per
declared limit: the smallest tiny case that only that limit excludes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ..cases import Case, make_inputs
from ..compare import ConformanceFailure, fail
from ..evaluation import batched, compare, evaluate, impl_fn, reference_run
from ..family import Family, Requirement, batched_lowp, param_marks
from ..registry import LOW_AND_FP32, Impl, fit, known_bug, skip_reason
from ..remote import ExecutorDied

# limit -> the declarations that make it, as they are when the implementation declares none
LIMITS = {
    "dtypes": lambda i: dict(dtypes=tuple(dict.fromkeys(i.dtypes + LOW_AND_FP32))),
    "modes": lambda i: dict(modes=tuple(dict.fromkeys(i.modes + ("decode", "prefill")))),
    "heads": lambda i: dict(heads_multiple_of=1, heads_power_of_two=False, min_heads=1, max_heads=None),
    "head dims": lambda i: dict(head_dim_multiple=1, min_head_dim=1, max_head_dim=None),
    "Dk == Dv": lambda i: dict(same_head_dims=False),
}


PREFERRED = ("full", "mixed")  # range patterns, most telling first


def _relaxed(impl: Impl, limit: str) -> Impl:
    return dataclasses.replace(impl, **LIMITS[limit](impl))


def beyond(impl: Impl, cases, device) -> dict:
    """{limit: the case beyond it}: per declared limit, the smallest tiny batched case that
    `impl` does not run and would run but for that one limit (fp32 first, bf16 last: the Triton
    interpreter computes bf16 wrongly; rows that select all their keys, then mixed ones, first:
    a tiny random row may select nothing, where most wrong answers agree with the right one)."""
    out = {}
    for limit in LIMITS:
        relaxed = _relaxed(impl, limit)
        found = [
            c
            for c in (fit(c, relaxed) for c in cases if c.size == "tiny" and batched_lowp(c) and c.values == "normal")
            if skip_reason(impl, c, device) and not skip_reason(relaxed, c, device)
        ]
        if found:
            out[limit] = min(
                found,
                key=lambda c: (
                    c.dtype != torch.float32,
                    c.dtype == torch.bfloat16,
                    PREFERRED.index(c.pattern) if c.pattern in PREFERRED else 2,
                    c.shape.elements,
                    c.id,
                ),
            )
    return out


def declares_limits(impl: Impl) -> bool:
    return any(_relaxed(impl, limit) != impl for limit in LIMITS)


def _broke_cuda(error: Exception, q: torch.Tensor) -> bool:
    """Whether an error left the CUDA context unusable (an illegal memory access raises too):
    the executor says so of its own (`KernelError.broke_cuda`); in this process, the context is
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


def param_id(impl: Impl, limit: str, case: Case) -> str:
    return f"{impl.name}-{limit.replace(' ', '')}-{case.id}"


def check(impl: Impl, limit: str, case: Case, device) -> None:
    """Refused (any error) or right: a result beyond a declared limit is judged as parity judges."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    try:
        got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    except ExecutorDied as e:
        fail(
            case.id,
            f"beyond its declared {limit}: the kernel's process died instead of refusing ({e})",
            rule="bad-input",
            kind="crashed instead of refusing",
        )
    except ConformanceFailure:
        raise  # it answered, and what it did is wrong on its own (inputs written, wrong dtype)
    except Exception as e:  # noqa: BLE001 - any error is a refusal, but one that broke CUDA
        if _broke_cuda(e, inp.q):
            fail(
                case.id,
                f"beyond its declared {limit}: the call broke the CUDA context instead of refusing ({type(e).__name__}: {e})",
                rule="bad-input",
                kind="crashed instead of refusing",
            )
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
    params = []
    for impl in impls:
        why = family.skip(impl, None, device)
        found = {} if why else beyond(impl, cases, device)
        for limit, case in found.items():
            bug = known_bug(impl, "limits", case)
            params.append(pytest.param(impl, limit, case, id=param_id(impl, limit, case), marks=param_marks(None, bug)))
        if not found:
            reason = why or f"{impl.name}: no tiny case lies beyond exactly one of its declared limits"
            params.append(pytest.param(impl, None, None, id=f"{impl.name}-none", marks=param_marks(reason, None)))
    return ("impl", "limit", "case"), params


def test_limits(impl, limit, case, device):
    check(impl, limit, case, device)


FAMILY = Family(
    "limits",
    "beyond a declared limit: refused or right",
    rank=12,
    check=check,
    requires=(Requirement(declares_limits, "declares no limit (dtypes, modes, heads, head dims, Dk == Dv)"),),
    marker="bad_input",
    tests=(test_limits,),
    parametrize=_params,
)
