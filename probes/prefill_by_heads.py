"""The 64k prefill (bf16, T=65536, 4 KV heads, D=128, 16 blocks of 64) at h = 1, 2, 4, 8, 16 query
heads per KV head: forward, forward+backward and peak memory as the running GPU's profile serves
it, beside the KV-outer routes forced (the KV-outer forward, kernels/triton/kv_outer.py, and dq from
the dk/dv kernel's pairs, kernels/triton/bwd.py), each configuration in a child process of its own
(the routes are read once a process). Prints one line per row and a table last. Run on a GPU:
python3 probes/prefill_by_heads.py"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADS = (1, 2, 4, 8, 16)
CONFIGS = (
    ("as served", {}),
    ("KV-outer routes", {"SELGATE_TRITON_KV_OUTER": "16", "SELGATE_TRITON_BWD_CONFIG": "dq_kv_outer_max_heads=16"}),
)


def child(label: str) -> None:
    import torch
    import triton.testing

    from selgate.bench.inputs import make_inputs, prefill_problem
    from selgate.kernels import reset_stats, selection_attention, stats

    for h in HEADS:
        row = {"config": label, "h": h}
        try:
            x = make_inputs(prefill_problem(65536, 4 * h, 4, 128, 128, 64, 16, "bfloat16"), seed=0, device="cuda")
            reset_stats()
            row["fwd_ms"] = triton.testing.do_bench(
                lambda: selection_attention(x.q, x.k, x.v, x.ranges, scale=x.scale), warmup=20, rep=300
            )
            row["forward"] = sorted(k for k in stats()["launches"] if k.startswith("triton_fwd_"))
            q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
            do = torch.randn_like(x.q)

            def step():
                o = selection_attention(q, k, v, x.ranges, scale=x.scale)
                torch.autograd.grad(o, (q, k, v), do)

            step()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            row["fwd_bwd_ms"] = triton.testing.do_bench(step, warmup=10, rep=500)
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except torch.OutOfMemoryError:
            row["error"] = "out of memory"
        torch.cuda.empty_cache()
        print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    rows = []
    for label, env in CONFIGS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", label], env={**os.environ, **env}, text=True, capture_output=True, cwd=ROOT
        )
        sys.stdout.write(out.stdout[-4000:] + out.stderr[-3000:])
        rows += [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("ROW ")]
    print("| configuration | h | forward kernel | fwd ms | fwd+bwd ms | peak GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['config']} | {r['h']} | {r['error']} | | | |")
            continue
        kernel = ", ".join(k.removeprefix("triton_fwd_") for k in r["forward"]) or "fwd.py"
        print(f"| {r['config']} | {r['h']} | {kernel} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {r['peak_gib']:.2f} |")


if __name__ == "__main__":
    child(sys.argv[2]) if sys.argv[1:2] == ["--child"] else main()
