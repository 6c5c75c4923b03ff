"""Outside kernels: declarations (validated, from attributes or YAML), cases fitted to them,
the block-index adapters, and block-index kernels through the matrix's families."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from selgate.conformance import adapters
from selgate.conformance.cases import TINY_PREFILL, make_inputs, select
from selgate.conformance.compare import ConformanceFailure
from selgate.conformance.families import FAMILIES
from selgate.conformance.impl import fit, known_bug, skip_reason
from selgate.conformance.registry import load_user_impl, resolve
from selgate.reference import normalize_ranges

OUTSIDE = Path(__file__).parents[1] / "outside"
sys.path.insert(0, str(OUTSIDE))


def _impl(name):
    return load_user_impl(f"blockkernels:{name}")


# --- adapters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_block_indices_and_ranges_round_trip(seed):
    """Random block selections -> ranges -> block ids give the same blocks, the block that
    holds t cut at t + 1 and blocks wholly beyond t dropped, ascending, -1 padded."""
    gen = torch.Generator().manual_seed(seed)
    B, S, G, S_kv, bs, nsel = 2, 7, 3, 45, 8, 4
    nb = -(-S_kv // bs)
    ids = torch.randint(-1, nb, (B, S, G, nsel), generator=gen)
    ranges = adapters.block_indices_to_ranges(ids, bs)
    got, counts = adapters.ranges_to_block_indices(ranges, bs, S_kv)
    t = torch.arange(S) + S_kv - S
    for b in range(B):
        for s in range(S):
            for g in range(G):
                want = sorted({int(i) for i in ids[b, s, g] if i >= 0 and i * bs <= t[s]})
                row = got[b, s, g].tolist()
                assert row[: len(want)] == want and all(x == -1 for x in row[len(want) :])
                assert int(counts[b, s, g]) == len(want)
    assert got.dtype == torch.int32 and counts.dtype == torch.int32


def test_block_counts_cut_the_rows():
    ids = torch.tensor([[[[0, 2, 5]]]])
    r = adapters.block_indices_to_ranges(ids, 4, block_counts=torch.tensor([[[2]]]))
    assert r.tolist() == [[[[[0, 4], [8, 12], [0, 0]]]]]


def test_a_selection_that_is_not_whole_blocks_is_refused_naming_it():
    ranges = torch.tensor([[[[[0, 8], [10, 16]]]]])
    with pytest.raises(
        ValueError,
        match=r"ranges: row \(0, 0, 0\) range 1 is \[10, 16\), not whole blocks of "
        r"block_size=8",
    ):
        adapters.ranges_to_block_indices(ranges, 8, 40)
    with pytest.raises(ValueError, match="block_size: expected an integer >= 1"):
        adapters.ranges_to_block_indices(ranges, 0, 40)


def test_every_block_aligned_case_converts():
    """Each tiny case made for a block size converts to block ids (its ranges are whole
    blocks after normalisation, the block holding t partial)."""
    impl = _impl("fla_style")
    for case in select("tiny"):
        case = fit(case, impl)
        inp = make_inputs(case)
        if case.mode == "varlen":
            adapters._varlen_blocks(inp.ranges, inp.cu_seqlens_q, inp.cu_seqlens_k, case.block_size)
        else:
            adapters.ranges_to_block_indices(inp.ranges, case.block_size, inp.k.shape[2])


# --- declarations -----------------------------------------------------------------------------


def test_cases_fit_the_declared_heads_and_block_size():
    impl = dataclasses.replace(_impl("fla_style"), min_heads=16, heads_power_of_two=True)
    case = next(c for c in select("tiny") if c.shape == TINY_PREFILL)
    fitted = fit(case, impl)
    assert fitted.shape.h == 16 and fitted.block_size == 8 and "-bs8-" in fitted.id
    assert skip_reason(impl, fitted, "cpu") is None
    assert "heads per group a power of two, >= 16; case has 4" in skip_reason(impl, case, "cpu")
    capped = dataclasses.replace(impl, max_heads=8)
    assert fit(case, capped).shape.h == 4 and "<= 8" in skip_reason(capped, case, "cpu")


def declared_with_a_typo(q, k, v, ranges, *, scale=None):
    return q


declared_with_a_typo.supports_backwards = True


def test_an_unknown_attribute_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"unknown declaration 'supports_backwards'"):
        load_user_impl("tests.conformance.test_outside_kernels:declared_with_a_typo")


@pytest.mark.parametrize(
    "text, error",
    [
        ("dtypes: [fp8]", r"dtypes: 'fp8' is not a torch dtype"),
        ("block_sise: 64", r"unknown declaration 'block_sise'"),
        ("min_heads: 0", r"min_heads: expected an integer >= 1, got 0"),
        ("backward: yes please", r"backward: expected true or false"),
        ("xfail: [{family: parity, cases: '*'}]", r"xfail\[0\]: expected exactly the keys"),
        ("xfail: [{family: speed, cases: '*', reason: r}]", r"xfail\[0\].family: 'speed' is not one of"),
        ("[1, 2]", r"expected a mapping of declarations"),
        ("dtypes: [fp16, fp32]\nbackward: true\ndtypes: [fp32]", r"declare.yaml:3: duplicate key 'dtypes' \(first on line 1\)"),
        ("block_size: 1048576", r"block_size: expected an integer from 1 to 128, got 1048576"),
    ],
)
def test_a_bad_declare_file_is_an_error_naming_the_key(tmp_path, text, error):
    path = tmp_path / "declare.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        resolve("blockkernels:fla_style", declare=str(path))


def test_a_declare_file_overrides_attributes_and_declares_strict_xfails(tmp_path):
    path = tmp_path / "declare.yaml"
    path.write_text(
        "dtypes: [fp16]\nbackward: false\nmin_heads: 16\n"
        "xfail:\n  - {family: parity, cases: 'decode-*', reason: 'decode rows off by one'}\n"
    )
    (impl,) = resolve("blockkernels:fla_style", declare=str(path))
    assert impl.dtypes == ("fp16",) and not impl.backward and impl.min_heads == 16
    decode = fit(next(c for c in select("tiny") if c.mode == "decode"), impl)
    assert known_bug(impl, "parity", decode) == "decode rows off by one"
    with pytest.raises(ValueError, match="declares one package.module:callable"):
        resolve("sdpa", declare=str(path))


# --- block-index kernels through the families -------------------------------------------------


def _cases(impl, family, patterns=("mixed", "builder", "full"), most=6):
    """Up to `most` tiny fp32 cases of `family` that `impl` runs, one per shape and pattern."""
    fam = FAMILIES[family]
    out = [
        fit(c, impl)
        for c in select("tiny")
        if fam.applies(c) and c.pattern in patterns and c.seed == 0 and c.dtype == torch.float32 and c.scale is None
    ]
    return [c for c in out if not fam.skip(impl, c, "cpu")][:most]


@pytest.mark.parametrize("name", ["fla_style", "fla_style_full_queries", "nsa_triton_style"])
@pytest.mark.parametrize("family", ["parity", "backward", "bounds", "empty_ranges", "decode", "varlen"])
def test_a_correct_block_index_kernel_passes(name, family):
    impl = _impl(name)
    cases = _cases(impl, family)
    assert cases, f"no {family} case runs on {name}"
    for case in cases:
        FAMILIES[family].check(impl, case, "cpu")


def test_a_causal_mask_wrong_inside_the_last_block_is_caught():
    """Attending to the whole block that holds t (keys past t included) fails parity on every
    case where t sits inside a selected block, and is caught by bounds too."""
    impl = _impl("fla_style_broken_causal")
    caught = {}
    for family in ("parity", "bounds"):
        for case in _cases(impl, family):
            try:
                FAMILIES[family].check(impl, case, "cpu")
            except ConformanceFailure:
                caught[family] = caught.get(family, 0) + 1
    assert caught.get("parity", 0) >= 3 and caught.get("bounds", 0) >= 3, caught


def test_the_block_size_shapes_the_selections():
    """With block_size declared every normalised range starts on a block boundary."""
    impl = _impl("fla_style")
    case = fit(next(c for c in select("tiny") if c.shape == TINY_PREFILL and c.pattern == "many_small"), impl)
    norm = normalize_ranges(make_inputs(case).ranges, TINY_PREFILL.S_kv)
    starts = norm[..., 0][norm[..., 1] > norm[..., 0]]
    assert starts.numel() and bool((starts % 8 == 0).all())


def test_filler_queries_cannot_poison_gradients():
    """A kernel that needs as many queries as keys gets filler rows ahead of the real ones. This
    kernel gives NaN for an empty row, and that NaN reaches every key's dv (shown first), so
    fillers that selected nothing failed backward and decode cases it passes on the real
    queries: fillers select keys a real row selects, and the kernel fails only its own family."""
    impl = _impl("fla_style_nan_empty")
    fn = sys.modules["blockkernels"].padded_nsa_nan_empty
    q, k, v = (
        torch.randn(1, 4, 2, 8, requires_grad=True),
        torch.randn(1, 4, 1, 8, requires_grad=True),
        torch.randn(1, 4, 1, 8, requires_grad=True),
    )
    ids = torch.tensor([[[[-1]], [[0]], [[0]], [[0]]]], dtype=torch.int32)
    counts = (ids[..., 0] >= 0).to(torch.int32)
    o = fn(q, k, v, block_indices=ids, block_counts=counts, block_size=8, scale=1.0)
    o[:, 1:].sum().backward()  # the empty row's output is dropped, its gradient is zero
    assert bool(v.grad.isnan().all()), "the kernel leaks an empty row's NaN into every key's dv"
    ran = 0
    for family in ("backward", "decode"):
        for case in _cases(impl, family, patterns=("full", "builder"), most=8):
            if case.shape.S < case.shape.S_kv:  # fillers present
                FAMILIES[family].check(impl, case, "cpu")
                ran += 1
    assert ran >= 4
    with pytest.raises(ConformanceFailure, match="empty rows"):
        for case in _cases(impl, "empty_ranges", patterns=("mixed", "empty", "padding")):
            FAMILIES["empty_ranges"].check(impl, case, "cpu")
