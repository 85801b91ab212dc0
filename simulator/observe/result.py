"""The outcome of one simulated scenario, and how it is written to a run folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml


@dataclass
class Result:
    """What a run produced: the summary dict and tidy DataFrames, plus the Perfetto trace events.

    ``requests``: one row per request (timestamps, metrics); ``breakdown``: one row per
    request, one column per latency category, summing to its latency; ``spans``: one row
    per recorded span (track, name, start, end, category); ``itl``: every inter-token gap
    at the client in seconds (LLM runs).
    """

    kind: str
    scenario: object
    summary: dict
    requests: pd.DataFrame
    breakdown: pd.DataFrame
    spans: pd.DataFrame
    trace_events: list = field(default_factory=list, repr=False)
    itl: np.ndarray | None = field(default=None, repr=False)

    def resolved_scenario(self) -> dict:
        return self.scenario.model_dump(mode="json")

    def write(self, out_dir: str | Path) -> Path:
        """Write summary.json, requests.csv, breakdown.csv, scenario.yaml and trace.json."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, sort_keys=False) + "\n")
        self.requests.to_csv(out / "requests.csv", index=False)
        self.breakdown.to_csv(out / "breakdown.csv", index=False)
        (out / "scenario.yaml").write_text(yaml.safe_dump(self.resolved_scenario(), sort_keys=False))
        (out / "trace.json").write_text(json.dumps({"traceEvents": self.trace_events,
                                                     "displayTimeUnit": "ms"}))
        return out
