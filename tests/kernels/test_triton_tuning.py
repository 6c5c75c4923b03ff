"""Launch-parameter selection and tuning of the Triton kernels (kernels/triton/tuning.py):
the host-known L bucket, the persisted tuned file (round trip, other triton version ignored
with a reason), precedence env > tuned > profile by_L_bucket > profile, the launch path
really launching with the chosen BLOCK_L, by_L_bucket derived from a recorded sweep, no
tuning inside a normal call unless asked, and outputs that do not depend on earlier configs
(no kernel accumulates into its output, so none needs reset_to_zero).

Kernel launches run on a GPU or under TRITON_INTERPRET=1 on tiny shapes."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from selgate.bench import tables, thresholds
from selgate.bench.__main__ import main
from selgate.bench.inputs import decode_problem, make_ranges, prefill_problem
from selgate.bench.tune import launch_bucket, range_slots
from selgate.errors import ConfigError
from selgate.kernels import config, reload_settings
from selgate.kernels.triton import tuning
from selgate.kernels.triton import bwd as bwd_mod
from selgate.kernels.triton import fwd as fwd_mod
from selgate.reference import normalize_ranges
from tests.helpers import random_inputs

ON_GPU = torch.cuda.is_available()
CAN_LAUNCH = ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"
launches = pytest.mark.skipif(not CAN_LAUNCH, reason="Triton needs a GPU or TRITON_INTERPRET=1")
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DATA = Path(__file__).parents[1] / "data" / "bench"
ENVS = (
    tuning.ENV_FWD,
    tuning.ENV_BWD,
    tuning.ENV_AUTOTUNE,
    tuning.ENV_TUNED,
    tuning.ENV_TUNED_DIR,
    tuning.ENV_RANGE_LEN,
    "SELGATE_TRITON_MIN_L",
)


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    """A private configs/ folder (the real base.yaml, no profile, no class, no tuned file), no
    tuning env but autotuning off (without a class a GPU would tune on first calls: its own
    test turns it on) and a private first-call cache."""
    (tmp_path / "profiles").mkdir()
    shutil.copy(config.CONFIG_DIR / "base.yaml", tmp_path / "base.yaml")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path)
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(tuning.ENV_AUTOTUNE, "0")
    monkeypatch.setenv(tuning.ENV_CACHE_DIR, str(tmp_path / "cache"))
    reload_settings()
    tuning.clear_cache()
    yield tmp_path
    reload_settings()
    tuning.clear_cache()


def device_name() -> str:
    return config.current_device_name()


def write_profile(folder: Path, text: str) -> None:
    (folder / "profiles" / f"{config.device_slug(device_name())}.yaml").write_text(text)
    reload_settings()


def fwd_entry(kind, D, bucket, dtype, block_l, warps=4, stages=1, Dv=None):
    return {
        "op": "fwd",
        "kind": kind,
        "Dk": D,
        "Dv": Dv or D,
        "L_bucket": bucket,
        "dtype": dtype,
        "config": {"BLOCK_L": block_l, "num_warps": warps, "num_stages": stages},
        "ms": 1.0,
    }


def pick(D=16, Dv=16, dtype=torch.float32, kind="interpreter", S_kv=70, n=4):
    """The launch parameters chosen (tuned keys only; TMA has its own test) and their source."""
    cfg = tuning.fwd_config(D, Dv, dtype.itemsize, kind, dtype=dtype, S_kv=S_kv, n=n)
    return {k: cfg[k] for k in tuning.FWD_KEYS}, tuning.last_choice("fwd")[2]


# ---- pure host logic -------------------------------------------------------------------------


def test_bucket_is_a_power_of_two_of_the_host_known_bound(cfg, monkeypatch):
    assert [tuning.l_bucket(x) for x in (0, 1, 16, 17, 100, 1024, 1025)] == [16, 16, 16, 32, 128, 1024, 2048]
    assert tuning.shape_bucket(S_kv=70, n=4) == 128  # min(70, 4 * 64) = 70
    assert tuning.shape_bucket(S_kv=65536, n=16) == 1024  # NSA decode: 16 blocks of 64 keys
    assert tuning.shape_bucket(S_kv=20, n=16) == 32  # an early step: the context bounds L
    monkeypatch.setenv(tuning.ENV_RANGE_LEN, "32")
    assert tuning.range_len() == 32 and tuning.shape_bucket(S_kv=65536, n=16) == 512
    assert tuning.nearest_bucket([], 64) is None
    assert [tuning.nearest_bucket([32, 128], b) for b in (16, 32, 64, 128, 4096)] == [32, 32, 128, 128, 128]


def test_tuned_file_round_trip_and_merge(cfg):
    path = tuning.tuned_path(device_name())
    assert path == cfg / "tuned" / f"{config.device_slug(device_name())}.json"
    tuning.write_tuned(path, [fwd_entry("decode", 128, 1024, "bfloat16", 64)], device_name=device_name())
    tuning.write_tuned(
        path,
        [
            fwd_entry("decode", 128, 1024, "bfloat16", 32),  # same key: replaced
            fwd_entry("decode", 128, 256, "bfloat16", 16),
        ],
        device_name=device_name(),
    )
    data = json.loads(path.read_text())
    assert data["triton"] == tuning.triton_version() and data["device"] == device_name()
    table, reason = tuning.read_tuned(path, device_name=device_name(), version=tuning.triton_version())
    assert reason is None
    assert table == {
        ("fwd", "decode", 128, 128, "bfloat16"): {
            256: {"BLOCK_L": 16, "num_warps": 4, "num_stages": 1},
            1024: {"BLOCK_L": 32, "num_warps": 4, "num_stages": 1},
        }
    }
    table, reason = tuning.read_tuned(path, device_name=device_name(), version=tuning.triton_version(), rl=32)
    assert table == {} and "range_len 64, running with range_len 32" in reason  # its buckets would mislead
    # A file of another triton version is replaced on write, never merged.
    tuning.write_tuned(path, [fwd_entry("decode", 64, 64, "float16", 16)], device_name=device_name(), version="0.0.1")
    assert [e["Dk"] for e in json.loads(path.read_text())["entries"]] == [64]


def test_other_triton_version_is_ignored_with_a_logged_reason(cfg, caplog):
    path = tuning.tuned_path(device_name())
    tuning.write_tuned(path, [fwd_entry("interpreter", 16, 128, "float32", 32)], device_name=device_name(), version="0.0.1")
    with caplog.at_level(logging.INFO, logger="selgate.kernels"):
        got, source = pick()
    assert source == "configs triton_fwd.interpreter" and got["BLOCK_L"] == 16
    status = tuning.tuning_status()
    assert not status["used"] and "triton 0.0.1" in status["reason"] and tuning.triton_version() in status["reason"]
    assert any("tuned_ignored" in r.getMessage() and "0.0.1" in r.getMessage() for r in caplog.records)
    # The same file for the running version is used.
    tuning.write_tuned(path, [fwd_entry("interpreter", 16, 128, "float32", 32)], device_name=device_name())
    assert pick()[0]["BLOCK_L"] == 32 and tuning.tuning_status()["used"]


def test_file_of_another_device_is_ignored(cfg):
    path = tuning.tuned_path(device_name())
    # Tuned elsewhere, then copied onto this device's file name by hand.
    tuning.write_tuned(path, [fwd_entry("interpreter", 16, 128, "float32", 32)], device_name="Some Other GPU")
    assert pick()[0]["BLOCK_L"] == 16
    assert "Some Other GPU" in tuning.tuning_status()["reason"]


def test_precedence_env_over_tuned_over_by_L_bucket_over_profile(cfg, monkeypatch):
    assert pick() == ({"BLOCK_L": 16, "num_warps": 4, "num_stages": 1}, "configs triton_fwd.interpreter")
    write_profile(cfg, "triton_fwd:\n  by_L_bucket:\n    interpreter:\n      128: {block_l: 64, num_warps: 8, num_stages: 1}\n")
    assert pick() == ({"BLOCK_L": 64, "num_warps": 8, "num_stages": 1}, "configs triton_fwd.by_L_bucket.interpreter.128")
    tuning.write_tuned(
        tuning.tuned_path(device_name()), [fwd_entry("interpreter", 16, 128, "float32", 32, 2, 1)], device_name=device_name()
    )
    got, source = pick()
    assert got == {"BLOCK_L": 32, "num_warps": 2, "num_stages": 1} and source.startswith("tuned")
    assert pick(dtype=torch.float16)[1].startswith("configs")  # another dtype: not tuned
    monkeypatch.setenv(tuning.ENV_FWD, "BLOCK_L=128")
    tuning.clear_cache()  # env is read once per cache
    got, source = pick()
    assert got == {"BLOCK_L": 128, "num_warps": 2, "num_stages": 1} and source.startswith(f"env {tuning.ENV_FWD}")
    monkeypatch.delenv(tuning.ENV_FWD)
    monkeypatch.setenv(tuning.ENV_TUNED, "0")
    tuning.clear_cache()
    assert pick()[1] == "configs triton_fwd.by_L_bucket.interpreter.128"
    monkeypatch.setenv(tuning.ENV_FWD, "BLOCK_L=x")
    tuning.clear_cache()
    with pytest.raises(ValueError, match="SELGATE_TRITON_FWD_CONFIG"):
        pick()


def test_a_kind_run_through_tma_keeps_the_profile_over_tuned_entries(cfg, monkeypatch):
    """Tuned entries time the gather path; a kind the profile runs through tensor descriptors
    keeps the profile's parameters, with its tail tile, and the env flag turns TMA off."""
    write_profile(cfg, "triton_fwd:\n  interpreter: {block_l: 16, num_warps: 4, num_stages: 1, tma: true, tail_l: 8}\n")
    tuning.write_tuned(
        tuning.tuned_path(device_name()), [fwd_entry("interpreter", 16, 128, "float32", 32, 2, 1)], device_name=device_name()
    )
    got = tuning.fwd_config(16, 16, 4, "interpreter", dtype=torch.float32, S_kv=70, n=4)
    assert got == {
        "BLOCK_L": 16,
        "num_warps": 4,
        "num_stages": 1,
        "TMA": True,
        "TAIL_L": 16,  # tail >= MMA minimum
        "PAIRS": False,
        "KV_OUTER_MAX_HEADS": 0,
        "KV_OUTER_MIN_TOKENS": {},
    }
    monkeypatch.setenv(tuning.ENV_TMA, "0")
    tuning.clear_cache()
    got = tuning.fwd_config(16, 16, 4, "interpreter", dtype=torch.float32, S_kv=70, n=4)
    assert got["TMA"] is False and got["BLOCK_L"] == 32  # gather path: the tuned entry applies


