"""The KV-outer prefill forward (kernels/triton/kv_outer.py) against the fp64 reference, on what
its design could get wrong: a tile split over several work items, two ranges of one row in one
tile (two partials to merge), NaN in the unselected keys of a tile other rows selected, NaN and
infinities in V at keys only some rows of a step select, empty rows, a bitwise-identical rerun,
and the profile's routing by heads per KV head.

On CPU under TRITON_INTERPRET=1 (fp32 and fp16; bf16 is wrong in the interpreter, triton-lang/triton#11584)."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from selgate.kernels import reload_settings, selection_attention, stats  # noqa: E402
from selgate.kernels.triton import inverse_index, kv_outer  # noqa: E402
from selgate.reference import build_ranges, normalize_ranges, selected_keys, selection_attention_ref  # noqa: E402
from tests.helpers import clean_dispatcher, random_inputs  # noqa: E402, F401

pytestmark = pytest.mark.usefixtures("clean_dispatcher")


def _nan_outside(k, v, norm):
    """k and v with every key no row selects set to NaN (a kernel must never read those)."""
    unused = ~selected_keys(norm, k.shape[2])  # [B, G, S_kv]
    return k.masked_fill(unused[..., None], float("nan")), v.masked_fill(unused[..., None], float("nan"))


def _check(q, k, v, norm, dtype, **kw):
    q, k, v = (t.to(DEVICE, dtype) for t in (q, k, v))
    norm = norm.to(DEVICE)
    o = torch.full((*q.shape[:4], v.shape[3]), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full(q.shape[:4], float("nan"), device=DEVICE)
    kv_outer.kv_outer_forward(q, k, v, norm, scale=0.3, out=(o, lse), **kw)
    ro, rl = selection_attention_ref(q.double(), k.double(), v.double(), norm, scale=0.3, return_lse=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert torch.isfinite(o).all() and not torch.isnan(lse).any()
    torch.testing.assert_close(o.double(), ro.to(o.device), atol=tol, rtol=0)
    assert torch.equal(torch.isinf(lse).cpu(), torch.isinf(rl).cpu())
    finite = torch.isfinite(rl)
    torch.testing.assert_close(lse[finite].double(), rl[finite].to(lse.device), atol=tol, rtol=0)
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_tiles_and_two_ranges_in_one_tile_merge_to_the_reference(monkeypatch, dtype):
    """CHUNK 3: a tile every row selects is split over many work items; ranges of 5 keys with
    gaps put two ranges of one row into one 64-key tile; NaN in every key no row selected."""
    monkeypatch.setattr(kv_outer, "CHUNK", 3)
    q, k, v, _ = random_inputs(B=2, S=40, G=2, h=3, Dk=16, Dv=8, S_kv=150, n=4, seed=1)
    starts = torch.tensor([0, 10, 70, 140])
    r = torch.stack([starts, starts + 5], -1).expand(2, 40, 2, 4, 2).clone()
    r[1, 5] = 0  # empty rows
    norm = normalize_ranges(r, 150)
    k, v = _nan_outside(k, v, norm)
    _check(q, k, v, norm, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nan_and_inf_in_v_reach_only_the_rows_that_select_them(dtype):
    """Rows of one MMA step selecting different keys of one tile: NaN, +inf and -inf in V at
    keys only some rows select, and +inf beside -inf under one row, give the reference's special
    values in those rows' columns and leave every other row and column finite."""
    q, k, v, _ = random_inputs(B=1, S=8, G=1, h=2, Dk=16, Dv=8, S_kv=64, n=1, seed=4)
    r = torch.zeros(1, 8, 1, 1, 2, dtype=torch.int64)
    for s in range(8):
        r[0, s, 0, 0] = torch.tensor([8 * s, 8 * s + 8])  # row s selects keys [8s, 8s + 8) alone
    r[0, 7, 0, 0] = torch.tensor([48, 64])  # row 7 selects row 6's keys too
    norm = normalize_ranges(r, 64)
    v = v.clone()
    v[0, 0, 3, 0] = float("nan")  # row 0, column 0
    v[0, 0, 9, 1] = float("inf")  # row 1, column 1
    v[0, 0, 17, 2] = float("-inf")  # row 2, column 2
    v[0, 0, 50, 3] = float("inf")  # rows 6 and 7, column 3 (+inf)
    v[0, 0, 60, 3] = float("-inf")  # row 7 alone: +inf beside -inf, NaN
    q, k, v = (t.to(DEVICE, dtype) for t in (q, k, v))
    o = torch.full((*q.shape[:4], v.shape[3]), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full(q.shape[:4], float("nan"), device=DEVICE)
    kv_outer.kv_outer_forward(q, k, v, norm.to(DEVICE), scale=0.3, out=(o, lse))
    ro = selection_attention_ref(q.double(), k.double(), v.double(), norm.to(DEVICE), scale=0.3)
    special = ~torch.isfinite(ro)
    assert special.sum() == 5 * 2 and torch.isfinite(o[~special]).all()
    assert torch.equal(o.isnan(), ro.isnan()) and torch.equal(o.isinf(), ro.isinf())
    assert torch.equal(o[ro.isinf()].double(), ro[ro.isinf()])
    torch.testing.assert_close(o[~special].double(), ro[~special], atol=1e-5 if dtype == torch.float32 else 2e-3, rtol=0)


def test_a_call_runs_whole_within_the_partials_budget_and_in_row_chunks_past_it(monkeypatch):
    """Within the budget both batches run in one launch; with a budget of 7 pairs' partials each
    batch's rows run in several chunks (a row never cut), the rows after a chunk boundary see
    their own positions, and both results are the reference's."""
    q, k, v, r = random_inputs(B=2, S=12, G=2, h=2, Dk=16, Dv=16, S_kv=90, n=3, seed=3)
    norm = normalize_ranges(r, 90)
    launches = []
    real = kv_outer._launch
    monkeypatch.setattr(kv_outer, "_launch", lambda q, *a, **kw: launches.append(tuple(q.shape[:2])) or real(q, *a, **kw))
    _check(q, k, v, norm, torch.float32)
    assert launches == [(2, 12)], "within the budget: the whole call, both batches, in one launch"
    launches.clear()
    monkeypatch.setattr(inverse_index, "PARTIALS_BUDGET", 7 * 2 * (16 + 2) * 4)
    _check(q, k, v, norm, torch.float32)
    assert len(launches) > 4 and sum(S for B, S in launches) == 2 * 12 and all(B == 1 for B, S in launches)


def test_nsa_ranges_at_one_head_a_group_and_a_rerun_is_bitwise_identical():
    q, k, v, _ = random_inputs(B=1, S=130, G=2, h=1, Dk=32, Dv=32, S_kv=130, n=1, seed=2)
    norm = build_ranges(torch.rand(1, 130, 2, 9, generator=torch.Generator().manual_seed(0)), G=2, l_sel=16, n=5, S_kv=130)
    o, lse = _check(q, k, v, norm, torch.float32)
    again = (torch.empty_like(o), torch.empty_like(lse))
    kv_outer.kv_outer_forward(*(t.to(DEVICE, torch.float32) for t in (q, k, v)), norm.to(DEVICE), scale=0.3, out=again)
    assert torch.equal(o, again[0]) and torch.equal(lse, again[1])


def test_the_profile_routes_prefill_calls_by_heads_per_kv_head(monkeypatch):
    """SELGATE_TRITON_KV_OUTER=2 (the profile's `kv_outer_max_heads`): prefill with h <= 2 runs
    the KV-outer kernel, h = 3 and decode do not."""
    monkeypatch.setenv("SELGATE_TRITON_KV_OUTER", "2")
    reload_settings()
    try:
        for h, S, expect in ((2, 9, 1), (3, 9, 0), (1, 1, 0)):
            q, k, v, r = random_inputs(B=1, S=S, G=2, h=h, Dk=16, Dv=16, S_kv=40, n=3, dtype=torch.float32, seed=h)
            before = stats()["launches"].get("triton_fwd_kv_outer", 0)
            o = selection_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), r.to(DEVICE), backend="triton")
            assert stats()["launches"].get("triton_fwd_kv_outer", 0) - before == expect, (h, S)
            want = selection_attention_ref(q.double(), k.double(), v.double(), r)
            torch.testing.assert_close(o.double().cpu(), want, atol=1e-5, rtol=0)
    finally:
        monkeypatch.delenv("SELGATE_TRITON_KV_OUTER")
        reload_settings()


