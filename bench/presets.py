"""The issue's benchmark matrices, sized so the full H100 sweep stays under six minutes.

`issue4`: the forward issue's acceptance settings (decode bf16 N=1024, h=8, D=Dv=128,
L in {512, 1024}; prefill bf16 B=1, T=65536, 64 heads in 4 groups, D=Dv=128, 16 blocks
of 64). `seed`: H in {4, 8}, D, Dv in {64, 128}, L in {16..1024}, N in {64, 256, 1024},
few/many/mixed (504 decode configurations, few timed calls each). `full`: both.
"""
from __future__ import annotations

import itertools

from .inputs import DISTS, Problem, decode_problem, prefill_problem
from .sweep import Settings

SEED_L = (16, 32, 64, 128, 256, 512, 1024)


def issue4(dtype: str = "bfloat16") -> list[tuple[str, list[Problem], Settings]]:
    decode = [decode_problem(1024, 8, 128, 128, L, dist, dtype) for L in (512, 1024) for dist in ("few", "many")]
    prefill = [prefill_problem(65536, 64, 4, 128, 128, 64, 16, dtype)]
    return [("issue4-decode", decode, Settings(warmup=10, iters=100)),
            ("issue4-prefill", prefill, Settings(warmup=2, iters=10, max_seconds=4.0))]


def seed(dtype: str = "bfloat16") -> list[tuple[str, list[Problem], Settings]]:
    problems = [decode_problem(N, H, D, Dv, L, dist, dtype)
                for N, H, D, Dv, L, dist in itertools.product((64, 256, 1024), (4, 8), (64, 128), (64, 128), SEED_L,
                                                              DISTS)]
    return [("seed", problems, Settings(warmup=3, iters=15, max_seconds=0.5))]


PRESETS = {"issue4": issue4, "seed": seed, "full": lambda dtype="bfloat16": issue4(dtype) + seed(dtype)}
