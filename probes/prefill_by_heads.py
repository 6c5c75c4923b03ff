"""The 64k prefill (bf16, T=65536, 4 KV heads, D=128, 16 blocks of 64) at h = 1, 2, 4, 8, 16 query
heads per KV head: forward, forward+backward and peak memory as the running GPU's profile serves
it, beside the row-outer kernels alone (the routes off) and the KV-outer routes forced (the KV-outer forward, kernels/triton/kv_outer.py, and dq from
the dk/dv kernel's pairs, kernels/triton/bwd.py), each configuration in a child process of its own
(the routes are read once a process). Prints one line per row and a table last. Run on a GPU:
python3 probes/prefill_by_heads.py"""

import json
import sys

from selgate.bench.probe_rows import run_children, time_prefill

HEADS = (1, 2, 4, 8, 16)
CONFIGS = (
    ("as served", {}),
    ("row-outer", {"SELGATE_TRITON_KV_OUTER": "0", "SELGATE_TRITON_BWD_CONFIG": "dq_kv_outer_max_heads=0"}),
    ("KV-outer routes", {"SELGATE_TRITON_KV_OUTER": "16", "SELGATE_TRITON_BWD_CONFIG": "dq_kv_outer_max_heads=16"}),
)


def child(label: str) -> None:
    import torch

    from selgate.bench.inputs import make_inputs, prefill_problem
    from selgate.kernels import reset_stats, stats

    for h in HEADS:
        row = {"config": label, "h": h}
        try:
            x = make_inputs(prefill_problem(65536, 4 * h, 4, 128, 128, 64, 16, "bfloat16"), seed=0, device="cuda")
            reset_stats()
            timed = time_prefill(x)
            row["forward"] = sorted(k for k in stats()["launches"] if k.startswith("triton_fwd_"))
            row.update(timed)
        except torch.OutOfMemoryError:
            row["error"] = "out of memory"
        torch.cuda.empty_cache()
        print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    rows = run_children(__file__, CONFIGS)
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
