"""Self-test of the conformance harness: every known-bad implementation is flagged by the
family it names, on every seed, while reference and sdpa pass every family on those seeds.
The family checks run directly (no nested pytest), on CPU, on tiny cases."""

import dataclasses

import pytest
import torch

from selgate.conformance.badimpls import BAD_IMPLS
from selgate.conformance.cases import TINY_DECODE, TINY_PREFILL, TINY_VARLEN, select
from selgate.conformance.compare import ConformanceFailure, assert_close
from selgate.conformance.families import FAMILIES
from selgate.conformance.families.bad_input import BAD_INPUTS
from selgate.conformance.families.bad_input import check as check_bad_input
from selgate.conformance.families.limits import beyond
from selgate.conformance.families.limits import check as check_limits
from selgate.conformance.impl import Xfail, fit, known_bug, skip_reason
from selgate.conformance.registry import REGISTRY, load_user_impl
from selgate.conformance.tolerances import ENV, tolerance
from tests.helpers import running_lane_device

SEEDS = (11, 12, 13)
DEVICE = "cpu"
# patterns most likely to expose a fault come first, so a flagged bug stops the search early
ORDER = (
    "mixed",
    "full",
    "overlapping",
    "beyond_t",
    "builder",
    "heavy_reuse",
    "single",
    "adjacent",
    "many_small",
    "beyond_skv",
    "empty",
    "padding",
)
GOOD_PATTERNS = ("mixed", "full", "overlapping")
# These checks run on the CPU in every lane, so in a GPU lane they are the CPU lane's work again
# on the GPU host's CPU (what they cost there: docs/lanes.md): a GPU lane skips them, but for the
# known-bad kernels that only the CUDA allocator's poisoning catches.
IN_A_GPU_LANE = running_lane_device() == "cuda"
CPU_LANE_ONLY = (
    "a CPU check the CPU lane runs; a GPU lane skips it (its good implementations on the GPU are the "
    "conformance matrix's reference and sdpa entries)"
)


def _cases(impl, family, seed, shapes=None, aimed_at=""):
    """The tiny cases `family` runs `impl` on, fitted to its declarations as the matrix fits them;
    those whose id holds `aimed_at` (the cases made for a bug) first."""
    fitted = [fit(c, impl) for c in select("tiny") if family.applies(c) and (shapes is None or c.shape in shapes)]
    cases = [c for c in fitted if not family.skip(impl, c, DEVICE)]
    cases.sort(key=lambda c: (not (aimed_at and aimed_at in c.id), ORDER.index(c.pattern), c.dtype.itemsize == 2, c.seed))
    return [dataclasses.replace(c, seed=seed) for c in cases]


def _flagged_beyond_limits(impl, seed) -> bool:
    for (limit, _), case in beyond(impl, select("tiny"), DEVICE).items():
        try:
            check_limits(impl, limit, dataclasses.replace(case, seed=seed), DEVICE)
        except ConformanceFailure:
            return True
    return False


def _flagged_bad_input(impl, seed) -> bool:
    case = next(c for c in _cases(impl, FAMILIES["parity"], seed) if c.dtype.itemsize == 4)
    for bad in (b for b in BAD_INPUTS if not b.varlen):
        try:
            check_bad_input(impl, bad, case, DEVICE)
        except ConformanceFailure:
            return True
    return False


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bad", BAD_IMPLS, ids=lambda b: b.impl.name)
def test_known_bad_implementation_is_flagged(bad, seed):
    if bad.device != "cuda" and IN_A_GPU_LANE:
        pytest.skip(CPU_LANE_ONLY)
    if bad.device == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{bad.impl.name} is caught by output poisoning, which needs the CUDA caching allocator")
    if bad.caught_by == "bad_input":
        assert _flagged_bad_input(bad.impl, seed), f"{bad.impl.name} ({bad.bug}) passed every bad input"
        return
    if bad.caught_by == "limits":
        assert _flagged_beyond_limits(bad.impl, seed), f"{bad.impl.name} ({bad.bug}) passed every case beyond its limits"
        return
    family = FAMILIES[bad.caught_by]
    for case in _cases(bad.impl, family, seed, aimed_at=bad.aimed_at):
        try:
            family.check(bad.impl, case, bad.device)
        except ConformanceFailure:
            return
    pytest.fail(f"{bad.impl.name} ({bad.bug}) passed every {family.name} case with seed {seed}")


