"""Running `selgate check`'s matrix: the probe process that imports the implementation and
reads its declarations, then the child pytest over the installed `selgate.conformance` on
isolated xdist workers, each process in one group that dies with the run, cut gracefully by
the first SIGINT or SIGTERM. What the run means is judged above (`selgate.reports.check`)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from selgate.conformance import declarations, sandbox
from selgate.conformance.check_plugin import CLAIMS_FILE, COLLECTED_FILE
from selgate.conformance.probe import importing_marker
from selgate.conformance.reaper import kill_descendants
from selgate.conformance.impl import Impl, described_impl
from selgate.cli_args import WRITE_PROBE, cannot_write
from selgate.environment import ENV_FILE

from .cut import Cut, default_sigint
from .pytest_command import pytest_args, pytest_command

MARKERS = "conformance and not policy"  # policy is selgate's own dispatcher, not the kernel's
PLUGINS = (
    "xdist.plugin",
    "pytest_timeout",
    "selgate.conformance.plugin",
    "selgate.conformance.check_plugin",
    "selgate.lanes.xdist_gpu",
    "selgate.reports.stamp",
)
MANIFEST = ".selgate-check.json"  # what an earlier check wrote into --out, and may remove
REPRO_DIR = "repro"  # the reproducers of the root causes (reports.triage writes them)
RESULT_FILES = ("junit.xml", ENV_FILE, "report.md", COLLECTED_FILE, CLAIMS_FILE)
DECLARED_FILE = "declared.json"  # the probe's declarations, handed to the workers
CUT_GRACE_S = 120  # after the first signal, how long pytest may take to write its results
PROBE_RESULT_LIMIT = 1 << 20  # bytes of the probe's result read at most


class UsageError(Exception):
    """Exit 2: the command line or its environment, not the kernel."""


def default_workers() -> int:
    """The lanes' sizing: on GPUs, one worker per 10 GB of the smallest GPU's memory, at most
    one per CPU core (8 on an 80 GB H100); on a CPU machine one per core."""
    from .runner import smallest_gpu_memory, visible_gpu_count, workers_per_gpu

    cpus = os.cpu_count() or 1
    import torch

    gpus = visible_gpu_count() if torch.cuda.is_available() else 0
    return gpus * workers_per_gpu(smallest_gpu_memory(), cpus, gpus) if gpus else cpus


# A kernel call still running at --timeout is killed in its executor and fails its case, the
# worker going on (remote.DEADLINE); pytest-timeout's thread ends a worker only this much later,
# where the judge's own code (the reference, the comparison) has hung.
JUDGE_GRACE_S = 30


def check_command(args, junit: Path, tmp: Path) -> list:
    """The child pytest: the matrix of one implementation, isolated from the caller's
    pytest configuration (an empty ini file in `tmp`) and plugins (autoload off, named with
    -p), on the declarations this process read (the probe's, in `tmp`)."""
    inifile = tmp / "pytest.ini"
    inifile.write_text("[pytest]\n")
    # --noconftest: without a test path in the caller's folder pytest loads conftest.py from there
    # and its parents, where a kernel's pull request may put one that rewrites every report
    select = ["--noconftest", "--pyargs", "selgate.conformance", "-m", MARKERS, "--impl", args.impl, "--size", args.size]
    select += ["--check-declared", str(tmp / DECLARED_FILE), "--check-case-limit", str(args.timeout)]
    return pytest_command(
        pytest_args(
            plugins=(*PLUGINS, "no:cacheprovider"),
            config=("-c", str(inifile), "--rootdir", str(inifile.parent)),
            select=select,
            workers=args.workers,
            max_worker_restart=100000,  # a crashed case is reported, never rerun (check_plugin)
            timeout=args.timeout + JUDGE_GRACE_S,
            junit=junit,
            k=args.k,
            output=("-q", "-rN", "--tb=no"),
        )
    )


def child_env(workers: int) -> dict:
    """The judge's environment: the caller's (refused settings are absent by then), plugin
    autoloading off, each worker's CPU thread pool its share of the cores, and the caller's
    directory off the import path (PYTHONSAFEPATH): a `pytest_timeout.py` beside the kernel
    shadowed the real plugin in the process that writes the JUnit. Only the kernel's own
    processes (probe, executors) put the directory on their path, last."""
    env = dict(os.environ)
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", SELGATE_LANE="check", PYTHONSAFEPATH="1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    return env


def prepare_out(out: Path) -> None:
    """Removes what an earlier check wrote into `out` (its manifest lists it) and nothing else;
    refuses a folder holding result files the check did not write."""
    manifest = out / MANIFEST
    if manifest.exists():
        for name in json.loads(manifest.read_text()):
            path = (out / name).resolve()
            if path.is_relative_to(out.resolve()) and path.is_file():
                path.unlink()
        manifest.unlink()
        for folder in sorted({p.parent for p in out.rglob("*")} - {out}, reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    linked = [n for n in (*RESULT_FILES, MANIFEST, WRITE_PROBE, REPRO_DIR) if (out / n).is_symlink()]
    if linked:
        raise UsageError(
            f"--out {out}: {', '.join(linked)} {'is a symlink' if len(linked) == 1 else 'are symlinks'}, "
            "which the check's writes would follow out of the folder; remove them or choose another folder"
        )
    foreign = [n for n in RESULT_FILES if (out / n).exists()]
    if foreign:
        raise UsageError(
            f"--out {out}: holds {', '.join(foreign)} that selgate check did not write; "
            "choose another folder or remove them (the check never deletes files it did not write)"
        )


def _child_setup() -> None:
    """`preexec_fn` of the check's children: SIGINT as `default_sigint` leaves it, and no core
    files. A kernel that aborts takes its worker down with a core file of the whole process
    (190 MB each on CPU, one per crash) written into the kernel's folder; the case's report
    already names the crash, and its repro script brings it back under a debugger."""
    default_sigint()
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))


