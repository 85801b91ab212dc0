"""What a run must say about itself: whether every request completed, and whether it was overloaded.

Every kind of run ends with :func:`assess`, which puts ``requests_total``, ``requests_completed``,
``status`` and (when there is something to say) ``warnings`` into the summary:

- ``status: ok``: every request completed.
- ``status: truncated``: ``max_sim_time`` stopped the run while work was still scheduled.
- ``status: incomplete``: the simulation ran out of events with requests unfinished (for
  example a receipt time that overflowed to infinity).

Metrics always cover only the completed requests; when none completed they are null, never
NaN, and a warning says so. Any other non-finite number in the summary (a clock overflowed by
absurd timing values) becomes null, with a warning naming the keys.

Overload (:func:`overload_warning`) is judged on open-loop runs only, from two signs that
must agree, over the completed requests:

1. the **offered rate** λ = (arrivals − 1) / (last arrival − first arrival) exceeds the
   **sustained throughput** μ = (completions − 1) / (last completion − first completion) by
   more than ``RATE_MARGIN``; and
2. the **queueing delay grows through the run**, read from the latency (arrival to
   completion), whose growth is the growth of every queue on the path, wherever the
   bottleneck is (the server, a batch, a CPU process after the GPU), or from the time to the
   first token, which the queue before the engine sets alone (the end-of-run drain, when
   arrivals stop and the last requests decode in smaller batches, can hide the latency's
   growth but not this one's): the mean latency of the last third of the requests (in arrival
   order) exceeds that of the middle third by at least ``GROWTH_FRACTION`` of what the rate gap
   predicts for a queue that grows without bound, (λ/μ − 1) × (mean arrival time of the last
   third − that of the middle third); or the mean time to the first token grows by at least
   ``FIRST_SLOPE`` of that arrival-time difference (the engine admits faster than it completes,
   so that queue grows at the admission rate's gap, not the completion rate's).

The first alone misreads a short burst that the system absorbs in one batch (the completions
then bunch at the end); the second alone misreads the warm-up of an empty system. The middle
third, not the first, is the baseline so that the warm-up does not count as growth. Measured
(2026-12-01) on 200-request Poisson runs of the default scenario with 128-token prompts, 64-token
outputs and ``max_batch: 8`` at 80, 98, 110 and 130% of 17.8 requests/s, 6 seeds each: 0, 0, 0
and 4 of 6 runs warn, with or without the first-token sign; the default scenario's 300 requests
at 60/s (5 s of arrivals, TTFT 0.56 -> 1.7 -> 2.9 s by thirds, latency falling as the drain
empties the batch) warn by the first-token sign alone. When a run is overloaded and a CPU process
was busy ``SATURATED`` of it (one API server in front of many replicas), the warning names it.
"""

from __future__ import annotations

import math

import numpy as np

from ..units import fmt_time

