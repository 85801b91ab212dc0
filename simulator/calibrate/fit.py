"""Fit a hardware profile (achievable GPU fractions, CPU costs) to a table of measured runs.

Every measured row is a scenario run through :func:`simulator.run`, so the fit uses the same
model the user will run. The fit is a bounded Gauss-Newton (Levenberg-Marquardt) on relative
residuals (predicted/measured - 1) with finite-difference Jacobians and ``numpy.linalg.lstsq``
steps; a parameter no row is sensitive to is held at its starting value and reported so.

CSV format (one measured run per row; ``#`` lines are comments):

- ``metric`` (required): ``tpot_ms``, ``ttft_ms``, ``itl_ms``, ``e2e_ms`` (means),
  ``output_tokens_per_s``, or ``latency_s`` (mean image latency of a ``kind: dit`` row);
- ``measured`` (required): the measured value in that metric's unit;
- ``model`` (required): a catalog model (``llama-2-7b``, ...);
- ``kind``: ``llm`` (default) or ``dit``; DiT rows take ``resolution``, ``steps``, ``cfg`` and
  dotted keys (``parallel.pipefusion``, ``delivery.vae``);
- optional shorthands: ``dtype``, ``tp``, ``pp``, ``prompt_tokens``, ``output_tokens``,
  ``batch`` (that many requests, all arriving at once), ``requests``, ``rate`` (requests/s,
  Poisson), ``max_batch``, ``detokenizer``, ``overlap``, ``stream_interval``, ``cuda_graphs``;
- any column whose name has a dot is a scenario override (``serving.max_batched_tokens``);
- ``source``, ``note``: free text, ignored. Empty cells mean "default".
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from ..config.yamlio import YAMLInputError, read_text
from ..errors import ConfigError

METRIC_PATHS = {
    "tpot_ms": ("tpot_ms", "mean"),
    "ttft_ms": ("ttft_ms", "mean"),
    "itl_ms": ("itl_ms", "mean"),
    "e2e_ms": ("e2e_ms", "mean"),
    "output_tokens_per_s": ("throughput", "output_tokens_per_s"),
    "latency_s": ("latency_s", "mean"),
}
SHORTHANDS = {
    "dtype": "dtype", "tp": "parallel.tp", "pp": "parallel.pp",
    "prompt_tokens": "workload.prompt_tokens", "output_tokens": "workload.output_tokens",
    "requests": "workload.requests", "rate": "workload.rate", "max_batch": "serving.max_batch",
    "detokenizer": "serving.detokenizer", "overlap": "serving.overlap",
    "stream_interval": "serving.stream_interval", "cuda_graphs": "hardware.cuda_graphs",
    "kind": "kind", "resolution": "resolution", "steps": "steps", "cfg": "cfg",
    "text_encode": "text_encode",
}
IGNORED = {"source", "note", "notes", "case"}
INT_KEYS = {"parallel.tp", "parallel.pp", "workload.prompt_tokens", "workload.output_tokens", "workload.requests",
            "serving.max_batch", "serving.stream_interval", "steps"}


@dataclass(frozen=True)
class Param:
    """One fitted quantity: where it goes in the profile, its bounds and the finite-difference step."""

    name: str
    section: str  # "gpu" or "cpu"
    lower: float
    upper: float
    unit: str  # "" for fractions, "s" for times

    def step(self, x: float) -> float:
        return max(0.01 * abs(x), 0.002 if self.unit == "" else 0.1e-6)


PARAMS = (
    Param("matmul", "gpu", 0.05, 1.0, ""),
    Param("hbm", "gpu", 0.05, 1.0, ""),
    Param("schedule_per_step", "cpu", 0.0, 0.05, "s"),
    Param("detokenize_per_token", "cpu", 0.0, 1e-3, "s"),
    Param("stream_per_chunk", "cpu", 0.0, 1e-3, "s"),
)
# The CPU cost of one eager kernel launch; fitted when some row runs eager (a DiT row, or
# ``cuda_graphs: false``), where it sets how soon small per-GPU shares become CPU-bound.
LAUNCH = Param("launch_overhead", "gpu", 0.0, 200e-6, "s")


def default_params(measurements: list[Measurement]) -> tuple[Param, ...]:
    """The five serving parameters, plus the launch cost when any row runs eager kernels."""
    eager = any(m.overrides.get("kind") == "dit" or m.overrides.get("hardware.cuda_graphs") is False
                for m in measurements)
    return PARAMS + (LAUNCH,) if eager else PARAMS


@dataclass
class Measurement:
    """One measured run: scenario overrides, metric and value, and where it came from."""

    row: int
    overrides: dict
    metric: str
    measured: float
    source: str | None = None  # the measurements file, for error messages


@dataclass
class FitResult:
    """Fitted values, which were identifiable, and the per-row residuals."""

    values: dict
    start: dict
    identifiable: dict
    predicted: list
    measurements: list
    iterations: int
    runs: int = 0
    history: list = field(default_factory=list)
    rank: int | None = None  # independent directions the rows pin down (None: nothing was fitted)

    @property
    def free(self) -> int:
        """Parameters some row is sensitive to: the ones the fit moved."""
        return sum(bool(v) for v in self.identifiable.values())

    @property
    def underdetermined(self) -> bool:
        """Whether the rows pin down fewer directions than there are free parameters."""
        return self.rank is not None and self.rank < self.free

    def underdetermined_message(self) -> str:
        """One line saying why the fitted values cannot be trusted ('' if they can)."""
        if not self.underdetermined:
            return ""
        n = len(self.measurements)
        why = (f"{n} rows for {self.free} free parameters" if n < self.free
               else f"the {n} rows pin down only {self.rank} of {self.free} free parameters")
        return (f"the fit is under-determined: {why}; the residuals can vanish while the values are "
                "arbitrary. Add rows sensitive to each parameter (see docs/calibration.md)")

    @property
    def residuals_pct(self) -> list[float]:
        return [100.0 * (p / m.measured - 1.0) for p, m in zip(self.predicted, self.measurements)]


def _cell(value: str) -> Any:
    v = value.strip()
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def _check_columns(cols: list[str], p: Path) -> None:
    for need in ("model", "metric", "measured"):
        if need not in cols:
            raise ConfigError(f"missing column {need!r}; columns are {', '.join(cols) or 'none'}", file=str(p),
                              path="row 1")
    unknown = [c for c in cols if c not in SHORTHANDS and c not in IGNORED and "." not in c
               and c not in ("model", "metric", "measured", "batch")]
    if unknown:
        raise ConfigError(f"unknown column {unknown[0]!r}; use {', '.join(sorted(SHORTHANDS))}, batch, or a "
                          "dotted scenario key", file=str(p), path="row 1")


def _measured(rec: dict, where, p: Path) -> float:
    try:
        measured = float(rec["measured"])
    except (TypeError, ValueError):
        raise ConfigError(f"measured must be a number, got {rec['measured']!r}", file=str(p),
                          path=where("measured")) from None
    if not (math.isfinite(measured) and measured > 0):
        raise ConfigError(f"measured must be positive, got {measured:g}", file=str(p), path=where("measured"))
    return measured


def _overrides(rec: dict, model: str, where, p: Path) -> dict:
    """The scenario overrides one row stands for (shorthand columns expanded, arrivals defaulted)."""
    ov: dict = {"model": model}
    for col, raw in rec.items():
        if col in ("model", "metric", "measured") or col in IGNORED or raw is None or not raw.strip():
            continue
        value = _cell(raw)
        key = "workload.requests" if col == "batch" else SHORTHANDS.get(col, col)
        if key in INT_KEYS and not (isinstance(value, int) and value > 0):
            raise ConfigError(f"expected a positive integer, got {raw!r}", file=str(p), path=where(col))
        if col == "rate" and isinstance(value, (int, float)):
            value = f"{value}/s"
        ov[key] = value
        if col == "batch":
            ov["workload.arrival"] = "all_at_once"
    if "workload.rate" in ov and "workload.arrival" not in ov:
        ov["workload.arrival"] = "poisson"
    ov.setdefault("workload.arrival", "all_at_once")
    ov.setdefault("workload.requests", 1)
    return ov


def read_measurements(path: str | Path) -> list[Measurement]:
    """Parse the measurements CSV; errors name the file, the row (1 = header) and the column."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("measurements file does not exist", file=str(p))
    try:
        text = read_text(p)
    except YAMLInputError as exc:
        raise ConfigError(str(exc), file=str(p)) from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    _check_columns(reader.fieldnames or [], p)
    out = []
    for i, rec in enumerate(reader, start=2):
        where = lambda col: f"row {i}, column {col!r}"  # noqa: E731
        if None in rec:
            raise ConfigError("more cells than columns", file=str(p), path=f"row {i}")
        metric = (rec.get("metric") or "").strip()
        if metric not in METRIC_PATHS:
            raise ConfigError(f"unknown metric {metric!r}; known: {', '.join(METRIC_PATHS)}", file=str(p),
                              path=where("metric"))
        measured = _measured(rec, where, p)
        model = (rec.get("model") or "").strip()
        if not model:
            raise ConfigError("model is empty", file=str(p), path=where("model"))
        out.append(Measurement(i, _overrides(rec, model, where, p), metric, measured, str(p)))
    if not out:
        raise ConfigError("no measured rows", file=str(p))
    return out