def test_the_profile_turns_the_pair_kernel_on_per_kind_and_the_env_flag_overrides_it(cfg, monkeypatch):
    """`pairs: true` (the H100's prefill) sends supported calls to pairs.py; other kinds keep
    fwd.py; SELGATE_TRITON_PAIRS=0|1 overrides the profile, read once per state."""
    write_profile(
        cfg,
        "triton_fwd:\n"
        "  interpreter: {block_l: 16, num_warps: 4, num_stages: 1, tma: true, pairs: true}\n"
        "  decode: {block_l: 16, num_warps: 4, num_stages: 1}\n",
    )
    assert tuning.fwd_config(16, 16, 4, "interpreter", dtype=torch.float32, S_kv=70, n=4)["PAIRS"] is True
    assert tuning.fwd_config(16, 16, 4, "decode", dtype=torch.float32, S_kv=70, n=4)["PAIRS"] is False
    monkeypatch.setenv(tuning.ENV_PAIRS, "0")
    assert tuning.fwd_config(16, 16, 4, "interpreter", dtype=torch.float32, S_kv=70, n=4)["PAIRS"] is True  # cached
    tuning.clear_cache()
    assert tuning.fwd_config(16, 16, 4, "interpreter", dtype=torch.float32, S_kv=70, n=4)["PAIRS"] is False
    monkeypatch.setenv(tuning.ENV_PAIRS, "1")
    tuning.clear_cache()
    assert tuning.fwd_config(16, 16, 4, "decode", dtype=torch.float32, S_kv=70, n=4)["PAIRS"] is True


