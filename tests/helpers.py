"""Inputs and checks for the harness's own unit tests: random inputs, NaN-poisoned K/V, and
SPEC.md's acceptance against the fp64 reference."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from selgate.conformance.inputs import random_qkv
from selgate.kernels import reset_stats
from selgate.kernels.policy import ENV_FLAGS, forget_kept_calls
from selgate.lanes.config import LANE_DIR, load_lane
from selgate.reference import resolve_scale, selection_attention_ref
from selgate.reference.golden import gather_attention
from selgate.reference.ranges import expand_ranges, selected_lengths


def running_lane_device() -> str | None:
    """The device of the lane this run belongs to (SELGATE_LANE), None outside a lane run."""
    lane = os.environ.get("SELGATE_LANE", "").removesuffix("-emulated")
    return load_lane(lane)["device"] if lane and (LANE_DIR / f"{lane}.yaml").exists() else None


@pytest.fixture
def clean_dispatcher(monkeypatch):
    """The dispatcher with none of its flags set, no kept calls and its counters reset, before and after."""
    for name in ENV_FLAGS:
        monkeypatch.delenv(name, raising=False)
    forget_kept_calls()
    reset_stats()
    yield
    forget_kept_calls()
    reset_stats()


def random_inputs(B=2, S=5, G=2, h=3, Dk=8, Dv=6, S_kv=23, n=4, dtype=torch.float64, seed=0, lo=-3, hi=None, requires_grad=False):
    """q, k, v and raw ranges with overlaps, padding and out-of-bounds ends."""
    g = torch.Generator().manual_seed(seed)
    hi = S_kv + 4 if hi is None else hi
    q, k, v = random_qkv(B, S, G, h, Dk, Dv, S_kv, dtype=dtype, generator=g, sample_dtype=torch.float64)
    ranges = torch.randint(lo, hi, (B, S, G, n, 2), generator=g)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, ranges


def poison_unselected(k, v, norm):
    """NaN every key of (b, g) that none of its rows selects; returns poisoned copies."""
    B, S, G = norm.shape[:3]
    L_max = max(int(selected_lengths(norm).max()), 1)
    idx, valid = expand_ranges(norm, L_max)  # [B, S, G, L]
    used = torch.zeros(B, G, k.shape[2], dtype=torch.bool, device=k.device)
    bi = torch.arange(B, device=k.device)[:, None, None, None].expand_as(idx)
    gi = torch.arange(G, device=k.device)[None, None, :, None].expand_as(idx)
    used[bi[valid], gi[valid], idx[valid]] = True
    nan = torch.tensor(float("nan"), dtype=k.dtype, device=k.device)
    return torch.where(used[..., None], k, nan), torch.where(used[..., None], v, nan)


def assert_matches_reference(q, k, v, norm, o, lse, *, positions=None):
    """SPEC.md acceptance: fp32 max 1e-5 / mean 1e-6; fp16/bf16 within 2x a plain PyTorch
    run in that precision plus 2 eps max|ref|, mean 1e-3; -inf lse and zero o on empty rows."""
    ref_o, ref_lse = selection_attention_ref(q, k, v, norm, positions=positions, return_lse=True)
    assert o.dtype == v.dtype and lse.dtype == torch.float32
    empty = ~torch.isfinite(ref_lse)
    assert torch.isfinite(o).all(), "non-finite output where the reference is finite"
    assert bool((lse[empty] == float("-inf")).all()) and bool((o[empty] == 0).all())
    assert torch.isfinite(lse[~empty]).all()
    err_o = (o.double() - ref_o).abs()
    err_lse = (lse.double() - ref_lse)[~empty].abs()
    if q.dtype == torch.float32:
        for name, err in (("o", err_o), ("lse", err_lse)):
            if err.numel():
                assert err.max() <= 1e-5 and err.mean() <= 1e-6, f"{name}: max {err.max():.3g} mean {err.mean():.3g}"
        return
    sc = resolve_scale(None, q.shape[-1])
    low_o, low_lse = gather_attention(q, k, v, norm, scale=sc, dtype=q.dtype)
    eps = torch.finfo(q.dtype).eps
    for name, err, low, ref in (("o", err_o, low_o, ref_o), ("lse", err_lse, low_lse[~empty], ref_lse[~empty])):
        if not err.numel():
            continue
        low_err = (low.double() - ref).abs().max()
        bound = 2 * low_err + 2 * eps * ref.abs().max()
        assert err.max() <= bound and err.mean() <= 1e-3, f"{name}: max {err.max():.3g} > {bound:.3g} or mean {err.mean():.3g}"


def run_pytest(rootdir, *args, env, timeout=120):
    """`python -m pytest *args` in `rootdir` as its own rootdir, the way a lane starts a nested
    run: output captured, the exit status left to the caller."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--rootdir", str(rootdir)],
        cwd=rootdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def running_with(last_arg: str) -> list:
    """The pids of live processes (zombies excluded) whose command line ends with `last_arg`: a
    process a confined kernel started, which cannot write its pid where a test reads it."""
    from pathlib import Path

    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if proc.name.isdigit() and len(argv) > 1 and argv[-2] == last_arg.encode() and state != "Z":
            pids.append(int(proc.name))
    return pids


def blocked_by_failures(rc: int, log: str) -> bool:
    """Whether a `selgate check` narrowed with -k blocked on the kernel's failing cases, not only
    on its narrowing (a narrowed check is BLOCKED whatever the kernel does)."""
    return rc == 1 and "CHECK BLOCKED" in log and re.search(r"blocking: \d+ failing case\(s\)", log) is not None
