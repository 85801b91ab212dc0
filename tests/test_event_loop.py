"""vLLM V1's API server as an asyncio event loop (``pipelines/llm/event_loop.py``): its turns, hand-traced
on a tiny SimPy run, and what they do to a served run."""

from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from simulator.api import run
from simulator.errors import LastmileError
from simulator.hardware.cpu import CorePool, CPUProcess
from simulator.pipelines.llm.event_loop import AsyncioServer, Message, PerOutputAsyncioServer, slices


class _Frontend:
    """What a loop asks of the frontend: its env, its server's process, the costs, and where rows go."""

    def __init__(self, fixed=1.0, per_chunk=0.5, intake=0.25):
        self.env = simpy.Environment()
        self.servers = [CPUProcess("api", CorePool(1))]
        self.cpu = SimpleNamespace(detokenize_step_fixed=fixed, detokenize_per_token=0.0, output_per_request=0.0,
                                   stream_per_chunk=per_chunk)
        self.intake = intake
        self.rows = []  # (step, request, chunk written at or None where held/merged, env.now)
        self.taken = []  # (request, tokenized start, end)

    def receive_costs(self, counts):
        return {}

    def deliver_entries(self, msg, idx):
        for i in idx.tolist():
            at = msg.sent_at[i]
            self.rows.append((msg.step, int(msg.emit[i]), None if np.isnan(at) else float(at), self.env.now))

    def take_in(self, rid, loop):
        self.taken.append((rid, *loop.book(self.intake, "tokenize")))


def _message(step, rids, send=None, made=None):
    emit = np.asarray(rids, dtype=np.int64)
    return Message(step, emit, send, None, None, np.full(len(rids), step + 1), None, made)


def _play(fe, loop, events):
    """Deliver ``events`` ((time, 'msg', Message) or (time, 'req', rid)) at their times and run to the end."""
    for at, kind, payload in events:
        def arrive(_ev, kind=kind, payload=payload):
            (loop.message if kind == "msg" else loop.request)(fe.env.now, payload)
        fe.env.timeout(at).callbacks.append(arrive)
    fe.env.run()


def test_the_loops_are_the_ones_the_config_names():
    from typing import get_args

    from simulator.config.models import Serving
    from simulator.pipelines.llm.frontend import API_SERVER_LOOPS
    assert set(API_SERVER_LOOPS) == set(get_args(Serving.model_fields["api_server_loop"].annotation))


def test_slices_follow_array_split():
    assert slices(5) == [(0, 5)]
    assert slices(128) == [(0, 128)]
    assert slices(300) == [(0, 100), (100, 200), (200, 300)]
    assert slices(129) == [(0, 65), (65, 129)]


def test_reader_and_handler_alternate_when_one_message_waits():
    """Messages at 0, 0.5 and 1.2 s, one each time the reader runs: every output leaves alone.

    0: reader, handler (1 s) -> 1.0; streams 0, 1 (0.5 s each) -> 1.5, 2.0, reader takes step 1;
    handler -> 3.0; streams -> 3.5, 4.0 (the reader, polled at 2.0, took step 2 behind them); handler -> 5.0;
    streams -> 5.5, 6.0."""
    fe = _Frontend()
    loop = AsyncioServer(fe, 0)
    _play(fe, loop, [(0.0, "msg", _message(0, [0, 1])), (0.5, "msg", _message(1, [0, 1])),
                     (1.2, "msg", _message(2, [0, 1]))])
    assert [(s, r, at) for s, r, at, _ in fe.rows] == [
        (0, 0, 1.5), (0, 1, 2.0), (1, 0, 3.5), (1, 1, 4.0), (2, 0, 5.5), (2, 1, 6.0)]
    assert all(now <= at for _, _, at, now in fe.rows)  # recorded when written, never after
    assert fe.servers[0].busy == pytest.approx(3 * 1.0 + 6 * 0.5)


def test_outputs_merge_when_the_reader_finds_two_messages():
    """Steps 1 and 2 both arrive while the handler processes step 0: the reader takes both, the handler
    processes them one after the other without yielding, and each stream writes one chunk with both
    tokens (step 1's rows are held, step 2's carry the chunk)."""
    fe = _Frontend()
    loop = AsyncioServer(fe, 0)
    _play(fe, loop, [(0.0, "msg", _message(0, [0, 1])), (0.5, "msg", _message(1, [0, 1])),
                     (0.8, "msg", _message(2, [0, 1]))])
    # 1.0: streams (1.5, 2.0), reader; 2.0: handler step 1 -> 3.0, step 2 -> 4.0; streams 4.5, 5.0
    assert [(s, r, at) for s, r, at, _ in fe.rows] == [
        (0, 0, 1.5), (0, 1, 2.0), (1, 0, None), (1, 1, None), (2, 0, 4.5), (2, 1, 5.0)]
    assert fe.servers[0].tasks == 3 + 2  # three handler turns (one per message), two stream batches


