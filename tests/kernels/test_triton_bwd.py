"""The Triton backward (dq, dk, dv) against fp64 reference gradients (SPEC.md tolerances).

On CPU the kernels run under TRITON_INTERPRET=1 on tiny shapes; bf16 runs on GPU only
(the interpreter computes bf16 dots wrongly, triton-lang/triton#11584). Outputs are NaN-poisoned
before each call, and NaN keys outside the selection must not leak into any gradient."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from selgate.kernels.triton.autograd import selection_attention_triton_autograd  # noqa: E402
from selgate.kernels.triton.bwd import triton_backward  # noqa: E402
from selgate.kernels.triton.fwd import tma_supported  # noqa: E402
from selgate.reference import (  # noqa: E402
    build_ranges,
    normalize_ranges,
    resolve_scale,
    selected_keys,
    selection_attention_ref,
)
from selgate.reference.golden import gather_attention  # noqa: E402
from tests.helpers import random_inputs  # noqa: E402

DTYPES = [
    torch.float32,
    torch.float16,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(DEVICE == "cpu", reason="bf16 is wrong under TRITON_INTERPRET (triton-lang/triton#11584)"),
    ),
]


def heavy_reuse_ranges(B, S, G, S_kv, l_sel, n, seed):
    """Builder ranges: every row selects block 0 and its 2 local blocks, the rest by score."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(B, S, G, -(-S_kv // l_sel), generator=g, dtype=torch.float64)
    return build_ranges(scores, G=G, l_sel=l_sel, n=n, S_kv=S_kv)


def make_case(name, dtype, seed=0):
    """Inputs of one named case: (q, k, v, raw ranges, positions)."""
    if name == "overlap_empty":
        q, k, v, r = random_inputs(B=2, S=5, G=2, h=3, Dk=8, Dv=16, S_kv=40, n=4, seed=seed)
        r[0, 2, 0] = torch.tensor([[0, 10], [5, 20], [18, 25], [0, 0]])  # overlapping input ranges
        r[1, 3] = 0  # an empty row in every group
        pos = None
    elif name == "heavy_reuse":
        q, k, v, _ = random_inputs(B=1, S=48, G=2, h=2, Dk=16, Dv=16, S_kv=48, n=1, seed=seed)
        r, pos = heavy_reuse_ranges(1, 48, 2, 48, l_sel=8, n=4, seed=seed), None
    elif name == "h1_dk8":
        q, k, v, r = random_inputs(B=1, S=4, G=3, h=1, Dk=8, Dv=8, S_kv=33, n=3, seed=seed)
        pos = None
    elif name == "long_ranges":  # 3 ranges of 1..40 keys a row (some merged), cut by the rows' positions
        q, k, v, _ = random_inputs(B=2, S=3, G=2, h=3, Dk=24, Dv=40, S_kv=70, n=3, seed=seed)
        g = torch.Generator().manual_seed(seed)
        start = torch.arange(3) * 23 + torch.randint(0, 4, (2, 3, 2, 3), generator=g)
        r = torch.stack([start, start + torch.randint(1, 41, start.shape, generator=g)], -1)
        pos = torch.tensor([[69, 40, 25], [33, 69, 50]])
    elif name == "decode_positions":
        q, k, v, r = random_inputs(B=3, S=1, G=2, h=4, Dk=24, Dv=40, S_kv=50, n=3, seed=seed)  # padded head dims
        pos = torch.tensor([[49], [17], [3]])
    else:
        raise ValueError(name)
    q, k, v = (t.to(dtype).to(DEVICE) for t in (q, k, v))
    return q, k, v, r.to(DEVICE), None if pos is None else pos.to(DEVICE)


