"""Every `SELGATE_*` environment variable selgate reads, declared once.

Each entry has a name, a type, a default, a meaning, the files that read it and the names it
had before (`deprecated`). Code reads a variable through `get`, so one value means the same
everywhere: flags accept 1/0, true/false, yes/no, on/off in any case, an empty value counts as
unset, and a malformed value raises `ConfigError` naming the variable, the value and what was
expected.

Names: `SELGATE_`, then the part a variable configures when it configures one (`TRITON_`,
`CUDA_`, `BENCH_`, `DOCKER_`), then what it sets. A former name still works: when only it is
set its value is read and one WARNING per process and name on the `selgate` logger says which
name replaces it; the current name and a former one set to different values are a
`ConfigError` naming both. Code that hands an environment to another process passes it
through `current_environ`, which writes every former name under its current one, so a child
(a lane's worker, a policy probe, a container) sees one name per variable.
`python -m selgate.kernels.settings --markdown` writes docs/configuration.md from this table.

It lives in the kernel package because the kernels read it and may import nothing from the
rest of selgate; everything else may import it.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
log = logging.getLogger("selgate")


@dataclass(frozen=True)
class Var:
    """One environment variable. `default` is what `get` returns when it is unset; None with
    `default_doc` saying where the reader takes its default from (configs, another path).
    `deprecated`: its former names, still read (with a warning) when the name is unset."""

    name: str
    type: str  # flag, int, float, str, path
    default: object
    meaning: str
    readers: tuple[str, ...]
    group: str
    default_doc: str = ""
    deprecated: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The current name, then the former ones."""
        return (self.name, *self.deprecated)


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


