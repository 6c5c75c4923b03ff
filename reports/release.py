"""The release-gate report: the gate under the `release` profile plus, for each GPU the
lanes ran on, the latest benchmark tables against its baseline (the device's own, else its
GPU class's; a GPU with neither blocks, and so do regressions) and the host-cost bars of its
newest host.csv (whose failures also block)."""

from __future__ import annotations

from pathlib import Path

from .gate import GateVerdict
from .markdown import render


def bench_sections(results: dict) -> tuple[list[str], list[str]]:
    """(Markdown sections, blocking lines) of the benchmark comparison per GPU in `results`.

    A GPU is judged by its own committed baselines, else by its class's (the lane's
    `environment.json` says the class: `gpu_class`, else `gpu_capability`), as ratios to each
    run's floors (`selgate.bench.regression`); a GPU that neither judges blocks the release,
    naming the missing baseline."""
    try:
        from selgate.bench.regression import compare_to_baseline, standing_baselines
    except ImportError as e:
        return [f"no benchmark results: selgate.bench.regression is unavailable ({e})"], []
    classed: dict[str, dict] = {}  # gpu -> {"device_class": ..., "capability": ...}, what its lanes said
    for r in results.values():
        env = r.environment or {}
        gpu = env.get("gpu", "none")
        if gpu != "none":
            classed[gpu] = {**lane_class(env), **classed.get(gpu, {})}
    if not classed:
        return ["no benchmark results: no GPU lane in these results"], []
    sections, blocking = [], []
    for gpu in sorted(classed):
        cmp = compare_to_baseline(gpu, **classed[gpu])
        sections.append(cmp.markdown())
        blocking += [f"benchmark {gpu}: {b}" for b in cmp.blocking]
        text, failed = host_section(gpu, required=standing_baselines(gpu, **classed[gpu]).kind is not None)
        sections.append(text)
        blocking += [f"host cost {gpu}: {b}" for b in failed]
    smoke_text, smoke_blocking = smoke_sections(results)
    return sections + smoke_text, blocking + smoke_blocking


def lane_class(env: dict) -> dict:
    """{"device_class": ..., "capability": ...} of what a lane's environment.json says (the stamp
    writes "none" for no class)."""
    said = {key: str(env.get(field) or "") for key, field in (("device_class", "gpu_class"), ("capability", "gpu_capability"))}
    return {key: value for key, value in said.items() if value.lower() not in ("", "none", "unknown")}


def smoke_sections(results: dict) -> tuple[list[str], list[str]]:
    """(Markdown sections, blocking lines) of the perf smoke of each lane in `results` whose YAML
    asks for one (`perf_smoke`): its CSV beside the lane's JUnit, judged by `compare_smoke` on the
    GPU and class its environment.json names, and measured on the commit the lane ran. A lane
    that ran without one blocks: its performance would be unmeasured."""
    from selgate.bench import tables
    from selgate.bench.regression import compare_smoke, measured_commits
    from selgate.lanes.config import load_lane
    from selgate.lanes.runner import PERF_DIR

    sections, blocking = [], []
    for name, r in sorted(results.items()):
        try:
            if name.endswith("-emulated") or not load_lane(name)["perf_smoke"]:
                continue
        except ValueError:
            continue  # not a lane of this tree: the gate's own rules say so
        env = r.environment or {}
        path = Path(r.junit).parent / PERF_DIR / "smoke.csv"
        title = f"### Perf smoke of lane {name}\n"
        if not path.exists():
            line = f"lane {name}: no perf smoke ({path}); a whole native `python -m selgate.lanes run {name}` times it"
            sections.append(f"{title}\n{line}\n")
            blocking.append(line)
            continue
        cmp = compare_smoke(env.get("gpu", "unknown"), path, **lane_class(env))
        sections.append(title + "\n" + cmp.markdown())
        blocking += [f"perf smoke {name}: {b}" for b in cmp.blocking]
        measured, ran = measured_commits(tables.read_csv(path)), str(env.get("commit") or "unrecorded")
        if measured != [ran]:
            blocking.append(f"perf smoke {name}: measured commit {', '.join(measured)}, the lane ran {ran}")
    return sections, blocking


def host_section(gpu: str, *, required: bool) -> tuple[str, list[str]]:
    """(Markdown, blocking lines) of the host-cost bars (`selgate.bench.host.host_checks`) on the
    newest host.csv of `gpu`. Without one the section reads "not measured", which blocks only
    where `required`: where a committed baseline judges the GPU's timings, its own or its class's,
    as a baselined sweep without a run blocks. A class baseline counts because it gates this GPU's
    performance as fully as its own would, and the host bars are ratios to SDPA's host time in the
    same run, so they hold on any machine without a baseline of the device. Where neither baseline
    exists the benchmark section already blocks the release naming the missing baseline; the host
    section then only reports "not measured", so the one root cause reads as one line."""
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
