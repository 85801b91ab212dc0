"""Request generation: arrival times and prompt/output lengths from a workload section."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.trace import fit_to_context, read_trace


@dataclass
class RequestSpecs:
    """Arrays of what each request is: arrival time (NaN for closed-loop), prompt and output tokens."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt)


def sample_tokens(spec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` token counts from a fixed number or a Distribution model."""
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    if spec.dist == "fixed":
        out = np.full(n, spec.value, dtype=np.int64)
    elif spec.dist == "uniform":
        out = rng.integers(spec.low, spec.high + 1, size=n)
    else:
        out = np.rint(spec.median * np.exp(spec.sigma * rng.standard_normal(n))).astype(np.int64)
    out = np.maximum(out, 1)
    if spec.max is not None:
        out = np.minimum(out, spec.max)
    return out.astype(np.int64)


def arrival_times(workload, n: int, rng: np.random.Generator) -> np.ndarray:
    """Open-loop arrival times (seconds from 0); NaN where the closed loop decides."""
    kind = workload.arrival
    if kind == "poisson":
        gaps = rng.exponential(1.0 / workload.rate, size=n)
    elif kind == "gamma":
        shape = workload.burstiness
        gaps = rng.gamma(shape, 1.0 / (workload.rate * shape), size=n)
    elif kind == "constant":
        gaps = np.full(n, 1.0 / workload.rate)
    elif kind == "all_at_once":
        return np.zeros(n)
    elif kind == "closed":
        return np.full(n, np.nan)
    else:
        raise ValueError(f"arrival {kind!r} needs a trace")
    times = np.cumsum(gaps)
    return times - times[0]


def make_requests(workload, rng: np.random.Generator, context: int | None = None) -> RequestSpecs:
    """Every request of a workload: lengths from the trace or the distributions, arrivals as configured.

    ``context``: the model's context window; with ``over_context: truncate_prompt`` prompts are cut to
    fit it (the loader has already rejected lengths that do not fit otherwise)."""
    if workload.trace:
        df = read_trace(workload.trace, limit=workload.requests)
        prompt = df["num_prefill_tokens"].to_numpy(np.int64)
        output = df["num_decode_tokens"].to_numpy(np.int64)
        n = len(df)
        if workload.arrival == "trace":
            at = df["arrived_at"].to_numpy(float) * workload.trace_time_scale
            arrival = at - at[0]
        else:
            arrival = arrival_times(workload, n, rng)
    else:
        n = workload.requests
        arrival = arrival_times(workload, n, rng)
        prompt = sample_tokens(workload.prompt_tokens, n, rng)
        output = sample_tokens(workload.output_tokens, n, rng)
    prompt = fit_to_context(prompt, output, context, workload.over_context)
    return RequestSpecs(arrival.astype(float), prompt, output)
