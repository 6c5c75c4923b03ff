"""Family gradcheck: torch.autograd.gradcheck in fp64 on tiny cases."""

from __future__ import annotations

import re

import torch
from torch.autograd.gradcheck import GradcheckError

from ..cases import Case, make_inputs
from ..compare import fail
from ..family import BACKWARD, FP64, Family
from ..impl import Impl

OUTPUTS, INPUTS = ("o", "lse"), ("q", "k", "v")


def gradcheck_kind(first_line: str) -> str:
    """gradcheck's first line with its outputs and inputs named (`Jacobian mismatch for o with
    respect to k`) and its numbers left out: what a report groups by."""
    text = re.sub(r"output (\d+)", lambda m: OUTPUTS[int(m[1])] if int(m[1]) < len(OUTPUTS) else m[0], first_line)
    text = re.sub(r"input (\d+)", lambda m: INPUTS[int(m[1])] if int(m[1]) < len(INPUTS) else m[0], text)
    return re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d*)?(?:e[-+]?\d+)?(?!\w)", "N", text).rstrip(",.")


def check(impl: Impl, case: Case, device) -> None:
    """torch.autograd.gradcheck in fp64 (finite differences against the implementation's grads)."""
    inp = make_inputs(case, device)
    leaves = [t.detach().clone().requires_grad_() for t in (inp.q, inp.k, inp.v)]

    def fn(q, k, v):
        o, lse = impl.forward(q, k, v, inp.ranges, scale=inp.scale)
        return (o,) if lse is None else (o, torch.where(torch.isfinite(lse), lse, 0.0))

    try:
        torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=0.0)
    except GradcheckError as e:
        first = str(e).splitlines()[0]
        fail(case.id, f"gradcheck: {first}", rule="gradients", kind=gradcheck_kind(first))


FAMILY = Family(
    "gradcheck",
    "torch.autograd.gradcheck in fp64",
    rank=2,
    check=check,
    applies=lambda c: c.dtype == torch.float64,
    requires=(BACKWARD, FP64),
)
