"""The judge's side of `selgate check`: the outside kernel is a callable here whose calls run in
an executor process (`executor.py`, started confined by `sandbox.py`), so that what the kernel
computes and whether it is right are decided in different processes.

A remote call behaves as the kernel called in place would, as the families see it: the same
layouts reach the kernel, its outputs come back with autograd (a backward runs the kernel's
backward in its process), bytes it wrote into an input are written into the caller's input (so
`evaluation.Unmodified` still catches a kernel that normalises ranges in place), and what it
raised is raised here under its own type name and message. An executor that dies (a crash,
os._exit, a sticky CUDA error) fails the call that was in flight, naming how it ended, and a
fresh one serves the next call.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch

from . import sandbox, wire

LOG_TAIL = 3  # lines of the executor's output quoted when it dies


class KernelError(Exception):
    """What the kernel raised in its process; the subclass bears the kernel's type name.
    `broke_cuda`: the call left the process's CUDA context unusable (a sticky CUDA error)."""

    broke_cuda = False


class ExecutorDied(RuntimeError):
    """The kernel's process ended while a call was in flight."""


class KernelTimedOut(ExecutorDied):
    """A call still running at the case's deadline (`DEADLINE`): its process was killed."""


# The running case's deadline (time.monotonic()) and limit, set before each case by the check's
# plugin: a call still running then has hung, and its process is killed here, so the case fails
# naming the limit and the worker keeps its other cases (pytest-timeout's thread, a backstop past
# it, ends the whole worker). "at" None: no deadline (a lane's executors run the reviewed tree).
DEADLINE = {"at": None, "limit_s": None}


_RAISED: dict = {}


def _raised(name: str, message: str) -> Exception:
    name = name if name.isidentifier() else "KernelError"
    cls = _RAISED.setdefault(name, type(name, (KernelError,), {"__module__": "kernel"}))
    return cls(message)


