"""What a stage does when a request reaches it, behind the :data:`STAGE_KINDS` registry (keyed by
its resource's kind).

A stage kind draws its per-request figures up front (from the run's rng, in a fixed order, so a
seed fixes every draw), then, when a request's stage becomes ready, ``start``s it on its resource
and tells the run when it ends (``run.finish``) and when its streamed outputs are out
(``run.release`` on a ``stream_from`` edge).
"""

from __future__ import annotations

import numpy as np

from ...workloads.sessions import sample_seconds
from .dit_stage import DiTStage
from .llm_stage import LLMStage


class TimedStage:
    """A cpu or service stage: ``time`` per request on its resource, ``outputs`` items emitted
    evenly over that time (item i of n is out at start + i/n x time).

    A consumer that streams from it (``stream_from: {stage, outputs: k}``) becomes ready when item
    k is out, and cannot end before this stage ends (it has the last item to consume): the run
    holds its end to this stage's. The stage's time on the request's clock includes its queue
    wait for a core (``<stage>.wait_s`` in the request table)."""

    def __init__(self, run, index: int, stage, n: int, rng: np.random.Generator):
        self.run, self.index, self.name, self.spec = run, index, stage.name, stage.spec
        self.time = sample_seconds(self.spec.time, n, rng)
        self.resource = None  # bound once the run's resources are built

    def start(self, rid: int, now: float) -> None:
        run, s = self.run, self.index
        seconds = float(self.time[rid])
        start, end = self.resource.book(now, seconds, f"r{rid} {self.name}")
        end = max(end, run.hold[rid, s])  # a streaming consumer ends after its producer
        run.start[rid, s] = start
        for d, k in run.streams[s]:  # consumers that start on this stage's k-th output
            run.hold[rid, d] = max(run.hold[rid, d], end)
            run.at(start + seconds * k / self.spec.outputs, run.release, rid, s, d)
        run.first[rid, s] = start + seconds / self.spec.outputs
        run.at(end, run.finish, rid, s)


STAGE_KINDS: dict[str, type] = {"cpu": TimedStage, "service": TimedStage, "llm": LLMStage, "dit": DiTStage}
"""Stage behaviour by the kind of the resource the stage names."""
