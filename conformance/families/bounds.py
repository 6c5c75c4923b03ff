"""Family bounds: keys outside every selection and beyond t hold NaN; no read of them may show.
Then a key some rows select and others do not holds NaN: the rows that do not select it must not
show it."""

from __future__ import annotations

import torch

from selgate.reference import normalize_ranges, query_positions, selected_keys

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import Result, batched, compare, evaluate, impl_fn, reference_run
from ..family import Family, batched_lowp
from ..inputs import Inputs
from ..impl import Impl

POISON_TAIL = 3  # keys appended beyond every query's position, all NaN


def _poisoned(inp: Inputs, tail: int):
    """Inputs whose keys no row selects are NaN, plus `tail` NaN keys beyond every query's
    position, reached by `tail` extra queries that select nothing (so `t` of the original
    rows is unchanged) and by an extra range `(t+1, S_kv + tail + 2)` on every original row."""
    q, k, v, r = inp.q, inp.k, inp.v, inp.ranges
    B, S, G, h, Dk = q.shape
    S_kv = k.shape[2]
    unsel = ~selected_keys(r, S_kv)[..., None]
    k = torch.where(unsel, float("nan"), k)
    v = torch.where(unsel, float("nan"), v)
    if not tail:
        return q, k, v, r
    nan = float("nan")
    k = torch.cat([k, k.new_full((B, G, tail, Dk), nan)], 2)
    v = torch.cat([v, v.new_full((B, G, tail, v.shape[3]), nan)], 2)
    q = torch.cat([q, torch.ones_like(q[:, :1]).expand(B, tail, G, h, Dk)], 1)
    t = query_positions(B, S, S_kv, r.device)[:, :, None, None, None]
    past = torch.cat([t + 1, torch.full_like(t, S_kv + tail + 2)], -1).expand(B, S, G, 1, 2)
    r = torch.cat([r.to(torch.int64), past], 3)
    r = torch.cat([r, torch.zeros_like(r[:, :1]).expand(B, tail, G, r.shape[3], 2)], 1)
    return q, k, v, r.to(inp.ranges.dtype)


def _shared_key_poisoned(inp: Inputs):
    """k and v NaN at one key of each (b, g), the last key any of its rows selects, and the rows
    [B, S, G] that select it. A row that does not (its t lies before the key, or its ranges skip
    it) must not show it: a tile loaded whole, an MMA step shared with the rows that select it or
    a mask added to the scores spreads it through 0 * NaN or NaN - inf."""
    S_kv = inp.k.shape[2]
    keys = torch.arange(S_kv, device=inp.k.device)
    last = torch.where(selected_keys(inp.ranges, S_kv), keys, -1).amax(-1)  # [B, G]; -1: none selected
    hit = (keys == last[..., None])[..., None]
    norm = normalize_ranges(inp.ranges, S_kv).to(torch.int64)
    j = last[:, None, :, None]
    rows = ((norm[..., 0] <= j) & (j < norm[..., 1])).any(-1)
    return inp.k.masked_fill(hit, float("nan")), inp.v.masked_fill(hit, float("nan")), rows


def _shared_key_check(impl: Impl, case: Case, inp: Inputs, judged, gold: Result, plain) -> None:
    """The forward on `_shared_key_poisoned` inputs, judged on the rows that do not select the
    key, which must be as the golden run has them (their values do not depend on it). The rows
    that select it are not judged: SPEC.md says what a NaN input gives nowhere, and a split-K
    combine that leaves out a split whose sum is not positive (so that an empty split's 0 / 0
    stays out) drops a NaN split too, exact on every finite input."""
    k, v, rows = _shared_key_poisoned(inp)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, k, v)
    compare(case, judged, _others(got, rows), _others(gold, rows), None if plain is None else _others(plain, rows))


def _others(result: Result, rows) -> Result:
    """`result` with o and lse zero in `rows` [B, S, G]: only the other rows are compared."""
    lse = None if result.lse is None else result.lse.masked_fill(rows[..., None], 0)
    return Result(result.o.masked_fill(rows[..., None, None], 0), lse, None)


def check(impl: Impl, case: Case, device) -> None:
    """Keys outside every selection and beyond `t` hold NaN: any read of them shows up, in
    the output or the gradients. Outputs are poisoned before the call (CUDA caching
    allocator); every element must be finite where the golden result is."""
    inp = make_inputs(case, device)
    S, S_kv = inp.q.shape[1], inp.k.shape[2]
    tail = POISON_TAIL if "prefill" in impl.modes else 0
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(batched(inp, judged), inp, case, judged, grads=impl.backward, lse=impl.lse)
    q, k, v, r = _poisoned(inp, tail)
    up_p = None
    if up is not None:
        do, dlse = up
        up_p = (
            torch.cat([do, torch.ones_like(do[:, :1]).expand(-1, tail, -1, -1, -1)], 1),
            torch.cat([dlse, torch.zeros_like(dlse[:, :1]).expand(-1, tail, -1, -1)], 1),
        )
    got = evaluate(impl_fn(impl, r, inp.scale), q, k, v, up_p)
    rows = slice(0, S)
    main = Result(got.o[:, rows], None if got.lse is None else got.lse[:, rows], None)
    if got.grads is not None:
        dq, dk, dv = got.grads
        main.grads = (dq[:, rows], dk[:, :, :S_kv], dv[:, :, :S_kv])
        for name, g in (("dq[tail queries]", dq[:, S:]), ("dk[tail keys]", dk[:, :, S_kv:]), ("dv[tail keys]", dv[:, :, S_kv:])):
            assert_equal(name, g, torch.zeros_like(g), case_id=case.id, why="nothing selects them", rule="unselected-keys")
    if tail:
        o_t = got.o[:, S:]
        assert_equal("o[tail queries]", o_t, torch.zeros_like(o_t), case_id=case.id, why="they select nothing", rule="empty-rows")
    compare(case, judged, main, gold, plain)
    _shared_key_check(impl, case, inp, judged, gold, plain)


FAMILY = Family(
    "bounds",
    "NaN-poisoned keys outside the selection and beyond t, and in a key other rows select",
    rank=6,
    check=check,
    # not the large-logit inputs, whose gradients (~10) an absolute fp32 bound does not fit
    applies=lambda c: batched_lowp(c) and (c.size != "tiny" or c.dtype == torch.float32 or c.smoke) and c.values == "normal",
)
