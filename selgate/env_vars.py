"""Every `SELGATE_*` environment variable selgate reads, declared once.

Each entry has a name, a type, a default, a meaning and the files that read it. Code reads a
variable through `get`, so one value means the same everywhere: flags accept 1/0, true/false,
yes/no, on/off in any case, an empty value counts as unset, and a malformed value raises
`ConfigError` naming the variable, the value and what was expected.

Names: `SELGATE_`, then the part a variable configures when it configures one (`TRITON_`,
`CUDA_`, `BENCH_`, `DOCKER_`), then what it sets. selgate reads its own namespace only: another
project's variables (nsa-vibe's `NSA_*` flags, set by someone validating it) change nothing here.
`python -m selgate.env_vars --markdown` writes docs/configuration.md from this table.

It lives in the kernel package because the kernels read it and may import nothing from the
rest of selgate; everything else may import it.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Var:
    """One environment variable. `default` is what `get` returns when it is unset; None with
    `default_doc` saying where the reader takes its default from (configs, another path)."""

    name: str
    type: str  # flag, int, float, str, path
    default: object
    meaning: str
    readers: tuple[str, ...]
    group: str
    default_doc: str = ""


def _flag(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise ConfigError(f"{name}: expected one of {TRUE + FALSE}, got {raw!r}")


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None


def _float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError(f"{name}: expected a finite number, got {raw!r}")
    return value


# Each parser takes the variable's name (for its error message) and the raw text.
PARSERS = {"flag": _flag, "int": _int, "float": _float, "str": lambda name, raw: raw, "path": lambda name, raw: Path(raw)}

GROUPS = {
    "dispatcher": "Dispatcher: which backend serves a call",
    "triton": "Triton launch configuration",
    "cuda": "CUDA decode extension build",
    "paths": "Configuration files",
    "lanes": "Lanes and reports",
    "bench": "Benchmarks",
    "setup": "Setup and CI scripts",
}

_K = "kernels/"
VARS: dict[str, Var] = {
    v.name: v
    for v in (
        # Dispatcher (tests clear exactly these for a known state: `policy.ENV_FLAGS`).
        Var(
            "SELGATE_TRITON_ENABLE",
            "flag",
            None,
            'Let `backend="auto"` use the Triton selection kernel.',
            (_K + "policy.py",),
            "dispatcher",
            "configs `runtime.use_triton_sel`",
        ),
        Var(
            "SELGATE_TRITON_FORCE",
            "flag",
            False,
            "Run Triton even where the ADR policy disables it (SM 8.9), ignoring the min-L threshold and SELGATE_TRITON_ENABLE.",
            (_K + "policy.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_TRITON_MIN_L",
            "int",
            None,
            "Smallest number of selected keys L for which `auto` picks Triton.",
            (_K + "policy.py",),
            "dispatcher",
            "configs `runtime.sel_triton_min_L`",
        ),
        Var(
            "SELGATE_FORCE_PARITY",
            "flag",
            False,
            "Route every call to the fp64 reference.",
            (_K + "policy.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_STRICT",
            "flag",
            False,
            "Raise instead of falling back when the requested backend cannot run.",
            (_K + "policy.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_TRITON_ALLOW_GRAD",
            "flag",
            None,
            "Route inputs that require grad to Triton.",
            (_K + "policy.py",),
            "dispatcher",
            "configs `runtime.sel_triton_allow_grad`",
        ),
        Var(
            "SELGATE_VALIDATE_RANGES",
            "flag",
            False,
            "Reject ranges that break the producer contract (sorted, disjoint, causal) instead of normalising them.",
            (_K + "policy.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_CUDA_ENABLE",
            "flag",
            False,
            "Try the CUDA decode kernel first for S = 1 calls on a GPU.",
            (_K + "policy.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_CAPABILITY",
            "str",
            None,
            "Pretend the device has this compute capability (e.g. `8.9`); lanes use it to exercise other GPU classes' policy.",
            (_K + "policy.py", "lanes/__main__.py", "selgate/environment.py"),
            "dispatcher",
            "the device's",
        ),
        Var(
            "SELGATE_DEBUG_LOG",
            "flag",
            False,
            "Log every dispatch decision as a `sel.*` line on the `selgate.kernels` logger.",
            (_K + "stats.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_TRITON_NORMALIZE",
            "flag",
            True,
            "Normalise CUDA ranges with one Triton launch; off keeps the torch formulation.",
            (_K + "dispatch.py",),
            "dispatcher",
        ),
        Var(
            "SELGATE_TRITON_TMA",
            "flag",
            None,
            "Use the TMA forward kernel (SM 9.0).",
            (_K + "triton/tuning.py",),
            "dispatcher",
            "configs `triton_fwd.<kind>.tma`",
        ),
        Var(
            "SELGATE_TRITON_PAIRS",
            "flag",
            None,
            "Use the Gluon pair forward kernel.",
            (_K + "triton/tuning.py",),
            "dispatcher",
            "configs `triton_fwd.<kind>.pairs`",
        ),
        Var(
            "SELGATE_TRITON_KV_OUTER",
            "int",
            None,
            "Run the KV-tile-outer forward (kv_outer.py) for calls with at most this many query heads per KV head, "
            "at every size (0: never).",
            (_K + "triton/tuning.py",),
            "dispatcher",
            "configs `triton_fwd.<kind>.kv_outer_max_heads` and `kv_outer_min_tokens`",
        ),
        # Triton launch configuration.
        Var(
            "SELGATE_TRITON_FWD_CONFIG",
            "str",
            None,
            "Forward launch override, `BLOCK_L=32,num_warps=8` or a JSON object; keys BLOCK_L, num_warps, num_stages.",
            (_K + "triton/tuning.py",),
            "triton",
        ),
        Var(
            "SELGATE_TRITON_BWD_CONFIG",
            "str",
            None,
            "Backward launch override in the same form; keys as in `tuning.BWD_KEYS`.",
            (_K + "triton/tuning.py",),
            "triton",
        ),
        Var(
            "SELGATE_TRITON_AUTOTUNE",
            "flag",
            None,
            "1: autotune every launch no tuned file covers, once per process and key (full search, kept in the process); "
            "0: never. Unset: the first-call autotune, on a GPU whose device and class profiles measured nothing "
            "(a few forward configs a key, within 30 s a process, kept in the user's cache).",
            (_K + "triton/tuning.py",),
            "triton",
            "first-call autotune where nothing was measured",
        ),
        Var(
            "SELGATE_TRITON_TUNE_CACHE",
            "path",
            Path.home() / ".cache" / "selgate" / "tuned",
            "Folder where the first-call autotune keeps what it tuned, one file per device.",
            (_K + "triton/tuning.py",),
            "triton",
        ),
        Var(
            "SELGATE_TRITON_TUNED",
            "flag",
            True,
            "Use the tuned files (device, class, first-call cache); off ignores them.",
            (_K + "triton/tuning.py",),
            "triton",
        ),
        Var(
            "SELGATE_TRITON_TUNED_DIR",
            "path",
            None,
            "Folder holding the tuned files.",
            (_K + "triton/tuning.py",),
            "triton",
            "configs/tuned",
        ),
        Var(
            "SELGATE_TRITON_RANGE_LEN",
            "int",
            None,
            "Longest range the host assumes (NSA's l_sel), which sets the L bucket.",
            (_K + "triton/tuning.py",),
            "triton",
            "configs `triton_tuning.range_len`, else 64",
        ),
        # CUDA decode extension build.
        Var(
            "SELGATE_CUDA_BUILD",
            "flag",
            False,
            "Build the CUDA decode extension when `selgate.kernels.cuda` is imported rather than at its first call.",
            (_K + "cuda/__init__.py",),
            "cuda",
        ),
        Var(
            "SELGATE_CUDA_CACHE",
            "path",
            Path.home() / ".cache" / "selgate" / "cuda",
            "Where the CUDA extension's builds are kept; lane runs set it under SELGATE_CACHE_DIR.",
            (_K + "cuda/build.py", "lanes/runner.py"),
            "cuda",
        ),
        Var(
            "SELGATE_CUDA_BUILD_WAIT",
            "float",
            900.0,
            "Longest wait, in seconds, for another process's build of the same extension.",
            (_K + "cuda/build.py",),
            "cuda",
        ),
        Var(
            "SELGATE_CUDA_VERBOSE",
            "flag",
            False,
            "Show the compiler's output while building.",
            (_K + "cuda/build.py",),
            "cuda",
        ),
        # Configuration files.
        Var(
            "SELGATE_CONFIG_DIR",
            "path",
            None,
            "Folder holding base.yaml, profiles/ and tuned/.",
            (_K + "config.py",),
            "paths",
            "the package's configs/",
        ),
        # Lanes and reports.
        Var(
            "SELGATE_LANE",
            "str",
            None,
            "The lane a pytest run belongs to; the lane runner sets it.",
            ("lanes/test_lane_policy.py", "selgate/environment.py", "reports/stamp.py"),
            "lanes",
            "unset (`adhoc` in reports)",
        ),
        Var(
            "SELGATE_TOL_OVERRIDES",
            "str",
            "",
            "The lane's tolerance overrides as JSON; only the lane runner may set it, from the lane YAML.",
            ("conformance/tolerances.py", "lanes/runner.py", "selgate/environment.py"),
            "lanes",
        ),
        Var(
            "SELGATE_CACHE_DIR",
            "path",
            None,
            "Root of the compiled-kernel caches that persist between lane runs.",
            ("lanes/runner.py",),
            "lanes",
            "$XDG_CACHE_HOME/selgate",
        ),
        Var(
            "SELGATE_DURATIONS",
            "path",
            None,
            "JSON of per-test durations; the costliest tests are scheduled first. The lane runner sets it.",
            ("lanes/ordering.py",),
            "lanes",
        ),
        Var(
            "SELGATE_PROGRESS_S",
            "float",
            30.0,
            "Seconds without a progress line before one is printed (lanes, bin/test); 0: a line per result, no timer.",
            ("lanes/progress.py",),
            "lanes",
        ),
        Var(
            "SELGATE_DOCKER_BUILD_ARGS",
            "str",
            "",
            "Space-separated KEY=VALUE Docker build args over the lane's (e.g. a local BASE_IMAGE).",
            ("lanes/docker_backend.py",),
            "lanes",
        ),
        Var(
            "SELGATE_COMMIT",
            "str",
            None,
            "Full commit id of a tree without .git (a Docker image).",
            ("selgate/tree.py",),
            "lanes",
            "git, else GITHUB_SHA",
        ),
        # Benchmarks.
        Var(
            "SELGATE_BENCH_RESULTS",
            "path",
            None,
            "Folder the benchmark tables are written to.",
            ("bench/tables.py",),
            "bench",
            "bench/results",
        ),
        Var(
            "SELGATE_BENCH_DENSE_BUDGET_MB",
            "int",
            8192,
            "Dense baselines needing more memory than this are skipped, not run out of memory.",
            ("bench/baselines.py",),
            "bench",
        ),
        # Setup and CI scripts (shell; listed so every variable is documented in one place).
        Var("SELGATE_VENV", "path", Path(".venv"), "Where bin/setup makes the virtual environment.", ("bin/setup",), "setup"),
        Var(
            "SELGATE_SETUP_DRY_RUN",
            "flag",
            False,
            "Make the venv and print each pip install instead of running it.",
            ("bin/setup",),
            "setup",
        ),
        Var(
            "SELGATE_DOCKER_STATE",
            "path",
            Path("/var/lib/selgate-docker"),
            "State folder of the Docker engine the CI script starts.",
            (".ci/docker_engine.sh",),
            "setup",
        ),
        Var(
            "SELGATE_DOCKER_STORAGE_DRIVER",
            "str",
            None,
            "Storage driver of that engine.",
            (".ci/docker_engine.sh",),
            "setup",
            "detected",
        ),
        Var("SELGATE_WORKERS", "str", "auto", "pytest-xdist workers of bin/test: a number or `auto`.", ("bin/test",), "setup"),
        Var(
            "SELGATE_FIND_LINKS",
            "path",
            None,
            "A folder of wheels bin/setup's pip installs from (`--find-links`), for machines without a package index.",
            ("bin/setup",),
            "setup",
            "`.whl/` when that folder exists",
        ),
        Var(
            "SELGATE_EVIDENCE_WHEELS",
            "path",
            Path(".gpuwhl"),
            "The wheels (junitparser, docker-py) bin/sm90-evidence installs into the GPU host's Python.",
            ("bin/sm90-evidence",),
            "setup",
        ),
        Var(
            "SELGATE_EVIDENCE_LANE_S",
            "int",
            600,
            "bin/sm90-evidence: seconds before the sm90 lane is cut (SIGINT; its JUnit is kept and the gate names the cut).",
            ("bin/sm90-evidence",),
            "setup",
        ),
        Var(
            "SELGATE_EVIDENCE_SANITIZE_S",
            "int",
            420,
            "bin/sm90-evidence: seconds for the compute-sanitizer pass.",
            ("bin/sm90-evidence",),
            "setup",
        ),
        Var(
            "SELGATE_EVIDENCE_BENCH_S",
            "int",
            170,
            "bin/sm90-evidence: seconds for the acceptance benchmark.",
            ("bin/sm90-evidence",),
            "setup",
        ),
        Var(
            "SELGATE_EVIDENCE_BWD_S",
            "int",
            70,
            "bin/sm90-evidence: seconds for the conformance matrix's Triton backward cases in bf16 up to the large size.",
            ("bin/sm90-evidence",),
            "setup",
        ),
    )
}

_UNSET = object()


def get(name: str, default=_UNSET, environ=None):
    """The parsed value of variable `name` from `environ` (default os.environ); `default` (else
    the registry's) when it is unset or empty. Raises ConfigError when it is malformed."""
    var = VARS.get(name)
    if var is None:
        raise KeyError(f"{name} is not in selgate.env_vars.VARS; declare it there")
    raw = (os.environ if environ is None else environ).get(name)
    if raw in (None, ""):
        return var.default if default is _UNSET else default
    return PARSERS[var.type](name, raw)


@functools.lru_cache(maxsize=None)
def _encoded(names: tuple) -> tuple:
    return tuple(map(os.environ.encodekey, names))


def raw(names: tuple) -> tuple:
    """The raw text of each variable in `names` as the environment holds it now, one dictionary
    lookup each (os.environ's own mapping, past its per-key encoding): about a microsecond for
    the dispatcher's flags, so a caller can tell per call whether values it parsed still hold."""
    data = getattr(os.environ, "_data", None)
    if data is None or not hasattr(os.environ, "encodekey"):
        return tuple(map(os.environ.get, names))
    return tuple(map(data.get, _encoded(names)))


_parsed: dict = {}  # name -> (raw text, parsed value)
_keys: dict = {}  # name -> its key in os.environ's own mapping


def current(name: str):
    """`get(name)` parsed again only when the variable's text changed: what a per-call reader
    (a debug switch on the call path) uses instead of parsing on every call. One dictionary
    lookup in os.environ's own mapping (a third of `raw`'s cost for one name)."""
    key = _keys.get(name)
    if key is None:
        key = _keys[name] = os.environ.encodekey(name) if hasattr(os.environ, "encodekey") else name
    data = getattr(os.environ, "_data", os.environ)
    text = data.get(key)
    hit = _parsed.get(name)
    if hit is None or hit[0] != text:
        hit = _parsed[name] = (text, get(name))
    return hit[1]


def _default_text(var: Var) -> str:
    if var.default is None:
        return var.default_doc or "unset"
    if var.type == "flag":
        return "1" if var.default else "0"
    if isinstance(var.default, Path) and var.default.is_absolute() and var.default.is_relative_to(Path.home()):
        return f"~/{var.default.relative_to(Path.home())}"
    return f"`{var.default}`" if var.default != "" else "empty"


def markdown() -> str:
    """docs/configuration.md: every variable by group, generated from VARS."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m selgate.env_vars --markdown`; edit selgate/env_vars.py. -->",
        "",
        "Every environment variable selgate reads. Settings in `configs/base.yaml`, the GPU class profile",
        "`configs/classes/<class>.yaml` and the device profile `configs/profiles/<device>.yaml` yield to",
        "these. Flags accept `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off` (any case); an empty value",
        "counts as unset; a malformed value is an error that names",
        "the variable, the value and what was expected.",
        "",
        "Names are `SELGATE_`, then the part a variable configures when it configures one (`TRITON_`,",
        "`CUDA_`, `BENCH_`, `DOCKER_`), then what it sets. selgate reads these names only: another",
        "project's variables (nsa-vibe's `NSA_*` flags, set by someone validating it) change nothing here.",
        "",
        "Two variables outside the scheme, under their usual names: `bin/setup` reuses the torch of the",
        "interpreter named by `PYTHON` (default `python3`); a lane gives each worker",
        "`OMP_NUM_THREADS` = the machine's cores // its workers (CPU threads for torch and OpenMP) unless",
        "it is already set (`lanes/runner.py`).",
    ]
    for group, title in GROUPS.items():
        lines += [
            "",
            f"## {title}",
            "",
            "| variable | type | default | meaning | read by |",
            "| --- | --- | --- | --- | --- |",
        ]
        for var in VARS.values():
            if var.group == group:
                readers = ", ".join(f"`{r}`" for r in var.readers)
                lines.append(f"| `{var.name}` | {var.type} | {_default_text(var)} | {var.meaning} | {readers} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m selgate.env_vars --markdown > docs/configuration.md")
    sys.stdout.write(markdown())