@launches
def test_the_profile_routes_the_kv_outer_forward_by_heads_and_query_tokens(cfg, monkeypatch):
    """`kv_outer_max_heads` and `kv_outer_min_tokens` ({h: fewest B x S}): a prefill call takes
    the KV-outer forward only at h <= the most heads and from its h's token count (its index costs
    a fixed time a call); SELGATE_TRITON_KV_OUTER forces it at every size."""
    from selgate.kernels import selection_attention, stats

    write_profile(
        cfg,
        "triton_fwd:\n  interpreter: {block_l: 16, num_warps: 4, num_stages: 1, kv_outer_max_heads: 2,"
        " kv_outer_min_tokens: {1: 16, 2: 32}}\n",
    )

    def routed(B, S, h):
        made = random_inputs(B=B, S=S, G=2, h=h, Dk=16, Dv=16, S_kv=40, n=3, dtype=torch.float32, seed=h)
        q, k, v, r = (t.to(DEVICE) for t in made)
        before = stats()["launches"].get("triton_fwd_kv_outer", 0)
        selection_attention(q, k, v, r, backend="triton")
        return stats()["launches"].get("triton_fwd_kv_outer", 0) - before

    got = {shape: routed(*shape) for shape in ((1, 15, 1), (1, 16, 1), (1, 16, 2), (2, 16, 2), (2, 16, 3))}
    assert got == {(1, 15, 1): 0, (1, 16, 1): 1, (1, 16, 2): 0, (2, 16, 2): 1, (2, 16, 3): 0}
    # the named kernel (the conformance matrix's triton-kv-outer, the bench's column) runs at any size
    from selgate.kernels.triton import selection_attention_kernel

    before = stats()["launches"].get("triton_fwd_kv_outer", 0)
    made = random_inputs(B=1, S=9, G=2, h=1, Dk=16, Dv=16, S_kv=40, n=3, dtype=torch.float32, seed=1)
    selection_attention_kernel("kv_outer", *(t.to(DEVICE) for t in made))
    assert stats()["launches"].get("triton_fwd_kv_outer", 0) - before == 1
    monkeypatch.setenv(tuning.ENV_KV_OUTER, "2")
    reload_settings()
    assert routed(1, 9, 2) == 1 and routed(1, 9, 3) == 0