def _kill_group(proc: subprocess.Popen) -> None:
    """Every process the child started (workers, the kernel's own) dies with the run."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Run:
    """The child process in flight, so that a signal reaches the right one the right way."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.graceful = False  # pytest: SIGINT, and it writes its results; the probe: killed
        self.left_behind = 0  # processes still alive below the check after a child exited
        self.isolation = ""  # how the probe was confined, as it recorded it

    def start(self, cmd, env, graceful, **kw) -> subprocess.Popen:
        self.graceful = graceful
        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_child_setup, **kw)
        return self.proc

    def cut(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.graceful:
            self.proc.send_signal(signal.SIGINT)
        else:
            _kill_group(self.proc)

    def wait(self, timeout=None) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            _kill_group(self.proc)
            if self.proc.poll() is not None:
                self.left_behind += kill_descendants()


# What the probe's own start-up (python, torch, selgate) may take before it imports the kernel's
# module; not the kernel's time, so not --import-timeout's.
STARTUP_LIMIT_S = 300


def load(args, run: Run, tmp: Path, env: dict):
    """(Impl, None) of the implementation, described by the probe process, or (None, reason)
    when importing it failed; UsageError when the spec or the declarations are the mistake.
    Sets `run.isolation`, how the probe was confined, as its record pipe said it."""
    read_end, write_end = sandbox.record_pipe()
    try:
        return _probe(args, run, tmp, env, write_end)
    finally:
        os.close(write_end)
        run.isolation = sandbox.recorded(read_end)


def _probe(args, run: Run, tmp: Path, env: dict, record: int):
    scratch = tmp / "probe"
    sandbox.prepare(str(scratch))
    result, log = scratch / "probe.json", tmp / "probe.log"
    cmd = sandbox.command(str(scratch), "selgate.conformance.probe", args.impl, str(result), record=record)
    if args.declare:
        cmd += ["--declare", str(Path(args.declare).resolve())]
    module = args.impl.partition(":")[0]
    with open(log, "w") as sink:
        environment = sandbox.environment(str(scratch), env)
        proc = run.start(cmd, environment, graceful=False, stdout=sink, stderr=subprocess.STDOUT, pass_fds=(record,))
        started = time.monotonic()
        while not importing_marker(result).exists() and proc.poll() is None:  # selgate's own start-up
            if time.monotonic() - started > STARTUP_LIMIT_S:
                _kill_group(proc)
                proc.wait()
                return None, f"the probe did not start importing {module} within {STARTUP_LIMIT_S} s (selgate's own start-up)"
            time.sleep(0.02)
        try:
            rc = run.wait(timeout=args.import_timeout)
        except subprocess.TimeoutExpired:
            return None, f"importing {module} did not finish within {args.import_timeout} s (--import-timeout)"
    tail = " | ".join(sandbox.tail(log).strip().splitlines()[-3:])
    text = sandbox.read_regular(result, PROBE_RESULT_LIMIT)
    if text is None:
        how = f"was killed by {sandbox.signal_name(-rc)}" if rc < 0 else f"ended the process with exit status {rc}"
        return None, f"importing {module} {how} before it returned" + (f" (last output: {tail})" if tail else "")
    try:
        data = json.loads(text)
    except ValueError as e:
        return None, f"the probe's result is not JSON: {e}"
    if not isinstance(data, dict) or (data.get("ok") is True and not isinstance(data.get("declared"), dict)):
        return None, "the probe's result is not what the probe writes (an object, its declarations an object)"
    if data.get("ok") is True:
        declared = data["declared"]
        # expected failures come from a --declare file alone, which this process reads: the
        # kernel's process writes the probe's result, and could hide its failures there
        declared.pop("xfail", None)
        if args.declare:  # the user's file wins key by key (load_user_impl): read here, not as the kernel's process copied it
            try:
                declared.update(declarations.file_json(args.declare))
            except (ValueError, OSError) as e:  # the kernel's process read it with limits of its own choosing
                raise UsageError(str(e)) from None
        if "varlen" in declared:  # where the executors import it from: this process says, not the kernel's
            declared["varlen"] = declarations.varlen_source(args.impl, args.declare)
        try:
            impl = described_impl(args.impl, declared)
        except ValueError as e:
            return None, f"the probe's result does not validate: {e}"
        try:
            (tmp / DECLARED_FILE).write_text(json.dumps(declared))
        except OSError as e:  # the kernel's processes may fill the disk their scratch folders lie on
            return None, f"the check could not write its own files in {tmp} ({e.strerror or e})"
        return impl, None
    if data.get("usage") is True:
        raise UsageError(str(data.get("error")))
    return None, str(data.get("error"))


def writable(out: Path) -> None:
    """UsageError unless `out` takes a file of a report's size (`cli_args.cannot_write`)."""
    why = cannot_write(out)
    if why:
        raise UsageError(f"--out {out}: cannot write a report there ({why})")


@dataclass
class Ran:
    """What running the matrix left for the judge: the implementation as the probe described
    it (None when importing it failed, `load_error` says why), pytest's exit status (None when
    pytest never started), the signal that cut the run, how many processes outlived their
    parent, and the probe's confinement line."""

    impl: Impl | None
    load_error: str | None
    status: int | None
    cut: str | None
    left_behind: int
    isolation: str


def run_matrix(args, out: Path) -> Ran:
    """Probes `args.impl`, then runs its matrix with the JUnit in `out`; UsageError when the
    spec or the declarations are the mistake."""
    runner = Run()
    env = child_env(args.workers)
    status = None
    tmp = Path(tempfile.mkdtemp(prefix="selgate-check-"))
    try:
        with Cut(runner.cut) as cut:
            impl, load_error = load(args, runner, tmp, env)
            if impl is not None and cut.signal is None:
                print(f"selgate check {args.impl}: {args.workers} worker(s), size {args.size}, reports in {out}", flush=True)
                runner.start(check_command(args, out / "junit.xml", tmp), env, graceful=True)
                status = _wait_for_results(runner, cut)
    finally:
        _remove(tmp)
    return Ran(impl, load_error, status, cut.signal, runner.left_behind, runner.isolation.strip())


def _remove(folder: Path) -> None:
    """The run's temporary folder, whatever the kernel's processes built in their scratch folders
    beneath it: a tree 5000 folders deep took shutil.rmtree past Python's recursion limit before
    the report was written. `rm -rf` walks it without recursion; what it cannot remove stays."""
    subprocess.run(["rm", "-rf", "--", str(folder)], stdin=subprocess.DEVNULL, capture_output=True, check=False)


def _wait_for_results(runner: Run, cut: Cut) -> int:
    """pytest's exit status; after a cut it has CUT_GRACE_S to write its results, then dies."""
    while True:
        try:
            return runner.wait(timeout=None if cut.signal is None else CUT_GRACE_S)
        except subprocess.TimeoutExpired:
            return -signal.SIGKILL
