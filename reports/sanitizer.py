"""The compute-sanitizer pass as the release gate sees it: `sanitizer/result.json` (written by
`python -m selgate.lanes sanitize` on a Hopper GPU) must exist, come from the tree being gated,
cover every tool, and have found nothing. Each tool's verdict is recomputed from its recorded
counts, never taken from the file's own `blocking` list."""

from __future__ import annotations

import json
from pathlib import Path

SANITIZER_DIR = "sanitizer"
RESULT_FILE = "result.json"
RUN = "`python -m selgate.lanes sanitize` on an H100"


def load_sanitizer(roots) -> dict | None:
    """The first `<root>/sanitizer/result.json` among `roots`; ValueError names one that is not JSON."""
    for root in map(Path, roots):
        path = root / SANITIZER_DIR / RESULT_FILE
        if path.exists():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e})") from None
    return None


def sanitizer_blocking(result: dict | None, tree: dict) -> list:
    """Why the pass does not clear a release (empty when it does)."""
    from selgate.lanes.sanitize import TOOLS, ToolResult

    if result is None:
        return [f"the compute-sanitizer pass is missing: no {SANITIZER_DIR}/{RESULT_FILE} in the results (run {RUN})"]
    stamp = result.get("tree") or {}
    out = []
    if stamp.get("commit") != tree["commit"] or stamp.get("digest") != tree["digest"]:
        out.append(
            f"the compute-sanitizer pass ran commit {stamp.get('commit')!r} (digest "
            f"{str(stamp.get('digest'))[:12]}), this tree is {tree['commit']} ({tree['digest'][:12]}): "
            f"rerun it ({RUN})"
        )
    warmup = result.get("warmup") or {}
    if warmup.get("exit_status") != 0:
        out.append(f"the compute-sanitizer pass: its cases failed without a sanitizer (exit {warmup.get('exit_status')})")
    ran = {}
    for entry in result.get("tools") or []:
        try:
            ran[entry["tool"]] = ToolResult(**entry)
        except (TypeError, KeyError):
            out.append(f"the compute-sanitizer pass: unreadable tool entry {str(entry)[:120]}")
    missing = [t for t in TOOLS if t not in ran]
    if missing:
        out.append(f"the compute-sanitizer pass did not run {missing} (run {RUN})")
    out += [b for r in ran.values() if (b := r.blocking())]
    return out
