"""The gate job's first step: every job it needs must have succeeded. GitHub runs a job
with `if: always()` whatever its needs did, and a failed, cancelled or skipped lane would
otherwise slip through as "not a failure"; a required check must not pass on a lane that
never ran. Lanes that were not requested for this event (GPU lanes on an unlabelled pull
request) are named in --may-skip and may be skipped, never failed or cancelled.

Usage: NEEDS='${{ toJSON(needs) }}' python check_needs.py [--may-skip job,job]
Exit status 0 when the gate may go on, 1 with one line per blocking job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def blocking(needs: dict, may_skip=frozenset()) -> list[str]:
    """Why the gate must fail, one line per job; empty when every need is satisfied."""
    if not needs:
        return ["no jobs in needs: the gate has nothing to vouch for"]
    lines = []
    for job, info in sorted(needs.items()):
        result = info.get("result")
        if result == "success" or (result == "skipped" and job in may_skip):
            continue
        why = {
            "skipped": "a skipped lane is not a pass",
            "cancelled": "a cancelled lane is not a pass",
            "failure": "it failed",
        }.get(result, "unknown result")
        lines.append(f"{job}: {result} ({why})")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--may-skip", default="", help="comma-separated jobs that were not requested for this event")
    args = p.parse_args(argv)
    try:
        needs = json.loads(os.environ["NEEDS"])
    except (KeyError, json.JSONDecodeError) as e:
        print(f"check_needs: NEEDS must hold the JSON of the needs context (toJSON(needs)): {e!r}", file=sys.stderr)
        return 2
    may_skip = {j.strip() for j in args.may_skip.split(",") if j.strip()}
    for job, info in sorted(needs.items()):
        print(f"needs.{job}.result = {info.get('result')}{' (may skip)' if job in may_skip else ''}")
    lines = blocking(needs, may_skip)
    for line in lines:
        print(f"gate blocked: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
