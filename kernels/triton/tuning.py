"""Launch parameters of the Triton forward and backward: selection, persisted tuning, autotuning.

Selection, once per key and then a dict lookup (no file read, no yaml, no device read per call):
  1. env override `SELGATE_TRITON_FWD_CONFIG` / `SELGATE_TRITON_BWD_CONFIG`, e.g.
     `BLOCK_L=32,num_warps=8` or `block_n=32,chunk=1024`: the keys given replace the chosen
     ones, verbatim (no shared-memory clamp);
  2. the persisted tuned configs, first that has the key: the device's `configs/tuned/<device-slug>.json`
     (folder: `SELGATE_TRITON_TUNED_DIR`, written by `python -m selgate.bench tune`), its GPU class's
     `configs/classes/<class>.json` (what was tuned for every GPU of that compute capability), the
     first-call autotune's cache (`SELGATE_TRITON_TUNE_CACHE`); a file whose triton version, device
     or class differs from the running one is ignored, with the reason logged once and kept in
     `tuning_status()`; `SELGATE_TRITON_TUNED=0` ignores them all;
  3. the profile's `triton_fwd.by_L_bucket.<kind>` (the threshold optimiser writes it);
  4. the profile/base `triton_fwd.<kind>` (forward) or `bwd.default_config` (backward).
  Profile values (3, 4) shrink to the forward's shared-memory budget as before; the profile is
  base.yaml < class < device (kernels/config.py).
Key: (op, kind, Dk, Dv, L bucket, dtype); kind is decode (S == 1), prefill or interpreter (CPU).
A key without an entry in a table takes the table's nearest bucket at or above, else the largest.
L bucket: l_bucket(min(S_kv, n * range_len)), range_len = NSA's l_sel: a bound on L the host knows, no device read.
(range_len: configs `triton_tuning.range_len`, default 64, env `SELGATE_TRITON_RANGE_LEN`; builder ranges are at most
n blocks of l_sel keys, so the bound holds for them; for other ranges it only picks the launch parameters.)

Autotuning (`autotune_mode`): `SELGATE_TRITON_AUTOTUNE=1` tunes any key that has neither an env
override nor a tuned entry on its first call (the full search space, forward and backward), keeps
the result for the process and does not write it; `=0` never tunes. Unset, a GPU whose device
and class profiles measured nothing (served_by "none": an sm80 or sm89 card, an unknown class)
gets the first-call autotune: a forward key with no tuned entry times FIRST_CALL_FWD_SPACE (four
configs) on its first call, at most FIRST_CALL_BUDGET_S seconds a process in all, and writes the
winner to the user's cache, which later processes read. A GPU with a measured profile never
tunes inside a call, nor does any call during CUDA-graph capture or under the interpreter. The
warm-up command `python -m selgate.bench tune` tunes ahead of time and writes the device file.

The forward is tuned by Triton's own `triton.autotune` over `triton.Config`s (BLOCK_L, warps,
stages; configs over the shared-memory budget pruned). The backward is tuned at the wrapper:
its KV tile `block_n` and `chunk` size the host-built inverse index and the grid, which a
kernel-level autotuner cannot vary, so each candidate runs the whole `triton_backward`.

reset_to_zero: no kernel accumulates into its output, so none is needed. The forward stores
`o` and `lse` once per program; the backward's delta, dq, dk/dv (direct, or fp32 partial slots)
and partial-reduce kernels all store, and `triton_backward` zero-fills dk and dv (tiles no row
selects) on every call before its launches. A benchmark repetition therefore rewrites the same
values; tests/kernels/test_triton_tuning.py proves outputs do not depend on what the buffers held or
on which configs ran before.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from pathlib import Path

import torch

from selgate.kernels import config as _config
from selgate.kernels.config import current_device_name, device_slug, load_config
from selgate import env_vars
from selgate.errors import ConfigError

log = logging.getLogger("selgate.kernels")

FORMAT = 1
ENV_FWD = "SELGATE_TRITON_FWD_CONFIG"
ENV_BWD = "SELGATE_TRITON_BWD_CONFIG"
ENV_AUTOTUNE = "SELGATE_TRITON_AUTOTUNE"
ENV_TUNED = "SELGATE_TRITON_TUNED"
ENV_TUNED_DIR = "SELGATE_TRITON_TUNED_DIR"
ENV_CACHE_DIR = "SELGATE_TRITON_TUNE_CACHE"
ENV_RANGE_LEN = "SELGATE_TRITON_RANGE_LEN"
ENV_TMA = "SELGATE_TRITON_TMA"
ENV_PAIRS = "SELGATE_TRITON_PAIRS"
ENV_KV_OUTER = "SELGATE_TRITON_KV_OUTER"
DEFAULT_RANGE_LEN = 64
FWD_KEYS = ("BLOCK_L", "num_warps", "num_stages")
BWD_KEYS = (
    "dq_block_n",
    "dq_warps",
    "dq_stages",
    "dq_tma",
    "dq_tail_n",
    "block_n",
    "block_m",
    "warps",
    "stages",
    "chunk",
    "overlap",
    "dq_kv_outer_max_heads",
)

# The first-call autotune's budget: a few forward configs a key (each a compile and ~30 ms of
# timing), and no more keys once a process has spent FIRST_CALL_BUDGET_S on it.
FIRST_CALL_FWD_SPACE = ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 8, 3))
FIRST_CALL_BUDGET_S = 30.0
# Forward search space: BLOCK_L x (warps, stages); configs over the smem budget are pruned.
FWD_SPACE = tuple((b, w, s) for b in (16, 32, 64, 128) for w, s in ((4, 2), (4, 3), (8, 2), (8, 3)))
# Backward: one factor at a time around the defaults, then the per-axis winners combined.
BWD_AXES = {
    "dq_block_n": (16, 32, 64, 128),
    "dq_warps": (4, 8),
    "block_n": (16, 32, 64, 128),
    "block_m": (16, 32, 64, 128),
    "warps": (4, 8),
    "stages": (1, 2, 3, 5, 7),
    "chunk": (512, 2048, 8192),
}


def l_bucket(L: int) -> int:
    """L bucket: the next power of two >= L, at least 16."""
    return max(16, 1 << max(int(L) - 1, 0).bit_length())


def range_len(cfg: dict | None = None) -> int:
    """Longest range the host assumes (NSA's l_sel): env SELGATE_TRITON_RANGE_LEN > configs > 64."""
    cfg = load_config() if cfg is None else cfg
    return int(env_vars.get(ENV_RANGE_LEN, (cfg.get("triton_tuning") or {}).get("range_len", DEFAULT_RANGE_LEN)))


def shape_bucket(S_kv: int, n: int, rl: int | None = None) -> int:
    """The L bucket of a launch with S_kv keys and n range slots (module docstring)."""
    return l_bucket(min(S_kv, n * (range_len() if rl is None else rl)))


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def kind_of(device: torch.device, S: int) -> str:
    return "interpreter" if device.type == "cpu" else "decode" if S == 1 else "prefill"


def parse_override(text: str, keys: tuple[str, ...], env: str) -> dict:
    """'BLOCK_L=32, num_warps=8' (or a JSON object) -> {'BLOCK_L': 32, 'num_warps': 8}."""
    text = text.strip()
    try:
        pairs = (item.split("=", 1) for item in text.split(",") if item.strip())
        out = json.loads(text) if text.startswith("{") else dict(pairs)
        out = {k.strip(): int(v) for k, v in out.items()}
    except (ValueError, TypeError):
        raise ConfigError(f"{env}={text!r}: expected KEY=INT pairs separated by commas, keys from {keys}") from None
    bad = set(out) - set(keys)
    if bad:
        raise ConfigError(f"{env}={text!r}: unknown keys {sorted(bad)}; expected some of {keys}")
    return out


def nearest_bucket(buckets, b: int):
    """The smallest bucket >= b, else the largest; None when there is none."""
    buckets = sorted(int(x) for x in buckets)
    if not buckets:
        return None
    return next((x for x in buckets if x >= b), buckets[-1])


# ---- persisted tuned configs -------------------------------------------------------------


def tuned_dir() -> Path:
    return env_vars.get(ENV_TUNED_DIR) or _config.CONFIG_DIR / "tuned"


def tuned_path(device_name: str | None = None, folder: Path | None = None) -> Path:
    return Path(folder or tuned_dir()) / f"{device_slug(device_name or current_device_name())}.json"


def class_tuned_path(cls: str) -> Path:
    """The tuned launches of a GPU class, beside its profile: configs/classes/<class>.json."""
    return _config.CONFIG_DIR / "classes" / f"{cls}.json"


def cache_tuned_path(device_name: str | None = None) -> Path:
    """Where the first-call autotune keeps its results for this device (the user's cache)."""
    return Path(env_vars.get(ENV_CACHE_DIR)) / f"{device_slug(device_name or current_device_name())}.json"


def triton_version() -> str:
    import triton

    return triton.__version__


def entry_key(e: dict) -> tuple:
    return (e["op"], e["kind"], int(e["Dk"]), int(e["Dv"]), e["dtype"])


def read_tuned(
    path: Path, *, device_name: str | None = None, cls: str | None = None, version: str, rl: int | None = None
) -> tuple[dict, str | None]:
    """Table {(op, kind, Dk, Dv, dtype): {bucket: config}} of a tuned file, and why it is
    ignored (None when used). A device file must name `device_name`, a class file (`cls`) its
    class. Its buckets depend on range_len: a file of another is ignored."""
    if not path.exists():
        return {}, f"no tuned file {path}"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {}, f"{path}: unreadable ({e})"
    if data.get("format") != FORMAT:
        return {}, f"{path}: format {data.get('format')!r}, expected {FORMAT}"
    if data.get("triton") != version:
        return {}, (
            f"{path}: tuned with triton {data.get('triton')}, running triton {version}; "
            "ignored (re-run `python -m selgate.bench tune`)"
        )
    if cls is not None:
        if data.get("class") != cls:
            return {}, f"{path}: tuned for class {data.get('class')!r}, running a {cls} GPU; ignored"
    elif device_slug(str(data.get("device", ""))) != device_slug(device_name):
        return {}, f"{path}: tuned on {data.get('device')!r}, running on {device_name!r}; ignored"
    rl = range_len() if rl is None else rl
    if data.get("range_len") != rl:
        return {}, f"{path}: buckets of range_len {data.get('range_len')}, running with range_len {rl}; ignored"
    table: dict = {}
    for e in data.get("entries", []):
        table.setdefault(entry_key(e), {})[int(e["L_bucket"])] = dict(e["config"])
    return table, None


def write_tuned(
    path: Path, entries: list[dict], *, device_name: str, version: str | None = None, extra: dict | None = None, clear=True
) -> Path:
    """Merge `entries` into the tuned file at `path` (same key and bucket: replaced). A file of
    another triton version or device is replaced, not merged. Written atomically; `clear`
    forgets this process's selections (the first-call autotune, which already holds its
    result, keeps them)."""
    version = version or triton_version()
    old = []
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("triton") == version and device_slug(str(data.get("device", ""))) == device_slug(device_name):
                old = data.get("entries", [])
        except (OSError, ValueError):
            pass
    merged = {(*entry_key(e), int(e["L_bucket"])): e for e in [*old, *entries]}
    data = {
        "format": FORMAT,
        "device": device_name,
        "triton": version,
        "torch": torch.__version__,
        "range_len": range_len(),
        "written": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **(extra or {}),
        "entries": [merged[k] for k in sorted(merged)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    if clear:
        clear_cache()
    return path


# ---- per-process state: everything below the first call of a key is a dict lookup ----------


class _State:
    def __init__(self, owner):
        self.owner = owner  # the load_config() dict this state was built from
        self.range_len = range_len(owner)
        self.cache: dict = {}
        self.tables: list | None = None  # [(label, table)] of the tuned files in force, first wins (lazy)
        self.sources: list = []  # what tuning_status() says of each tuned file
        self.session: dict = {}  # autotune results of this process
        self.autotune_s = 0.0  # seconds the first-call autotune spent in this process
        self.last: dict = {}
        self.plans: dict = {}  # fwd.triton_forward's launch plans, dropped with this state
        self.env_fwd = env_vars.get(ENV_FWD)  # read once per state: no environ access per call
        self.env_bwd = env_vars.get(ENV_BWD)
        for text, keys, name in ((self.env_fwd, FWD_KEYS, ENV_FWD), (self.env_bwd, BWD_KEYS, ENV_BWD)):
            if text:  # malformed is an error on every path, also those (TMA, pairs) that never apply it
                parse_override(text, keys, name)
        kinds = {kind: raw for kind, raw in owner["triton_fwd"].items() if isinstance(raw, dict) and "block_l" in raw}
        self.tma = {kind: env_vars.get(ENV_TMA, bool(raw.get("tma", False))) for kind, raw in kinds.items()}  # read once
        self.pairs = {kind: env_vars.get(ENV_PAIRS, bool(raw.get("pairs", False))) for kind, raw in kinds.items()}
        self.kv_outer = {kind: kv_outer_route(kind, raw) for kind, raw in kinds.items()}


def kv_outer_route(kind: str, raw: dict) -> tuple[int, dict]:
    """(most query heads per KV head, {h: fewest query tokens a call}) of a kind's KV-outer
    route: `kv_outer_max_heads` and `kv_outer_min_tokens` (the index's fixed cost makes short
    calls slower than the row kernels). SELGATE_TRITON_KV_OUTER forces the route at every size."""
    forced = env_vars.get(ENV_KV_OUTER)
    if forced is not None:
        return forced, {}
    bars = raw.get("kv_outer_min_tokens") or {}
    if not isinstance(bars, dict) or not all(
        type(h) is int and h > 0 and type(t) is int and t >= 0
        for h, t in bars.items()  # bool is not an int here
    ):
        raise ConfigError(
            f"triton_fwd.{kind}.kv_outer_min_tokens: expected a mapping of query heads per KV head (int > 0) "
            f"to the fewest query tokens a call (int >= 0), got {bars!r}"
        )
    return int(raw.get("kv_outer_max_heads", 0)), dict(bars)


_state: _State | None = None


def current_state() -> _State:
    """The selection state of the current config (a new one after `reload_settings()`)."""
    global _state
    cfg = load_config()
    if _state is None or _state.owner is not cfg:
        _state = _State(cfg)
    return _state


def is_current(state: _State) -> bool:
    """Whether `state` is still the selection state in force (no clear since it was made)."""
    return state is _state


def clear_cache() -> None:
    """Forget cached selections, the tuned table and the env overrides read (they are read
    once, at the first selection after this or after `policy.reload_settings()`)."""
    global _state
    _state = None


def _tables(st: _State) -> list:
    """[(label, table)]: the device's tuned file, then its class's, then the first-call
    autotune's cache; a key takes the first table that has it."""
    if st.tables is None:
        st.tables, st.sources = [], []
        if not env_vars.get(ENV_TUNED):
            st.sources.append({"kind": "all", "path": None, "used": False, "reason": f"{ENV_TUNED}=0", "keys": 0})
            return st.tables
        prof = st.owner["_profile"]
        name, cls, version = prof["device_name"], prof["class"], triton_version()
        files = [("device", tuned_path(name), dict(device_name=name))]
        if cls:
            files.append(("class", class_tuned_path(cls), dict(cls=cls)))
        files.append(("cache", cache_tuned_path(name), dict(device_name=name)))
        for kind, path, expect in files:
            table, reason = read_tuned(path, version=version, rl=st.range_len, **expect)
            if reason and path.exists():
                log.warning("sel.triton.tuned_ignored reason=%s", reason)
            st.sources.append({"kind": kind, "path": str(path), "used": reason is None, "reason": reason, "keys": len(table)})
            if reason is None:
                st.tables.append((f"tuned ({kind}) {path}", table))
    return st.tables


def tuning_status() -> dict:
    """Which tuned files serve (device, class, first-call cache) or why not, which profile
    files served the launch parameters, the autotune mode, the last selections."""
    st = current_state()
    _tables(st)
    used = [s for s in st.sources if s["used"]]
    return {
        "served_by": used[0]["kind"] if used else "none",
        "path": used[0]["path"] if used else None,
        "used": bool(used),
        "reason": None if used else "; ".join(s["reason"] for s in st.sources),
        "keys": sum(s["keys"] for s in used),
        "files": [dict(s) for s in st.sources],
        "profile": dict(st.owner["_profile"]),
        "autotune": autotune_mode(st),
        "autotune_s": round(st.autotune_s, 3),
        "session_keys": len(st.session),
        "last": dict(st.last),
    }


def autotune_mode(st: _State) -> str:
    """'on' (SELGATE_TRITON_AUTOTUNE=1: any key without a tuned entry, the full search), 'off',
    or 'first-call' (unset, on a GPU whose device and class profiles measured no launches: a few
    forward configs per key within FIRST_CALL_BUDGET_S a process, persisted in the user's cache)."""
    flag = env_vars.get(ENV_AUTOTUNE)
    if flag is not None:
        return "on" if flag else "off"
    return "first-call" if st.owner["_profile"]["served_by"] == "none" and torch.cuda.is_available() else "off"


def last_choice(op: str = "fwd") -> tuple | None:
    """(key, config, source) of the latest selection for op 'fwd' or 'bwd'."""
    return current_state().last.get(op)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _lookup(st: _State, op, kind, Dk, Dv, dtype, b):
    """(config, source) from the session's autotune results or the tuned file, else None."""
    if b is None or dtype is None:
        return None
    k = (op, kind, Dk, Dv, dtype_name(dtype))
    for label, table in (("autotuned in this process", st.session), *_tables(st)):
        pick = nearest_bucket(table.get(k, {}), b)
        if pick is not None:
            return dict(table[k][pick]), f"{label} L<={pick}"
    return None


def last_kept(op: str) -> bool:
    """Whether the last selection of `op` is kept for its key; a default used during CUDA-graph
    capture is not (the next call outside capture tunes), so a caller must not keep it either."""
    st = current_state()
    last = st.last.get(op)
    return last is not None and last[0] in st.cache


def _select(op, key, resolve, tune, keys, env_name, env):
    st = current_state()
    hit = st.cache.get(key)
    if hit is None:
        cfg, source = resolve(st)
        tuned = source.startswith(("tuned", "autotuned"))
        mode = "off" if tune is None or env or tuned else autotune_mode(st)
        # a kind the profile reads through tensor descriptors ignores tuned entries (resolve)
        first_call = mode == "first-call" and op == "fwd" and key[1] != "interpreter" and not st.tma.get(key[1], False)
        if first_call and st.autotune_s >= FIRST_CALL_BUDGET_S:
            log.info("sel.triton.autotune_skipped reason=first-call budget %ss spent key=%s", FIRST_CALL_BUDGET_S, key)
        elif mode == "on" or first_call:
            if _capturing():
                log.info("sel.triton.autotune_skipped reason=cuda graph capture key=%s", key)
                st.last[op] = (key, cfg, source)
                return dict(cfg)  # not cached: tune on the next call outside capture
            t0 = time.perf_counter()
            best = tune(cfg, FIRST_CALL_FWD_SPACE) if first_call else tune(cfg)
            st.autotune_s += time.perf_counter() - t0
            kind, Dk, Dv, item, dtype, b = key[1:7]
            st.session.setdefault((op, kind, Dk, Dv, dtype_name(dtype)), {})[b] = best
            if first_call:
                _persist_first_call(st, op, kind, Dk, Dv, dtype, b, best)
            cfg, source = resolve(st)
        if env:
            cfg = {**cfg, **parse_override(env, keys, env_name)}
            source = f"env {env_name} over {source}"
        hit = st.cache[key] = (cfg, source)
    st.last[op] = (key, *hit)
    return dict(hit[0])


def _persist_first_call(st: _State, op, kind, Dk, Dv, dtype, b, best) -> None:
    """Keep a first-call result in the user's cache for the next process; a cache that cannot
    be written costs the next process another tune, never this call."""
    name = st.owner["_profile"]["device_name"]
    entry = {"op": op, "kind": kind, "Dk": Dk, "Dv": Dv, "L_bucket": b, "dtype": dtype_name(dtype), "config": best}
    try:
        write_tuned(cache_tuned_path(name), [entry], device_name=name, extra={"command": "first-call autotune"}, clear=False)
    except OSError as e:
        log.warning("sel.triton.autotune_cache_unwritable path=%s error=%s", cache_tuned_path(name), e)


def profile_fwd_config(cfg_all: dict, Dk: int, Dv: int, item: int, kind: str, b: int | None) -> tuple[dict, str]:
    """(config, source) from configs/ alone: `triton_fwd.by_L_bucket.<kind>` (nearest bucket),
    else `triton_fwd.<kind>`, shrunk to the shared-memory budget."""
    from .tiles import fit_smem

    fwd = cfg_all["triton_fwd"]
    raw, source = fwd[kind], f"configs triton_fwd.{kind}"
    by_bucket = {int(k): v for k, v in ((fwd.get("by_L_bucket") or {}).get(kind) or {}).items()}
    pick = nearest_bucket(by_bucket, b) if b is not None else None
    if pick is not None:
        raw, source = by_bucket[pick], f"configs triton_fwd.by_L_bucket.{kind}.{pick}"
    cfg = {"BLOCK_L": int(raw["block_l"]), "num_warps": int(raw["num_warps"]), "num_stages": int(raw["num_stages"])}
    return fit_smem(cfg, Dk, Dv, item, fwd["smem_budget_kb"]), source


def fwd_config(Dk: int, Dv: int, item: int, kind: str, *, dtype=None, S_kv=None, n=None, tune=None) -> dict:
    """Launch parameters {BLOCK_L, num_warps, num_stages} of the forward (module docstring).
    `tune(default) -> config` runs when SELGATE_TRITON_AUTOTUNE=1 and the key has no entry."""
    st = current_state()
    b = l_bucket(min(S_kv, n * st.range_len)) if S_kv is not None and n is not None else None
    env = st.env_fwd
    key = ("fwd", kind, Dk, Dv, item, dtype, b, env)
    hit = st.cache.get(key)
    if hit is not None:  # the hot path
        st.last["fwd"] = (key, *hit)
        return dict(hit[0])

    def resolve(st):
        from .tiles import MIN_DOT

        # Tuned entries time the gather path: a kind the profile runs through tensor
        # descriptors (TMA) keeps the profile's parameters, measured on that path.
        tma = st.tma.get(kind, False)
        cfg, source = (None if tma else _lookup(st, "fwd", kind, Dk, Dv, dtype, b)) or profile_fwd_config(
            st.owner, Dk, Dv, item, kind, b
        )
        tail = int(st.owner["triton_fwd"][kind].get("tail_l", cfg["BLOCK_L"]))
        return {
            **cfg,
            "TMA": tma,
            "TAIL_L": max(MIN_DOT, tail),
            "PAIRS": st.pairs.get(kind, False),
            "KV_OUTER_MAX_HEADS": st.kv_outer.get(kind, (0, {}))[0],
            "KV_OUTER_MIN_TOKENS": st.kv_outer.get(kind, (0, {}))[1],
        }, source

    return _select("fwd", key, resolve, tune, FWD_KEYS, ENV_FWD, env)


def bwd_config(Dk: int, Dv: int, dtype, kind: str, *, S_kv=None, n=None, default, tune=None) -> dict:
    """Backward launch parameters (bwd.launch_config's keys); `default(Dk, Dv, dtype)` gives
    the built-in values."""
    st = current_state()
    b = l_bucket(min(S_kv, n * st.range_len)) if S_kv is not None and n is not None else None
    env = st.env_bwd
    key = ("bwd", kind, Dk, Dv, None, dtype, b, env)
    hit = st.cache.get(key)
    if hit is not None:
        st.last["bwd"] = (key, *hit)
        return dict(hit[0])

    def resolve(st):
        found = _lookup(st, "bwd", kind, Dk, Dv, dtype, b)
        if found:
            return {**default(Dk, Dv, dtype), **found[0]}, found[1]
        return default(Dk, Dv, dtype), "bwd.default_config"

    return _select("bwd", key, resolve, tune, BWD_KEYS, ENV_BWD, env)


# ---- tuning ----------------------------------------------------------------------------------


def cpu_bench(fn, quantiles=None, reps: int = 1):
    """A do_bench for CPU tensors (the interpreter): one warm call, then `reps` timed ones."""
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    ms = (time.perf_counter() - t0) * 1e3 / reps
    return [ms] * len(quantiles) if quantiles else ms


def device_bench(device: torch.device, *, warmup_ms: float = 5, rep_ms: float = 25):
    """do_bench(fn, quantiles) for `device`: triton.testing.do_bench on a GPU, else cpu_bench."""
    if device.type != "cuda":
        return cpu_bench
    import triton.testing

    return lambda fn, quantiles=None: triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=quantiles)


def _median(t) -> float:
    return float(t[0] if isinstance(t, (list, tuple)) else t)


def fwd_autotuner(kernel, space, do_bench, smem_budget_kb: int | None = None):
    """`triton.autotune` over `space` [(BLOCK_L, warps, stages)] wrapping the forward `kernel`:
    a fresh tuner per key (its in-memory cache is the key), no reset_to_zero (the kernel only
    stores), configs over the shared-memory budget pruned before benchmarking."""
    import triton

    from .tiles import smem_fits

    budget = load_config()["triton_fwd"]["smem_budget_kb"] if smem_budget_kb is None else smem_budget_kb
    configs = [triton.Config({"BLOCK_L": b}, num_warps=w, num_stages=s) for b, w, s in space]

    def prune(configs, nargs, **kw):
        item = nargs["q_ptr"].element_size()
        ok = [c for c in configs if smem_fits(c.kwargs["BLOCK_L"], c.num_stages, kw["DK_PAD"], kw["DV_PAD"], item, budget)]
        return ok or configs[:1]

    return triton.autotune(
        configs=configs, key=[], reset_to_zero=None, prune_configs_by={"early_config_prune": prune}, do_bench=do_bench
    )(kernel)


def config_of(c) -> dict:
    """triton.Config -> {'BLOCK_L', 'num_warps', 'num_stages'}."""
    return {"BLOCK_L": int(c.kwargs["BLOCK_L"]), "num_warps": int(c.num_warps), "num_stages": int(c.num_stages)}


def tune_fwd(run, *, kernel, default: dict, space=None, do_bench=cpu_bench) -> dict:
    """Tune the forward `kernel` (fwd.py's, handed in: this module never imports the kernels it
    tunes) on one input: `run(tuner)` launches `triton_forward` through `tuner` (a
    `triton.autotune` wrapper over `space`, default FWD_SPACE, plus `default`).
    Returns {'config', 'ms', 'default_ms', 'timings': {name: ms}}."""
    space = FWD_SPACE if space is None else space
    space = list(dict.fromkeys([*space, (default["BLOCK_L"], default["num_warps"], default["num_stages"])]))
    tuner = fwd_autotuner(kernel, space, do_bench)
    run(tuner)
    timings = {c: _median(t) for c, t in getattr(tuner, "configs_timings", {}).items()}
    best = config_of(tuner.best_config)
    named = {"{BLOCK_L}x{num_warps}x{num_stages}".format(**config_of(c)): ms for c, ms in timings.items()}
    d = "{BLOCK_L}x{num_warps}x{num_stages}".format(**default)
    return {
        "config": best,
        "ms": named.get("{BLOCK_L}x{num_warps}x{num_stages}".format(**best)),
        "default_ms": named.get(d),
        "timings": named,
    }


def bwd_candidates(default: dict, axes: dict) -> list[dict]:
    """The default, then each axis varied alone (one factor at a time)."""
    out = [dict(default)]
    for k, values in axes.items():
        out += [{**default, k: v} for v in values if v != default.get(k)]
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = 1e-4 if a.dtype == torch.float32 else 2e-2
    a, b = a.float(), b.float()
    return bool(torch.isfinite(a).all()) and float((a - b).abs().max()) <= tol * (float(b.abs().max()) + 1)


def tune_bwd(run, *, default: dict, axes: dict | None = None, do_bench=cpu_bench) -> dict:
    """Tune the backward: `run(config)` runs `triton_backward` with that config and returns
    (dq, dk, dv). One factor at a time, then the per-axis winners combined; a candidate that
    fails to compile or disagrees with the default beyond tolerance is dropped."""
    axes = BWD_AXES if axes is None else axes
    ref = [t.clone() for t in run(default)]

    def time_it(cfg):
        try:
            got = run(cfg)
            if not all(_close(g, r) for g, r in zip(got, ref)):
                return float("inf"), "mismatch"
            return _median(do_bench(lambda: run(cfg), quantiles=(0.5, 0.2, 0.8))), ""
        except Exception as e:  # out of resources, bad tile combination: not a candidate
            return float("inf"), f"{type(e).__name__}"

    timings = {}
    for cfg in bwd_candidates(default, axes):
        timings[_bwd_name(cfg)] = (time_it(cfg), cfg)
    combined = dict(default)
    for k in axes:
        best_k = min(
            (v for v in timings.values() if all(v[1][j] == default[j] for j in default if j != k)), key=lambda v: v[0][0]
        )
        combined[k] = best_k[1][k]
    if _bwd_name(combined) not in timings:
        timings[_bwd_name(combined)] = (time_it(combined), combined)
    name, ((ms, _), cfg) = min(timings.items(), key=lambda kv: kv[1][0][0])
    return {
        "config": cfg,
        "ms": ms,
        "default_ms": timings[_bwd_name(default)][0][0],
        "timings": {n: (t[0] if not t[1] else t[1]) for n, (t, _) in timings.items()},
    }


def _bwd_name(cfg: dict) -> str:
    return ",".join(f"{k}={cfg[k]}" for k in BWD_KEYS if k in cfg)
