"""The last mile is what it costs, not where it is booked (issue 23): the one attribution on the
critical path, and the counterfactual run with the last mile free."""

import numpy as np
import pytest

import simulator
from simulator.hardware.cpu import CorePool, CPUProcess
from simulator.observe import attribution
from simulator.observe.records import LLM_LAST_MILE

BITES = "scenarios/llm/last_mile_bites.yaml"


def test_a_wait_on_a_process_is_split_by_what_ran_there():
    """A task submitted behind the last mile's work on its process waited on exactly that work,
    named by what ran: detokenization, output objects, messages and streaming."""
    proc = CPUProcess("engine0", CorePool(4), keep_history=True)
    proc.submit(0.0, 2e-3, "detokenize")
    proc.submit(0.0, 0.5e-3, "output")
    proc.submit(0.0, 0.25e-3, "send outputs")
    proc.submit(0.0, 3e-3, "stream")
    proc.submit(0.0, 1e-3, "tokenize")
    start, _ = proc.submit(1e-3, 1e-3, "schedule+launch")  # submitted 1 ms into the detokenization
    assert start == pytest.approx(6.75e-3)
    waited = attribution.wait_activity(proc, 1e-3, start)
    assert attribution.WAIT_PARTS == ("detokenize", "output", "ipc", "stream")
    assert waited == (pytest.approx(1e-3), pytest.approx(0.5e-3), pytest.approx(0.25e-3),
                      pytest.approx(3e-3))  # tokenization counts as scheduling
    assert attribution.wait_activity(proc, start, start) == (0.0, 0.0, 0.0, 0.0)


def test_a_window_sums_to_its_length():
    """Every category's part of a window, with a wait split five ways, adds up to the window."""
    rng = np.random.default_rng(1)
    n = 1000
    ws = rng.uniform(0, 1, n)
    a0 = ws + rng.uniform(-0.2, 0.2, n)
    s0 = a0 + rng.uniform(0, 0.1, n)
    a1 = s0 + rng.uniform(0, 0.1, n)
    g0 = np.maximum(a1, ws) + rng.uniform(0, 0.1, n)
    g1 = g0 + rng.uniform(0, 0.1, n)
    wait = s0 - a0
    waits = wait * 0.3, wait * 0.1, wait * 0.2, wait * 0.3
    pd1, pi, po, pe, px, pR = (ws + 0.01 * k for k in range(1, 7))
    c = attribution.cut(ws, pd1, pi, po, pe, a0, a1, s0, g0, g1, np.full(n, 0.01), *waits)
    bx, b3 = attribution.receipt(px, pR, c)
    total = sum(attribution.step_parts(c).values()) + sum(attribution.receipt_parts(bx, b3, c))
    np.testing.assert_allclose(total, g1 - ws, rtol=0, atol=1e-12)


def test_a_window_names_each_milestone_gap():
    """A window whose previous token ran its whole path before the step: each gap between its
    milestones is its own category, in order: d2h, ipc, detokenize, output, ipc, stream, queue."""
    one = np.array([0.0])
    ws, marks = one, [one + t for t in (1.0, 3.0, 6.0, 10.0, 15.0, 21.0)]  # d1, i, o, e, x, R
    a0, s0, a1, g0, g1 = (one + t for t in (30.0, 30.0, 31.0, 31.0, 33.0))
    c = attribution.cut(ws, *marks[:4], a0, a1, s0, g0, g1, one, one, one, one, one)
    bx, b3 = attribution.receipt(marks[4], marks[5], c)
    parts = attribution.step_parts(c)
    ipc, stream, queue = attribution.receipt_parts(bx, b3, c)
    assert {k: float(v[0]) for k, v in parts.items()} == {
        "d2h": 1.0, "ipc": 2.0, "detokenize": 3.0, "output": 4.0, "stream": 0.0, "schedule": 1.0,
        "queue": 0.0, "compute": 2.0, "comm": 0.0}
    assert (float(ipc[0]), float(stream[0]), float(queue[0])) == (5.0, 6.0, 9.0)
    after = attribution.after_parts(c, bx, b3, one + 12.0)  # received its first token at 12
    assert tuple(float(v[0]) for v in after) == (0.0, 0.0, 0.0, 3.0, 6.0)  # d2h, det, output, ipc, stream


def _bites(detokenizer: str) -> dict:
    return simulator.run(BITES, {"workload.concurrency": 64, "workload.requests": 512,
                                 "serving.detokenizer": detokenizer, "record_spans": False}).summary


def test_booking_the_same_work_under_another_process_leaves_the_share():
    """last_mile_bites (vLLM 0.5: the API server shares the engine's process) detokenizing in the engine
    and in the API server: the same times, so the same last-mile share (it was 21% and 0.2%)."""
    eng, api = _bites("engine"), _bites("api_server")
    assert api["itl_ms"]["mean"] == pytest.approx(eng["itl_ms"]["mean"], rel=1e-3)
    assert eng["itl_last_mile_share"] > 0.3
    assert api["itl_last_mile_share"] == pytest.approx(eng["itl_last_mile_share"], abs=0.01)
    assert api["last_mile_share"] == pytest.approx(eng["last_mile_share"], abs=0.01)
    # the counterfactual agrees with the attribution where the last mile sits on the critical path
    for s in (eng, api):
        assert s["last_mile_cost"]["itl_share"] == pytest.approx(s["itl_last_mile_share"], abs=0.02)


