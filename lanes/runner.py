"""Run one lane: pytest over the lane's paths, markers and size, on xdist workers (sharing
the GPUs, as many as their memory holds), with a per-test timeout, the costliest tests first,
progress with the time left, JUnit into `reports/out/<lane>/junit.xml`, persistent Triton and
CUDA extension caches, and the lane's own policy checks. Locally, or in Docker through
`selgate.lanes.docker_backend`.

pytest runs with plugin autoloading off and its configuration file named (`-c
pyproject.toml`): an installed plugin that deselects, `PYTEST_ADDOPTS` or an untracked
`pytest.ini` cannot change what a lane runs."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import sys
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from selgate.conformance.tolerances import ENV as TOL_ENV
from selgate import env_vars
from selgate.cli_args import MAX_WORKERS, WORKERS_RANGE

from .config import LANE_DIR, tolerance_env
from .cut import Cut, default_sigint, mark_signal, raise_interrupt
from .detect import lane_for
from .pytest_command import pytest_args, pytest_command
from .ordering import DURATIONS_DIR, DURATIONS_ENV

ROOT = LANE_DIR.parent
OUT_ROOT = ROOT / "reports" / "out"
POLICY_TESTS = "lanes/test_lane_policy.py"
REFUSED_FILE = "refused.json"
COMMAND_FILE = "command.txt"  # a local run's full pytest command line, with its environment
PLUGINS = (
    "xdist.plugin",
    "pytest_timeout",
    "selgate.lanes.xdist_gpu",
    "selgate.lanes.ordering",
    "selgate.lanes.progress",
    "selgate.reports.stamp",
)
CONFORMANCE_PLUGIN = "selgate.conformance.plugin"  # the matrix's --impl and --size, where installed
CONFIG_ARGS = ("-c", "pyproject.toml", "--rootdir", ".")
CLEAN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
CACHE_ENV = ("TRITON_CACHE_DIR", "SELGATE_CUDA_CACHE")
GPU_GB_PER_WORKER = 10  # GPU memory (GB) one worker of a GPU lane may take
# The size of each worker's CPU thread pool (torch's intra-op threads, OpenMP): torch sizes it to
# the machine's cores, so n workers would run n x cores threads, whose spinning takes the cores the
# other workers need (measurements in docs/lanes.md). A caller's own setting wins.
THREADS_ENV = "OMP_NUM_THREADS"
PYCACHE_ENV = "PYTHONPYCACHEPREFIX"
# Bytecode is written into the lane's cache (PYCACHE_ENV) whatever the caller set: with a prefix,
# Python no longer reads site-packages' own __pycache__, so under PYTHONDONTWRITEBYTECODE=1 (docker
# images, CI machines) every process of the lane compiled torch from source, 3.9 s an import
# against 1.8 (docs/lanes.md). An empty value is unset to Python, in a container too.
NO_BYTECODE_ENV = "PYTHONDONTWRITEBYTECODE"
# An idle worker takes tests queued behind another's long one (with `load` they wait for it:
# 2 of the CPU lane's 8 minutes were its second worker idle behind a 330 s compile).
DIST = "worksteal"
UNSET_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
# Extra pytest arguments (`lanes run <lane> -- ...`) that load code or change where pytest finds
# its configuration, conftests and test modules: a plugin (-p), another configuration file or
# root, a conftest boundary, an import mode, packages by name, a warning category or debugger
# class (both imported by name), another interpreter for the workers (--tx), or an ini value
# that does any of that. The lane refuses them by name rather than recording them.
REFUSED_ARGS = (
    "-p",
    "-c",
    "--config-file",
    "--inifile",
    "--rootdir",
    "--confcutdir",
    "--noconftest",
    "--import-mode",
    "--pyargs",
    "-o",
    "--override-ini",
    "-W",
    "--pythonwarnings",
    "--pdbcls",
    "--tx",
    "--rsyncdir",
)
# ini keys an extra `-o key=value` may still set: they change what is printed, not what runs
SAFE_INI = ("log_cli", "log_cli_level", "log_level", "console_output_style", "junit_logging", "junit_log_passing_tests")


# pytest's short options that take a value: in a cluster (`-vpX`), what follows one is its value
SHORT_WITH_VALUE = "kmrpcoWn"


def refused_arg(arg: str, value: str | None) -> str | None:
    """The refused option `arg` spells (`-p x`, `-px`, `-vpx`, `--rootdir=x`), or None. `value`
    is the next argument, which a separate `-o` takes as its key=value."""
    if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:  # a cluster of short options
        for i, char in enumerate(arg[1:], 1):
            if f"-{char}" in REFUSED_ARGS:
                if i == 1:  # the option itself, its value attached: below
                    break
                return refused_arg("-" + arg[i:], value)
            if char in SHORT_WITH_VALUE:
                return None
    for option in REFUSED_ARGS:
        if option.startswith("--"):
            if arg != option and not arg.startswith(option + "="):
                continue
        elif not arg.startswith(option):  # a short option takes its value attached too (-pX)
            continue
        if option in ("-o", "--override-ini"):
            attached = arg[len(option) :].lstrip("=") if arg != option else value
            if attached and attached.split("=", 1)[0].strip() in SAFE_INI:
                return None
        return option
    return None


def lane_plugins(names=PLUGINS) -> list:
    """The plugins a lane names (autoloading is off), the matrix's plugin included once the
    package provides it."""
    return [*names, CONFORMANCE_PLUGIN] if importlib.util.find_spec(CONFORMANCE_PLUGIN) else list(names)


def selection_args(lane: dict, *, policy_only: bool = False) -> list:
    """The lane's own selection: its paths and policy checks, size class and markers."""
    paths = [POLICY_TESTS] if policy_only else [*lane["paths"], POLICY_TESTS]
    args = [*paths]
    if not policy_only:  # the conformance matrix's size class
        args += ["--size", lane["size"]]
    if lane["markers"]:
        args += ["-m", lane["markers"]]
    return args


