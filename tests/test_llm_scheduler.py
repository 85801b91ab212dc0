"""The token budget builds the step as vLLM V1's scheduler does: decodes first, then prefill chunks
up to the budget; long prompts split across steps shared with the running decodes; preemption from
the tail; and the budget moves TTFT and ITL when it binds."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.pipelines.llm.engine import RequestTable
from simulator.pipelines.llm.scheduler import Scheduler
from simulator.pipelines.llm.settings import EngineSettings


def settings(budget: int, *, max_batch: int = 256, chunked: bool = True, threshold: int = 0,
             block_size: int = 16) -> EngineSettings:
    return EngineSettings(max_batch, budget, block_size, chunked, "sync", "engine", 1, True, None,
                          long_prefill_token_threshold=threshold)


def table(prompts, outputs=None) -> RequestTable:
    n = len(prompts)
    return RequestTable(np.zeros(n), np.array(prompts), np.array(outputs or [100] * n))


def step(s: Scheduler):
    """Schedule one step and apply it as the engine does (computed tokens advance at launch)."""
    b = s.schedule()
    t = s.table
    t.computed[b.decode] = b.comp + 1
    for rid, p, n in b.chunks:
        t.computed[rid] = p + n
    return b


def test_a_prompt_longer_than_the_budget_is_chunked_next_to_the_running_decodes():
    # Three short requests are decoding; a 1,000-token prompt arrives with a budget of 256.
    t = table([10, 10, 10, 1000])
    s = Scheduler(t, settings(256), kv_blocks=10_000)
    for rid in range(3):
        s.waiting.append(rid)
    first = step(s)
    assert first.chunks == [(0, 0, 10), (1, 0, 10), (2, 0, 10)] and len(first.decode) == 0
    s.waiting.append(3)
    chunks = []
    for _ in range(4):
        b = step(s)
        assert list(b.decode) == [0, 1, 2]          # decodes first, one token each
        assert b.tokens == min(256, 3 + 1000 - sum(n for *_, n in chunks))
        chunks += b.chunks
    # 253 prompt tokens per step (256 - 3 decodes): 253, 253, 253, then the last 241.
    assert chunks == [(3, 0, 253), (3, 253, 253), (3, 506, 253), (3, 759, 241)]
    assert t.computed[3] == t.target[3] == 1000


def test_the_budget_sets_how_many_steps_a_prompt_takes():
    def steps_to_prefill(budget: int) -> int:
        t = table([1, 1, 3000])
        s = Scheduler(t, settings(budget), kv_blocks=10_000)
        s.waiting.extend([0, 1])
        step(s)
        s.waiting.append(2)
        n = 0
        while t.computed[2] < t.prompt[2]:
            step(s)
            n += 1
        return n

    # ceil(3000 / (budget - 2 decodes)) steps.
    assert [steps_to_prefill(b) for b in (1024, 2048, 8192)] == [3, 2, 1]


def test_budget_cuts_decodes_and_waiting_admission_stops_at_the_budget():
    t = table([5] * 6)
    s = Scheduler(t, settings(12), kv_blocks=10_000)
    s.waiting.extend(range(6))
    b = step(s)
    assert b.chunks == [(0, 0, 5), (1, 0, 5), (2, 0, 2)]   # the third is chunked to the 2 tokens left
    b = step(s)
    # Running first: 2 decodes and request 2's remaining 3 tokens, then admissions up to 12.
    assert list(b.decode) == [0, 1]
    assert b.chunks == [(2, 2, 3), (3, 0, 5), (4, 0, 2)]
    assert b.tokens == 12


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits():
    t = table([5, 20])
    s = Scheduler(t, settings(16, chunked=False), kv_blocks=10_000)
    s.waiting.extend([0, 1])
    b = step(s)
    assert b.chunks == [(0, 0, 5)] and list(s.waiting) == [1]


def test_long_prefill_threshold_caps_a_request_and_keeps_running_order():
    # vLLM clamps each request to the threshold; running requests are served in admission order,
    # so a partial prefill admitted before a decode takes its budget first.
    t = table([40, 3])
    s = Scheduler(t, settings(16, threshold=12), kv_blocks=10_000)
    s.waiting.extend([0, 1])
    b = step(s)
    assert b.chunks == [(0, 0, 12), (1, 0, 3)]
    b = step(s)
    assert b.chunks == [(0, 12, 12)] and list(b.decode) == [1]


def test_preemption_takes_the_tail_and_stops_admission():
    # Block size 4, 6 blocks: requests 0 and 1 hold 2 blocks each at 8 computed tokens, 2 free.
    t = table([8, 8, 4])
    s = Scheduler(t, settings(64, block_size=4), kv_blocks=5)
    s.waiting.extend([0, 1])
    step(s)
    assert s.kv_free == 1
    s.waiting.append(2)
    # Both decodes need a new block (8 % 4 == 0) and one is free: the tail (1) is preempted,
    # and no waiting request is admitted in a step that preempted.
    b = step(s)
    assert list(b.decode) == [0] and b.chunks == []
    assert list(s.waiting) == [1, 2] and t.preemptions[1] == 1 and t.computed[1] == 0
    assert s.kv_free == 5 - 3


def loaded(budget: int) -> dict:
    # Long prompts arriving on a busy replica: the budget binds.
    return {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "serving": {"max_batch": 64, "max_batched_tokens": budget, "overlap": "sync"},
            "workload": {"requests": 60, "arrival": "poisson", "rate": "12/s", "prompt_tokens": 3000,
                         "output_tokens": 64}}


def test_ttft_and_itl_move_with_the_budget_in_a_loaded_run():
    small, large = (simulator.run(loaded(b)).summary for b in (512, 8192))
    # A small budget splits each 3,000-token prompt over ~6 steps: TTFT rises, and the decodes'
    # steps stay short (no step carries a whole prompt), so the worst inter-token gaps shrink.
    assert small["ttft_ms"]["p50"] > 1.5 * large["ttft_ms"]["p50"]
    assert small["itl_ms"]["p99"] < large["itl_ms"]["p99"]
    assert small["steps"] > large["steps"]


def test_a_preempted_request_that_finishes_leaves_the_waiting_queue():
    """Async scheduling preempts from a step built before the previous one's outputs are processed:
    a request whose last token was in flight finishes while it waits, and must leave the queue
    (vLLM V1's stopped_preempted_reqs), not be admitted again to decode forever."""
    t = table([8, 8, 4], outputs=[5, 1, 5])
    s = Scheduler(t, settings(64, block_size=4), kv_blocks=5)
    s.waiting.extend([0, 1])
    step(s)  # both prompts computed; request 1's only token is sampled by this step
    s.waiting.append(2)
    step(s)  # built before that step's outputs are processed: preempts the tail, request 1
    assert list(s.waiting) == [1, 2]
    s.finish(np.array([1]))  # the first step's outputs: request 1 has its one token
    assert list(s.waiting) == [2] and s.running == [0]
    assert s.kv_free == 5 - 3 and t.blocks[1] == 0