# Each parser takes the name actually set (for its error message) and the raw text.
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
        # Dispatcher (tests clear exactly these, under every name, for a known state: `policy.ENV_FLAGS`).
        Var(
            "SELGATE_TRITON_ENABLE",
            "flag",
            None,
            'Let `backend="auto"` use the Triton selection kernel.',
            (_K + "policy.py",),
            "dispatcher",
            "configs `runtime.use_triton_sel`",
            deprecated=("NSA_USE_TRITON_SEL",),
        ),
        Var(
            "SELGATE_TRITON_FORCE",
            "flag",
            False,
            "Run Triton even where the ADR policy disables it (SM 8.9), ignoring the min-L threshold and SELGATE_TRITON_ENABLE.",
            (_K + "policy.py",),
            "dispatcher",
            deprecated=("NSA_TRITON_SEL_FORCE",),
        ),
        Var(
            "SELGATE_TRITON_MIN_L",
            "int",
            None,
            "Smallest number of selected keys L for which `auto` picks Triton.",
            (_K + "policy.py",),
            "dispatcher",
            "configs `runtime.sel_triton_min_L`",
            deprecated=("NSA_SEL_TRITON_MIN_L",),
        ),
        Var(
            "SELGATE_FORCE_PARITY",
            "flag",
            False,
            "Route every call to the fp64 reference.",
            (_K + "policy.py",),
            "dispatcher",
            deprecated=("NSA_FORCE_PARITY",),
        ),
        Var(
            "SELGATE_STRICT",
            "flag",
            False,
            "Raise instead of falling back when the requested backend cannot run.",
            (_K + "policy.py",),
            "dispatcher",
            deprecated=("NSA_SEL_STRICT",),
        ),
        Var(
            "SELGATE_TRITON_ALLOW_GRAD",
            "flag",
            None,
            "Route inputs that require grad to Triton.",
            (_K + "policy.py",),
            "dispatcher",
            "configs `runtime.sel_triton_allow_grad`",
            deprecated=("NSA_SEL_TRITON_ALLOW_GRAD",),
        ),
        Var(
            "SELGATE_VALIDATE_RANGES",
            "flag",
            False,
            "Reject ranges that break the producer contract (sorted, disjoint, causal) instead of normalising them.",
            (_K + "policy.py",),
            "dispatcher",
            deprecated=("NSA_SEL_VALIDATE",),
        ),
        Var(
            "SELGATE_CUDA_ENABLE",
            "flag",
            False,
            "Try the CUDA decode kernel first for S = 1 calls on a GPU.",
            (_K + "policy.py",),
            "dispatcher",
            deprecated=("NSA_SEL_CUDA",),
        ),
        Var(
            "SELGATE_CAPABILITY",
            "str",
            None,
            "Pretend the device has this compute capability (e.g. `8.9`); lanes use it to exercise other GPU classes' policy.",
            (_K + "policy.py", "lanes/__main__.py", "reports/environment.py"),
            "dispatcher",
            "the device's",
            deprecated=("NSA_SEL_CAPABILITY",),
        ),
        Var(
            "SELGATE_DEBUG_LOG",
            "flag",
            False,
            "Log every dispatch decision as a `sel.*` line on the `selgate.kernels` logger.",
            (_K + "stats.py",),
            "dispatcher",
            deprecated=("NSA_DEBUG_LOG",),
        ),
        Var(
            "SELGATE_TRITON_NORMALIZE",
            "flag",
            True,
            "Normalise CUDA ranges with one Triton launch; off keeps the torch formulation.",
            (_K + "dispatch.py",),
            "dispatcher",
            deprecated=("NSA_SEL_TRITON_NORMALIZE",),
        ),
        Var(
            "SELGATE_TRITON_TMA",
            "flag",
            None,
            "Use the TMA forward kernel (SM 9.0).",
            (_K + "triton/tuning.py",),
            "dispatcher",
            "configs `triton_fwd.<kind>.tma`",
            deprecated=("NSA_SEL_TRITON_TMA",),
        ),
        Var(
            "SELGATE_TRITON_PAIRS",
            "flag",
            None,
            "Use the Gluon pair forward kernel.",
            (_K + "triton/tuning.py",),
            "dispatcher",
            "configs `triton_fwd.<kind>.pairs`",
            deprecated=("NSA_SEL_TRITON_PAIRS",),
        ),
        # Triton launch configuration.
        Var(
            "SELGATE_TRITON_FWD_CONFIG",
            "str",
            None,
            "Forward launch override, `BLOCK_L=32,num_warps=8` or a JSON object; keys BLOCK_L, num_warps, num_stages.",
            (_K + "triton/tuning.py",),
            "triton",
            deprecated=("NSA_SEL_TRITON_FWD_CONFIG",),
        ),
        Var(
            "SELGATE_TRITON_BWD_CONFIG",
            "str",
            None,
            "Backward launch override in the same form; keys as in `tuning.BWD_KEYS`.",
            (_K + "triton/tuning.py",),
            "triton",
            deprecated=("NSA_SEL_TRITON_BWD_CONFIG",),
        ),
        Var(
            "SELGATE_TRITON_AUTOTUNE",
            "flag",
            False,
            "Autotune a launch the tuned file does not cover, once per process and key.",
            (_K + "triton/tuning.py",),
            "triton",
            deprecated=("NSA_SEL_TRITON_AUTOTUNE",),
        ),
        Var(
            "SELGATE_TRITON_TUNED",
            "flag",
            True,
            "Use the tuned file of the device; off ignores it.",
            (_K + "triton/tuning.py",),
            "triton",
            deprecated=("NSA_SEL_TUNED",),
        ),
        Var(
            "SELGATE_TRITON_TUNED_DIR",
            "path",
            None,
            "Folder holding the tuned files.",
            (_K + "triton/tuning.py",),
            "triton",
            "configs/tuned",
            deprecated=("NSA_SEL_TUNED_DIR",),
        ),
        Var(
            "SELGATE_TRITON_RANGE_LEN",
            "int",
            None,
            "Longest range the host assumes (NSA's l_sel), which sets the L bucket.",
            (_K + "triton/tuning.py",),
            "triton",
            "configs `triton_tuning.range_len`, else 64",
            deprecated=("NSA_SEL_RANGE_LEN",),
        ),
        # CUDA decode extension build.
        Var(
            "SELGATE_CUDA_BUILD",
            "flag",
            False,
            "Build the CUDA decode extension when `selgate.kernels.cuda` is imported rather than at its first call.",
            (_K + "cuda/__init__.py",),
            "cuda",
            deprecated=("NSA_SEL_CUDA_BUILD",),
        ),
        Var(
            "SELGATE_CUDA_CACHE",
            "path",
            Path.home() / ".cache" / "selgate" / "cuda",
            "Where the CUDA extension's builds are kept; lane runs set it under SELGATE_CACHE_DIR.",
            (_K + "cuda/build.py", "lanes/runner.py"),
            "cuda",
            deprecated=("NSA_SEL_CUDA_CACHE",),
        ),
        Var(
            "SELGATE_CUDA_BUILD_WAIT",
            "float",
            900.0,
            "Longest wait, in seconds, for another process's build of the same extension.",
            (_K + "cuda/build.py",),
            "cuda",
            deprecated=("NSA_SEL_CUDA_BUILD_WAIT",),
        ),
        Var(
            "SELGATE_CUDA_VERBOSE",
            "flag",
            False,
            "Show the compiler's output while building.",
            (_K + "cuda/build.py",),
            "cuda",
            deprecated=("NSA_SEL_CUDA_VERBOSE",),
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
            ("lanes/test_lane_policy.py", "reports/environment.py", "reports/stamp.py"),
            "lanes",
            "unset (`adhoc` in reports)",
        ),
        Var(
            "SELGATE_TOL_OVERRIDES",
            "str",
            "",
            "The lane's tolerance overrides as JSON; only the lane runner may set it, from the lane YAML.",
            ("conformance/tolerances.py", "lanes/runner.py", "reports/environment.py"),
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
            "Seconds between progress lines of a lane run (0: none).",
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
            ("reports/tree.py", "bench/check_triton_fwd.py"),
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
            "bin/sm90-evidence: seconds for the Triton backward's bf16 parity check.",
            ("bin/sm90-evidence",),
            "setup",
        ),
    )
}

