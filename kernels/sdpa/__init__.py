"""The packed-SDPA production path."""

from .packed import selection_attention_sdpa

__all__ = ["selection_attention_sdpa"]
