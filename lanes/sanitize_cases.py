"""The compute-sanitizer pass's driver (`python -m selgate.lanes.sanitize_cases`): one tiny call
of every GPU kernel, so that each tool sees each kernel launch at least once in a few seconds of
GPU time. Sizes cross a tile boundary (S_kv 300, ranges that end mid-tile, a padding range) so
that masked loads and tails run; correctness is the conformance matrix's job, not this one's.

Prints one line per case and exits 1 when a case raises (a kernel under a sanitizer must still
run), 2 without a CUDA device of SM 9.x (the Gluon kernel needs Hopper)."""

from __future__ import annotations

import sys

import torch

from selgate.conformance.inputs import random_qkv

B, G, H, D, S_KV, N = 1, 2, 4, 64, 300, 4
SEED = 0


def inputs(S: int, dtype, *, grad: bool = False):
    """q, k, v and normalised-looking ranges (sorted, disjoint, one padding entry) on the GPU,
    made on the CPU so that the sanitizer sees few torch kernels."""
    q, k, v = random_qkv(B, S, G, H, D, D, S_KV, dtype=dtype, generator=SEED, sample_dtype=torch.float32)
    ranges = torch.tensor([[0, 40], [64, 130], [200, 300], [0, 0]], dtype=torch.int64)
    ranges = ranges.expand(B, S, G, N, 2).contiguous()
    q, k, v, ranges = (t.cuda() for t in (q, k, v, ranges))
    for t in (q, k, v):
        t.requires_grad_(grad)
    return q, k, v, ranges


def triton_forward_prefill():
    from selgate.kernels.triton import selection_attention_triton

    q, k, v, r = inputs(8, torch.float32)  # fp32: the Triton kernel, not the Gluon pairs kernel
    return selection_attention_triton(q, k, v, r)


def triton_forward_decode():
    from selgate.kernels.triton import selection_attention_triton

    q, k, v, r = inputs(1, torch.float16)
    return selection_attention_triton(q, k, v, r)


def triton_backward():
    from selgate.kernels.triton import selection_attention_triton

    q, k, v, r = inputs(8, torch.float32, grad=True)
    o = selection_attention_triton(q, k, v, r)
    o.backward(torch.ones_like(o))
    return q.grad, k.grad, v.grad


def gluon_prefill():
    from selgate.kernels.triton import pairs
    from selgate.reference.ranges import normalize_ranges

    q, k, v, r = inputs(8, torch.float16)
    why = pairs.unsupported(q, k, v, None)
    if why is not None:
        raise RuntimeError(f"the Gluon prefill kernel declines the case: {why}")
    o = torch.empty(B, 8, G, H, D, dtype=v.dtype, device=q.device)
    lse = torch.empty(B, 8, G, H, dtype=torch.float32, device=q.device)
    return pairs.pair_forward(q, k, v, normalize_ranges(r, S_KV, None), scale=D**-0.5, out=(o, lse))


def cuda_decode(kernel: str, dtype):
    def run():
        from selgate.kernels.cuda.decode import selection_attention_cuda

        q, k, v, r = inputs(1, dtype)
        return selection_attention_cuda(q, k, v, r, kernel=kernel)

    return run


CASES = {
    "triton_forward_prefill": triton_forward_prefill,
    "triton_forward_decode": triton_forward_decode,
    "triton_backward": triton_backward,
    "gluon_prefill": gluon_prefill,
    "cuda_decode_mma": cuda_decode("mma", torch.float16),
    "cuda_decode_simt": cuda_decode("simt", torch.float32),
}


def main(names=None) -> int:
    unknown = sorted(set(names or ()) - set(CASES))
    if unknown:
        print(f"sanitize_cases: unknown cases {unknown}; cases are {list(CASES)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("sanitize_cases: needs an SM 9.x CUDA device (the Gluon prefill kernel is Hopper's)", file=sys.stderr)
        return 2
    print(f"gpu: {torch.cuda.get_device_name()}", flush=True)
    failed = 0
    for name in names or CASES:
        try:
            CASES[name]()
            torch.cuda.synchronize()
            print(f"case {name}: ran", flush=True)
        except Exception as e:  # noqa: BLE001 (every case is reported, then the run fails: one kernel's error must not hide the others)
            failed += 1
            print(f"case {name}: FAILED {type(e).__name__}: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
