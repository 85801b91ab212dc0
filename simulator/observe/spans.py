"""Span recorder: what ran where and when, for utilization, breakdowns and the Perfetto trace.

Spans go to disk as they are produced: every ``SPILL_SPANS`` of them, the recorder writes them to an
anonymous temporary file (``tempfile``'s, so ``TMPDIR`` chooses where; it has no name, so nothing is
left behind however the process ends), one segment per track, and keeps only an index of the segments (each: the spans' starts, ends and places in the recording
order, then their names and categories). The trace is written from there a track at a time
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
    so large runs stay light. The latest spans are held in the lists; older ones are in the
    recorder's file (``segments``: track, file offset, count, bytes of names).
    """

    enabled: bool = True
    track: list = field(default_factory=list)
    name: list = field(default_factory=list)
    start: list = field(default_factory=list)
    end: list = field(default_factory=list)
    category: list = field(default_factory=list)
    busy: dict = field(default_factory=dict)
    segments: list = field(default_factory=list, repr=False)
    count: int = 0  # spans recorded, in the file and in the lists
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
            self.track.append(track)
            self.name.append(name)
            self.start.append(start)
            self.end.append(end)
            self.category.append(category)
            self.count += 1
            if len(self.track) >= SPILL_SPANS:
                self.spill()

    def add_busy(self, track: str, seconds: float) -> None:
        """Accrue busy time on a track without a span (for tracks measured another way)."""
        self.busy[track] = self.busy.get(track, 0.0) + seconds

    # -- the file ------------------------------------------------------------------------------
    def spill(self) -> None:
        """Write the spans held in the lists to the file, a segment per track, and empty the lists."""
        if not self.track:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="lastmile-spans-")
        self._file.seek(0, os.SEEK_END)
        self._write(self._file)

    def _write(self, fh) -> None:
        start, end = np.array(self.start, dtype=float), np.array(self.end, dtype=float)
        seq = np.arange(self.count - len(self.track), self.count, dtype=np.int64)
        by_track: dict[str, list[int]] = {}
        for i, t in enumerate(self.track):
            by_track.setdefault(t, []).append(i)
        names, cats = self.name, self.category
        for track, idx in by_track.items():
            sel = np.array(idx)
            blob = (_SEP.join([names[i] for i in idx]) + _SEP + _SEP.join([cats[i] for i in idx])).encode()
            offset = fh.tell()
            fh.write(start[sel].tobytes() + end[sel].tobytes() + seq[sel].tobytes() + blob)
            self.segments.append((track, offset, len(idx), len(blob)))
        for column in (self.track, self.name, self.start, self.end, self.category):
            column.clear()

    def tracks(self) -> list[str]:
        """Every track with a recorded span."""
        return sorted({s[0] for s in self.segments} | set(self.track))

    def track_spans(self, track: str, names: bool = True) -> tuple:
        """One track's spans in the order recorded: (start, end, names, categories) (the last two
        object arrays, None without ``names``)."""
        starts, ends, name_parts, cat_parts = [], [], [], []
        mine = [s for s in self.segments if s[0] == track]
        if mine:
            self._file.flush()
            self._read(self._file, mine, names, starts, ends, name_parts, cat_parts)
        idx = [i for i, t in enumerate(self.track) if t == track]
        if idx:
            starts.append(np.array([self.start[i] for i in idx], dtype=float))
            ends.append(np.array([self.end[i] for i in idx], dtype=float))
            if names:
                name_parts.extend(self.name[i] for i in idx)
                cat_parts.extend(self.category[i] for i in idx)
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
                fh.seek(offset + 24 * n)
                parts = fh.read(size).decode().split(_SEP)
                name_parts.extend(parts[:n])
                cat_parts.extend(parts[n:])

    def frame(self) -> pd.DataFrame:
        """All recorded spans as a DataFrame (columns track, name, start, end, category), in the
        order recorded within each track."""
        import pandas as pd  # imported where a frame is built: a run without spans never needs pandas

        if not self.segments:
            return pd.DataFrame({"track": self.track, "name": self.name, "start": self.start,
                                 "end": self.end, "category": self.category})
        parts, seqs = [], []
        for t in self.tracks():
            s, e, names, cats = self.track_spans(t)
            parts.append(pd.DataFrame({"track": t, "name": names, "start": s, "end": e, "category": cats}))
            seqs.append(self._seq(t))
        frame = pd.concat(parts, ignore_index=True)
        return frame.iloc[np.argsort(np.concatenate(seqs), kind="stable")].reset_index(drop=True)

    def _seq(self, track: str) -> np.ndarray:
        """The recording order of one track's spans (their places among all spans)."""
        parts = []
        fh = self._file
        fh.flush()
        for t, offset, n, _ in self.segments:
            if t == track:
                fh.seek(offset + 16 * n)
                parts.append(np.frombuffer(fh.read(8 * n), dtype=np.int64))
        base = self.count - len(self.track)
        parts.append(np.array([base + i for i, t in enumerate(self.track) if t == track], dtype=np.int64))
        return np.concatenate(parts)

    def utilization(self, horizon: float) -> dict[str, float]:
        """Fraction of ``horizon`` each track was busy."""
        if horizon <= 0:
            return {k: 0.0 for k in self.busy}
        return {k: min(1.0, v / horizon) for k, v in sorted(self.busy.items())}


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