def test_one_api_server_bottleneck_is_large_and_the_counterfactual_buys_at_least_a_second_server():
    """Short prompts on a B200 at concurrency 1,024 with vLLM V1's layout: one API server sets the
    token rate, so the last mile is most of ITL, and making it free gains at least what a second
    API server buys."""
    over = {"serving.engine": "vllm-v1", "serving.overlap": "async", "serving.detokenizer": "api_server",
            "serving.api_server_process": "own", "workload.concurrency": 1024, "workload.requests": 2048,
            "record_spans": False}
    one = simulator.run(BITES, over).summary
    two = simulator.run(BITES, {**over, "serving.api_servers": 2}, last_mile_cost=False).summary
    assert one["itl_last_mile_share"] > 0.5
    second_server = two["throughput"]["output_tokens_per_s"] / one["throughput"]["output_tokens_per_s"] - 1
    assert second_server > 0.3
    assert one["last_mile_cost"]["throughput_gain"] >= second_server


TWO = {"model": {"base": "llama-3-8b", "layers": 2}, "serving.engine": "reference",
       "serving.api_server_process": "engine", "serving.detokenizer": "api_server",
       "hardware.cpu.detokenize_per_token": "1 ms", "hardware.cpu.output_per_request": "0 ms",
       "hardware.cpu.stream_per_chunk": "2 ms", "hardware.cpu.detokenize_step_fixed": "0 ms",
       "hardware.cpu.request_overhead": "0 ms", "hardware.cpu.tokenize_per_token": "0 ms",  # one prefill step
       "workload.requests": 2, "workload.arrival": "all_at_once", "workload.prompt_tokens": 16,
       "workload.output_tokens": 2, "record_spans": False}


def test_two_requests_closed_form():
    """Two requests, two tokens each, their API server in the engine's process: after the prefill step
    the decode step's scheduling waits 2 ms behind detokenizing both tokens and 4 ms behind their two
    chunks, so each request's detokenization is 2 + 2 ms (that wait and its last token's) and its
    stream 4 ms plus its last chunk's place in the stream (2 or 4 ms) and the client link; what the
    counterfactual saves on each request's E2E is exactly its attributed last mile."""
    base = simulator.run(None, TWO, last_mile_cost=False)
    free = simulator.run(None, {**TWO, "serving.last_mile": "free"}, last_mile_cost=False)
    b = base.breakdown
    assert base.summary["steps"] == 2  # both prompts in one step, both second tokens in the next
    np.testing.assert_allclose(b["detokenize"], [4e-3, 4e-3], rtol=0, atol=1e-12)
    link = b["stream"].to_numpy() - np.array([6e-3, 8e-3])  # the client link's time, the same for both
    assert link[0] == pytest.approx(link[1], abs=1e-12) and 0 < link[0] < 1e-3
    assert (b["d2h"] > 0).all()
    assert (b[["output", "ipc"]].to_numpy() == 0).all()  # no output objects, no process crossed
    last_mile = b[list(LLM_LAST_MILE)].sum(axis=1).to_numpy()
    saved = base.requests["e2e_s"].to_numpy() - free.requests["e2e_s"].to_numpy()
    np.testing.assert_allclose(saved, last_mile, rtol=0, atol=1e-12)
    assert (free.breakdown[list(LLM_LAST_MILE)].to_numpy() == 0).all()
    np.testing.assert_allclose(b.drop(columns="e2e_s").sum(axis=1), b["e2e_s"], rtol=0, atol=1e-12)


def test_last_mile_cost_is_in_every_llm_summary_and_deterministic():
    s1 = simulator.run(None, {"workload.requests": 40}).summary
    s2 = simulator.run(None, {"workload.requests": 40}).summary
    assert s1["last_mile_cost"] == s2["last_mile_cost"]
    c = s1["last_mile_cost"]
    assert c["free_status"] == "ok"
    assert c["e2e_ms"]["mean"] > 0  # the default stack's last mile costs something
    assert "last_mile_cost" not in simulator.run(None, {"workload.requests": 40}, last_mile_cost=False).summary
    assert "last_mile_cost" not in simulator.run(None, {"workload.requests": 40,
                                                        "serving.last_mile": "free"}).summary


ONE = {"model": {"base": "llama-3-8b", "layers": 2}, "serving.engine": "reference",
       "serving.api_server_process": "own", "serving.detokenizer": "engine", "serving.overlap": "sync",
       "hardware.cpu.detokenize_per_token": "1 ms", "hardware.cpu.output_per_request": "0.5 ms",
       "hardware.cpu.stream_per_chunk": "2 ms", "hardware.cpu.detokenize_step_fixed": "0 ms",
       "hardware.cpu.ipc_per_message": "1 ms", "hardware.cpu.ipc_per_byte": "0 ms",
       "hardware.cpu.request_overhead": "0 ms", "hardware.cpu.tokenize_per_token": "0 ms",
       "workload.requests": 1, "workload.arrival": "all_at_once", "workload.prompt_tokens": 16,
       "workload.output_tokens": 2, "record_spans": False}


def test_output_objects_and_messages_are_their_own_categories():
    """One request, two tokens, detokenized in the engine, streamed by an API server in its own
    process: each token is detokenized (1 ms), its output built (0.5 ms) and sent (1 ms at each end).
    The first token's chain holds the engine's loop until its output is sent (the loop waits, sync),
    so its detokenization, output and send are on the critical path while its receipt overlaps the
    next step; the last token's whole path counts: detokenize 2 ms, output 1 ms, ipc 1 + 2 ms."""
    r = simulator.run(None, ONE, last_mile_cost=False)
    b = r.breakdown
    assert r.summary["steps"] == 2
    np.testing.assert_allclose(b["detokenize"], [2e-3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(b["output"], [1e-3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(b["ipc"], [3e-3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.drop(columns="e2e_s").sum(axis=1), b["e2e_s"], rtol=0, atol=1e-12)
    share = r.summary["breakdown_share"]
    assert share["output"] > 0 and share["ipc"] > share["output"]
