"""The validation suite: run every published-measurement family and compare predicted with measured.

A family is one YAML file in ``scenarios/validation/``: ``family``, ``title``, ``source``,
``metric``, ``notes``, a ``base`` scenario and ``cases`` of ``{case, set, measured, note}``,
where ``set`` holds dotted overrides of the base (or, for a case of another ``kind`` than the
family's, that kind's inputs) and ``measured`` is a number (for the family's metric), a mapping of metric to number (several metrics per case), or ``oom`` (the
measurement ran out of memory). A case with ``stage: k`` reads its metrics from the k-th block
of the summary's ``stages`` (a run of ``workload.stages``, such as a load stage measured on a
server that the previous stage had loaded). The measured figures live in the files, so validation needs
nothing outside the repository at run time.
"""

from __future__ import annotations

import copy
import math
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from .config.yamlio import YAMLInputError, load_file
from .errors import ConfigError
from .progress import Progress
from .project import scenarios_dir

ROW_COLUMNS = ["family", "case", "metric", "predicted", "measured", "error_pct", "note", "status"]
STATUSES = {
    "ok": "a number predicted against a number measured: error_pct is the signed error",
    "oom": "measured OOM and the simulator reports OOM: agrees, no error to count",
    "missed_oom": "measured OOM but the simulator fits the run: a miss with no number",
    "sim_oom": "the simulator reports OOM for a run that was measured: a miss with no number",
}
"""A row's validation status. OOM rows carry no error (NaN), so they never enter a family's median or
max; the two mismatches are counted per family (``oom_mismatches``) and fail its target."""
TARGET_MEDIAN_PCT = 10.0
TARGET_MAX_PCT = 25.0
MARK_START = "<!-- fidelity:start -->"
MARK_END = "<!-- fidelity:end -->"

# metric name -> (path into the run summary, unit shown in tables)
METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "tpot_ms": (("tpot_ms", "mean"), "ms"),
    "ttft_ms": (("ttft_ms", "mean"), "ms"),
    "itl_ms": (("itl_ms", "mean"), "ms"),
    "itl_p50_ms": (("itl_ms", "p50"), "ms"),
    "itl_p99_ms": (("itl_ms", "p99"), "ms"),
    "ttft_p50_ms": (("ttft_ms", "p50"), "ms"),
    "last_mile_cost_itl_share": (("last_mile_cost", "itl_share"), "share"),  # the counterfactual's ITL saving
    "e2e_ms": (("e2e_ms", "mean"), "ms"),
    "batch_latency_s": (("duration_s",), "s"),  # first arrival to last completion: a whole batch's latency
    "output_tokens_per_s": (("throughput", "output_tokens_per_s"), "tok/s"),
    "latency_s": (("latency_s", "p50"), "s"),
    "encode_s": ((), "s"),
    "gpu_share": (("engine_time_share", "gpu"), "share"),
    "api_server_share": (("engine_time_share", "api_server"), "share"),
    "host_share": (("engine_time_share", "schedule+output"), "share"),  # scheduling, input prep, outputs
    "step_gap_ms": (("step_gap_ms", "mean"), "ms"),
    "busbw_gbps": ((), "GB/s"),  # a collective's nccl-tests bus bandwidth (kind: collective)
    "throughput_ratio": (("throughput", "output_tokens_per_s"), "x"),  # of the case over its relative_to case
    "tpot_ratio": (("tpot_ms", "mean"), "x"),
    "ttft_ratio": (("ttft_ms", "mean"), "x"),
    "e2e_ratio": (("e2e_ms", "mean"), "x"),
    "prefix_hit_rate": (("prefix_cache", "hit_rate"), "share"),  # prompt tokens found in the prefix cache
    "kv_transfer_ms": (("disaggregation", "transfer_ms", "mean"), "ms"),  # prefill -> decode KV copy
    "copy_gbps": ((), "GB/s"),  # a KV copy between a GPU and host memory on the offload route (kind: host_copy)
    "joules_per_output_token": (("energy", "joules_per_output_token"), "J"),  # the GPUs' energy per output token
    "gpu_watts": (("energy", "gpu_watts_mean"), "W"),  # mean power per GPU over the run
    "joules_per_image": (("energy", "joules_per_image"), "J"),  # the GPUs' energy per image (kind: dit)
    "vae_s": (("breakdown_mean_s", "vae"), "s"),  # a DiT request's VAE decode (kind: dit)
}
RATIOS = frozenset({"throughput_ratio", "tpot_ratio", "ttft_ratio", "e2e_ratio"})
"""Metrics that are one case's figure over another's (``relative_to``): speed-ups, reductions."""


