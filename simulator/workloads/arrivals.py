"""Request arrivals and lengths for every scenario kind: one module, one convention.

Conventions (the same for LLM, DiT and any later kind):

- ``workload.burstiness`` is the **coefficient of variation** (CV) of the inter-arrival gaps,
  as Vidur's gamma request-interval generator and the queueing literature use it: gamma gaps
  of shape k = 1/CV² and mean 1/rate. CV = 1 is Poisson, CV > 1 burstier, CV < 1 smoother.
- Every open-loop process's **first request arrives at t = 0**; the remaining arrivals follow
  at the drawn gaps (so Poisson, gamma, constant, all-at-once and trace replays start alike).
- Gaps are drawn first from the scenario's rng, before any token length, so two kinds with the
  same seed and the same arrival section draw the same gaps.

Arrival processes are classes behind the :data:`ARRIVALS` registry, keyed by the YAML name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.trace import fit_to_context, repeated_arrivals, repeated_rows, workload_rows
from ..errors import ConfigError
from .prefix import PrefixIds, trace_ids
from .sessions import draw_sessions, pooled_prompts, synthetic_ids


@dataclass
class RequestSpecs:
    """Arrays of what each request is: arrival time (NaN for closed-loop), prompt and output tokens, and
    the ids of its prompt's blocks where the workload says which prompts share a prefix (None where it
    does not: every prompt is then taken as unique), and its session in a multi-turn workload."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    prefix: PrefixIds | None = None
    session: np.ndarray | None = None
    """Each request's session (int64, 0-based) with ``workload.sessions``; None otherwise."""

    def __len__(self) -> int:
        return len(self.prompt)


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    """Arrival times whose first is 0 and whose successive differences are ``gaps[1:]``."""
    times = np.cumsum(gaps)
    return times - times[0]


class Arrival:
    """An arrival process: ``times(workload, n, rng)`` gives n arrival times (s) from 0."""

    open_loop = True

    def times(self, workload, n: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError


class Poisson(Arrival):
    """Exponential gaps of mean 1/rate (CV 1)."""

    def times(self, workload, n, rng):
        return _from_gaps(rng.exponential(1.0 / workload.rate, size=n))


class Gamma(Arrival):
    """Gamma gaps of mean 1/rate and coefficient of variation ``burstiness`` (shape 1/CV²)."""

    def times(self, workload, n, rng):
        cv = workload.burstiness
        shape = 1.0 / (cv * cv)
        return _from_gaps(rng.gamma(shape, 1.0 / (workload.rate * shape), size=n))


class Constant(Arrival):
    """Evenly spaced arrivals, 1/rate apart (CV 0)."""

    def times(self, workload, n, rng):
        return np.arange(n) / workload.rate


class AllAtOnce(Arrival):
    """Every request at t = 0 (an offline batch)."""

    def times(self, workload, n, rng):
        return np.zeros(n)


class Closed(Arrival):
    """Clients keep ``concurrency`` requests in flight: a request arrives when one finishes (NaN here)."""

    open_loop = False

    def times(self, workload, n, rng):
        return np.full(n, np.nan)


ARRIVALS: dict[str, Arrival] = {"poisson": Poisson(), "gamma": Gamma(), "constant": Constant(),
                                "all_at_once": AllAtOnce(), "closed": Closed()}
"""Arrival processes by their ``workload.arrival`` name (``trace`` replays a file's own times)."""


def staged_times(workload, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s, the first at 0) of a load profile: ``workload.stages`` back to back.

    Stage k sends ``int(rate_k x duration_k)`` requests whose gaps (drawn from ``workload.arrival``
    at rate_k) are scaled to sum to duration_k, so the stage ends exactly when the next begins.
    This is inference-perf's ConstantLoadTimer (inference_perf/loadgen/load_timer.py: exponential
    intervals "normalized to sum to the duration"), the generator behind its ``type: constant``
    stages; with ``arrival: constant`` the gaps are even. The whole profile is then shifted so its
    first request arrives at 0, like every other process here."""
    process = ARRIVALS[workload.arrival]
    out, start = [], 0.0
    for stage in workload.stages:
        n = stage.requests
        gaps = np.diff(process.times(_AtRate(workload, stage.rate), n + 1, rng))
        out.append(start + np.cumsum(gaps * (stage.duration / gaps.sum())))
        start += stage.duration
    times = np.concatenate(out)
    return times - times[0]


class _AtRate:
    """A workload seen at one stage's rate (its other fields, such as burstiness, unchanged)."""

    def __init__(self, workload, rate: float):
        self._workload, self.rate = workload, rate

    def __getattr__(self, name):
        return getattr(self._workload, name)


