"""The gate: the policy in gate.yaml applied to the lanes' results, giving a verdict whose
first blocking line names what blocks."""

from __future__ import annotations

import datetime
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

from selgate import strict_yaml
from selgate.conformance.reported import names
from .inventory import difference
from .results import LaneResult
from .sanitizer import sanitizer_blocking
from selgate.tree import FULL_COMMIT, differing, untracked_config
from selgate.verdict import ABORTED, Verdict, pytest_exit

POLICY_FILE = Path(__file__).resolve().parent / "gate.yaml"
QUARANTINE_KEYS = ("test", "owner", "reason", "expires", "lanes")
MAX_QUARANTINE_DAYS = 30
LINK = re.compile(r"https?://\S+|(?:[\w.-]+/[\w.-]+)?#\d+")
# A wildcard entry may cover no more than one family's tests of one implementation: the
# module, the test function (one family's) and the implementation are literal, wildcards come after.
PATTERN = re.compile(r"conformance/test_conformance\.py::(?P<test>test_\w+)\[(?P<impl>[\w.:]+)-[^\[\]]*\]")
WILDCARDS = ("*", "?")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(kw_only=True)
class GateVerdict(Verdict):
    subject = "GATE"
    required_lanes: list
    quarantined: list = field(default_factory=list)  # (CaseResult, entry)
    notes: list = field(default_factory=list)
    coverage: dict = field(default_factory=dict)  # lane -> what none of its conformance cases ran (lane_coverage)

    def scope(self) -> str:
        return f"required lanes {', '.join(self.required_lanes)}"


def known_lanes() -> list:
    """Lanes a policy may name: each lane YAML, run natively or emulated."""
    from selgate.lanes.config import lane_names

    return [n for name in lane_names() for n in (name, f"{name}-emulated")]


POLICY_KEYS = ("default_profile", "profiles", "required_families", "quarantine")
PROFILE_KEYS = ("required_lanes", "same_commit", "sanitizer")
# The registered implementations (selgate.conformance.registry.REGISTRY; a test keeps the two
# equal): the gate does not import the registry, which imports the kernels. A test id names
# its implementation after '[', and some names extend others (triton, triton-gather).
IMPLEMENTATIONS = ("reference", "sdpa", "triton", "triton-gather", "triton-tma", "triton-pairs", "triton-kv-outer", "cuda")


def load_policy(path: Path = POLICY_FILE, today: datetime.date | None = None) -> dict:
    """gate.yaml, validated strictly: ValueError names the file, the line and the bad key or
    entry (an unknown or repeated key included: a misspelt `sanitiser: true` would otherwise
    leave the release without its sanitizer pass)."""
    today = today or utc_today()
    doc = strict_yaml.load(path)
    policy = doc.data if doc.data is not None else {}
    if not isinstance(policy, dict):
        raise ValueError(f"{doc.where()}: expected a mapping, got {type(policy).__name__}")
    _known_keys(policy, POLICY_KEYS, doc, ())
    for key in POLICY_KEYS:
        if key not in policy:
            raise ValueError(f"{doc.where()}: missing key {key!r}; a policy needs {list(POLICY_KEYS)}")
    profiles = policy["profiles"]
    if (
        not isinstance(profiles, dict)
        or not isinstance(policy["default_profile"], str)
        or policy["default_profile"] not in profiles
    ):
        raise ValueError(
            f"{doc.where('profiles')}: profiles: expected a mapping holding default_profile "
            f"{policy['default_profile']!r}, got {profiles!r}"
        )
    for name, profile in profiles.items():
        if not isinstance(profile, dict):
            raise ValueError(
                f"{doc.where('profiles', name)}: profiles.{name}: expected a mapping of {list(PROFILE_KEYS)}, got {profile!r}"
            )
        _known_keys(profile, PROFILE_KEYS, doc, ("profiles", name))
        lanes = profile.get("required_lanes")
        if not isinstance(lanes, list) or not lanes or not all(isinstance(n, str) and n for n in lanes):
            raise ValueError(
                f"{doc.where('profiles', name, 'required_lanes')}: profiles.{name}.required_lanes: expected a "
                f"non-empty list of lane names (a gate that requires no lane passes on no results), got {lanes!r}"
            )
        for flag in ("same_commit", "sanitizer"):
            if not isinstance(profile.get(flag, False), bool):
                raise ValueError(
                    f"{doc.where('profiles', name, flag)}: profiles.{name}.{flag}: expected true or false, got {profile[flag]!r}"
                )
    families = policy["required_families"]
    if (
        not isinstance(families, list)
        or not families
        or not all(isinstance(f, str) for f in families)
        or set(families) - set(names())
    ):
        raise ValueError(
            f"{doc.where('required_families')}: required_families: expected a non-empty list of families "
            f"among {list(names())} (a gate that requires no family passes a lane that ran none), got {families!r}"
        )
    entries = policy["quarantine"] if policy["quarantine"] is not None else []
    if not isinstance(entries, list):
        raise ValueError(f"{doc.where('quarantine')}: quarantine: expected a list of entries, got {entries!r}")
    policy["quarantine"] = [
        _quarantine(entry, f"quarantine[{i}]", today, lambda *key, i=i: doc.where("quarantine", i, *key))
        for i, entry in enumerate(entries)
    ]
    return policy