MIN_REQUESTS = 12
"""Fewest completed requests the overload criterion judges (thirds of at least four)."""
RATE_MARGIN = 0.10
"""Arrivals must outpace completions by more than this fraction."""
GROWTH_FRACTION = 0.5
"""Share of the rate gap's predicted delay growth that the observed growth must reach."""
FIRST_SLOPE = 0.1
"""Seconds the mean time to first output must grow per second of arrivals (middle third to last):
the queue before the engine growing at a tenth of the arrivals' pace, a rate 10% over what admits
them; a stable server's grows by nothing on average."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def completion_status(total: int, completed: int, cut: bool, max_sim_time: float | None,
                      unit: str = "request") -> tuple[str, list[str]]:
    """The run's status and its warnings about unfinished requests.

    ``cut``: the run stopped at ``max_sim_time`` with events still scheduled.
    """
    if completed >= total:
        return "ok", []
    missing = total - completed
    if cut:
        status = "truncated"
        head = (f"run truncated at max_sim_time = {fmt_time(max_sim_time)}: "
                f"{missing} of {_plural(total, unit)} did not complete")
    else:
        status = "incomplete"
        head = (f"{missing} of {_plural(total, unit)} did not complete (the simulation ran out of "
                "events before they finished)")
    if completed == 0:
        return status, [head + "; no latency metrics (they are null)"]
    return status, [head + f"; metrics cover the {completed} that did"]


def was_cut(env, max_sim_time: float | None) -> bool:
    """True when ``env.run(until=max_sim_time)`` returned with events still scheduled."""
    return max_sim_time is not None and env.peek() != math.inf


def _rate(times: np.ndarray) -> float | None:
    """Events per second over the span of ``times`` (None when they do not span any time)."""
    if len(times) < 2:
        return None
    span = float(times.max() - times.min())
    return (len(times) - 1) / span if span > 0 else None


def overload_warning(arrival: np.ndarray, finish: np.ndarray, latency: np.ndarray,
                     completed: np.ndarray, unit: str = "requests", first=None) -> str | None:
    """A warning when offered load exceeded capacity (see the module docstring), else None.

    ``arrival``: every request's arrival time (all of them, completed or not); ``finish``
    and ``latency``: each request's completion time and latency (read where ``completed``);
    ``first``: each request's wait for its first output (TTFT), read the same way where given.
    """
    arrival = np.asarray(arrival, dtype=float)
    completed = np.asarray(completed, dtype=bool) & np.isfinite(arrival)
    if int(completed.sum()) < MIN_REQUESTS:
        return None
    offered = _rate(arrival[np.isfinite(arrival)])
    sustained = _rate(np.asarray(finish, dtype=float)[completed])
    if offered is None or sustained is None or offered <= (1 + RATE_MARGIN) * sustained:
        return None
    order = np.argsort(arrival[completed], kind="stable")
    a = arrival[completed][order]
    third = len(a) // 3
    mid, last = slice(third, 2 * third), slice(len(a) - third, None)
    span = float(a[last].mean() - a[mid].mean())
    predicted = (offered / sustained - 1) * span
    if predicted <= 0:
        return None
    for name, values, needed in (("latency", latency, GROWTH_FRACTION * predicted),
                                 ("time to first output", first, FIRST_SLOPE * span)):
        if values is None:
            continue
        d = np.asarray(values, dtype=float)[completed][order]
        if float(d[last].mean() - d[mid].mean()) >= needed:
            return (f"offered load exceeds capacity: {unit} arrive at {offered:.4g}/s but complete at "
                    f"{sustained:.4g}/s sustained, and {name} grows through the run as queues build "
                    f"(mean {fmt_time(float(d[mid].mean()))} in the middle third of arrivals, "
                    f"{fmt_time(float(d[last].mean()))} in the last): latencies depend on the run's length")
    return None


SATURATED = 0.90
"""A CPU process busy at least this share of the run is named as the bottleneck when a run is overloaded."""


def saturated_hint(utilization: dict) -> str | None:
    """The busiest CPU process when it was busy at least ``SATURATED`` of the run: what to add."""
    cpus = {k: v for k, v in utilization.items() if k.startswith("cpu:") and v is not None}
    if not cpus:
        return None
    track, busy = max(cpus.items(), key=lambda kv: kv[1])
    if busy < SATURATED:
        return None
    what = ("more API servers (serving.api_servers)" if "api_server" in track else
            "a lighter host path (serving.engine, serving.detokenizer) or more replicas")
    return f"{track[4:]} was busy {100 * busy:.1f}% of the run, the bottleneck: {what} would serve more"


def _non_finite(d: dict, prefix: str = "") -> list[str]:
    """Replace every non-finite float in ``d`` (nested) by None; return the key paths replaced."""
    bad = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            bad += _non_finite(v, path + ".")
        elif isinstance(v, float) and not math.isfinite(v):
            d[k] = None
            bad.append(path)
    return bad


def assess(summary: dict, total: int, completed: int, cut: bool, max_sim_time: float | None,
           extra: list[str] | None = None, unit: str = "request") -> dict:
    """Write ``requests_total``, ``requests_completed``, ``status`` and ``warnings`` into ``summary``."""
    status, warnings = completion_status(total, completed, cut, max_sim_time, unit)
    warnings += [w for w in (extra or []) if w]
    bad = _non_finite(summary)
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        warnings.append(f"non-finite results reported as null: {', '.join(bad[:4])}{more} "
                        "(timing values too large for the simulated clock?)")
    summary["requests_total"] = int(total)
    summary["requests_completed"] = int(completed)
    if summary.get("status") in (None, "ok"):
        summary["status"] = status
    if warnings:
        summary["warnings"] = list(summary.get("warnings", [])) + warnings
    return summary
