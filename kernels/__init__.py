"""The implementations under test and the dispatcher."""

from .dispatch import BACKENDS, selection_attention, selection_attention_varlen
from .policy import capability_override, reload_settings
from .stats import reset_stats, stats

__all__ = [
    "BACKENDS",
    "capability_override",
    "reload_settings",
    "reset_stats",
    "selection_attention",
    "selection_attention_varlen",
    "stats",
]