def _known_keys(mapping: dict, known: tuple, doc, path: tuple) -> None:
    """ValueError at the first key of `mapping` not in `known` (a typo is not ignored)."""
    for key in mapping:
        if key not in known:
            dotted = ".".join(map(str, (*path, key)))
            raise ValueError(f"{doc.where(*path, key)}: {dotted}: unknown key; expected one of {list(known)}")


def implementation_of(nodeid: str) -> str | None:
    """The implementation a conformance test id (or pattern) names after its '[': the longest
    registered name followed by '-', else the text up to the first '-'; None without '['."""
    if "[" not in nodeid:
        return None
    params = nodeid.split("[", 1)[1]
    named = [n for n in IMPLEMENTATIONS if params.startswith(n + "-")]
    return max(named, key=len) if named else params.split("-", 1)[0]


DTYPE = re.compile(r"-(fp64|fp32|fp16|bf16)-s\d+")


def lane_coverage(lane: LaneResult) -> list:
    """What the lane's conformance matrix never ran (each such case skipped, other than for a
    declared lack of support): implementations, dtypes of the implementations that ran, and
    families, so that a lane's pass says what it leaves to other lanes (the CPU lane: the CUDA
    and Gluon kernels, bf16 on Triton)."""
    matrix = [c for c in lane.cases if _impl(c) in IMPLEMENTATIONS]
    matrix = [c for c in matrix if not (c.outcome == "skip" and "declare" in c.message)]  # by design, not the lane's
    ran = [c for c in matrix if c.outcome != "skip"]
    impls = dict.fromkeys(_impl(c) for c in matrix)
    ran_impls = {_impl(c) for c in ran}
    out = []
    if never := [i for i in impls if i not in ran_impls]:
        out.append(f"implementation{'s' if len(never) > 1 else ''} {', '.join(never)}")
    by_dtype: dict = {}  # dtype -> {implementation: whether one of its cases in that dtype ran}
    for c in matrix:
        if dtype := _dtype(c):
            seen = by_dtype.setdefault(dtype, {})
            seen[_impl(c)] = seen.get(_impl(c), False) or c.outcome != "skip"
    for dtype, seen in by_dtype.items():
        if without := [i for i, done in seen.items() if not done and i in ran_impls]:
            out.append(f"{dtype} on {', '.join(without)}")
    if never := [f for f in dict.fromkeys(c.family for c in matrix) if not any(c.family == f for c in ran)]:
        out.append(f"famil{'ies' if len(never) > 1 else 'y'} {', '.join(never)}")
    return out


