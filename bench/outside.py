"""Outside kernels in the benchmark: `--backends pkg.mod:fn` times a user's kernel beside ours.

The kernel is loaded, declared and adapted exactly as the conformance matrix does it
(`load_user_impl`, attributes or a `--declare` YAML file, the block-index adapters), so it is
timed on the terms it is judged on. A row its declarations exclude is a skip whose note is
the matrix's own reason; a kernel that selects whole blocks gets its row's selection rebuilt
at its declared block size (`Method.block_size`, see sweep.run_problem).
"""

from __future__ import annotations

import os
import sys

import torch

from selgate.conformance.cases import Case, Shape
from selgate.conformance.impl import Impl, skip_reason
from selgate.conformance.registry import load_user_impl

from .inputs import Problem

_LOADED: dict = {}


def is_outside(name: str) -> bool:
    """True for a `package.module:callable` spec (our method names hold no colon)."""
    return ":" in name


def _case(p: Problem, impl: Impl) -> Case:
    """The matrix case a benchmark row corresponds to, for the registry's skip rules (size
    and smoke classes are the matrix's, not the benchmark's, so they never exclude a row)."""
    shape = Shape(mode=p.kind, B=p.B, S=p.S, S_kv=p.S_kv, G=p.G, h=p.h, Dk=p.D, Dv=p.Dv, n=max(p.n_blocks, 1))
    return Case(
        shape=shape, pattern="builder", dtype=getattr(torch, p.dtype), seed=0, size="tiny", smoke=True, block_size=impl.block_size
    )


def _method(impl: Impl):
    from .baselines import Method

    def build(p, x):
        return lambda: impl.forward(x.q, x.k, x.v, x.ranges, scale=x.scale, want_lse=False)[0]

    def skip(p, device):
        return skip_reason(impl, _case(p, impl), device)

    return Method(impl.name, False, build, skip, block_size=impl.block_size)


def load(names, declare=None) -> None:
    """Load the outside kernels among `names`; `declare` (a YAML file) declares the one
    outside kernel named, as `--declare` does for the matrix."""
    specs = [n for n in names if is_outside(n)]
    if specs and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the kernel's module beside the caller, as `selgate check` finds it
    if declare and len(specs) != 1:
        raise ValueError(
            f"--declare {declare}: declares one package.module:callable named by --backends; --backends names {len(specs)}"
        )
    for spec in specs:
        _LOADED[spec] = _method(load_user_impl(spec, declare, what="--backends"))


def get(spec: str):
    """The Method of an outside kernel, loaded with its own attributes if `load` has not run."""
    if spec not in _LOADED:
        load([spec])
    return _LOADED[spec]
