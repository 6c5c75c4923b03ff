"""Kept calls (kernels/kept.py): a signature the ladder served replays its decision on fresh
inputs, and anything the signature does not hold still takes the ladder. Proven by what the
ladder's input check sees (it runs only on the ladder) and by the counters; every output is
compared with the fp64 reference on fresh inputs with unselected keys poisoned. On a CPU the
Triton rung needs TRITON_INTERPRET=1 (the capability override simulates a GPU)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from selgate.kernels import capability_override, dispatch, reload_settings, reset_stats, selection_attention, stats
from selgate.kernels.policy import dispatch_policy
from selgate.kernels.stats import device_counter
from selgate.reference import RangeError, normalize_ranges, selection_attention_ref
from tests.helpers import assert_matches_reference, clean_dispatcher, poison_unselected, random_inputs  # noqa: F401 (a fixture)

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
needs_triton = pytest.mark.skipif(
    not (ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"), reason="Triton needs a GPU or TRITON_INTERPRET=1"
)
pytestmark = [pytest.mark.usefixtures("clean_dispatcher"), needs_triton]


@pytest.fixture
def ladder(monkeypatch):
    """How many calls took the ladder (its input check runs there only). The gather launch is
    pinned: the TMA and pair kernels are never kept (`forward_replay`), and the sm90 profiles route
    prefill to them (on an H100 two prefill tests here took the ladder on every call)."""
    seen = []
    real = dispatch.check_inputs
    monkeypatch.setattr(dispatch, "check_inputs", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    monkeypatch.setenv("SELGATE_TRITON_TMA", "0")
    monkeypatch.setenv("SELGATE_TRITON_PAIRS", "0")
    reload_settings()  # the tuning state reads these once
    yield seen
    reload_settings()  # rebuilt on the next call, once monkeypatch has restored the environment


def decode(seed: int, S: int = 1, dtype=torch.float32, **kw):
    """Fresh inputs of one signature, K/V outside the selection poisoned, normal ranges."""
    shape = dict(B=2, S=S, G=2, h=2, Dk=16, Dv=16, S_kv=40, n=3, dtype=dtype, seed=seed) | kw
    q, k, v, r = (t.to(DEVICE) for t in random_inputs(**shape))
    norm = normalize_ranges(r, k.shape[2])
    k, v = poison_unselected(k, v, norm)
    return q, k, v, norm


def assert_reference(o, q, k, v, norm, **kw):
    assert (o.double() - selection_attention_ref(q, k, v, norm, **kw)).abs().max() <= 1e-5


def test_a_served_signature_replays_on_fresh_inputs(ladder):
    with capability_override("9.0"):
        for seed in range(3):
            q, k, v, r = decode(seed)
            o, lse = selection_attention(q, k, v, r, backend="triton", normalized=True, strict=True, return_lse=True)
            assert_reference(o, q, k, v, r)
            assert lse.shape == q.shape[:4] and lse.dtype == torch.float32
    assert len(ladder) == 1  # the first call; the other two replayed its decision
    assert stats()["calls"] == {"triton": 3} and stats()["launches"] == {"triton_fwd": 3}
    reset_stats()
    with capability_override("9.0"):
        selection_attention(q, k, v, r, backend="triton", normalized=True, strict=True, return_lse=True)
    assert len(ladder) == 1 and stats()["capability"] == "9.0" and stats()["capability_source"] == "override"


def test_what_the_signature_does_not_hold_takes_the_ladder(ladder, monkeypatch):
    q, k, v, r = decode(0)
    with capability_override("9.0"):
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        assert len(ladder) == 1
        variants = {
            "another shape": decode(1, S=2),
            "another dtype": decode(1, dtype=torch.float16),
            "another alignment": tuple(torch.cat((x.new_zeros(1), x.flatten()))[1:].view(x.shape) for x in decode(1)),
            "other strides": (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, r),
        }
        for i, (what, (q2, k2, v2, r2)) in enumerate(variants.items(), start=2):
            o = selection_attention(q2, k2, v2, r2, backend="triton", normalized=True)
            assert len(ladder) == i, what
            if q2.dtype == torch.float32:
                assert_reference(o, q2, k2, v2, r2)
        n = len(ladder)
        selection_attention(q, k, v, r, backend="triton", normalized=True, return_lse=True)  # another keyword
        monkeypatch.setenv("SELGATE_STRICT", "1")  # another flag set: another policy
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        assert len(ladder) == n + 2
        monkeypatch.delenv("SELGATE_STRICT")
    with capability_override("8.9"):  # the ADR rule: a kept 9.0 call must not serve under 8.9
        o = selection_attention(q, k, v, r, backend="triton", normalized=True)
    assert stats()["fallback_reasons"] == {"triton:adr_policy": 1} and len(ladder) == n + 3
    assert_reference(o, q, k, v, r)


def test_a_kept_call_serves_only_its_own_keywords(ladder):
    """Each keyword that changes the result is in the signature: the same tensors with another
    scale, with positions, or with ranges no longer declared normal are computed for what they
    ask, not replayed."""
    q, k, v, norm = decode(0, S=2)
    inner = norm[..., :1, :] + torch.tensor([1, 0], device=DEVICE)  # inside the first range
    raw = torch.cat((norm.flip(3), inner, torch.full_like(inner, -3)), dim=3)  # out of order, overlapping, negative
    raw_norm = torch.cat((norm, torch.zeros_like(inner), torch.zeros_like(inner)), dim=3)  # the same slots as raw
    pos = torch.tensor([[30, 35], [20, 39]], device=DEVICE)
    with capability_override("9.0"):
        selection_attention(q, k, v, norm, backend="triton", normalized=True, scale=0.5)
        assert_reference(
            selection_attention(q, k, v, norm, backend="triton", normalized=True, scale=0.25), q, k, v, norm, scale=0.25
        )
        pnorm = normalize_ranges(norm, k.shape[2], pos)
        o = selection_attention(q, k, v, pnorm, backend="triton", normalized=True, scale=0.5, positions=pos)
        assert_reference(o, q, k, v, pnorm, scale=0.5, positions=pos)
        selection_attention(q, k, v, raw_norm, backend="triton", normalized=True)
        for _ in range(2):  # the ladder normalises these first (host ranges), every time
            assert_reference(selection_attention(q, k, v, raw, backend="triton"), q, k, v, norm)
        with pytest.raises(TypeError, match="scale: expected a Python float"):
            selection_attention(q, k, v, norm, backend="triton", normalized=True, scale=np.float32(0.5))
    assert len(ladder) == (6 if ON_GPU else 7)  # device ranges are clipped by the kernel: the second raw call is kept


def test_what_the_ladder_reads_beyond_the_signature_is_never_kept(ladder, monkeypatch, caplog):
    """Routes decided by values (min-L on host ranges), calls that fell back first, range
    validation, debug logging and tensor subclasses all take the ladder on every call."""
    q, k, v, r = decode(0)
    short = r.clone()
    short[..., 1] = torch.minimum(short[..., 1], short[..., 0] + 1)  # one key a range at most
    with capability_override("9.0"):
        if not ON_GPU:  # device ranges are judged by S_kv, host ones by their length
            monkeypatch.setenv("SELGATE_TRITON_MIN_L", "8")
            selection_attention(q, k, v, r, normalized=True)
            selection_attention(q, k, v, short, normalized=True)
            assert stats()["fallback_reasons"] == {"triton:min_L": 1}
            monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
        for _ in range(2):  # the CUDA rung falls back (no CUDA device or inputs on the CPU): not kept
            selection_attention(q, k, v, r, backend="cuda", normalized=True)
        assert sum(n for key, n in stats()["fallback_reasons"].items() if key.startswith("cuda:")) == (0 if ON_GPU else 2)
        subclass = q.as_subclass(type("Sub", (torch.Tensor,), {}))
        for _ in range(2):
            selection_attention(subclass, k, v, r, backend="triton", normalized=True)
        monkeypatch.setenv("SELGATE_DEBUG_LOG", "1")
        with caplog.at_level(logging.INFO, logger="selgate.kernels"):
            for _ in range(2):
                selection_attention(q, k, v, r, backend="triton", normalized=True)
        assert sum(m.startswith("sel.dispatch.plan") for m in caplog.messages) == 2
        monkeypatch.delenv("SELGATE_DEBUG_LOG")
        monkeypatch.setenv("SELGATE_VALIDATE_RANGES", "1")
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        with pytest.raises(RangeError):
            selection_attention(q, k, v, r.flip(3), backend="triton", normalized=True)
    assert len(ladder) == (1 if ON_GPU else 4) + 2 + 2 + 2


def test_functorch_wrappers_take_the_ladder():
    """vmap's batched tensors hold no storage to key: the signature leaves them to the ladder."""
    q, k, v, r = decode(0)
    o = torch.func.vmap(lambda x: selection_attention(x, k, v, r, backend="reference"))(torch.stack((q, q)))
    assert o.shape == (2, *q.shape[:4], v.shape[3])