def default_directory() -> Path:
    """``validation/`` of the project's scenarios folder (``simulator.project.scenarios_dir``)."""
    return scenarios_dir() / "validation"


CASE_KEYS = frozenset({"case", "set", "measured", "note", "stage", "relative_to", "kind"})
"""What a family's case may hold."""


@dataclass
class Case:
    """One measured row: overrides of the family's base scenario and the measured figure(s)."""

    name: str
    overrides: dict
    measured: Any
    note: str = ""
    stage: int | None = None  # read the metrics from this load stage's block (summary["stages"])
    relative_to: str | None = None  # the case a ratio metric divides by (an earlier case of the family)
    kind: str | None = None  # how this case is predicted, where it differs from the family's kind


@dataclass
class Family:
    """One published-measurement family, as read from its YAML file."""

    name: str
    title: str
    source: str
    metric: str
    notes: str
    kind: str
    base: dict
    cases: list[Case] = field(default_factory=list)
    path: str = ""


def _require(doc: dict, key: str, path: Path, types) -> Any:
    if key not in doc:
        raise ConfigError("required key is missing", file=str(path), path=key)
    if not isinstance(doc[key], types):
        raise ConfigError(f"expected {getattr(types, '__name__', types)}, got {doc[key]!r}", file=str(path), path=key)
    return doc[key]


def load_family(path: str | Path) -> Family:
    """Read and check one family file; errors name the file and the key."""
    p = Path(path)
    try:
        doc = load_file(p)
    except OSError as exc:
        raise ConfigError(f"cannot read validation family ({exc.strerror or exc})", file=str(p)) from None
    except YAMLInputError as exc:
        raise ConfigError(str(exc), file=str(p)) from None
    if not isinstance(doc, dict):
        raise ConfigError("a validation family must be a YAML mapping", file=str(p))
    kind = doc.get("kind", "simulate")
    if kind not in CASE_KINDS:
        raise ConfigError(f"kind {kind!r} is not one of {', '.join(CASE_KINDS)}", file=str(p), path="kind")
    metric = _require(doc, "metric", p, str)
    if metric != "mean" and metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}", file=str(p), path="metric")
    fam = Family(name=_require(doc, "family", p, str), title=doc.get("title", ""), source=_require(doc, "source", p, str),
                 metric=metric, notes=doc.get("notes", ""), kind=kind, base=doc.get("base") or {}, path=str(p))
    for i, row in enumerate(_require(doc, "cases", p, list)):
        where = f"cases[{i}]"
        if not isinstance(row, dict) or "measured" not in row or "case" not in row:
            raise ConfigError("a case needs 'case' and 'measured'", file=str(p), path=where)
        unknown = sorted(set(row) - CASE_KEYS)
        if unknown:
            raise ConfigError(f"a case takes no {unknown[0]!r} (it takes {', '.join(sorted(CASE_KEYS))})", file=str(p),
                              path=f"{where}.{unknown[0]}")
        measured = row["measured"]
        numbers = measured.values() if isinstance(measured, dict) else [measured]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise ConfigError("a measured figure must be a finite number", file=str(p), path=f"{where}.measured")
        if isinstance(measured, dict):
            bad = [m for m in measured if m not in METRICS]
            if bad:
                raise ConfigError(f"unknown metric {bad[0]!r}", file=str(p), path=f"{where}.measured")
        elif not (isinstance(measured, (int, float)) or str(measured).lower() == "oom"):
            raise ConfigError(f"measured must be a number, a mapping or 'oom', got {measured!r}",
                              file=str(p), path=f"{where}.measured")
        stage = row.get("stage")
        if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int) or stage < 0):
            raise ConfigError(f"stage must be a stage index (0, 1, ...), got {stage!r}", file=str(p),
                              path=f"{where}.stage")
        relative = row.get("relative_to")
        names = [c.name for c in fam.cases]
        ratios = [m for m in (measured if isinstance(measured, dict) else {metric: measured}) if m in RATIOS]
        if relative is not None and str(relative) not in names:
            raise ConfigError(f"relative_to {relative!r} is not an earlier case of this family", file=str(p),
                              path=f"{where}.relative_to")
        if ratios and relative is None:
            raise ConfigError(f"metric {ratios[0]!r} is a ratio: the case needs relative_to (the case it divides "
                              "by)", file=str(p), path=where)
        case_kind = row.get("kind")
        if case_kind is not None and case_kind not in CASE_KINDS:
            raise ConfigError(f"kind {case_kind!r} is not one of {', '.join(CASE_KINDS)}", file=str(p),
                              path=f"{where}.kind")
        fam.cases.append(Case(str(row["case"]), dict(row.get("set") or {}), measured, str(row.get("note", "")),
                              stage, None if relative is None else str(relative), case_kind))
    return fam


