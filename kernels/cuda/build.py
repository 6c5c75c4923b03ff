"""On-demand build of the CUDA decode extension (`torch.utils.cpp_extension.load`).

Each build lands in its own directory keyed by the hash of the sources and flags and by the
device's compute capability, so a stale or foreign binary is never loaded and a second
process reuses the first one's build; processes building into one directory take turns
(an flock, released even when its holder is killed). A failed build is remembered for the
process: the wrapper then falls back (reason "build") instead of recompiling on every call.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from selgate import env_vars

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("sel_decode.cu", "sel_decode_bind.cpp")
HEADERS = ("sel_decode.h",)
# No --use_fast_math: the kernels call exp2f/log2f on pre-scaled scores, which keep their
# accuracy without it, and fast math would also flush denormals in the p*V sums.
CUDA_FLAGS = ("-O3", "-std=c++17", "-lineinfo")
CXX_FLAGS = ("-O3", "-std=c++17")


class BuildError(RuntimeError):
    """The extension could not be compiled or loaded; the message ends with the compiler's output."""


def source_hash(source_dir: Path = SOURCE_DIR) -> str:
    """sha256 over the sources, headers, flags and TORCH_CUDA_ARCH_LIST (which changes the build)."""
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode() + b"\0" + (source_dir / name).read_bytes() + b"\0")
    h.update(" ".join((*CUDA_FLAGS, *CXX_FLAGS)).encode())
    h.update(os.environ.get("TORCH_CUDA_ARCH_LIST", "").encode())
    return h.hexdigest()


def cache_dir(arch: str, source_dir: Path = SOURCE_DIR) -> Path:
    """Build directory for compute capability `arch` (e.g. "90"): `$SELGATE_CUDA_CACHE`
    (default ~/.cache/selgate/cuda) / `<hash16>-sm<arch>-torch<version>`."""
    import torch

    base = env_vars.get("SELGATE_CUDA_CACHE")
    return base / f"{source_hash(source_dir)[:16]}-sm{arch}-torch{torch.__version__.replace('+', '_')}"


_lock = threading.Lock()
_loaded: dict[str, object] = {}  # arch -> extension module or the BuildError it raised
build_seconds: dict[str, float] = {}  # arch -> wall time of this process's build or load


def device_arch(device=None) -> str:
    from selgate.device import device_capability

    major, minor = device_capability(device)
    return f"{major}{minor}"


def load_extension(device=None):
    """The compiled extension for `device`'s architecture; builds it on first use.

    Raises `BuildError` (also on every later call once a build failed in this process)."""
    arch = device_arch(device)
    with _lock:
        if arch not in _loaded:
            _loaded[arch] = _build(arch)
        ext = _loaded[arch]
    if isinstance(ext, BuildError):
        raise ext
    return ext


def _build(arch: str):
    out = cache_dir(arch)
    start = time.perf_counter()
    try:
        ext = _load_in(
            out, f"selgate_sel_decode_{out.name[:16]}_sm{arch}", SOURCE_DIR, arch, verbose=env_vars.get("SELGATE_CUDA_VERBOSE")
        )
    except Exception as exc:  # lock, compiler, linker or import failure: keep the reason, fall back
        return BuildError(f"building the CUDA decode extension in {out} failed: {exc}")
    build_seconds[arch] = time.perf_counter() - start
    return ext


def _load_in(out: Path, name: str, source_dir: Path, arch: str, *, verbose: bool = False):
    """Build (or reuse) and import the extension from `source_dir` into `out`.

    One builder per build directory across processes (xdist workers build side by side).
    torch's own lock is a file that outlives a builder killed mid-build (a per-test timeout
    does that), after which every later load waits on it forever; an flock is released by
    the kernel when its holder dies, and while we hold it any torch lock file in the
    directory is such a leftover. (The dead builder's compiler may still be running; a build
    it then spoils fails to load and is reported, it is never used.)"""
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as guard:
        _take_turn(guard, out, env_vars.get("SELGATE_CUDA_BUILD_WAIT"))
        (out / "lock").unlink(missing_ok=True)
        return load(
            name=name,
            sources=[str(source_dir / s) for s in SOURCES],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=[*CUDA_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}"],
            build_directory=str(out),
            verbose=verbose,
        )


def _take_turn(guard, out: Path, wait_s: float) -> None:
    """Hold the exclusive flock on `guard`, waiting at most `wait_s` seconds for another builder."""
    import fcntl

    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"another process has been building into {out} for more than {wait_s:g} s (SELGATE_CUDA_BUILD_WAIT)"
                ) from None
            time.sleep(0.2)


def patched_copy(dest: Path, edits: dict[str, list[tuple[str, str]]]) -> Path:
    """The extension's sources copied into `dest` with every `(anchor, replacement)` of
    `edits[file]` applied. For probes that instrument or vary the kernel in a private build:
    an anchor found other than exactly once raises ValueError, so a probe fails loudly when
    the kernel's text moves instead of timing an unpatched copy. A file whose text is
    already there is not rewritten, so its build stays up to date."""
    dest.mkdir(parents=True, exist_ok=True)
    unknown = set(edits) - {*SOURCES, *HEADERS}
    if unknown:
        raise ValueError(f"edits: {sorted(unknown)} are not sources of the extension {[*SOURCES, *HEADERS]}")
    for name in (*SOURCES, *HEADERS):
        text = (SOURCE_DIR / name).read_text()
        for anchor, replacement in edits.get(name, ()):
            found = text.count(anchor)
            if found != 1:
                raise ValueError(f"edits[{name!r}]: anchor {anchor[:60]!r} found {found} times, expected once")
            text = text.replace(anchor, replacement)
        target = dest / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    return dest


def load_patched(name: str, edits: dict[str, list[tuple[str, str]]]):
    """Build (or reuse) and load a private copy of the extension with `edits` applied
    (`patched_copy`) in `<tmp>/<name>`: processes that share `name` share the build, taking
    turns as `_load_in` does."""
    import tempfile

    out = Path(tempfile.gettempdir()) / name
    return _load_in(out, name, patched_copy(out, edits), device_arch())


def prebuild() -> None:
    """Eager build (SELGATE_CUDA_BUILD=1 at import): compile now for the current device so the
    first decode call pays nothing. Without a CUDA device there is nothing to build for."""
    import warnings

    import torch

    if not torch.cuda.is_available():
        warnings.warn(
            "SELGATE_CUDA_BUILD=1 but no CUDA device is visible: the CUDA decode kernel is not built",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    try:
        load_extension()
    except BuildError as exc:
        warnings.warn(f"SELGATE_CUDA_BUILD=1: {exc}", RuntimeWarning, stacklevel=2)
