"""The threshold optimiser, the profile it writes, and the dispatcher reading that profile."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml

from selgate.bench import tables, thresholds
from selgate.bench.__main__ import main
from selgate.kernels import config, policy, reload_settings

DEVICE = "NVIDIA H100 80GB HBM3"


def row(L, method, ms, *, kind="decode", tag="a"):
    return {
        "config": f"{kind} L={L} {tag}",
        "kind": kind,
        "L": L,
        "L_max": L,
        "method": method,
        "status": "ok",
        "ms": ms,
        "ours": True,
    }


def sweep(speedups, **kw):
    """sdpa at 1 ms and triton at 1/speedup ms for each L."""
    return [r for L, s in speedups.items() for r in (row(L, "sdpa", 1.0, **kw), row(L, "triton", 1.0 / s, **kw))]


def test_smallest_L_from_which_triton_wins_by_1_2x():
    d = thresholds.derive(sweep({16: 0.8, 32: 1.05, 64: 1.3, 128: 2.0, 256: 3.0}))
    assert d.min_L == 64 and d.losses == []
    assert [(L, n) for L, n, _ in d.per_L] == [(16, 1), (32, 1), (64, 1), (128, 1), (256, 1)]


def test_winning_from_the_smallest_measured_L_turns_the_rung_off():
    d = thresholds.derive(sweep({16: 1.3, 32: 2.0, 64: 3.0}))
    assert d.min_L == 0 and d.losses == []
    assert "threshold 0" in d.markdown()


def test_every_config_of_an_L_must_qualify():
    rows = sweep({16: 0.8, 64: 1.3, 128: 2.0}) + sweep({64: 1.15}, tag="b")
    assert thresholds.derive(rows).min_L == 128


def test_a_dip_above_moves_the_threshold_and_losses_below_are_reported():
    d = thresholds.derive(sweep({16: 0.8, 32: 1.3, 64: 1.1, 128: 2.0}))
    assert d.min_L == 128
    assert d.losses == ["decode L=32 a: triton 1.30x faster"]
    assert "No L avoids every loss" in d.markdown()


def test_triton_never_1_2x_faster_keeps_packed_sdpa():
    d = thresholds.derive(sweep({16: 0.9, 32: 1.1, 64: 1.15}))
    assert d.min_L == thresholds.NEVER
    assert "never" in d.markdown()


def test_a_miss_within_the_noise_does_not_move_the_threshold():
    """The H100 sweep of 2026-11-23 (b19a12d) measured one L=32 row at 0.98x: triton 1.23 ms
    with a 0.83-1.82 ms interval (host 1.11 ms/call against ~0.17 ms for its neighbours).
    A miss whose interval reaches the bar is noise; one that misses at both ends is not."""
    rows = sweep({16: 3.0, 32: 3.0, 64: 3.0})
    rows[2:4] = [
        {**row(32, "sdpa", 1.21), "ms_lo": 1.17, "ms_hi": 1.25, "iters": 15},
        {**row(32, "triton", 1.23), "ms_lo": 0.83, "ms_hi": 1.82, "iters": 15},
    ]
    d = thresholds.derive(rows)
    assert d.min_L == 0 and "within the noise of the bar" in d.note.lower() and "best case 1.51x" in d.note
    rows[3]["iters"] = 3  # cut to 3 samples: the interval is their whole range, medians decide
    assert thresholds.derive(rows).min_L == 64
    rows[3].update(iters=15, ms_lo=1.20, ms_hi=1.26)  # a tight interval: a real miss
    assert thresholds.derive(rows).min_L == 64


def test_launch_parameters_per_kind_and_bucket():
    rows = []
    for L, fast, slow in ((16, "triton@32x4x2", "triton@64x4x3"), (1000, "triton@64x4x3", "triton@32x4x2")):
        rows += [row(L, fast, 1.0), row(L, slow, 3.0 if L == 1000 else 1.5)]
    d = thresholds.derive(rows)
    assert d.launch_by_bucket["decode"] == {
        16: {"block_l": 32, "num_warps": 4, "num_stages": 2},
        1024: {"block_l": 64, "num_warps": 4, "num_stages": 3},
    }
    assert d.launch["decode"] == {"block_l": 64, "num_warps": 4, "num_stages": 3}  # geomean: 1.5x vs 3x slowdown


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    """A private configs/ folder (the real base.yaml, an existing profile with a key to keep)."""
    (tmp_path / "profiles").mkdir()
    shutil.copy(config.CONFIG_DIR / "base.yaml", tmp_path / "base.yaml")
    (tmp_path / "profiles" / "nvidia-h100-80gb-hbm3.yaml").write_text("policy:\n  triton_sel_min_capability: '9.0'\n")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path)
    monkeypatch.delenv("SELGATE_TRITON_MIN_L", raising=False)
    reload_settings()
    yield tmp_path
    reload_settings()


def test_profile_is_written_and_read_back_by_the_dispatcher(config_dir):
    d = thresholds.derive(sweep({16: 0.8, 64: 1.5}) + [row(64, "triton@32x4x2", 0.5)])
    path = thresholds.write_profile(d, DEVICE, source="sweep.csv")
    assert path == config_dir / "profiles" / "nvidia-h100-80gb-hbm3.yaml"
    cfg = config.load_config(DEVICE)
    assert cfg["_profile"]["device"] == str(path) and cfg["_profile"]["served_by"] == "device"
    assert cfg["runtime"]["sel_triton_min_L"] == 64
    assert cfg["runtime"]["sdpa_budget_mb"] == 1024  # base keys survive the merge
    assert cfg["policy"]["triton_sel_min_capability"] == "9.0"  # the profile's other keys are kept
    assert cfg["triton_fwd"]["decode"] == {"block_l": 32, "num_warps": 4, "num_stages": 2}
    assert cfg["triton_fwd"]["prefill"] == config.load_config("cpu")["triton_fwd"]["prefill"]  # not measured: base
    assert policy.dispatch_policy(DEVICE).min_L == 64
    assert policy.dispatch_policy("cpu").min_L == config.load_config("cpu")["runtime"]["sel_triton_min_L"]


def test_a_tma_kind_keeps_its_launch_parameters(config_dir):
    """Variants time the gather path; the TMA path's parameters were measured on TMA."""
    tma = {"block_l": 64, "num_warps": 2, "num_stages": 3, "tma": True, "tail_l": 32}
    (config_dir / "profiles" / "nvidia-h100-80gb-hbm3.yaml").write_text(yaml.safe_dump({"triton_fwd": {"prefill": tma}}))
    rows = [r for kind in ("decode", "prefill") for r in sweep({16: 2.0}, kind=kind) + [row(16, "triton@32x4x2", 0.5, kind=kind)]]
    thresholds.write_profile(thresholds.derive(rows), DEVICE, source="sweep.csv")
    fwd = config.load_config(DEVICE)["triton_fwd"]
    assert fwd["prefill"] == tma
    assert fwd["decode"] == {"block_l": 32, "num_warps": 4, "num_stages": 2}
    assert set(fwd["by_L_bucket"]) == {"decode"}


