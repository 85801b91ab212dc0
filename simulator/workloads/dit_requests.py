"""What each request of a DiT service asks for: its shape, the scenario's own or drawn from ``workload.shapes``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.dit_models import parse_resolution
from ..config.dit_trace import read_dit_trace, trace_shapes
from .arrivals import open_loop_arrivals

SHAPE_STREAM = 0x5A4E
"""The random stream the shapes are drawn from (apart from the arrivals', so adding shapes moves no arrival)."""


@dataclass(frozen=True)
class Shape:
    """What a request asks for: its image (or video) size, frames (None for an image), and steps."""

    width: int
    height: int
    frames: int | None
    steps: int


def own_shape(sc) -> Shape:
    """The scenario's own request shape."""
    return Shape(sc.width, sc.height, sc.frames, sc.steps)


def shaped(sc, shape: Shape):
    """The scenario as one request of ``shape`` sees it: its resolution, steps and frames."""
    return sc.model_copy(update={"resolution": f"{shape.width}x{shape.height}", "steps": shape.steps,
                                 "frames": shape.frames})


def request_shapes(sc, n: int) -> list[Shape] | None:
    """Each of ``n`` requests' shapes: a DiT trace's rows, or drawn by weight from ``workload.shapes`` (steps
    and frames default to the scenario's); None when every request has the scenario's own."""
    mix = sc.workload.shapes
    if sc.workload.trace:
        rows = read_dit_trace(sc.workload.trace)
        return [Shape(w, h, frames, steps) for w, h, steps, frames in trace_shapes(rows, n, sc.steps, sc.frames)]
    if not mix:
        return None
    kinds = []
    for m in mix:
        w, h = parse_resolution(m.resolution)
        kinds.append(Shape(w, h, m.frames or sc.frames, m.steps or sc.steps))
    weights = np.array([m.weight for m in mix], dtype=float)
    picks = np.random.default_rng([sc.seed, SHAPE_STREAM]).choice(len(kinds), size=n, p=weights / weights.sum())
    return [kinds[i] for i in picks]


def dit_arrivals(sc, rng: np.random.Generator) -> np.ndarray | None:
    """Arrival times (s) of the requests: a DiT trace's ``arrived_at`` times ``workload.trace_time_scale``,
    else the arrival process's (None for a closed loop)."""
    w = sc.workload
    if w.arrival == "trace":
        return read_dit_trace(w.trace).arrived_at[:w.requests] * w.trace_time_scale
    return open_loop_arrivals(w, rng)
