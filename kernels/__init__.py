"""The implementations under test and the dispatcher.

The names below load on first use (PEP 562): importing `selgate.kernels.config` (the lane
runner, the gate, `selgate check`'s verdict process) then costs no torch
import, about 2.4 s of CPU on the 2-core CPU lane machine."""

import importlib

# Eager: a function named as its module would otherwise be shadowed by the module once
# `selgate.kernels.stats` is imported (the import system sets the package attribute).
from .stats import reset_stats as reset_stats, stats as stats

_EXPORTS = {
    "BACKENDS": ".dispatch",
    "selection_attention": ".dispatch",
    "selection_attention_varlen": ".dispatch",
    "capability_override": ".policy",
    "reload_settings": ".policy",
}

__all__ = sorted([*_EXPORTS, "reset_stats", "stats"])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
