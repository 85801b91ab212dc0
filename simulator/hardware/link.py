"""Links as processor-sharing ports: concurrent transfers share bandwidth max-min fairly.

A transfer crosses one or more ports at once (e.g. a sender's tx port and a receiver's rx
port); its rate is set by progressive filling, so each flow is limited by its most
contended port. Rates are recomputed whenever a flow starts or ends, and the pending
completion is re-timed, so contention emerges from the simulation instead of a formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import simpy

# A flow is done when less than this fraction of its bytes remains: float residue from
# re-timing must never leave a flow alive with a vanishing remainder.
_REL_EPS = 1e-9


def copy_seconds(nbytes, bandwidth: float):
    """Seconds ``nbytes`` (a number or an array) take at ``bandwidth`` (0 for nothing to copy)."""
    return nbytes / bandwidth if not isinstance(nbytes, (int, float)) or nbytes > 0 else 0.0


def booked_copy(booked_until: float, issued: float, latency: float, seconds: float) -> tuple[float, float]:
    """A serialized copier's copy issued at ``issued`` behind the copy booked until ``booked_until``:
    it begins after both and the latency, and ends ``seconds`` later; returns (begin, end). The one
    closed form of a booked copy (:meth:`Fabric.book` and the closed-form decode runs call it)."""
    begin = (issued if issued > booked_until else booked_until) + latency
    return begin, begin + seconds


def flow_rate(ports, max_rate: float = float("inf")) -> float:
    """The rate of a flow alone on ``ports``: its narrowest port's bandwidth, or its own cap if lower."""
    return min(min(p.bandwidth for p in ports), max_rate)


@dataclass(eq=False)
class Port:
    """One direction of one physical link endpoint, with its accounting.

    ``busy_time`` is the union of intervals with at least one active flow (not a sum over
    flows); ``bytes_moved`` is the total payload that crossed the port; ``active`` is the
    number of flows crossing it now.
    """

    name: str
    bandwidth: float
    busy_time: float = 0.0
    bytes_moved: float = 0.0
    active: int = 0
    reserved: bool = False  # owned by one serialized copier whose copies are booked in closed form
    booked_until: float = 0.0

    @property
    def track(self) -> str:
        """Span-recorder track name of this port."""
        return "link:" + self.name


@dataclass(eq=False)
class _Flow:
    ports: tuple[Port, ...]
    nbytes: float
    remaining: float
    label: str
    start: float
    done: simpy.Event
    max_rate: float = float("inf")  # the flow's own ceiling (e.g. an all-reduce's bus bandwidth)
    rate: float = 0.0
    ttf: float = field(default=float("inf"))  # time to finish at the current rate


