"""Chrome/Perfetto trace of a run: slices per GPU, link and CPU track, counters, and a flow per request.

Times are written in microseconds with exactly three decimals, computed from whole nanoseconds:
each slice's ``ts`` is its rounded start and its ``dur`` the rounded end minus the rounded
start, so a slice that ends where the next begins never overlaps it, not even by 1 ns after
rounding. Spans that genuinely overlap on one track (concurrent transfers on a link port) go
to numbered sub-tracks (``link:gpu0.tx (2)``), since Perfetto needs the slices of one thread
to nest. Events are streamed to the file, not built as one list, from spans read a track at a time;
a run folder's trace holds the run's first ``MAX_TRACE_SPANS`` slices unless the whole is asked for
(``lastmile run --full-trace``), and says where it stops.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a frame is built, not to load the module
    import pandas as pd

MAX_TRACE_SPANS = 250_000
"""Slices a run folder's trace.json holds by default: about 45 MB with its counters and request flows
(measured: 400,000 slices of the chat trace's 19,366 requests wrote 73 MB, ~180 bytes a slice), what a
browser's trace viewer opens at ease; a full-length run of that trace writes 2.1 million slices."""
REQUEST_NAME = r"^r(\d+) "
"""Span names that start with ``r<id> `` belong to request ``<id>`` (DiT, token pipeline)."""


def _group(track: str) -> str:
    if track.startswith("link:"):
        return "links"
    if track.startswith("cpu:"):
        return "cpu"
    return "gpus"


def _us(ns: int) -> str:
    """Whole nanoseconds as microseconds with three decimals, exactly (no float rounding)."""
    sign = "-" if ns < 0 else ""
    ns = abs(int(ns))
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _ns(seconds) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=float) * 1e9).astype(np.int64)


