"""The tiny case matrix keeps what each bug class needs, whatever an implementation declares:
several KV groups at every head-dim window, rows past 256 keys, large logits that overflow an
fp32 exp yet are exact in fp32, and case ids the triage parser reads."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from selgate.conformance.cases import DTYPE_NAMES, make_inputs, select
from selgate.conformance.families import FAMILIES
from selgate.conformance.inputs import FP32_EXP_OVERFLOW, LOG2E
from selgate.conformance.impl import fit
from selgate.conformance.registry import REGISTRY
from selgate.reports.triage import CASE_ID
from selgate.reference import normalize_ranges, selected_lengths, selection_attention_ref

TINY = select("tiny")
PARITY = FAMILIES["parity"]
HEAD_DIMS = sorted({d for c in TINY for d in (c.shape.Dk, c.shape.Dv)})
HEADS = {
    "any": {},
    "power_of_two": {"heads_power_of_two": True},
    "multiple_of_4": {"heads_multiple_of": 4},
    "max_4": {"max_heads": 4},
}


def _declared(mode, dtype, window, same, heads):
    lo, hi = window
    return dataclasses.replace(
        REGISTRY["sdpa"],
        name="declared",
        modes=(mode,),
        dtypes=(DTYPE_NAMES[dtype],),
        min_head_dim=lo,
        max_head_dim=hi,
        same_head_dims=same,
        **HEADS[heads],
    )


@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_declarations_never_leave_only_one_group(mode, dtype):
    """Any head-dim window (up to d, from d, exactly d), Dv == Dk or not, any heads rule: when a
    parity case of `mode` and `dtype` runs at all, one with G >= 2 runs (a kernel whose every
    group reads group 0's keys is caught whatever it declares)."""
    windows = [(1, d) for d in HEAD_DIMS] + [(d, None) for d in HEAD_DIMS] + [(d, d) for d in HEAD_DIMS]
    cases = [c for c in TINY if c.mode == mode and c.dtype == dtype and PARITY.applies(c)]
    for window, same, heads in itertools.product(windows, (False, True), HEADS):
        impl = _declared(mode, dtype, window, same, heads)
        ran = [f for f in (fit(c, impl) for c in cases) if not PARITY.skip(impl, f, "cpu")]
        if ran:
            assert any(c.shape.G >= 2 for c in ran), (window, same, heads, [c.id for c in ran])


def test_fit_keeps_the_group_count():
    impl = _declared("decode", torch.float32, (1, None), False, "multiple_of_4")
    assert all(fit(c, impl).shape.G == c.shape.G for c in TINY)


def test_heads_and_groups_that_are_not_powers_of_two_survive_fitting():
    for rule, want in (("any", {3, 5, 6, 7, 12}), ("multiple_of_4", {12})):
        impl = _declared("prefill", torch.float32, (1, None), False, rule)
        heads = {fit(c, impl).shape.h for c in TINY}
        assert want <= heads, (rule, sorted(heads))
    assert {c.shape.G for c in TINY} >= {3}
    assert {d for d in HEAD_DIMS if d & (d - 1)} >= {24, 40, 72, 100}
    # a multiple of 16 fits the awkward counts to 48, not to 16 (a head index by shift passed there)
    sixteen = dataclasses.replace(REGISTRY["sdpa"], heads_multiple_of=16)
    assert 48 in {fit(c, sixteen).shape.h for c in TINY}


def test_rows_past_256_keys_reach_the_interpreter():
    """Some tiny case, a smoke one among them (the Triton interpreter runs only those), has a
    row of more than 2 x 128 selected keys."""

    def longest(c):
        inp = make_inputs(c)
        return int(selected_lengths(normalize_ranges(inp.ranges, inp.k.shape[2])).max())

    long_rows = [c for c in TINY if c.shape.S_kv > 256 and not c.gpu_only and longest(c) > 256]
    assert any(c.smoke for c in long_rows), [c.id for c in long_rows]


@pytest.mark.parametrize("case", [c for c in TINY if c.values == "large_logits"], ids=lambda c: c.id)
def test_large_logits_overflow_fp32_exp_and_are_exact(case):
    """Some row's lse is past fp32's exp overflow (a softmax without the max gives inf / inf);
    some group holds heads whose scores differ by more than that; q and k are exact in the
    case's dtype and their dot products exact in fp32; scale * log2(e) is a power of two."""
    inp = make_inputs(case)
    q, k = inp.q.double(), inp.k.double()
    _, lse = selection_attention_ref(q, k, inp.v.double(), inp.ranges, scale=inp.scale, return_lse=True)
    assert float(lse[torch.isfinite(lse)].max()) > FP32_EXP_OVERFLOW
    top = torch.einsum("bsghd,bgkd->bsghk", q, k).amax(-1) * inp.scale
    spread = top.amax(3) - top.amin(3)
    assert float(spread.max()) > FP32_EXP_OVERFLOW
    dots = torch.einsum("bsghd,bgkd->bsghk", q, k)
    assert torch.equal(torch.einsum("bsghd,bgkd->bsghk", q.float(), k.float()).double(), dots)
    for t in (q, k):
        assert torch.equal(t.to(case.dtype).double(), t)
    ratio = inp.scale * LOG2E
    assert ratio == 2.0 ** round(torch.tensor(ratio).log2().item())


def test_case_ids_parse_and_are_unique():
    ids = [c.id for c in select("large")]
    assert len(ids) == len(set(ids))
    assert all(CASE_ID.fullmatch(i) for i in ids), [i for i in ids if not CASE_ID.fullmatch(i)]
