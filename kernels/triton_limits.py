"""What the Triton kernels take: the one statement of their limits, which the dispatcher,
the kernels and the conformance registry read. It lives outside `triton/` because importing
that package imports triton, and the dispatcher and the registry must read these limits on
machines without it."""

from __future__ import annotations

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 256
BF16_INTERPRETER = "bf16 under TRITON_INTERPRET computes wrongly (triton-lang/triton#11584)"

TMA_MIN_CAPABILITY = (9, 0)  # tensor descriptors

# The Gluon pair forward (triton/pairs.py): measured and built for Hopper only.
PAIRS_DTYPES = (torch.float16, torch.bfloat16)
PAIRS_HEAD_DIMS = (64, 128)  # Dk == Dv, one of these
PAIRS_MAX_HEADS = 16  # heads padded to the MMA's 16 rows
PAIRS_CAPABILITY_MAJOR = 9


def unsupported(q, Dk: int, Dv: int, interpreting: bool):
    """Why no Triton kernel takes inputs like `q` with these head dims, as `(reason, detail)`,
    or None. Device and dtype rules only; capability and policy are the dispatcher's."""
    if q.device.type != "cuda" and not interpreting:
        return "device", f"q is on {q.device}; Triton needs a CUDA device or TRITON_INTERPRET=1"
    if q.dtype not in DTYPES:
        return "dtype", f"q.dtype={q.dtype}; the Triton kernel takes fp16, bf16 or fp32"
    if q.dtype == torch.bfloat16 and q.device.type != "cuda":
        return "dtype", BF16_INTERPRETER
    for name, d in (("Dk", Dk), ("Dv", Dv)):
        if d % HEAD_DIM_MULTIPLE or d > MAX_HEAD_DIM:
            return "head_dim", (f"{name}={d}; the Triton kernel takes multiples of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}")
    return None
