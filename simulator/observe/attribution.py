"""The one attribution of an LLM request's client-visible time to the activities on its critical path.

A request's output row of step k covers the window from its previous row's GPU end ``ws`` to this
step's GPU end ``g1``. The window is cut at the previous token's milestones (``Prev``): its copy end,
its arrival at the process that detokenizes it, its detokenization's end, its outputs built, its
arrival at the API server and its receipt, each clipped to the step's start ``cs`` (work hidden
behind the GPU or behind the next step's chain costs nothing), then at the step's own chain: the
wait of its scheduling on the engine's process (``a0`` to ``s0``: the tasks that held the process, a
shared GIL, named by what they were: detokenization, output processing, inter-process messages and
streaming are the last mile, anything else scheduling), its scheduling and launch (``s0`` to
``a1``), the wait for the GPU (queue), compute and communication. Whatever is left is queueing.
Every path that folds rows (the token ledger, its closed-form runs, the walk over kept rows) calls
these functions; nothing else cuts a window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..invariants import require
from .records import CPU_ACTIVITY, LLM_LAST_MILE

WAIT_PARTS = ("detokenize", "output", "ipc", "stream")
"""The last-mile activities a step's scheduling can wait behind on its process (the step table's
``wdet``, ``wout``, ``wipc``, ``wstr`` seconds, in this order)."""

WAIT_COLUMNS = ("wdet", "wout", "wipc", "wstr")

STEP_TIMES = ("a0", "a1", "s0", "g0", "g1", "comm") + WAIT_COLUMNS
"""The step table's columns a window's cuts read: scheduling submitted (a0) and done (a1), its own
start on the process (s0), GPU start and end, communication, and the seconds of each of
``WAIT_PARTS`` the scheduling waited behind (within a0..s0)."""

PREV = ("d1", "i", "o", "e", "x", "R")
"""A token's milestones after its step's GPU end, in the order they happen: its sampled id copied to
the host (d1), at the process that detokenizes it (i: after the message carrying it, where one
crosses), detokenized (o), its output built (e), the output at its API server (x: after the message
carrying it, where one crosses), received by the client (R). A row records i, o, e, x, R; d1 is its
step's."""

ROW_MARKS = PREV[1:]
"""The milestones an output row records (its step records the copy's end)."""


@dataclass
class Cuts:
    """A window's cut points (arrays, or scalars): ws <= b1 <= bi <= bo <= b2 <= cs <= sw <= c1 <= c2
    <= bc <= g1, and the shares of the scheduling's wait [cs, sw] that were each of ``WAIT_PARTS``
    (None where no step's scheduling waited behind any: the wait, if any, is all scheduling)."""

    ws: np.ndarray | None = None
    b1: np.ndarray | None = None
    bi: np.ndarray | None = None
    bo: np.ndarray | None = None
    b2: np.ndarray | None = None
    cs: np.ndarray | None = None
    sw: np.ndarray | None = None
    c1: np.ndarray | None = None
    c2: np.ndarray | None = None
    bc: np.ndarray | None = None
    g1: np.ndarray | None = None
    shares: tuple | None = None

    def take(self, index, fields=("ws", "b1", "bi", "bo", "b2", "cs", "sw", "shares")) -> "Cuts":
        """The cuts ``fields`` of the windows at ``index`` (an index array into these): by default
        what :func:`receipt`, :func:`receipt_parts` and :func:`after_parts` read."""
        out, taken = {}, {}  # cuts that are one array (a milestone that coincides) stay one
        for f in fields:
            v = getattr(self, f)
            if v is None or f == "shares":
                out[f] = None if v is None else tuple(s[index] for s in v)
            else:
                out[f] = taken.get(id(v))
                if out[f] is None:
                    out[f] = taken[id(v)] = v[index]
        return Cuts(**out)


def _clip(value, low, high):
    return np.minimum(np.maximum(value, low), high)


def _gap(begin, end):
    """``end - begin``, at least 0 (0 where the two cuts are one array: a milestone that coincides)."""
    return np.zeros_like(begin) if begin is end else np.maximum(end - begin, 0.0)


def cut(ws, pd1, pi, po, pe, a0, a1, s0, g0, g1, comm, wdet, wout, wipc, wstr) -> Cuts:
    """The cut points of windows [ws, g1] after a previous token copied at ``pd1``, at its
    detokenizing process at ``pi`` (``pd1`` itself where no message carries it), detokenized at
    ``po`` and its output built at ``pe``, for steps with the times of ``STEP_TIMES``."""
    cs = np.maximum(a0, ws)
    b1 = _clip(pd1, ws, cs)
    bi = b1 if pi is pd1 else _clip(pi, b1, cs)
    bo = _clip(po, bi, cs)
    b2 = _clip(pe, bo, cs)
    c1 = _clip(a1, cs, g1)
    sw = _clip(s0, cs, c1)
    c2 = _clip(g0, c1, g1)
    bc = np.maximum(c2, g1 - comm)
    waits = (wdet, wout, wipc, wstr)
    if not any(np.any(w) for w in {id(w): w for w in waits}.values()):  # one look at a shared zeros
        return Cuts(ws, b1, bi, bo, b2, cs, sw, c1, c2, bc, g1)
    wait = s0 - a0
    safe = np.where(wait > 0, wait, 1.0)
    shares = tuple(np.where(wait > 0, w / safe, 0.0) for w in waits)
    return Cuts(ws, b1, bi, bo, b2, cs, sw, c1, c2, bc, g1, shares)


