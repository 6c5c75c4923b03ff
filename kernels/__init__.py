"""The implementations under test and the dispatcher."""
from .dispatch import selection_attention

__all__ = ["selection_attention"]
