"""`python -m selgate.conformance.executor IN_FD OUT_FD`: the process that calls a kernel for a
judge (`remote.Executor`: `selgate check`'s workers, started confined by `sandbox.command`, or a
lane's with `--executors`). It receives inputs, runs the kernel's forward (and, on request, its
backward), and sends back the outputs, the gradients and the bytes of any input the call wrote
into; nothing else. No pytest, no reference, no comparison is imported here (and under the check
no variable of pytest's or selgate's is set): whether a result is right is decided elsewhere.

Requests (wire.py): {"op": "call", "fn": SPEC, "args", "kwargs"} answers {"out", "grad",
"handle", "inputs"}; {"op": "grad", "handle", "grads"} answers {"grads", "inputs"}; a raising
kernel answers {"error": {"type", "message"}}. SPEC is `package.module:callable`; a registered
implementation's calls come as {"registered": NAME or NAME.varlen} in place of "fn".
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

from . import wire
from .poison import poison_cuda_cache


class Server:
    def __init__(self):
        self.fns: dict = {}
        self.graphs: dict = {}  # handle -> (outputs, inputs, their Decoder, q k v): until the judge releases it
        self.next_handle = 0

    def fn(self, header: dict):
        key = ("registered", header["registered"]) if "registered" in header else ("fn", header["fn"])
        if key not in self.fns:
            if key[0] == "registered":
                from .registry import REGISTRY

                name, _, part = key[1].partition(".")
                self.fns[key] = getattr(REGISTRY[name], part or "call")
            else:
                from .declarations import load_callable

                self.fns[key] = load_callable(key[1])
        return self.fns[key]

    def call(self, header: dict, dec: wire.Decoder) -> tuple[dict, wire.Encoder]:
        args, kwargs = dec.value(header["args"]), dict(zip(header["kwargs"], dec.value(header["kwargs_values"])))
        inputs = list(wire.tensors((args, kwargs)))
        qkv = args[:3] if len(args) >= 3 and all(isinstance(t, torch.Tensor) for t in args[:3]) else None
        before = _snapshot(dec)
        fn = self.fn(header)
        if qkv:
            poison_cuda_cache(*qkv)
        with torch.set_grad_enabled(any(t.requires_grad for t in inputs)):
            out = fn(*args, **kwargs)
        enc = wire.Encoder()
        flat = list(wire.tensors(out))
        reply = {"out": enc.value(_detached(out)), "grad": [t.requires_grad for t in flat], "inputs": _changed(enc, dec, before)}
        if any(t.requires_grad for t in flat):
            reply["handle"] = self.keep((flat, inputs, dec, qkv))
        return reply, enc

    def keep(self, graph) -> int:
        self.next_handle += 1
        self.graphs[self.next_handle] = graph
        return self.next_handle

    def grad(self, header: dict, dec: wire.Decoder) -> tuple[dict, wire.Encoder]:
        outputs, inputs, inputs_dec, qkv = self.graphs[header["handle"]]
        pairs = [(o, g) for o, g in zip(outputs, dec.value(header["grads"])) if g is not None and o.requires_grad]
        wanted = [t for t in inputs if t.requires_grad]
        before = _snapshot(inputs_dec)
        got = [None] * len(wanted)
        if pairs and wanted:
            if qkv:
                poison_cuda_cache(*qkv)
            got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True, retain_graph=True)
        grads = iter(got)
        enc = wire.Encoder()
        reply = {"grads": enc.value([next(grads) if t.requires_grad else None for t in inputs])}
        reply["inputs"] = _changed(enc, inputs_dec, before)
        return reply, enc


def _detached(x):
    """The call's result as sent: tensors without their graph (the graph stays here)."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detached(i) for i in x)
    return x


def _snapshot(dec: wire.Decoder) -> list:
    return [None if s.device.type == "meta" else bytes(_bytes(s)) for s in dec.made]


def _bytes(s) -> bytes:
    return torch.empty(0, dtype=torch.uint8, device=s.device).set_(s).cpu().numpy().tobytes()


def _changed(enc: wire.Encoder, dec: wire.Decoder, before: list) -> list:
    """[[storage index, its bytes as a uint8 tensor]] of every input storage the call wrote into."""
    out = []
    for i, (s, b) in enumerate(zip(dec.made, before)):
        if b is not None and _bytes(s) != b:
            out.append([i, enc.value(torch.empty(0, dtype=torch.uint8, device=s.device).set_(s))])
    return out


def serve(rfile, wfile) -> None:
    server = Server()
    while True:
        try:
            header, dec = wire.recv(rfile)
        except wire.Closed:
            return
        for handle in header.get("release", ()):  # graphs the judge no longer holds
            server.graphs.pop(handle, None)
        try:
            reply, enc = (server.call if header["op"] == "call" else server.grad)(header, dec)
        except BaseException as e:  # noqa: BLE001 - whatever the kernel raised is its answer: pytest's
            # Skipped or a SystemExit too, which would otherwise end this process and cost a fresh one
            reply, enc = {"error": {"type": type(e).__name__, "message": str(e), "where": traceback.format_exc(limit=-3)}}, None
        leaving = _sticky_cuda_error()  # the judge starts a fresh executor for the next call
        if leaving:
            reply = {**reply, "leaving": True}
        wire.send(wfile, reply, enc)  # an output that cannot travel was refused above, as the call's error
        if leaving:
            return


def _sticky_cuda_error() -> bool:
    if not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any error here leaves the context unusable
        return True


def main(argv) -> int:
    rfd, wfd = argv
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the kernel's folder: started with PYTHONSAFEPATH, appended last
    with os.fdopen(int(rfd), "rb") as rfile, os.fdopen(int(wfd), "wb") as wfile:
        serve(rfile, wfile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
