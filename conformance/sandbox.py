"""Where the kernel under `selgate check` runs: processes (the probe that imports it, the
executors that call it) that start confined before any of the kernel's code, or site's, runs.

- Landlock (Linux >= 5.13, any user, root included): the process and everything it starts
  may create, write, rename or delete files only beneath the folders it is given (its own
  scratch folder, the Triton cache, /dev/shm and /proc for CUDA) and write only the character
  devices of /dev (never a disk), and it holds no capability; from landlock ABI 6 on
  it cannot signal processes outside its domain nor connect to their abstract unix sockets (the
  determinism family's two processes included), and from the first ABI it cannot ptrace them
  (nor write their memory through /proc). So the kernel cannot rewrite the check's results,
  the judge's files or the judge itself.
- From landlock ABI 4 on it can neither connect to nor listen on a TCP port (a service on the
  machine, a container engine's API, another copy of itself elsewhere).
- The parent's death kills it (PR_SET_PDEATHSIG), and the check, a child subreaper, kills every
  process left below it before it reads a result (`reaper.py`).
- Its environment holds no PYTEST_* or SELGATE_* variable, and it imports neither pytest nor
  selgate's comparison or reference: a kernel meets no tell of being judged by accident.

This file is standard library only: the executor's interpreter runs it with `-S` (no site, so
no `.pth` file of any installed package has run), confines itself, then runs `site.main()`
and the module it was asked for (`boot`).
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import sys

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
# LANDLOCK_ACCESS_FS_*: every right that changes the file system (reading, executing and device
# ioctls stay allowed everywhere), by the ABI that introduced it
_WRITES = {1: sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12)), 2: 1 << 13, 3: 1 << 14}
_MAKE_DEVICES = (1 << 6) | (1 << 11)  # MAKE_CHAR, MAKE_BLOCK: handled, granted nowhere
_FILE_WRITES = (1 << 1) | (1 << 14)  # WRITE_FILE, TRUNCATE: what a rule on one file may grant
_NET_TCP = (1 << 0) | (1 << 1)  # LANDLOCK_ACCESS_NET_BIND_TCP, _CONNECT_TCP (ABI 4): handled, no rule grants them
_SCOPES = (1 << 0) | (1 << 1)  # ABI 6: LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, _SIGNAL
# the largest file a confined process may write (its output log, which lies outside its scratch
# folder, included): past it its writes fail (EFBIG; Python ignores SIGXFSZ). Triton's cache
# files, compiled kernels, are a few MB.
FILE_LIMIT = 256 << 20


class _PathBeneath(ctypes.Structure):
    """struct landlock_path_beneath_attr, packed."""

    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The landlock ABI this kernel offers, 0 where it offers none."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


COMMON = "they run without pytest, selgate's comparison or reference, or any PYTEST_*/SELGATE_* variable"
NO_RECORD = f"unknown (the confined process said nothing on its record pipe); {COMMON}"
# What a root process may still write beneath /proc that reaches outside its sandbox (kernel
# settings such as core_pattern run a program outside it): read-only in its own mount namespace,
# as container runtimes mount them
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")


def record_pipe() -> tuple[int, int]:
    """(read end, write end) of the pipe a confined process says its confinement on: `boot`
    writes one line and closes its end before the kernel's code loads, so what the judge reads
    is `boot`'s, never a line the kernel wrote (a file in its scratch folder, the kernel could rewrite)."""
    return os.pipe()


def recorded(read_end: int) -> str:
    """The line a confined process wrote on its record pipe (`record_pipe`), without waiting (call
    it once the process is past `boot`: ended, or importing the kernel); closes `read_end`."""
    os.set_blocking(read_end, False)
    try:
        with os.fdopen(read_end, "rb") as f:
            return (f.read(4096) or b"").decode(errors="replace").partition("\n")[0].strip() or NO_RECORD
    except BlockingIOError:
        return NO_RECORD