@pytest.mark.parametrize("bars", ["[16384]", "{1: -1}", "{0: 8}", "{1: true}", "{1: 8.5}"])
def test_a_malformed_kv_outer_token_bar_is_refused_naming_the_key(cfg, bars):
    write_profile(cfg, f"triton_fwd:\n  interpreter: {{block_l: 16, num_warps: 4, num_stages: 1, kv_outer_min_tokens: {bars}}}\n")
    with pytest.raises(ConfigError, match=r"triton_fwd\.interpreter\.kv_outer_min_tokens: expected a mapping"):
        tuning.fwd_config(16, 16, 4, "interpreter", dtype=torch.float32, S_kv=70, n=4)


def test_backward_default_takes_dkdv_depth_from_the_profile(cfg):
    """fp16/bf16 dk/dv with head dims <= 128 read block_m and stages from `triton_bwd`; fp32
    and large head dims keep their register-bound tiles whatever the profile says."""
    base = bwd_mod.default_config(128, 128, torch.bfloat16)
    assert (base["block_m"], base["stages"]) == (64, 2)  # configs/base.yaml
    write_profile(cfg, "triton_bwd: {block_m: 32, stages: 7}\n")
    got = bwd_mod.default_config(128, 128, torch.bfloat16)
    assert got == {**base, "block_m": 32, "stages": 7}
    assert bwd_mod.default_config(64, 64, torch.float16)["stages"] == 7
    assert bwd_mod.default_config(192, 192, torch.bfloat16)["stages"] == 2
    assert bwd_mod.default_config(64, 64, torch.float32)["stages"] == 2