def _impl(case) -> str | None:
    """The implementation a result ran: the matrix's fact, else read from its test id (a crashed
    worker's test, whose JUnit record carries no properties)."""
    return case.facts.get("impl") or implementation_of(case.nodeid)


def _dtype(case) -> str | None:
    """The dtype a result covers; none for a bad input (its case only carries the bad argument)."""
    if case.family == "bad_input":
        return None
    if "dtype" in case.facts:
        return case.facts["dtype"]
    m = DTYPE.search(case.nodeid)
    return m[1] if m else None


def _quarantine(entry, label: str, today: datetime.date, at) -> dict:
    """One quarantine entry, validated: a narrow, owned, linked, expiring exception. `label`
    names it (quarantine[0]); `at(key)` gives the `file:line` of one of its keys."""
    if not isinstance(entry, dict):
        raise ValueError(f"{at()}: {label}: expected a mapping with {list(QUARANTINE_KEYS)}, got {entry!r}")
    label = f"{label} ({entry.get('test', '?')!r})"
    where = f"{at()}: {label}"
    missing = [k for k in QUARANTINE_KEYS if entry.get(k) in (None, "", [])]
    unknown = sorted(map(str, set(entry) - set(QUARANTINE_KEYS)))
    if missing or unknown:
        raise ValueError(f"{where}: missing {missing}, unknown {unknown}; every entry needs exactly {list(QUARANTINE_KEYS)}")
    test = entry["test"]
    where = f"{at('test')}: {label}"
    if not isinstance(test, str) or "::" not in test:
        raise ValueError(f"{where}: test: expected a pytest node id (path::name), got {test!r}")
    if any(w in test for w in WILDCARDS):
        from selgate.conformance.families import of_test

        match = PATTERN.fullmatch(test)
        if not match or of_test(match["test"]) is None or any(w in test.split("[", 1)[0] for w in WILDCARDS):
            raise ValueError(
                f"{where}: test: a pattern may cover one family and one implementation only, "
                "e.g. conformance/test_conformance.py::test_parity[triton-*fp16*] (module, function "
                f"and implementation literal; the implementation is matched whole, so triton-* does "
                f"not cover triton-gather), got {test!r}"
            )
    for key in ("owner", "reason"):
        if not isinstance(entry[key], str):
            raise ValueError(f"{at(key)}: {label}: {key}: expected text, got {entry[key]!r}")
    if not LINK.search(entry["reason"]):
        raise ValueError(
            f"{at('reason')}: {label}: reason: expected a link to the tracked problem (a URL or an issue "
            f"reference such as #12), got {entry['reason']!r}"
        )
    lanes, known = entry["lanes"], known_lanes()
    if not isinstance(lanes, list) or not all(isinstance(n, str) and n in known for n in lanes):
        raise ValueError(f"{at('lanes')}: {label}: lanes: expected a list of lanes among {known}, got {lanes!r}")
    expires = _date(entry["expires"], f"{at('expires')}: {label}: expires")
    if expires > today + datetime.timedelta(days=MAX_QUARANTINE_DAYS):
        raise ValueError(
            f"{at('expires')}: {label}: expires: at most {MAX_QUARANTINE_DAYS} days ahead "
            f"({today + datetime.timedelta(days=MAX_QUARANTINE_DAYS)}), got {expires}"
        )
    return {**entry, "expires": expires}


def utc_today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


def _date(value, where: str) -> datetime.date:
    """A calendar date, as YAML reads `2026-12-08` or as the text YYYY-MM-DD; a date with a
    time of day (YAML reads `2026-12-08 00:00:00` as one) is refused: in which zone?"""
    if isinstance(value, datetime.datetime):
        raise ValueError(f"{where}: expected a date YYYY-MM-DD, got a date and time {value.isoformat(sep=' ')!r}")
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str) and DATE.fullmatch(value):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"{where}: expected a date YYYY-MM-DD, got {value!r}")


