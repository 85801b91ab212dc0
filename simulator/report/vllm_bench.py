"""An LLM run in ``vllm bench serve``'s terms: its printed result block and its ``--save-result`` JSON keys.

Defined as vLLM 0.33.0 defines them (``vllm/benchmarks/serve.py``: ``benchmark`` prints the block,
``process_one_metric`` each metric's mean, median and chosen percentiles, ``--metric-percentiles``
defaulting to 99, over ``ttft,tpot,itl`` for generative models; ``calculate_metrics``: TPOT per
request as (latency - TTFT) / (output tokens - 1), ITL one gap per received chunk, throughputs over
the benchmark's duration). The numbers are the run's own: TTFT, TPOT and E2E per completed request,
ITL per received chunk (``observe.itl``), so a dashboard that reads vLLM's JSON reads lastmile's.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

METRICS = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
           ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))
DEFAULT_METRICS = ("ttft", "tpot", "itl")
DEFAULT_PERCENTILES = (99.0,)


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    """``--percentiles 50,90,99`` as numbers in (0, 100]; a one-line error otherwise."""
    if not text:
        return DEFAULT_PERCENTILES
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise ConfigError(f"percentiles are numbers separated by commas, got {text!r}", file="--percentiles") from None
    if not values or any(not 0 < p <= 100 for p in values):
        raise ConfigError(f"percentiles lie in (0, 100], got {text!r}", file="--percentiles")
    return values


def _samples(result) -> dict[str, np.ndarray]:
    """Each metric's samples in seconds, completed requests only."""
    req = result.requests
    done = req["completed"].to_numpy(bool)
    tpot = req["tpot_s"].to_numpy(float)[done]
    itl = result.itl if result.itl is not None else np.empty(0)
    return {"ttft": req["ttft_s"].to_numpy(float)[done], "tpot": tpot[np.isfinite(tpot)],
            "itl": np.asarray(itl, dtype=float), "e2el": req["e2e_s"].to_numpy(float)[done]}


def result_json(result, percentiles=DEFAULT_PERCENTILES, metrics=DEFAULT_METRICS) -> dict:
    """The scalar keys ``vllm bench serve --save-result`` writes, from an LLM run (the per-request
    lists it also writes are left out: ``requests.csv`` holds them)."""
    if result.kind != "llm":
        raise ConfigError(f"vllm bench serve's metrics are an LLM run's, not a {result.kind} run's", file="--format")
    s = result.summary
    tokens, thr = s.get("tokens") or {}, s.get("throughput") or {}
    out = {"duration": s.get("duration_s"), "completed": s.get("requests_completed"),
           "failed": (s.get("requests_total") or 0) - (s.get("requests_completed") or 0),
           "total_input_tokens": tokens.get("input_total"), "total_output_tokens": tokens.get("output_total"),
           "request_throughput": thr.get("requests_per_s"),
           "request_goodput": (s.get("goodput") or {}).get("requests_per_s"),
           "output_throughput": thr.get("output_tokens_per_s"), "total_token_throughput": thr.get("total_tokens_per_s")}
    samples = _samples(result)
    for key in metrics:
        v = samples[key] * 1e3
        out[f"mean_{key}_ms"] = float(np.mean(v)) if len(v) else None
        out[f"median_{key}_ms"] = float(np.median(v)) if len(v) else None
        out[f"std_{key}_ms"] = float(np.std(v)) if len(v) else None
        for p in percentiles:
            out[f"p{_word(p)}_{key}_ms"] = float(np.percentile(v, p)) if len(v) else None
    return out


def _word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def result_block(result, percentiles=DEFAULT_PERCENTILES, metrics=DEFAULT_METRICS) -> str:
    """The block ``vllm bench serve`` prints at the end of a run, for this run."""
    r = result_json(result, percentiles, metrics)
    w = result.scenario.workload

    def line(label: str, value, spec: str = "") -> str:
        shown = "-" if value is None else format(value, spec)
        return "{:<40} {:<10}".format(label, shown)

    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             line("Successful requests:", r["completed"]), line("Failed requests:", r["failed"])]
    if w.concurrency is not None:
        lines.append(line("Maximum request concurrency:", w.concurrency))
    if w.arrival in ("poisson", "gamma", "constant") and w.rate is not None:
        lines.append(line("Request rate configured (RPS):", w.rate, ".2f"))
    lines += [line("Benchmark duration (s):", r["duration"], ".2f"),
              line("Total input tokens:", r["total_input_tokens"]),
              line("Total generated tokens:", r["total_output_tokens"]),
              line("Request throughput (req/s):", r["request_throughput"], ".2f"),
              line("Request goodput (req/s):", r["request_goodput"], ".2f"),
              line("Output token throughput (tok/s):", r["output_throughput"], ".2f"),
              line("Total token throughput (tok/s):", r["total_token_throughput"], ".2f")]
    for key, name, header in METRICS:
        if key not in metrics:
            continue
        lines += ["{s:{c}^{n}}".format(s=header, n=50, c="-"),
                  line(f"Mean {name} (ms):", r[f"mean_{key}_ms"], ".2f"),
                  line(f"Median {name} (ms):", r[f"median_{key}_ms"], ".2f")]
        lines += [line(f"P{_word(p)} {name} (ms):", r[f"p{_word(p)}_{key}_ms"], ".2f") for p in percentiles]
    lines.append("=" * 50)
    return "\n".join(lines)
