"""A DiT service's queue: the requests waiting in it, the policy that orders them, and the batches it forms.

A request waits until the GPUs are free; the policy's first request then opens a denoising pass,
joined by the requests of the same group (the same shape at the same step: diffusers pipelines
run one timestep for the whole batch) in the policy's order, up to ``serving.max_batch``. With
``serving.preempt`` the pass is cut at a step boundary when a waiting request ranks ahead of every
request in it; the pass's requests go back to the queue with their steps done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...workloads.dit_requests import Shape


@dataclass(eq=False)
class Job:
    """One request inside the service, with the time it spent in each part of its latency so far."""

    rid: int
    arrival: float
    shape: Shape
    step_work: float  # GPU seconds of one denoising step of this request alone (the policy's measure)
    served: object = None  # the SimPy event fired when its last pass (and VAE) is done
    steps_done: int = 0
    queued_at: float = math.nan
    start: float = math.nan
    denoise_start: float = math.nan
    denoise_end: float = math.nan
    queue: float = 0.0
    text_encode: float = 0.0
    denoise: float = 0.0
    comm: float = 0.0
    phase: float = 0.0  # wall time of its denoising passes
    vae: float = 0.0
    batch: int = 0      # most requests one of its passes held
    preemptions: int = 0
    comm_bytes: float = 0.0

    def __post_init__(self):
        self.queued_at = self.arrival

    @property
    def remaining(self) -> float:
        """Estimated GPU seconds of denoising left."""
        return self.step_work * (self.shape.steps - self.steps_done)

    @property
    def group(self) -> tuple:
        """Requests of one group can share a pass: same shape, same step."""
        return self.shape, self.steps_done


class FIFO:
    """Oldest request first."""

    @staticmethod
    def key(job: Job) -> tuple:
        return job.arrival, job.rid


class ShortestFirst:
    """Least remaining denoising work first (shortest remaining processing time; Schrage, Operations
    Research 16(3), 1968): small images and few steps overtake large ones."""

    @staticmethod
    def key(job: Job) -> tuple:
        return job.remaining, job.arrival, job.rid


POLICIES = {"fifo": FIFO, "shortest_first": ShortestFirst}
"""Queue policies by their ``serving.policy`` name (config.dit_models.DIT_POLICIES lists the same)."""


@dataclass
class Queue:
    """Waiting requests under one policy, with its depth over time (a trace counter)."""

    policy: object
    max_batch: int
    waiting: list = field(default_factory=list)
    depth: list = field(default_factory=list)  # (time, requests waiting)

    def put(self, job: Job, now: float) -> None:
        job.queued_at = now
        self.waiting.append(job)
        self.depth.append((now, len(self.waiting)))

    def take(self, now: float) -> list[Job]:
        """The next pass's requests: the policy's first and its group's next ones, up to max_batch."""
        key = self.policy.key
        head = min(self.waiting, key=key)
        batch = sorted((j for j in self.waiting if j.group == head.group), key=key)[:self.max_batch]
        taken = set(map(id, batch))
        self.waiting = [j for j in self.waiting if id(j) not in taken]
        self.depth.append((now, len(self.waiting)))
        return batch

    def ranks_ahead(self, batch: list[Job]) -> bool:
        """Whether a waiting request comes before every request of the running pass."""
        if not self.waiting:
            return False
        key = self.policy.key
        return key(min(self.waiting, key=key)) < min(key(j) for j in batch)
