"""The eager call path's host work: the policy resolved once per flag set and re-read only
when a flag's text changes or `reload_settings()` is called, ranges the caller declares
normal skip the normalising launch, and the CUDA decode kernel never serves a call that
needs gradients. GPU tests: no host synchronisation on the call path, and one launch."""

from __future__ import annotations

import pytest
import torch

from selgate.kernels import policy, reload_settings, reset_stats, selection_attention, stats
from selgate.kernels import config as config_mod
from selgate.reference import RangeError, normalize_ranges, selection_attention_ref
from tests.helpers import clean_dispatcher, random_inputs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("clean_dispatcher")
ON_GPU = torch.cuda.is_available()


def test_policy_is_resolved_once_per_flag_set(monkeypatch):
    calls = []
    real = policy._resolve
    monkeypatch.setattr(policy, "_resolve", lambda name: calls.append(name) or real(name))
    reload_settings()
    first = policy.dispatch_policy()
    assert all(policy.dispatch_policy() is first for _ in range(50)) and len(calls) == 1
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "77")  # a flag's new text is seen on the next call
    assert policy.dispatch_policy().min_L == 77 and len(calls) == 2
    monkeypatch.delenv("SELGATE_TRITON_MIN_L")
    assert policy.dispatch_policy() == first and len(calls) == 2  # the earlier flag set, still cached


def test_config_files_are_read_again_only_on_reload(monkeypatch, tmp_path):
    base = (config_mod.CONFIG_DIR / "base.yaml").read_text()
    assert "sel_triton_min_L: 64" in base
    (tmp_path / "base.yaml").write_text(base.replace("sel_triton_min_L: 64", "sel_triton_min_L: 5"))
    reload_settings()
    before = policy.dispatch_policy("cpu").min_L
    monkeypatch.setattr(config_mod, "CONFIG_DIR", tmp_path)
    assert policy.dispatch_policy("cpu").min_L == before  # cached: no file read per call
    reload_settings()
    assert policy.dispatch_policy("cpu").min_L == 5
    monkeypatch.undo()
    reload_settings()


def test_a_malformed_flag_is_still_an_error_on_every_call(monkeypatch):
    monkeypatch.setenv("SELGATE_STRICT", "maybe")
    for _ in range(2):
        with pytest.raises(Exception, match="SELGATE_STRICT"):
            policy.dispatch_policy()


def test_declared_normal_ranges_give_the_same_output_and_skip_counting():
    q, k, v, raw = random_inputs(S=1, dtype=torch.float32, seed=3)
    norm = normalize_ranges(raw, k.shape[2])
    ref = selection_attention_ref(q, k, v, norm)
    a = selection_attention(q, k, v, raw)
    tokens = stats()["selected_tokens"]
    assert tokens > 0
    b = selection_attention(q, k, v, norm, normalized=True)
    assert torch.equal(a, b) and (b.double() - ref).abs().max() <= 1e-5
    assert stats()["selected_tokens"] == tokens and stats()["calls"] == {"sdpa": 2}


def test_a_false_declaration_is_caught_by_range_validation(monkeypatch):
    q, k, v, raw = random_inputs(S=1, dtype=torch.float32, seed=3)
    overlapping = torch.tensor([[0, 10], [5, 12]]).expand(*raw.shape[:3], 2, 2)
    monkeypatch.setenv("SELGATE_VALIDATE_RANGES", "1")
    with pytest.raises(RangeError, match="overlaps"):
        selection_attention(q, k, v, overlapping, normalized=True)


def test_the_cuda_kernel_never_serves_a_call_that_needs_gradients():
    """It has no backward: such a call goes down the ladder (reason 'grad') and its output
    carries gradients, instead of coming back detached."""
    q, k, v, r = random_inputs(S=1, Dk=8, Dv=8, dtype=torch.float32, requires_grad=True)
    o = selection_attention(q, k, v, r, backend="cuda")
    assert o.requires_grad and stats()["fallback_reasons"].get("cuda:grad") == 1
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def decode_inputs(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    B, G, h, D, S_kv, n, blk = 2, 4, 4, 64, 2048, 8, 32
    q = torch.randn(B, 1, G, h, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, G, S_kv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, G, S_kv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    start = torch.arange(n, device="cuda") * (S_kv // n)
    ranges = torch.stack((start, start + blk), -1).expand(B, 1, G, n, 2).contiguous()
    return q, k, v, ranges


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["auto", "triton", "cuda"])
@pytest.mark.parametrize("normalized", [False, True])
def test_a_decode_call_never_synchronises(backend, normalized):
    q, k, v, r = decode_inputs(0)
    strict = backend != "auto"  # a named kernel must serve, not a fallback
    selection_attention(q, k, v, r, backend=backend, normalized=normalized, strict=strict)  # warm: builds, compiles, tunes
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            o = selection_attention(q, k, v, r, backend=backend, normalized=normalized, strict=strict)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 0.05


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("normalized", [True, False])
def test_a_decode_call_on_the_triton_kernel_is_one_launch(normalized):
    """Declared normal, or not: the forward kernel then makes the ranges disjoint itself and
    counts the call's tokens, as the normalising launch would have."""
    q, k, v, r = decode_inputs(1)
    r = torch.cat((r, r[..., :2, :] + 5), dim=3) if not normalized else r  # overlaps, out of order
    reset_stats()  # before the warm call, which also allocates the device counter (a fill kernel)
    selection_attention(q, k, v, r, backend="triton", normalized=normalized, strict=True)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        o = selection_attention(q, k, v, r, backend="triton", normalized=normalized, strict=True)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1, kernels
    norm = normalize_ranges(r, k.shape[2])
    if not normalized:  # both calls counted
        assert stats()["selected_tokens"] == 2 * int((norm[..., 1] - norm[..., 0]).sum())
    assert (o.double() - selection_attention_ref(q, k, v, norm)).abs().max() <= 0.05


def test_an_accepted_signature_still_refuses_what_differs():
    """check_inputs remembers accepted (shape, dtype, device) signatures; scale, positions and
    any input that differs in one of those are still checked on every call."""
    from selgate.reference import check_inputs

    q, k, v, r = random_inputs(dtype=torch.float32)
    d = check_inputs(q, k, v, r)
    assert check_inputs(q, k, v, r) is d  # the second call is the lookup
    with pytest.raises(ValueError, match="scale"):
        check_inputs(q, k, v, r, scale=float("nan"))
    with pytest.raises(ValueError, match="positions"):
        check_inputs(q, k, v, r, positions=torch.zeros(d.B, d.S + 1, dtype=torch.int64))
    with pytest.raises(TypeError, match="k: dtype"):
        check_inputs(q, k.double(), v, r)
    with pytest.raises(TypeError, match="ranges"):
        check_inputs(q, k, v, r.float())
    with pytest.raises(TypeError, match="v: expected a torch.Tensor"):
        check_inputs(q, k, v.numpy(), r)


def test_the_hosts_tile_arithmetic_is_tritons():
    """pow2_at_least and ceil_div replace triton.next_power_of_2 and triton.cdiv on the launch
    path (each of those is a constexpr-function call costing microseconds); same values."""
    triton = pytest.importorskip("triton")
    from selgate.kernels.triton.tiles import ceil_div, pow2_at_least

    for x in range(1, 2050):
        for lo in (1, 2, 16):
            assert pow2_at_least(x, lo) == max(lo, triton.next_power_of_2(x))
        for b in (1, 3, 32, 256):
            assert ceil_div(x, b) == triton.cdiv(x, b)
