"""Family policy: the dispatcher's ADR and fallback rules, proven by its counters. selgate's
own dispatcher, so never claimed by a kernel under `selgate check`.

ADR-0001: on SM 8.9 the Triton selection kernel never launches unless
SELGATE_TRITON_FORCE=1. Every rung that leaves Triton records its reason, and whatever
backend serves the call gives the golden result (a fallback has the fast path's semantics).
Capabilities are simulated with `capability_override`; on CPU Triton runs in its interpreter.
"""

import pytest
import torch

from selgate.kernels.policy import ENV_FLAGS
from selgate.reference import selection_attention_ref

from ..cases import Case, Shape, make_inputs
from ..compare import assert_close
from ..family import Family
from ..registry import REGISTRY

CASE = Case(
    shape=Shape(mode="prefill", B=1, S=4, S_kv=40, G=2, h=2, Dk=16, Dv=16, n=3),
    pattern="builder",
    dtype=torch.float32,
    seed=0,
    size="tiny",
)
TRITON_SKIP = REGISTRY["triton"].unavailable() and f"triton unavailable: {REGISTRY['triton'].unavailable()}"

# (capability, env, backend that must serve the call, fallback reason that must be counted)
SCENARIOS = {
    "sm89-adr-keeps-triton-off": ("8.9", {}, "sdpa", "triton:adr_policy"),
    "sm89-forced-runs-triton": ("8.9", {"SELGATE_TRITON_FORCE": "1"}, "triton", None),
    "sm89-force-beats-disabled-flag": ("8.9", {"SELGATE_TRITON_FORCE": "1", "SELGATE_TRITON_ENABLE": "0"}, "triton", None),
    "sm90-runs-triton": ("9.0", {}, "triton", None),
    "sm80-runs-triton": ("8.0", {}, "triton", None),
    "sm75-below-min-capability": ("7.5", {}, "sdpa", "triton:capability"),
    "sm90-min-L": ("9.0", {"SELGATE_TRITON_MIN_L": "100000"}, "sdpa", "triton:min_L"),
    "sm90-disabled-flag": ("9.0", {"SELGATE_TRITON_ENABLE": "0"}, "sdpa", "triton:disabled"),
    "sm90-force-parity": ("9.0", {"SELGATE_FORCE_PARITY": "1"}, "reference", None),
}


@pytest.fixture
def dispatcher(monkeypatch):
    """The dispatcher with its flags cleared (min-L 0 unless a scenario sets it) and counters reset."""
    for flag in ENV_FLAGS:
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "0")
    import selgate.kernels as kernels

    kernels.reset_stats()
    return kernels


def _inputs():
    return make_inputs(CASE, "cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(TRITON_SKIP is not None, reason=str(TRITON_SKIP))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_policy(dispatcher, monkeypatch, scenario):
    cap, env, served_by, reason = SCENARIOS[scenario]
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    inp = _inputs()
    with dispatcher.capability_override(cap):
        o, lse = dispatcher.selection_attention(inp.q, inp.k, inp.v, inp.ranges, return_lse=True)
    st = dispatcher.stats()
    assert st["calls"] == {served_by: 1}, f"{scenario}: expected one call on {served_by}, counters {st}"
    launched = st["launches"].get("triton_fwd", 0)
    assert launched == (served_by == "triton"), f"{scenario}: triton_fwd launches {launched}, counters {st}"
    if reason is not None:
        assert st["fallback_reasons"].get(reason) == 1, f"{scenario}: reason {reason} not counted once: {st}"
    if served_by != "reference":  # SELGATE_FORCE_PARITY returns before the capability rung
        assert st["capability"] == cap and st["capability_source"] == "override", st
    o_ref, lse_ref = selection_attention_ref(inp.q, inp.k, inp.v, inp.ranges, return_lse=True)
    assert_close("o", o, o_ref, precision=CASE.dtype, case_id=f"policy {scenario}")
    assert_close("lse", lse, lse_ref, precision=CASE.dtype, case_id=f"policy {scenario}")


@pytest.mark.skipif(TRITON_SKIP is not None, reason=str(TRITON_SKIP))
def test_policy_strict_triton_on_sm89_refuses(dispatcher):
    """Asking for Triton by name on SM 8.9, strict and unforced, is an error, not a quiet fallback."""
    from selgate.errors import StrictModeError

    inp = _inputs()
    with dispatcher.capability_override("8.9"), pytest.raises(StrictModeError, match="adr_policy"):
        dispatcher.selection_attention(inp.q, inp.k, inp.v, inp.ranges, backend="triton", strict=True)
    assert dispatcher.stats()["launches"].get("triton_fwd", 0) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU rule: a CUDA device takes the capability rungs")
def test_policy_cpu_without_override_uses_sdpa(dispatcher, monkeypatch):
    """On a CPU without a simulated capability, auto serves sdpa and says why ("cpu")."""
    inp = _inputs()
    o = dispatcher.selection_attention(inp.q, inp.k, inp.v, inp.ranges)
    st = dispatcher.stats()
    assert st["calls"] == {"sdpa": 1} and st["fallback_reasons"].get("triton:cpu") == 1, st
    assert_close("o", o, selection_attention_ref(inp.q, inp.k, inp.v, inp.ranges), precision=CASE.dtype, case_id="policy cpu")


FAMILY = Family(
    "policy",
    "the dispatcher's ADR and fallback rules (selgate's own dispatcher)",
    rank=12,
    claimed=False,
    tests=(dispatcher, test_policy, test_policy_strict_triton_on_sm89_refuses, test_policy_cpu_without_override_uses_sdpa),
)