def profile_of(policy: dict, profile: str | None) -> dict:
    """The named profile (default: the policy's default_profile)."""
    name = profile or policy["default_profile"]
    if name not in policy["profiles"]:
        raise ValueError(f"--profile: expected one of {sorted(policy['profiles'])}, got {name!r}")
    return policy["profiles"][name]


def required_lanes(policy: dict, profile: str | None, lanes: list | None) -> list:
    """The lanes a verdict requires. `lanes` (`--lanes`) replace the default profile's (bin/gate
    gates the one lane its machine ran) and add to any other profile's: a release never
    requires fewer lanes than its profile names."""
    named = list(profile_of(policy, profile)["required_lanes"])
    if not lanes:
        return named
    if (profile or policy["default_profile"]) == policy["default_profile"]:
        return list(lanes)
    return list(dict.fromkeys([*named, *lanes]))


def _lane_config(lane: str) -> dict | None:
    from selgate.lanes.config import LANE_DIR, load_lane

    base = lane.removesuffix("-emulated")
    return load_lane(base) if (LANE_DIR / f"{base}.yaml").exists() else None


def lane_families(policy: dict, lane: str) -> list:
    """Families a lane must pass: gate.yaml's plus its lane YAML's (an emulated run counts
    as its lane)."""
    cfg = _lane_config(lane)
    extra = cfg["required_families"] if cfg else []
    return list(dict.fromkeys([*policy["required_families"], *extra]))


def narrowing(lane: str, selection: dict) -> list:
    """How a run's recorded selection falls short of its lane's own (lanes/<lane>.yaml): a
    missing path, a -k, an --impl, another -m, a smaller --size, --deselect, --ignore or --lf. A lane
    without a YAML (an ad-hoc result) has nothing to fall short of."""
    from selgate.conformance.sizes import SIZES
    from selgate.lanes.runner import POLICY_TESTS

    cfg = _lane_config(lane)
    if cfg is None:
        return []
    short = []
    ran = selection.get("paths", [])
    missing = [p for p in (*cfg["paths"], POLICY_TESTS) if not any(a in (p, ".") or p.startswith(a + "/") for a in ran)]
    if missing:
        short.append(f"paths without {missing}")
    if selection.get("k"):
        short.append(f"-k {selection['k']!r}")
    if selection.get("impl"):
        short.append(f"--impl {selection['impl']}")
    if (selection.get("m") or "") != (cfg["markers"] or ""):
        short.append(f"-m {selection.get('m')!r} where the lane has {cfg['markers']!r}")
    size = selection.get("size")
    if size not in SIZES or SIZES.index(size) < SIZES.index(cfg["size"]):
        short.append(f"--size {size} where the lane has {cfg['size']}")
    for option in ("deselect", "ignore"):
        if selection.get(option):
            short.append(f"--{option} {selection[option]}")
    if selection.get("last_failed"):
        short.append("--lf")
    return short


def _quarantine_entry(policy: dict, case) -> dict | None:
    """The entry covering `case` in its lane: `*` and `?` are wildcards, brackets literal
    (node ids carry parameters in them); a pattern covers its implementation only, named
    whole (`triton-*` covers triton's tests, not triton-gather's)."""
    for entry in policy["quarantine"]:
        test = entry["test"]
        if case.lane not in entry["lanes"] or not fnmatch.fnmatchcase(case.nodeid, test.replace("[", "[[]")):
            continue
        if any(w in test for w in WILDCARDS) and implementation_of(case.nodeid) != implementation_of(test):
            continue
        return entry
    return None