def test_keys_past_the_normalisers_sort_key_take_the_row_kernels():
    """The route normalises ranges with the Triton normaliser, whose packed sort key holds
    S_kv <= 2^30: past it the row kernels serve (the sm90 lane's 2^30 + 100-key case failed in
    strict mode with the route on), and the named kernel is refused rather than replaced."""
    from selgate.kernels.triton import fwd, forward_kernel_unsupported
    from selgate.kernels.triton.normalize import MAX_S_KV

    q = torch.empty(1, 9, 1, 2, 16)
    cfg = {"KV_OUTER_MAX_HEADS": 2}
    assert fwd.kv_outer_routes(q, 2, MAX_S_KV, cfg)
    assert not fwd.kv_outer_routes(q, 2, MAX_S_KV + 100, cfg)
    assert not fwd.kv_outer_routes(q, 3, 40, cfg) and not fwd.kv_outer_routes(q[:, :1], 2, 40, cfg)
    k = torch.empty(1, 1, MAX_S_KV + 100, 16, device="meta")
    assert "2^30" in forward_kernel_unsupported("kv_outer", q, k, k)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graph capture needs a GPU")
def test_under_graph_capture_the_row_kernels_serve_the_route(monkeypatch):
    """The KV-outer forward reads its index's size on the host, which capture forbids: a captured
    prefill takes the row kernels, and replays right."""
    monkeypatch.setenv("SELGATE_TRITON_KV_OUTER", "16")
    reload_settings()
    try:
        q, k, v, r = (t.to(DEVICE) for t in random_inputs(B=1, S=64, G=2, h=2, Dk=64, Dv=64, S_kv=64, n=3, dtype=torch.float16))
        eager = selection_attention(q, k, v, r, backend="triton")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = selection_attention(q, k, v, r, backend="triton")
        graph.replay()
        torch.testing.assert_close(captured, eager, atol=2e-3, rtol=0)
    finally:
        monkeypatch.delenv("SELGATE_TRITON_KV_OUTER")
        reload_settings()


def test_the_named_kernel_on_normalised_ranges_skips_normalisation(monkeypatch):
    """`selection_attention_kernel(..., normalized=True)` runs the kernel on the ranges as given
    (the bench's `triton_kv_outer` column times the kernel, as `triton` is timed, without the
    reference's torch normalisation); without it the ranges are normalised first."""
    import selgate.kernels.triton as kt

    q, k, v, r = random_inputs(B=1, S=24, G=2, h=2, Dk=16, Dv=8, S_kv=90, n=3, dtype=torch.float32, seed=4)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    norm = normalize_ranges(r, 90).to(DEVICE)
    want = kt.selection_attention_kernel("kv_outer", q, k, v, r.to(DEVICE), scale=0.3)
    calls = []
    monkeypatch.setattr(kt, "normalize_ranges", lambda *a, **kw: calls.append(a) or normalize_ranges(*a, **kw))
    got = kt.selection_attention_kernel("kv_outer", q, k, v, norm, scale=0.3, normalized=True)
    assert calls == []
    assert torch.equal(got, want)
    ref = selection_attention_ref(q.double(), k.double(), v.double(), norm, scale=0.3)
    torch.testing.assert_close(got.double(), ref.to(got.device), atol=1e-5, rtol=0)
