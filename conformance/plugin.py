"""The conformance matrix as a pytest plugin (entry point `pytest11`, so an installed
selgate brings it to any pytest run): the `--impl`, `--size` and `--declare` options, the
family markers, and the parametrization of each family's test over (implementation x case),
OpInfo style. Every declared combination runs, an undeclared one is a skip with its
reason, a declared known bug is `xfail(strict=True)`. Markers, tests and their parameters
come from the family declarations (selgate.conformance.families: `Family.params`).

    pytest --pyargs selgate.conformance -m conformance --impl mypkg.mod:fn [--declare fn.yaml]

A run that does not use the matrix pays for the options alone: torch, the families and the
implementations are imported only when a selgate option is given or the run's paths or `-m`
expression name the conformance matrix. `--impl pkg.mod:fn` imports from the directory pytest
was invoked in, as `python -m pytest` does. A run given `--impl` in which none of an
implementation's cases ran (all skipped or deselected) fails: a skip-only run is not a pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .sizes import SIZES

# the families' own tests (policy's) use plain asserts: rewritten, as in a test module
pytest.register_assert_rewrite("selgate.conformance.families")

MATRIX = "conformance"  # in a path or -m expression, the run uses the matrix
FAILURE = "failure"  # the JUnit property holding a ConformanceFailure's facts (compare.py), as JSON


def pytest_addoption(parser):
    group = parser.getgroup("selgate", "selgate conformance matrix")
    group.addoption(
        "--impl",
        default=None,
        metavar="NAMES|pkg.mod:fn",
        help="implementations to run the matrix on: comma-separated registered names "
        "(reference, sdpa, triton, triton-gather, triton-tma, triton-pairs, triton-kv-outer, cuda) or package.module:callable; "
        "default: all registered",
    )
    group.addoption(
        "--size",
        default=None,
        choices=SIZES,
        help="largest case size class to run (cumulative: small also runs tiny); default tiny",
    )
    group.addoption(
        "--declare",
        default=None,
        metavar="FILE.yaml",
        help="declarations (capabilities, constraints, expected failures) of the one "
        "package.module:callable named by --impl, for a kernel whose module you do not own",
    )
    group.addoption(
        "--executors",
        action="store_true",
        default=False,
        help="run the registered implementations' calls in an executor process of each worker, "
        "as selgate check runs an outside kernel (unconfined: the reviewed tree's own kernels)",
    )


def uses_matrix(config) -> bool:
    """A selgate option is given, or the run's paths or `-m` expression name the matrix."""
    opt = config.option
    if opt.impl or opt.declare or opt.size:
        return True
    return MATRIX in (opt.markexpr or "") or any(MATRIX in str(a) for a in config.args)


def pytest_configure(config):
    """Registers the markers (also for `pytest --markers`) and resolves the implementations, when
    the run uses the matrix;
    a bad --impl or --declare is a usage error, reported once."""
    config._selgate_impls = None
    if not uses_matrix(config):
        if config.option.markers:  # `pytest --markers` lists the matrix's, at the cost of importing it
            _add_markers(config)
        return
    decided = getattr(config.option, "check_declared", None)  # selgate check's workers (check_plugin)
    spec = config.getoption("--impl")
    if decided and _xdist_controller(config):
        # The workers collect, judge and report; this process only counts what they ran, so
        # it never imports torch (a second or more of every check's start).
        if not config.option.collectonly:
            config.pluginmanager.register(RanCount([spec]), "selgate-ran-count")
        return
    from .registry import resolve

    _add_markers(config)
    here = str(config.invocation_params.dir)
    if spec and ":" in spec and here not in sys.path and not decided:
        sys.path.insert(0, here)  # as `python -m pytest` has it: the kernel's module beside the caller
        # (under selgate check the workers judge and never import it: its executors do)
    try:
        if decided:
            from .check_plugin import decided_impl

            config._selgate_impls = [decided_impl(spec, decided)]
        else:
            config._selgate_impls = resolve(spec, declare=config.getoption("--declare"))
        if config.getoption("--executors"):
            config._selgate_impls = _in_executors(config._selgate_impls)
    except (ValueError, ImportError, AttributeError, TypeError, OSError) as e:
        raise pytest.UsageError(str(e)) from e
    if spec and not config.option.collectonly:  # a collection runs nothing, by design
        config.pluginmanager.register(RanCount(impl.name for impl in config._selgate_impls), "selgate-ran-count")