def inventory_command(lane: dict) -> list:
    """`pytest --collect-only` of the lane's whole selection, under the lane's configuration
    and nothing else: the inventory a run of the lane must match."""
    plugins = ("no:cacheprovider", *lane_plugins(("pytest_timeout",)))
    return pytest_command(
        ["--collect-only", "-q", *pytest_args(plugins=plugins, config=CONFIG_ARGS, select=selection_args(lane))]
    )


def run_env(extra: dict) -> dict:
    """os.environ with the lane's variables, plugin autoloading off and pytest's option
    variables removed."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    return {**env, **extra, **CLEAN_ENV}


def clear_out(out_name: str, out_root: Path | None = None) -> Path:
    """Empty reports/out/<out_name>/ before anything can fail, so that no earlier run's
    results are left for the gate to read: a link there is removed, never followed (its
    target is left alone), and a new empty folder made. Raises OSError naming the folder when
    it cannot be emptied, rather than leaving results behind."""
    out_dir = (out_root or OUT_ROOT) / out_name
    try:
        if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
            out_dir.unlink()
        elif out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
    except OSError as e:
        raise type(e)(f"{out_dir}: cannot empty the lane's results folder ({e}); remove it and run the lane again") from e
    return out_dir


def record_refusal(out_name: str, error: str, out_root: Path | None = None) -> None:
    """A run refused before pytest started leaves this note, which the gate blocks on by name."""
    path = (out_root or OUT_ROOT) / out_name / REFUSED_FILE
    path.write_text(json.dumps({"lane": out_name, "error": error}, indent=1) + "\n")


def cache_root() -> Path:
    """Where compiled kernels persist between runs: Triton's cache and the CUDA extension's
    builds, per lane and architecture ($SELGATE_CACHE_DIR, default ~/.cache/selgate)."""
    return env_vars.get("SELGATE_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "selgate"


@dataclass
class LanePlan:
    """Everything one lane run needs; `env` holds only what the lane adds to os.environ."""

    lane: dict
    out_name: str  # reports/out/<out_name>/
    pytest_args: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    cache_dir: Path = None  # TRITON_CACHE_DIR
    workers: int = 1
    extension_cache_dir: Path = None  # SELGATE_CUDA_CACHE: the CUDA decode extension's builds
    smoke: bool = False  # time the perf smoke after the tests (a perf_smoke lane, run whole and natively)


def visible_gpu_count() -> int:
    """GPUs this process may use: the CUDA_VISIBLE_DEVICES entries when set, else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    import torch

    return torch.cuda.device_count()


