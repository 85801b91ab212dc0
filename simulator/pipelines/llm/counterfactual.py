"""The last mile's cost as a counterfactual: the same scenario and seed with the last mile made free.

The attributed share (``breakdown_share``) says where a request's time went; this says what a user
would gain if the outputs' path cost nothing (``serving.last_mile: free``: the D2H copy of sampled
ids, detokenization, output objects, the outputs' messages between processes, SSE chunks and the
client link), with everything else (the workload, the GPU, scheduling, the requests' own path in)
unchanged. It cannot be moved by booking work under another process: only by changing a time.
"""

from __future__ import annotations

METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
STATS = ("mean", "p50", "p99")


def free_scenario(scenario):
    """The counterfactual of ``scenario``: its last mile free, no spans (only its summary is read)."""
    serving = scenario.serving.model_copy(update={"last_mile": "free"})
    return scenario.model_copy(update={"serving": serving, "record_spans": False})


def _delta(base, free) -> float | None:
    return None if base is None or free is None else base - free


def last_mile_cost(base: dict, free: dict) -> dict:
    """The summary block: per metric and statistic, what the last mile costs (the run's figure minus
    the counterfactual's, in ms); the throughput the counterfactual gains (its output tokens/s over
    the run's, minus 1); ITL and E2E cost as shares of the run's means (to read beside the attributed
    ``itl_last_mile_share`` and ``last_mile_share``); and the counterfactual's status."""
    out: dict = {}
    for m in METRICS:
        b, f = base.get(m) or {}, free.get(m) or {}
        out[m] = {s: _delta(b.get(s), f.get(s)) for s in STATS}
    bt = (base.get("throughput") or {}).get("output_tokens_per_s")
    ft = (free.get("throughput") or {}).get("output_tokens_per_s")
    out["throughput_gain"] = ft / bt - 1.0 if bt and ft is not None else None

    def share(metric):
        cost, mean = out[metric]["mean"], (base.get(metric) or {}).get("mean")
        return cost / mean if cost is not None and mean else None

    out["itl_share"], out["e2e_share"] = share("itl_ms"), share("e2e_ms")
    out["free_status"] = free.get("status")
    return out


def counterfactual_of(scenario):
    """The scenario to simulate beside ``scenario`` for its ``last_mile_cost`` (None where it is itself
    the counterfactual)."""
    return None if scenario.serving.last_mile == "free" else free_scenario(scenario)


def add_last_mile_cost(result, free_summary: dict) -> None:
    """Add ``last_mile_cost`` to ``result.summary`` from the counterfactual's summary (the caller
    simulates no counterfactual for a run that did not run: ``status: oom``)."""
    result.summary["last_mile_cost"] = last_mile_cost(result.summary, free_summary)