def test_backward_precedence(cfg, monkeypatch):
    default = bwd_mod.default_config(16, 16, torch.float32)

    def bwd_pick():
        got = bwd_mod.launch_config(16, 16, torch.float32, S_kv=70, n=4, kind="interpreter")
        return got, tuning.last_choice("bwd")[2]

    assert bwd_pick() == (default, "bwd.default_config")
    entry = {
        "op": "bwd",
        "kind": "interpreter",
        "Dk": 16,
        "Dv": 16,
        "L_bucket": 128,
        "dtype": "float32",
        "config": {**default, "block_n": 16, "chunk": 64},
        "ms": 1.0,
    }
    tuning.write_tuned(tuning.tuned_path(device_name()), [entry], device_name=device_name())
    got, source = bwd_pick()
    assert got == {**default, "block_n": 16, "chunk": 64} and source.startswith("tuned")
    monkeypatch.setenv(tuning.ENV_BWD, "chunk=8")
    tuning.clear_cache()
    assert bwd_pick()[0] == {**default, "block_n": 16, "chunk": 8}
    # Without the shape (old callers) only the defaults apply.
    assert bwd_mod.launch_config(16, 16, torch.float32) == {**default, "chunk": 8}


def test_profile_values_still_fit_the_smem_budget(cfg):
    write_profile(cfg, "triton_fwd:\n  decode: {block_l: 256, num_warps: 4, num_stages: 4}\n")
    got, _ = pick(D=256, Dv=256, dtype=torch.bfloat16, kind="decode")
    assert got["BLOCK_L"] * 512 * 2 * got["num_stages"] <= 160 * 1024


def test_selection_is_cached_per_bucket_not_per_length(cfg):
    for S_kv in range(65, 129):  # decode: S_kv grows by one per step, all in bucket 128
        pick(S_kv=S_kv, n=16)
    keys = [k for k in tuning.current_state().cache if k[0] == "fwd"]
    assert len(keys) == 1 and keys[0][6] == 128


def test_range_slots_match_the_benchmark_inputs():
    gen = torch.Generator().manual_seed(0)
    problems = (
        decode_problem(2, 2, 16, 16, 64, "few", "float32"),
        decode_problem(2, 2, 16, 16, 48, "many", "float32"),
        decode_problem(3, 2, 16, 16, 256, "mixed", "float32"),
        prefill_problem(64, 4, 2, 16, 16, 8, 4, "float32"),
    )
    for p in problems:
        assert range_slots(p) == make_ranges(p, gen, "cpu").shape[3]
        row = {"kind": p.kind, "config": p.key, "L": p.L, "dist": p.dist, "S_kv": p.S_kv}
        assert range_slots(row) == range_slots(p)


def test_by_L_bucket_from_a_recorded_sweep(cfg):
    """tests/data/bench/launch_cpu.csv: a `sel` run with triton@ variants (CPU, interpreter).
    The optimiser buckets rows by the bound the launch path computes, and what it writes is
    what the selection reads back for a shape of that bucket."""
    rows = tables.read_csv(DATA / "launch_cpu.csv")
    d = thresholds.derive(rows)
    expected = {tuning.shape_bucket(r["S_kv"], range_slots(r)) for r in rows}
    assert set(d.launch_by_bucket["decode"]) == expected == {64, 256, 1024}
    assert {launch_bucket(r) for r in rows if r["L"] == 256 and r["dist"] == "few"} == {256}  # 4 ranges of 64
    # Make 16-key tiles win below 256 keys and 32-key tiles above, then write and read back.
    for r in rows:
        if r["method"].startswith("triton@"):
            small = launch_bucket(r) < 256
            r["ms"] = 1.0 if r["method"] == ("triton@16x4x1" if small else "triton@32x4x1") else 2.0
    d = thresholds.derive(rows)
    by = d.launch_by_bucket["decode"]
    assert by[64]["block_l"] == 16 and by[256]["block_l"] == 32 and by[1024]["block_l"] == 32
    thresholds.write_profile(d, device_name(), source="launch_cpu.csv")
    tuning.clear_cache()
    assert pick(kind="decode", S_kv=64, n=16) == (
        {"BLOCK_L": 16, "num_warps": 4, "num_stages": 1},
        "configs triton_fwd.by_L_bucket.decode.64",
    )
    assert pick(kind="decode", S_kv=4096, n=16)[0]["BLOCK_L"] == 32  # bucket 1024
    assert pick(kind="decode", S_kv=2**20, n=64)[1].endswith("by_L_bucket.decode.1024")  # above: the largest


# ---- the launch path --------------------------------------------------------------------------