def reference_grads(q, k, v, r, pos, do, w, dtype):
    """Gradients of `sum(o * do) + sum(lse * w)` (lse of empty rows left out) in `dtype`
    (fp64: the golden result; a low precision: the plain-PyTorch baseline)."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    sc = resolve_scale(None, q.shape[-1])
    if dtype == torch.float64:
        o, lse = selection_attention_ref(q, k, v, r, positions=pos, return_lse=True)
    else:
        o, lse = gather_attention(q, k, v, normalize_ranges(r, k.shape[2], pos), scale=sc, dtype=dtype)
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    loss = (o * do.to(dtype)).sum() + (lse * w.to(dtype)).sum()
    return [g.double() for g in torch.autograd.grad(loss, (q, k, v))], o.detach(), lse.detach()


def poisoned_like(*ts):
    return tuple(torch.full_like(t, float("nan")) for t in ts)


def assert_within_spec(got, ref, base, dtype, what):
    err = (got.double() - ref).abs()
    assert not torch.isnan(got).any(), f"{what}: NaN where the reference is finite"
    if dtype == torch.float32:
        assert err.max() <= 1e-5 and err.mean() <= 1e-6, f"{what}: max {err.max():.3g} mean {err.mean():.3g}"
    else:
        bound = 3 * (base - ref).abs().max() + 2 * torch.finfo(dtype).eps * ref.abs().max()
        assert err.max() <= bound and err.mean() <= 1e-3, (
            f"{what}: max {err.max():.3g} > {bound:.3g} or mean {err.mean():.3g} > 1e-3"
        )


def assert_backward_matches_reference(case, dtype, config):
    """Every gradient within SPEC.md tolerances of the fp64 reference; the kernels see
    NaN-poisoned outputs and NaN in every key no row of the group selects."""
    q, k, v, r, pos = make_case(case, dtype)
    g = torch.Generator().manual_seed(1)
    do = torch.randn(*q.shape[:4], v.shape[-1], generator=g).to(DEVICE, dtype).double()  # as the kernel sees them
    w = torch.randn(*q.shape[:4], generator=g).to(DEVICE).double()
    ref, o, lse = reference_grads(q, k, v, r, pos, do, w, torch.float64)
    base = ref if dtype == torch.float32 else reference_grads(q, k, v, r, pos, do, w, dtype)[0]
    norm = normalize_ranges(r, k.shape[2], pos)
    unused = ~selected_keys(norm, k.shape[2], pos)[..., None]
    k_nan, v_nan = (t.masked_fill(unused, float("nan")) for t in (k, v))
    got = triton_backward(
        q,
        k_nan,
        v_nan,
        o.to(dtype),
        lse.float(),
        do.to(dtype),
        norm,
        scale=resolve_scale(None, q.shape[-1]),
        positions=pos,
        dlse=w.float(),
        out=poisoned_like(q, k, v),
        config=config,
    )
    for name, a, b, c in zip(("dq", "dk", "dv"), got, ref, base):
        assert a.dtype == dtype
        assert_within_spec(a, b, c, dtype, f"{case} {dtype} {name}")
    return norm


@pytest.mark.parametrize("dq_path", ["gather", "tma", "kv_outer"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["overlap_empty", "heavy_reuse", "h1_dk8", "decode_positions"])
def test_backward_matches_fp64_reference(case, dtype, dq_path):
    # small tiles and chunks: several KV tiles, and tiles split into partials, even at tiny
    # sizes; dq through the gather path (SM < 9.0, unaligned K/V), through descriptors, and
    # from the dk/dv kernel's pairs (summed per row)
    fused = 16 if dq_path == "kv_outer" else 0
    assert_backward_matches_reference(
        case, dtype, dict(block_n=16, chunk=5, dq_tma=dq_path == "tma", dq_kv_outer_max_heads=fused)
    )


def test_dq_shares_over_the_partials_budget_take_the_dq_kernel(monkeypatch):
    """dq from the pairs asked for, but its shares would pass the budget: the dq kernel runs
    (spied), after the index, and the gradients still meet the reference."""
    from selgate.kernels.triton import bwd, inverse_index

    monkeypatch.setattr(inverse_index, "PARTIALS_BUDGET", 64)
    ran = []
    real = bwd._dq
    monkeypatch.setattr(bwd, "_dq", lambda *a: ran.append(1) or real(*a))
    assert_backward_matches_reference("overlap_empty", torch.float32, dict(block_n=16, chunk=5, dq_kv_outer_max_heads=16))
    assert ran == [1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dq_through_tensor_descriptors(dtype):
    """dq_tma: each range's whole 16-key tiles through tensor descriptors (padded head dims
    read as zeros), its remainder in masked 16-key gathers; most ranges have both."""
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need SM >= 9.0")
    assert tma_supported(*make_case("long_ranges", dtype)[1:3]), "the gather path would run instead"
    norm = assert_backward_matches_reference(
        "long_ranges", dtype, dict(block_n=16, chunk=5, dq_block_n=16, dq_tail_n=16, dq_tma=True)
    )
    length = norm[..., 1] - norm[..., 0]
    assert bool(((length > 16) & (length % 16 > 0)).any()) and bool(((length > 0) & (length < 16)).any())


@pytest.mark.parametrize("fused", [0, 2], ids=["dq-kernel", "dq-from-pairs"])
def test_nan_keys_outside_the_selection_never_leak_and_unselected_keys_get_zero(fused):
    q, k, v, r = random_inputs(B=1, S=6, G=2, h=2, Dk=16, Dv=8, S_kv=45, n=2, hi=30, seed=4)
    r[0, 2, 1] = 0  # an empty row
    q, k, v, r = (t.to(DEVICE) for t in (q.float(), k.float(), v.float(), r))
    norm = normalize_ranges(r, 45)
    o, lse = selection_attention_ref(q, k, v, norm, return_lse=True)
    do = torch.randn_like(o).float()
    sc = resolve_scale(None, 16)
    used = selected_keys(norm, 45)
    assert bool((~used).any()) and bool(used.any())

    def run(k, v):
        return triton_backward(
            q,
            k,
            v,
            o.float(),
            lse.float(),
            do,
            norm,
            scale=sc,
            out=poisoned_like(q, k, v),
            config=dict(block_n=16, chunk=3, dq_kv_outer_max_heads=fused),
        )

    clean = run(k, v)
    kp, vp = k.clone(), v.clone()
    kp[~used] = float("nan")
    vp[~used] = float("nan")
    poisoned = run(kp, vp)
    for a, b in zip(clean, poisoned):
        assert torch.equal(a, b)
    for grad in clean[1:]:
        assert torch.equal(grad[~used], torch.zeros_like(grad[~used]))
        assert bool((grad[used].abs().sum(-1) > 0).all())
    assert torch.equal(clean[0][0, 2, 1], torch.zeros_like(clean[0][0, 2, 1]))
    assert torch.equal(run(k, v)[1], clean[1]), "a second run must be bitwise equal"


@pytest.mark.parametrize("fused", [0, 2], ids=["dq-kernel", "dq-from-pairs"])
@pytest.mark.parametrize("dtype", [torch.float16])
def test_repeated_runs_are_bitwise_equal(dtype, fused):
    q, k, v, r, pos = make_case("heavy_reuse", dtype, seed=2)
    norm = normalize_ranges(r, k.shape[2])
    o, lse = selection_attention_ref(q, k, v, norm, return_lse=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(0)).to(DEVICE, dtype)
    runs = [
        triton_backward(
            q, k, v, o.to(dtype), lse.float(), do, norm, scale=0.25, config=dict(block_n=16, chunk=4, dq_kv_outer_max_heads=fused)
        )
        for _ in range(2)
    ]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("autocast", [False, True])
def test_autograd_function_end_to_end(autocast):
    """Forward kernel + backward kernels through autograd; under autocast fp32 leaves
    compute in fp16 and receive fp32 gradients (fp16: the Triton interpreter computes bf16 wrongly)."""
    q, k, v, r, pos = make_case("overlap_empty", torch.float32, seed=3)
    norm = normalize_ranges(r, k.shape[2])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast(DEVICE, dtype=torch.float16, enabled=autocast):
        o, lse = selection_attention_triton_autograd(*leaves, norm, scale=resolve_scale(None, q.shape[-1]))
    assert o.dtype == (torch.float16 if autocast else torch.float32)
    lse_f = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    ((o.float() * do).sum() + lse_f.sum()).backward()
    low = torch.float16 if autocast else torch.float32
    ref, _, _ = reference_grads(*(t.to(low) for t in (q, k, v)), r, pos, do, torch.ones_like(lse_f), torch.float64)
    base = ref if not autocast else reference_grads(*(t.to(low) for t in (q, k, v)), r, pos, do, torch.ones_like(lse_f), low)[0]
    for name, leaf, b, c in zip(("dq", "dk", "dv"), leaves, ref, base):
        assert leaf.grad.dtype == torch.float32
        assert_within_spec(leaf.grad, b, c, low, f"autograd autocast={autocast} {name}")


@pytest.mark.skipif(DEVICE != "cuda", reason="streams: CUDA only")
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refusal comes before any capture
def test_side_stream_follows_the_callers_stream():
    """On a non-default caller stream, dk/dv beside dq (`overlap`) or after it give the same
    bits, readable on the caller's stream without a device-wide sync; under CUDA graph capture
    the backward refuses clearly (its index reads two sizes on the host)."""
    q, k, v, r, pos = make_case("heavy_reuse", torch.float16)
    norm = normalize_ranges(r, k.shape[2], pos)
    o, lse = selection_attention_ref(q, k, v, norm, positions=pos, return_lse=True)
    do = torch.randn_like(o)
    args = (q, k, v, o.half(), lse.float(), do.half(), norm)
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(caller):
        got = [triton_backward(*args, scale=0.25, positions=pos, config=dict(overlap=ov)) for ov in (True, False)]
        sums = [torch.stack([t.float().sum() for t in g]) for g in got]  # queued on the caller's stream
    torch.cuda.current_stream().wait_stream(caller)
    for a, b in zip(*got):
        assert torch.equal(a, b)
    assert torch.equal(sums[0], sums[1]) and torch.isfinite(sums[0]).all()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graph capture"):
        with torch.cuda.graph(graph):
            triton_backward(*args, scale=0.25, positions=pos)


def test_bad_inputs_name_the_argument():
    q, k, v, r = (t.to(DEVICE) for t in random_inputs(B=1, S=2, G=1, h=2, Dk=8, Dv=8, S_kv=9, n=2, dtype=torch.float32))
    norm = normalize_ranges(r, 9)
    o, lse = torch.zeros(1, 2, 1, 2, 8, device=DEVICE), torch.zeros(1, 2, 1, 2, device=DEVICE)
    with pytest.raises(TypeError, match="lse: expected dtype torch.float32"):
        triton_backward(q, k, v, o, lse.half(), o, norm, scale=1.0)
    with pytest.raises(ValueError, match=r"do: expected shape \(1, 2, 1, 2, 8\)"):
        triton_backward(q, k, v, o, lse, o[..., :4], norm, scale=1.0)
    q2, k2, v2, _ = (t.to(DEVICE) for t in random_inputs(B=1, S=2, G=1, h=2, Dk=12, Dv=8, S_kv=9, n=2, dtype=torch.float32))
    with pytest.raises(ValueError, match="Dk=12"):
        triton_backward(q2, k2, v2, o, lse, o, norm, scale=1.0)
    with pytest.raises(ValueError, match=r"out\[1\]: expected shape"):
        triton_backward(q, k, v, o, lse, o, norm, scale=1.0, out=(q, q, v))


def test_dispatcher_routes_grad_to_the_triton_backward(monkeypatch):
    from selgate.kernels import selection_attention
    from selgate.errors import StrictModeError

    q, k, v, r, _ = make_case("h1_dk8", torch.float32, seed=6)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    monkeypatch.delenv("SELGATE_TRITON_ALLOW_GRAD", raising=False)  # default: on
    o = selection_attention(*leaves, r, backend="triton", strict=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    (o * do).sum().backward()
    ref, _, _ = reference_grads(
        q, k, v, r, None, do.double(), torch.zeros(q.shape[:4], dtype=torch.float64, device=DEVICE), torch.float64
    )
    for name, leaf, b in zip(("dq", "dk", "dv"), leaves, ref):
        assert_within_spec(leaf.grad, b, b, torch.float32, f"dispatched {name}")
    monkeypatch.setenv("SELGATE_TRITON_ALLOW_GRAD", "0")
    with pytest.raises(StrictModeError, match="grad"):
        selection_attention(*leaves, r, backend="triton", strict=True)


def test_varlen_backward_through_the_dispatcher():
    """Packed sequences (cu_seqlens): per-query positions reach the backward's causal limit."""
    from selgate.kernels import selection_attention_varlen
    from selgate.reference import varlen_to_batched

    q, k, v, r = random_inputs(B=1, S=9, G=2, h=2, Dk=16, Dv=8, S_kv=30, n=3, dtype=torch.float32, seed=9)
    cu_q, cu_k = torch.tensor([0, 4, 9]), torch.tensor([0, 12, 30])
    q, k, v, r, cu_q, cu_k = (t.to(DEVICE) for t in (q, k, v, r, cu_q, cu_k))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = selection_attention_varlen(*leaves, r, cu_q, cu_k, backend="triton", strict=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    (o * do).sum().backward()
    glob, pos = varlen_to_batched(r, cu_q, cu_k)
    ref, _, _ = reference_grads(
        q, k, v, glob, pos, do.double(), torch.zeros(q.shape[:4], dtype=torch.float64, device=DEVICE), torch.float64
    )
    for name, leaf, b in zip(("dq", "dk", "dv"), leaves, ref):
        assert_within_spec(leaf.grad, b, b, torch.float32, f"varlen {name}")
