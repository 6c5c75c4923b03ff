"""Does the CUDA decode kernel's K/V copy instruction cost it the streaming rate?

Nsight Compute showed the tensor-core kernel reading twice as many L2 sectors as the Triton
decode kernel for the same DRAM bytes (L2 hit rate 50% against 2%). This probe builds
private copies of the extension whose 16-byte `cp.async` differs only in its cache and
L2-prefetch qualifiers, checks each copy's output bitwise against the unpatched one, and
times them side by side (graph replay over rotating inputs, as bench/cuda_decode.py does), variants
interleaved and repeated. Usage on a GPU machine: python3 probes/decode_load_variants.py
"""

from __future__ import annotations

import subprocess
import sys

import torch

from selgate.bench.timing import rotation_count, time_graph
from selgate.kernels.cuda import build
from selgate.bench.cuda_decode import L_SEL, nsa_inputs

BASE = "cp.async.ca.shared.global"  # what sel_decode.cu issues (`.cg` before the load flavours were measured, docs/design/cuda-decode.md)
ANCHOR = 'asm volatile("' + BASE + ' [%0], [%1], 16, %2;\\n"'
VARIANTS = {
    "ca": BASE,
    "cg": "cp.async.cg.shared.global",
    "cg+L2::128B": "cp.async.cg.shared.global.L2::128B",
    "cg+L2::256B": "cp.async.cg.shared.global.L2::256B",
}
POINTS = [(256, h, D, n) for h in (4, 8) for D in (64, 128) for n in (8, 16)] + [(1024, 4, 64, 8), (1024, 8, 128, 16)]


def load(name: str):
    slug = "".join(ch for ch in name if ch.isalnum())
    return build.load_patched(f"sel_ld_{slug}", {"sel_decode.cu": [(ANCHOR, ANCHOR.replace(BASE, VARIANTS[name]))]})


def call(ext, x):
    """One decode call straight into a built extension (k, v as [B*G, S_kv, D], as the wrapper passes them)."""
    return ext.fwd(x.q, x.k.flatten(0, 1), x.v.flatten(0, 1), x.ranges, None, x.scale, True, [])


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        load(sys.argv[2])
        return
    procs = {v: subprocess.Popen([sys.executable, __file__, "--build", v]) for v in VARIANTS}  # builds in parallel
    failed = [v for v, proc in procs.items() if proc.wait() != 0]
    if failed:
        raise RuntimeError(f"variants {failed} failed to build (their compiler output is above)")
    exts = {v: load(v) for v in VARIANTS}
    dev = torch.device("cuda")
    print("| N | h | D | n | " + " | ".join(f"{v} us" for v in VARIANTS) + " | bitwise equal |", flush=True)
    print("| --- " * (5 + len(VARIANTS)) + "|", flush=True)
    for N, h, D, n in POINTS:
        selected = N * n * L_SEL * 2 * D * 2
        sets = [nsa_inputs(N, h, D, n, torch.bfloat16, seed=s, device=dev) for s in range(rotation_count(selected, dev))]
        x = sets[0]
        outs = {v: call(e, x)[0] for v, e in exts.items()}
        same = all(torch.equal(o, outs["ca"]) for o in outs.values())
        times = {v: [] for v in VARIANTS}
        for _ in range(3):
            for v, e in exts.items():
                calls = [lambda x=x, e=e: call(e, x) for x in sets]
                times[v].append(time_graph(calls, dev).median_ms * 1e3)
        cells = " | ".join("/".join(f"{t:.1f}" for t in times[v]) for v in VARIANTS)
        print(f"| {N} | {h} | {D} | {n} | {cells} | {same} |", flush=True)
        del sets, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
