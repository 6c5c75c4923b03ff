"""The executor boundary of `selgate check` (conformance/remote.py, executor.py, wire.py): a
kernel called through it behaves as the kernel called in place, as the families see it, in
another process: the same outputs and gradients bit for bit, the layouts it was handed, its
writes into an input, its exceptions by name, and a crash as that call's error only."""

from __future__ import annotations

import os
from pathlib import Path


import pytest
import torch

from selgate.conformance import sandbox
from selgate.conformance.remote import Executor, ExecutorDied, KernelError, remote_callable
from selgate.reference import normalize_ranges

from tests.helpers import random_inputs
from tests.reports.test_check_cli import OUTSIDE


@pytest.fixture
def executor(tmp_path, monkeypatch):
    """A confined executor serving the outside kernels (tests/outside) and `tmp_path`'s modules."""
    for f in OUTSIDE.glob("*.py"):
        (tmp_path / f.name).write_text(f.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ex = Executor(tmp_path / "executors")
    yield ex
    ex.stop()


SHAPE = dict(B=2, S=5, G=2, h=3, Dk=8, Dv=6, S_kv=23, n=4)
# gradcheck calls the kernel twice per input element: 348 elements, with empty rows among them
GRADCHECK_SHAPE = dict(B=2, S=3, G=2, h=2, Dk=4, Dv=3, S_kv=9, n=3)


def _inputs(requires_grad=False, shape=SHAPE):
    q, k, v, r = random_inputs(**shape, dtype=torch.float64, seed=3)
    big = torch.randn(3, *k.shape[1:], dtype=k.dtype)  # k as a view at a storage offset
    big[1:] = k
    k = big[1:]
    return [t.requires_grad_(requires_grad) for t in (q, k, v)] + [r]


def test_a_remote_call_gives_what_the_call_in_place_gives_forward_and_backward(executor):
    from tokenkernels import gather

    remote = remote_callable(executor, "tokenkernels:gather")
    q, k, v, r = _inputs(requires_grad=True)
    assert k.storage_offset() > 0
    o = remote(q, k, v, r, scale=0.3)
    o_here = gather(q, k, v, r, scale=0.3)
    assert torch.equal(o, o_here) and o.requires_grad
    do = torch.randn_like(o)
    assert all(
        torch.equal(a, b) for a, b in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(o_here, (q, k, v), do))
    )
    assert executor.proc.pid != os.getpid() and executor.proc.poll() is None


def test_gradcheck_runs_through_the_boundary(executor):
    remote = remote_callable(executor, "tokenkernels:gather")
    q, k, v, r = _inputs(requires_grad=True, shape=GRADCHECK_SHAPE)
    assert torch.autograd.gradcheck(lambda q, k, v: remote(q, k, v, r), (q, k, v), eps=1e-6, atol=1e-5)


def test_the_kernels_writes_into_an_input_come_back_into_the_callers_input(executor):
    remote = remote_callable(executor, "selgate.conformance.badimpls:_normalises_in_place")
    q, k, v, r = _inputs()
    before = r.clone()
    remote(q, k, v, r)
    assert not torch.equal(r, before) and torch.equal(r, normalize_ranges(before, k.shape[2]))


def test_the_kernels_exception_keeps_its_type_name_and_message(executor):
    remote = remote_callable(executor, "tokenkernels:gather")
    q, k, v, r = _inputs()
    with pytest.raises(KernelError, match=r"\bq\b") as raised:
        remote(q[0], k, v, r)
    assert type(raised.value).__name__ == "ValueError"


def test_a_crash_fails_its_call_and_a_fresh_executor_serves_the_next(executor, tmp_path):
    (tmp_path / "crashy.py").write_text(
        "import os\nfrom tokenkernels import gather\n"
        "def fn(q, k, v, ranges, *, scale=None):\n"
        "    if q.shape[0] == 1:\n        os.abort()\n"
        "    return gather(q, k, v, ranges, scale=scale)\n"
    )
    remote = remote_callable(executor, "crashy:fn")
    q, k, v, r = _inputs()
    with pytest.raises(ExecutorDied, match="killed by SIGABRT during the call"):
        remote(q[:1], k[:1], v[:1], r[:1])
    assert remote(q, k, v, r).shape == (*q.shape[:4], v.shape[-1])


