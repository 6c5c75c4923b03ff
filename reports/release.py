"""The release-gate report: the gate under the `release` profile plus, for each GPU the
lanes ran on, the latest benchmark tables against their baseline (whose regressions also
block) and the host-cost bars of its newest host.csv (whose failures also block)."""

from __future__ import annotations

from .gate import GateVerdict
from .markdown import render


def bench_sections(results: dict) -> tuple[list[str], list[str]]:
    """(Markdown sections, blocking lines) of the benchmark comparison per GPU in `results`."""
    gpus = sorted({(r.environment or {}).get("gpu", "none") for r in results.values()} - {"none"})
    try:
        from selgate.bench.regression import baselines, compare_to_baseline
    except ImportError as e:
        return [f"no benchmark results: selgate.bench.regression is unavailable ({e})"], []
    if not gpus:
        return ["no benchmark results: no GPU lane in these results"], []
    sections, blocking = [], []
    for gpu in gpus:
        cmp = compare_to_baseline(gpu)
        sections.append(cmp.markdown())
        blocking += [f"benchmark {gpu}: {b}" for b in cmp.blocking]
        text, failed = host_section(gpu, required=bool(baselines(gpu)))
        sections.append(text)
        blocking += [f"host cost {gpu}: {b}" for b in failed]
    return sections, blocking


def host_section(gpu: str, *, required: bool) -> tuple[str, list[str]]:
    """(Markdown, blocking lines) of the host-cost bars (`selgate.bench.host.host_checks`) on the
    newest host.csv of `gpu`. Without one the section reads "not measured", which blocks only
    where `required` (the GPU has a committed baseline), as a baselined sweep without a run
    blocks and a GPU without a baseline does not."""
    from selgate.bench import tables
    from selgate.bench.host import host_checks, read_csv

    title = f"### Host cost per call: {gpu}\n"
    path = tables.latest_csv(gpu, "host")
    if path is None:
        line = f"not measured: no host.csv of {gpu} under {tables.RESULTS_DIR} (`python -m selgate.bench host`)"
        return f"{title}\n{line}\n", [line] if required else []
    lines = host_checks(read_csv(path))
    return "\n".join([title, f"From `{path}`:", "", *lines]) + "\n", [x[7:] for x in lines if x.startswith("- FAIL ")]


def render_release(results: dict, verdict: GateVerdict) -> str:
    sections, bench_blocking = bench_sections(results)
    verdict.blocking += bench_blocking
    body = render(results, verdict, title="selgate release report")
    return body + "\n## Benchmarks\n\n" + "\n".join(sections) + "\n"
