"""Family parity: o and lse equal the golden result; an implementation with an o-only path runs it too."""

from __future__ import annotations

from ..cases import Case, make_inputs
from ..compare import assert_close
from ..evaluation import batched, compare, evaluate, impl_fn, reference_run
from ..family import Family, batched_lowp
from ..impl import Impl


def check(impl: Impl, case: Case, device) -> None:
    """o and lse equal the golden result; an implementation with an o-only path runs it too."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    gold, plain, _ = reference_run(batched(inp, judged), inp, case, judged, grads=False)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    compare(case, judged, got, gold, plain)
    if impl.lse:
        o_only = evaluate(impl_fn(impl, inp.ranges, inp.scale, want_lse=False), inp.q, inp.k, inp.v)
        assert_close(
            "o", o_only.o, gold.o, precision=judged, case_id=case.id + " (o-only path)", plain=None if plain is None else plain.o
        )


FAMILY = Family("parity", "o and lse against the fp64 golden result", rank=0, check=check, applies=batched_lowp)
