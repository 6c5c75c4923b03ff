"""The compute-sanitizer pass of a release (`python -m selgate.lanes sanitize`): memcheck,
racecheck, initcheck and synccheck, each over one run of `selgate.lanes.sanitize_cases` (a tiny
call of every GPU kernel: Triton forward and backward, the Gluon prefill kernel, the CUDA decode
kernel). A finding blocks the release gate, and so does a pass that is absent, ran another
tree, or did not finish.

The kernels are compiled by one plain run first (Triton's and the extension's caches), so the
sanitized runs only load them. PyTorch's caching allocator is off under the sanitizer
(PYTORCH_NO_CUDA_MEMORY_CACHING=1): inside one of its pooled blocks an out-of-bounds access
lands in valid memory and memcheck cannot see it.

Writes reports/out/sanitizer/: result.json (what the gate reads), report.md, junit-sanitizer.xml
(one test per tool, for CI displays) and each tool's full log."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from selgate import env_vars

from .runner import OUT_ROOT, ROOT, cache_root

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
DRIVER = "selgate.lanes.sanitize_cases"
OUT_NAME = "sanitizer"
RESULT_FILE = "result.json"
TIMEOUT_S = 150  # one tool's run; the four take about 4 minutes on an H100 at most
SHOWN_FINDINGS = 20
PREFIX = "========="
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


@dataclass
class ToolResult:
    tool: str
    exit_status: int | None  # None: timed out
    seconds: float
    errors: int | None = None  # None: no summary in the output (the run did not finish)
    warnings: int = 0
    findings: list = field(default_factory=list)  # the first error lines, without the tool's prefix
    tail: str = ""  # the end of its output

    def blocking(self) -> str | None:
        """Why this tool's run blocks a release, None when it found nothing."""
        name = f"compute-sanitizer {self.tool}"
        if self.exit_status is None:
            return f"{name}: timed out after {self.seconds:.0f} s"
        if self.errors is None:
            return f"{name}: no error summary in its output (exit {self.exit_status}): the run did not finish"
        if self.errors:
            first = f", e.g. {self.findings[0]}" if self.findings else ""
            return f"{name}: {self.errors} errors{first}"
        if self.exit_status != 0:
            return f"{name}: the cases failed under it (exit {self.exit_status}): {last_line(self.tail)}"
        return None


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


def parse_output(tool: str, text: str) -> tuple[int | None, int, list]:
    """(errors, warnings, finding lines) from compute-sanitizer's output; errors None when no
    summary was printed. racecheck reports hazards in a summary of its own."""
    errors, warnings = None, 0
    if tool == "racecheck" and (m := RACECHECK_SUMMARY.findall(text)):
        errors, warnings = int(m[-1][0]), int(m[-1][1])
    elif m := ERROR_SUMMARY.findall(text):
        errors = int(m[-1])
    findings = []
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        body = line[len(PREFIX) :]
        if body[:1] != " " or body[1:2].isspace() or not body.strip():
            continue  # the banner, indented stack lines and blank lines
        body = body.strip()
        if "SUMMARY" in body or body.startswith(("COMPUTE-SANITIZER", "Note:", "Program hit")):
            continue
        findings.append(body)
    return errors, warnings, findings[:SHOWN_FINDINGS]


def sanitizer_command(tool: str, cases: list, sanitizer: str) -> list:
    return [sanitizer, "--tool", tool, "--target-processes", "all", "--print-limit", "50", sys.executable, "-m", DRIVER, *cases]


def child_env() -> dict:
    """The caches the lanes use, and no caching allocator."""
    return {
        **os.environ,
        "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
        "SELGATE_CUDA_BUILD": "1",
        "TRITON_CACHE_DIR": str(cache_root() / "triton" / f"{OUT_NAME}-sm90"),
        "SELGATE_CUDA_CACHE": str(env_vars.get("SELGATE_CUDA_CACHE", cache_root() / "cuda")),
    }


