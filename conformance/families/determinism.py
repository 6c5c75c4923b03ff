"""Family determinism: repeated runs are bitwise identical (SPEC.md, "Determinism"), within
one process and across processes. Within: each case runs several times in its process.
Across, two ways (a kernel seeded by its process id, or tuned differently in each process, is
repeatable within one process only):
- in a lane, a registered implementation runs each case once more in a second process of the
  worker's (an executor, `second_process`), compared bitwise with the first run;
- with the plugin's `--checksums DIR`, each process writes the sha256 of every tensor of a
  case's first run to DIR (`record`), and `differences` compares the files of two runs made in
  distinct processes; `selgate check` runs the determinism cases a second time, in fresh
  processes, for it."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import Result, evaluate, golden_fn, impl_fn, make_upstream
from ..family import DETERMINISTIC, Family, repeatable
from ..registry import Impl

CHECKSUMS: dict = {"dir": None}  # where this process records checksums (plugin.py: --checksums)
SECOND: dict = {"executor": None}  # this worker's second process (`second_process`), started on first use
PROCESS = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # a pid can be reused; this token cannot


def check(impl: Impl, case: Case, device, backward: bool = False) -> None:
    """Repeated runs give bitwise-identical o and lse (and dq, dk, dv with `backward`):
    5 runs on a GPU, where reduction order can race; 2 on CPU, to keep the interpreter cheap."""
    runs = 5 if torch.device(device).type == "cuda" else 2
    inp = make_inputs(case, device)
    up = None
    if backward:
        gold = evaluate(golden_fn(inp.ranges, inp.scale), inp.q, inp.k, inp.v)
        up = make_upstream(gold.o, gold.lse, case.seed)
    fn = impl_fn(impl, inp.ranges, inp.scale)
    first = evaluate(fn, inp.q, inp.k, inp.v, up)
    record(f"test_determinism{'_backward' if backward else ''}[{impl.name}-{case.id}]", first, (inp.q, inp.k, inp.v, inp.ranges))
    for i in range(1, runs):
        _same(evaluate(fn, inp.q, inp.k, inp.v, up), first, case, f"run {i + 1} vs run 1 must be bitwise identical")
    other = second_process(impl)
    if other is not None:
        again = evaluate(impl_fn(other, inp.ranges, inp.scale), inp.q, inp.k, inp.v, up)
        _same(again, first, case, "a second process's run vs this process's must be bitwise identical")


def _same(again: Result, first: Result, case: Case, why: str) -> None:
    pairs = [("o", again.o, first.o), ("lse", again.lse, first.lse)]
    if first.grads is not None:
        pairs += list(zip(("dq", "dk", "dv"), again.grads, first.grads))
    for name, a, b in pairs:
        if a is not None:
            assert_equal(name, a, b, case_id=case.id, why=why)


def second_process(impl: Impl) -> Impl | None:
    """`impl` called in this worker's second process: an executor (conformance/executor.py) with
    this process's environment, started on first use. None where this run does not compare
    processes itself: under `--checksums` (`selgate check` compares two whole runs) and for an
    implementation no other process can load (an outside kernel: the check's to judge)."""
    import dataclasses

    from ..registry import REGISTRY
    from ..remote import Executor, remote_callable

    spec = impl.spec or (f"registry:{impl.name}" if impl.name in REGISTRY else None)
    if CHECKSUMS["dir"] is not None or spec is None:
        return None
    if SECOND["executor"] is None:
        import tempfile

        SECOND["executor"] = Executor(Path(tempfile.mkdtemp(prefix="selgate-second-process-")), confined=False)
    return dataclasses.replace(impl, call=remote_callable(SECOND["executor"], spec))


def checksum(t: torch.Tensor) -> str:
    """The sha256 of the tensor's bytes (its dtype's bit patterns, in logical order)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def record(key: str, result: Result, inputs: tuple) -> None:
    """Appends the checksums of `result` under `key` (the test's name and parameters) to this
    process's file in the `--checksums` folder, when one is set, with one of the `inputs`: two
    processes that made different inputs for a case compare nothing of the kernel's."""
    if CHECKSUMS["dir"] is None:
        return
    tensors = {"o": result.o, "lse": result.lse, **dict(zip(("dq", "dk", "dv"), result.grads or ()))}
    sums = {name: checksum(t) for name, t in tensors.items() if t is not None}
    made = hashlib.sha256(" ".join(checksum(t) for t in inputs).encode()).hexdigest()
    entry = {"key": key, "process": PROCESS, "inputs": made, "sums": sums}
    with open(Path(CHECKSUMS["dir"]) / f"{PROCESS}.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def read(folder: Path) -> dict:
    """{key: entry} of every checksum written into `folder`."""
    out = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                out[entry["key"]] = entry
    return out


@dataclass
class Differences:
    """Two runs' checksums compared: `differ` {key: tensors whose sums differ between two
    processes}; `missing` keys the first run wrote and the second did not; `unlike_inputs`
    keys whose two processes made different inputs (the harness's fault, not the kernel's)."""

    differ: dict
    missing: list
    unlike_inputs: list


def differences(first: Path, second: Path) -> Differences:
    a, b = read(first), read(second)
    out = Differences({}, [], [])
    for key, entry in a.items():
        again = b.get(key)
        if again is None:
            out.missing.append(key)
        elif again["inputs"] != entry["inputs"]:
            out.unlike_inputs.append(key)
        elif again["process"] != entry["process"]:
            names = [n for n in entry["sums"] if again["sums"].get(n) != entry["sums"][n]]
            if names:
                out.differ[key] = names
    return out


FAMILY = Family(
    "determinism", "bitwise-identical repeated runs", rank=3, check=check, applies=repeatable, requires=(DETERMINISTIC,)
)
