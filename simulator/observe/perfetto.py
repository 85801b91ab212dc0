"""Chrome/Perfetto trace events from recorded spans: one track (thread) per GPU, link and CPU process."""

from __future__ import annotations

import pandas as pd


def _group(track: str) -> str:
    if track.startswith("link:"):
        return "links"
    if track.startswith("cpu:"):
        return "cpu"
    return "gpus"


def trace_events(spans: pd.DataFrame, max_events: int = 200_000) -> list[dict]:
    """Complete ('X') events in microseconds, with process/thread names for each track."""
    if spans.empty:
        return []
    spans = spans.iloc[:max_events]
    tracks = sorted(spans["track"].unique())
    groups = sorted({_group(t) for t in tracks})
    pid = {g: i + 1 for i, g in enumerate(groups)}
    tid = {t: i + 1 for i, t in enumerate(tracks)}
    events: list[dict] = []
    for g in groups:
        events.append({"ph": "M", "name": "process_name", "pid": pid[g], "tid": 0, "args": {"name": g}})
    for t in tracks:
        events.append({"ph": "M", "name": "thread_name", "pid": pid[_group(t)], "tid": tid[t], "args": {"name": t}})
    for track, name, start, end, cat in zip(spans["track"], spans["name"], spans["start"], spans["end"],
                                            spans["category"]):
        events.append({"ph": "X", "name": str(name), "cat": str(cat) or "span", "pid": pid[_group(track)],
                       "tid": tid[track], "ts": round(start * 1e6, 3), "dur": round((end - start) * 1e6, 3)})
    return events
