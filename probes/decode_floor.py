"""What a decode kernel that does no attention at all can reach at the decode benchmark grid points (N, D, n of bench/cuda_decode.py).

Why: the CUDA decode kernel misses 1.3x of the HBM floor only at N=256 (about 11-22 us
of bytes), where fixed costs weigh most. These read-only Triton kernels move exactly the
selected K/V bytes, one program per 64 selected keys of a row, every program issuing its
single K and V load at once, and write one float per program:
  - `read dep`: the program reads the row's ranges, then gathers the keys at selection
    positions [64 i, 64 i + 64) (the dependent read every selection kernel has);
  - `read nodep`: the same byte count from keys [64 i, 64 i + 64), no ranges read.
So `read dep` is close to the least time any kernel that honours the ranges can take
(nothing but the ranges read, then the bytes, at full parallelism), and `read nodep`
minus the copy shows the cost of the loads' layout. `read dep pdl` is `read dep` with
programmatic dependent launch, its trigger right after the wait that must precede the
ranges read (as the CUDA kernel does where the next grid lands evenly). `merge s` is `read dep
pdl` split into s programs a row that each write an [h, Dv] fp32 partial, the last to arrive
(a release/acquire counter) summing them in slot order into `o`: the least a split decode
kernel with a one-kernel merge (FlashDecoding without a second launch) pays. Timed by CUDA-graph replay over the
same rotating input sets as `bench/cuda_decode.py`, beside the same-size copy, the CUDA kernel
(automatic launch, which triggers right after the wait at every decode benchmark grid point, and
`cuda pdl`: DecodeLaunch(pdl=Pdl.TRIGGER_AFTER_LOOP), triggered after its loop) and the Triton decode kernel.
Usage on a GPU machine: python3 probes/decode_floor.py
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from selgate.bench.timing import measure_limits
from selgate.kernels.cuda import DecodeLaunch, Pdl, selection_attention_cuda
from selgate.bench.cuda_decode import L_SEL, copy_us, graph_us, grid_sets, triton_method
from selgate.kernels.triton.tiles import gather_keys


@triton.jit
def _read_slot(
    k_ptr,
    v_ptr,
    r_ptr,
    out_ptr,
    n,
    S_kv,
    D: tl.constexpr,
    N_PAD: tl.constexpr,
    BLK: tl.constexpr,
    DEP: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    d = tl.arange(0, D)
    if DEP:
        j = tl.arange(0, N_PAD)
        start = tl.load(r_ptr + (row * n + j) * 2, mask=j < n, other=0).to(tl.int32)
        length = tl.load(r_ptr + (row * n + j) * 2 + 1, mask=j < n, other=0).to(tl.int32) - start
        stop = tl.cumsum(length, 0)
        key, ok = gather_keys(i * BLK, start, stop - length, stop, tl.sum(length, 0), S_kv, BLK)
    else:
        key = (i * BLK + tl.arange(0, BLK)).to(tl.int64)
        ok = key < S_kv
    off = (row * S_kv + key[:, None]) * D + d[None, :]
    acc = tl.load(k_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
    acc += tl.load(v_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(out_ptr + row * tl.num_programs(1) + i, tl.sum(acc))


@triton.jit
def _read_slot_merge(
    k_ptr,
    v_ptr,
    r_ptr,
    ws_ptr,
    cnt_ptr,
    o_ptr,
    n,
    S_kv,
    D: tl.constexpr,
    H: tl.constexpr,
    N_PAD: tl.constexpr,
    BLK: tl.constexpr,
    SLOTS: tl.constexpr,
):
    """`read dep pdl` plus the merge a split decode kernel needs: each program writes an
    [H, D] fp32 partial, the last of a row's programs to arrive (a release/acquire counter,
    CUTLASS-semaphore style) sums the row's partials in slot order and writes o [H, D]."""
    gdc_wait()
    gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    d = tl.arange(0, D)
    hh = tl.arange(0, H)
    j = tl.arange(0, N_PAD)
    start = tl.load(r_ptr + (row * n + j) * 2, mask=j < n, other=0).to(tl.int32)
    length = tl.load(r_ptr + (row * n + j) * 2 + 1, mask=j < n, other=0).to(tl.int32) - start
    stop = tl.cumsum(length, 0)
    key, ok = gather_keys(i * BLK, start, stop - length, stop, tl.sum(length, 0), S_kv, BLK)
    off = (row * S_kv + key[:, None]) * D + d[None, :]
    acc = tl.load(k_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
    acc += tl.load(v_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
    part = tl.sum(acc, 0)[None, :] + hh[:, None].to(tl.float32)
    tl.store(ws_ptr + ((row * SLOTS + i) * H + hh[:, None]) * D + d[None, :], part)
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu") == SLOTS - 1:
        sl = tl.arange(0, SLOTS)
        parts = tl.load(
            ws_ptr + ((row * SLOTS + sl[:, None, None]) * H + hh[None, :, None]) * D + d[None, None, :], cache_modifier=".cg"
        )
        tl.store(o_ptr + (row * H + hh[:, None]) * D + d[None, :], tl.sum(parts, 0).to(o_ptr.dtype.element_ty))
        tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed", scope="gpu")


def read_only(dep: bool, pdl: bool = False):
    """A call reading the selected K/V bytes of inputs `x` (N rows, G = 1) without attention."""

    def call(x):
        N, S_kv, D = x.k.shape[0], x.k.shape[2], x.k.shape[3]
        n = x.ranges.shape[3]
        slots = n  # NSA ranges: n blocks of L_SEL keys
        out = torch.empty(N, slots, device=x.k.device)
        _read_slot[(N, slots)](
            x.k,
            x.v,
            x.ranges.contiguous(),
            out,
            n,
            S_kv,
            D=D,
            N_PAD=max(16, triton.next_power_of_2(n)),
            BLK=L_SEL,
            DEP=dep,
            PDL=pdl,
            num_warps=4,
            launch_pdl=pdl,
        )
        return out

    return call


def read_merge(slots: int):
    """`read dep pdl` split into `slots` programs a row, merged by the last to arrive."""
    ws = {}

    def call(x):
        N, S_kv, D = x.k.shape[0], x.k.shape[2], x.k.shape[3]
        n, H = x.ranges.shape[3], x.q.shape[3]
        key = (N, H, D, slots, x.k.device)
        if key not in ws:  # the counters start at 0 and every merge puts its row's back
            ws[key] = (torch.empty(N * slots * H * D, device=x.k.device), torch.zeros(N, dtype=torch.int32, device=x.k.device))
        part, cnt = ws[key]
        o = torch.empty(N, H, D, dtype=x.v.dtype, device=x.k.device)
        _read_slot_merge[(N, slots)](
            x.k,
            x.v,
            x.ranges.contiguous(),
            part,
            cnt,
            o,
            n,
            S_kv,
            D=D,
            H=H,
            N_PAD=max(16, triton.next_power_of_2(n)),
            BLK=n * L_SEL // slots,
            SLOTS=slots,
            num_warps=4 if slots >= 4 else 8,
            launch_pdl=True,
        )
        return o

    return call


def main() -> None:
    dev = torch.device("cuda")
    copy_gbps = measure_limits(dev, torch.bfloat16).copy_gbps
    methods = {
        "read dep": read_only(True),
        "read dep pdl": read_only(True, pdl=True),
        "read nodep": read_only(False),
        "merge 8": read_merge(8),
        "merge 4": read_merge(4),
        "merge 2": read_merge(2),
        "cuda": lambda x: selection_attention_cuda(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True),
        "cuda pdl": lambda x: selection_attention_cuda(
            x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True, launch=DecodeLaunch(pdl=Pdl.TRIGGER_AFTER_LOOP)
        ),
    }
    tri = triton_method()
    if tri is not None:
        methods["triton"] = tri
    print(f"copy bandwidth {copy_gbps:.0f} GB/s; graph time / HBM floor (floor us in its column)", flush=True)
    head = ["N", "h", "D", "n", "floor us", "copy"] + list(methods)
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row, sets in grid_sets(dev, torch.bfloat16, copy_gbps):
        cells = [
            row["N"],
            row["h"],
            row["D"],
            row["n"],
            f"{row['floor_us']:.1f}",
            f"{copy_us(row['moved'], dev) / row['floor_us']:.2f}",
        ]
        for name, fn in methods.items():
            try:
                cells.append(f"{graph_us(fn, sets) / row['floor_us']:.2f}")
            except Exception as exc:  # report and go on: one failing method must not hide the others
                cells.append(f"error {type(exc).__name__}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
