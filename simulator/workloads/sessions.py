"""Synthetic workloads whose prompts share prefixes: multi-turn sessions and shared system prompts.

A session of T turns (``workload.sessions``) starts per the scenario's arrival process; turn k arrives
``think_time`` after turn k-1 arrived, and its prompt is the whole history: turn k-1's prompt, its
output and a new user message. The draws are made before the run (open loop: no feedback from when a
turn completes). Shared system prompts (``workload.prefix``) put one of G groups' first tokens at the
start of every stream (a request, or a session's history). Both become :class:`PrefixIds` through
:func:`~simulator.workloads.prefix.stream_ids`.

Every draw here comes after the draws a workload without these keys makes, from the same rng, so a
scenario that does not use them draws exactly what it drew before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .prefix import PrefixIds, stream_ids

DEFAULT_BLOCK_TOKENS = 16
"""Tokens per id when only ``sessions`` is set: the default of ``workload.prefix.block_tokens``
(config.models.DEFAULT_PREFIX_BLOCK_TOKENS, vLLM's KV block size)."""


def sample_seconds(spec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` durations (s) from a number or a TimeDistribution model (no draw for a number or fixed)."""
    if isinstance(spec, (int, float)):
        return np.full(n, float(spec))
    if spec.dist == "fixed":
        out = np.full(n, float(spec.value))
    elif spec.dist == "uniform":
        out = rng.uniform(spec.low, spec.high, size=n)
    elif spec.dist == "exponential":
        out = rng.exponential(spec.mean, size=n)
    else:
        out = spec.median * np.exp(spec.sigma * rng.standard_normal(n))
    if spec.max is not None:
        out = np.minimum(out, spec.max)
    return out


@dataclass
class SessionDraw:
    """Requests of a session workload in arrival order: arrival (s), prompt and output tokens, the session
    of each, and each session's first prompt (turn 1's message)."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    session: np.ndarray
    first_prompt: np.ndarray


def draw_sessions(workload, rng: np.random.Generator, start_times, sample_tokens) -> SessionDraw:
    """``workload.requests`` turns of ceil(requests / turns) sessions, in arrival order (ties: by session,
    then turn). Draws, in order: the sessions' start times (``start_times(workload, n, rng)``), every
    turn's message, every turn's output, the think times."""
    turns = workload.sessions.turns
    n = workload.requests
    count = -(-n // turns)
    starts = start_times(workload, count, rng)
    message = sample_tokens(workload.prompt_tokens, count * turns, rng).reshape(count, turns)
    output = sample_tokens(workload.output_tokens, count * turns, rng).reshape(count, turns)
    think = sample_seconds(workload.sessions.think_time, count * (turns - 1), rng).reshape(count, turns - 1)
    zero = np.zeros((count, 1))
    arrival = starts[:, None] + np.concatenate([zero, np.cumsum(think, axis=1)], axis=1)
    # turn k's prompt: messages 1..k and outputs 1..k-1
    history = np.concatenate([np.zeros((count, 1), dtype=np.int64), np.cumsum(output[:, :-1], axis=1)], axis=1)
    prompt = np.cumsum(message, axis=1) + history
    session = np.repeat(np.arange(count, dtype=np.int64), turns)
    turn = np.tile(np.arange(turns, dtype=np.int64), count)
    order = np.lexsort((turn, session, arrival.ravel()))[:n]
    return SessionDraw(arrival.ravel()[order], prompt.ravel()[order].astype(np.int64),
                       output.ravel()[order].astype(np.int64), session[order], message[:, 0].astype(np.int64))


def synthetic_ids(workload, prompt: np.ndarray, stream: np.ndarray, first_prompt: np.ndarray,
                  rng: np.random.Generator) -> PrefixIds:
    """Prefix ids of synthetic prompts, each the first ``prompt[i]`` tokens of stream ``stream[i]``.

    With ``workload.prefix``, each stream draws its group (uniform over ``groups``, after every other
    draw) and shares its first min(shared_tokens, first_prompt) tokens' whole blocks with the group."""
    spec = workload.prefix
    unit = spec.block_tokens if spec is not None else DEFAULT_BLOCK_TOKENS
    if spec is None or spec.shared_tokens == 0:
        return stream_ids(stream, prompt, unit)
    group = rng.integers(0, spec.groups, size=first_prompt.size)
    shared = np.minimum(first_prompt, spec.shared_tokens) // unit
    return stream_ids(stream, prompt, unit, shared, group, spec.shared_tokens // unit)


def pooled_prompts(workload, n: int, rng: np.random.Generator, sample_tokens) -> tuple:
    """A pool of prompts sent again and again: inference-perf's shared-prefix dataset.

    ``workload.prefix.prompts_per_group`` questions per group, each after its group's system prompt,
    make ``groups x prompts_per_group`` distinct prompts (lengths drawn once per prompt, group by
    group); they are shuffled once and request i sends prompt ``i mod pool`` of that order, as
    inference-perf's ``SharedPrefixDataGenerator`` does (``_generate_prompts`` shuffles its prompts,
    ``load_lazy_data`` takes ``data_index % len(self.prompts)``; kubernetes-sigs/inference-perf,
    inference_perf/datagen/shared_prefix_datagen.py). A repeated prompt has the same ids: every full
    block of it hits a prefix cache that kept it. Returns (prompt, output, prefix ids)."""
    spec = workload.prefix
    pool = spec.groups * spec.prompts_per_group
    prompt_of = sample_tokens(workload.prompt_tokens, pool, rng)
    output_of = sample_tokens(workload.output_tokens, pool, rng)
    order = rng.permutation(pool)
    which = order[np.arange(n) % pool]
    group = np.arange(pool) // spec.prompts_per_group  # the prompts in group order, as generated
    unit = spec.block_tokens
    shared = np.minimum(prompt_of, spec.shared_tokens) // unit
    prompt = prompt_of[which]
    return prompt, output_of[which], stream_ids(which, prompt, unit, shared, group, spec.shared_tokens // unit)
