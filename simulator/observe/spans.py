"""Span recorder: what ran where and when, for utilization, breakdowns and the Perfetto trace.

Spans go to disk as they are produced: every ``SPILL_SPANS`` of them, the recorder writes them to an
anonymous temporary file (``tempfile``'s, so ``TMPDIR`` chooses where; it has no name, so nothing is
left behind however the process ends), one segment per track, and keeps only an index of the
segments (each: the spans' starts and ends, then their names and categories). The trace is written from there a track at a time
(:meth:`SpanRecorder.track`), and the spans frame is read back only when asked for
(:meth:`SpanRecorder.frame`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a frame is built, not to load the module
    import pandas as pd

SPILL_SPANS = 1 << 16
"""Spans held in memory before they are written to the recorder's file."""

_SEP = "\0"  # between the names of a segment's spans


@dataclass
class SpanRecorder:
    """Append-only log of ``(track, name, start, end, category)`` spans.

    Tracks name a GPU, a link port or a CPU process (``"gpu0"``, ``"link:gpu0.tx"``,
    ``"cpu:engine"``). ``enabled=False`` keeps only per-track busy time (for utilization)
    so large runs stay light. The latest spans are held per track, each as (name, start, end,
    category), in the order recorded; older ones are in the recorder's file
    (``segments``: track, file offset, count, bytes of names).
    """

    enabled: bool = True
    busy: dict = field(default_factory=dict)
    segments: list = field(default_factory=list, repr=False)
    count: int = 0  # spans recorded, in the file and held
    held: int = 0   # spans held in memory, not yet in the file
    _held: dict = field(default_factory=dict, repr=False)  # track -> [(name, start, end, category)]
    _file: object = field(default=None, repr=False)  # the file, once spans were written to it

    def add(self, track: str, name: str, start: float, end: float, category: str = "") -> None:
        """Record one span; busy time accrues even when detailed spans are disabled."""
        self.busy[track] = self.busy.get(track, 0.0) + (end - start)
        self.add_span_only(track, name, start, end, category)

    def add_span_only(self, track: str, name: str, start: float, end: float,
                      category: str = "") -> None:
        """Record a span without accruing busy time (for tracks whose overlapping spans
        would double-count; their owner accrues busy time with ``add_busy``)."""
        if self.enabled:
            held = self._held.get(track)
            if held is None:
                held = self._held[track] = []
            held.append((name, start, end, category))
            self.count += 1
            self.held += 1
            if self.held >= SPILL_SPANS:
                self.spill()

    def add_block(self, track: str, names, starts: np.ndarray, ends: np.ndarray, categories) -> None:
        """Record many spans of one track at once, in their order on the track, without busy time (a
        closed-form decode run's): ``names`` and ``categories`` a list or one string for all."""
        if not self.enabled or not len(starts):
            return
        n = len(starts)
        held = self._held.get(track)
        if held is None:
            held = self._held[track] = []
        held.append(_Block([names] * n if isinstance(names, str) else names, starts, ends,
                           [categories] * n if isinstance(categories, str) else categories))
        self.count += n
        self.held += n
        if self.held >= SPILL_SPANS:
            self.spill()

    def add_busy(self, track: str, seconds: float) -> None:
        """Accrue busy time on a track without a span (for tracks measured another way)."""
        self.busy[track] = self.busy.get(track, 0.0) + seconds

    # -- the file ------------------------------------------------------------------------------
    def spill(self) -> None:
        """Write the held spans to the file, a segment per track, and let them go."""
        if not self.held:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="lastmile-spans-")
        fh = self._file
        fh.seek(0, os.SEEK_END)
        for track, held in self._held.items():
            if not held:
                continue
            names, starts, ends, cats = _columns(held)
            blob = (_SEP.join(names) + _SEP + _SEP.join(cats)).encode()
            offset = fh.tell()
            fh.write(starts.tobytes() + ends.tobytes() + blob)
            self.segments.append((track, offset, len(starts), len(blob)))
            held.clear()
        self.held = 0

    def tracks(self) -> list[str]:
        """Every track with a recorded span."""
        return sorted({s[0] for s in self.segments} | {t for t, held in self._held.items() if held})

    def track_spans(self, track: str, names: bool = True) -> tuple:
        """One track's spans in the order recorded: (start, end, names, categories) (the last two
        object arrays, None without ``names``)."""
        starts, ends, name_parts, cat_parts = [], [], [], []
        mine = [s for s in self.segments if s[0] == track]
        if mine:
            self._file.flush()
            self._read(self._file, mine, names, starts, ends, name_parts, cat_parts)
        held = self._held.get(track)
        if held:
            h_names, h_starts, h_ends, h_cats = _columns(held)
            starts.append(h_starts)
            ends.append(h_ends)
            if names:
                name_parts.extend(h_names)
                cat_parts.extend(h_cats)
        s = np.concatenate(starts) if starts else np.empty(0)
        e = np.concatenate(ends) if ends else np.empty(0)
        if not names:
            return s, e, None, None
        return s, e, _objects(name_parts), _objects(cat_parts)

    @staticmethod
    def _read(fh, segments, names, starts, ends, name_parts, cat_parts) -> None:
        for _, offset, n, size in segments:
            fh.seek(offset)
            starts.append(np.frombuffer(fh.read(8 * n), dtype=float))
            ends.append(np.frombuffer(fh.read(8 * n), dtype=float))
            if names:
                fh.seek(offset + 16 * n)
                parts = fh.read(size).decode().split(_SEP)
                name_parts.extend(parts[:n])
                cat_parts.extend(parts[n:])

    def frame(self) -> pd.DataFrame:
        """All recorded spans as a DataFrame (columns track, name, start, end, category), in time
        order: by start, then by track name, then in the order recorded on the track. The order
        depends on what ran when, not on the order a simulation recorded it in (a closed-form run
        records its spans in blocks)."""
        import pandas as pd  # imported where a frame is built: a run without spans never needs pandas

        tracks, names, cats, starts, ends, ranks, within = [], [], [], [], [], [], []
        for rank, t in enumerate(self.tracks()):
            s, e, n, c = self.track_spans(t)
            tracks.append(np.full(len(s), t, dtype=object))
            names.append(n)
            cats.append(c)
            starts.append(s)
            ends.append(e)
            ranks.append(np.full(len(s), rank, dtype=np.int64))
            within.append(np.arange(len(s)))
        if not tracks:
            return pd.DataFrame({"track": [], "name": [], "start": [], "end": [], "category": []})
        order = np.lexsort((np.concatenate(within), np.concatenate(ranks), np.concatenate(starts)))
        return pd.DataFrame({key: np.concatenate(parts)[order] for key, parts in
                             (("track", tracks), ("name", names), ("start", starts), ("end", ends),
                              ("category", cats))})

    def utilization(self, horizon: float) -> dict[str, float]:
        """Fraction of ``horizon`` each track was busy."""
        if horizon <= 0:
            return {k: 0.0 for k in self.busy}
        return {k: min(1.0, v / horizon) for k, v in sorted(self.busy.items())}


