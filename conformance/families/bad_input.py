"""Family bad_input: malformed calls raise an error naming the argument, never a result.
Not per case: each malformed call (`BAD_INPUTS`) once per implementation."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from ..cases import Case, make_inputs
from ..compare import fail
from ..family import Family, param_marks
from ..impl import Impl, fit, known_bug, skip_reason
from ..remote import ExecutorDied


@dataclass(frozen=True)
class BadInput:
    """One malformed call: `mutate(inp) -> kwargs` of the call; the error must name `arg`."""

    name: str
    arg: str
    mutate: Callable
    varlen: bool = False


def _base(inp):
    return dict(q=inp.q, k=inp.k, v=inp.v, ranges=inp.ranges, scale=inp.scale)


def _with(**changes):
    return lambda inp: {**_base(inp), **{k: f(inp) for k, f in changes.items()}}


BAD_INPUTS = (
    BadInput("q-rank", "q", _with(q=lambda i: i.q[0])),
    BadInput("q-int", "q", _with(q=lambda i: i.q.to(torch.int32))),
    BadInput("k-headdim", "k", _with(k=lambda i: i.k[..., :-1])),
    BadInput("k-dtype", "k", _with(k=lambda i: i.k.to(torch.float64 if i.q.dtype != torch.float64 else torch.float32))),
    BadInput("v-length", "v", _with(v=lambda i: i.v[:, :, :-1])),
    BadInput("v-dtype", "v", _with(v=lambda i: i.v.to(torch.float64 if i.q.dtype != torch.float64 else torch.float32))),
    BadInput("ranges-float", "ranges", _with(ranges=lambda i: i.ranges.to(torch.float32))),
    BadInput("ranges-pairs", "ranges", _with(ranges=lambda i: i.ranges[..., :1].contiguous())),
    BadInput("ranges-groups", "ranges", _with(ranges=lambda i: torch.cat([i.ranges, i.ranges[:, :, :1]], 2))),
    BadInput("k-batch", "k", _with(k=lambda i: torch.cat([i.k, i.k]))),
    BadInput("v-groups", "v", _with(v=lambda i: torch.cat([i.v, i.v], 1))),
    BadInput("scale-nan", "scale", _with(scale=lambda i: float("nan"))),
    BadInput("scale-inf", "scale", _with(scale=lambda i: float("inf"))),
    BadInput("scale-zero", "scale", _with(scale=lambda i: 0.0)),
    BadInput("scale-negative", "scale", _with(scale=lambda i: -1.0)),
    BadInput("q-meta", "q", _with(q=lambda i: i.q.to("meta"))),
    BadInput(
        "cu_seqlens_q-total",
        "cu_seqlens_q",
        lambda i: {**_base(i), "cu_q": i.cu_seqlens_q[:-1], "cu_k": i.cu_seqlens_k},
        varlen=True,
    ),
    BadInput(
        "cu_seqlens_q-decreasing",
        "cu_seqlens_q",
        lambda i: {**_base(i), "cu_q": i.cu_seqlens_q.flip(0), "cu_k": i.cu_seqlens_k},
        varlen=True,
    ),
    BadInput(
        "cu_seqlens_k-list",
        "cu_seqlens_k",
        lambda i: {**_base(i), "cu_q": i.cu_seqlens_q, "cu_k": i.cu_seqlens_k.tolist()},
        varlen=True,
    ),
)


def check(impl: Impl, bad: BadInput, case: Case, device) -> None:
    """The call raises an error whose message names the offending argument."""
    inp = make_inputs(case, device)
    kw = bad.mutate(inp)
    try:
        with torch.no_grad():
            if bad.varlen:
                impl.forward_varlen(kw["q"], kw["k"], kw["v"], kw["ranges"], kw["cu_q"], kw["cu_k"], scale=kw["scale"])
            else:
                impl.forward(kw["q"], kw["k"], kw["v"], kw["ranges"], scale=kw["scale"])
    except ExecutorDied as e:  # SPEC.md: refused before any kernel runs, never a crash inside one
        fail(
            case.id,
            f"bad input {bad.name}: the kernel's process died instead of refusing ({e})",
            rule="bad-input",
            kind="crashed instead of refusing",
        )
    except Exception as e:  # any error type, as long as it says what was wrong
        if not re.search(rf"(?<![\w.]){re.escape(bad.arg)}(?!\w)", str(e)):
            fail(
                case.id,
                f"bad input {bad.name}: {type(e).__name__} does not name {bad.arg!r}: {e}",
                rule="bad-input",
                kind="refused without naming the argument",
            )
        return
    fail(
        case.id,
        f"bad input {bad.name}: accepted silently (expected an error naming {bad.arg!r})",
        rule="bad-input",
        kind="accepted silently",
    )


def _params(family, impls, cases, device) -> tuple:
    """Each bad input once per implementation, on the first tiny case it supports."""
    params = []
    for impl in impls:
        for bad in BAD_INPUTS:
            usable = [
                c
                for c in (fit(c, impl) for c in cases)
                if c.size == "tiny"
                and (c.mode == "varlen") == bad.varlen
                and c.dtype_name in impl.dtypes
                and c.dtype != torch.float64
                and not skip_reason(impl, c, device)
            ]
            usable.sort(key=lambda c: c.dtype != torch.float32)
            why = family.skip(impl, None, device) or (
                None if usable else f"{impl.name} declares no tiny {'varlen' if bad.varlen else 'batched'} case"
            )
            bug = None if why or not usable else known_bug(impl, "bad_input", usable[0], bad.name)
            params.append(
                pytest.param(impl, bad, usable[0] if usable else None, id=f"{impl.name}-{bad.name}", marks=param_marks(why, bug))
            )
    return ("impl", "bad", "case"), params


def test_bad_input(impl, bad, case, device):
    check(impl, bad, case, device)


FAMILY = Family(
    "bad_input", "clear errors naming the argument", rank=11, check=check, tests=(test_bad_input,), parametrize=_params
)
