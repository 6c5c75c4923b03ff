"""The tree a lane ran: the full commit and a digest of every file the run can read: every
tracked file, and every untracked or ignored file a run can load or read (`read_by_runs`: code
and configuration anywhere, any file inside the project's own folders) except the outputs
listed in OUTPUTS. The gate compares it with the tree being gated, so results from another
commit, another working tree or a tree with an extra `pytest.ini`, an ignored conftest or an
edited doc a test reads cannot stand in for this one; a wheel built into dist/, downloaded
results, notes beside the checkout or an editor's backup and swap files do not change it. The
stamp keeps each file's hash, so a mismatch names the files."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
from pathlib import Path

from selgate import env_vars

ROOT = Path(__file__).resolve().parent.parent
FULL_COMMIT = re.compile(r"[0-9a-f]{40}")
# What a run writes or the environment holds, left out of the digest. The whole checkout is on
# a lane's import path (pytest runs from its root), so every other file, tracked, untracked or
# ignored, is in the digest. Each entry is a folder pattern (`/`-separated; a leading `/`
# anchors it at the checkout's root, otherwise it matches a folder of that name anywhere) and
# is safe to leave out because:
OUTPUTS = (
    ".git",  # git's own store; the commit id stands for it
    # what lanes and the gate write; code loaded from it is refused by name (the stamp records
    # every conftest and plugin module a run loads; the gate blocks one that is not tracked)
    "/reports/out",
    # the interpreter's installation (versions are in environment.json); the stamp records its
    # startup hooks and plugins, and the gate checks them
    "/.venv",
    "/venv",  # the same, under the other usual name
    "/build",  # setuptools' build output and tool venvs; pytest never recurses into build/ and nothing imports from it
    "/.whl",  # wheels brought to install from; a run reads what was installed, not these
    "/*.egg-info",  # pip's metadata of the editable install (entry points, version); plugin autoloading is off in lanes
    "__pycache__",  # bytecode; lanes put theirs outside the checkout (PYTHONPYCACHEPREFIX), so none here is read
    ".pytest_cache",  # pytest's cache: only --lf/--nf/--sw read it, and the gate blocks --lf and any result the inventory lacks
    ".hypothesis",  # Hypothesis' example database: it replays failing examples, which can add a failure, never hide one
    ".mypy_cache",  # type checker and linter caches, read by no run
    ".ruff_cache",
)
# Files pytest reads its own configuration from; untracked, they can narrow a run unseen.
PYTEST_CONFIG = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "conftest.py", "pyproject.toml")
# What Python loads wherever it lies on the import path (the checkout's root is on a lane's)
LOADABLE = (".py", ".pyc", ".pth", ".so", ".pyd")
# Editors' backups and swap files, and Finder's folder settings, which turn up beside any file being
# edited. None ends as code or configuration does, so no import, pytest collection or `*.yaml`
# glob takes one. (Emacs' `.#name` lock is a symlink to nowhere, never hashed; a `.#name.yaml`
# file is no editor's and stays in: `Path.glob("*.yaml")` matches dot-files.)
EDITOR_FILES = ("*~", ".*.sw?", "#*#", ".DS_Store")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=60, cwd=root)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def output(path: str) -> bool:
    """Whether `path` (relative, `/`-separated; a folder may end in `/`) lies in one of OUTPUTS."""
    parts = path.strip("/").split("/")
    for pattern in OUTPUTS:
        if pattern.startswith("/"):
            anchored = pattern[1:].split("/")
            if len(parts) >= len(anchored) and all(fnmatch.fnmatchcase(p, a) for p, a in zip(parts, anchored)):
                return True
        elif pattern in parts:
            return True
    return False


def runs(path: str) -> bool:
    """Whether the file at `path` (relative, `/`-separated) is in the digest: every file but outputs."""
    return not output(path)


def read_by_runs(path: str, project_folders: set) -> bool:
    """Whether an untracked or ignored file at `path` can change a run: code or pytest
    configuration anywhere, or any file inside a folder of the project (one that holds tracked
    files, the checkout's root aside: tests copy and glob their folders). A wheel in dist/,
    results downloaded into results/, notes at the root or editor files anywhere do not."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(LOADABLE) or name in PYTEST_CONFIG:
        return True
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in EDITOR_FILES):
        return False
    parts = path.split("/")[:-1]
    return any("/".join(parts[: i + 1]) in project_folders for i in range(len(parts)))