def confine(writable) -> None:
    """Confines this process and its future children: files change only beneath `writable`.
    Raises OSError where landlock is missing or refuses."""
    libc = _libc()
    version = abi()
    if not version:
        raise OSError("landlock is not available")
    handled = sum(bits for v, bits in _WRITES.items() if v <= version)
    fields = [handled, _NET_TCP if version >= 4 else 0] + ([_SCOPES] if version >= 6 else [])
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr) if version >= 4 else 8), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        rules = [(path, handled & ~_MAKE_DEVICES) for path in writable] + [(f, handled & _FILE_WRITES) for f in device_files()]
        for path, access in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(access, fd)
                if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    drop_capabilities()


# The device files a kernel's process may open for writing: the standard ones programs write to,
# and the GPUs' (NVIDIA's control, per-GPU, UVM and MIG capability files; ROCm's kfd and render
# nodes). The rest of /dev (kmsg, kvm, fuse, loop-control, the disks) is read-only to it.
STANDARD_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/kfd", "/dev/dri/renderD*")


def device_files() -> list:
    """The device files a confined process may write, one rule each: character devices of
    `STANDARD_DEVICES` and `GPU_DEVICES` that exist here. Never a block device: a process that
    writes a disk beneath its file system rewrites any file (the check's own code) whatever
    landlock says of paths."""
    import glob

    names = [f"/dev/{n}" for n in STANDARD_DEVICES] + [p for pattern in GPU_DEVICES for p in glob.glob(pattern)]
    out = []
    for path in names:
        try:
            if stat.S_ISCHR(os.stat(path, follow_symlinks=False).st_mode):
                out.append(path)
        except OSError:
            continue
    return sorted(set(out))


