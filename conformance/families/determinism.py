"""Family determinism: repeated runs are bitwise identical (SPEC.md, "Determinism")."""

from __future__ import annotations

import torch

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import evaluate, golden_fn, impl_fn, make_upstream
from ..family import DETERMINISTIC, Family, repeatable
from ..registry import Impl


def check(impl: Impl, case: Case, device, backward: bool = False) -> None:
    """Repeated runs give bitwise-identical o and lse (and dq, dk, dv with `backward`):
    5 runs on a GPU, where reduction order can race; 2 on CPU, to keep the interpreter cheap."""
    runs = 5 if torch.device(device).type == "cuda" else 2
    inp = make_inputs(case, device)
    up = None
    if backward:
        gold = evaluate(golden_fn(inp.ranges, inp.scale), inp.q, inp.k, inp.v)
        up = make_upstream(gold.o, gold.lse, case.seed)
    fn = impl_fn(impl, inp.ranges, inp.scale)
    first = evaluate(fn, inp.q, inp.k, inp.v, up)
    for i in range(1, runs):
        again = evaluate(fn, inp.q, inp.k, inp.v, up)
        pairs = [("o", again.o, first.o), ("lse", again.lse, first.lse)]
        if up is not None:
            pairs += list(zip(("dq", "dk", "dv"), again.grads, first.grads))
        for name, a, b in pairs:
            if a is not None:
                assert_equal(name, a, b, case_id=case.id, why=f"run {i + 1} vs run 1 must be bitwise identical")


FAMILY = Family(
    "determinism", "bitwise-identical repeated runs", rank=3, check=check, applies=repeatable, requires=(DETERMINISTIC,)
)