# Former name -> current name, for every variable that was renamed.
DEPRECATED: dict[str, str] = {old: var.name for var in VARS.values() for old in var.deprecated}

_UNSET = object()
_WARNED: set[str] = set()  # former names this process has warned about (one line each)


def _warn_deprecated(old: str, new: str) -> None:
    if old not in _WARNED:
        _WARNED.add(old)
        log.warning(
            "environment variable %s is deprecated: it was renamed %s; set that instead "
            "(the old name is still read while %s is unset)",
            old,
            new,
            new,
        )


def _lookup(var: Var, environ) -> tuple[str, str, object] | None:
    """(the name the value is read from, its raw text, its parsed value), or None when no name
    of `var` is set (empty counts as unset). The current name wins; a former name whose value
    differs from the one read is a ConfigError naming both; each former name set is warned
    about once per process. A malformed value raises naming the variable it was set under."""
    env = os.environ if environ is None else environ
    found = [(name, env[name]) for name in var.names if env.get(name) not in (None, "")]
    if not found:
        return None
    parse = PARSERS[var.type]
    name, raw = found[0]
    value = parse(name, raw)
    for other, other_raw in found[1:]:
        if parse(other, other_raw) != value:
            former = ", ".join(var.deprecated)
            raise ConfigError(
                f"{name} and {other} are both set, to different values ({raw!r} and {other_raw!r}): "
                f"{former} {'is the former name' if len(var.deprecated) == 1 else 'are former names'} "
                f"of {var.name}; set only {var.name}"
            )
    for other, _ in found:
        if other != var.name:
            _warn_deprecated(other, var.name)
    return name, raw, value


def _var(name: str) -> Var:
    var = VARS.get(name)
    if var is None:
        hint = f" (renamed {DEPRECATED[name]})" if name in DEPRECATED else ""
        raise KeyError(f"{name} is not in selgate.kernels.settings.VARS{hint}; declare it there")
    return var


def get(name: str, default=_UNSET, environ=None):
    """The parsed value of variable `name` from `environ` (default os.environ), read under its
    current name or, when that is unset, a former one; `default` (else the registry's) when it
    is unset or empty. Raises ConfigError when malformed (naming the variable actually set) or
    when two of its names disagree."""
    var = _var(name)
    found = _lookup(var, environ)
    if found is None:
        return var.default if default is _UNSET else default
    return found[2]


def names(name: str) -> tuple[str, ...]:
    """Every name variable `name` is read under: the current one, then the former ones. For
    code that asks whether a variable is present at all, or removes it."""
    return _var(name).names


def source(name: str, environ=None) -> str:
    """The name variable `name`'s value is read from (a former name when only that is set);
    the current name when it is unset. For messages that name what the user set."""
    found = _lookup(_var(name), environ)
    return found[0] if found else name


def current_environ(environ=None) -> dict:
    """A copy of `environ` (default os.environ) with every variable set under a former name
    moved to its current name, for handing to another process (a lane's workers, a policy
    probe, a container): the child then sees one name per variable, and what a lane adds
    under the current name replaces what the caller set under the old one. Raises
    ConfigError when two names of one variable disagree."""
    env = dict(os.environ if environ is None else environ)
    for var in dict.fromkeys(VARS[new] for old, new in DEPRECATED.items() if old in env):
        found = _lookup(var, env)
        for old in var.deprecated:
            env.pop(old, None)
        if found is not None:
            env[var.name] = found[1]
    return env


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
        "<!-- Generated by `python -m selgate.kernels.settings --markdown`; edit kernels/settings.py. -->",
        "",
        "Every environment variable selgate reads. Settings in `configs/base.yaml` and the device profile",
        "`configs/profiles/<device>.yaml` yield to these. Flags accept `1`/`0`, `true`/`false`, `yes`/`no`,",
        "`on`/`off` (any case); an empty value counts as unset; a malformed value is an error that names",
        "the variable, the value and what was expected.",
        "",
        "Names are `SELGATE_`, then the part a variable configures when it configures one (`TRITON_`,",
        "`CUDA_`, `BENCH_`, `DOCKER_`), then what it sets. A former name (last column) is still read when",
        "the current name is unset, with one warning per process on the `selgate` logger; the two set to",
        "different values are an error naming both. Former names will be removed in a later release.",
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
            "| variable | type | default | meaning | read by | former names |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for var in VARS.values():
            if var.group == group:
                readers = ", ".join(f"`{r}`" for r in var.readers)
                former = ", ".join(f"`{d}`" for d in var.deprecated) or "-"
                lines.append(f"| `{var.name}` | {var.type} | {_default_text(var)} | {var.meaning} | {readers} | {former} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m selgate.kernels.settings --markdown > docs/configuration.md")
    sys.stdout.write(markdown())