def base_values(hardware: str, cpu: str = "reference") -> dict:
    """Starting point: the catalog GPU's achievable fractions and the CPU profile's costs."""
    from ..config.loader import load_scenario

    sc = load_scenario({"model": "llama-2-7b", "hardware": {"gpu": hardware, "cpu": cpu}})
    gpu, c = sc.hardware.gpu, sc.hardware.cpu
    return {"matmul": gpu.achievable.matmul, "matmul_fp8": gpu.achievable.matmul_fp8, "hbm": gpu.achievable.hbm,
            "launch_overhead": gpu.launch_overhead, "schedule_per_step": c.schedule_per_step,
            "detokenize_per_token": c.detokenize_per_token, "stream_per_chunk": c.stream_per_chunk,
            "gpu_name": gpu.name}


def hardware_sections(hardware: str, cpu: str, values: dict, start: dict) -> tuple[dict, dict]:
    """The ``gpu`` and ``cpu`` profile sections for ``values`` (FP8 fraction scaled with the BF16 one)."""
    fp8 = min(1.0, start["matmul_fp8"] * values["matmul"] / start["matmul"])
    gpu = {"base": hardware, "achievable": {"matmul": float(values["matmul"]), "matmul_fp8": float(fp8),
                                            "hbm": float(values["hbm"])},
           "launch_overhead": float(values["launch_overhead"])}
    cpu_sec = {"base": cpu, **{k: float(values[k]) for k in ("schedule_per_step", "detokenize_per_token",
                                                              "stream_per_chunk")}}
    return gpu, cpu_sec


