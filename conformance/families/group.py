"""Family group: equal q across a group's heads gives equal outputs."""

from __future__ import annotations

import torch

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import batched, compare, evaluate, impl_fn, reference_run
from ..family import Family, batched_lowp
from ..impl import Impl


def check(impl: Impl, case: Case, device) -> None:
    """With equal q across the heads of a group, every head's o and lse are equal (heads
    share their group's ranges by construction), and correct. Equal up to 4 ulp of the
    largest value: a library matmul may round rows of one product differently (seen: the
    fp64 reference on CUDA, heads differing by 5e-17); a head reading other ranges is off by O(1)."""
    inp = make_inputs(case, device)
    inp.q = inp.q[:, :, :, :1].expand_as(inp.q).contiguous()
    judged = impl.judged_as(case.dtype)
    gold, plain, _ = reference_run(batched(inp, judged), inp, case, judged, grads=False)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    for name, t in (("o", got.o), ("lse", got.lse)):
        if t is None:
            continue
        first = t[:, :, :, :1].expand_as(t)
        finite = t[torch.isfinite(t)]
        atol = 4 * torch.finfo(t.dtype).eps * float(finite.abs().max()) if finite.numel() else 0.0
        assert_equal(
            name, t, first, case_id=case.id, why="equal q across a group's heads gives equal outputs", rule="ranges", atol=atol
        )
    compare(case, judged, got, gold, plain)


FAMILY = Family(
    "group",
    "equal q across a group's heads gives equal outputs",
    rank=9,
    check=check,
    # not the large-logit inputs: their heads differ in size by design, which equal q undoes
    applies=lambda c: batched_lowp(c) and c.shape.h > 1 and c.pattern in ("mixed", "builder", "full") and c.values == "normal",
)
