"""Outside kernels that each hide one bug from a check, as a hostile reviewer wrote them:
`selgate check` must block each, or its headline must name what the pass leaves out. They
declare prefill alone, fp32 and no backward (but where the bug needs fp16), to keep their
checks short."""

from __future__ import annotations

import os

import torch

from tokenkernels import gather


def declares_per_process(q, k, v, ranges, *, scale=None):
    """1% off in fp16. Declares fp16 and fp32 where it is imported first (the check's probe)
    and fp32 alone in pytest's workers, where the fp16 cases run: skipped, had the workers
    read its declarations again."""
    o = gather(q, k, v, ranges, scale=scale)
    return o if q.dtype == torch.float32 else o * 1.01


declares_per_process.dtypes = ("fp32",) if "PYTEST_XDIST_WORKER" in os.environ else ("fp16", "fp32")


def seeded_by_pid(q, k, v, ranges, *, scale=None):
    """Bitwise repeatable within a process and different in every other one (as a kernel
    seeded by its pid, or tuned per process, is), each time within SPEC.md's fp32 bar."""
    o = gather(q, k, v, ranges, scale=scale)
    shape = (*o.shape[:3], 1, o.shape[4])  # one value for every head of a group, as its heads share keys
    noise = torch.rand(shape, generator=torch.Generator().manual_seed(os.getpid()), dtype=o.dtype)
    return o * (1 + 1e-6 * noise.to(o.device))


def nan_in_fp16(q, k, v, ranges, *, scale=None):
    """NaN everywhere in fp16, right in fp32; its --declare file (nan_in_fp16.yaml) declares
    every fp16 failure a strict expected failure."""
    o = gather(q, k, v, ranges, scale=scale)
    return o if q.dtype == torch.float32 else torch.full_like(o, float("nan"))


for _fn in (declares_per_process, seeded_by_pid, nan_in_fp16):
    _fn.modes = ("prefill",)
seeded_by_pid.dtypes = ("fp32",)
nan_in_fp16.dtypes = ("fp16", "fp32")
