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
   bottleneck is (the server, a batch, a CPU process after the GPU): the mean latency of the
   last third of the requests (in arrival order) exceeds that of the middle third by at least
   ``GROWTH_FRACTION`` of what the rate gap predicts for a queue that grows without bound,
   (λ/μ − 1) × (mean arrival time of the last third − that of the middle third).

The first alone misreads a short burst that the system absorbs in one batch (the completions
then bunch at the end); the second alone misreads the warm-up of an empty system. The middle
third, not the first, is the baseline so that the warm-up does not count as growth. Measured on
200-request Poisson LLM runs (6 seeds each, capacity ~17.8 requests/s): no warning up to 98%
load, a warning in half of the runs at 110%, in all of them at 130%.
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
                     completed: np.ndarray, unit: str = "requests") -> str | None:
    """A warning when offered load exceeded capacity (see the module docstring), else None.

    ``arrival``: every request's arrival time (all of them, completed or not); ``finish``
    and ``latency``: each request's completion time and latency (read where ``completed``).
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
    d = np.asarray(latency, dtype=float)[completed][order]
    third = len(a) // 3
    mid, last = slice(third, 2 * third), slice(len(a) - third, None)
    predicted = (offered / sustained - 1) * float(a[last].mean() - a[mid].mean())
    grown = float(d[last].mean() - d[mid].mean())
    if predicted <= 0 or grown < GROWTH_FRACTION * predicted:
        return None
    return (f"offered load exceeds capacity: {unit} arrive at {offered:.4g}/s but complete at "
            f"{sustained:.4g}/s sustained, and latency grows through the run as queues build "
            f"(mean {fmt_time(float(d[mid].mean()))} in the middle third of arrivals, "
            f"{fmt_time(float(d[last].mean()))} in the last): latencies depend on the run's length")


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
