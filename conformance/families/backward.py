"""Family backward: dq, dk, dv equal the golden gradients; keys no row selected get exactly zero dk, dv.
Large logits run here too: a backward that recomputes the softmax without its max gives NaN
gradients under a right forward."""

from __future__ import annotations

import torch

from selgate.reference import selected_keys

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import batched, compare, evaluate, impl_fn, reference_run
from ..family import BACKWARD, Family, batched_lowp, tiny_subset
from ..impl import Impl
from ..tolerances import tolerance

TINY = tiny_subset(("mixed", "builder", "overlapping", "heavy_reuse", "full", "empty", "beyond_t"))


def check(impl: Impl, case: Case, device) -> None:
    """dq, dk, dv equal the golden gradients; keys no row selected get exactly zero dk, dv."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(batched(inp, judged), inp, case, judged, grads=True, lse=impl.lse)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v, up)
    # fp32's absolute bound does not scale with scores near 100: a correct kernel's dk is 1.5e-5
    # off there (selgate's SDPA path), so only NaN and inf are judged; fp16/bf16 bounds scale
    compare(case, judged, got, gold, plain, grad_values=case.values != "large_logits" or tolerance(judged, "dk").relative)
    unsel = ~selected_keys(inp.ranges, inp.k.shape[2])
    for name, g in (("dk", got.grads[1]), ("dv", got.grads[2])):
        assert_equal(
            f"{name}[unselected keys]",
            g[unsel],
            torch.zeros_like(g[unsel]),
            case_id=case.id,
            why="keys no row selected get exactly zero gradient",
            rule="unselected-keys",
        )


FAMILY = Family(
    "backward",
    "dq, dk, dv against the golden gradients",
    rank=1,
    check=check,
    applies=lambda c: TINY(c) or (c.values == "large_logits" and batched_lowp(c)),
    requires=(BACKWARD,),
)