class _Block:
    """Spans of one track recorded at once: names, starts, ends, categories."""

    __slots__ = ("names", "starts", "ends", "cats")

    def __init__(self, names: list, starts, ends, cats: list):
        self.names, self.starts, self.ends, self.cats = names, starts, ends, cats


def _columns(held: list) -> tuple:
    """One track's held spans (single spans as tuples, blocks) as (names, starts, ends, categories),
    in the order held; the list then holds them as one block."""
    names, cats, starts, ends = [], [], [], []
    singles: list = []

    def flush_singles():
        if singles:
            n, st, en, ca = zip(*singles)
            names.extend(n)
            cats.extend(ca)
            starts.append(np.array(st, dtype=float))
            ends.append(np.array(en, dtype=float))
            singles.clear()

    for item in held:
        if isinstance(item, _Block):
            flush_singles()
            names.extend(item.names)
            cats.extend(item.cats)
            starts.append(np.asarray(item.starts, dtype=float))
            ends.append(np.asarray(item.ends, dtype=float))
        else:
            singles.append(item)
    flush_singles()
    out = names, np.concatenate(starts), np.concatenate(ends), cats
    if len(held) > 1 or not isinstance(held[0], _Block):
        held[:] = [_Block(*out)]  # the same spans as one block: read again, they need no assembling
    return out


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