def discover(directory: str | Path | None = None) -> list[Family]:
    """Every family file in ``directory`` (default: ``scenarios/validation``), sorted by name."""
    d = Path(directory) if directory else default_directory()
    if not d.is_dir():
        raise ConfigError("validation directory does not exist", file=str(d))
    return [load_family(p) for p in sorted(d.glob("*.yaml"))]


def _lookup(summary: dict, path: tuple[str, ...]) -> float:
    if path == ("engine_time_share", "schedule+output"):
        share = summary.get("engine_time_share") or {}
        parts = [share.get("schedule"), share.get("output")]
        return math.nan if None in parts else float(sum(parts))
    node: Any = summary
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return float(node) if node is not None else math.nan


def error_pct(predicted: float, measured: float) -> float:
    """Signed error of a prediction, percent of the measurement."""
    if not (np.isfinite(predicted) and np.isfinite(measured)) or measured == 0:
        return math.nan
    return 100.0 * (predicted - measured) / measured


def _scenario(base: dict, overrides: dict) -> tuple[dict, dict]:
    """Split overrides: plain keys go into the scenario; dotted keys are passed as overrides."""
    raw = copy.deepcopy(base)
    dotted = {}
    for k, v in overrides.items():
        if "." in k:
            dotted[k] = v
        elif isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return raw, dotted


def _simulate_case(fam: Family, case: Case, summaries: dict | None = None) -> list[dict]:
    from .api import run

    raw, dotted = _scenario(fam.base, case.overrides)
    metrics = case.measured if isinstance(case.measured, dict) else {fam.metric: None}
    # the counterfactual with the last mile free doubles a case's work: run only where a metric reads it
    counterfactual = any(METRICS[m][0][:1] == ("last_mile_cost",) for m in metrics)
    try:
        result = run(raw, dotted, last_mile_cost=counterfactual)
    except ConfigError as exc:
        raise ConfigError(f"case {case.name!r}: {exc.message}", file=fam.path, path=exc.path) from None
    s = result.summary
    if summaries is not None:
        summaries[case.name] = s
    if isinstance(case.measured, str):  # measured OOM
        got_oom = s.get("status") == "oom"
        pred = math.nan if got_oom else _lookup(s, METRICS[fam.metric][0])
        return [dict(metric=fam.metric, predicted=pred, measured=math.nan, error_pct=math.nan,
                     note="OOM measured and predicted" if got_oom else "OOM measured, simulator fits",
                     status="oom" if got_oom else "missed_oom")]
    if s.get("status") == "oom":
        return [dict(metric=fam.metric, predicted=math.nan, measured=float(case.measured), error_pct=math.nan,
                     note="simulator predicts OOM for a measured run", status="sim_oom")]
    measured = case.measured if isinstance(case.measured, dict) else {fam.metric: case.measured}
    if case.stage is not None:  # a load stage's own block: the same metric keys, over its requests
        stages = s.get("stages") or []
        if case.stage >= len(stages):
            raise ConfigError(f"case {case.name!r}: stage {case.stage} but the run has {len(stages)} stages "
                              "(workload.stages)", file=fam.path)
        s = stages[case.stage]
    out = []
    for metric, value in measured.items():
        pred = _lookup(s, METRICS[metric][0])
        if metric in RATIOS:
            pred /= _lookup((summaries or {}).get(case.relative_to) or {}, METRICS[metric][0])
        out.append(dict(metric=metric, predicted=pred, measured=float(value), error_pct=error_pct(pred, float(value)),
                        note=case.note))
    return out