def drop_capabilities() -> None:
    """Every capability dropped by this process and its future children (root stays uid 0 but can
    no longer make device nodes, send raw SCSI writes, read physical memory or load modules).
    Dropping is allowed to any process; the bounding set needs CAP_SETPCAP, which only root has."""
    libc = _libc()
    pr_capbset_drop, pr_cap_ambient, pr_cap_ambient_clear_all = 24, 47, 4
    libc.prctl(pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0)
    for cap in range(64):  # those the kernel does not know fail with EINVAL, harmlessly
        libc.prctl(pr_capbset_drop, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice 32 bits, all zero
    if libc.capset(ctypes.byref(header), ctypes.byref(data)) != 0:  # glibc's wrapper: any architecture
        raise OSError(ctypes.get_errno(), "capset")


def triton_cache() -> str:
    """Triton's cache folder as Triton resolves it, so compiled kernels survive between checks."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")


def writable_paths(folder: str) -> list:
    """The folders beneath which a confined process may write: `folder`, Triton's cache, /dev/shm
    (POSIX semaphores and shared memory, as multiprocessing uses them) and /proc: CUDA's
    initialisation fails (cudaGetDeviceCount, error 304) where /proc cannot be written, on an
    H100 with landlock ABI 7. /proc of another process stays closed: landlock refuses ptrace
    access to processes outside the domain, which /proc/<pid>/mem, fd and the like require.
    Device files are granted one by one (`device_files`)."""
    return [folder, triton_cache(), *[p for p in ("/dev/shm",) if os.path.isdir(p)], "/proc"]


def environment(scratch: str, base=None) -> dict:
    """The kernel's processes' environment: `base`'s (default os.environ) without PYTEST_* and
    SELGATE_*, with temporary files, caches other than Triton's and bytecode inside `scratch`."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(("PYTEST_", "SELGATE_"))}
    cache = os.path.join(scratch, "cache")
    env.update(
        TMPDIR=scratch,
        XDG_CACHE_HOME=cache,
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
        CUDA_CACHE_PATH=os.path.join(cache, "nv"),
        TRITON_CACHE_DIR=triton_cache(),
        PYTHONSAFEPATH="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


_BOOT = "import sys; ns = {}; exec(compile(open(sys.argv[1]).read(), sys.argv[1], 'exec'), ns); ns['boot'](sys.argv[2:])"


def command(folder: str, module: str, *args: str, record: int = -1) -> list:
    """The command line that runs `python -m module args` confined to writing beneath `folder`
    (the process's scratch folder, or a folder above the scratch folders of its peers); the
    process says how it was confined on the file descriptor `record` (pass it on; -1: nowhere)."""
    head = json.dumps({"writable": writable_paths(folder), "record": record})
    return [sys.executable, "-S", "-c", _BOOT, os.path.abspath(__file__), head, module, *args]


def signal_name(number: int) -> str:
    """`SIGABRT` for 6; `signal 40` for a real-time signal, which has no name in `signal.Signals`
    (a probe that killed itself with one crashed the check's message about it)."""
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def tail(path, size: int = 1 << 16) -> str:
    """The last `size` bytes of a log a confined process wrote, as text."""
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return f.read().decode(errors="replace")


def read_regular(path, limit: int):
    """The first `limit` bytes of `path` as text, or None unless it is a regular file: the
    kernel's processes write their scratch folders, where a FIFO in place of a result would
    block its reader forever and a symlink would point it elsewhere."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(limit).decode(errors="replace")


def prepare(scratch: str) -> None:
    """Makes the folders the confined process may write, which must exist before it confines itself."""
    for path in (scratch, triton_cache()):
        os.makedirs(path, exist_ok=True)


def _proc_read_only() -> str:
    """As root: the kernel settings under /proc read-only in a mount namespace of this process's
    own (mount(2) is closed to it once landlock confines it, so it cannot undo this)."""
    if os.geteuid() != 0:
        return ""
    if all(os.statvfs(p).f_flag & os.ST_RDONLY for p in PROC_READ_ONLY if os.path.exists(p)):
        return "; /proc/sys and the other kernel settings read-only (as mounted)"
    libc = _libc()
    ms_rdonly, ms_remount, ms_bind, ms_rec, ms_private = 1, 0x20, 0x1000, 0x4000, 1 << 18
    steps = [lambda: libc.unshare(0x20000), lambda: libc.mount(b"none", b"/", None, ms_rec | ms_private, None)]
    for path in (p.encode() for p in PROC_READ_ONLY if os.path.exists(p)):
        steps.append(lambda path=path: libc.mount(path, path, None, ms_bind | ms_rec, None))
        steps.append(lambda path=path: libc.mount(None, path, None, ms_bind | ms_remount | ms_rdonly, None))
    for step in steps:
        if step() != 0:
            return f"; as root it could write /proc/sys (no mount namespace: {os.strerror(ctypes.get_errno())})"
    return "; /proc/sys and the other kernel settings read-only in a mount namespace of its own"


def confinement(writable) -> str:
    """Confines this process as far as the machine allows; the line saying how."""
    version = abi()
    proc = _proc_read_only()
    if not version:
        return f"no landlock on this machine's kernel: the kernel's processes could write the results folder; {COMMON}"
    confine(writable)
    reach = "signal, ptrace or reach by an abstract unix socket" if version >= 6 else "ptrace"
    tcp = ", open no TCP connection" if version >= 4 else ""
    return (
        f"landlock ABI {version}: the kernel's processes (probe, executors) write files only beneath their own "
        f"scratch folder, Triton's cache ({triton_cache()}), /dev/shm and /proc, and of /dev the GPUs' and the standard "
        "devices (null, zero, tty, ...), hold no "
        f"capability{tcp}, and cannot {reach} the check's{proc}; {COMMON}"
    )


def boot(argv) -> None:
    """In the new interpreter (started with -S): die with the parent, confine (recording how),
    then load site and run the module."""
    import runpy

    head, module, *args = json.loads(argv[0]), argv[1], *argv[2:]
    _libc().prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when the judge that started it dies
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))  # its logs are the judge's disk
    line = confinement(head["writable"])
    if head["record"] >= 0:
        with os.fdopen(head["record"], "w") as f:  # closed here: nothing loaded later can write on it
            f.write(line + "\n")
    import site

    site.main()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