class Executor:
    """One executor process, started on first use and again after one died. `confined`: started
    by `sandbox.command` (the check: the kernel is untrusted); otherwise a plain child with this
    process's environment (a lane's `--executors`: the reviewed tree's own kernels)."""

    def __init__(self, scratch_root: Path, confined: bool = True):
        self.scratch_root, self.confined = Path(scratch_root), confined
        self.proc = None
        self.released: list = []  # graphs whose autograd node is gone, told with the next request

    def start(self) -> None:
        self.scratch_root.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=f"executor-{os.getpid()}-", dir=self.scratch_root)
        to_child, from_judge = os.pipe()
        to_judge, from_child = os.pipe()
        fds = (str(to_child), str(from_child))
        if self.confined:
            # the executors of one run share what they may write (the root, not their own folder):
            # a kernel's state across its processes (a cache, a marker) survives a crash as it would
            # in one working directory
            sandbox.prepare(scratch)
            cmd = sandbox.command(str(self.scratch_root), "selgate.conformance.executor", *fds)
            env = sandbox.environment(scratch)
        else:
            cmd, env = [sys.executable, "-m", "selgate.conformance.executor", *fds], None
        # The executor's output goes where no executor may write (its scratch root's sibling), into
        # a file this process creates: a path beneath the scratch root could be a link the kernel
        # planted to a file of the judge's, which opening it here would hand the kernel to write.
        logs = self.scratch_root.with_name(self.scratch_root.name + "-logs")
        logs.mkdir(exist_ok=True)
        self.log = logs / f"{Path(scratch).name}.log"
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(to_child, from_child), cwd=os.getcwd(),
            )  # fmt: skip
        os.close(to_child)
        os.close(from_child)
        self.wfile, self.rfile = _DeadlinePipe(from_judge, select.POLLOUT), _DeadlinePipe(to_judge, select.POLLIN)

    def request(self, header: dict, enc: wire.Encoder):
        """(reply header, its Decoder); raises the kernel's error, or ExecutorDied."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        header, self.released = {**header, "release": self.released}, []
        try:
            wire.send(self.wfile, header, enc)
            reply, dec = wire.recv(self.rfile)
        except (wire.Closed, BrokenPipeError, ValueError) as e:
            raise ExecutorDied(self._died(e)) from None
        except BaseException:  # a timeout or an interrupt mid-call: the executor's state is unknown
            self.stop()
            raise
        if reply.get("leaving"):  # it found its CUDA context broken and ends after this answer
            self.stop()
        if "error" in reply:
            error = _raised(reply["error"]["type"], reply["error"]["message"])
            error.broke_cuda = bool(reply.get("leaving"))  # a crash that raised, not a refusal
            raise error
        return reply, dec

    def _died(self, error) -> str:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"the kernel's process broke the protocol ({error}) and was killed"
        self.stop()
        how = f"was killed by {sandbox.signal_name(-rc)}" if rc < 0 else f"exited with status {rc}"
        tail = " | ".join(sandbox.tail(self.log).strip().splitlines()[-LOG_TAIL:])
        return f"the kernel's process {how} during the call" + (f" (last output: {tail})" if tail else "")

    def release(self, proc, handle) -> None:
        if proc is self.proc:  # a graph of an executor that died died with it
            self.released.append(handle)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self.wfile, self.rfile):
                try:
                    f.close()
                except OSError:
                    pass
        self.proc = None


class _DeadlinePipe:
    """The judge's end of an executor's pipe, whose every read and write ends at the case's
    deadline (`DEADLINE`): a kernel that hangs, stops mid-reply or stops reading its requests
    cannot hold the worker past it. Non-blocking, waited on with poll (select refuses file
    descriptors past 1023)."""

    def __init__(self, fd: int, event: int):
        os.set_blocking(fd, False)
        self.fd, self.poller = fd, select.poll()
        self.poller.register(fd, event)

    def _wait(self) -> None:
        at = DEADLINE["at"]
        if not self.poller.poll(None if at is None else max(0.0, at - time.monotonic()) * 1000):
            raise KernelTimedOut(
                f"the kernel's call ran past the case's limit of {DEADLINE['limit_s']:g} s (the check's --timeout); "
                "its process was killed"
            )

    def readinto(self, view) -> int:
        while True:
            self._wait()
            try:
                return os.readv(self.fd, [view])  # 0: the pipe closed
            except BlockingIOError:
                continue

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._wait()
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                continue

    def flush(self) -> None:
        pass

    def close(self) -> None:
        os.close(self.fd)


class _Call(torch.autograd.Function):
    """A remote call's outputs as an autograd node whose backward runs the kernel's backward in
    its process: the output gradients go there, the input gradients come back."""

    @staticmethod
    def forward(ctx, job, *tensors):
        ctx.set_materialize_grads(False)
        ctx.job = job
        flat = list(wire.tensors(job.out))
        ctx.mark_non_differentiable(*[t for t, g in zip(flat, job.grad) if not g])
        return tuple(flat)

    @staticmethod
    def backward(ctx, *grads):
        job = ctx.job
        enc = wire.Encoder()
        header = {"op": "grad", "handle": job.handle, "grads": enc.value(list(grads))}
        reply, dec = job.executor.request(header, enc)
        job.mirror(reply["inputs"], dec)
        return (None, *dec.value(reply["grads"]))


class _Job:
    """One call: its request, and what came back."""

    def __init__(self, executor: Executor, fn: str, args, kwargs, registered: bool = False):
        self.executor = executor
        self.enc = wire.Encoder()
        self.header = {"op": "call", "registered" if registered else "fn": fn, "args": self.enc.value(tuple(args))}
        self.header["kwargs"] = list(kwargs)
        self.header["kwargs_values"] = self.enc.value(list(kwargs.values()))

    def run(self) -> None:
        reply, dec = self.executor.request(self.header, self.enc)
        self.mirror(reply["inputs"], dec)
        self.out, self.grad, self.handle = dec.value(reply["out"]), reply["grad"], reply.get("handle")

    def mirror(self, changed, dec: wire.Decoder) -> None:
        """Writes the bytes the kernel wrote into its copy of an input into the caller's input."""
        for index, value in changed:
            storage, device = self.enc.objects[int(index)]
            torch.empty(0, dtype=torch.uint8, device=device).set_(storage).copy_(dec.value(value).reshape(-1))


def _rebuild(x, flat):
    if isinstance(x, torch.Tensor):
        return next(flat)
    if isinstance(x, (list, tuple)):
        return type(x)(_rebuild(i, flat) for i in x)
    return x


def remote_callable(executor: Executor, fn: str, registered: bool = False):
    """A callable that runs `fn` in `executor` on its arguments: a kernel's `package.module:callable`,
    or with `registered` a registered implementation's `NAME` / `NAME.varlen` (a field of its own
    in the request: a user's module named `registry` was served selgate's own kernel when a spec
    prefix said which)."""

    def call(*args, **kwargs):
        job = _Job(executor, fn, args, kwargs, registered)
        job.run()
        tensors = list(wire.tensors((args, tuple(kwargs.values()))))
        if job.handle is not None:  # the executor keeps the graph until the node holding this job is gone
            weakref.finalize(job, executor.release, executor.proc, job.handle)
        if job.handle is None or not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
            return job.out
        return _rebuild(job.out, iter(_Call.apply(job, *tensors)))

    return call


def in_executor(impl, executor: Executor):
    """`impl` (a registered implementation) with its calls run in `executor`."""
    import dataclasses

    varlen = remote_callable(executor, f"{impl.name}.varlen", registered=True) if impl.varlen else None
    return dataclasses.replace(impl, call=remote_callable(executor, impl.name, registered=True), varlen=varlen)