def _image_case(fam: Family, case: Case, summaries: dict | None = None) -> list[dict]:
    from .config.dit_models import image_codecs

    o = case.overrides
    try:
        cost = image_codecs().cost(o.get("format", "png"), o.get("compress_level"))
        pred = float(o["width"]) * float(o["height"]) * cost.seconds_per_pixel
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"case {case.name!r}: needs format, compress_level, width, height ({exc})",
                          file=fam.path) from None
    return [dict(metric=fam.metric, predicted=pred, measured=float(case.measured),
                 error_pct=error_pct(pred, float(case.measured)), note=case.note)]


def _collective_case(fam: Family, case: Case, summaries: dict | None = None) -> list[dict]:
    """A collective as NCCL runs it (``hardware.nccl``) on a node type's topology: ``node``, ``nodes``,
    ``gpus`` (per node; default all), ``collective``, ``size`` (bytes, nccl-tests' size) and
    optionally ``algorithm: ring`` (NCCL_NVLS_ENABLE=0)."""
    from .config.loader import load_scenario
    from .hardware import nccl

    o = {**fam.base, **case.overrides}
    try:
        hw = load_scenario({"model": "llama-3-8b", "hardware": {"node": o["node"]}}).hardware
        nodes, per = int(o.get("nodes", 1)), int(o.get("gpus", hw.gpus_per_node))
        grp = nccl.group_on(hw, [k * hw.gpus_per_node + i for k in range(nodes) for i in range(per)])
        choices = [p for p in nccl.plans(grp, o["collective"], float(o["size"]))
                   if o.get("algorithm") in (None, p.algorithm)]
        plan = min(choices, key=lambda p: p.time)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"case {case.name!r}: needs node, collective, size ({exc})", file=fam.path) from None
    pred = plan.busbw / 1e9
    return [dict(metric=fam.metric, predicted=pred, measured=float(case.measured),
                 error_pct=error_pct(pred, float(case.measured)),
                 note=f"{plan.algorithm}/{plan.protocol}; {case.note}".rstrip("; "))]


