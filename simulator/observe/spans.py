"""Span recorder: what ran where and when, for utilization, breakdowns and the Perfetto trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a frame is built, not to load the module
    import pandas as pd


@dataclass
class SpanRecorder:
    """Append-only log of ``(track, name, start, end, category)`` spans, kept as plain lists.

    Tracks name a GPU, a link port or a CPU process (``"gpu0"``, ``"link:gpu0.tx"``,
    ``"cpu:engine"``). ``enabled=False`` keeps only per-track busy time (for utilization)
    so large runs stay light.
    """

    enabled: bool = True
    track: list = field(default_factory=list)
    name: list = field(default_factory=list)
    start: list = field(default_factory=list)
    end: list = field(default_factory=list)
    category: list = field(default_factory=list)
    busy: dict = field(default_factory=dict)

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

    def add_busy(self, track: str, seconds: float) -> None:
        """Accrue busy time on a track without a span (for tracks measured another way)."""
        self.busy[track] = self.busy.get(track, 0.0) + seconds

    def frame(self) -> pd.DataFrame:
        """All recorded spans as a DataFrame (columns track, name, start, end, category)."""
        import pandas as pd  # imported where a frame is built: a run without spans never needs pandas

        return pd.DataFrame({"track": self.track, "name": self.name, "start": self.start,
                             "end": self.end, "category": self.category})

    def utilization(self, horizon: float) -> dict[str, float]:
        """Fraction of ``horizon`` each track was busy."""
        if horizon <= 0:
            return {k: 0.0 for k in self.busy}
        return {k: min(1.0, v / horizon) for k, v in sorted(self.busy.items())}
