"""Profiles and tuned launches by GPU class, refined by device (kernels/config.py,
kernels/triton/tuning.py): every Hopper name, and an SM 9.0 name nobody profiled, runs the
sm90 class's measured launches; a device profile overrides only what it measured; the class
follows the real capability; the first-call autotune runs only where nothing was measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from selgate.kernels import config, reload_settings, stats
from selgate.kernels.triton import tuning

ROOT = Path(__file__).resolve().parents[2]
HOPPER = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA H800", "NVIDIA H20", "NVIDIA GH200 480GB")


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """A private copy of the real configs/ (base, classes, profiles), no tuning env."""
    shutil.copytree(config.CONFIG_DIR, tmp_path / "configs", ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path / "configs")
    for name in (tuning.ENV_AUTOTUNE, tuning.ENV_TUNED, tuning.ENV_TUNED_DIR, tuning.ENV_FWD, tuning.ENV_BWD):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(tuning.ENV_CACHE_DIR, str(tmp_path / "cache"))
    reload_settings()
    yield tmp_path / "configs"
    reload_settings()


@pytest.mark.parametrize("name", [*HOPPER, "NVIDIA Hopper Engineering Sample"])
def test_every_sm90_name_runs_the_class_launches(configs, name):
    cfg = config.load_config(name, (9, 0))
    prefill = cfg["triton_fwd"]["prefill"]
    assert (prefill["block_l"], prefill["num_warps"], prefill["tma"], prefill["pairs"]) == (32, 1, True, True)
    assert (cfg["triton_bwd"]["block_m"], cfg["triton_bwd"]["stages"]) == (32, 7)
    assert cfg["runtime"]["sel_triton_min_L"] == 0
    prof = config.profile_source(cfg)
    assert prof["class"] == "sm90"
    assert prof["served_by"] == ("device" if (configs / "profiles" / f"{config.device_slug(name)}.yaml").exists() else "class")
    assert "capabilities" not in cfg and "bench_baseline" not in cfg  # class metadata is not a setting


def test_the_same_names_without_a_class_get_base_launches(configs):
    """What a profile keyed by name alone gave an H200: base.yaml's untuned prefill."""
    cfg = config.load_config("NVIDIA H200", None)
    assert cfg["triton_fwd"]["prefill"].get("tma") is None and cfg["triton_fwd"]["prefill"]["block_l"] == 64
    assert config.profile_source(cfg) == {**config.profile_source(cfg), "class": None, "served_by": "none"}


def test_a_device_profile_overrides_only_what_it_measured(configs):
    (configs / "profiles" / "nvidia-h200.yaml").write_text("triton_fwd:\n  decode: {block_l: 16}\nruntime: {sdpa_budget_mb: 7}\n")
    config.cache_clear()
    cfg = config.load_config("NVIDIA H200", (9, 0))
    assert cfg["triton_fwd"]["decode"] == {"block_l": 16, "num_warps": 4, "num_stages": 2}  # the class's warps, stages
    assert cfg["triton_fwd"]["prefill"]["pairs"] is True and cfg["runtime"]["sel_triton_min_L"] == 0
    assert cfg["runtime"]["sdpa_budget_mb"] == 7
    assert config.profile_source(cfg)["served_by"] == "device"


@pytest.mark.parametrize(
    "cap,cls,served", [((8, 0), "sm80", "none"), ((8, 6), "sm80", "none"), ((8, 9), "sm89", "none"), ((7, 5), None, "none")]
)
def test_other_classes_and_unknown_capabilities(configs, cap, cls, served):
    prof = config.profile_source(config.load_config("Some GPU", cap))
    assert (prof["class"], prof["served_by"]) == (cls, served)


def test_the_lanes_classes_match_the_class_profiles():
    """A lane YAML's capabilities are the class profile's: one GPU class, one list."""
    for cls in ("sm80", "sm89", "sm90"):
        lane = yaml.safe_load((ROOT / "lanes" / f"{cls}.yaml").read_text())
        prof = yaml.safe_load((ROOT / "configs" / "classes" / f"{cls}.yaml").read_text())
        assert lane["capabilities"] == prof["capabilities"], cls
        assert all(config.device_class(c) == cls for c in prof["capabilities"])


