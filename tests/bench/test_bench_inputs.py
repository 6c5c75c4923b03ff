"""Benchmark inputs and timing statistics (CPU, tiny shapes)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from selgate.bench.baselines import block_indices
from selgate.bench.inputs import decode_problem, make_inputs, prefill_problem, with_kv_layout
from selgate.bench.timing import MIN_SAMPLES, median_interval, rotation_count, time_calls
from selgate.reference import expand_ranges, normalize_ranges, selected_lengths, validate_ranges

CPU = torch.device("cpu")


def lengths(x):
    return selected_lengths(x.ranges)


@pytest.mark.parametrize("dist", ["few", "many", "mixed"])
def test_decode_ranges_are_normalised_nsa_selections(dist):
    p = decode_problem(32, 2, 8, 8, 48, dist, "float32")
    x = make_inputs(p, seed=1, device=CPU)
    validate_ranges(x.ranges, p.S_kv)
    assert torch.equal(normalize_ranges(x.ranges, p.S_kv), x.ranges)
    L = lengths(x)
    assert int(L.max()) == 48 and int(L.min()) >= 1
    assert bool((x.ranges[..., 0, 0] == 0).all())  # block 0 forced
    assert bool((x.ranges[..., 1].amax(-1) == p.S_kv).all())  # the local block ending at t = S_kv - 1
    real = (x.ranges[..., 1] > x.ranges[..., 0]).sum(-1)
    if dist == "few":
        assert int(real.max()) <= 4 and bool((L == 48).all())
    if dist == "many":
        assert int(real.max()) > 4 and bool((L == 48).all())
    if dist == "mixed":
        assert set(L.unique().tolist()) == {24, 48}


def test_decode_inputs_are_fresh_per_seed():
    p = decode_problem(4, 2, 8, 8, 16, "few", "float32")
    a, b = make_inputs(p, seed=0, device=CPU), make_inputs(p, seed=1, device=CPU)
    assert not torch.equal(a.q, b.q) and not torch.equal(a.k, b.k)


def test_prefill_ranges_are_causal_blocks():
    p = prefill_problem(96, 4, 2, 8, 8, 8, 3, "float32")
    x = make_inputs(p, seed=0, device=CPU)
    assert (p.B, p.S, p.G, p.h) == (1, 96, 2, 2) and x.ranges.shape[:4] == (1, 96, 2, 3)
    validate_ranges(x.ranges, p.S_kv)
    L = lengths(x)
    assert int(L.max()) <= 24 and int(L[0, 0].max()) == 1  # query 0 sees key 0 only
    nb = p.S_kv // p.l_sel
    ids = block_indices(x.ranges, p.l_sel, p.n_blocks, p.S_kv)  # absent blocks: nb + 1
    idx, valid = expand_ranges(x.ranges, int(L.max()))
    covered = torch.zeros(*ids.shape[:3], nb + 2, dtype=torch.bool)
    covered.scatter_(-1, torch.where(valid, idx // p.l_sel, nb + 1), True)
    listed = torch.zeros_like(covered).scatter_(-1, ids, True)
    assert torch.equal(covered[..., :nb], listed[..., :nb])


@pytest.mark.parametrize("layout", ["separate", "group", "key"])
def test_kv_layouts_store_the_same_values(layout):
    """Only where K and V sit changes: the values, shapes and the problem's key (when not
    separate) say which layout a row timed; V starts one group's K (or one key row) after K."""
    p = prefill_problem(64, 4, 2, 8, 8, 8, 2, "float32")
    x, y = make_inputs(p, seed=0, device=CPU), make_inputs(replace(p, kv_layout=layout), seed=0, device=CPU)
    assert torch.equal(x.k, y.k) and torch.equal(x.v, y.v) and torch.equal(x.ranges, y.ranges)
    assert y.k.shape == x.k.shape and y.v.shape == x.v.shape
    if layout != "separate":
        v_after_k = {"group": p.S_kv * p.D, "key": p.D}[layout]
        assert y.v.data_ptr() - y.k.data_ptr() == v_after_k * y.k.element_size()
        assert replace(p, kv_layout=layout).key == p.key + f" kv={layout}"


def test_kv_layout_errors_are_named():
    x = make_inputs(prefill_problem(64, 4, 2, 8, 8, 8, 2, "float32"), seed=0, device=CPU)
    with pytest.raises(ValueError, match="layout: expected one of"):
        with_kv_layout(x, "stacked")
    with pytest.raises(ValueError, match=r"k \(1, 2, 64, 8\) and v \(1, 2, 64, 4\) must have one shape"):
        with_kv_layout(replace(x, v=x.v[..., :4]), "key")


def test_bad_problem_arguments_are_named():
    with pytest.raises(ValueError, match="dist: expected one of"):
        decode_problem(4, 2, 8, 8, 16, "some", "float32")
    with pytest.raises(ValueError, match="S_kv: 8 is smaller than L=16"):
        decode_problem(4, 2, 8, 8, 16, "few", "float32", S_kv=8)
    with pytest.raises(ValueError, match="heads: 6 is not a multiple of groups=4"):
        prefill_problem(64, 6, 4, 8, 8, 8, 2, "float32")


def test_median_interval_order_statistics():
    t = median_interval([float(i) for i in range(20, 0, -1)])
    assert (t.median_ms, t.lo_ms, t.hi_ms, t.n) == (10.5, 6.0, 16.0, 20)
    one = median_interval([2.0])
    assert (one.median_ms, one.lo_ms, one.hi_ms) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="at least one"):
        median_interval([])


def test_time_calls_rotates_input_sets():
    seen = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    t = time_calls(calls, CPU, warmup=2, iters=7)
    assert t.n == 7 and seen == [0, 1] + [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("iters, expected", [(15, MIN_SAMPLES), (5, 5)])
def test_the_time_cap_does_not_cut_samples_below_the_regression_rules_minimum(iters, expected):
    """A stalled warm-up once cut a 2 ms row to 9 samples; the cut stops at MIN_SAMPLES (or at
    what the caller asked for, if fewer)."""
    t = time_calls([lambda: time.sleep(0.002)], CPU, warmup=3, iters=iters, max_seconds=0.001)
    assert t.n == expected


def test_rotation_covers_four_l2_sizes():
    assert rotation_count(1 << 20, CPU) == 8
    assert rotation_count(40 << 20, CPU) == 5
    assert rotation_count(1 << 30, CPU) == 2
