"""pytest plugin (`-p selgate.reports.stamp`, loaded by the lane runner): records what the
report needs and JUnit lacks. Each test gets `nodeid`, `family` and, when its parameters
carry one, `seed` as JUnit properties; the controller writes beside the JUnit file the
environment stamp with the tree the run started on, pytest's exit status, its effective
arguments and configuration files, the code it loaded (every conftest and plugin module with its
file's digest, from the controller and each xdist worker, and the interpreter's startup hooks),
what the run selected and, for a run cut short, how far it
got (environment.json), and, in a lane run, the lane's inventory collected apart from the run
(inventory.json). The gate compares all of it with the lane and the tree it gates, so a
narrowed, cut, foreign or differently configured run cannot stand in for the lane."""

from __future__ import annotations

import hashlib
import json
import os
import site
import subprocess
import sys
import types
from pathlib import Path

import pytest

from selgate import env_vars

from selgate.environment import ENV_FILE
from selgate.kernels.served import run_environment, served_device
from selgate.conformance.reported import family_of
from .inventory import INVENTORY_FILE, collect_inventory, start_inventory
from selgate.outcome import outcome_known
from selgate import tree

TREE = pytest.StashKey[dict]()
TREE_FILES = pytest.StashKey[dict]()  # {path: (sha256, status)} of the files in the tree's digest
LOADED = pytest.StashKey[list]()  # what the workers loaded, as they report it
WORKER_LOADED = "selgate_loaded"  # the key of a worker's record in its workeroutput
WORKER_DEVICE = "selgate_device"  # a worker's device stamp (served_device) in its workeroutput
DEVICE = pytest.StashKey[dict]()  # the device stamp of the first worker to finish
STARTUP_MODULES = ("sitecustomize", "usercustomize")
INVENTORY = pytest.StashKey[subprocess.Popen]()
# Tests whose outcome is known so far, and what interrupted the session: a cut run records how
# far it got. Module state, like pytest's own plugins keep per session; reset as one starts.
_done: set = set()
_interrupt: list = []


def seed_of(item) -> str | None:
    """A `seed` parameter, or the `.seed` of a parameter (a conformance case), if any."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "seed" in params:
        return str(params["seed"])
    for value in params.values():
        if getattr(value, "seed", None) is not None:
            return str(value.seed)
    return None


def pytest_collection_modifyitems(items):
    for item in items:
        props = [("nodeid", item.nodeid), ("family", family_of(item.nodeid, [m.name for m in item.iter_markers()]))]
        seed = seed_of(item)
        if seed is not None:
            props.append(("seed", seed))
        item.user_properties.extend(props)


def selection_of(config) -> dict:
    """The run's selection: positional paths, -k, -m, --size, --impl, --deselect, --ignore, --lf."""

    def norm(path: str) -> str:
        return path.removeprefix("./").rstrip("/")

    return {
        "paths": [norm(a) for a in config.args],
        "k": config.option.keyword or "",
        "m": config.option.markexpr or "",
        "size": config.getoption("--size", None),
        "impl": config.getoption("--impl", None),
        "deselect": [norm(a) for a in config.getoption("deselect", None) or []],
        "ignore": [norm(a) for a in config.getoption("ignore", None) or []],
        "last_failed": bool(config.getoption("lf", False)),
    }


def configuration_of(config) -> dict:
    """The effective pytest configuration: arguments as invoked, the configuration file and
    its addopts, PYTEST_ADDOPTS, whether plugins were autoloaded, the conftest files and
    plugins loaded."""
    root = Path(config.rootpath)

    def rel(path) -> str:
        path = Path(path)
        return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)

    conftests = {
        rel(p.__file__)
        for p in config.pluginmanager.get_plugins()
        if Path(getattr(p, "__file__", None) or "x").name == "conftest.py"
    }
    plugins = {
        name for name, p in config.pluginmanager.list_name_plugin() if p is not None and os.sep not in name and not name.isdigit()
    }
    return {
        "args": list(config.invocation_params.args),
        "inifile": rel(config.inipath) if config.inipath else None,
        "rootdir": str(root),
        "ini_addopts": list(config.getini("addopts")),
        "env_addopts": os.environ.get("PYTEST_ADDOPTS", ""),
        "autoload": os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "") == "",
        "conftests": sorted(conftests),
        "plugins": sorted(plugins),
    }