class Fabric:
    """The set of ports in one simulation and the flows currently crossing them."""

    def __init__(self, env: simpy.Environment, recorder=None):
        self.env = env
        self.recorder = recorder
        self.ports: dict[str, Port] = {}
        self._flows: list[_Flow] = []
        self._last = env.now
        self._generation = 0
        self._due: list[_Flow] = []

    def port(self, name: str, bandwidth: float) -> Port:
        """Create the port ``name`` or return the existing one (its bandwidth must match)."""
        if not bandwidth > 0:
            raise ValueError(f"port {name!r}: bandwidth must be > 0 bytes/s, got {bandwidth!r}")
        existing = self.ports.get(name)
        if existing is not None:
            if existing.bandwidth != bandwidth:
                raise ValueError(f"port {name!r} exists with bandwidth {existing.bandwidth}, "
                                 f"not {bandwidth}")
            return existing
        port = self.ports[name] = Port(name, float(bandwidth))
        return port

    @property
    def active_flows(self) -> int:
        """Number of transfers currently moving bytes."""
        return len(self._flows)

    def transfer(self, ports: Sequence[Port], nbytes: float, latency: float = 0.0,
                 label: str = "", max_rate: float = float("inf")) -> simpy.Process:
        """Move ``nbytes`` through all ``ports`` at once after ``latency``; returns the process.

        Zero bytes (or no ports) completes after the latency alone; ``max_rate`` (bytes/s)
        caps this flow below its ports' fair share.
        """
        return self.env.process(self.move(ports, nbytes, latency, label, max_rate))

    def move(self, ports: Sequence[Port], nbytes: float, latency: float = 0.0,
             label: str = "", max_rate: float = float("inf")):
        """The same transfer as a generator, for ``yield from`` inside a process that waits for
        it anyway (two SimPy events fewer than :meth:`transfer`)."""
        if nbytes < 0:
            raise ValueError(f"transfer {label!r}: nbytes must be >= 0, got {nbytes!r}")
        if latency < 0:
            raise ValueError(f"transfer {label!r}: latency must be >= 0, got {latency!r}")
        if not max_rate > 0:
            raise ValueError(f"transfer {label!r}: max_rate must be > 0, got {max_rate!r}")
        unique = tuple(dict.fromkeys(ports))  # a port listed twice is still one port
        return self._run(unique, float(nbytes), float(latency), label, float(max_rate))

    def reserve(self, ports: Sequence[Port]) -> None:
        """Give ``ports`` to one caller whose copies are serialized, like the device-to-host copies
        of one CUDA stream: each is booked in closed form by :meth:`book`, without SimPy events.
        A shared flow on a reserved port is an error, so a booking is never wrong about contention."""
        for p in ports:
            if p.active:
                raise ValueError(f"port {p.name!r} carries flows and cannot be reserved")
            p.reserved = True

    def book(self, ports: Sequence[Port], nbytes: float, latency: float, label: str, start: float,
             max_rate: float = float("inf")) -> float:
        """A copy on reserved ``ports`` issued at ``start``: after the previous booked copy and the
        latency, ``nbytes`` at the narrowest port's bandwidth (or the flow's own ``max_rate``, if
        lower); returns when it ends.

        The same times as :meth:`move` gives a flow alone on its ports, in one function call."""
        if not all(p.reserved for p in ports):
            raise ValueError(f"booking {label!r}: every port must be reserved first")
        booked = max((p.booked_until for p in ports), default=start)
        if nbytes <= 0 or not ports:
            return booked_copy(booked, start, latency, 0.0)[0]
        seconds = copy_seconds(nbytes, flow_rate(ports, max_rate))
        begin, end = booked_copy(booked, start, latency, seconds)
        rec = self.recorder
        for p in ports:
            p.booked_until = end
            p.busy_time += seconds
            p.bytes_moved += nbytes
            if rec is not None:
                rec.add_busy(p.track, seconds)
                if rec.enabled:
                    rec.add_span_only(p.track, label, begin, end, "link")
        return end

    def settle_run(self, ports: Sequence[Port], booked_until: float, seconds: float, nbytes: float) -> None:
        """After a closed-form run of booked copies on reserved ``ports`` (``pipelines.llm.decode_runs``,
        with :meth:`book`'s times): the ports are booked until ``booked_until`` and ``seconds`` and
        ``nbytes`` more busy, as the recorder's tracks."""
        rec = self.recorder
        for p in ports:
            p.booked_until = max(p.booked_until, booked_until)  # a port two runs' copies share keeps the later
            if nbytes > 0:  # as :meth:`book`, a copy of nothing leaves no trace
                p.busy_time += seconds
                p.bytes_moved += nbytes
                if rec is not None:
                    rec.add_busy(p.track, seconds)

    def _run(self, ports: tuple[Port, ...], nbytes: float, latency: float, label: str,
             max_rate: float = float("inf")):
        if any(p.reserved for p in ports):
            raise ValueError(f"transfer {label!r} crosses a port reserved for booked copies")
        if latency > 0:
            yield self.env.timeout(latency)
        if nbytes <= 0 or not ports:
            return
        self._advance()
        flow = _Flow(ports, nbytes, nbytes, label, self.env.now, self.env.event(), max_rate)
        self._flows.append(flow)
        for p in ports:
            p.active += 1
        self._reschedule()
        yield flow.done

    def _advance(self) -> None:
        """Drain bytes and accrue busy time for the interval since the last change."""
        now = self.env.now
        elapsed = now - self._last
        self._last = now
        if elapsed <= 0 or not self._flows:
            return
        for f in self._flows:
            moved = min(f.rate * elapsed, f.remaining)
            f.remaining -= moved
            for p in f.ports:
                p.bytes_moved += moved
        rec = self.recorder
        for p in dict.fromkeys(p for f in self._flows for p in f.ports):
            p.busy_time += elapsed
            if rec is not None:
                rec.add_busy(p.track, elapsed)

    def _assign_rates(self) -> None:
        """Max-min fair rates by progressive filling over the active flows.

        All unfrozen rates rise together; the first limit reached freezes its flows: a port's
        fair share of what is left, or a flow's own ``max_rate`` if that comes first.
        """
        if len(self._flows) == 1:  # alone: its narrowest port or its own cap (the common case: one D2H)
            f = self._flows[0]
            f.rate = flow_rate(f.ports, f.max_rate)
            return
        cap = {p: p.bandwidth for f in self._flows for p in f.ports}
        count = {p: 0 for p in cap}
        for f in self._flows:
            for p in f.ports:
                count[p] += 1
        unfrozen = list(self._flows)
        while unfrozen:
            bottleneck = min((p for p in cap if count[p] > 0), key=lambda p: cap[p] / count[p])
            share = max(cap[bottleneck], 0.0) / count[bottleneck]
            ceiling = min(f.max_rate for f in unfrozen)
            if ceiling < share:
                frozen = [f for f in unfrozen if f.max_rate == ceiling]
                share = ceiling
            else:
                frozen = [f for f in unfrozen if bottleneck in f.ports]
            for f in frozen:
                f.rate = share
                for p in f.ports:
                    cap[p] -= share
                    count[p] -= 1
            unfrozen = [f for f in unfrozen if f not in frozen]

    def _reschedule(self) -> None:
        """Recompute rates and arm one wake-up for the next completion; older ones go stale."""
        self._generation += 1
        if not self._flows:
            self._due = []
            return
        self._assign_rates()
        for f in self._flows:
            f.ttf = f.remaining / f.rate if f.rate > 0 else float("inf")
        dt = min(f.ttf for f in self._flows)
        # Flows due within float noise of the first finish together, so every wake-up
        # retires at least one flow and residue cannot cause an endless chain of wake-ups.
        self._due = [f for f in self._flows if f.ttf <= dt * (1 + _REL_EPS)]
        wake = self.env.timeout(dt)
        generation = self._generation
        wake.callbacks.append(lambda _ev: self._on_wake(generation))

    def _on_wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # a flow started or ended since this wake-up was armed
        self._advance()
        due = set(self._due)
        finished = [f for f in self._flows
                    if f in due or f.remaining <= _REL_EPS * f.nbytes]
        for f in finished:
            self._finish(f)
        self._reschedule()

    def _finish(self, f: _Flow) -> None:
        self._flows.remove(f)
        now = self.env.now
        rec = self.recorder
        for p in f.ports:
            p.bytes_moved += f.remaining  # residue below epsilon, so bytes are conserved
            p.active -= 1
            if rec is not None and rec.enabled:
                rec.add_span_only(p.track, f.label, f.start, now, "link")
        f.remaining = 0.0
        f.done.succeed()
