"""How an engine's loop overlaps its CPU work with the GPU: one loop per ``serving.overlap`` mode.

Each mode is a generator function over an :class:`~simulator.pipelines.llm.engine.Engine`, named in
``OVERLAP_MODES``; the engine runs the one its settings name.

- ``sync`` (vLLM <= 0.5): step n's outputs are processed before step n+1 is scheduled.
- ``async_output`` (vLLM 0.6, PR #7049 / #7921): once step n's sampled ids are on the host, step n+1
  is scheduled and launched, and step n's outputs are processed while n+1 runs.
- ``async`` (async scheduling: vLLM V1 PR #19970 / #23569, SGLang's overlap scheduler, TensorRT-LLM's
  overlap scheduler): step n+1 is scheduled and launched before step n has finished at all.

Both overlapped modes cost one step of lag: a request that finished in step n still occupies a
slot in step n+1, as in the real engines. Multi-step scheduling (``serving.multi_step``) launches
several decode steps at once in ``sync`` and ``async_output`` and hands their outputs back in bulk.
"""

from __future__ import annotations

from .run_support import declare

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("overlap", owner="overlap")


def sync_loop(engine):
    """Schedule, run, process the outputs, repeat; with multi-step, a run of steps at a time."""
    while True:
        if not engine.sched.running and not engine.sched.waiting:
            yield from engine.idle()
        if engine.runs is not None:
            resume = engine.runs.run()
            if resume is not None:
                if resume > engine.env.now:
                    yield engine.env.timeout(resume - engine.env.now)
                continue
        steps = engine.launch_run()
        if not steps:
            yield from engine.idle()  # nothing fits (waiting requests blocked on KV): wait for new work
            continue
        if len(steps) > 1 and not steps[-1].done.processed:
            yield steps[-1].done  # a multi-step run's outputs come back once its last step's are on the host
        for step in steps:
            yield from engine.finish_step(step)


def async_scheduling_loop(engine):
    """Launch step n+1, then process step n's outputs (waiting for them to reach the host)."""
    pending = None
    while True:
        if not engine.sched.running and not engine.sched.waiting and pending is None:
            yield from engine.idle()
        if engine.runs is not None and pending is not None:
            got = engine.runs.run_lagged(pending)
            if got is not None:
                resume, pending = got
                if resume > engine.env.now:
                    yield engine.env.timeout(resume - engine.env.now)
                continue
        step, pending = pending, engine.launch()
        if step is None:
            if pending is None:
                yield from engine.idle()  # nothing fits (waiting requests blocked on KV)
            continue
        yield from engine.finish_step(step)


def async_output_loop(engine):
    """Wait for step n's sampled ids, launch step n+1, then process step n's outputs while it runs."""
    pending: list = []
    while True:
        if not engine.sched.running and not engine.sched.waiting and not pending:
            yield from engine.idle()
        if engine.runs is not None and len(pending) == 1:
            got = engine.runs.run_lagged(pending[0])
            if got is not None:
                resume, step = got
                if resume > engine.env.now:
                    yield engine.env.timeout(resume - engine.env.now)
                pending = [step]
                continue
        steps = engine.launch_run()
        for step in pending:
            yield from engine.finish_step(step, wait=False)
        if not steps:
            had, pending = bool(pending), []
            if had or (not engine.sched.running and not engine.sched.waiting):
                continue  # finishing the last steps may have freed what the scheduler needs
            yield from engine.idle()  # nothing fits (waiting requests blocked on KV)
            continue
        if not steps[-1].done.processed:
            yield steps[-1].done
        pending = steps


OVERLAP_MODES = {"sync": sync_loop, "async": async_scheduling_loop, "async_output": async_output_loop}
"""``serving.overlap`` -> the engine loop that runs it."""

SERIAL_MODES = frozenset({"sync", "async_output"})
"""The loops that launch step n+1 only once step n's sampled ids are on the host (each waits for the
step's ``done``, which follows its copy); ``async`` launches it before."""


def serial_steps(serving) -> bool:
    """Whether each step's GPU work begins after the previous step's copy to the host has ended: a
    serial loop, one step at a time (multi-step launches several, whose copies overlap the next)."""
    return serving.overlap in SERIAL_MODES and serving.multi_step == 1