@pytest.mark.skipif(IN_A_GPU_LANE, reason=CPU_LANE_ONLY)
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "policy"])
@pytest.mark.parametrize("name", ["reference", "sdpa"])
def test_good_implementation_passes(name, family):
    impl = REGISTRY[name]
    if family == "bad_input":
        case = next(c for c in select("tiny") if c.shape == TINY_PREFILL)
        for bad in BAD_INPUTS:
            check_bad_input(
                impl, bad, case if not bad.varlen else next(c for c in select("tiny") if c.shape == TINY_VARLEN), DEVICE
            )
        return
    fam = FAMILIES[family]
    why = fam.skip(impl, None, DEVICE)
    if why:
        pytest.skip(why)
    shapes = {TINY_DECODE, TINY_PREFILL, TINY_VARLEN} if family != "gradcheck" else None
    patterns = ("mixed",) if family == "gradcheck" else GOOD_PATTERNS  # gradcheck is the slow one
    cases = [c for c in _cases(impl, fam, 0, shapes) if c.pattern in patterns and c.dtype != torch.bfloat16]
    ran = 0
    for seed in SEEDS:
        for case in {dataclasses.replace(c, seed=seed) for c in cases}:
            fam.check(impl, case, DEVICE)
            ran += 1
    assert ran, f"no case of {family} ran on {name}"


def user_sdpa(q, k, v, ranges, *, scale=None):
    """A user's implementation as `--impl tests.conformance.test_harness_selftest:user_sdpa` loads it."""
    return REGISTRY["sdpa"].call(q, k, v, ranges, scale=scale, want_lse=True)


user_sdpa.dtypes = ("fp32", torch.float16)
user_sdpa.supports_lse = True
user_sdpa.max_head_dim = 64


def test_user_implementation_declares_capabilities_by_attributes():
    impl = load_user_impl("tests.conformance.test_harness_selftest:user_sdpa")
    assert impl.dtypes == ("fp32", "fp16") and impl.lse and not impl.backward
    assert impl.modes == ("decode", "prefill") and impl.varlen is None
    case = next(c for c in select("tiny") if c.shape == TINY_PREFILL and c.pattern == "mixed")
    FAMILIES["parity"].check(impl, case, DEVICE)
    big = next(c for c in select("tiny") if c.shape.Dk > 64)
    assert "up to 64" in skip_reason(impl, big, DEVICE)
    assert "does not declare backward" in FAMILIES["backward"].skip(impl, case, DEVICE)
    with pytest.raises(ValueError, match="package.module:callable"):
        load_user_impl("no_colon")


def test_tolerance_overrides_layer_over_spec(monkeypatch):
    monkeypatch.setenv(ENV, '{"fp32": {"max_abs": 2.0e-5}, "bf16": {"grad": {"mean_abs": 2.0e-3}, "dk": {"factor": 4}}}')
    assert tolerance(torch.float32, "o").max_abs == 2e-5 and tolerance(torch.float32, "o").mean_abs == 1e-6
    assert tolerance(torch.bfloat16, "dq").mean_abs == 2e-3 and tolerance(torch.bfloat16, "dq").factor == 3
    assert tolerance(torch.bfloat16, "dk").factor == 4 and tolerance(torch.bfloat16, "dk").mean_abs == 2e-3
    assert tolerance(torch.bfloat16, "o").mean_abs == 1e-3 and tolerance(torch.float16, "dk").factor == 3
    monkeypatch.setenv(ENV, "fp32: {max_abs: 1.0e-4, bogus: 1}")
    with pytest.raises(ValueError, match=r"SELGATE_TOL_OVERRIDES: fp32.bogus"):
        tolerance(torch.float32, "o")


def test_failure_message_names_errors_bound_index_and_case():
    ref = torch.zeros(2, 3, dtype=torch.float64)
    got = ref.float().clone()
    got[1, 2] = 1e-3
    with pytest.raises(ConformanceFailure) as e:
        assert_close("dv", got, ref, precision=torch.float32, case_id="some-case-id")
    msg = str(e.value)
    for part in ("[some-case-id]", "dv: max abs err 1.000e-03", "bound 1.000e-05", "mean abs err 1.667e-04", "index (1, 2)"):
        assert part in msg, msg
    got[0, 0] = float("nan")
    with pytest.raises(ConformanceFailure, match=r"non-finite .* index \(0, 0\)"):
        assert_close("dv", got, ref, precision=torch.float32, case_id="c")


def test_known_bug_becomes_strict_xfail():
    impl = dataclasses.replace(REGISTRY["sdpa"], xfails=(Xfail("parity", "decode-*", "bug 1"),))
    decode, prefill = (next(c for c in select("tiny") if c.mode == m) for m in ("decode", "prefill"))
    assert known_bug(impl, "parity", decode) == "bug 1"
    assert known_bug(impl, "parity", prefill) is None and known_bug(impl, "bounds", decode) is None