def test_env_still_overrides_the_measured_profile(config_dir, monkeypatch):
    thresholds.write_profile(thresholds.derive(sweep({16: 2.0})), DEVICE, source="sweep.csv")
    monkeypatch.setenv("SELGATE_TRITON_MIN_L", "512")
    assert policy.dispatch_policy(DEVICE).min_L == 512


def test_thresholds_command(config_dir, tmp_path, capsys):
    rows = [{**r, "software": "torch 2.11.0 triton 3.6.0"} for r in sweep({16: 0.9, 32: 1.4})]
    csv_path = tables.write_csv(rows, tmp_path / "run" / "sweep.csv")
    assert main(["thresholds", str(csv_path), "--device", DEVICE]) == 0
    assert "sel_triton_min_L = 32" in capsys.readouterr().out
    assert config.load_config(DEVICE)["runtime"]["sel_triton_min_L"] == 32
    assert config.load_config(DEVICE)["measured"]["software"] == "torch 2.11.0 triton 3.6.0"
    assert "sel_triton_min_L = 32" in (tmp_path / "run" / "sweep.thresholds.md").read_text()
    no_triton = tables.write_csv([row(16, "sdpa", 1.0)], tmp_path / "run" / "sdpa_only.csv")
    with pytest.raises(SystemExit, match="no configuration with both"):
        main(["thresholds", str(no_triton), "--device", DEVICE])


