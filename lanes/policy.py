"""A lane's policy checks: what the dispatcher must decide under the lane's env, proven by
its launch counters (`selgate.kernels.stats()`), not by reading the config.

Each check runs `probe()` in a fresh interpreter with the check's env added, because the
flags and the capability override are read from the environment that a check changes.
On a CPU lane the probe runs Triton under TRITON_INTERPRET=1 (the dispatcher takes CPU
tensors to Triton only with a capability override there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE_L = 128  # selected keys per row: above the min-L threshold, so only policy keeps Triton off


def triton_launches(stats: dict) -> int:
    return sum(n for kernel, n in stats["launches"].items() if kernel.startswith("triton"))


def probe() -> dict:
    """One tiny forward call through `auto`; returns the counters it produced."""
    import torch

    from selgate.conformance.inputs import random_qkv
    from selgate.kernels import selection_attention
    from selgate.kernels.stats import reset_stats, stats

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    B, S, G, h, D = 1, 1, 1, 2, 16
    q, k, v = random_qkv(B, S, G, h, D, D, PROBE_L, dtype=dtype, generator=0, sample_dtype=torch.float32, device=device)
    ranges = torch.tensor([0, PROBE_L], device=device).expand(B, S, G, 1, 2).contiguous()
    reset_stats()
    with torch.no_grad():
        o = selection_attention(q, k, v, ranges)
    if not torch.isfinite(o).all():
        raise AssertionError("probe: the dispatcher returned non-finite output")
    return stats()


def probe_in_subprocess(env: dict, timeout: float = 600) -> dict:
    """`probe()`'s counters from a fresh interpreter with `env` added to os.environ."""
    full = {**os.environ, **{k: str(v) for k, v in env.items()}}
    proc = subprocess.run(
        [sys.executable, "-m", "selgate.lanes.policy"], env=full, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"policy probe with env {env} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def judge(check: dict, stats: dict) -> tuple[bool, str]:
    """(passed, one-line explanation) of one policy check against the probe's counters."""
    launched = triton_launches(stats)
    ok = (launched > 0) == check["triton_launches"]
    want = "launch" if check["triton_launches"] else "never launch"
    return ok, (
        f"{check['name']}: Triton must {want} with env {check['env']}; counted {launched} Triton "
        f"launches, calls {stats['calls']}, fallbacks {stats['fallback_reasons']}, capability "
        f"{stats['capability']} ({stats['capability_source']})"
    )


if __name__ == "__main__":
    print(json.dumps(probe()))
