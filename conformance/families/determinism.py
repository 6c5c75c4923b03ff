"""Family determinism: repeated runs are bitwise identical (SPEC.md, "Determinism"), within
one process and across processes. Within: each case runs several times in its process. Across:
each case runs once more in a second process of the worker's (an executor with a scratch root of
its own, `second_process`), whose result must be bitwise identical to the first run's: a kernel
seeded by its process id, or tuned differently in each process, is repeatable within one process
only. Under `selgate check` that process is confined as the kernel's first executor is
(`check_plugin.decided_impl` sets it); in a lane it is a plain child with the worker's environment."""

from __future__ import annotations

from pathlib import Path

import torch

from ..cases import Case, make_inputs
from ..compare import assert_equal
from ..evaluation import Result, evaluate, golden_fn, impl_fn, make_upstream
from ..family import DETERMINISTIC, Family, repeatable
from ..impl import Impl

SECOND: dict = {"executor": None}  # this worker's second process (`second_process`): started on first use, or set
ACROSS = "not bitwise identical across processes"


def check(impl: Impl, case: Case, device, backward: bool = False) -> None:
    """Repeated runs give bitwise-identical o and lse (and dq, dk, dv with `backward`):
    5 runs on a GPU, where reduction order can race; 2 on CPU, to keep the interpreter cheap;
    then one run in a second process (`second_process`)."""
    runs = 5 if torch.device(device).type == "cuda" else 2
    inp = make_inputs(case, device)
    up = None
    if backward:
        gold = evaluate(golden_fn(inp.ranges, inp.scale), inp.q, inp.k, inp.v)
        up = make_upstream(gold.o, gold.lse, case.seed)
    fn = impl_fn(impl, inp.ranges, inp.scale)
    first = evaluate(fn, inp.q, inp.k, inp.v, up)
    for i in range(1, runs):
        _same(evaluate(fn, inp.q, inp.k, inp.v, up), first, case, f"run {i + 1} vs run 1 must be bitwise identical")
    other = second_process(impl)
    if other is not None:
        again = evaluate(impl_fn(other, inp.ranges, inp.scale), inp.q, inp.k, inp.v, up)
        _same(again, first, case, f"{ACROSS}: a second process's run vs this one's")


def _same(again: Result, first: Result, case: Case, why: str) -> None:
    pairs = [("o", again.o, first.o), ("lse", again.lse, first.lse)]
    if first.grads is not None:
        pairs += list(zip(("dq", "dk", "dv"), again.grads, first.grads))
    for name, a, b in pairs:
        if a is not None:
            assert_equal(name, a, b, case_id=case.id, why=why, rule="determinism")


def second_process(impl: Impl) -> Impl | None:
    """`impl` called in this worker's second process (SECOND: set by `selgate check`'s workers to
    a confined executor; otherwise a plain executor with this process's environment, started on
    first use): a kernel's `impl.spec` (`package.module:callable`, called as `fn(q, k, v, ranges,
    scale=...)`), else a registered implementation's own call by its name. None for an
    implementation no other process can load."""
    import dataclasses

    from ..registry import REGISTRY
    from ..remote import Executor, remote_callable

    registered = impl.spec is None and impl.name in REGISTRY
    if impl.spec is None and not registered:
        return None
    if SECOND["executor"] is None:
        import tempfile

        SECOND["executor"] = Executor(Path(tempfile.mkdtemp(prefix="selgate-second-process-")), confined=False)
    remote = remote_callable(SECOND["executor"], impl.name if registered else impl.spec, registered=registered)
    if registered:
        return dataclasses.replace(impl, call=remote)

    def call(q, k, v, ranges, *, scale=None, want_lse=True):
        return remote(q, k, v, ranges, scale=scale)

    return dataclasses.replace(impl, call=call)


FAMILY = Family(
    "determinism", "bitwise-identical repeated runs", rank=3, check=check, applies=repeatable, requires=(DETERMINISTIC,)
)