def _prefix_replay_case(fam: Family, case: Case, summaries: dict | None = None) -> list[dict]:
    """A trace's requests looked up and then cached, one after another in arrival order, by the
    simulator's prefix cache (:class:`~simulator.pipelines.llm.prefix_cache.PrefixCache`) with no
    capacity bound: the trace's own prefix reuse as an unbounded cache sees it, without timing
    (a timed run of a whole Mooncake trace takes minutes). ``trace`` (a ``.jsonl`` path, relative
    to the family file), ``requests`` (default: the whole trace); the metric is ``prefix_hit_rate``."""
    from .config.loader import load_scenario
    from .config.trace import read_trace
    from .pipelines.llm.prefix_cache import PrefixCache, merged_stats
    from .workloads.arrivals import make_requests

    o = dict(case.overrides)  # not the family's base: a simulate family's base is a scenario
    measured = float(case.measured["prefix_hit_rate"] if isinstance(case.measured, dict) else case.measured)
    path = Path(str(o.get("trace", "")))
    if not path.is_absolute():
        path = Path(fam.path).parent / path
    if not path.is_file():  # ../shared is beside the workplace's checkouts only
        return [dict(metric="prefix_hit_rate", predicted=math.nan, measured=measured, error_pct=math.nan,
                     note=f"trace {path.name} not found: not replayed")]
    requests = int(o.get("requests") or len(read_trace(str(path))))
    # a context no trace row exceeds: the replay reads the trace's own lengths, uncut
    sc = load_scenario({"model": {"base": "llama-3.1-8b", "context_length": 1 << 20}, "hardware": {"gpu": "h100-sxm"},
                        "workload": {"arrival": "trace", "trace": str(path), "requests": requests}})
    specs = make_requests(sc.workload, np.random.default_rng(sc.seed), sc.model.context_length)
    cache = PrefixCache(specs.prefix, sc.serving.block_size)
    for rid, prompt in enumerate(specs.prompt.tolist()):
        cache.match(rid, prompt)
        cache.register(rid, prompt, prompt)
        cache.release(rid)
    pred = merged_stats([cache])["hit_rate"]
    return [dict(metric="prefix_hit_rate", predicted=pred, measured=measured, error_pct=error_pct(pred, measured),
                 note=case.note)]


def _host_copy_case(fam: Family, case: Case, summaries: dict | None = None) -> list[dict]:
    """KV blocks copied between GPU 0 and host memory on the route the KV offload tier uses
    (``Topology.offload_route``, flows on the shared Fabric): ``gpu`` (catalog name), ``direction``
    (``d2h``, ``h2d`` or ``both`` at once) and ``size`` (bytes each way); the metric is the bytes
    moved over the time the copies take, in GB/s (both directions summed for ``both``)."""
    import simpy

    from .config.loader import load_scenario
    from .hardware.topology import Topology

    o = {**fam.base, **case.overrides}
    try:
        hw = load_scenario({"model": "llama-3-8b", "hardware": {"gpu": o["gpu"]}}).hardware
        size, direction = float(o["size"]), str(o.get("direction", "d2h"))
        ways = {"d2h": ["tx"], "h2d": ["rx"], "both": ["tx", "rx"]}[direction]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"case {case.name!r}: needs gpu, size and direction d2h|h2d|both ({exc})",
                          file=fam.path) from None
    env = simpy.Environment()
    topo = Topology.from_hardware(env, hw, 1)
    for way in ways:
        ports, latency = topo.offload_route(0, way)
        topo.fabric.transfer(ports, size, latency, f"copy {way}")
    env.run()
    pred = size * len(ways) / env.now / 1e9
    measured = float(case.measured["copy_gbps"] if isinstance(case.measured, dict) else case.measured)
    return [dict(metric="copy_gbps", predicted=pred, measured=measured, error_pct=error_pct(pred, measured),
                 note=case.note)]


CASE_KINDS = {"simulate": _simulate_case, "image_encode": _image_case, "collective": _collective_case,
              "prefix_replay": _prefix_replay_case, "host_copy": _host_copy_case}
"""A family's ``kind`` -> how one of its cases is predicted (each takes the family, the case and the
summaries of the family's earlier cases, which ratio metrics divide by)."""


def _check_cases(families: list[Family]) -> dict[tuple[str, str], list[str]]:
    """Every simulated case's scenario loads, before any case runs: a malformed case is an error at
    once, not after the cases before it have run. Returns the set-up each simulated case runs,
    (family, case) -> ``coverage.signature`` of its scenario."""
    from .config.loader import load_scenario
    from .coverage import signature

    covers: dict[tuple[str, str], list[str]] = {}
    for fam in families:
        for case in fam.cases:
            if CASE_KINDS[case.kind or fam.kind] is not _simulate_case:
                continue
            raw, dotted = _scenario(fam.base, case.overrides)
            try:
                covers[fam.name, case.name] = signature(load_scenario(raw, dotted))
            except ConfigError as exc:
                raise ConfigError(f"case {case.name!r}: {exc.message}", file=fam.path, path=exc.path) from None
    return covers