def provenance(name: str, stamp: dict | None, tree: dict) -> list:
    """Why a lane's tree stamp is not the tree being gated (`tree`): full commit ids and the
    digest of every file that can change a run must both be equal."""
    if not stamp:
        return [f"required lane {name} has no tree stamp: rerun it with `python -m selgate.lanes run {name}`"]
    ran, here = str(stamp.get("commit")), str(tree["commit"])
    out = []
    if not FULL_COMMIT.fullmatch(ran):
        out.append(f"required lane {name} names commit {ran!r}, not a full commit id")
    elif ran != here:
        out.append(f"required lane {name} ran commit {ran}, this tree is commit {here}: rerun the lane on it")
    if stamp.get("digest") != tree["digest"]:
        out.append(
            f"required lane {name} ran other files than this tree has (digest {str(stamp.get('digest'))[:12]}, "
            f"here {tree['digest'][:12]}; {differing(stamp, tree)}): rerun the lane on this tree"
        )
    if config := untracked_config(stamp):
        out.append(f"required lane {name} ran with untracked pytest configuration {config}: commit or remove it")
    return out


def configuration(name: str, pytest_config: dict | None) -> list:
    """Why the run's pytest configuration is not the lane's own (pyproject.toml, no addopts
    from the environment, plugins named rather than autoloaded)."""
    if not pytest_config:
        return [f"required lane {name} recorded no pytest configuration: rerun it with `python -m selgate.lanes run {name}`"]
    out = []
    if pytest_config.get("inifile") != "pyproject.toml":
        out.append(
            f"required lane {name} read its pytest configuration from {pytest_config.get('inifile')!r}, not pyproject.toml"
        )
    if pytest_config.get("env_addopts"):
        out.append(f"required lane {name} ran under PYTEST_ADDOPTS={pytest_config['env_addopts']!r}")
    if pytest_config.get("autoload", True):
        out.append(f"required lane {name} ran with pytest plugin autoloading on (any installed plugin could deselect tests)")
    out += loaded_code_blocking(name, pytest_config.get("loaded") or [])
    return out


# Code from outside the checkout a lane may load as a plugin, by top-level package: pytest's own,
# the lane runner's plugins (lanes/runner.py PLUGINS, the conformance plugin) and xdist's worker
# code, which execnet sends as `__channelexec__`. With autoloading off and `-p` refused by the
# runner, an installed package's plugin can only come in through a conftest, which must be tracked.
ALLOWED_PLUGIN_PACKAGES = ("pytest", "_pytest", "__channelexec__")
# Where a startup hook (sitecustomize, usercustomize, a .pth file that runs code) may not lie:
# the checkout and PYTHONPATH, which a change under review or a caller's environment control. The
# interpreter's installation (a venv's site-packages, even inside the checkout: an editable
# install's finder) and the machine's own files (Debian's /etc/python3.x/sitecustomize.py, which
# the CPU lane's image runs under) are the environment, like an installed package.
STARTUP_REFUSED = ("checkout", "pythonpath")


def allowed_plugin_packages() -> set:
    from selgate.lanes.runner import CONFORMANCE_PLUGIN, PLUGINS

    return {*ALLOWED_PLUGIN_PACKAGES, *(n.split(".")[0] for n in (*PLUGINS, CONFORMANCE_PLUGIN))}