def test_calls_that_record_autograd_are_never_kept(ladder):
    q, k, v, r = decode(0)
    q.requires_grad_(True)
    with capability_override("9.0"):
        for _ in range(2):
            o = selection_attention(q, k, v, r, backend="triton", normalized=True)
            assert o.requires_grad
        with torch.no_grad():  # the same tensors without autograd recording: kept
            for _ in range(2):
                selection_attention(q, k, v, r, backend="triton", normalized=True)
    assert len(ladder) == 3


def test_int64_positions_are_checked_on_every_kept_call(ladder):
    q, k, v, r = decode(0, S=2)
    pos = torch.tensor([[30, 35], [20, 39]], device=DEVICE)
    r = normalize_ranges(r, k.shape[2], pos)
    with capability_override("9.0"):
        for _ in range(2):
            o = selection_attention(q, k, v, r, backend="triton", normalized=True, positions=pos)
        assert_reference(o, q, k, v, r, positions=pos)
        with pytest.raises(ValueError, match="positions: max .* overflows"):
            selection_attention(q, k, v, r, backend="triton", normalized=True, positions=torch.full_like(pos, 2**63 - 1))
    assert len(ladder) == 1  # the kept call refused it


def test_reload_and_a_cleared_tuning_state_drop_kept_calls(ladder):
    from selgate.kernels.triton import tuning

    q, k, v, r = decode(0)
    with capability_override("9.0"):
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        assert len(dispatch_policy().kept) == 1
        reload_settings()
        assert len(dispatch_policy().kept) == 0
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        tuning.clear_cache()  # the launch plan it replays is gone: the ladder plans again
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        selection_attention(q, k, v, r, backend="triton", normalized=True)
    assert len(ladder) == 3


