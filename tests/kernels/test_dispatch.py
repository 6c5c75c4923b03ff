"""The dispatcher's ladder, policy, strict mode, counters and config precedence.

Routing is proven by the counters: `launches` counts real Triton kernel launches, so
"never launches the kernel" is a measured zero, not an inference. Tests that launch
Triton need a GPU or TRITON_INTERPRET=1 (the capability override then simulates a GPU)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
import sys
import types

import shutil

import pytest
import torch

from selgate.kernels import capability_override, reload_settings, reset_stats, selection_attention, stats
from selgate.kernels import config as config_mod
from selgate.errors import StrictModeError
from selgate.kernels.policy import ENV_FLAGS, dispatch_policy
from selgate.reference import RangeError, normalize_ranges, selected_lengths, selection_attention_ref
from tests.helpers import clean_dispatcher, random_inputs  # noqa: F401 (a fixture)

ON_GPU = torch.cuda.is_available()
CAN_LAUNCH = ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if ON_GPU else "cpu"
needs_triton = pytest.mark.skipif(not CAN_LAUNCH, reason="Triton needs a GPU or TRITON_INTERPRET=1")


pytestmark = pytest.mark.usefixtures("clean_dispatcher")


def launched() -> dict:
    """The dispatch-level launches: `triton_fwd_<kernel>` (which forward kernel the profile
    picked, say the KV-outer one by heads per KV head) is the profile's, not the dispatcher's."""
    return {k: n for k, n in stats()["launches"].items() if not k.startswith("triton_fwd_")}


def inputs(dtype=torch.float32, **kw):
    shape = dict(B=2, S=3, G=2, h=2, Dk=16, Dv=16, S_kv=40, n=3, dtype=dtype, seed=5) | kw
    return tuple(t.to(DEVICE) for t in random_inputs(**shape))


def max_L(ranges, S_kv):
    return int(selected_lengths(normalize_ranges(ranges, S_kv)).max())


# --- CPU routing, no Triton -------------------------------------------------------------


def test_cpu_auto_uses_sdpa_without_importing_triton():
    code = (
        "import sys, torch; from selgate.kernels import selection_attention, stats; from tests.helpers import "
        "random_inputs; selection_attention(*random_inputs(dtype=torch.float32)); "
        "assert stats()['calls'] == {'sdpa': 1}, stats(); assert stats()['fallback_reasons'] == {'triton:cpu': 1}; "
        "assert 'triton' not in sys.modules and 'selgate.kernels.triton' not in sys.modules, 'triton imported'"
    )
    env = {k: v for k, v in os.environ.items() if k not in ENV_FLAGS and k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_explicit_backends_match_reference_and_count(backend):
    q, k, v, r = inputs()
    o, lse = selection_attention(q, k, v, r, backend=backend, return_lse=True)
    ref_o, ref_lse = selection_attention_ref(q, k, v, r, return_lse=True)
    assert o.dtype == v.dtype and lse.dtype == torch.float32
    assert (o.double() - ref_o).abs().max() <= 1e-5
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse.double() - ref_lse)[finite].abs().max() <= 1e-5
    s = stats()
    assert s["calls"] == {backend: 1} and s["launches"] == {}
    norm = normalize_ranges(r, k.shape[2])
    assert s["selected_tokens"] == int(selected_lengths(norm).sum()) > 0
    assert s["kv_bytes_read"] == s["selected_tokens"] * (16 + 16) * 4


def test_force_parity_routes_auto_to_reference(monkeypatch):
    monkeypatch.setenv("SELGATE_FORCE_PARITY", "1")
    selection_attention(*inputs())
    assert stats()["calls"] == {"reference": 1}


def test_unknown_backend_and_bad_flag_are_named(monkeypatch):
    q, k, v, r = inputs()
    with pytest.raises(ValueError, match="backend: expected one of .*'flash'"):
        selection_attention(q, k, v, r, backend="flash")
    monkeypatch.setenv("SELGATE_STRICT", "maybe")
    with pytest.raises(ValueError, match="SELGATE_STRICT: expected one of .*'maybe'"):
        selection_attention(q, k, v, r)


def test_validate_flag_rejects_overlaps_instead_of_normalising(monkeypatch):
    q, k, v, _ = inputs(S=1)
    bad = torch.tensor([[0, 10], [5, 12], [0, 0]], device=DEVICE).expand(2, 1, 2, 3, 2)
    selection_attention(q, k, v, bad)  # default: normalised silently
    monkeypatch.setenv("SELGATE_VALIDATE_RANGES", "1")
    with pytest.raises(RangeError, match=r"ranges\[0, 0, 0, 1\] = \(5, 12\) overlaps"):
        selection_attention(q, k, v, bad)
    good = torch.tensor([[0, 4], [5, 12], [0, 0]], device=DEVICE).expand(2, 1, 2, 3, 2)
    assert torch.isfinite(selection_attention(q, k, v, good)).all()


def test_kernel_error_falls_back_once_logged_and_strict_raises(monkeypatch, caplog):
    """A backend that raises hands over to sdpa with reason 'error', logged once per reason."""
    fake = types.ModuleType("selgate.kernels.cuda.decode")

    def broken(*a, **kw):
        raise RuntimeError("boom")

    fake.run_cuda, fake.CLIP_MAX_RANGES = broken, 64  # device ranges take the clipping call, host ones the normalised
    monkeypatch.setitem(sys.modules, "selgate.kernels.cuda.decode", fake)
    q, k, v, r = inputs(S=1, Dv=12)  # Dv=12 keeps Triton out of the chain: cuda > sdpa
    with caplog.at_level(logging.INFO, logger="selgate.kernels"):
        for _ in range(2):
            o = selection_attention(q, k, v, r, backend="cuda")
    assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5
    s = stats()
    assert s["calls"] == {"sdpa": 2} and s["fallback_reasons"]["cuda:error"] == 2
    lines = [m for m in caplog.messages if m.startswith("sel.cuda.fallback reason=error")]
    assert len(lines) == 1 and "boom" in lines[0]
    with pytest.raises(StrictModeError, match="'cuda' failed .*boom"):
        selection_attention(q, k, v, r, backend="cuda", strict=True)


def test_debug_log_lines(monkeypatch, caplog):
    monkeypatch.setenv("SELGATE_DEBUG_LOG", "1")
    with caplog.at_level(logging.INFO, logger="selgate.kernels"):
        selection_attention(*inputs(), backend="sdpa")
    assert any(m.startswith("sel.sdpa.call rows=12 tokens=") for m in caplog.messages), caplog.messages


@pytest.fixture
def config_dir(monkeypatch, tmp_path):
    """A config folder whose base.yaml is the real one with one line replaced: `edit(old, new)`."""
    (tmp_path / "profiles").mkdir()
    shutil.copytree(config_mod.CONFIG_DIR / "classes", tmp_path / "classes")  # served as the real GPU's class

    def edit(old: str, new: str):
        (tmp_path / "base.yaml").write_text((config_mod.CONFIG_DIR / "base.yaml").read_text().replace(old, new))
        monkeypatch.setattr(config_mod, "CONFIG_DIR", tmp_path)
        reload_settings()
        return tmp_path

    yield edit
    reload_settings()


def test_config_precedence_base_profile_env(monkeypatch, config_dir):
    """base.yaml < configs/profiles/<device>.yaml < env, and each layer is really read."""
    folder = config_dir("sel_triton_min_L: 64", "sel_triton_min_L: 11")
    assert dispatch_policy("cpu").min_L == 11
    (folder / "profiles" / "cpu.yaml").write_text("runtime:\n  sel_triton_min_L: 22\n")
    reload_settings()
    assert dispatch_policy("cpu").min_L == 22
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "33")
    assert dispatch_policy("cpu").min_L == 33


def test_sdpa_budget_from_config_reaches_the_sdpa_and_reference_paths(monkeypatch, config_dir):
    """runtime.sdpa_budget_mb is read: the dispatcher hands it to both torch paths."""
    from selgate.kernels import dispatch

    config_dir("sdpa_budget_mb: 1024", "sdpa_budget_mb: 3")
    seen = []
    for name in ("selection_attention_sdpa", "selection_attention_ref"):
        real = getattr(dispatch, name)
        monkeypatch.setattr(dispatch, name, lambda *a, _real=real, **kw: seen.append(kw["budget_bytes"]) or _real(*a, **kw))
    for backend in ("sdpa", "reference"):
        selection_attention(*inputs(), backend=backend)
    assert seen == [3 << 20, 3 << 20]


# --- the Triton rungs (interpreter on CPU) -----------------------------------------------


@needs_triton
def test_sm89_never_launches_without_force_and_does_with_it(monkeypatch):
    q, k, v, r = inputs()
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    with capability_override("8.9"):
        selection_attention(q, k, v, r)
        s = stats()
        assert s["launches"] == {} and s["calls"] == {"sdpa": 1}
        assert s["fallback_reasons"] == {"triton:adr_policy": 1}
        assert (s["capability"], s["capability_source"]) == ("8.9", "override")
        with pytest.raises(StrictModeError, match="adr_policy"):
            selection_attention(q, k, v, r, backend="triton", strict=True)
        assert stats()["launches"] == {}
        monkeypatch.setenv("SELGATE_TRITON_FORCE", "1")
        o = selection_attention(q, k, v, r)
    assert launched() == {"triton_fwd": 1} and stats()["calls"] == {"sdpa": 1, "triton": 1}
    assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5


@needs_triton
def test_capability_env_override_is_logged(monkeypatch, caplog):
    monkeypatch.setenv("SELGATE_CAPABILITY", "8.9")
    with caplog.at_level(logging.INFO, logger="selgate.kernels"):
        selection_attention(*inputs())
    assert "sel.policy.capability value=8.9 source=override" in caplog.messages
    assert any(m.startswith("sel.triton.fallback reason=adr_policy") for m in caplog.messages)
    assert stats()["launches"] == {}


@needs_triton
def test_min_L_routes_both_ways(monkeypatch):
    """The rung compares the longest selected row with min-L: read exactly from host tensors,
    bounded by S_kv on a device (a read would synchronise the call)."""
    q, k, v, r = inputs()
    L = k.shape[2] if r.is_cuda else max_L(r, k.shape[2])
    with capability_override("9.0"):
        monkeypatch.setenv("SELGATE_TRITON_MIN_L", str(L + 1))
        selection_attention(q, k, v, r)
        assert stats()["launches"] == {} and stats()["fallback_reasons"] == {"triton:min_L": 1}
        monkeypatch.setenv("SELGATE_TRITON_MIN_L", str(L))
        selection_attention(q, k, v, r)
    assert launched() == {"triton_fwd": 1} and stats()["calls"] == {"sdpa": 1, "triton": 1}


@needs_triton
@pytest.mark.parametrize(
    "cap, flags, kw, reason",
    [
        ("9.0", {}, {"Dk": 12}, "head_dim"),
        ("9.0", {}, {"Dv": 264}, "head_dim"),
        ("9.0", {}, {"dtype": torch.float64}, "dtype"),
        ("7.5", {}, {}, "capability"),
        ("9.0", {"SELGATE_TRITON_ENABLE": "0"}, {}, "disabled"),
    ],
)
def test_unsupported_or_disabled_falls_back_with_reason(monkeypatch, cap, flags, kw, reason):
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    for name, val in flags.items():
        monkeypatch.setenv(name, val)
    q, k, v, r = inputs(**kw)
    with capability_override(cap):
        o = selection_attention(q, k, v, r)
        assert stats()["fallback_reasons"] == {f"triton:{reason}": 1} and stats()["launches"] == {}
        assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5
        if reason != "disabled":  # an explicit request skips only the performance rungs
            with pytest.raises(StrictModeError, match=reason):
                selection_attention(q, k, v, r, backend="triton", strict=True)
        else:  # ... of which SELGATE_TRITON_ENABLE is one (README: an explicit backend skips it)
            reset_stats()
            o = selection_attention(q, k, v, r, backend="triton", strict=True)
            assert launched() == {"triton_fwd": 1} and stats()["fallback_reasons"] == {}
            assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5


@needs_triton
def test_grad_goes_to_sdpa_unless_allowed(monkeypatch):
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    monkeypatch.setenv("SELGATE_TRITON_ALLOW_GRAD", "0")
    q, k, v, r = inputs()
    for t in (q, k, v):
        t.requires_grad_(True)
    with capability_override("9.0"):
        o = selection_attention(q, k, v, r)
    o.sum().backward()
    assert stats()["fallback_reasons"] == {"triton:grad": 1} and stats()["launches"] == {}
    assert q.grad is not None and torch.isfinite(q.grad).all()
    monkeypatch.setenv("SELGATE_TRITON_ALLOW_GRAD", "1")
    with capability_override("9.0"):
        o = selection_attention(q, k, v, r)
    assert o.requires_grad and launched() == {"triton_fwd": 1} and stats()["calls"]["triton"] == 1


@pytest.mark.skipif(not ON_GPU, reason="CUDA graph capture needs a GPU")
def test_auto_call_captures_in_a_cuda_graph_and_replays_new_inputs(monkeypatch):
    """With the min-L rung off (the H100 profile's 0) a call never reads the device back, so a
    decode loop can capture it; the replay must compute on whatever the inputs now hold."""
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    q, k, v, r = inputs(torch.float32, S=1, Dk=64, Dv=64, S_kv=300, n=4)
    selection_attention(q, k, v, r)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = selection_attention(q, k, v, r)
    q2, k2, v2, r2 = inputs(torch.float32, S=1, Dk=64, Dv=64, S_kv=300, n=4, seed=9)
    for dst, src in ((q, q2), (k, k2), (v, v2), (r, r2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert (o.double() - selection_attention_ref(q2, k2, v2, r2)).abs().max() <= 1e-5  # SPEC.md fp32 bar
    assert stats()["calls"] == {"triton": 2}


def test_the_sdpa_rung_runs_sdpa_forward_unless_the_lse_is_asked_for(monkeypatch):
    """Without `return_lse` the fallback runs SDPA's forward (2-3.9x faster on a CPU than the
    explicit softmax that the LSE needs); both agree with the reference."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    q, k, v, r = random_inputs(B=1, S=3, S_kv=30, G=2, h=2, dtype=torch.float32, seed=9)
    ref = selection_attention_ref(q, k, v, r)
    o = selection_attention(q, k, v, r, backend="sdpa")
    assert calls and (o.double() - ref).abs().max() <= 1e-5
    calls.clear()
    o, lse = selection_attention(q, k, v, r, backend="sdpa", return_lse=True)
    assert not calls and (o.double() - ref).abs().max() <= 1e-5 and lse.dtype == torch.float32