def loaded_code_blocking(name: str, loaded: list) -> list:
    """Why code a lane's pytest loaded (its record of every conftest, plugin and startup hook of
    the controller and each worker) is not what the tree and the lane allow: a conftest or plugin
    in the checkout must be a tracked file with the content stamped; one outside it must be a
    plugin the lane runner names (or pytest's own); a startup hook may not come from the checkout
    or PYTHONPATH."""
    out, allowed = [], allowed_plugin_packages()
    for record in loaded:
        kind, module, path, where = record.get("kind"), record.get("name"), record.get("path"), record.get("where")
        what = f"{kind} {path or module}" + (f" (module {module})" if path and kind == "plugin" else "")
        if kind in ("conftest", "plugin") and where == "checkout":
            status = record.get("status")  # None: a copy without git (a lane's image), where the digest is every file
            if status in ("untracked", "ignored") or (status is None and not record.get("stamped")):
                why = {"untracked": "untracked", "ignored": "ignored by git"}.get(status, "left out of the tree's digest")
                out.append(
                    f"required lane {name} loaded {what}, {why}: pytest ran code the tree under review "
                    "does not hold; remove it (or commit it) and rerun the lane"
                )
            elif not record.get("stamped"):
                out.append(f"required lane {name} loaded {what} with content other than the tree stamped: rerun the lane")
        elif kind == "conftest":
            out.append(f"required lane {name} loaded {what} from outside the checkout ({where}): rerun it from a clean checkout")
        elif kind == "plugin" and str(module).split(".")[0] not in allowed:
            out.append(
                f"required lane {name} loaded {what}, a plugin the lane runner does not name "
                f"(allowed outside the checkout: {sorted(allowed)}): rerun it with `python -m selgate.lanes run {name}`"
            )
        elif kind in ("sitecustomize", "usercustomize", "pth") and where in STARTUP_REFUSED:
            out.append(
                f"required lane {name} ran under the startup hook {kind} {path} (on {where}): Python ran it "
                "before pytest started; remove it and rerun the lane"
            )
    return out


def tolerances(name: str, environment: dict, cfg: dict | None) -> list:
    """Tolerances come from the lane YAML only: the run's overrides must be the lane's."""
    from selgate.conformance.tolerances import ENV
    from selgate.lanes.config import tolerance_env

    wanted = tolerance_env(cfg).get(ENV, "none") if cfg else "none"
    ran = environment.get("tolerance_overrides", "none")
    if ran != wanted:
        return [
            f"required lane {name} ran with {ENV}={ran!r}, its lane YAML gives {wanted!r}: only "
            "tolerance_overrides in the lane YAML (with a reason and the measured error) may change a tolerance"
        ]
    return []


def cut_short(name: str, cut: dict) -> str:
    """The blocking line of a run cut short: what cut it and how far it got."""
    by = f"by {cut['signal']}" if cut.get("signal") else f"({cut.get('reason') or 'interrupted'})"
    done, total = cut.get("tests_done", 0), cut.get("tests_collected", 0)
    share = f" ({100 * done // total} %)" if total else ""
    return (
        f"required lane {name} cut short {by} after {done} of {total} tests{share}: its JUnit holds the "
        f"results it has; rerun the lane to completion (`python -m selgate.lanes run {name}`)"
    )


def inventory_gaps(name: str, lane: LaneResult, cfg: dict | None) -> list:
    """How the tests with a result differ from the lane's inventory."""
    if cfg is None:
        return []
    inventory = lane.inventory
    if not inventory:
        return [f"required lane {name} has no inventory.json: rerun it with `python -m selgate.lanes run {name}`"]
    if inventory.get("exitstatus") not in (0, 5):
        return [
            f"required lane {name}: collecting its inventory failed (pytest exit {inventory.get('exitstatus')}): "
            + " ".join(str(inventory.get("output", "")).split())[-300:]
        ]
    # a module that failed to collect reports under its path, and blocks as an error of its own
    gaps = difference(inventory.get("ids", []), [c.nodeid for c in lane.cases if "::" in c.nodeid])
    return [f"required lane {name} ran another set than its selection collects: {'; '.join(gaps)}"] if gaps else []


def lane_yaml_missing(name: str, cfg: dict | None) -> list:
    """A result counts only for a lane with a YAML (lanes/<name>.yaml; `<name>-emulated` is
    `<name>`): without one there is no selection or inventory to hold the run to, and a
    hand-picked run would pass."""
    if cfg is not None:
        return []
    base = name.removesuffix("-emulated")
    return [
        f"required lane {name} has no lane YAML (lanes/{base}.yaml): a run counts only against a "
        "lane's own selection and inventory; gate a lane that has one"
    ]