def _sha256(path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _prefixes() -> list:
    """The interpreter's own installation: its prefix (a venv's, even one inside the checkout) and
    the base installation's."""
    return [Path(os.path.realpath(p)) for p in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}]


def _pythonpath() -> list:
    return [Path(os.path.realpath(p)) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _located(path, root: Path, *, startup: bool = False) -> dict:
    """Where a loaded file lies, its path (relative when in the checkout) and its digest.
    `where`: `installation` (the interpreter's, even a venv inside the checkout), `checkout`,
    `pythonpath` (startup hooks only: a PYTHONPATH folder wins over the other two) or `other`."""
    if path is None:
        return {"path": None, "where": "none", "sha256": None}
    full = Path(os.path.realpath(path))
    if startup and any(full.is_relative_to(p) for p in _pythonpath()):
        where = "pythonpath"
    elif any(full.is_relative_to(p) for p in _prefixes()):
        where = "installation"
    else:
        where = "checkout" if full.is_relative_to(root) else "other"
    shown = full.relative_to(root).as_posix() if where == "checkout" else str(full)
    return {"path": shown, "where": where, "sha256": _sha256(full)}


def startup_hooks(root: Path) -> list:
    """The interpreter's startup hooks in this process: the `sitecustomize` and `usercustomize`
    modules it imported, and each `.pth` file with a line that runs code (`import ...`) in a site
    folder, a PYTHONPATH folder or another folder on sys.path."""
    hooks = []
    for name in STARTUP_MODULES:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            hooks.append({"kind": name, "name": name, **_located(file, root, startup=True)})
    folders = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    folders += [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path]
    seen = set()
    for folder in folders:
        folder = Path(os.path.realpath(folder or "."))
        if folder in seen or not folder.is_dir():
            continue
        seen.add(folder)
        for pth in sorted(folder.glob("*.pth")):
            try:
                lines = pth.read_text(errors="replace").splitlines()
            except OSError:
                continue
            if any(line.startswith(("import ", "import\t")) for line in lines):
                hooks.append({"kind": "pth", "name": pth.name, **_located(pth, root, startup=True)})
    return hooks


def loaded_code(config) -> list:
    """What this process loaded that can change a run: each conftest and plugin pytest
    registered (a plugin object by the module of its class), with its file and digest, and the
    interpreter's startup hooks."""
    root = Path(os.path.realpath(tree.ROOT))  # the checkout stamped (a lane's rootdir)
    records = []
    for name, plugin in config.pluginmanager.list_name_plugin():
        if plugin is None:  # blocked with -p no:<name>
            continue
        if isinstance(plugin, types.ModuleType):
            module_name = plugin.__name__
        else:  # an object (or a class) registered by the module defining it
            module_name = (plugin if isinstance(plugin, type) else type(plugin)).__module__
        module = sys.modules.get(module_name)
        file = getattr(plugin if isinstance(plugin, types.ModuleType) else module, "__file__", None)
        kind = "conftest" if file and Path(file).name == "conftest.py" else "plugin"
        records.append({"kind": kind, "name": module_name, **_located(file, root)})
    return _unique(records + startup_hooks(root))


def _unique(records) -> list:
    return sorted(
        {json.dumps(r, sort_keys=True): r for r in records}.values(), key=lambda r: (r["kind"], str(r["path"]), r["name"])
    )


def annotate(records: list, files: dict) -> list:
    """Each record of a file inside the checkout with its status in the tree stamped as the run
    started (`tracked`, `untracked`, `ignored`, or None: not in the digest) and whether its
    content is the one stamped (`stamped`)."""
    out = []
    for record in records:
        if record.get("where") == "checkout":
            sha, status = files.get(record["path"], (None, None))
            record = {**record, "status": status, "stamped": sha is not None and sha == record.get("sha256")}
        out.append(record)
    return out


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker's record of what it loaded, and its device stamp."""
    output = getattr(node, "workeroutput", {})
    loaded = output.get(WORKER_LOADED)
    if loaded:
        node.config.stash.setdefault(LOADED, []).extend(loaded)
    if output.get(WORKER_DEVICE) and DEVICE not in node.config.stash:
        node.config.stash[DEVICE] = output[WORKER_DEVICE]


def _controller_xml(config) -> str | None:
    """The JUnit path on the controller; None on xdist workers and runs without JUnit."""
    return None if hasattr(config, "workerinput") else config.option.xmlpath


def pytest_runtest_logreport(report):
    if outcome_known(report):
        _done.add(report.nodeid)


def pytest_keyboard_interrupt(excinfo):
    """Ctrl-C or SIGINT (KeyboardInterrupt), or xdist stopping the run (its Interrupted, e.g.
    `maximum crashed workers reached: 20`)."""
    _interrupt[:] = [excinfo.type, str(excinfo.value)]


def cut_record(session) -> dict:
    """How far an interrupted run got: the signal as pytest saw it (SIGINT for a plain
    KeyboardInterrupt, None when xdist or a -x/--maxfail stopped it), the reason, the tests
    done and the tests collected (0 when the run was cut during collection)."""
    kind, message = _interrupt or (None, "")
    keyboard = kind is KeyboardInterrupt
    reason = "KeyboardInterrupt" if keyboard else message or str(session.shouldstop or session.shouldfail or "interrupted")
    return {
        "signal": "SIGINT" if keyboard else None,
        "reason": reason,
        "tests_done": len(_done),
        "tests_collected": int(session.testscollected),
    }


def pytest_sessionstart(session):
    """The tree is stamped as the run starts; a lane run collects its inventory meanwhile."""
    _done.clear()
    _interrupt.clear()
    config = session.config
    if not _controller_xml(config):
        return
    config.stash[TREE], config.stash[TREE_FILES] = tree.tree_files(tree.ROOT)
    pending = start_inventory(env_vars.get("SELGATE_LANE", ""), config.option.xmlpath, config.rootpath)
    if pending is not None:
        config.stash[INVENTORY] = pending


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: its record goes to the controller
        config.workeroutput[WORKER_LOADED] = loaded_code(config)
        config.workeroutput[WORKER_DEVICE] = served_device()
        return
    xmlpath = _controller_xml(config)
    if not xmlpath:
        return
    # The device part from a worker that ran the tests, when one reported: the controller then
    # never imports torch (a second of every lane's and check's run)
    env = run_environment(config.stash.get(DEVICE, None))
    env["pytest_exitstatus"] = int(exitstatus)
    if int(exitstatus) == pytest.ExitCode.INTERRUPTED:
        env["cut"] = cut_record(session)
    env["selection"] = selection_of(config)
    if TREE not in config.stash:
        config.stash[TREE], config.stash[TREE_FILES] = tree.tree_files(tree.ROOT)
    env["pytest"] = configuration_of(config)
    env["pytest"]["loaded"] = annotate(_unique(loaded_code(config) + config.stash.get(LOADED, [])), config.stash[TREE_FILES])
    env["tree"] = config.stash[TREE]
    out = Path(xmlpath).parent
    out.mkdir(parents=True, exist_ok=True)
    (out / ENV_FILE).write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
    pending = config.stash.get(INVENTORY, None)
    if pending is None:
        return
    if "cut" in env:  # the cut blocks the lane on its own; a machine going away gives no time to wait
        pending.kill()
        pending.wait()
        return
    (out / INVENTORY_FILE).write_text(json.dumps(collect_inventory(pending), indent=1) + "\n")