def test_a_kept_call_that_raises_hands_the_call_back_to_the_ladder(ladder, monkeypatch):
    from selgate.kernels.triton import fwd

    q, k, v, r = decode(0)
    with capability_override("9.0"):
        selection_attention(q, k, v, r, backend="triton", normalized=True)
        real, raised = fwd.record_launch, []

        def once(name):
            if not raised:
                raised.append(name)
                raise RuntimeError("launch failed")
            real(name)

        monkeypatch.setattr(fwd, "record_launch", once)
        q, k, v, r = decode(1)
        o = selection_attention(q, k, v, r, backend="triton", normalized=True)
    assert raised and len(ladder) == 2
    assert_reference(o, q, k, v, r)
    assert stats()["calls"] == {"triton": 2}


def test_reset_stats_zeroes_the_device_sums_in_place():
    """Kept calls and captured CUDA graphs hold the counter tensor: a reset must not orphan it."""
    sums = device_counter(torch.device(DEVICE))
    sums.add_(7)
    reset_stats()
    assert device_counter(torch.device(DEVICE)) is sums and stats()["selected_tokens"] == 0


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["auto", "triton", "cuda"])
@pytest.mark.parametrize("normalized", [False, True])
def test_kept_decode_calls_on_a_gpu_compute_and_count_as_the_ladder(ladder, backend, normalized):
    """Each route a decode step takes on a GPU, replayed on fresh bf16 inputs: the clipping
    forward, the forward on normal ranges, the CUDA kernel after the counting normaliser."""
    tokens = 0
    for seed in range(3):
        q, k, v, norm = decode(seed, dtype=torch.bfloat16, Dk=64, Dv=64, S_kv=700, n=6, B=3, G=4, h=8)
        r = norm if normalized else torch.cat((norm.flip(3), norm[..., :2, :]), dim=3)  # out of order, overlapping
        o, lse = selection_attention(
            q, k, v, r, backend=backend, normalized=normalized, strict=backend != "auto", return_lse=True
        )
        assert_matches_reference(q, k, v, norm, o, lse)
        tokens += int((norm[..., 1] - norm[..., 0]).sum())
    assert len(ladder) == 1
    assert stats()["calls"] == {"cuda" if backend == "cuda" else "triton": 3}
    if not normalized:  # counted on the device by the clipping forward or the normaliser
        assert stats()["selected_tokens"] == tokens