def receipt(px, pR, c: Cuts) -> tuple:
    """The previous token's arrival at its API server (None: where its output was made, no message
    carried it) and its receipt, clipped into the window: b2 <= bx <= b3 <= cs."""
    bx = c.b2 if px is None else _clip(px, c.b2, c.cs)
    return bx, _clip(pR, bx, c.cs)


def step_parts(c: Cuts) -> dict:
    """Each category's length in the window that does not depend on the previous token's path past
    its outputs (the scheduling's wait split by what held the process); ``compute`` is prefill or
    decode, by row."""
    parts = {"d2h": c.b1 - c.ws, "ipc": _gap(c.b1, c.bi), "detokenize": c.bo - c.bi, "output": c.b2 - c.bo,
             "stream": np.zeros_like(c.b1), "schedule": c.c1 - c.cs, "queue": c.c2 - c.c1,
             "compute": c.bc - c.c2, "comm": c.g1 - c.bc}
    if c.shares is not None:  # the wait behind the last mile's work on the process
        wait = np.maximum(c.sw - c.cs, 0.0)
        for name, share in zip(WAIT_PARTS, c.shares):
            parts[name] = parts[name] + wait * share
        parts["schedule"] = wait * (1.0 - sum(c.shares)) + (c.c1 - c.sw)
    for v in parts.values():
        np.maximum(v, 0.0, out=v)
    return parts


def receipt_parts(bx, b3, c: Cuts) -> tuple:
    """The window's parts that the previous token's path past its outputs sets: the message to its
    API server [b2, bx], streaming [bx, b3], queueing [b3, cs]."""
    return _gap(c.b2, bx), np.maximum(b3 - bx, 0.0), np.maximum(c.cs - b3, 0.0)


def after_parts(c: Cuts, bx, b3, lower) -> tuple:
    """The last mile's parts (``LLM_LAST_MILE``, in its order) that lie after ``lower`` (the
    request's first receipt): the last mile of the inter-token time."""
    def after(begin, end):
        return np.maximum(end - np.maximum(begin, lower), 0.0)

    ipc = [after(begin, end) for begin, end in ((c.b1, c.bi), (c.b2, bx)) if begin is not end]
    parts = {"d2h": after(c.ws, c.b1), "detokenize": after(c.bi, c.bo), "output": after(c.bo, c.b2),
             "ipc": sum(ipc) if ipc else np.zeros_like(c.b1), "stream": after(bx, b3)}
    if c.shares is not None:
        wait = np.maximum(c.sw - np.maximum(c.cs, lower), 0.0)
        for name, share in zip(WAIT_PARTS, c.shares):
            parts[name] = parts[name] + wait * share
    return tuple(parts[name] for name in LLM_LAST_MILE)


def tail_parts(g1, d1, i, o, e, x, R, lower) -> list:
    """A request's last token's whole last mile, (length, length after ``lower``) for each of
    ``LLM_LAST_MILE`` in its order: copy, messages, detokenization, output, streaming to its receipt."""
    def seg(begin, end):
        return np.maximum(end - begin, 0.0), np.maximum(end - np.maximum(begin, lower), 0.0)

    ipc_in, ipc_out = seg(d1, i), seg(e, x)
    parts = {"d2h": seg(g1, d1), "detokenize": seg(i, o), "output": seg(o, e),
             "ipc": (ipc_in[0] + ipc_out[0], ipc_in[1] + ipc_out[1]), "stream": seg(x, R)}
    return [parts[name] for name in LLM_LAST_MILE]


def check_ordered(a0, s0, a1, g0, g1, d1) -> None:
    """STEP_ORDERED: the step times a window's cuts read are in order (scalars or arrays of steps)."""
    ok = np.all((a0 <= s0) & (s0 <= a1) & (a1 <= g0) & (g0 <= g1) & (g1 <= d1))
    require("STEP_ORDERED", bool(ok), lambda: f"a0 {a0}, s0 {s0}, a1 {a1}, g0 {g0}, g1 {g1}, d1 {d1}")


def wait_activity(proc, a0: float, s0: float) -> tuple:
    """Seconds of each of ``WAIT_PARTS`` that ``proc`` ran between ``a0`` and ``s0``: what a step's
    scheduling, submitted at ``a0`` and started at ``s0``, waited behind on its process."""
    if s0 <= a0:
        return NO_WAIT
    seconds = dict.fromkeys(WAIT_PARTS, 0.0)
    for label, length in proc.ran_between(a0, s0).items():
        activity = CPU_ACTIVITY.get(label)
        if activity is not None:
            seconds[activity] += length
    # invariant WAIT_WITHIN: what a wait is split into lies within the wait (cut's shares sum to <= 1)
    total = sum(seconds.values())
    assert total <= (s0 - a0) * (1 + 1e-9) + 1e-15, (seconds, s0 - a0)
    return tuple(seconds[name] for name in WAIT_PARTS)


NO_WAIT = (0.0,) * len(WAIT_PARTS)
