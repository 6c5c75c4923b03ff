"""Family backward: dq, dk, dv equal the golden gradients; keys no row selected get exactly zero dk, dv."""

from __future__ import annotations

import torch

from selgate.reference import selected_keys

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import batched, compare, evaluate, impl_fn, reference_run
from ..family import BACKWARD, Family, tiny_subset
from ..registry import Impl


def check(impl: Impl, case: Case, device) -> None:
    """dq, dk, dv equal the golden gradients; keys no row selected get exactly zero dk, dv."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(batched(inp, judged), inp, case, judged, grads=True, lse=impl.lse)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v, up)
    compare(case, judged, got, gold, plain)
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
    applies=tiny_subset(("mixed", "builder", "overlapping", "heavy_reuse", "full", "empty", "beyond_t")),
    requires=(BACKWARD,),
)