def _add_markers(config) -> None:
    from . import families

    config.addinivalue_line("markers", f"{MATRIX}: the conformance matrix; --impl and --size select what it runs")
    for name, what in families.reported().items():
        config.addinivalue_line("markers", f"{name}: conformance family: {what}")


def _xdist_controller(config) -> bool:
    """This process hands cases to xdist workers and collects nothing itself."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def _in_executors(impls: list) -> list:
    """The registered implementations' calls in one executor process of this worker."""
    import tempfile

    from .registry import REGISTRY
    from .remote import Executor, in_executor

    outside = [i.name for i in impls if i.name not in REGISTRY]
    if outside:
        raise ValueError(f"--executors: runs registered implementations only; {', '.join(outside)} is not one")
    executor = Executor(Path(tempfile.mkdtemp(prefix="selgate-executors-")), confined=False)
    return [in_executor(impl, executor) for impl in impls]


def run_device() -> str:
    """The device the matrix runs on: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return run_device()


def pytest_generate_tests(metafunc):
    if "impl" not in metafunc.fixturenames:
        return
    from . import families
    from .cases import select

    family = families.of_test(metafunc.function.__name__)
    if family is None:
        raise pytest.UsageError(f"{metafunc.function.__name__}: takes impl but is no conformance family's test")
    impls = metafunc.config._selgate_impls
    if impls is None:
        raise pytest.UsageError(f"{metafunc.function.__name__}: collected, but the run names no conformance option or path")
    cases = select(metafunc.config.getoption("--size") or "tiny")
    metafunc.parametrize(*family.params(impls, cases, run_device()))


def case_facts(item) -> list:
    """A matrix test's facts as (name, value) JUnit properties, written where they are known so
    that no report parses them back out of the test id: its implementation, case, dtype and
    size (elements of q, k and v, by which the smallest failing case is chosen)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    impl, case = params.get("impl"), params.get("case")
    facts = [("impl", impl.name)] if hasattr(impl, "name") else []
    if hasattr(case, "shape"):
        from .cases import DTYPE_NAMES

        facts += [("case", case.id), ("dtype", DTYPE_NAMES[case.dtype]), ("elements", str(case.shape.elements))]
        facts += [("sets", ",".join(case.sets))] if case.sets else []
    return facts


def pytest_collection_modifyitems(config, items):
    if getattr(config, "_selgate_impls", None) is None:
        return
    for item in items:
        item.user_properties.extend(case_facts(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A ConformanceFailure's facts become the test's `failure` property: on the item, which
    JUnit's record (made at teardown, on an xdist worker too) copies."""
    yield
    compare = sys.modules.get("selgate.conformance.compare")  # not imported: no ConformanceFailure exists
    if compare is not None and call.excinfo is not None and isinstance(call.excinfo.value, compare.ConformanceFailure):
        item.user_properties.append((FAILURE, json.dumps(call.excinfo.value.facts, sort_keys=True)))


class RanCount:
    """Counts the cases each implementation named by --impl ran (passed, failed or xfailed;
    on the xdist controller, from the workers' reports), and fails a run in which one ran none."""

    def __init__(self, names):
        self.ran = dict.fromkeys(names, 0)
        self.idle = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and (not report.skipped or hasattr(report, "wasxfail")):
            impl = dict(report.user_properties).get("impl")
            if impl in self.ran:
                self.ran[impl] += 1

    def pytest_sessionfinish(self, session, exitstatus):
        if hasattr(session.config, "workerinput") or exitstatus not in (0, 1):
            return
        self.idle = [name for name, n in self.ran.items() if n == 0]
        if self.idle:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.idle:
            terminalreporter.write_line(
                f"selgate: no case of {', '.join(self.idle)} ran (every one skipped or deselected: see the skip "
                "reasons); a run of --impl that runs none of its cases fails",
                red=True,
            )
