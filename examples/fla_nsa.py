"""fla-core's NSA selection kernel (`fla.ops.nsa.parallel.parallel_nsa`, PyPI `fla-core`)
made a selgate implementation: its block-index form wrapped by selgate's padded adapter.

    selgate check fla_nsa:selection --declare fla_nsa.yaml --size small

`parallel_nsa` takes q [B, T, HQ, D], k/v [B, T_kv, H, D], `block_indices` [B, T, H, S]
(-1 padded) and `block_counts` [B, T, H]; its backward needs as many queries as keys, so
the adapter hands it every position (`full_queries=True`) and keeps the last T outputs.
Without `g_cmp` and `window_size` it computes the selected branch alone, the function
SPEC.md defines; with `block_indices` given it warns that they override its own top-n,
which is the point here."""

from __future__ import annotations

import warnings

from fla.ops.nsa.parallel import parallel_nsa

from selgate.conformance.adapters import padded_block_kernel

BLOCK_SIZE = 64


def _parallel_nsa(q, k, v, **kw):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*block_indices.*is provided")
        return parallel_nsa(q, k, v, **kw)


selection = padded_block_kernel(_parallel_nsa, BLOCK_SIZE, full_queries=True)
