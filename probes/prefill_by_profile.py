"""Which profile serves a GPU, and what it costs: the 64k prefill forward and forward+backward
(bf16, T=65536, 4 KV heads, D=128, 16 blocks of 64) at h = 1 and 16 query heads per KV head,
as the running GPU's configuration serves them (no environment variable set) and as base.yaml
alone would (a copy of configs/ without class or device profiles, through SELGATE_CONFIG_DIR in
a child process: what a GPU got whose name no profile matched), with fla-core's parallel_nsa
beside (h = 16 only: it needs 16 heads a group) in the same run. Prints one line per row and a
table last. Run on a GPU: python3 probes/prefill_by_profile.py [--served]"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

from selgate.bench.probe_rows import run_children, time_prefill

ROOT = Path(__file__).resolve().parent.parent


def child(label: str) -> None:
    import torch
    import triton.testing

    from selgate.bench.baselines import get_method
    from selgate.bench.inputs import make_inputs, prefill_problem
    from selgate.kernels import stats

    dev = torch.device("cuda")
    for h in (1, 16):
        p = prefill_problem(65536, 4 * h, 4, 128, 128, 64, 16, "bfloat16")
        x = make_inputs(p, seed=0, device=dev)
        timed = time_prefill(x, fwd=(50, 500), step=(50, 1000))
        tuned = stats().get("tuned", {})
        row = {"config": label, "h": h, **timed,
               "profile": stats()["profile"]["served_by"], "tuned": tuned.get("served_by"),
               "autotune": f"{tuned.get('autotune')} {tuned.get('autotune_s')} s"}  # fmt: skip
        if h == 16 and label == "as served":
            try:
                fla = get_method("fla_nsa").build(p, x)
                row["fla_fwd_ms"] = triton.testing.do_bench(fla, warmup=20, rep=500)
                qf = x.q.reshape(1, 65536, 64, 128).detach().clone().requires_grad_()
                kf, vf = (t.transpose(1, 2).contiguous().requires_grad_() for t in (x.k, x.v))
                from fla.ops.nsa import parallel_nsa

                from selgate.bench.baselines import block_indices

                idx = block_indices(x.ranges, 64, 16, 65536)
                dof = torch.randn(1, 65536, 64, 128, device=dev, dtype=torch.bfloat16)

                def fla_step():
                    o = parallel_nsa(qf, kf, vf, block_indices=idx, block_counts=16, block_size=64, scale=x.scale)
                    torch.autograd.grad(o, (qf, kf, vf), dof)

                row["fla_fwd_bwd_ms"] = triton.testing.do_bench(fla_step, warmup=10, rep=500)
            except Exception as e:  # noqa: BLE001 - the row says why fla-core did not run
                row["fla"] = f"{type(e).__name__}: {str(e)[:200]}"
        print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    base_only = Path(tempfile.mkdtemp()) / "configs"
    shutil.copytree(ROOT / "configs", base_only, ignore=shutil.ignore_patterns("classes", "profiles", "tuned", "*.py"))
    configs = (
        ("as served", {}),
        ("base.yaml only, first-call autotune", {"SELGATE_CONFIG_DIR": str(base_only)}),
        ("base.yaml only, autotune off", {"SELGATE_CONFIG_DIR": str(base_only), "SELGATE_TRITON_AUTOTUNE": "0",
                                          "SELGATE_TRITON_TUNE_CACHE": str(base_only / "no-cache")}),
    )  # fmt: skip
    if "--served" in sys.argv:  # the served configuration alone (with fla-core): a short run
        configs = configs[:1]
    rows = run_children(__file__, configs)
    print("| configuration | h | profile | tuned | autotune | fwd ms | fwd+bwd ms | peak GiB | fla-core fwd / fwd+bwd ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fla = f"{r['fla_fwd_ms']:.1f} / {r['fla_fwd_bwd_ms']:.1f}" if "fla_fwd_bwd_ms" in r else r.get("fla", "")
        print(f"| {r['config']} | {r['h']} | {r['profile']} | {r['tuned']} | {r['autotune']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
              f"{r['peak_gib']:.2f} | {fla} |")  # fmt: skip


if __name__ == "__main__":
    child(sys.argv[2]) if sys.argv[1:2] == ["--child"] else main()
