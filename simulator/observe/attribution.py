"""The one attribution of an LLM request's client-visible time to the activities on its critical path.

A request's output row of step k covers the window from its previous row's GPU end ``ws`` to this
step's GPU end ``g1``. The window is cut at the previous token's copy end (``pd1``), detokenization
end (``pe``) and receipt (``pR``), each clipped to the step's start ``cs`` (work hidden behind the GPU
or behind the next step's chain costs nothing), then at the step's own chain: the wait of its
scheduling on the engine's process (``a0`` to ``s0``: the tasks that held the process, a shared GIL,
named by what they were: detokenization and streaming are the last mile, anything else
scheduling), its scheduling and launch (``s0`` to ``a1``), the wait for the GPU (queue), compute and
communication. Whatever is left is queueing. Every path that folds rows (the token ledger, its
closed-form runs, the walk over kept rows) calls these functions; nothing else cuts a window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..invariants import require
from .records import CPU_ACTIVITY

STEP_TIMES = ("a0", "a1", "s0", "g0", "g1", "comm", "wdet", "wstr")
"""The step table's columns a window's cuts read: scheduling submitted (a0) and done (a1), its own
start on the process (s0), GPU start and end, communication, and the detokenization and streaming
seconds the scheduling waited behind (wdet, wstr, within a0..s0)."""


@dataclass
class Cuts:
    """A window's cut points (arrays, or scalars): ws <= b1 <= b2 <= cs <= sw <= c1 <= c2 <= bc <= g1,
    and the shares of the scheduling's wait [cs, sw] that were detokenization and streaming (None
    where no step's scheduling waited behind either: the wait, if any, is all scheduling)."""

    ws: np.ndarray | None = None
    b1: np.ndarray | None = None
    b2: np.ndarray | None = None
    cs: np.ndarray | None = None
    sw: np.ndarray | None = None
    c1: np.ndarray | None = None
    c2: np.ndarray | None = None
    bc: np.ndarray | None = None
    g1: np.ndarray | None = None
    fdet: np.ndarray | None = None
    fstr: np.ndarray | None = None

    def take(self, index, fields=("ws", "b1", "b2", "cs", "sw", "fdet", "fstr")) -> "Cuts":
        """The cuts ``fields`` of the windows at ``index`` (an index array into these): by default
        what :func:`receipt`, :func:`receipt_parts` and :func:`after_parts` read."""
        return Cuts(**{f: None if getattr(self, f) is None else getattr(self, f)[index] for f in fields})


def cut(ws, pd1, pe, a0, a1, s0, g0, g1, comm, wdet, wstr) -> Cuts:
    """The cut points of windows [ws, g1] after a previous token copied at ``pd1`` and detokenized
    at ``pe``, for steps with the times of ``STEP_TIMES``."""
    cs = np.maximum(a0, ws)
    b1 = np.minimum(np.maximum(pd1, ws), cs)
    b2 = np.minimum(np.maximum(pe, b1), cs)
    c1 = np.minimum(np.maximum(a1, cs), g1)
    sw = np.minimum(np.maximum(s0, cs), c1)
    c2 = np.minimum(np.maximum(g0, c1), g1)
    bc = np.maximum(c2, g1 - comm)
    if not (np.any(wdet) or np.any(wstr)):
        return Cuts(ws, b1, b2, cs, sw, c1, c2, bc, g1)
    wait = s0 - a0
    safe = np.where(wait > 0, wait, 1.0)
    fdet = np.where(wait > 0, wdet / safe, 0.0)
    fstr = np.where(wait > 0, wstr / safe, 0.0)
    return Cuts(ws, b1, b2, cs, sw, c1, c2, bc, g1, fdet, fstr)


def receipt(pR, c: Cuts):
    """The previous token's receipt clipped into the window: b2 <= b3 <= cs."""
    return np.minimum(np.maximum(pR, c.b2), c.cs)


def step_parts(c: Cuts) -> dict:
    """Each category's length in the window that does not depend on the previous receipt (the
    scheduling's wait split by what held the process); ``compute`` is prefill or decode, by row."""
    parts = {"d2h": c.b1 - c.ws, "detokenize": c.b2 - c.b1, "stream": np.zeros_like(c.b1),
             "schedule": c.c1 - c.cs, "queue": c.c2 - c.c1, "compute": c.bc - c.c2, "comm": c.g1 - c.bc}
    if c.fdet is not None:  # the wait behind detokenization and streaming on the process
        wait = np.maximum(c.sw - c.cs, 0.0)
        parts["detokenize"] = parts["detokenize"] + wait * c.fdet
        parts["stream"] = wait * c.fstr
        parts["schedule"] = wait * (1.0 - c.fdet - c.fstr) + (c.c1 - c.sw)
    for v in parts.values():
        np.maximum(v, 0.0, out=v)
    return parts


def receipt_parts(b3, c: Cuts) -> tuple:
    """The window's parts that the previous receipt sets: streaming [b2, b3], queueing [b3, cs]."""
    return np.maximum(b3 - c.b2, 0.0), np.maximum(c.cs - b3, 0.0)


def after_parts(c: Cuts, b3, lower) -> tuple:
    """The last mile's parts (d2h, detokenize, stream) that lie after ``lower`` (the request's first
    receipt): the last mile of the inter-token time."""
    parts = (np.maximum(c.b1 - np.maximum(c.ws, lower), 0.0), np.maximum(c.b2 - np.maximum(c.b1, lower), 0.0),
             np.maximum(b3 - np.maximum(c.b2, lower), 0.0))
    if c.fdet is None:
        return parts
    wait = np.maximum(c.sw - np.maximum(c.cs, lower), 0.0)
    return parts[0], parts[1] + wait * c.fdet, parts[2] + wait * c.fstr


def tail_parts(g1, d1, e, R, lower) -> list:
    """A request's last token's whole last mile, (length, length after ``lower``) for each of
    d2h, detokenize and stream: copy, detokenization, streaming to its receipt."""
    return [(np.maximum(end - begin, 0.0), np.maximum(end - np.maximum(begin, lower), 0.0))
            for begin, end in ((g1, d1), (d1, e), (e, R))]


def check_ordered(a0, s0, a1, g0, g1, d1) -> None:
    """STEP_ORDERED: the step times a window's cuts read are in order (scalars or arrays of steps)."""
    ok = np.all((a0 <= s0) & (s0 <= a1) & (a1 <= g0) & (g0 <= g1) & (g1 <= d1))
    require("STEP_ORDERED", bool(ok), lambda: f"a0 {a0}, s0 {s0}, a1 {a1}, g0 {g0}, g1 {g1}, d1 {d1}")


def wait_activity(proc, a0: float, s0: float) -> tuple[float, float]:
    """Seconds of detokenization and of streaming that ``proc`` ran between ``a0`` and ``s0``: what a
    step's scheduling, submitted at ``a0`` and started at ``s0``, waited behind on its process."""
    det = stream = 0.0
    if s0 > a0:
        for label, seconds in proc.ran_between(a0, s0).items():
            activity = CPU_ACTIVITY.get(label)
            if activity == "detokenize":
                det += seconds
            elif activity == "stream":
                stream += seconds
        # invariant WAIT_WITHIN: what a wait is split into lies within the wait (cut's shares sum to <= 1)
        assert det + stream <= (s0 - a0) * (1 + 1e-9) + 1e-15, (det, stream, s0 - a0)
    return det, stream