def run_family(fam: Family, progress: Progress | None = None, cases: Sequence[int] | None = None) -> list[dict]:
    """Predicted vs measured rows of one family, or of its ``cases`` (indices; ``progress`` counts them)."""
    rows, summaries = [], {}
    for i in range(len(fam.cases)) if cases is None else cases:
        case = fam.cases[i]
        for r in CASE_KINDS[case.kind or fam.kind](fam, case, summaries):
            rows.append({"family": fam.name, "case": case.name, "status": "ok", **r})
        if progress is not None:
            progress.update(1, fam.name)
    return rows


def _tasks(families: list[Family]) -> list[tuple[Family, list[int]]]:
    """What the worker processes run, in the families' order: a family whose ratio metrics divide by
    an earlier case's summary runs whole, in one task; any other, a case per task (so the processes
    share a long family's cases instead of one of them running it alone at the end)."""
    out = []
    for fam in families:
        if any(c.relative_to for c in fam.cases):
            out.append((fam, list(range(len(fam.cases)))))
        else:
            out.extend((fam, [i]) for i in range(len(fam.cases)))
    return out


def _run_task(task: tuple[Family, list[int]]) -> list[dict]:
    fam, cases = task
    return run_family(fam, cases=cases)


def run_validation(families: Iterable[str] | None = None, directory: str | Path | None = None,
                   workers: int | None = None) -> pd.DataFrame:
    """Run the named families (all if None); one row per case and metric, ``error_pct`` signed.

    Cases run in ``workers`` processes (default: one per CPU), a case per task, or a family per task
    where a ratio divides by an earlier case's summary (:func:`_tasks`); the rows come back in the
    families' and cases' order, so the table is the same whatever the number of workers. The set-up
    each simulated case runs is in the table's ``attrs["covers"]`` ((family, case) -> signature)."""
    found = discover(directory)
    if families:
        wanted = list(families)
        known = {f.name for f in found}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise ConfigError(f"unknown validation family {unknown[0]!r}; known: {', '.join(sorted(known))}")
        found = [f for f in found if f.name in wanted]
    covers = _check_cases(found)
    workers = min(workers or os.cpu_count() or 1, len(found))
    with Progress(sum(len(f.cases) for f in found), "validate", "cases") as progress:
        if workers <= 1:
            rows = [r for fam in found for r in run_family(fam, progress)]
        else:
            rows = []
            tasks = _tasks(found)
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for (fam, cases), task_rows in zip(tasks, pool.map(_run_task, tasks)):
                    rows += task_rows
                    progress.update(len(cases), fam.name)
    table = pd.DataFrame(rows, columns=ROW_COLUMNS)
    table.attrs["covers"] = covers
    return table


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per family (and metric): rows, median and max |error| % over its numeric rows, its OOM mismatches
    (rows the simulator and the measurement disagree on fitting), and whether the targets are met."""
    out = []
    for (fam, metric), g in table.groupby(["family", "metric"], sort=False):
        err = g["error_pct"].abs().to_numpy(dtype=float)
        med = float(np.nanmedian(err)) if np.isfinite(err).any() else math.nan
        mx = float(np.nanmax(err)) if np.isfinite(err).any() else math.nan
        status = g["status"] if "status" in g else pd.Series(["ok"] * len(g))
        mismatches = int(status.isin(["missed_oom", "sim_oom"]).sum())
        out.append({"family": fam, "metric": metric, "rows": len(g), "median_abs_pct": med, "max_abs_pct": mx,
                    "oom_mismatches": mismatches,
                    "meets_target": bool(med <= TARGET_MEDIAN_PCT and mx <= TARGET_MAX_PCT and not mismatches)})
    return pd.DataFrame(out, columns=["family", "metric", "rows", "median_abs_pct", "max_abs_pct", "oom_mismatches",
                                      "meets_target"])


def _err_text(r) -> str:
    """A row's error column: the signed error, or what its OOM status says."""
    status = getattr(r, "status", "ok")
    if status == "missed_oom":
        return "OOM missed"
    if status == "sim_oom":
        return "sim OOM"
    if status == "oom":
        return "OOM ok"
    return "-" if math.isnan(r.error_pct) else f"{r.error_pct:+.1f}%"


