"""No silent wrong answer at the edges: key counts past 2^31, positions whose t + 1 would
overflow, no range slot or no key at all, non-finite rows, malformed arguments and settings.

Huge S_kv uses stride-0 K/V (`expand`), so every key holds the same vectors and the exact
answer is known without a reference run: `o = v0`, `lse = scale * q.k0 + log(L)`. Triton runs
on a GPU or under TRITON_INTERPRET=1; cases that only a GPU path reaches skip on CPU."""

from __future__ import annotations

import math
import os

import pytest
import torch

from selgate.kernels import capability_override, reset_stats, selection_attention, selection_attention_varlen, stats
from selgate.errors import ConfigError, StrictModeError
from selgate.reference import normalize_ranges, selection_attention_ref
from selgate.reference.varlen import varlen_to_batched
from tests.helpers import clean_dispatcher, random_inputs  # noqa: F401 (a fixture)

ON_GPU = torch.cuda.is_available()
CAN_LAUNCH = ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if ON_GPU else "cpu"
needs_triton = pytest.mark.skipif(not CAN_LAUNCH, reason="Triton needs a GPU or TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="this path (Triton range normalisation, CUDA) runs on a GPU only")
BACKENDS = ("reference", "sdpa", pytest.param("triton", marks=needs_triton))
INT64_MAX = 2**63 - 1


pytestmark = pytest.mark.usefixtures("clean_dispatcher")


def call(backend, *args, **kw):
    """The dispatcher with `backend` forced (strict: no silent fallback), a simulated SM 9.0
    so the interpreter runs Triton on CPU."""
    with capability_override("9.0"):
        return selection_attention(*args, backend=backend, strict=True, **kw)


def constant_kv(S_kv, G=1, D=16, dtype=torch.float32, seed=0):
    """K/V [1, G, S_kv, D] whose every key is the same row (stride 0: a few bytes), and q."""
    g = torch.Generator().manual_seed(seed)
    k0, v0 = (torch.randn(1, G, 1, D, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    return k0, v0, k0.expand(1, G, S_kv, D), v0.expand(1, G, S_kv, D)


def expected(q, k0, v0, L):
    """Exact `(o, lse)` of rows that select L copies of the same key: o = v0, lse = s + log L."""
    B, S, G, h, D = q.shape
    score = torch.einsum("bsghd,gd->bsgh", q.double(), k0[0, :, 0].double()) / math.sqrt(D)
    return v0[0, :, 0].double()[None, None, :, None].expand(B, S, G, h, -1), score + math.log(L)


# --- key counts past 2^31 ---------------------------------------------------------------


@pytest.mark.parametrize("S_kv", [2**30 + 100, 2**31 + 10])
@pytest.mark.parametrize("backend", BACKENDS)
def test_keys_past_2_31_are_read(backend, S_kv):
    """Decode and a 2-query prefill over the last keys of a stride-0 K/V: the Triton forward
    counted keys in int32 and returned zeros; the Triton range normalisation packed starts
    past 2^30 into its sort key and dropped them."""
    if backend == "triton" and not ON_GPU and S_kv < 2**31:
        pytest.skip("the packed sort key of the Triton normalisation runs on CUDA tensors only")
    k0, v0, k, v = constant_kv(S_kv)
    q = torch.randn(1, 2, 1, 2, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ranges = torch.tensor([[S_kv - 40, S_kv + 5], [S_kv - 100, S_kv - 90]], device=DEVICE)
    ranges = ranges[None, None, None].expand(1, 2, 1, 2, 2).contiguous()
    o, lse = call(backend, q, k, v, ranges, return_lse=True)
    for s, L in ((0, 10 + 39), (1, 10 + 40)):  # query s = 0 sits at t = S_kv - 2
        ref_o, ref_lse = expected(q[:, s : s + 1], k0, v0, L)
        assert (o[:, s : s + 1].double() - ref_o).abs().max() <= 1e-5
        assert (lse[:, s : s + 1].double() - ref_lse).abs().max() <= 1e-5


@needs_triton
def test_triton_backward_refuses_keys_past_2_31(monkeypatch):
    """The Triton backward counts keys in int32: gradients past 2^31 keys go to sdpa with a
    reason (or raise under strict), never through a forward whose backward would wrap. Only q
    requires grad: a dk of 2^31 keys would not fit in memory."""
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    k0, v0, k, v = constant_kv(2**31 + 10)
    q = torch.randn(1, 1, 1, 2, 16, device=DEVICE, requires_grad=True)
    ranges = torch.tensor([[[[[2**31, 2**31 + 10]]]]], device=DEVICE)
    with capability_override("9.0"), pytest.raises(StrictModeError, match="S_kv=2147483658"):
        selection_attention(q, k, v, ranges, backend="triton", strict=True)
    reset_stats()
    with capability_override("9.0"):
        o = selection_attention(q, k, v, ranges, backend="triton")
    assert stats()["fallback_reasons"] == {"triton:S_kv": 1} and stats()["calls"] == {"sdpa": 1}
    o.sum().backward()
    assert torch.isfinite(q.grad).all()
    from selgate.kernels.triton.bwd import triton_backward

    with pytest.raises(ValueError, match=r"k: S_kv=2147483658 > 2\^31 - 1"):
        triton_backward(q, k, v, None, None, None, ranges, scale=0.25)


def test_triton_normalize_refuses_s_kv_past_its_sort_key():
    pytest.importorskip("triton")
    from selgate.kernels.triton.normalize import normalize_ranges_triton

    ranges = torch.zeros(1, 1, 1, 1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"S_kv: 1073741825 > 2\^30"):
        normalize_ranges_triton(ranges, 2**30 + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_key_offsets_past_int32_with_int32_ranges(backend):
    """Two packed sequences, the second starting at key 2^31, with int32 local ranges: the
    shifted ranges wrapped in int32 and the second sequence came back all zeros."""
    T_k0 = 2**31
    k0, v0, k, v = constant_kv(T_k0 + 20)
    q = torch.randn(1, 2, 1, 2, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ranges = torch.tensor([[0, 64], [4, 20]], dtype=torch.int32, device=DEVICE)[None, :, None, None]
    cu_q = torch.tensor([0, 1, 2], device=DEVICE)
    cu_k = torch.tensor([0, T_k0, T_k0 + 20], device=DEVICE)
    glob, pos = varlen_to_batched(ranges, cu_q, cu_k)
    assert glob.dtype == torch.int64 and glob[0, 1, 0, 0].tolist() == [T_k0 + 4, T_k0 + 20]
    assert pos.tolist() == [[T_k0 - 1, T_k0 + 19]]
    with capability_override("9.0"):
        o, lse = selection_attention_varlen(q, k, v, ranges, cu_q, cu_k, backend=backend, strict=True, return_lse=True)
    for s, L in ((0, 64), (1, 16)):
        ref_o, ref_lse = expected(q[:, s : s + 1], k0, v0, L)
        assert (o[:, s : s + 1].double() - ref_o).abs().max() <= 1e-5
        assert (lse[:, s : s + 1].double() - ref_lse).abs().max() <= 1e-5


def test_varlen_int32_ranges_stay_int32_below_2_31():
    ranges = torch.tensor([[[[[0, 3]]]]], dtype=torch.int32)
    glob, _ = varlen_to_batched(ranges, torch.tensor([0, 1]), torch.tensor([0, 5]))
    assert glob.dtype == torch.int32 and glob.tolist() == [[[[[0, 3]]]]]


# --- positions whose t + 1 overflows ---------------------------------------------------


@pytest.mark.parametrize("validate", ["0", "1"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_positions_whose_t_plus_1_overflows_are_refused(backend, validate, monkeypatch):
    """t = 2^63 - 1 made t + 1 wrap to -2^63 and every row silently empty, in every backend;
    SELGATE_VALIDATE_RANGES=1 blamed the ranges."""
    monkeypatch.setenv("SELGATE_VALIDATE_RANGES", validate)
    q, k, v, r = (t.to(DEVICE) for t in random_inputs(B=1, S=2, G=1, h=2, Dk=16, Dv=16, S_kv=30, n=2, dtype=torch.float32))
    pos = torch.tensor([[5, INT64_MAX]], device=DEVICE)
    with pytest.raises(ValueError, match=r"positions: max 9223372036854775807 = 2\^63 - 1 overflows t \+ 1"):
        call(backend, q, k, v, normalize_ranges(r, 30), positions=pos)


@needs_gpu
def test_int64_positions_still_capture_in_a_cuda_graph(monkeypatch):
    """The positions check reads the device back; under CUDA-graph capture it is skipped (the
    eager warm-up call checks), so a decode loop with int64 positions still captures."""
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    q, k, v, r = (t.cuda() for t in random_inputs(B=2, S=1, G=2, h=2, Dk=64, Dv=64, S_kv=300, n=4, dtype=torch.float32))
    pos = torch.full((2, 1), 299, device="cuda")
    selection_attention(q, k, v, r, positions=pos)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = selection_attention(q, k, v, r, positions=pos)
    pos.fill_(150)
    graph.replay()
    torch.cuda.synchronize()
    assert (o.double() - selection_attention_ref(q, k, v, r, positions=pos)).abs().max() <= 1e-5


def test_largest_positions_that_fit_still_work():
    """t = 2^63 - 2 (int64) and 2^31 - 1 (int32) are far past S_kv: every key is visible."""
    q, k, v, r = random_inputs(B=1, S=2, G=1, h=2, Dk=16, Dv=16, S_kv=30, n=2, dtype=torch.float32)
    want = selection_attention_ref(q, k, v, r, positions=torch.tensor([[29, 29]]))
    for pos in (torch.tensor([[INT64_MAX - 1] * 2]), torch.tensor([[2**31 - 1] * 2], dtype=torch.int32)):
        assert torch.equal(selection_attention_ref(q, k, v, r, positions=pos), want)


# --- no range slot, no key -------------------------------------------------------------


@pytest.mark.parametrize("shape", [dict(n=0), dict(S_kv=0)], ids=["n=0", "S_kv=0"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_slot_or_no_key_gives_the_contracts_empty_rows(backend, shape):
    """SPEC.md's L == 0: o = 0 exactly, lse = -inf, zero gradients (the reference raised
    IndexError where the kernels returned this)."""
    kw = dict(B=1, S=2, G=2, h=2, Dk=16, Dv=16, S_kv=20, n=2, dtype=torch.float32) | shape
    q, k, v, r = (t.to(DEVICE).requires_grad_(t.is_floating_point()) for t in random_inputs(**kw))
    o, lse = call(backend, q, k, v, r, return_lse=True)
    assert o.shape == (1, 2, 2, 2, 16) and bool((o == 0).all()) and bool((lse == float("-inf")).all())
    (o.sum() + lse.exp().sum()).backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and bool((t.grad == 0).all())


@pytest.mark.parametrize("shape", [dict(n=0), dict(S_kv=0)], ids=["n=0", "S_kv=0"])
def test_reference_formulations_agree_on_no_slot_or_no_key(shape):
    q, k, v, r = random_inputs(**(dict(S_kv=20, n=2) | shape))
    for form in ("gather", "mask"):
        o, lse = selection_attention_ref(q, k, v, r, formulation=form, return_lse=True)
        assert o.dtype == torch.float64 and bool((o == 0).all()) and bool((lse == float("-inf")).all())


# --- non-finite rows -------------------------------------------------------------------


def nonfinite_case(kind):
    """Rows that select keys [0, 20): a NaN in one head's q, an infinite selected key, or every
    score -inf; the other rows and heads stay finite."""
    q, k, v, r = random_inputs(B=1, S=2, G=1, h=2, Dk=16, Dv=16, S_kv=20, n=2, dtype=torch.float32, seed=3)
    r[:] = torch.tensor([0, 20])
    bad = torch.zeros(1, 2, 1, 2, dtype=torch.bool)
    if kind == "nan_q":
        q[0, 1, 0, 0, 3] = float("nan")
        bad[0, 1, 0, 0] = True
    elif kind == "inf_key":
        k[0, 0, 5] = 0.0
        k[0, 0, 5, 0] = float("inf")
        q[..., 0] = q[..., 0].abs() + 0.5  # q . k5 = +inf in every head
        bad[:] = True
    else:  # every selected score of head 1 is -inf
        k[0, 0, :, 0] = float("-inf")
        q[0, :, 0, 1, 0] = 1.0
        q[0, :, 0, 0, 0] = 0.0  # 0 * -inf = NaN: head 0 is NaN too
        bad[:] = True
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), r.to(DEVICE), bad.to(DEVICE)


# non-finite inputs are the point here: numpy, under Triton's interpreter, warns on each
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("kind", ["nan_q", "inf_key", "all_minus_inf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_non_finite_row_has_nan_lse_in_every_backend(backend, kind):
    """The reference's decision (golden.py): lse = NaN where the row's top score is not
    finite. It gave -inf (the empty-row value) for a NaN q, +inf for an infinite key, where
    Triton gave -inf."""
    q, k, v, r, bad = nonfinite_case(kind)
    o, lse = call(backend, q, k, v, r, return_lse=True)
    assert bool(lse[bad].isnan().all()), lse
    assert bool(o[bad].isnan().any(-1).all())
    if (~bad).any():
        ref_o, ref_lse = selection_attention_ref(q, k, v, r, return_lse=True)
        assert (lse[~bad].double() - ref_lse[~bad]).abs().max() <= 1e-5
        assert (o[~bad].double() - ref_o[~bad]).abs().max() <= 1e-5


def test_reference_formulations_agree_on_non_finite_rows():
    for kind in ("nan_q", "inf_key", "all_minus_inf"):
        q, k, v, r, bad = nonfinite_case(kind)
        lses = [
            selection_attention_ref(q.double(), k.double(), v.double(), r, formulation=f, return_lse=True)[1]
            for f in ("gather", "mask")
        ]
        assert torch.equal(lses[0].isnan(), bad) and torch.equal(lses[1].isnan(), bad)


def test_a_minus_inf_score_beside_finite_ones_is_a_zero_weight():
    q, k, v, r, _ = (t.cpu() for t in nonfinite_case("nan_q"))
    q = q.nan_to_num().abs().double()
    k = k.double()
    k[0, 0, 7] = -1.0
    k[0, 0, 7, 0] = float("-inf")
    o, lse = selection_attention_ref(q, k, v.double(), r, return_lse=True)
    keep = torch.arange(20) != 7
    want_o, want_lse = selection_attention_ref(
        q, k[:, :, keep], v.double()[:, :, keep], torch.tensor([0, 19]).expand_as(r), return_lse=True
    )
    assert torch.allclose(o, want_o) and torch.allclose(lse, want_lse)


# --- malformed arguments ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["q", "k", "v", "ranges", "positions"])
def test_meta_tensors_are_refused_by_name(name):
    q, k, v, r = random_inputs(B=1, S=2, G=1, h=2, Dk=16, Dv=16, S_kv=20, n=2, dtype=torch.float32)
    args = dict(q=q, k=k, v=v, ranges=r, positions=torch.tensor([[18, 19]]))
    args[name] = args[name].to("meta")
    pos = args.pop("positions")
    with pytest.raises(ValueError, match=rf"^{name}: a meta tensor \(.*\) holds no data; expected a CPU or CUDA"):
        selection_attention(*args.values(), positions=pos)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("bad", [[0, 2, 3], "meta"], ids=["list", "meta"])
def test_cu_seqlens_must_be_tensors(which, bad):
    q, k, v, r = random_inputs(B=1, S=3, G=1, h=2, Dk=16, Dv=16, S_kv=5, n=2, dtype=torch.float32)
    cu = dict(cu_seqlens_q=torch.tensor([0, 2, 3]), cu_seqlens_k=torch.tensor([0, 3, 5]))
    cu[which] = cu[which].to("meta") if bad == "meta" else bad
    got = "a meta tensor \\(3,\\)" if bad == "meta" else "list"
    with pytest.raises(TypeError, match=rf"^{which}: expected a 1-D int32/int64 torch.Tensor of offsets, got {got}$"):
        selection_attention_varlen(q, k, v, r, cu["cu_seqlens_q"], cu["cu_seqlens_k"])


# --- malformed settings ----------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize(
    "var, value",
    [
        ("SELGATE_TRITON_FWD_CONFIG", "garbage"),
        ("SELGATE_TRITON_FWD_CONFIG", "BLOCK_X=3"),
        ("SELGATE_TRITON_TMA", "maybe"),
        ("SELGATE_TRITON_RANGE_LEN", "long"),
    ],
)
def test_a_named_backend_raises_on_malformed_settings_and_auto_records_why(var, value, monkeypatch):
    """backend='triton' fell back to sdpa with one warning line; now it raises naming the
    variable. 'auto' may still fall back, with reason 'config' in stats()."""
    from selgate.kernels.triton import tuning

    monkeypatch.setenv(var, value)
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    monkeypatch.setattr(tuning, "_state", None)  # settings are read once per state
    q, k, v, r = (t.to(DEVICE) for t in random_inputs(B=1, S=2, G=1, h=2, Dk=16, Dv=16, S_kv=20, n=2, dtype=torch.float32))
    with capability_override("9.0"), pytest.raises(ConfigError, match=rf"^{var}"):
        selection_attention(q, k, v, r, backend="triton")
    assert stats()["calls"] == {}
    with capability_override("9.0"):
        o = selection_attention(q, k, v, r)
    assert stats()["calls"] == {"sdpa": 1} and stats()["fallback_reasons"] == {"triton:config": 1}
    assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5
