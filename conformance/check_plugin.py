"""pytest plugin of a `selgate check` run (`-p selgate.conformance.check_plugin`, loaded by the
check alone).

- The settings that change a verdict (`VERDICT_ENV`: tolerances, pytest's option variables)
  are refused by the check before it starts; this plugin keeps them out of the run: a test
  after which one is set (by the kernel's module at import, or by a call) fails, naming it.
- The implementation is the one the deciding process described (`--check-declared`, the
  probe's declarations as JSON), and its calls run in an executor process (`remote.py`): the
  workers never import it, so a kernel cannot declare one support to the probe and another to
  the workers (its attributes are read once, by the probe), the report's declarations are what
  ran, and the kernel's code never shares a process with pytest or the comparison.
- The controller writes the ids the run collected to `collected.json` beside the JUnit, so a
  run cut short can name the cases that never ran.
- Cases go to workers by kernel variant (packed or not, head dims, heads, dtype: what a Triton
  kernel compiles and autotunes per), whole variants to one worker, the costliest first
  (`KernelVariantScheduling`, `compile_cost`): with
  cases dealt one by one every worker compiled and autotuned every variant of the kernel under
  test from a cold cache (fla-core: 319 s with 8 workers on an H100, 206 s by variant).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

VERDICT_ENV = ("SELGATE_TOL_OVERRIDES", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
COLLECTED_FILE = "collected.json"
# Beside the JUnit (out of the kernel's reach, as the results are): the families the run's Impl
# claims (`families.claims`), which the deciding process reads without importing the families
# and torch. A worker computes them and hands them to the controller (xdist's workeroutput).
CLAIMS_FILE = "claims.json"
CLAIMS_KEY = "selgate_claims"


def pytest_addoption(parser):
    group = parser.getgroup("selgate")
    group.addoption(
        "--check-declared",
        default=None,
        metavar="FILE.json",
        help="selgate check: the declarations (declarations.to_json) of the one --impl package.module:callable",
    )
    group.addoption(
        "--check-case-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="selgate check: a kernel call still running this long after its case began is killed with its "
        "process and fails the case (pytest-timeout, set past it, ends a worker whose own code hangs)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Each case's deadline for the kernel's calls (`remote.DEADLINE`), from its start."""
    limit = item.config.getoption("check_case_limit")
    if limit:
        from .remote import DEADLINE

        DEADLINE.update(at=time.monotonic() + limit, limit_s=limit)


def decided_impl(spec: str, path) -> "Impl":  # noqa: F821 - the families import torch: not at plugin load
    """The Impl of `spec` from the declarations in `path`, whose calls run in an executor process
    (`remote.py`): this process never imports the kernel. The executors' scratch folders go beside
    `path`; the determinism family's second process (`determinism.second_process`) is a confined
    executor too, under a root of its own, so it finds nothing the first executors left there (a
    seed kept in a file would make the two processes alike)."""
    from . import declarations
    from .families import determinism
    from .impl import user_impl
    from .remote import Executor, remote_callable

    data = json.loads(Path(path).read_text())
    executor = Executor(Path(path).parent / "executors")
    determinism.SECOND["executor"] = Executor(Path(path).parent / "executors-second")
    varlen = remote_callable(executor, data["varlen"]) if "varlen" in data else None
    return user_impl(spec, declarations.from_json(data, varlen), remote_callable(executor, spec))