def arrival_times(workload, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s, the first at 0) of n requests; NaN where the closed loop decides."""
    if workload.stages:
        return staged_times(workload, rng)[:n]
    process = ARRIVALS.get(workload.arrival)
    if process is None:
        raise ValueError(f"arrival {workload.arrival!r} needs a trace")
    return process.times(workload, n, rng)


def open_loop_arrivals(workload, rng: np.random.Generator) -> np.ndarray | None:
    """Arrival times (s) of ``workload.requests`` for a kind without traces; None for ``closed``."""
    process = ARRIVALS.get(workload.arrival)
    if process is None:
        raise ConfigError(f"arrival {workload.arrival!r} is not supported by this scenario kind "
                          f"(use {', '.join(ARRIVALS)})", path="workload.arrival")
    for key in ("prefix", "sessions"):  # prompts that share prefixes: LLM workloads only
        if getattr(workload, key, None) is not None:
            raise ConfigError(f"workload.{key} shapes LLM prompts; this scenario kind has none, drop it",
                              path=f"workload.{key}")
    if not process.open_loop:
        return None
    return arrival_times(workload, workload.requests, rng)


def sample_tokens(spec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` token counts from a fixed number or a Distribution model."""
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    if spec.dist == "fixed":
        out = np.full(n, spec.value, dtype=np.int64)
    elif spec.dist == "uniform":
        out = rng.integers(spec.low, spec.high + 1, size=n)
    elif spec.dist == "random":  # vllm bench serve's random dataset (config.models.Distribution)
        low, high = spec.bounds()
        out = rng.integers(low, high + 1, size=n)
    else:
        out = np.rint(spec.median * np.exp(spec.sigma * rng.standard_normal(n))).astype(np.int64)
    out = np.maximum(out, 1)
    if spec.max is not None:
        out = np.minimum(out, spec.max)
    return out.astype(np.int64)


def make_requests(workload, rng: np.random.Generator, context: int | None = None) -> RequestSpecs:
    """Every request of a workload: lengths from the trace or the distributions, arrivals as configured.

    ``context``: the model's context window; with ``over_context: truncate_prompt`` prompts are cut to
    fit it (the loader has already rejected lengths that do not fit otherwise), and so are their prefix ids.

    Prefix ids (:class:`~simulator.workloads.prefix.PrefixIds`) come from a ``.jsonl`` trace's
    ``hash_ids``, or from ``workload.sessions`` / ``workload.prefix`` (drawn after every other draw);
    a CSV trace or plain synthetic lengths carry none (``prefix`` None)."""
    prefix = session = None
    if workload.trace:
        df = workload_rows(workload, limit=workload.requests)
        prompt, output, at, prefix = df.num_prefill_tokens, df.num_decode_tokens, df.arrived_at, trace_ids(df)
        n = len(df)
        if getattr(workload, "trace_repeat", False) and workload.requests > n:
            # Replayed again and again: request i is row i mod rows (config.trace.repeated_rows); each
            # repetition's prefix ids are shifted past the trace's, so repeats are new users.
            rows = repeated_rows(n, workload.requests)
            prompt, output, n = prompt[rows], output[rows], workload.requests
            at = repeated_arrivals(at, n) if workload.arrival == "trace" else at
            prefix = None if prefix is None else prefix.repeated(n)
        if workload.arrival == "trace":
            at = at * workload.trace_time_scale
            arrival = at - at[0]
        else:
            arrival = arrival_times(workload, n, rng)
    elif getattr(workload, "sessions", None) is not None:
        draw = draw_sessions(workload, rng, arrival_times, sample_tokens)
        arrival, prompt, output, session = draw.arrival, draw.prompt, draw.output, draw.session
        prefix = synthetic_ids(workload, prompt, draw.session, draw.first_prompt, rng)
    elif getattr(getattr(workload, "prefix", None), "prompts_per_group", None):
        n = workload.requests
        arrival = arrival_times(workload, n, rng)
        prompt, output, prefix = pooled_prompts(workload, n, rng, sample_tokens)
    else:
        n = workload.requests
        arrival = arrival_times(workload, n, rng)
        prompt = sample_tokens(workload.prompt_tokens, n, rng)
        output = sample_tokens(workload.output_tokens, n, rng)
        if getattr(workload, "prefix", None) is not None:
            prefix = synthetic_ids(workload, prompt, np.arange(n), prompt, rng)
    prompt = fit_to_context(prompt, output, context, workload.over_context)
    if prefix is not None:
        prefix = prefix.cut(prompt)
        prefix.check(prompt)
    return RequestSpecs(arrival.astype(float), prompt, output, prefix, session)