def exit_status(name: str, lane: LaneResult, status) -> list:
    """pytest's own exit status must agree with the JUnit. 0 passes; 1 (tests failed) only
    when the JUnit holds failures, its suites' stated failure and error counts equal the
    <failure> and <error> elements its test cases hold, and the failures each block by name or
    are quarantined; any other status blocks (2-4 block earlier as an aborted run)."""
    if status is None:
        return [f"required lane {name} recorded no pytest exit status: rerun it with `python -m selgate.lanes run {name}`"]
    if type(status) is not int:  # JSON's true would compare equal to 1
        return [f"required lane {name}: pytest exit {status!r} (not an exit status): rerun the lane"]
    if status == 0:
        return []
    if status != 1:
        return [
            f"required lane {name}: {pytest_exit(status)}: only a run that exits 0, or 1 on quarantined failures alone, passes"
        ]
    failing = [c for c in lane.cases if c.outcome in ("fail", "error")]
    if not failing:
        return [
            f"required lane {name}: pytest exit 1 (tests failed), but {lane.junit} shows no failure or error: "
            "the JUnit is not the one pytest wrote; rerun the lane"
        ]
    if lane.headers != lane.elements:
        h = lane.headers
        stated = "no counts" if h is None else f"{h['failures']} failures and {h['errors']} errors"
        return [
            f"required lane {name}: pytest exit 1 (tests failed), and {lane.junit} states {stated} where its "
            f"test cases hold {lane.elements['failures']} failures and {lane.elements['errors']} errors: the JUnit is "
            "not the one pytest wrote; rerun the lane"
        ]
    # every failure left blocks by name below; quarantined ones explain the exit status
    return []


def tree_state(tree: dict, same_commit: bool) -> list:
    """The gated tree names a full commit; for a release (`same_commit`), one with no change beside it."""
    out = []
    if not FULL_COMMIT.fullmatch(str(tree["commit"])):
        out.append(
            f"the tree being gated names no full commit ({tree['commit']!r}): gate a git checkout, "
            "or set GITHUB_SHA / SELGATE_COMMIT to its full commit id"
        )
    if same_commit and tree.get("dirty"):
        out.append(
            f"the tree being gated has uncommitted changes to files that can change a run "
            f"({', '.join(tree.get('untracked') or []) or 'tracked files'}): a release gates one "
            "committed tree"
        )
    return out


def expired_quarantine(policy: dict, today: datetime.date) -> list:
    return [
        f"quarantine of {e['test']} (owner {e['owner']}) expired on {e['expires']}: fix the test or renew the entry"
        for e in policy["quarantine"]
        if e["expires"] < today
    ]


def absent(name: str, lane: LaneResult | None) -> str | None:
    """Why a required lane has no results to judge, or None."""
    if lane is None:
        return f"required lane {name} missing: no {name}/junit.xml in the results (run `python -m selgate.lanes run {name}`)"
    if lane.refused is not None:
        return f"required lane {name} never ran: the lane runner refused it ({lane.refused})"
    return None


def lane_stamp(name: str, lane: LaneResult, tree: dict) -> tuple[list, bool]:
    """(blocking lines, judged) of a required lane's stamp: written by this lane, neither cut
    nor aborted (then its exit status is `judged`), from this tree, configured, at the lane's
    tolerances, over its whole selection and inventory."""
    env, cfg = lane.environment, _lane_config(name)
    status = (env or {}).get("pytest_exitstatus")
    if env is None:
        return [
            f"required lane {name} unstamped: no environment.json beside {lane.junit} "
            "(not run through `python -m selgate.lanes run`)"
        ], False
    if env.get("lane") != name:
        return [f"required lane {name} foreign: {lane.junit} was written by lane {env.get('lane')!r}"], False
    if env.get("cut"):
        return [cut_short(name, env["cut"])], False
    if status in ABORTED:
        return [f"required lane {name} aborted: {pytest_exit(status)}"], False
    out = lane_yaml_missing(name, cfg) + provenance(name, env.get("tree"), tree)
    out += configuration(name, env.get("pytest")) + tolerances(name, env, cfg)
    if short := narrowing(name, env.get("selection") or {}):
        out.append(
            f"required lane {name} narrowed: run with {'; '.join(short)} (the gate needs "
            f"the lane's whole selection: `python -m selgate.lanes run {name}`)"
        )
    return out + inventory_gaps(name, lane, cfg), True


