"""Shared resources of a request pipeline, behind the :data:`RESOURCES` registry (the YAML ``kind``).

A resource is built once per run and shared by every request and every stage that names it, so
stages on one resource contend for it. ``cpu`` and ``service`` book a stage's time in closed form
(start and end known when the work is submitted, like ``hardware.cpu``'s FIFO clocks); ``llm``
(``llm_stage.LLMDeployment``) feeds calls to a serving deployment and ``dit`` (``dit_stage.DiTDeployment``)
images to a DiT deployment, each living in the same SimPy env.
"""

from __future__ import annotations

import heapq

from .dit_stage import DiTDeployment
from .llm_stage import LLMDeployment


class CPUPool:
    """``cores`` identical cores, first come first served: a task takes the core that frees first
    (an M/G/k queue), and waits for it when all are busy. Each core is a trace track."""

    def __init__(self, name: str, spec, run):
        self.name, self.recorder = name, run.recorder
        self._free = [(0.0, c) for c in range(spec.cores)]  # (free at, core): the heap picks the lowest core on ties
        self.tracks = [f"cpu:{name}.{c}" for c in range(spec.cores)]

    def book(self, now: float, seconds: float, label: str) -> tuple[float, float]:
        """Queue ``seconds`` of work at ``now``; returns (start, end)."""
        free, core = self._free[0]
        start = now if now > free else free
        end = start + seconds
        heapq.heapreplace(self._free, (end, core))
        if seconds > 0:
            self.recorder.add(self.tracks[core], label, start, end, "cpu")
        return start, end


class Service:
    """An external service of unbounded concurrency: a call starts at once and takes its latency.
    Its calls overlap, so the trace shows them on one track without accruing busy time."""

    def __init__(self, name: str, spec, run):
        self.name, self.recorder = name, run.recorder
        self.track = f"service:{name}"

    def book(self, now: float, seconds: float, label: str) -> tuple[float, float]:
        if seconds > 0:
            self.recorder.add_span_only(self.track, label, now, now + seconds, "service")
        return now, now + seconds


RESOURCES: dict[str, type] = {"cpu": CPUPool, "service": Service, "llm": LLMDeployment, "dit": DiTDeployment}
"""Resource runtimes by their YAML ``kind``."""
