"""CUDA selection decode kernel (S = 1), compiled on first use (NSA_SEL_CUDA_BUILD=1: at import)."""
import os

from .decode import selection_attention_cuda

__all__ = ["selection_attention_cuda"]

if os.environ.get("NSA_SEL_CUDA_BUILD") == "1":
    from .build import prebuild

    prebuild()