def verdict_environ(environ=None) -> dict:
    """The verdict-changing settings set (non-empty) in `environ` (default os.environ)."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in VERDICT_ENV if env.get(k)}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """The check refuses these settings, so any value seen here was set inside the run (xdist
    workers inherit what the kernel's import set in the controller)."""
    result = yield  # a test that failed keeps its own failure
    now = verdict_environ()
    if now:
        changed = ", ".join(f"{k}={v!r}" for k, v in sorted(now.items()))
        pytest.fail(f"the environment changed during the run (by the implementation): {changed}; the verdict cannot use it")
    return result


def _write_collected(config, ids) -> None:
    xml = None if hasattr(config, "workerinput") else config.option.xmlpath
    if xml and not getattr(config, "_selgate_collected", False):
        config._selgate_collected = True
        (Path(xml).parent / COLLECTED_FILE).write_text(json.dumps(list(ids), indent=0) + "\n")


def pytest_collection_finish(session):
    """Without xdist the controller collects itself."""
    if not hasattr(session.config, "workerinput") and session.config.pluginmanager.getplugin("dsession") is None:
        _write_collected(session.config, [i.nodeid for i in session.items])


def _claims(config) -> dict | None:
    from .families import claims

    impls = getattr(config, "_selgate_impls", None) or []
    return claims(impls[0]) if len(impls) == 1 else None


def _write_claims(config, claims) -> None:
    xml = config.option.xmlpath
    if xml and claims is not None and not getattr(config, "_selgate_claimed", False):
        config._selgate_claimed = True
        (Path(xml).parent / CLAIMS_FILE).write_text(json.dumps(claims, indent=0) + "\n")  # rank order, as reported


def pytest_sessionfinish(session):
    """A worker hands the claims to the controller; a run without xdist writes them itself."""
    config = session.config
    if hasattr(config, "workeroutput"):
        config.workeroutput[CLAIMS_KEY] = _claims(config)
    elif config.pluginmanager.getplugin("dsession") is None:
        _write_claims(config, _claims(config))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The first worker to finish brings the claims (every worker computes the same)."""
    _write_claims(node.config, getattr(node, "workeroutput", {}).get(CLAIMS_KEY))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """With xdist the workers collect; every worker collects the same ids."""
    _write_collected(node.config, ids)


# what a kernel specialises on, in a case id: packed (varlen) or not, heads per group, head dims,
# dtype
VARIANT = re.compile(r"-(varlen-|(?:decode|prefill)-).*-G\d+h(\d+)-D(\d+)x(\d+)-.*-(fp64|fp32|fp16|bf16)-s\d+")
ITEMSIZE = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2}


def variant_of(nodeid: str) -> str:
    """The scope a case is scheduled in: its kernel variant, or the nodeid itself."""
    m = VARIANT.search(nodeid)
    if not m:
        return nodeid
    packed, h, dk, dv, dtype = m.groups()
    return f"{'varlen-' if packed == 'varlen-' else ''}h{h}-D{dk}x{dv}-{dtype}"


def compile_cost(nodeid: str) -> tuple:
    """Larger is compiled first: wider head dims, then wider elements. A variant's first case
    pays its compile and autotune, which grow with the tile (fla-core cold on an H100: 124 s for
    D192x128 fp32, 62 s bf16, 28-31 s D32x32), so the costliest start first and no worker is
    left with one at the end."""
    m = VARIANT.search(nodeid)
    if not m:
        return (0, 0)
    _, _, dk, dv, dtype = m.groups()
    return (int(dk) + int(dv), ITEMSIZE[dtype])


def pytest_collection_modifyitems(config, items):
    """Collection order is the order variants are handed out (xdist's reordering by case
    count is turned off): costliest variants first, cases of a variant in their own order."""
    items.sort(key=lambda item: compile_cost(item.nodeid), reverse=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class KernelVariantScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return variant_of(nodeid)

        def _assign_work_unit(self, node):
            """Only to a worker whose collection arrived: one replacing a crashed worker is
            added before it has collected (xdist's own raised KeyError there)."""
            if node in self.registered_collections:
                super()._assign_work_unit(node)

        def _reschedule(self, node):
            """As xdist's, except that the worker is filled to more than two pending cases, and
            told to finish once the queue is empty. A worker runs a case only once it knows the
            next one (or that there is none), so a replacement handed one single-case unit (a
            unit whose other case crashed) with work still queued waited forever: no case of
            its finished to ask for more."""
            if node.shutting_down or node not in self.registered_collections:
                return
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

        def remove_node(self, node):
            """As xdist's, except that the case a crashed worker was running is reported as
            that crash and never handed out again: a kernel that aborts on a case every time
            would otherwise take down worker after worker on it."""
            workload = self.assigned_work.pop(node)
            pending = [(unit, nodeid) for unit in workload.values() for nodeid, done in unit.items() if not done]
            if not pending:
                return None
            unit, crashed = pending[0]
            unit[crashed] = True
            self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    config.option.loadscopereorder = False  # hand variants out in collection order
    return KernelVariantScheduling(config, log)