class Spy:
    """Stands in for the forward kernel: records the launch's keyword arguments, then launches."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append(kw)
            return self.kernel[grid](*args, **kw)

        return launch


def tiny(dtype=torch.float32, S=1, seed=0):
    q, k, v, r = random_inputs(B=2, S=S, G=2, h=2, Dk=16, Dv=16, S_kv=70, n=4, dtype=dtype, seed=seed)
    q, k, v, r = (t.to(DEVICE) for t in (q, k, v, r))
    return q, k, v, normalize_ranges(r, 70)


@launches
def test_a_kept_launch_plan_still_names_its_selection(cfg):
    """A call served from a kept launch plan reports its own selection (`tuning_status`), not
    the one computed last."""
    a = tiny()
    q, k, v, r = random_inputs(B=2, S=1, G=2, h=2, Dk=16, Dv=16, S_kv=70, n=1, dtype=torch.float32, seed=1)
    b = (*(t.to(DEVICE) for t in (q, k, v)), normalize_ranges(r.to(DEVICE), 70))  # n=1: another L bucket
    keys = []
    for inputs in (a, b, a):
        fwd_mod.triton_forward(*inputs, scale=0.25)
        keys.append(tuning.last_choice()[0])
    assert keys[0] != keys[1] and keys[2] == keys[0]


@launches
def test_the_kernel_launches_with_the_tuned_block_l(cfg, monkeypatch):
    kind = tuning.kind_of(DEVICE, 1)
    spy = Spy(fwd_mod._sel_fwd_kernel)
    monkeypatch.setattr(fwd_mod, "_sel_fwd_kernel", spy)
    q, k, v, norm = tiny()
    o_default, _ = fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    tuning.write_tuned(
        tuning.tuned_path(device_name()), [fwd_entry(kind, 16, 128, "float32", 32, 4, 2)], device_name=device_name()
    )
    o_tuned, _ = fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    assert spy.calls[0]["BLOCK_L"] not in (32, 128)
    assert (spy.calls[1]["BLOCK_L"], spy.calls[1]["num_warps"], spy.calls[1]["num_stages"]) == (32, 4, 2)
    write_profile(cfg, f"triton_fwd:\n  by_L_bucket:\n    {kind}:\n      128: {{block_l: 128, num_warps: 4, num_stages: 2}}\n")
    monkeypatch.setenv(tuning.ENV_TUNED, "0")
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    assert spy.calls[2]["BLOCK_L"] == 128  # by_L_bucket, read by the launch path
    torch.testing.assert_close(o_tuned, o_default, rtol=1e-5, atol=1e-5)


@launches
def test_no_tuning_inside_a_call_unless_asked(cfg, monkeypatch):
    calls = []
    real = tuning.tune_fwd
    monkeypatch.setattr(tuning, "tune_fwd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(tuning, "FWD_SPACE", ((16, 4, 1), (32, 4, 1)))
    q, k, v, norm = tiny()
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    assert calls == [] and tuning.last_choice()[2] == f"configs triton_fwd.{tuning.kind_of(DEVICE, 1)}"
    monkeypatch.setenv(tuning.ENV_AUTOTUNE, "1")
    tuning.clear_cache()
    monkeypatch.setattr(tuning, "_capturing", lambda: True)  # CUDA-graph capture: never tune
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    assert calls == []
    monkeypatch.setattr(tuning, "_capturing", lambda: False)
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    assert calls == [1] and tuning.last_choice()[2].startswith("autotuned in this process")
    assert not tuning.tuned_path(device_name()).exists()  # kept in the process, not written


@launches
def test_autotuner_leaves_the_same_output_as_one_clean_launch(cfg):
    """triton.autotune runs every config several times on the same o/lse (pre-filled with
    garbage here); with no reset_to_zero the result must equal one launch of the winner."""
    q, k, v, norm = tiny()
    o = torch.full((*q.shape[:4], 16), 7.0, device=DEVICE)
    lse = torch.full(q.shape[:4], -3.0, device=DEVICE)
    reps = []

    def bench(fn, quantiles=None):
        for _ in range(3):
            fn()
        reps.append(1)
        return [float(len(reps))] * 3  # the first config benchmarked wins

    tuner = tuning.fwd_autotuner(fwd_mod._sel_fwd_kernel, [(32, 4, 1), (16, 4, 1), (16, 8, 2)], bench)
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25, out=(o, lse), _tuner=tuner)
    assert len(reps) == 3 and tuner.reset_to_zero == []
    best = tuning.config_of(tuner.best_config)
    assert best == {"BLOCK_L": 32, "num_warps": 4, "num_stages": 1}
    o2, lse2 = fwd_mod.triton_forward(q, k, v, norm, scale=0.25, config=best)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@launches
def test_outputs_do_not_depend_on_the_config_run_before(cfg):
    """No kernel accumulates into its output: config B after config A on the same buffers equals
    config B on NaN buffers, bitwise."""
    q, k, v, norm = tiny()
    a, b = {"BLOCK_L": 16, "num_warps": 4, "num_stages": 1}, {"BLOCK_L": 32, "num_warps": 4, "num_stages": 1}
    o, lse = fwd_mod.triton_forward(q, k, v, norm, scale=0.25, config=a)
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25, config=b, out=(o, lse))
    nan_o, nan_lse = torch.full_like(o, float("nan")), torch.full_like(lse, float("nan"))
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25, config=b, out=(nan_o, nan_lse))
    assert torch.equal(o, nan_o) and torch.equal(lse, nan_lse)

    # Backward: dk/dv of one config written over another's equal a fresh run, bitwise.
    qb, kb, vb, nb = tiny(S=3, seed=1)
    ob, lseb = fwd_mod.triton_forward(qb, kb, vb, nb, scale=0.25)
    do = torch.randn_like(ob)
    small = {"block_n": 16, "chunk": 3, "dq_block_n": 16}
    first = bwd_mod.triton_backward(qb, kb, vb, ob, lseb, do, nb, scale=0.25, config={"block_n": 32})
    again = bwd_mod.triton_backward(qb, kb, vb, ob, lseb, do, nb, scale=0.25, config=small, out=first)
    fresh = [torch.full_like(t, float("nan")) for t in (qb, kb, vb)]
    bwd_mod.triton_backward(qb, kb, vb, ob, lseb, do, nb, scale=0.25, config=small, out=fresh)
    assert all(torch.equal(x, y) for x, y in zip(again, fresh))


@launches
def test_tune_command_writes_a_file_the_launch_path_reads(cfg, tmp_path, capsys, monkeypatch):
    out = tmp_path / "tuned_out"
    args = [
        "tune",
        "--device",
        DEVICE.type,
        "--decode",
        "--bwd",
        "--N",
        "2",
        "--H",
        "2",
        "--D",
        "16",
        "--dtype",
        "fp32",
        "--decode_buckets",
        "16,128",
        "--fwd_space",
        "16x4x1,32x4x1",
        "--bwd_buckets",
        "64",
        "--T",
        "16",
        "--heads",
        "2",
        "--groups",
        "1",
        "--bwd_axes",
        "block_n=16",
        "--out-dir",
        str(out),
        "--budget_s",
        "300",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    path = out / f"{config.device_slug(device_name())}.json"
    data = json.loads(path.read_text())
    assert data["triton"] == tuning.triton_version()
    assert sorted((e["op"], e["L_bucket"]) for e in data["entries"]) == [("bwd", 64), ("fwd", 16), ("fwd", 128)]
    assert "picks 3/3 tuned entries" in text and path.with_suffix(".md").exists()
    monkeypatch.setenv(tuning.ENV_TUNED_DIR, str(out))
    tuning.clear_cache()
    spy = Spy(fwd_mod._sel_fwd_kernel)
    monkeypatch.setattr(fwd_mod, "_sel_fwd_kernel", spy)
    q, k, v, norm = tiny()  # S_kv=70, n=4: bucket 128
    fwd_mod.triton_forward(q, k, v, norm, scale=0.25)
    tuned = next(e for e in data["entries"] if e["op"] == "fwd" and e["L_bucket"] == 128)["config"]
    assert spy.calls[0]["BLOCK_L"] == tuned["BLOCK_L"] and tuning.last_choice()[2].startswith("tuned")