def assign_lanes(start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Lane of each span (input sorted by start) so spans in one lane never overlap.

    Greedy interval partitioning: a span takes the lowest-numbered lane already free at its
    start, so the common case (no overlap) is lane 0 for every span, checked without a loop.
    """
    n = len(start_ns)
    lanes = np.zeros(n, dtype=np.int64)
    if n < 2 or bool((start_ns[1:] >= np.maximum.accumulate(end_ns)[:-1]).all()):
        return lanes
    free: list[int] = []          # lanes whose last span has ended, as a heap of lane numbers
    busy: list[tuple[int, int]] = []  # (end, lane) of lanes in use
    count = 0
    for i in range(n):
        s = int(start_ns[i])
        while busy and busy[0][0] <= s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, count = count, count + 1
        lanes[i] = lane
        heapq.heappush(busy, (int(end_ns[i]), lane))
    return lanes


@dataclass
class Counter:
    """A counter track: ``name`` with ``values`` at ``times`` (seconds), shown under ``track``'s group."""

    name: str
    track: str
    times: np.ndarray
    values: np.ndarray


class _FrameSpans:
    """A spans DataFrame read as a :class:`~simulator.observe.spans.SpanRecorder` is: a track at a time."""

    def __init__(self, spans: pd.DataFrame):
        self.spans = spans
        self.count = len(spans)
        self._track = spans["track"].astype(str).to_numpy() if len(spans) else np.empty(0, dtype=object)

    def tracks(self) -> list[str]:
        return sorted(set(self._track))

    def track_spans(self, track: str, names: bool = True) -> tuple:
        mine = self._track == track
        sp = self.spans
        s, e = sp["start"].to_numpy(float)[mine], sp["end"].to_numpy(float)[mine]
        if not names:
            return s, e, None, None
        return (s, e, sp["name"].astype(str).to_numpy()[mine], sp["category"].astype(str).to_numpy()[mine])

    def frame(self) -> pd.DataFrame:
        return self.spans


def _ordered(start, end) -> tuple:
    """One track's spans in ns, ``end`` no earlier than ``start``, and the order that sorts them by
    (start, end), ties in the order recorded."""
    s = _ns(start)
    e = np.maximum(_ns(end), s)
    order = np.lexsort((e, s))
    return s[order], e[order], order


@dataclass
class Trace:
    """The trace of one run, written lazily: spans as slices, counters, and flows.

    ``spans``: a frame of spans, or the :class:`~simulator.observe.spans.SpanRecorder` that holds
    them (on disk), read a track at a time. ``flows``: a frame with columns ``flow`` (request id),
    ``track`` and ``time`` (seconds), one row per point a request passes through, in order; each
    point is bound to the slice on ``track`` that contains ``time`` (points that fall in no slice
    are dropped). None: follow requests by their span names (:func:`request_flows`). Either may be
    given as a function that makes it, called when the trace is first written or measured (a run
    whose trace is never written never pays for them).
    """

    spans: object
    counters: object = field(default_factory=list)
    flows: object = None
    cut_ns: int | None = None  # with a bound (:meth:`bound`): only what starts before this is written

    def _made_once(self, name: str):
        value = getattr(self, name)
        if callable(value):
            value = value()
            setattr(self, name, value)
        return value

    def _source(self):
        return self.spans if hasattr(self.spans, "track_spans") else _FrameSpans(self.spans)

    def bound(self, max_spans: int) -> dict | None:
        """Write at most ``max_spans`` slices: the run's first ones, up to the time the bound is
        reached (every track's, counters and flows alike, so the window is whole); returns what was
        left out (None: everything fits)."""
        src = self._source()
        if src.count <= max_spans:
            self.cut_ns = None
            return None
        starts = np.concatenate([_ns(src.track_spans(t, names=False)[0]) for t in src.tracks()])
        cut = int(np.partition(starts, max_spans)[max_spans])
        self.cut_ns = cut
        return {"spans_total": int(src.count), "spans_written": int(np.count_nonzero(starts < cut)),
                "until_s": cut / 1e9, "run_s": float(starts.max()) / 1e9}

    def _kept(self, s_ns, e_ns, order):
        """One track's ordered spans inside the bound (all without one)."""
        if self.cut_ns is None:
            return s_ns, e_ns, order
        keep = s_ns < self.cut_ns
        return s_ns[keep], e_ns[keep], order[keep]

    def __len__(self) -> int:
        return self._source().count + sum(len(c.times) for c in self._made_once("counters"))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[dict]:
        for line in self.lines():
            yield json.loads(line)

    # -- output ------------------------------------------------------------------------------
    def lines(self) -> Iterator[str]:
        """Every trace event as one JSON object string: metadata, slices, counters, flows. Spans are
        read a track at a time (twice: their lanes first, for the thread names that come first)."""
        src = self._source()
        self._made_once("counters")
        self._made_once("flows")
        if not src.count and not self.counters:
            return
        span_tracks = src.tracks() if src.count else []
        tracks = sorted(set(span_tracks) | {c.track for c in self.counters})
        groups = sorted({_group(t) for t in tracks})
        pid = {g: i + 1 for i, g in enumerate(groups)}
        lanes_of = {}
        for t in span_tracks:
            s, e, _ = self._kept(*_ordered(*src.track_spans(t, names=False)[:2]))
            lanes_of[t] = int(assign_lanes(s, e).max()) + 1 if len(s) else 1
        tid, names, next_tid = {}, {}, 1
        for t in tracks:
            for lane in range(lanes_of.get(t, 1)):
                tid[(t, lane)] = next_tid
                names[(t, lane)] = t if lane == 0 else f"{t} ({lane + 1})"
                next_tid += 1
        for g, p in pid.items():
            yield json.dumps({"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": g}})
        for (t, lane), i in tid.items():
            yield json.dumps({"ph": "M", "name": "thread_name", "pid": pid[_group(t)], "tid": i,
                              "args": {"name": names[(t, lane)]}})
        if self.flows is None:  # found from the span names
            self.flows = request_flows(src.frame())
        flow_groups = {} if self.flows.empty else dict(iter(self.flows.groupby("track", sort=False)))
        points: dict = {}
        quoted: dict[str, str] = {}
        for track in span_tracks:
            start, end, name_arr, cat_arr = src.track_spans(track)
            s_ns, e_ns, order = self._kept(*_ordered(start, end))
            del start, end
            lanes = assign_lanes(s_ns, e_ns)
            p = pid[_group(track)]
            tids = [tid[(track, lane)] for lane in range(lanes_of[track])]
            for name, cat, s, e, lane in zip(name_arr[order], cat_arr[order], s_ns, e_ns, lanes):
                qn = quoted.get(name) or quoted.setdefault(name, json.dumps(name))
                qc = quoted.get("\0" + cat) or quoted.setdefault("\0" + cat, json.dumps(cat or "span"))
                yield (f'{{"ph":"X","name":{qn},"cat":{qc},"pid":{p},"tid":{tids[lane]},'
                       f'"ts":{_us(s)},"dur":{_us(e - s)}}}')
            if track in flow_groups:
                self._bind(flow_groups[track], s_ns, e_ns, lanes, p, tid, track, points)
        for c in self.counters:
            qn, p = json.dumps(c.name), pid[_group(c.track)]
            for ns, v in zip(_ns(c.times), np.asarray(c.values, dtype=float)):
                if np.isfinite(v) and (self.cut_ns is None or ns < self.cut_ns):
                    yield f'{{"ph":"C","name":{qn},"pid":{p},"tid":0,"ts":{_us(ns)},"args":{{"value":{float(v)!r}}}}}'
        yield from self._flow_lines(points)

    @staticmethod
    def _bind(grp, s, e, lane, p, tid, track, points) -> None:
        """Bind the flow points on one track to the slice that contains each (sorted slices)."""
        t = _ns(grp["time"].to_numpy(float))
        i = np.searchsorted(s, t, side="right") - 1
        ok = (i >= 0) & (e[np.maximum(i, 0)] >= t)
        for row, k, good in zip(grp.index, i, ok):
            if good:
                points[row] = (p, tid[(track, int(lane[k]))], int((s[k] + e[k]) // 2))

    def _flow_lines(self, points) -> Iterator[str]:
        """One flow per request ('s', then 't' per middle point, then 'f'), each bound inside a slice."""
        if self.flows.empty:
            return
        flows = self.flows.loc[[r for r in self.flows.index if r in points]]
        for fid, grp in flows.groupby("flow", sort=True):
            rows = list(grp.index)
            if len(rows) < 2:
                continue
            for j, r in enumerate(rows):
                p, th, ns = points[r]
                ph = "s" if j == 0 else ("f" if j == len(rows) - 1 else "t")
                bp = '' if ph == "s" else ',"bp":"e"'
                yield (f'{{"ph":"{ph}","id":{int(fid)},"name":"request {int(fid)}","cat":"request",'
                       f'"pid":{p},"tid":{th},"ts":{_us(ns)}{bp}}}')

    def write(self, path: str | Path, max_spans: int | None = None) -> dict | None:
        """Stream the trace to ``path`` as ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; with
        ``max_spans``, only the run's first ones (:meth:`bound`), said in the file's ``otherData``
        (the trace format's own place for metadata) and returned."""
        cut = self.cut_ns = None
        if max_spans is not None:
            cut = self.bound(max_spans)
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"traceEvents": [')
            for i, line in enumerate(self.lines()):
                f.write(("\n" if i == 0 else ",\n") + line)
            other = "" if cut is None else f', "otherData": {json.dumps({"lastmile_bounded_trace": cut})}'
            f.write(f'\n], "displayTimeUnit": "ms"{other}}}\n')
        return cut


def request_flows(spans: pd.DataFrame) -> pd.DataFrame:
    """Flow points of requests whose spans are named ``r<id> ...``: its first span on each track, in
    time order, then its last span."""
    import pandas as pd

    if spans.empty:
        return pd.DataFrame(columns=["flow", "track", "time"])
    rid = spans["name"].astype(str).str.extract(REQUEST_NAME, expand=False)
    mine = spans[rid.notna()].assign(flow=rid[rid.notna()].astype(np.int64))
    if mine.empty:
        return pd.DataFrame(columns=["flow", "track", "time"])
    mine = mine.assign(time=(mine["start"] + mine["end"]) / 2)
    first = mine.sort_values(["flow", "start"], kind="stable").drop_duplicates(["flow", "track"])
    last = mine.sort_values(["flow", "end"], kind="stable").drop_duplicates("flow", keep="last")
    pts = pd.concat([first, last]).drop_duplicates(["flow", "track", "time"])
    pts = pts.sort_values(["flow", "time"], kind="stable")
    return pts[["flow", "track", "time"]].reset_index(drop=True)


def trace_events(spans, counters=None, flows=None) -> Trace:
    """The run's trace: every span (a frame, or the recorder that holds them) as a slice, with
    ``counters`` and request ``flows`` (each, or a function that makes it).

    Without explicit ``flows``, requests are followed by their span names (``r<id> ...``).
    """
    return Trace(spans, counters if callable(counters) else list(counters or ()), flows)