# The KV-outer forward against the pairs kernel at the 64k-preset's shape, ms (H100, 2026-12-08):
# h -> T -> (KV-outer, pairs)
HEADS_MS = {
    1: {8192: (2.92, 1.54), 16384: (3.06, 3.34), 65536: (7.47, 14.60)},
    2: {8192: (3.60, 1.60), 16384: (3.59, 3.42), 65536: (12.02, 14.93)},
    4: {8192: (3.77, 1.60), 16384: (4.85, 3.43), 65536: (17.12, 14.96)},
}


def heads_rows(table=HEADS_MS, **shape):
    base = dict(kind="prefill", status="ok", B=1, G=4, D=128, Dv=128, L=1024, dist="", kv_layout="separate", dtype="bfloat16")
    return [
        {**base, **shape, "config": f"T={T} h={h} {shape}", "method": m, "h": h, "S": T, "S_kv": T, "ms": ms, "device": DEVICE}
        for h, by_T in table.items()
        for T, times in by_T.items()
        for m, ms in zip(("triton_kv_outer", "triton_pairs"), times)
    ]


def test_the_kv_outer_bars_are_the_sizes_from_which_it_won_at_every_larger_one():
    from selgate.bench import kv_outer_bars

    bars = kv_outer_bars.derive(heads_rows())
    assert (bars.max_heads, bars.min_tokens) == (2, {1: 16384, 2: 65536})
    assert "| 4 | 65536 |" in bars.markdown() and "| 17.120 | 14.960 | pairs |" in bars.markdown()
    # a loss between two wins: the bar is above it; a second configuration losing at its largest size: no route at that h
    dip = {1: {8192: (1.0, 2.0), 16384: (3.0, 2.0), 65536: (7.0, 14.0)}}
    assert kv_outer_bars.derive(heads_rows(dip)).min_tokens == {1: 65536}
    lost = heads_rows(dip) + heads_rows({1: {65536: (15.0, 14.0)}}, D=64)
    assert kv_outer_bars.derive(lost).max_heads == 0
    # h measured at 2 and 4 only: h = 1 and 3 take the bar of the next measured h above
    gaps = {2: HEADS_MS[1], 4: HEADS_MS[2]}
    assert kv_outer_bars.derive(heads_rows(gaps)).min_tokens == {1: 16384, 2: 16384, 3: 65536, 4: 65536}


def test_the_kv_outer_bars_are_written_into_the_device_profile_and_route_calls(config_dir, tmp_path, capsys):
    from selgate.kernels.triton import fwd, tuning

    csv = tables.write_csv(heads_rows(), tmp_path / "prefill_heads.csv")
    assert main(["kv-outer", str(csv), "--dry-run"]) == 0
    assert "kv_outer_max_heads = 2, kv_outer_min_tokens: h = 1: 16384, h = 2: 65536" in capsys.readouterr().out
    assert "kv_outer" not in (config_dir / "profiles" / "nvidia-h100-80gb-hbm3.yaml").read_text()
    assert main(["kv-outer", str(csv)]) == 0
    prefill = config.load_config(DEVICE)["triton_fwd"]["prefill"]
    assert (prefill["kv_outer_max_heads"], prefill["kv_outer_min_tokens"]) == (2, {1: 16384, 2: 65536})
    assert config.load_config(DEVICE)["policy"]["triton_sel_min_capability"] == "9.0"  # the profile's other keys are kept
    heads, bars = tuning.kv_outer_route("prefill", prefill)
    cfg = {"KV_OUTER_MAX_HEADS": heads, "KV_OUTER_MIN_TOKENS": bars}
    shapes = [(S, h) for S in (8192, 16384) for h in (1, 2)]
    routed = {(S, h): fwd.kv_outer_routes(torch.empty(1, S, 1, h, 8, device="meta"), h, S, cfg) for S, h in shapes}
    assert routed == {(8192, 1): False, (16384, 1): True, (8192, 2): False, (16384, 2): False}
    none = tables.write_csv([r for r in heads_rows() if r["method"] == "triton_pairs"], tmp_path / "pairs.csv")
    with pytest.raises(SystemExit, match="no prefill configuration with both `triton_pairs` and `triton_kv_outer`"):
        main(["kv-outer", str(none)])
