"""The outcome of one simulated scenario, and how it is written to a run folder."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from .. import forked
from .figures import fork_figures, write_run_figures
from .perfetto import MAX_TRACE_SPANS

if TYPE_CHECKING:  # pandas is imported where a frame is built, not to load the module
    import pandas as pd


def json_safe(value):
    """``value`` with every non-finite float (NaN, inf) replaced by None, numpy scalars made plain,
    so ``json.dumps(..., allow_nan=False)`` always succeeds."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def with_units(frame: pd.DataFrame, seconds, index: str | None = "request") -> pd.DataFrame:
    """``frame`` as published: the columns named in ``seconds`` become ``<name>_s`` and ``index``
    (when it is a column) becomes the index, so requests and breakdown join on it."""
    out = frame.rename(columns={c: f"{c}_s" for c in seconds if c in frame.columns})
    if index is not None and index in out.columns:
        out = out.set_index(index)
    return out


def _seconds(x) -> str:
    """A duration in readable units (``-`` when undefined)."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    ax = abs(x)
    if ax >= 1:
        return f"{x:.3g} s"
    if ax >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} us"


def _ms(x) -> str:
    return "-" if x is None else _seconds(x / 1e3)


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


@dataclass
class Result:
    """What a run produced: the summary dict and tidy DataFrames, plus the Perfetto trace.

    ``requests``: one row per request, indexed by ``request``, times in seconds with the unit
    in the column name (``arrival_s``, ``ttft_s``, ``e2e_s`` ...); ``breakdown``: one row per
    completed request, indexed by ``request`` too (so the two join), one column per latency
    category in seconds, summing to its latency; ``spans``: one row per recorded span (track,
    name, start, end, category); ``itl``: every inter-token gap at the client in seconds (LLM
    runs; None for a run with more gaps than the token ledger keeps exactly, whose summary then
    says ``itl_quantile_error``). ``trace_events``: the trace (a :class:`~simulator.observe.perfetto.Trace`, or a list
    of event dicts), written to ``trace.json``.
    """

    kind: str
    scenario: object
    summary: dict
    _requests: object  # each of the three frames, or a function that builds it when first read
    _breakdown: object
    _spans: object
    trace_events: object = field(default_factory=list, repr=False)
    itl: np.ndarray | None = field(default=None, repr=False)
    trace_bound: dict | None = field(default=None, repr=False)  # what the written trace.json left out, if anything

    def _frame(self, name: str) -> "pd.DataFrame":
        value = getattr(self, name)
        if callable(value):
            value = value()
            setattr(self, name, value)
        return value

    @property
    def requests(self) -> "pd.DataFrame":
        return self._frame("_requests")

    @property
    def breakdown(self) -> "pd.DataFrame":
        return self._frame("_breakdown")

    @property
    def spans(self) -> "pd.DataFrame":
        return self._frame("_spans")

    def resolved_scenario(self) -> dict:
        return self.scenario.model_dump(mode="json")

    # -- readable forms ----------------------------------------------------------------------
    def headline(self) -> list[tuple[str, str]]:
        """The key metrics of the run as (label, readable value) pairs."""
        s = self.summary
        rows = [("kind", self.kind), ("name", str(s.get("scenario", s.get("name", "?")))),
                ("status", str(s.get("status", "ok")))]
        if "requests_total" in s:
            rows.append(("requests", f"{s.get('requests_completed')}/{s.get('requests_total')} completed"))
        if self.kind == "llm":
            for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
                st = s.get(key) or {}
                rows.append((f"{label} p50 / p99", f"{_ms(st.get('p50'))} / {_ms(st.get('p99'))}"))
            tp = (s.get("throughput") or {}).get("output_tokens_per_s")
            rows.append(("throughput", "-" if tp is None else f"{tp:,.0f} output tok/s"))
            rows.append(("last mile", f"{_share(s.get('last_mile_share'))} of E2E, "
                                      f"{_share(s.get('itl_last_mile_share'))} of inter-token time"))
        else:
            st = s.get("latency_s") or {}
            rows.append(("latency p50 / p99", f"{_seconds(st.get('p50'))} / {_seconds(st.get('p99'))}"))
            if "last_mile_share" in s:
                rows.append(("last mile", _share(s.get("last_mile_share"))))
            if "bubble_fraction" in s:
                rows.append(("bubble", _share(s.get("bubble_fraction"))))
        return rows

    def breakdown_means(self) -> dict[str, float]:
        """Mean seconds per breakdown category over the completed requests (empty for no breakdown)."""
        bd = self.breakdown
        if self.kind == "token_pipeline" or bd is None or bd.empty:
            return {}
        cats = [c for c in bd.columns if not c.endswith("_s")]
        return {c: float(bd[c].mean()) for c in cats}

    def __repr__(self) -> str:
        head = dict(self.headline())
        parts = [f"{k}={v}" for k, v in head.items() if k not in ("kind", "name")]
        return f"<Result {self.kind} {head['name']!r}: " + ", ".join(parts) + ">"

    def _repr_html_(self) -> str:
        """A small table of the headline metrics and the mean breakdown, for notebooks."""
        import html  # notebooks only

        esc = html.escape
        rows = "".join(f"<tr><th style='text-align:left'>{esc(k)}</th><td>{esc(v)}</td></tr>"
                       for k, v in self.headline())
        means = self.breakdown_means()
        total = sum(means.values()) or 1.0
        bd = "".join(f"<tr><td>{esc(c)}</td><td>{esc(_seconds(m))}</td><td>{100 * m / total:.1f}%</td></tr>"
                     for c, m in means.items())
        out = f"<table><caption>lastmile result</caption>{rows}</table>"
        if bd:
            out += ("<table><caption>mean breakdown per request</caption>"
                    f"<tr><th>category</th><th>mean</th><th>share</th></tr>{bd}</table>")
        return out

    # -- the run folder ----------------------------------------------------------------------
    def _write_csv(self, name: str, path: Path) -> None:
        """One frame as CSV: a range of requests at a time where it is built from a request store and
        not yet in memory (the same text as the whole frame's ``to_csv``)."""
        raw = getattr(self, f"_{name}")
        if not hasattr(raw, "chunks"):
            frame = self._frame(f"_{name}")
            frame.to_csv(path, index=frame.index.name is not None)
            return
        with open(path, "w", encoding="utf-8", newline="") as fh:
            for i, chunk in enumerate(raw.chunks()):
                chunk.to_csv(fh, header=i == 0, index=chunk.index.name is not None)

    def write(self, out_dir: str | Path, figures: bool = True, parallel: bool = False, trace: bool = True,
              full_trace: bool = False) -> Path:
        """Write summary.json, requests.csv, breakdown.csv, scenario.yaml, trace.json and (unless
        ``figures=False``) the run's PNG figures (see :mod:`simulator.observe.figures`); with
        ``parallel``, the figures are drawn in a forked process while this one writes the rest (the
        command line's run folder: Matplotlib's import and rendering then cost no wall time of their own);
        without ``trace``, no trace.json; unless ``full_trace``, trace.json holds the run's first
        ``perfetto.MAX_TRACE_SPANS`` slices (``trace_bound`` then says where it stops)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        child = fork_figures(self, out) if figures and parallel else None
        try:
            self._write_files(out, trace, full_trace)
        finally:
            if child is not None:
                try:
                    child.join()
                except forked.ChildFailed as exc:
                    raise RuntimeError(f"drawing the run's figures failed: {exc}") from None
        if figures and child is None:
            write_run_figures(self, out)
        return out

    def _write_files(self, out: Path, with_trace: bool = True, full_trace: bool = False) -> None:
        (out / "summary.json").write_text(json.dumps(json_safe(self.summary), indent=2, allow_nan=False) + "\n")
        for name in ("requests", "breakdown"):
            self._write_csv(name, out / f"{name}.csv")
        (out / "scenario.yaml").write_text(yaml.safe_dump(self.resolved_scenario(), sort_keys=False))
        trace = self.trace_events
        if not with_trace:
            return
        if hasattr(trace, "write"):
            self.trace_bound = trace.write(out / "trace.json", None if full_trace else MAX_TRACE_SPANS)
        else:
            (out / "trace.json").write_text(json.dumps({"traceEvents": list(trace), "displayTimeUnit": "ms"}))