def run_tool(tool: str, cases: list, sanitizer: str, out_dir: Path, timeout_s: float) -> ToolResult:
    start = time.monotonic()
    try:
        proc = subprocess.run(
            sanitizer_command(tool, cases, sanitizer),
            cwd=ROOT,
            env=child_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
        text, status = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:  # its output so far comes as bytes, text mode or not
        out = e.stdout or b""
        text, status = out.decode(errors="replace") if isinstance(out, bytes) else out, None
    (out_dir / f"{tool}.log").write_text(text)
    errors, warnings, findings = parse_output(tool, text)
    return ToolResult(tool, status, round(time.monotonic() - start, 1), errors, warnings, findings, text[-2000:])


def write_outputs(out_dir: Path, results: list, *, cases: list, warmup: dict, tree: dict, gpu: str) -> dict:
    """result.json, report.md and junit-sanitizer.xml; returns the result."""
    blocking = [b for r in results if (b := r.blocking())]
    if warmup["exit_status"] != 0:
        blocking.insert(0, f"the cases failed without a sanitizer (exit {warmup['exit_status']}): {last_line(warmup['tail'])}")
    data = {
        "tree": tree,
        "gpu": gpu,
        "cases": cases,
        "warmup": warmup,
        "tools": [asdict(r) for r in results],
        "blocking": blocking,
    }
    (out_dir / RESULT_FILE).write_text(json.dumps(data, indent=1) + "\n")
    lines = [
        "# compute-sanitizer pass",
        "",
        f"GPU {gpu}, commit {tree['commit']}, cases: {', '.join(cases)}",
        "",
        "| tool | errors | warnings | seconds | exit |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.tool} | {'-' if r.errors is None else r.errors} | {r.warnings} | {r.seconds} | "
        f"{'timeout' if r.exit_status is None else r.exit_status} |"
        for r in results
    ]
    lines += ["", "## Blocking", ""] + ([f"- {b}" for b in blocking] or ["none"])
    for r in results:
        if r.findings:
            lines += ["", f"## {r.tool}: first findings", "", *[f"- `{f}`" for f in r.findings]]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    write_junit(out_dir / "junit-sanitizer.xml", results)
    return data


def write_junit(path: Path, results: list) -> None:
    from junitparser import Failure, JUnitXml, TestCase, TestSuite

    suite = TestSuite("compute-sanitizer")
    for r in results:
        case = TestCase(r.tool, classname="compute_sanitizer", time=r.seconds)
        if reason := r.blocking():
            case.result = [Failure(reason)]
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(path), pretty=True)


def find_sanitizer(given: str | None) -> str:
    """compute-sanitizer: `given`, else on PATH, else in the CUDA toolkit; ValueError when none."""
    candidates = (
        [given]
        if given
        else [
            shutil.which("compute-sanitizer"),
            str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer"),
        ]
    )
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return path
    raise ValueError(f"--sanitizer: no compute-sanitizer at {given or 'PATH or $CUDA_HOME/bin'} (it comes with the CUDA toolkit)")


def run_pass(
    tools=TOOLS, cases=None, *, sanitizer: str | None = None, timeout_s: float = TIMEOUT_S, out_root: Path | None = None
) -> dict:
    """Compile once, then each tool over the cases; the result (its `blocking` empty when clean)."""
    from selgate.tree import tree_stamp

    from .sanitize_cases import CASES

    unknown = sorted(set(tools) - set(TOOLS))
    if unknown or not tools:
        raise ValueError(f"--tools: expected some of {list(TOOLS)}, got {list(tools)}")
    cases = list(cases or CASES)
    if set(cases) - set(CASES):
        raise ValueError(f"--cases: expected some of {list(CASES)}, got {cases}")
    sanitizer = find_sanitizer(sanitizer)
    out_dir = (out_root or OUT_ROOT) / OUT_NAME
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    tree = tree_stamp()
    start = time.monotonic()
    warm = subprocess.run(
        [sys.executable, "-m", DRIVER, *cases],
        cwd=ROOT,
        env=child_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout_s * 4,
        check=False,
    )
    warmup = {"exit_status": warm.returncode, "seconds": round(time.monotonic() - start, 1), "tail": warm.stdout[-2000:]}
    print(f"sanitize: cases compiled and run plainly in {warmup['seconds']} s (exit {warm.returncode})", flush=True)
    results = []
    for tool in tools:
        results.append(run_tool(tool, cases, sanitizer, out_dir, timeout_s))
        r = results[-1]
        print(f"sanitize: {tool}: {'-' if r.errors is None else r.errors} errors in {r.seconds} s", flush=True)
    gpu = next((line.split(":", 1)[1].strip() for line in warm.stdout.splitlines() if line.startswith("gpu:")), "unknown")
    return write_outputs(out_dir, results, cases=cases, warmup=warmup, tree=tree, gpu=gpu)
