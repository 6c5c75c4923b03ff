"""Family decode: decode of a query equals its row of the prefill."""

from __future__ import annotations

import torch

from ..cases import Case, make_inputs
from ..compare import assert_close
from ..evaluation import batched, evaluate, impl_fn, reference_run
from ..family import DECODE_AND_PREFILL, Family
from ..impl import Impl


def check(impl: Impl, case: Case, device) -> None:
    """Decode of query `s` (keys cut at its position `t`) equals row `s` of prefill: for the
    first, middle and last rows, each against the golden row and against the prefill row."""
    inp = make_inputs(case, device)
    S, S_kv = inp.q.shape[1], inp.k.shape[2]
    judged = impl.judged_as(case.dtype)
    gold, plain, _ = reference_run(batched(inp, judged), inp, case, judged, grads=False)
    prefill = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    for s in sorted({0, S // 2, S - 1}):
        t = s + S_kv - S
        if t < 0:
            continue
        row = slice(s, s + 1)
        dec = evaluate(impl_fn(impl, inp.ranges[:, row], inp.scale), inp.q[:, row], inp.k[:, :, : t + 1], inp.v[:, :, : t + 1])
        for name, ref in (("golden", gold), ("prefill", prefill)):
            cid = f"{case.id} decode of row {s} vs {name} row"
            assert_close(
                "o", dec.o, ref.o[:, row], precision=judged, case_id=cid, plain=None if plain is None else plain.o[:, row]
            )
            if dec.lse is not None and ref.lse is not None:
                assert_close(
                    "lse",
                    dec.lse,
                    ref.lse[:, row],
                    precision=judged,
                    case_id=cid,
                    plain=None if plain is None else plain.lse[:, row],
                )


FAMILY = Family(
    "decode",
    "decode equals the matching prefill row",
    rank=8,
    check=check,
    applies=lambda c: c.mode == "prefill" and c.dtype != torch.float64 and not c.gpu_only,
    requires=(DECODE_AND_PREFILL,),
    call_modes=("decode", "prefill"),
)