def ran_anything(name: str, lane: LaneResult) -> list:
    counts = lane.counts()
    if not lane.cases:
        return [f"required lane {name} empty: {lane.junit} holds no tests"]
    if counts["pass"] == 0 and counts["fail"] == 0 and counts["error"] == 0:
        return [f"required lane {name} skipped: all {len(lane.cases)} tests skipped or xfailed"]
    return []


def family_gaps(policy: dict, name: str, lane: LaneResult) -> list:
    """Each family the policy requires of the lane has a passing test."""
    out = []
    for family in lane_families(policy, name):
        fc = lane.counts(family)
        if fc["pass"] == 0 and lane.cases:
            out.append(
                f"required lane {name}: family {family} has no passing test "
                f"(pass/fail/error/skip/xfail {'/'.join(map(str, fc.values()))})"
            )
    return out


def failures(policy: dict, lane: LaneResult, required: list, today: datetime.date, quarantined: list) -> list:
    """A lane's failing tests (those under a live quarantine entry go to `quarantined`), after
    whether an optional lane was refused."""
    out = []
    if lane.refused is not None and lane.name not in required:
        out.append(f"lane {lane.name} never ran: the lane runner refused it ({lane.refused})")
    for case in lane.cases:
        if case.outcome not in ("fail", "error"):
            continue
        entry = _quarantine_entry(policy, case)
        if entry is not None and entry["expires"] >= today:
            quarantined.append((case, entry))
        else:
            seed = f" (seed {case.seed})" if case.seed else ""
            out.append(f"lane {lane.name}: {case.outcome.upper()} {case.nodeid}{seed}: {case.message}")
    return out


def evaluate(
    policy: dict,
    results: dict,
    required: list,
    today: datetime.date | None = None,
    *,
    tree: dict,
    same_commit: bool = False,
    sanitizer: dict | None = None,
    require_sanitizer: bool = False,
) -> GateVerdict:
    """Apply the policy's rules (the functions above, one each) to `{lane: LaneResult}` gated
    for `tree` (the tree stamp of what is being gated); blocking lines come most fundamental
    first. `same_commit` (a profile's flag, set for releases): the gated tree must be committed,
    with no change beside it. `require_sanitizer` (likewise): the compute-sanitizer pass
    `sanitizer` must be clean."""
    today = today or utc_today()
    v = GateVerdict(required_lanes=required)
    v.blocking += tree_state(tree, same_commit) + expired_quarantine(policy, today)
    v.blocking += [f"lane {lane.name}: committed evidence {lane.manifest}" for lane in results.values() if lane.manifest]
    gaps = []
    for name in required:
        lane = results.get(name)
        if why := absent(name, lane):
            v.blocking.append(why)
            continue
        lines, judged = lane_stamp(name, lane, tree)
        v.blocking += lines + ran_anything(name, lane)
        if judged and lane.cases:  # an empty run blocks as empty, whatever pytest's status
            v.blocking += exit_status(name, lane, lane.environment.get("pytest_exitstatus"))
        v.coverage[name] = lane_coverage(lane)
        gaps += family_gaps(policy, name, lane)
    for lane in results.values():
        v.blocking += failures(policy, lane, required, today, v.quarantined)
    v.blocking += gaps
    if require_sanitizer:
        v.blocking += sanitizer_blocking(sanitizer, tree)
    return v
