"""The KV-outer route's size bars from a `prefill_heads` sweep (`triton_pairs` and
`triton_kv_outer` rows), written into the device profile's `triton_fwd.prefill`.

The KV-outer forward builds an index whose cost a call does not shrink with the call, so it
wins only from some number of query tokens (B x S) on, and only at few query heads per KV head
(its partials grow with h). Per h and per measured configuration (heads, head dims, selection,
dtype), the bar is the fewest tokens from which its median time beat the pairs kernel's at
every larger measured size; an h whose largest measured size it lost in any configuration has
no route. `kv_outer_max_heads` is the largest h below which every measured h has a bar; an h
not measured takes the bar of the next measured h above it (more heads never cost the
KV-outer forward less)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from selgate.kernels.config import profile_path

from .thresholds import save_profile

KV_OUTER, ROWS = "triton_kv_outer", "triton_pairs"
SHAPE = ("G", "D", "Dv", "L", "dist", "kv_layout", "dtype")  # what a configuration is, besides h and T


@dataclass
class Bars:
    max_heads: int = 0
    min_tokens: dict[int, int] = field(default_factory=dict)
    points: list[tuple] = field(default_factory=list)  # (h, tokens, shape, KV-outer ms, pairs ms)

    def markdown(self) -> str:
        bars = ", ".join(f"h = {h}: {t}" for h, t in self.min_tokens.items()) or "none"
        lines = [
            f"## KV-outer route: kv_outer_max_heads = {self.max_heads}, kv_outer_min_tokens: {bars}",
            "",
            "| h | query tokens | configuration | KV-outer ms | pairs ms | faster |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {h} | {t} | {' '.join(map(str, shape))} | {kv:.3f} | {rows:.3f} | {'KV-outer' if kv < rows else 'pairs'} |"
            for h, t, shape, kv, rows in self.points
        ]
        return "\n".join(lines) + "\n"


def _bar(sizes: dict[int, dict]) -> int | None:
    """The fewest tokens from which KV-outer beat the pairs kernel at every larger size measured
    with both; None when it lost at the largest."""
    bar = None
    for tokens in sorted((t for t, m in sizes.items() if len(m) == 2), reverse=True):
        if sizes[tokens][KV_OUTER] >= sizes[tokens][ROWS]:
            break
        bar = tokens
    return bar


def derive(rows: list[dict]) -> Bars:
    measured: dict[int, dict[tuple, dict[int, dict]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        if r.get("kind") == "prefill" and r["status"] == "ok" and r["method"] in (KV_OUTER, ROWS):
            measured[r["h"]][tuple(r.get(k) for k in SHAPE)][r["B"] * r["S"]][r["method"]] = r["ms"]
    out = Bars()
    per_h = {}
    for h in sorted(measured):
        bars = [_bar(sizes) for sizes in measured[h].values()]
        per_h[h] = None if None in bars or not bars else max(bars)
        out.points += [
            (h, t, shape, m[KV_OUTER], m[ROWS])
            for shape, sizes in measured[h].items()
            for t, m in sorted(sizes.items())
            if len(m) == 2
        ]
    for h in sorted(per_h):  # the contiguous run of winning h from the smallest measured
        if per_h[h] is None:
            break
        out.max_heads = h
    out.min_tokens = {h: next(per_h[m] for m in sorted(per_h) if m >= h) for h in range(1, out.max_heads + 1)}
    return out


def write_profile(bars: Bars, device_name: str, *, source: str) -> Path:
    """Merge the bars into `configs/profiles/<device-slug>.yaml`'s `triton_fwd.prefill` (other
    keys kept); no route measured to win writes `kv_outer_max_heads: 0`, over its class's."""
    path = profile_path(device_name)
    profile = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    prefill = profile.setdefault("triton_fwd", {}).setdefault("prefill", {})
    prefill["kv_outer_max_heads"] = bars.max_heads
    prefill["kv_outer_min_tokens"] = bars.min_tokens
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    prefill["kv_outer_source"] = f"`python -m selgate.bench kv-outer` on {source}, {date}"
    return save_profile(profile, device_name)