def predict(measurements: list[Measurement], hardware: str, cpu: str, values: dict, start: dict) -> np.ndarray:
    """Simulated value of each measured row with the given parameters."""
    from ..api import run

    gpu, cpu_sec = hardware_sections(hardware, cpu, values, start)
    out = np.empty(len(measurements))
    for i, m in enumerate(measurements):
        raw = {"kind": m.overrides.get("kind", "llm"), "model": m.overrides["model"],
               "hardware": {"gpu": gpu, "cpu": cpu_sec}, "record_spans": False}
        ov = {k: v for k, v in m.overrides.items() if k not in ("model", "kind")}
        try:
            s = run(raw, ov, last_mile_cost=False).summary
        except ConfigError as exc:
            where = f"row {m.row}, {exc.path}" if exc.path else f"row {m.row}"
            raise ConfigError(exc.message, file=m.source, path=where) from None
        node: Any = s
        for k in METRIC_PATHS[m.metric]:
            node = node.get(k) if isinstance(node, dict) else None
        if node is None:
            raise ConfigError(f"the simulated run produced no {m.metric} (no request completed?)",
                              file=m.source, path=f"row {m.row}")
        out[i] = float(node)
    return out


def _jacobian(residual, x: np.ndarray, r: np.ndarray, params, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Forward differences of the residuals, stepping inward at a bound."""
    J = np.zeros((len(r), len(params)))
    for j, p in enumerate(params):
        h = p.step(x[j])
        xp = x.copy()
        xp[j] = min(hi[j], x[j] + h)
        if xp[j] == x[j]:
            xp[j] = max(lo[j], x[j] - h)
        rp, _ = residual(xp)
        J[:, j] = (rp - r) / (xp[j] - x[j])
    return J


def _damped_step(J: np.ndarray, r: np.ndarray, lam: float, identifiable: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The Levenberg-Marquardt step on column-scaled identifiable parameters (zero for the others)."""
    Js = J[:, identifiable] / scale[identifiable]
    A = np.vstack([Js, math.sqrt(lam) * np.eye(Js.shape[1])])
    b = np.concatenate([-r, np.zeros(Js.shape[1])])
    ds, *_ = np.linalg.lstsq(A, b, rcond=None)
    dx = np.zeros(J.shape[1])
    dx[identifiable] = ds / scale[identifiable]
    return dx


def fit(measurements: list[Measurement], hardware: str, cpu: str = "reference", max_iter: int = 25,
        tol: float = 1e-6, params: tuple[Param, ...] | None = None,
        progress: Callable[[str], None] | None = None) -> FitResult:
    """Bounded Levenberg-Marquardt on relative residuals; returns the fitted values and residuals.

    Written here because the project's dependencies hold no bounded least-squares solver (SciPy's
    ``least_squares`` is the usual one); each residual evaluation is a batch of simulations.
    """
    params = default_params(measurements) if params is None else params
    start = base_values(hardware, cpu)
    y = np.array([m.measured for m in measurements])
    x = np.array([start[p.name] for p in params], dtype=float)
    lo, hi = np.array([p.lower for p in params]), np.array([p.upper for p in params])
    runs = 0

    def values_of(v):
        return {**start, **{p.name: float(val) for p, val in zip(params, v)}}

    def residual(v):
        nonlocal runs
        runs += len(measurements)
        pred = predict(measurements, hardware, cpu, values_of(v), start)
        return pred / y - 1.0, pred

    r, pred = residual(x)
    cost, lam, history, it, rank = float(r @ r), 1e-3, [float(r @ r)], 0, None
    identifiable = np.ones(len(params), dtype=bool)
    for it in range(1, max_iter + 1):
        J = _jacobian(residual, x, r, params, lo, hi)
        # Scale columns so fractions and microseconds are comparable; drop insensitive parameters.
        scale = np.linalg.norm(J, axis=0)
        identifiable = scale > 1e-9 * max(scale.max(), 1e-30)
        rank = _rank(J[:, identifiable] / scale[identifiable]) if identifiable.any() else 0
        improved = False
        for _ in range(8):
            xn = np.clip(x + _damped_step(J, r, lam, identifiable, scale), lo, hi)
            rn, pn = residual(xn)
            cn = float(rn @ rn)
            if cn < cost:
                improved, rel = True, (cost - cn) / max(cost, 1e-30)
                x, r, pred, cost = xn, rn, pn, cn
                lam = max(lam / 10, 1e-9)
                break
            lam *= 10
        history.append(cost)
        if progress:
            progress(f"iteration {it}: sum of squared relative residuals {cost:.3e}")
        if not improved or rel < tol or cost < 1e-12:
            break
    vals = values_of(x)
    return FitResult(values={p.name: vals[p.name] for p in params}, start={p.name: start[p.name] for p in params},
                     identifiable={p.name: bool(ok) for p, ok in zip(params, identifiable)},
                     predicted=pred.tolist(), measurements=measurements, iterations=it, runs=runs, history=history,
                     rank=rank)


#: Singular values below this fraction of the largest count as directions the rows do not pin down.
RANK_TOL = 1e-4


def _rank(J_scaled: np.ndarray) -> int:
    """Numerical rank of the column-normalised Jacobian (never more than the number of rows)."""
    sv = np.linalg.svd(J_scaled, compute_uv=False)
    return int((sv > RANK_TOL * sv.max()).sum()) if sv.size and sv.max() > 0 else 0


def _fmt_seconds(v: float) -> str:
    if v == 0:
        return "0 us"
    if v < 1e-3:
        return f"{v * 1e6:.4g} us"
    return f"{v * 1e3:.4g} ms"


def profile_dict(result: FitResult, hardware: str, cpu: str, source: str, command: str) -> dict:
    """The hardware profile YAML (``gpu:`` and ``cpu:`` sections, plus how it was made)."""
    start = base_values(hardware, cpu)
    gpu, cpu_sec = hardware_sections(hardware, cpu, {**start, **result.values}, start)
    gpu["achievable"] = {k: round(v, 4) for k, v in gpu["achievable"].items()}
    gpu["launch_overhead"] = _fmt_seconds(gpu["launch_overhead"])
    cpu_out = {"name": f"calibrated-{Path(source).stem}", "base": cpu,
               **{k: _fmt_seconds(cpu_sec[k]) for k in ("schedule_per_step", "detokenize_per_token",
                                                         "stream_per_chunk")},
               "source": f"lastmile calibrate {source}"}
    rows = [{"row": m.row, "model": m.overrides["model"], "metric": m.metric, "measured": m.measured,
             "predicted": round(float(p), 6), "residual_pct": round(100 * (p / m.measured - 1), 3)}
            for p, m in zip(result.predicted, result.measurements)]
    return {
        "gpu": gpu,
        "cpu": cpu_out,
        "measured": {
            "date": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
            "command": command,
            "measurements": str(source),
            "fitted": {k: (round(v, 4) if k in ("matmul", "hbm") else _fmt_seconds(v))
                       for k, v in result.values.items()},
            "held_at_start (no row sensitive to it)": [k for k, ok in result.identifiable.items() if not ok],
            "iterations": result.iterations,
            **({"warning": result.underdetermined_message()} if result.underdetermined else {}),
            "residuals": rows,
        },
    }


def write_profile(path: str | Path, profile: dict) -> None:
    """Write the profile YAML with a header saying how to use it."""
    head = ("# Hardware profile fitted by `lastmile calibrate`. Use it in a scenario as\n"
            f"#   hardware: {{gpu: {Path(path).name}, cpu: {Path(path).name}}}\n")
    Path(path).write_text(head + yaml.safe_dump(profile, sort_keys=False, width=100))