def _folders(paths) -> set:
    """Every folder holding one of `paths`, at any depth (the root, "", left out)."""
    out = set()
    for p in paths:
        parts = p.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def _walk(root: Path, under: str = "") -> list[str]:
    """Files below root/under, outputs left out (their folders are not entered)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root / under):
        rel = Path(dirpath).relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        dirnames[:] = [d for d in dirnames if not output(rel + d + "/")]
        found += [rel + f for f in filenames if not output(rel + f)]
    return found


def commit(root: Path = ROOT) -> str:
    """The full commit id: SELGATE_COMMIT (a copy of the tree without .git), GITHUB_SHA in CI,
    else the checkout's HEAD; "unknown" when none names one."""
    named = env_vars.get("SELGATE_COMMIT") or os.environ.get("GITHUB_SHA")
    if named:
        return named
    head = _git(root, "rev-parse", "HEAD")
    return head.strip() if head else "unknown"


def _split(listing: str) -> list[str]:
    return [p for p in listing.split("\0") if p]


def tree_files(root: Path = ROOT) -> tuple[dict, dict]:
    """(stamp, files): tree_stamp's dict, and {path: (sha256 hex, status)} of every file in the
    digest, status `tracked`, `untracked` or `ignored` (`None` in a copy without git)."""
    root = Path(root)
    tracked = _git(root, "ls-files", "-z", "--cached")
    status: dict[str, str | None] = {}
    if tracked is None:
        status = dict.fromkeys(_walk(root))
        untracked = ignored = dirty = None
    else:
        status = dict.fromkeys(_split(tracked), "tracked")
        project = _folders(status)
        others = _split(_git(root, "ls-files", "-z", "--others", "--exclude-standard") or "")
        status.update(dict.fromkeys((p for p in others if runs(p) and read_by_runs(p, project)), "untracked"))
        # ignored files come as their topmost ignored folder (`x/`) or file; outputs are not entered
        for entry in _split(_git(root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory") or ""):
            if output(entry):
                continue
            for path in _walk(root, entry) if entry.endswith("/") else [entry]:
                if read_by_runs(path, project):
                    status.setdefault(path, "ignored")
        untracked = sorted(p for p, s in status.items() if s == "untracked")
        ignored = sorted(p for p, s in status.items() if s == "ignored")
        changed = _split(_git(root, "diff", "--name-only", "-z", "HEAD") or "")
        dirty = bool(untracked or ignored) or any(runs(p) for p in changed)
    digest = hashlib.sha256()
    files = {}
    for path in sorted(status):
        full = root / path
        if output(path) or not full.is_file():  # tracked but deleted in the working tree, or a link to a folder
            continue
        sha = hashlib.sha256(full.read_bytes()).digest()
        digest.update(path.encode() + b"\0" + sha)
        files[path] = (sha.hex(), status[path])
    stamp = {
        "commit": commit(root),
        "digest": digest.hexdigest(),
        "files": len(files),
        "untracked": untracked,
        "ignored": ignored,
        "dirty": dirty,
        "hashes": {path: sha[:16] for path, (sha, _) in files.items()},
    }
    return stamp, files


def differing(ran: dict, here: dict, most: int = 5) -> str:
    """The files two tree stamps disagree on, named (at most `most`), for a digest mismatch."""
    a, b = ran.get("hashes"), here.get("hashes")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "(the lane's stamp lists no files: rerun it to see which)"
    names = [f"{p} ({'only where the lane ran' if p not in b else 'only here' if p not in a else 'changed'})"
             for p in sorted(set(a) | set(b)) if a.get(p) != b.get(p)]  # fmt: skip
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return "files that differ: " + ", ".join(names[:most]) + more


def tree_stamp(root: Path = ROOT) -> dict:
    """{commit, digest, files, untracked, ignored, dirty, hashes} of the tree at `root`.
    `untracked` and `ignored` list the files in the digest that git does not track (ignored ones
    outside OUTPUTS), and `dirty` says whether any file in the digest differs from the commit; all
    three are None in a copy without git. `hashes`: each file's sha256, shortened, by path."""
    return tree_files(root)[0]


def untracked_config(stamp: dict) -> list[str]:
    """Untracked or ignored pytest configuration files in a tree stamp."""
    return [p for p in [*(stamp.get("untracked") or []), *(stamp.get("ignored") or [])] if p.rsplit("/", 1)[-1] in PYTEST_CONFIG]
