"""CUDA selection decode kernel (S = 1), compiled on first use (SELGATE_CUDA_BUILD=1: at import)."""

from selgate import env_vars

from .decode import selection_attention_cuda
from .launch import DecodeLaunch, Pdl, Prefetch, Schedule

__all__ = ["DecodeLaunch", "Pdl", "Prefetch", "Schedule", "selection_attention_cuda"]

if env_vars.get("SELGATE_CUDA_BUILD"):
    from .build import prebuild

    prebuild()
