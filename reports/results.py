"""Lanes' results read back from `<results>/<lane>/junit.xml` (+ environment.json, the
lane's inventory.json, or the note of a run refused before it started) with junitparser,
one outcome per test, and merged into one JUnit file whose suites carry their lane and
environment as properties."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Properties, Skipped

from selgate.environment import ENV_FILE
from selgate.conformance.reported import family_of
from .inventory import INVENTORY_FILE

OUTCOMES = ("pass", "fail", "error", "skip", "xfail")
_RANK = {"pass": 0, "skip": 1, "xfail": 2, "fail": 3, "error": 4}  # a repeated test keeps its worst


@dataclass
class CaseResult:
    lane: str
    nodeid: str
    family: str
    outcome: str
    message: str = ""
    seed: str | None = None
    seconds: float = 0.0  # the test's time as JUnit records it (setup, call and teardown)
    # what the matrix wrote where it knew it (conformance/plugin.py): impl, case, dtype, elements, sets
    # and, for a broken contract, failure: {rule, tensor, kind, error, bound} (compare.py)
    facts: dict = field(default_factory=dict)


@dataclass
class LaneResult:
    name: str
    junit: Path
    environment: dict | None
    cases: list = field(default_factory=list)
    inventory: dict | None = None  # the lane's own selection, collected apart from the run
    refused: str | None = None  # why the lane runner refused to start the run
    # <failure> and <error> elements among the test cases, before a repeated test is merged, and
    # the same counts as the suites' headers state them (None where a header leaves one out)
    elements: dict = field(default_factory=lambda: {"failures": 0, "errors": 0})
    headers: dict | None = None
    manifest: str | None = None  # why committed evidence does not match its junit.txt manifest

    def counts(self, family: str | None = None) -> dict:
        out = dict.fromkeys(OUTCOMES, 0)
        for c in self.cases:
            if family is None or c.family == family:
                out[c.outcome] += 1
        return out


def _properties(case) -> dict:
    props = case.child(Properties)
    return {p.name: p.value for p in props} if props is not None else {}


FACTS = ("impl", "case", "dtype", "elements", "sets")


def _facts(props: dict) -> dict:
    """The matrix's facts among a test's properties; `failure` decoded (a value that is not a
    JSON object is left out: the report then reads the message, as for any other failure)."""
    facts = {k: props[k] for k in FACTS if k in props}
    try:
        failure = json.loads(props.get("failure", "null"))
    except json.JSONDecodeError:
        failure = None
    if isinstance(failure, dict):
        facts["failure"] = failure
    return facts


def _outcome(case) -> tuple[str, str]:
    for r in case.result:
        if isinstance(r, Error):
            return "error", r.message or (r.text or "")[:200]
        if isinstance(r, Failure):
            return "fail", r.message or (r.text or "")[:200]
    for r in case.result:
        if isinstance(r, Skipped):
            return ("xfail" if r.type == "pytest.xfail" else "skip"), r.message or ""
    return "pass", ""


def _nodeid(case) -> str:
    """pytest writes classname `a.b.test_mod.TestC`; without a `nodeid` property (xdist's
    crash reports) the file path is rebuilt up to the module. A collection error has no
    classname and the dotted module as its name."""
    if not case.classname:
        return case.name.replace(".", "/") + ".py"
    parts = case.classname.split(".")
    mod = next(
        (i for i in range(len(parts) - 1, -1, -1) if parts[i].startswith("test") and not parts[i].startswith("Test")),
        len(parts) - 1,
    )
    return "/".join(parts[: mod + 1]) + ".py::" + "::".join([*parts[mod + 1 :], case.name])


def _combine(old: CaseResult, new: CaseResult) -> CaseResult:
    """A test reported twice (its failure, then xdist's crash error) keeps its worst outcome,
    both messages, and the seed and family its first report carried."""
    worst, other = (new, old) if _RANK[new.outcome] > _RANK[old.outcome] else (old, new)
    message = old.message if new.message in old.message else f"{old.message}; then {new.message}"
    seconds = old.seconds + new.seconds
    facts = {**other.facts, **worst.facts}
    return replace(worst, message=message, seed=worst.seed or other.seed, family=old.family, seconds=seconds, facts=facts)


def _json(path: Path, packed: bool = False) -> dict | None:
    """The JSON object in `path`, or with `packed` in `path`.gz where committed evidence keeps it
    (None when there is none); ValueError names a file that is not JSON or holds another value
    than an object (`[]`, a number, null). Only the inventory is read packed: a stale
    environment.json.gz must not stand in for the stamp a run did not write."""
    source = path if path.exists() or not packed else path.with_name(path.name + ".gz")
    if not source.exists():
        return None
    try:
        data = json.loads(source.read_text() if source is path else gzip.decompress(source.read_bytes()))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as e:
        raise ValueError(f"{source}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}: {json.dumps(data)[:80]}")
    return data


MANIFEST_FILE = "junit.txt"


def manifest_text(junit: Path, cases) -> str:
    """The plain-text manifest committed beside a `junit.xml.gz`: the gz's SHA-256, then one line
    per test, `outcome name`, under a `## file` line for each test file, sorted, so that a diff
    of the evidence shows what changed, test by test (the file is not repeated on every line: the
    sm90 lane's 11036 tests took 1.2 MB that way)."""
    digest = hashlib.sha256(Path(junit).read_bytes()).hexdigest()
    lines = [
        f"# sha256 {digest} {Path(junit).name}: one line per test, `outcome name`, under a `## file` line per test file, sorted"
    ]
    current = None
    for c in sorted(cases, key=lambda c: c.nodeid):
        file, _, name = c.nodeid.partition("::")
        if file != current:
            lines.append(f"## {file}")
            current = file
        lines.append(f"{c.outcome} {name}".rstrip())
    return "\n".join(lines) + "\n"


def _tests(lines: list) -> list:
    """`outcome nodeid` of each test line of a manifest's body (its `## file` lines expanded)."""
    out, file = [], ""
    for line in lines:
        if line.startswith("## "):
            file = line[3:]
            continue
        outcome, _, name = line.partition(" ")
        out.append(f"{outcome} {file}::{name}" if name else f"{outcome} {file}")
    return out


def manifest_mismatch(junit: Path, cases) -> str | None:
    """Why the manifest beside a committed `junit.xml.gz` is not that file's (missing, another
    digest, other tests or outcomes); None when it matches. A plain junit.xml needs none."""
    if Path(junit).suffix != ".gz":
        return None
    path = Path(junit).with_name(MANIFEST_FILE)
    if not path.exists():
        return f"{junit} has no {MANIFEST_FILE} beside it (`python -m selgate.reports.results {junit.parent}` writes it)"
    want, have = manifest_text(junit, cases).splitlines(), path.read_text().splitlines()
    if want[0] != (have[:1] or [""])[0]:
        return f"{path} does not match {junit.name}: the gz has another digest ({want[0].split()[2][:12]})"
    want, have = _tests(want[1:]), _tests(have[1:])
    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
    if extra or missing or len(have) != len(want):
        example = (missing or extra or ["repeated lines"])[0]
        return (
            f"{path} does not match {junit.name}: {len(missing)} lines of the gz missing, {len(extra)} "
            f"not in it (e.g. {example!r})"
        )
    return None


def junit_path(lane_dir: Path) -> Path:
    """`junit.xml`, or the `junit.xml.gz` that committed evidence keeps (a lane's JUnit is
    megabytes of repeated XML; gzip makes it a tenth)."""
    plain = Path(lane_dir) / "junit.xml"
    packed = plain.with_name("junit.xml.gz")
    return packed if packed.exists() and not plain.exists() else plain


def read_junit(path: Path) -> JUnitXml:
    if path.suffix == ".gz":
        with gzip.open(path) as f:
            return JUnitXml.fromfile(f)
    return JUnitXml.fromfile(str(path))


def load_lane(name: str, lane_dir: Path) -> LaneResult | None:
    """The lane's results, or None when it has neither junit.xml nor a refusal note;
    ValueError names a file that does not parse."""
    from selgate.lanes.runner import REFUSED_FILE

    junit = junit_path(lane_dir)
    refused = _json(Path(lane_dir) / REFUSED_FILE)
    if refused is not None:
        return LaneResult(name, junit, None, refused=str(refused.get("error", "no reason recorded")))
    if not junit.exists():
        return None
    result = LaneResult(name, junit, _json(junit.parent / ENV_FILE), inventory=_json(junit.parent / INVENTORY_FILE, packed=True))
    by_id: dict = {}
    try:
        suites = list(read_junit(junit))
    except SyntaxError as e:  # ElementTree's and lxml's parse errors both derive from it
        raise ValueError(f"{junit}: not a JUnit XML file ({e})") from None
    headers: dict | None = {"failures": 0, "errors": 0}
    for suite in suites:
        for key in ("failures", "errors"):
            stated = suite._elem.get(key)  # as the file states it; junitparser reads a missing one as 0
            if headers is not None and stated is not None and stated.isdigit():
                headers[key] += int(stated)
            else:
                headers = None
        for case in suite:
            for r in case.result:
                if isinstance(r, (Error, Failure)):
                    result.elements["errors" if isinstance(r, Error) else "failures"] += 1
            props = _properties(case)
            if not (props.get("nodeid") or case.name):
                continue  # a test in flight when the run was cut: pytest leaves an empty element, no result
            nodeid = props.get("nodeid") or _nodeid(case)
            outcome, message = _outcome(case)
            family = props.get("family") or family_of(nodeid)
            seconds = float(case.time or 0.0)
            message = " ".join(message.split())[:300]
            new = CaseResult(name, nodeid, family, outcome, message, props.get("seed"), seconds, _facts(props))
            old = by_id.get(nodeid)
            by_id[nodeid] = new if old is None else _combine(old, new)
    result.cases = list(by_id.values())
    result.headers = headers
    result.manifest = manifest_mismatch(junit, result.cases)
    return result


def load_results(roots, lanes=None) -> dict:
    """{lane: LaneResult} from the lane folders under `roots` (first root holding a lane
    wins); with `lanes`, only those (a missing one is simply absent)."""
    found: dict = {}
    for root in map(Path, roots):
        for sub in sorted(p for p in root.glob("*/") if p.is_dir()):
            if sub.name in found or (lanes is not None and sub.name not in lanes):
                continue
            lane = load_lane(sub.name, sub)
            if lane is not None:
                found[sub.name] = lane
    return found


def merge(results: dict, path: Path) -> JUnitXml:
    """One JUnit file of every lane's suites, each stamped with `lane` and the environment."""
    merged = JUnitXml("selgate")
    for name, lane in results.items():
        if lane.refused is not None:
            continue
        for suite in read_junit(lane.junit):
            suite.name = f"{name}"
            suite.add_property("lane", name)
            for key, value in sorted((lane.environment or {"environment": "missing"}).items()):
                if key not in ("lane", "pytest", "tree"):
                    suite.add_property(key, str(value))
            merged.add_testsuite(suite)
    merged.update_statistics()
    path.parent.mkdir(parents=True, exist_ok=True)
    merged.write(str(path), pretty=True)
    return merged


def write_manifests(dirs) -> list:
    """Write junit.txt beside each `junit.xml.gz` under `dirs` (committed evidence), and pack the
    lane's inventory.json beside it as inventory.json.gz (an sm90 inventory is over 1 MB of node
    ids); the paths written."""
    written = []
    for d in map(Path, dirs):
        for junit in sorted(d.rglob("junit.xml.gz")) if d.is_dir() else []:
            lane = load_lane(junit.parent.name, junit.parent)
            path = junit.with_name(MANIFEST_FILE)
            path.write_text(manifest_text(junit, lane.cases))
            written.append(path)
            inventory = junit.with_name(INVENTORY_FILE)
            if inventory.exists():
                packed = inventory.with_name(INVENTORY_FILE + ".gz")
                packed.write_bytes(gzip.compress(inventory.read_bytes(), mtime=0))
                inventory.unlink()
                written.append(packed)
    return written


if __name__ == "__main__":  # python -m selgate.reports.results DIR...: the evidence manifests
    if len(sys.argv) < 2:
        sys.exit("usage: python -m selgate.reports.results DIR... (junit.txt beside each junit.xml.gz; packs inventory.json)")
    for written in write_manifests(sys.argv[1:]):
        print(f"wrote {written}")
