"""The critical path of each request through its graph, and the breakdown by stage along it.

A stage becomes ready when the last of the edges into it is released (a dependency's end, or a
streamed producer's k-th output); the dependency that released last is its **critical
predecessor**. Walking back from the stage that ended last (the request's completion) along
critical predecessors to an entry stage (ready at the arrival) gives the critical path. Stage
``c`` on it is charged ``[ready(c), out(c)]``, where ``out`` is the next path stage's ready time
(or the request's end for the last one), so the charges tile [arrival, end] and sum to E2E.

A stage's charge includes its wait in its resource's queue (a CPU core, the LLM engine's queue),
and, for a consumer that streams from a producer, the wait for the producer's last output.
"""

from __future__ import annotations

import numpy as np


def critical_paths(arrival: np.ndarray, ready: np.ndarray, end: np.ndarray, pred: np.ndarray,
                   done: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Per request (rows of the ``(n, stages)`` arrays): its critical path (stage indices, from the
    first to the last) and the seconds charged to each stage (NaN rows for unfinished requests)."""
    n, S = ready.shape
    charge = np.full((n, S), np.nan)
    paths: list[tuple[int, ...]] = []
    for rid in range(n):
        if not done[rid]:
            paths.append(())
            continue
        row = charge[rid]
        row[:] = 0.0
        cur = S - 1 - int(np.argmax(end[rid, ::-1]))  # the last (in graph order) of the stages that ended last
        out = end[rid, cur]
        path = []
        while cur >= 0:
            path.append(cur)
            row[cur] = out - ready[rid, cur]
            out = ready[rid, cur]
            cur = int(pred[rid, cur])
        if out != arrival[rid]:  # an entry stage is ready at the arrival, by construction
            raise AssertionError(f"request {rid}'s critical path starts at {out}, not its arrival {arrival[rid]}")
        paths.append(tuple(reversed(path)))
    return paths, charge