def test_vllm_0_6s_loop_writes_a_chunk_per_output():
    """The same arrivals on vLLM 0.6.0's loop (asyncio_per_output): nothing merges; each stream writes its
    two held outputs as two chunks, the four as one task of 2 s after the handler's two messages (2.0-4.0):
    request 0's at 4.5 and 5.0, request 1's at 5.5 and 6.0."""
    fe = _Frontend()
    loop = PerOutputAsyncioServer(fe, 0)
    _play(fe, loop, [(0.0, "msg", _message(0, [0, 1])), (0.5, "msg", _message(1, [0, 1])),
                     (0.8, "msg", _message(2, [0, 1]))])
    assert sorted((s, r, at) for s, r, at, _ in fe.rows) == [
        (0, 0, 1.5), (0, 1, 2.0), (1, 0, 4.5), (1, 1, 5.5), (2, 0, 5.0), (2, 1, 6.0)]
    assert fe.servers[0].busy == pytest.approx(3 * 1.0 + 6 * 0.5)


def test_a_request_waits_behind_the_streams_made_ready_before_it():
    """A request polled at the end of an iteration runs after the streams its handler turn woke."""
    fe = _Frontend()
    loop = AsyncioServer(fe, 0)
    _play(fe, loop, [(0.0, "msg", _message(0, [0, 1])), (0.3, "req", 7)])
    assert fe.taken == [(7, 2.0, 2.25)]  # handler 0-1, streams 1-2, then the intake


def test_outputs_built_elsewhere_are_only_filed():
    """A separate detokenizer's outputs (SGLang's layout): the handler books no detokenization, the
    milestones stay the detokenizer's, and the streams run at once: 0.2-0.7 and 0.7-1.2."""
    fe = _Frontend()
    loop = AsyncioServer(fe, 0)
    msg = _message(0, [0, 1], made=(0.0, 0.05, 0.1))
    _play(fe, loop, [(0.2, "msg", msg)])
    assert [(s, r, at) for s, r, at, _ in fe.rows] == [(0, 0, 0.7), (0, 1, 1.2)]
    assert msg.marks["o"].tolist() == [0.05, 0.05] and msg.marks["x"].tolist() == [0.2, 0.2]
    assert fe.servers[0].busy == pytest.approx(1.0)


def test_asyncio_needs_api_servers_of_their_own():
    with pytest.raises(LastmileError, match="serving.api_server_loop"):
        run(None, {"serving.api_server_loop": "asyncio", "serving.api_server_process": "engine"})


@pytest.mark.parametrize("engine", ["vllm-v1-measured", "sglang"])
def test_a_lagging_loop_merges_and_keeps_every_token(engine):
    """One API server short of CPU at concurrency 256 (vLLM V1's layout, and SGLang's with its separate
    detokenizer): chunks carry several tokens each, every token reaches the client, and the run is the
    same from one process to the next."""
    if engine == "sglang":  # its tokenizer manager as slow per chunk as the measured one's (host_path_sglang)
        engine = {"base": "sglang", "costs": {"stream_per_chunk": "95 us", "request_overhead": "2.35 ms"}}
    over = {"serving.engine": engine, "serving.api_server_loop": "asyncio", "hardware.cpu_cores": 2,
            "workload.arrival": "closed", "workload.concurrency": 256, "workload.requests": 512,
            "workload.prompt_tokens": 64, "workload.output_tokens": 32, "model": "llama-3-8b"}
    a, b = run(None, over), run(None, over)
    assert a.summary == b.summary
    s = a.summary
    assert s["requests_completed"] == 512
    assert s["tokens"]["output_total"] == 512 * 32
    merged = s["itl_ms"]["mean"] / s["itl_per_token_ms"]["mean"]  # a chunk's gap over a token's
    fifo = run(None, {**over, "serving.api_server_loop": "fifo"}).summary
    assert fifo["itl_ms"]["mean"] == pytest.approx(fifo["itl_per_token_ms"]["mean"])  # a chunk per token
    assert merged > 1.2


def test_vllm_0_6s_lagging_loop_streams_every_token_alone():
    """vLLM 0.6.0's layout with its measured costs, one API server short of CPU: every chunk carries one
    token (a chunk's gap is a token's) and every token arrives, where V1's loop on the same run merges a
    lagging stream's tokens into fuller chunks."""
    over = {"serving.engine": "vllm-0.6", "serving.api_server_loop": "asyncio_per_output", "hardware.cpu_cores": 2,
            "workload.arrival": "closed", "workload.concurrency": 256, "workload.requests": 512,
            "workload.prompt_tokens": 64, "workload.output_tokens": 32, "model": "llama-3-8b"}
    a, b = run(None, over), run(None, over)
    assert a.summary == b.summary
    s = a.summary
    assert s["requests_completed"] == 512 and s["tokens"]["output_total"] == 512 * 32
    assert s["itl_ms"]["mean"] == pytest.approx(s["itl_per_token_ms"]["mean"])
    merging = run(None, {**over, "serving.api_server_loop": "asyncio"}).summary
    assert merging["itl_ms"]["mean"] > 1.2 * merging["itl_per_token_ms"]["mean"]