HANGS = """
import os, sys, time
from tokenkernels import gather

def fn(q, k, v, ranges, *, scale=None):
    if q.shape[1] == 5:
        return gather(q, k, v, ranges, scale=scale)
    if q.shape[1] == 2:  # it answers, then stops reading requests
        sys.modules["selgate.conformance.wire"].recv = lambda f: time.sleep(3600)
        return gather(q, k, v, ranges, scale=scale)
    if q.shape[1] == 1:  # the reply's first byte, then a hang
        os.write(int(sys.argv[-1]), b"\\x01")
    time.sleep(3600)
"""


@pytest.mark.parametrize("how, S", [("hangs", 3), ("stops mid-reply", 1), ("stops reading", 2)])
def test_a_call_past_the_cases_deadline_is_killed_and_a_fresh_executor_serves_the_next(executor, tmp_path, monkeypatch, how, S):
    """The check sets each case's deadline (`remote.DEADLINE`); every read and write of a call
    ends there, its process killed, instead of holding the worker until pytest-timeout ends it:
    a kernel that hangs, writes a reply's first byte and hangs, or stops reading requests."""
    import time

    from selgate.conformance import remote as remote_mod

    (tmp_path / "hangs.py").write_text(HANGS)
    remote = remote_callable(executor, "hangs:fn")
    q, k, v, r = _inputs()
    remote(q, k, v, r)  # started: the deadline below measures the calls, not torch's import
    proc = executor.proc
    monkeypatch.setitem(remote_mod.DEADLINE, "limit_s", 2.0)
    monkeypatch.setitem(remote_mod.DEADLINE, "at", time.monotonic() + 2.0)
    start = time.monotonic()
    with pytest.raises(remote_mod.KernelTimedOut, match=r"ran past the case's limit of 2 s \(the check's --timeout\)"):
        remote(q[:, :S], k, v, r[:, :S])
        remote(torch.zeros(1 << 18), k, v, r)  # stops reading: a request of 1 MiB, more than a pipe holds
    assert time.monotonic() - start < 10, how
    assert executor.proc is None and proc.poll() is not None, "the hung process was killed"
    monkeypatch.setitem(remote_mod.DEADLINE, "at", time.monotonic() + 120)
    assert remote(q, k, v, r).shape == (*q.shape[:4], v.shape[-1])


def test_a_storage_longer_than_its_header_says_is_refused_before_it_is_read():
    """Each storage's length comes from the peer: one that disagrees with the header is a broken
    peer, refused before any memory is taken for it (a claimed 3 GiB took 3 GiB)."""
    import io
    import json
    import struct

    from selgate.conformance import wire

    head = json.dumps({"storages": [{"nbytes": 1, "device": "cpu"}]}).encode()
    message = struct.pack("<Q", len(head)) + head + struct.pack("<Q", 3 << 30)
    with pytest.raises(ValueError, match="a storage of 3221225472 bytes where the header says"):
        wire.recv(io.BytesIO(message))


def test_a_kernel_that_floods_its_output_dies_at_the_file_limit(executor, tmp_path):
    """The executor's output file lies outside its scratch folder, on the judge's disk: a kernel
    printing without end wrote 101 MB there in seconds. Past `sandbox.FILE_LIMIT` its writes fail
    (Python ignores SIGXFSZ: EFBIG, "File too large"), and that is the call's error."""
    (tmp_path / "flood.py").write_text(
        "import sys\ndef fn(q, k, v, ranges, *, scale=None):\n    while True:\n        sys.stdout.write('x' * 65536)\n"
    )
    q, k, v, r = _inputs()
    with pytest.raises(KernelError, match="File too large"):
        remote_callable(executor, "flood:fn")(q, k, v, r)
    assert executor.log.stat().st_size <= sandbox.FILE_LIMIT


