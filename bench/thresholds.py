"""The threshold optimiser: a sweep's CSV in, the device profile's measured values out.

`sel_triton_min_L` is the smallest selected length `L` (max over rows, what the
dispatcher compares) from which every measured configuration has the Triton forward at
least `MIN_SPEEDUP` x packed SDPA (a configuration misses the bar only
when it misses at the ends of the two 95% intervals that favour Triton: one stalled sample
of the host must not switch the dispatcher's policy), such that no configuration below
it loses more than `MAX_LOSS` by staying on packed SDPA (i.e. Triton is not more than 10%
faster there). When that is the smallest L measured, the threshold is 0: nothing below it
was measured to favour packed SDPA, and 0 turns the min-L rung off, which also drops the
one host read of the selection per call that the rung costs (a decode step must not
synchronise). When no L meets both, the smallest L meeting the first is taken and the
losses below it are reported; when Triton never qualifies, the threshold is set past any
length (`NEVER`). Launch parameters (`BLOCK_L`, warps, stages) come from the
`triton@BxWxS` variants of the sweep: per kind (decode, prefill; what the kernel reads)
and per L bucket, the variant with the lowest geometric-mean slowdown against the best
variant of each configuration, among those measured on all of them. The bucket is the one
the launch path computes from what the host knows (`launch_bucket`), so the profile's
`triton_fwd.by_L_bucket.<kind>` is read back under the same key.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from selgate.kernels.config import load_config, profile_path
from selgate.kernels.policy import reload_settings

from .baselines import variant_config
from .timing import MIN_SAMPLES

MIN_SPEEDUP = 1.2
MAX_LOSS = 0.10
NEVER = 2**31 - 1


@dataclass
class Decision:
    min_L: int
    per_L: list[tuple[int, int, float]] = field(default_factory=list)  # L, configs, min speedup
    losses: list[str] = field(default_factory=list)
    launch: dict[str, dict] = field(default_factory=dict)  # kind -> launch parameters
    launch_by_bucket: dict[str, dict[int, dict]] = field(default_factory=dict)
    note: str = ""

    def markdown(self) -> str:
        shown = "never (Triton did not qualify)" if self.min_L == NEVER else str(self.min_L)
        lines = [
            f"## Threshold: sel_triton_min_L = {shown}",
            "",
            self.note,
            "",
            "| L | configs | min speedup triton vs sdpa |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {L} | {n} | {s:.2f} |" for L, n, s in self.per_L]
        if self.losses:
            lines += ["", f"Configurations below the threshold where Triton is > {MAX_LOSS:.0%} faster:"]
            lines += [f"- {x}" for x in self.losses]
        for kind, cfg in self.launch.items():
            buckets = ", ".join(f"L<={b}: {_name(c)}" for b, c in sorted(self.launch_by_bucket.get(kind, {}).items()))
            lines.append(f"\nTriton launch ({kind}): {_name(cfg)}; by L bucket: {buckets}")
        return "\n".join(lines) + "\n"


def _name(cfg: dict) -> str:
    return f"BLOCK_L={cfg['block_l']} num_warps={cfg['num_warps']} num_stages={cfg['num_stages']}"


def launch_bucket(r: dict) -> int:
    """The L bucket under which the launch path looks a row's configuration up: the bucket of
    its host-known bound min(S_kv, n * range_len) (kernels/triton/tuning.py), n the row's range
    slots; a row without shape columns (S_kv, dist) is bucketed by its measured L_max."""
    from selgate.kernels.triton.tuning import l_bucket, range_len

    if r.get("S_kv") in (None, "") or (r.get("kind") == "decode" and not r.get("dist")):
        return l_bucket(r["L_max"])

    from .tune import launch_bucket as shape_bucket

    return shape_bucket(r, range_len(load_config(r.get("device") or None)))


def _by_config(rows: list[dict]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            out[r["config"]][r["method"]] = r
    return out


def _best_case_speedup(sdpa: dict, tri: dict) -> float:
    """sdpa / triton at the ends of their 95% intervals that favour Triton: below MIN_SPEEDUP
    the bar is missed beyond the run-to-run noise. Medians where a row has no interval or
    fewer than MIN_SAMPLES samples (its interval would be its min and max, and one fast
    sample would excuse a miss)."""
    if (
        any(r.get(k) is None for r in (sdpa, tri) for k in ("ms_lo", "ms_hi"))
        or min(sdpa.get("iters") or 0, tri.get("iters") or 0) < MIN_SAMPLES
    ):
        return sdpa["ms"] / tri["ms"]
    return sdpa["ms_hi"] / tri["ms_lo"]


def choose_min_L(rows: list[dict]) -> Decision:
    pairs = []  # (L, speedup of the medians, config, best-case speedup)
    for config, methods in _by_config(rows).items():
        if "sdpa" in methods and "triton" in methods:
            sdpa, tri = methods["sdpa"], methods["triton"]
            pairs.append((tri["L_max"], sdpa["ms"] / tri["ms"], config, _best_case_speedup(sdpa, tri)))
    if not pairs:
        return Decision(NEVER, note="No configuration has both `sdpa` and `triton` measured: Triton never qualifies.")
    Ls = sorted({p[0] for p in pairs})
    per_L = []
    for L in Ls:
        at = [p for p in pairs if p[0] == L]
        per_L.append((L, len(at), min(p[1] for p in at)))

    def qualifies(L):
        return all(p[3] >= MIN_SPEEDUP for p in pairs if p[0] >= L)

    def losses(L):
        return [f"{c}: triton {s:.2f}x faster" for l_, s, c, _ in pairs if l_ < L and s > 1 + MAX_LOSS]

    candidates = [L for L in Ls if qualifies(L)]
    clean = [L for L in candidates if not losses(L)]
    rule = (
        f"Rule: smallest L from which triton >= {MIN_SPEEDUP}x packed SDPA on every measured "
        f"configuration (a configuration misses only when the ends of the two 95% intervals that favour "
        f"Triton miss too, as the regression check treats noise), none below it more than {MAX_LOSS:.0%} "
        f"slower on sdpa than on triton; {len(pairs)} configurations with both measured."
    )
    noisy = [f"{c}: medians {s:.2f}x, best case {b:.2f}x" for _, s, c, b in pairs if s < MIN_SPEEDUP <= b]
    if noisy:
        rule += " Within the noise of the bar: " + "; ".join(noisy) + "."
    if clean and clean[0] == Ls[0]:
        return Decision(
            0,
            per_L,
            note=rule + f" Triton qualifies from the smallest L measured ({Ls[0]}): "
            "threshold 0 (rung off, no host read per call).",
        )
    if clean:
        return Decision(clean[0], per_L, note=rule)
    if candidates:
        return Decision(
            candidates[0], per_L, losses(candidates[0]), note=rule + " No L avoids every loss below it; the losses are listed."
        )
    return Decision(NEVER, per_L, note=rule + " No L qualifies: the dispatcher keeps packed SDPA.")


def _best_variant(configs: list[dict[str, dict]]) -> dict | None:
    """Variant with the lowest geometric-mean ms / best-ms over `configs`, measured in every one."""
    names = None
    for methods in configs:
        measured = {m for m in methods if variant_config(m)}
        names = measured if names is None else names & measured
    if not names:
        return None

    def slowdown(name):
        return sum(math.log(c[name]["ms"] / min(c[m]["ms"] for m in names)) for c in configs)

    best = variant_config(min(sorted(names), key=slowdown))
    return {"block_l": best["BLOCK_L"], "num_warps": best["num_warps"], "num_stages": best["num_stages"]}


def choose_launch(rows: list[dict], decision: Decision) -> None:
    by_kind: dict[str, list] = defaultdict(list)
    for methods in _by_config(rows).values():
        if any(variant_config(m) for m in methods):
            by_kind[next(iter(methods.values()))["kind"]].append(methods)
    for kind, configs in by_kind.items():
        best = _best_variant(configs)
        if best is None:
            continue
        decision.launch[kind] = best
        buckets: dict[int, list] = defaultdict(list)
        for c in configs:
            buckets[launch_bucket(next(iter(c.values())))].append(c)
        decision.launch_by_bucket[kind] = {b: cfg for b, cs in sorted(buckets.items()) if (cfg := _best_variant(cs)) is not None}


def derive(rows: list[dict]) -> Decision:
    decision = choose_min_L(rows)
    choose_launch(rows, decision)
    return decision


def write_profile(decision: Decision, device_name: str, *, source: Path, software: str = "", capability=None) -> Path:
    """Merge the decision into `configs/profiles/<device-slug>.yaml` (other keys kept); the
    device's class (from `capability`) says which kinds launch through tensor descriptors."""
    path = profile_path(device_name)
    profile = yaml.safe_load(path.read_text()) if path.exists() else {}
    profile = profile or {}
    profile.setdefault("runtime", {})["sel_triton_min_L"] = decision.min_L
    if decision.launch:
        fwd = profile.setdefault("triton_fwd", {})
        # The `triton@` variants time the gather path: a kind this device reads through
        # tensor descriptors (`tma: true`) keeps the launch parameters measured on that path.
        served = load_config(device_name, capability)["triton_fwd"]
        tma_kinds = {kind for kind, raw in {**served, **fwd}.items() if isinstance(raw, dict) and raw.get("tma")}
        for kind, launch in decision.launch.items():
            if kind not in tma_kinds:
                fwd[kind] = {**(fwd.get(kind) or {}), **launch}
        fwd["by_L_bucket"] = {kind: by for kind, by in decision.launch_by_bucket.items() if kind not in tma_kinds}
    profile["measured"] = {
        "source": str(source),
        "software": software,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "rule": f"triton >= {MIN_SPEEDUP}x sdpa (a miss within the 95% intervals, "
        f">= {MIN_SAMPLES} samples, is noise); <= {MAX_LOSS:.0%} loss below",
    }
    return save_profile(profile, device_name)


def save_profile(profile: dict, device_name: str) -> Path:
    """Write `profile` as the device's measured profile (`bench thresholds`, `bench kv-outer`)
    and drop the settings read from the old one."""
    path = profile_path(device_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Measured profile of {device_name}: written by `python -m selgate.bench thresholds` and `kv-outer`.\n"
        "# Values override its class profile (configs/classes/) and configs/base.yaml on this device;\n"
        "# environment variables override all.\n"
    )
    path.write_text(header + yaml.safe_dump(profile, sort_keys=False))
    reload_settings()
    return path
