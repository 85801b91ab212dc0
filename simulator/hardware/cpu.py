"""CPU model: named single-threaded processes (a Python process and its GIL) on a pool of cores.

Work submitted to a process runs after the work already queued there (FIFO, one task at a
time) and only when a core is free. Because every submission happens at the current
simulated time, a task's start and end are known when it is submitted: no SimPy event is
needed unless someone waits for the result.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

from ..observe.spans import SpanRecorder


@dataclass
class CorePool:
    """A pool of identical cores; a task runs, whole, at the earliest time from its ready time at
    which some core is idle for its duration.

    Work is booked ahead (a chunk's read when it will arrive, a message when it will be sent), so a
    core holds intervals in the future: a task ready before one of them runs in the idle gap if it
    fits, as an operating system would run it, instead of queueing behind the booking. While there
    are at least as many cores as processes, no process ever waits for a core, and the pool is not
    consulted at all. ``now`` (the simulation's clock) lets a core forget intervals that have ended.
    """

    cores: int
    processes: int = 0
    now: Callable[[], float] | None = None
    _busy: list = field(default_factory=list)

    def __post_init__(self):
        if self.cores < 1:
            raise ValueError("a CPU needs at least one core")
        self._busy = [[] for _ in range(self.cores)]  # per core: its booked (start, end), by start

    @property
    def contended(self) -> bool:
        return self.processes > self.cores

    def place(self, ready: float, duration: float) -> float:
        """Book ``duration`` seconds on the core that can start them first at or after ``ready``
        (the lowest-numbered on a tie); returns the start."""
        best, chosen = float("inf"), None
        for core in self._busy:
            start = _first_gap(core, ready, duration)
            if start < best:
                best, chosen = start, core
                if start == ready:  # no core starts before ready, and a tie keeps the lower-numbered
                    break
        if duration <= 0:
            return best
        bisect.insort(chosen, (best, best + duration))
        if len(chosen) > CORE_TRIM and self.now is not None:  # intervals that ended hold back no later task
            now = self.now()
            chosen[:] = [iv for iv in chosen if iv[1] > now]
        return best


def _first_gap(intervals: list, ready: float, duration: float) -> float:
    """The earliest start at or after ``ready`` at which ``duration`` fits between ``intervals``. One
    core's intervals do not overlap, so sorted by start they are sorted by end too: those that ended by
    ``ready`` are skipped by bisection."""
    t = ready
    for i in range(bisect.bisect_right(intervals, t, key=_END), len(intervals)):
        s, e = intervals[i]
        if s >= t + duration:
            break
        t = e
    return t


_END = itemgetter(1)


CORE_TRIM = 64
"""Intervals a core holds before those that have ended are dropped."""


HISTORY_TRIM = 64
"""Tasks a process's history holds before the ended ones are dropped (each submission appends one)."""


@dataclass
class CPUProcess:
    """One process: tasks run one at a time, in submission order, each on a free core."""

    name: str
    pool: CorePool
    recorder: SpanRecorder | None = None
    free_at: float = 0.0
    busy: float = 0.0
    tasks: int = 0
    by_label: dict = field(default_factory=dict)  # busy seconds per task label, for the activity shares
    # with keep_history: (start, end, label) of the recent tasks, in order, those ended long ago dropped in
    # bulk: what a task submitted now would wait behind (kept only where someone asks, :meth:`ran_between`)
    keep_history: bool = False
    history: deque = field(default_factory=deque, repr=False)

    def __post_init__(self):
        self.pool.processes += 1

    @property
    def track(self) -> str:
        return f"cpu:{self.name}"

    def submit(self, now: float, duration: float, label: str = "") -> tuple[float, float]:
        """Queue ``duration`` seconds of work at time ``now``; returns (start, end)."""
        if self.pool.contended:
            start = self.pool.place(now if now > self.free_at else self.free_at, duration)
        else:
            start = now if now > self.free_at else self.free_at
        end = start + duration
        self.free_at = end
        self.busy += duration
        self.tasks += 1
        self.by_label[label] = self.by_label.get(label, 0.0) + duration
        if self.keep_history and duration > 0:
            history = self.history
            history.append((start, end, label))
            if len(history) > HISTORY_TRIM:  # tasks that ended before now can hold back no later task
                while history[0][1] <= now:
                    history.popleft()
        if self.recorder is not None and duration > 0:
            self.recorder.add(self.track, label, start, end, "cpu")
        return start, end

    def settle_run(self, free_at: float, busy: float, tasks: int, recorded: float, by_label: dict) -> None:
        """After a closed-form run of steps (``pipelines.llm.decode_runs``) played this process's clock
        forward with :meth:`submit`'s rule and in its order: the clock, busy seconds, task count and
        the recorder's busy time as the run left them, and ``by_label``'s seconds added per label."""
        self.free_at, self.busy, self.tasks = free_at, busy, tasks
        for label, seconds in by_label.items():
            self.by_label[label] = self.by_label.get(label, 0.0) + seconds
        if self.recorder is not None and (recorded or self.track in self.recorder.busy):  # as :meth:`submit`: a track
            self.recorder.busy[self.track] = recorded  # is busy once a task that takes time ran there

    def ran(self, start: float, end: float, label: str) -> None:
        """A task a closed-form run of steps played on this clock (its totals settled with
        :meth:`settle_run`), kept in the history for the waits of tasks submitted after the run."""
        if self.keep_history:
            self.history.append((start, end, label))

    def recorded_busy(self) -> float:
        """The busy seconds the recorder holds for this process's track (0 without a recorder)."""
        return self.recorder.busy.get(self.track, 0.0) if self.recorder is not None else 0.0

    def ran_between(self, t0: float, t1: float) -> dict[str, float]:
        """Seconds of each task label this process ran between ``t0`` and ``t1``: what a task
        submitted at ``t0`` and started at ``t1`` waited behind (the rest of the wait, if any, was
        for a free core). Needs ``keep_history``."""
        assert self.keep_history, f"{self.name}: ran_between needs keep_history"
        history = self.history
        while history and history[0][1] <= t0:
            history.popleft()
        out: dict[str, float] = {}
        for start, end, label in history:
            if start >= t1:
                break
            overlap = min(end, t1) - max(start, t0)
            if overlap > 0:
                out[label] = out.get(label, 0.0) + overlap
        return out


def book(proc: CPUProcess, at: float, seconds: float, label: str) -> float:
    """``seconds`` of work on ``proc`` queued at ``at``; returns when it ends (``at`` itself, with no
    task booked, when there is no work: a message that costs nothing leaves no span)."""
    return proc.submit(at, seconds, label)[1] if seconds > 0 else at