def _target_text(r, met: str = "met", missed: str = "MISSED") -> str:
    extra = f" ({r.oom_mismatches} OOM mismatch{'es' if r.oom_mismatches > 1 else ''})" if r.oom_mismatches else ""
    return (met if r.meets_target else missed) + extra


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if math.isinf(v):
        return "inf"
    a = abs(v)
    return f"{v:.4g}" if a < 1000 else f"{v:,.0f}"


def format_table(table: pd.DataFrame) -> str:
    """Plain-text table: every row, then each family's median and max |error|."""
    lines = [f"{'family':<24} {'case':<44} {'metric':<20} {'predicted':>10} {'measured':>10} {'error':>8}"]
    for r in table.itertuples():
        err = _err_text(r)
        lines.append(f"{r.family:<24} {r.case[:44]:<44} {r.metric:<20} {_fmt(r.predicted):>10} "
                     f"{_fmt(r.measured):>10} {err:>8}")
    lines.append("")
    lines.append(f"{'family':<24} {'metric':<20} {'rows':>4} {'median|err|':>12} {'max|err|':>10}  target "
                 f"(median <= {TARGET_MEDIAN_PCT:g}%, max <= {TARGET_MAX_PCT:g}%)")
    for r in summarize(table).itertuples():
        lines.append(f"{r.family:<24} {r.metric:<20} {r.rows:>4} {r.median_abs_pct:>11.1f}% "
                     f"{r.max_abs_pct:>9.1f}%  {_target_text(r)}")
    return "\n".join(lines)


def fidelity_markdown(table: pd.DataFrame, directory: str | Path | None = None) -> str:
    """The README's fidelity section: per-family summary, per-row table and each family's notes."""
    fams = {f.name: f for f in discover(directory)}
    s = summarize(table)
    lines = ["Generated by `lastmile validate --write-readme README.md --write-fidelity simulator/data/fidelity.json` "
             "(the status `lastmile run` reads for its caveat); do not edit by hand.", "",
             f"Targets: median |error| <= {TARGET_MEDIAN_PCT:g}% per family, no row beyond {TARGET_MAX_PCT:g}%.", "",
             "| family | metric | rows | median abs error | max abs error | target |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in s.itertuples():
        lines.append(f"| {r.family} | {r.metric} | {r.rows} | {r.median_abs_pct:.1f}% | {r.max_abs_pct:.1f}% | "
                     f"{_target_text(r, 'met', 'missed')} |")
    for name, g in table.groupby("family", sort=False):
        fam = fams.get(name)
        lines += ["", f"**{fam.title if fam else name}** — source: {fam.source if fam else '?'}", ""]
        if fam and fam.notes:
            lines += [" ".join(str(fam.notes).split()), ""]
        lines += ["| case | metric | predicted | measured | error |", "| --- | --- | ---: | ---: | ---: |"]
        for r in g.itertuples():
            err = _err_text(r)
            pred = "OOM" if r.status in ("oom", "sim_oom") else _fmt(r.predicted)
            meas = "OOM" if r.status in ("oom", "missed_oom") else _fmt(r.measured)
            lines.append(f"| {r.case} | {r.metric} | {pred} | {meas} | {err} |")
    return "\n".join(lines)


def rewrite_readme(path: str | Path, block: str) -> None:
    """Replace the text between the fidelity markers of ``path``; append a section with them if absent."""
    p = Path(path)
    text = p.read_text() if p.is_file() else ""
    new = f"{MARK_START}\n{block}\n{MARK_END}"
    pattern = re.compile(re.escape(MARK_START) + r".*?" + re.escape(MARK_END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: new, text, count=1)
    elif MARK_START in text or MARK_END in text:
        raise ConfigError("has only one of the fidelity markers; put both or neither", file=str(p))
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + "## Fidelity\n\n" + new + "\n"
    p.write_text(text)