def test_a_kernels_module_named_registry_is_the_kernel_not_selgates(executor, tmp_path):
    """`registry:sdpa` is a kernel's spec like any other: a spec prefix once told the executor to
    serve selgate's registered sdpa instead (a module named `registry` beside a kernel 1 off got
    CHECK PASSED). Registered implementations travel in a field of their own."""
    (tmp_path / "registry.py").write_text(
        "from tokenkernels import gather\ndef sdpa(q, k, v, ranges, *, scale=None):\n"
        "    return gather(q, k, v, ranges, scale=scale) + 1\n"
    )
    q, k, v, r = _inputs()
    theirs = remote_callable(executor, "registry:sdpa")(q, k, v, r, scale=0.3)
    ours = remote_callable(executor, "tokenkernels:gather")(q, k, v, r, scale=0.3)
    assert torch.equal(theirs, ours + 1)


def test_the_executor_holds_no_judge(executor, tmp_path):
    """No pytest, no comparison or reference module, no PYTEST_* or SELGATE_* variable."""
    (tmp_path / "looks.py").write_text(
        "import os, sys\n"
        "def fn(q, k, v, ranges, *, scale=None):\n"
        "    seen = [m for m in ('pytest', '_pytest', 'selgate.conformance.compare', 'selgate.conformance.evaluation',\n"
        "        'selgate.reference') if m in sys.modules]\n"
        "    seen += [k for k in os.environ if k.startswith(('PYTEST_', 'SELGATE_'))]\n"
        "    raise RuntimeError(repr(seen))\n"
    )
    q, k, v, r = _inputs()
    os.environ["SELGATE_LANE"] = "check"
    try:
        with pytest.raises(KernelError, match=r"^\[\]$"):
            remote_callable(executor, "looks:fn")(q, k, v, r)
    finally:
        del os.environ["SELGATE_LANE"]


def test_the_executors_output_is_a_file_the_judge_creates_where_no_executor_writes(executor):
    """The judge opens the executor's output file: beneath the scratch root, where the kernel
    writes, that path could be a link it planted to a file of the judge's (an open following it
    handed the kernel a descriptor to write there). It lies beside the root, created anew."""
    q, k, v, r = _inputs()
    remote_callable(executor, "tokenkernels:gather")(q, k, v, r, scale=0.3)
    log = executor.log.resolve()
    assert log.exists() and not log.is_symlink() and log.parent.name == "executors-logs"
    assert not any(log.is_relative_to(Path(p).resolve()) for p in sandbox.writable_paths(str(executor.scratch_root)))


@pytest.mark.skipif(sandbox.abi() < 4, reason="landlock handles TCP from ABI 4 on; this machine's kernel offers less")
def test_the_kernel_opens_no_tcp_connection(executor, tmp_path):
    """A port listening on this machine (a service, a container engine's API) is out of reach."""
    import socket

    (tmp_path / "dials.py").write_text(
        "import socket\n"
        "def fn(q, k, v, ranges, *, scale=None):\n"
        "    with socket.create_connection(('127.0.0.1', int(open('port').read())), timeout=5):\n"
        "        raise RuntimeError('connected')\n"
    )
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        (tmp_path / "port").write_text(str(server.getsockname()[1]))
        q, k, v, r = _inputs()
        with pytest.raises(KernelError, match="Permission denied"):
            remote_callable(executor, "dials:fn")(q, k, v, r)


def test_the_writable_devices_are_the_standard_ones_and_the_gpus():
    """An allow-list, not every character device: what CUDA opens (the GPU's files, where this
    machine has them) is in it, and nothing outside the two lists."""
    import fnmatch

    files = sandbox.device_files()
    assert "/dev/null" in files
    gpu = [f for f in files if any(fnmatch.fnmatch(f, p) for p in sandbox.GPU_DEVICES)]
    assert sorted(set(files) - set(gpu)) == sorted(f"/dev/{n}" for n in sandbox.STANDARD_DEVICES if os.path.exists(f"/dev/{n}"))
    assert ("/dev/nvidiactl" in files) == os.path.exists("/dev/nvidiactl")


