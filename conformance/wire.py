"""How tensors travel between the judge and the kernel's executor: over a pipe, as a JSON header
and the raw bytes of each storage, copied. Nothing is unpickled (a pickle from the kernel's
process would run its code in the judge), nothing is shared (the executor cannot rewrite a
result after the judge read it), and a tensor arrives with the layout it left with: dtype,
shape, strides, storage offset, and one storage for the tensors that shared one.

A value is None, a bool, int, float (NaN and infinities included), str, a list or tuple of
values, or a tensor; anything else is refused (ValueError) by the side that sends it.
"""

from __future__ import annotations

import json
import struct

import torch

MAX_HEADER = 1 << 26  # a header is names and shapes: more is a broken or hostile peer


class Closed(EOFError):
    """The other side is gone (its process ended or closed the pipe)."""


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {name!r}")
    return dtype


class Encoder:
    """Values to JSON, with each distinct storage listed once (`storages`, `blobs`)."""

    def __init__(self):
        self.storages, self.blobs, self.objects, self._index = [], [], [], {}

    def storage(self, t: torch.Tensor) -> int:
        s = t.untyped_storage()
        key = (t.device.type, t.device.index, s.data_ptr(), s.nbytes())
        if key not in self._index:
            self._index[key] = len(self.storages)
            self.storages.append({"nbytes": s.nbytes(), "device": str(t.device)})
            self.objects.append((s, t.device))
            if t.device.type != "meta":
                raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(s)
                self.blobs.append(raw.cpu().numpy().tobytes())
            else:
                self.blobs.append(b"")
        return self._index[key]

    def value(self, x):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, torch.Tensor):
            return {
                "tensor": self.storage(x),
                "dtype": str(x.dtype).removeprefix("torch."),
                "shape": list(x.shape),
                "stride": list(x.stride()),
                "offset": x.storage_offset(),
                "grad": x.requires_grad,
            }
        if isinstance(x, (list, tuple)):
            return {"tuple" if isinstance(x, tuple) else "list": [self.value(i) for i in x]}
        raise ValueError(f"cannot send a {type(x).__name__}")


class Decoder:
    """JSON and blobs back to values; storages are rebuilt once each, on their device."""

    def __init__(self, storages: list, blobs: list):
        if len(storages) != len(blobs):
            raise ValueError("storages and blobs disagree")
        self.made = []
        for meta, blob in zip(storages, blobs):
            device = torch.device(meta["device"])
            if device.type == "meta":
                self.made.append(torch.empty(int(meta["nbytes"]), dtype=torch.uint8, device="meta").untyped_storage())
                continue
            self.made.append(blob.to(device).untyped_storage())  # a uint8 tensor of its own (recv)

    def value(self, x):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, dict) and "tensor" in x:
            s = self.made[int(x["tensor"])]
            t = torch.empty(0, dtype=_dtype(x["dtype"]), device=s.device)
            t.set_(s, int(x["offset"]), [int(i) for i in x["shape"]], [int(i) for i in x["stride"]])
            return t.requires_grad_() if x.get("grad") else t
        if isinstance(x, dict) and "tuple" in x:
            return tuple(self.value(i) for i in x["tuple"])
        if isinstance(x, dict) and "list" in x:
            return [self.value(i) for i in x["list"]]
        raise ValueError(f"not a value: {str(x)[:80]}")


def tensors(x):
    """The tensors of a value (nested lists, tuples and dict values), in order."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for i in x:
            yield from tensors(i)
    elif isinstance(x, dict):
        for i in x.values():
            yield from tensors(i)


def send(f, header: dict, enc: Encoder | None = None) -> None:
    """Writes `header` (with `enc`'s storages) and the storages' bytes to the binary file `f`."""
    blobs = enc.blobs if enc else []
    header = {**header, "storages": enc.storages if enc else []}
    head = json.dumps(header).encode()
    f.write(struct.pack("<Q", len(head)) + head)
    for blob in blobs:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
    f.flush()


def _fill(f, view: memoryview) -> None:
    """Fills `view` from `f`, buffered or not (an unbuffered pipe gives what it holds a read)."""
    got = 0
    while got < len(view):
        k = f.readinto(view[got:])
        if not k:
            raise Closed("the pipe closed mid-message" if got else "the pipe closed")
        got += k


def _read(f, n: int) -> bytearray:
    data = bytearray(n)
    _fill(f, memoryview(data))
    return data


def recv(f) -> tuple[dict, Decoder]:
    """(header, a Decoder of its storages) of the next message on `f`."""
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > MAX_HEADER:
        raise ValueError(f"a header of {n} bytes")
    header = json.loads(_read(f, n))
    blobs = []
    for meta in header.get("storages", []):
        (m,) = struct.unpack("<Q", _read(f, 8))
        if not isinstance(meta, dict) or m != (0 if meta.get("device") == "meta" else meta.get("nbytes")):
            raise ValueError(f"a storage of {m} bytes where the header says {meta!r}")
        blob = torch.empty(m, dtype=torch.uint8)  # pages are touched as the bytes arrive, not before
        _fill(f, memoryview(blob.numpy()))
        blobs.append(blob)
    return header, Decoder(header.get("storages", []), blobs)
