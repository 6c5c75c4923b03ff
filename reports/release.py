"""The release-gate report: the gate under the `release` profile plus, for each GPU the
lanes ran on, the latest benchmark tables against their baseline (whose regressions also
block)."""

from __future__ import annotations

from .gate import GateVerdict
from .markdown import render


def bench_sections(results: dict) -> tuple[list[str], list[str]]:
    """(Markdown sections, blocking lines) of the benchmark comparison per GPU in `results`."""
    gpus = sorted({(r.environment or {}).get("gpu", "none") for r in results.values()} - {"none"})
    try:
        from selgate.bench.regression import compare_to_baseline
    except ImportError as e:
        return [f"no benchmark results: selgate.bench.regression is unavailable ({e})"], []
    if not gpus:
        return ["no benchmark results: no GPU lane in these results"], []
    sections, blocking = [], []
    for gpu in gpus:
        cmp = compare_to_baseline(gpu)
        sections.append(cmp.markdown())
        blocking += [f"benchmark {gpu}: {b}" for b in cmp.blocking]
    return sections, blocking


def render_release(results: dict, verdict: GateVerdict) -> str:
    sections, bench_blocking = bench_sections(results)
    verdict.blocking += bench_blocking
    body = render(results, verdict, title="selgate release report")
    return body + "\n## Benchmarks\n\n" + "\n".join(sections) + "\n"