def smallest_gpu_memory() -> int:
    """Total memory in bytes of the smallest visible GPU."""
    import torch

    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def workers_per_gpu(memory: int, cpus: int, gpus: int) -> int:
    """Workers sharing one GPU: one per GPU_GB_PER_WORKER of its memory (8 on an 80 GB H100,
    whose 85 GB of HBM3 torch reports), at most one per CPU core over all GPUs, at least one."""
    return max(1, min(int(memory / 1e9 // GPU_GB_PER_WORKER), cpus // gpus))


def lane_workers(lane: dict, workers, *, gpus: int | None, gpu_memory: int | None, cpus: int | None) -> int:
    """The worker count: a number, `gpus` (one per visible GPU) or `per_gpu` (workers_per_gpu
    on each visible GPU); `gpus`, `gpu_memory` and `cpus` default to this machine's."""
    if workers not in ("gpus", "per_gpu"):
        return workers
    count = visible_gpu_count() if gpus is None else gpus
    if count < 1:
        raise ValueError(f"lane {lane['name']}: workers {workers!r} but CUDA_VISIBLE_DEVICES leaves no GPU visible")
    if workers == "gpus":
        return count
    memory = smallest_gpu_memory() if gpu_memory is None else gpu_memory
    return count * workers_per_gpu(memory, cpus or os.cpu_count() or 1, count)


def plan_lane(
    lane: dict,
    *,
    capability: str | None,
    workers: int | None = None,
    k: str | None = None,
    emulate: bool = False,
    policy_only: bool = False,
    extra=(),
    gpus: int | None = None,
    gpu_memory: int | None = None,
    cpus: int | None = None,
) -> LanePlan:
    """Build the pytest command line and environment for `lane` on a machine whose device
    has `capability` (None: no CUDA device). Raises ValueError when the lane cannot run here."""
    name = lane["name"]
    extra = list(extra)
    for i, arg in enumerate(extra):
        option = refused_arg(arg, extra[i + 1] if i + 1 < len(extra) else None)
        if option:
            raise ValueError(
                f"{arg}: the lane refuses {option} among extra pytest arguments: it loads code or configuration "
                f"the tree and the lane do not name (allowed -o keys: {', '.join(SAFE_INI)})"
            )
    target = str(lane["capabilities"][0]) if lane["capabilities"] else None
    if lane["device"] == "cuda" and capability is None:
        raise ValueError(f"lane {name}: needs a CUDA device of capability {lane['capabilities']}; this machine has none")
    if emulate and lane["device"] != "cuda":
        raise ValueError(f"lane {name}: --emulate needs a GPU lane, {name} runs on {lane['device']}")
    if lane["device"] == "cuda" and capability not in map(str, lane["capabilities"]) and not emulate:
        raise ValueError(
            f"lane {name}: expects compute capability {lane['capabilities']}, this device "
            f"has {capability}; pass --emulate to run it under SELGATE_CAPABILITY={target}"
        )
    workers = lane_workers(lane, lane["workers"] if workers is None else workers, gpus=gpus, gpu_memory=gpu_memory, cpus=cpus)
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers: expected {WORKERS_RANGE}, got {workers}")

    out_name = f"{name}-emulated" if emulate else name
    arch = f"sm{capability.replace('.', '')}" if capability else "cpu"
    env = {k_: str(v) for k_, v in (lane["env"] or {}).items()}
    env.update(tolerance_env(lane))
    outside = env_vars.get(TOL_ENV)
    if outside and outside != env.get(TOL_ENV):
        raise ValueError(
            f"{TOL_ENV}: set in the environment to {outside!r}; only "
            f"lanes/{name}.yaml (tolerance_overrides, with a reason and the measured error) "
            f"may change a tolerance: unset it"
        )
    if lane["device"] == "cuda" and "SELGATE_CUDA_BUILD" not in os.environ:
        # Each worker builds (or loads) the CUDA decode extension when it imports it during
        # collection, outside any per-test timeout that could kill a build half-way; the
        # builders take turns (kernels/cuda/build.py). The caller's own setting wins.
        env.setdefault("SELGATE_CUDA_BUILD", "1")
    env["SELGATE_LANE"] = out_name
    if THREADS_ENV not in os.environ:
        env[THREADS_ENV] = str(max(1, (cpus or os.cpu_count() or 1) // workers))
    if emulate:
        env["SELGATE_CAPABILITY"] = target
    # Bytecode is read and written outside the checkout: a stale or crafted .pyc in a __pycache__
    # of the checkout (left out of the tree's digest) is never what runs.
    env[PYCACHE_ENV] = str(cache_root() / "pycache" / f"{out_name}-{arch}")
    env[NO_BYTECODE_ENV] = ""
    cache_dir = cache_root() / "triton" / f"{out_name}-{arch}"
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    # builds are keyed by source hash, architecture and torch inside (kernels/cuda/build.py)
    extension_cache_dir = env_vars.get("SELGATE_CUDA_CACHE", cache_root() / "cuda")
    env["SELGATE_CUDA_CACHE"] = str(extension_cache_dir)
    durations = DURATIONS_DIR / f"{name}.json"
    if durations.exists():  # relative to the checkout: the same file inside a lane's image
        env[DURATIONS_ENV] = os.path.relpath(durations, ROOT)

    junit = f"reports/out/{out_name}/junit.xml"
    args = pytest_args(
        plugins=lane_plugins(),
        config=CONFIG_ARGS,
        select=selection_args(lane, policy_only=policy_only),
        workers=workers,
        dist=DIST,
        max_worker_restart=lane["max_worker_restart"],
        timeout=lane["timeout"],
        junit=junit,
        k=k,
        output=("-o", "console_output_style=progress", "-rfE", *extra),
    )
    smoke = lane["perf_smoke"] and not (k or emulate or policy_only or extra)
    return LanePlan(lane, out_name, args, env, cache_dir, workers, extension_cache_dir, smoke)


def shown_path(path: Path) -> str:
    """`path` relative to the checkout where it lies inside it: shorter to read."""
    return os.path.relpath(path, ROOT) if path.resolve().is_relative_to(ROOT) else str(path)


def run_summary(plan: LanePlan, out_dir: Path) -> str:
    """The line a lane run starts with: what it runs and where its results go. The full command
    (about 900 characters of environment and arguments) goes to COMMAND_FILE instead."""
    threads = plan.env.get(THREADS_ENV, os.environ.get(THREADS_ENV, "torch's default"))  # the caller's, where it set it
    lane = plan.lane
    text = f"lane {plan.out_name}: {plan.workers} worker(s) of {threads} CPU thread(s), size {lane['size']}"
    if lane["markers"]:
        text += f", markers {lane['markers']!r}"
    return text + f", JUnit {shown_path(out_dir / 'junit.xml')}"


def run_plan(plan: LanePlan, *, docker: bool = False) -> int:
    """Run the plan; returns pytest's exit status (the gate reads the JUnit, not this). A
    SIGINT or SIGTERM cuts the run: pytest still writes the results it has (`selgate.lanes.cut`)."""
    out_dir = clear_out(plan.out_name)
    plan.cache_dir.mkdir(parents=True, exist_ok=True)
    summary = run_summary(plan, out_dir)
    if docker:
        print(summary, flush=True)
        from .docker_backend import run_lane_in_docker

        # the image has its own paths for both caches, which the backend mounts
        env = {k: v for k, v in {**plan.env, **CLEAN_ENV}.items() if k not in CACHE_ENV}
        with Cut(raise_interrupt) as cut:
            status = run_lane_in_docker(
                plan.lane,
                pytest_args=plan.pytest_args,
                env=env,
                reports_dir=out_dir,
                cache_dir=plan.cache_dir,
                extension_cache_dir=plan.extension_cache_dir,
            )
    else:
        cmd = pytest_command(plan.pytest_args)
        command_file = out_dir / COMMAND_FILE
        command_file.write_text(shlex.join([f"{k}={v}" for k, v in {**plan.env, **CLEAN_ENV}.items()] + cmd) + "\n")
        print(f"{summary}; full command in {shown_path(command_file)}", flush=True)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(plan.env), start_new_session=True, preexec_fn=default_sigint)
        with Cut(lambda: proc.send_signal(signal.SIGINT)) as cut:
            status = proc.wait()
    mark_signal(out_dir, cut.signal)
    if plan.smoke and not docker and cut.signal is None:
        run_smoke(plan, out_dir)
    return status


PERF_DIR = "perf"  # the lane's perf smoke: reports/out/<lane>/perf/smoke.csv


def run_smoke(plan: LanePlan, out_dir: Path) -> int:
    """Time the bench's `smoke` preset into `out_dir/perf` as users run it: the caller's environment,
    none of the lane's test settings, only its compile caches. Its exit status is printed, not
    returned to the gate: the release gate reads the CSV, and a missing one blocks there."""
    cmd = [sys.executable, "-m", "selgate.bench", "sel", "--sweep", "smoke", "--out", str(out_dir / PERF_DIR)]
    env = {**os.environ, "TRITON_CACHE_DIR": str(plan.cache_dir), "SELGATE_CUDA_CACHE": str(plan.extension_cache_dir)}
    print(f"lane {plan.out_name}: perf smoke, {shlex.join(cmd[1:])}", flush=True)
    status = subprocess.run(cmd, cwd=ROOT, env=env, start_new_session=True).returncode
    if status:
        print(f"lane {plan.out_name}: the perf smoke exited {status}; the release gate blocks without its CSV", flush=True)
    return status


def resolve_lane(name: str) -> tuple[str, str | None]:
    """(lane name, device capability); `auto` picks the lane for this machine."""
    from selgate.device import capability_text, device_capability

    capability = capability_text(device_capability())
    return (lane_for(capability) if name == "auto" else name), capability