@pytest.mark.skipif(not sandbox.abi(), reason="this machine's kernel offers no landlock")
def test_the_kernel_writes_no_disk_makes_no_device_and_holds_no_capability(executor, tmp_path):
    """A root kernel that could write /dev rewrote the judge's installed files through the block
    device beneath them: of /dev only the standard devices and the GPUs' are writable (not
    /dev/kmsg, /dev/kvm, /dev/fuse, /dev/loop-control, where they exist), a device node cannot
    be made (nor a new file in /dev), and no capability is left."""
    (tmp_path / "devices.py").write_text(
        "import os, stat\n"
        "def attempt(f):\n"
        "    try:\n"
        "        f()\n"
        "        return 'done'\n"
        "    except OSError as e:\n"
        "        return 'refused'\n"
        "def fn(q, k, v, ranges, *, scale=None):\n"
        "    seen = {'null': attempt(lambda: open('/dev/null', 'w').write('x'))}\n"
        "    seen['new file in /dev'] = attempt(lambda: open('/dev/selgate-planted', 'w'))\n"
        "    seen['mknod'] = attempt(lambda: os.mknod('node', stat.S_IFBLK | 0o600, os.makedev(7, 0)))\n"
        "    disks = [e.path for e in os.scandir('/dev') if stat.S_ISBLK(e.stat(follow_symlinks=False).st_mode)]\n"
        "    seen['disks'] = sorted({attempt(lambda d=d: os.close(os.open(d, os.O_WRONLY))) for d in disks})\n"
        "    others = [f'/dev/{n}' for n in ('kmsg', 'kvm', 'fuse', 'loop-control') if os.path.exists(f'/dev/{n}')]\n"
        "    seen['others'] = sorted({attempt(lambda d=d: os.close(os.open(d, os.O_WRONLY))) for d in others})\n"
        "    caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n"
        "    seen['capabilities'] = sorted(set(caps))\n"
        "    raise RuntimeError(repr(seen))\n"
    )
    q, k, v, r = _inputs()
    with pytest.raises(KernelError) as e:
        remote_callable(executor, "devices:fn")(q, k, v, r)
    seen = eval(str(e.value)[str(e.value).index("{") :])
    assert seen["null"] == "done"
    assert seen["new file in /dev"] == "refused" and seen["mknod"] == "refused"
    assert seen["disks"] in ([], ["refused"]) and seen["others"] in ([], ["refused"]), seen
    assert seen["capabilities"] == ["0000000000000000"], seen
    assert not os.path.exists("/dev/selgate-planted")


@pytest.mark.skipif(
    sandbox.abi() < 6, reason="landlock scopes abstract unix sockets from ABI 6 on; this machine's kernel offers less"
)
def test_the_kernel_reaches_no_abstract_unix_socket_outside_its_process(executor, tmp_path):
    """An abstract unix socket (no file: landlock's paths do not cover it) listening in another
    process, such as the determinism family's other process, is out of reach."""
    import socket

    (tmp_path / "dials_unix.py").write_text(
        "import socket\n"
        "def fn(q, k, v, ranges, *, scale=None):\n"
        "    with socket.socket(socket.AF_UNIX) as s:\n"
        "        s.connect(b'\\0selgate-test-' + open('name', 'rb').read())\n"
        "        raise RuntimeError('connected')\n"
    )
    with socket.socket(socket.AF_UNIX) as server:
        name = f"{os.getpid()}-{tmp_path.name}".encode()
        server.bind(b"\0selgate-test-" + name)
        server.listen()
        (tmp_path / "name").write_bytes(name)
        q, k, v, r = _inputs()
        with pytest.raises(KernelError, match="Operation not permitted|Permission denied"):
            remote_callable(executor, "dials_unix:fn")(q, k, v, r)