def _entry(bucket, block_l):
    return {"op": "fwd", "kind": "decode", "Dk": 64, "Dv": 64, "L_bucket": bucket, "dtype": "bfloat16",
            "config": {"BLOCK_L": block_l, "num_warps": 4, "num_stages": 2}, "ms": 1.0}  # fmt: skip


def _state_for(monkeypatch, name, cap):
    """The tuning state as on a GPU called `name` of capability `cap`."""
    monkeypatch.setattr(config, "current_device_name", lambda: name)
    monkeypatch.setattr(config, "current_capability", lambda: cap)
    reload_settings()
    return tuning.current_state()


def test_tuned_launches_layer_device_over_class(configs, monkeypatch):
    st = _state_for(monkeypatch, "NVIDIA H800", (9, 0))
    assert tuning._lookup(st, "fwd", "decode", 64, 64, torch.bfloat16, 1024)[1].startswith("tuned (class)")
    status = tuning.tuning_status()
    assert status["served_by"] == "class" and status["profile"]["class"] == "sm90"
    assert [f["kind"] for f in status["files"]] == ["device", "class", "cache"]
    # a device file refines its class key by key
    tuning.write_tuned(tuning.tuned_path("NVIDIA H800"), [_entry(1024, 16)], device_name="NVIDIA H800")
    st = _state_for(monkeypatch, "NVIDIA H800", (9, 0))
    cfg, source = tuning._lookup(st, "fwd", "decode", 64, 64, torch.bfloat16, 1024)
    assert cfg["BLOCK_L"] == 16 and source.startswith("tuned (device)")
    assert tuning._lookup(st, "fwd", "decode", 128, 128, torch.bfloat16, 1024)[1].startswith("tuned (class)")
    assert stats()["tuned"]["served_by"] == "device" and stats()["profile"]["class"] == "sm90"


def test_a_class_file_of_another_class_is_ignored_with_its_reason(configs, monkeypatch):
    path = configs / "classes" / "sm90.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "class": "sm80"}))
    _state_for(monkeypatch, "NVIDIA H800", (9, 0))
    status = tuning.tuning_status()
    assert status["served_by"] == "none" and "tuned for class 'sm80', running a sm90 GPU" in status["reason"]


def _first_call(monkeypatch, name, cap):
    """fwd_config on a decode key as a GPU would select it (no launch): the tunes it asked for."""
    st = _state_for(monkeypatch, name, cap)
    monkeypatch.setattr(tuning.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tuning, "_capturing", lambda: False)
    asked = []

    def tune(default, space=None):
        asked.append(space)
        return {"BLOCK_L": 32, "num_warps": 4, "num_stages": 2}

    cfg = tuning.fwd_config(64, 64, 2, "decode", dtype=torch.float16, S_kv=4096, n=16, tune=tune)
    return st, asked, cfg


def test_first_call_autotune_only_where_nothing_was_measured(configs, monkeypatch):
    _, asked, _ = _first_call(monkeypatch, "NVIDIA H800", (9, 0))
    assert asked == []  # the class measured this GPU's launches
    st, asked, cfg = _first_call(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    assert tuning.autotune_mode(st) == "first-call" and asked == [tuning.FIRST_CALL_FWD_SPACE]
    assert cfg["BLOCK_L"] == 32 and tuning.last_choice()[2].startswith("autotuned in this process")
    cached = json.loads(tuning.cache_tuned_path("NVIDIA A100-SXM4-80GB").read_text())
    assert cached["device"] == "NVIDIA A100-SXM4-80GB" and cached["entries"][0]["config"]["BLOCK_L"] == 32
    # the next process reads the cache instead of tuning again
    _, asked, cfg = _first_call(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    assert asked == [] and tuning.last_choice()[2].startswith("tuned (cache)")
    monkeypatch.setenv(tuning.ENV_AUTOTUNE, "0")
    st, asked, _ = _first_call(monkeypatch, "NVIDIA L4", (8, 9))
    assert tuning.autotune_mode(st) == "off" and asked == []


def test_first_call_autotune_stops_at_its_budget(configs, monkeypatch):
    st = _state_for(monkeypatch, "NVIDIA L4", (8, 9))
    st.autotune_s = tuning.FIRST_CALL_BUDGET_S
    monkeypatch.setattr(tuning, "current_state", lambda: st)
    _, asked, _ = _first_call(monkeypatch, "NVIDIA L4", (8, 9))
    assert asked == [] and tuning.last_choice()[2].startswith("configs triton_fwd.decode")
