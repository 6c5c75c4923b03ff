"""Family empty_ranges: rows selecting nothing give o = 0 exactly, lse = -inf, no NaN, zero dq."""

from __future__ import annotations

import torch

from selgate.reference import query_positions

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import batched, compare, empty_rows, evaluate, impl_fn, reference_run
from ..family import Family, batched_lowp
from ..impl import Impl


def _with_empty_rows(ranges: torch.Tensor, S_kv: int) -> torch.Tensor:
    """Two rows in three made empty: all `(0, 0)` padding, or only inverted ranges and
    ranges wholly beyond `t` (non-canonical empties)."""
    B, S, G, n, _ = ranges.shape
    row = torch.arange(B * S * G, device=ranges.device).reshape(B, S, G, 1, 1)
    t = query_positions(B, S, S_kv, ranges.device)[:, :, None, None]
    j = torch.arange(n, device=ranges.device)
    beyond = torch.stack([t + 1 + j, t + 3 + j], -1)
    inverted = torch.stack([j + 4, j + 1], -1).expand(B, S, G, n, 2)
    odd = torch.where((j % 2 == 0)[..., None], beyond, inverted)
    r = torch.where(row % 3 == 0, 0, torch.where(row % 3 == 1, odd, ranges.to(torch.int64)))
    return r.to(ranges.dtype)


def check(impl: Impl, case: Case, device) -> None:
    """Rows selecting nothing give o = 0 exactly, lse = -inf, no NaN, and zero dq."""
    inp = make_inputs(case, device)
    S_kv = inp.k.shape[2]
    ranges = _with_empty_rows(inp.ranges, S_kv)
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(batched(inp, judged, ranges), inp, case, judged, grads=impl.backward, lse=impl.lse)
    got = evaluate(impl_fn(impl, ranges, inp.scale), inp.q, inp.k, inp.v, up)
    empty = empty_rows(ranges, S_kv)
    o_e = got.o[empty]
    assert_equal(
        "o[empty rows]", o_e, torch.zeros_like(o_e), case_id=case.id, why="an empty row gives o = 0 exactly", rule="empty-rows"
    )
    if got.lse is not None:
        l_e = got.lse[empty]
        assert_equal(
            "lse[empty rows]",
            l_e,
            torch.full_like(l_e, float("-inf")),
            case_id=case.id,
            why="an empty row gives lse = -inf",
            rule="empty-rows",
        )
    if got.grads is not None:
        dq_e = got.grads[0][empty]
        assert_equal(
            "dq[empty rows]",
            dq_e,
            torch.zeros_like(dq_e),
            case_id=case.id,
            why="an empty row contributes zero gradient",
            rule="empty-rows",
        )
    compare(case, judged, got, gold, plain)


FAMILY = Family(
    "empty_ranges",
    "rows selecting nothing",
    rank=5,
    check=check,
    # not the large-logit inputs, whose gradients (~10) an absolute fp32 bound does not fit
    applies=lambda c: batched_lowp(c) and c.pattern in ("mixed", "builder", "empty", "padding", "full") and c.values == "normal",
)
