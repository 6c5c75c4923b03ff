"""What the prefill probes (probes/prefill_*.py, run from a checkout) share: timing one
configuration's forward and forward+backward, and running each configuration in a child process
of its own (routes and profiles are read once a process), collecting the `ROW {json}` lines the
children print."""

import json
import os
import subprocess
import sys
from pathlib import Path


def time_prefill(x, *, fwd=(20, 300), step=(10, 500)) -> dict:
    """fwd_ms, fwd_bwd_ms and peak_gib of `selection_attention` on the bench inputs `x`
    (`triton.testing.do_bench` with (warmup, rep) `fwd` and `step`); peak memory of a
    forward+backward step."""
    import torch
    import triton.testing

    from selgate.kernels import selection_attention

    row = {"fwd_ms": triton.testing.do_bench(lambda: selection_attention(x.q, x.k, x.v, x.ranges, scale=x.scale),
                                             warmup=fwd[0], rep=fwd[1])}  # fmt: skip
    q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
    do = torch.randn_like(x.q)

    def train_step():
        o = selection_attention(q, k, v, x.ranges, scale=x.scale)
        torch.autograd.grad(o, (q, k, v), do)

    train_step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    row["fwd_bwd_ms"] = triton.testing.do_bench(train_step, warmup=step[0], rep=step[1])
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def run_children(script: str, configs) -> list:
    """`script --child <label>` once per (label, environment) of `configs`, from the checkout
    holding `script` (probes/ in it); their output passed through, their ROW lines parsed."""
    rows = []
    for label, env in configs:
        out = subprocess.run([sys.executable, script, "--child", label], env={**os.environ, **env}, text=True,
                             capture_output=True, cwd=Path(script).resolve().parents[1])  # fmt: skip
        sys.stdout.write(out.stdout[-4000:] + out.stderr[-3000:])
        rows += [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("ROW ")]
    return rows
