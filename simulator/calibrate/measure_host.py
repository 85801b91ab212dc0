"""Measure an LLM serving engine's host-path (CPU) costs on this machine, with the libraries engines use.

Three costs that sit between the GPU's sampled token and the user's socket, each timed on real code:
building the per-request output objects of an engine step (pure Python, as vLLM V1's OutputProcessor),
sending one step's outputs between processes (msgpack and pickle over a ZeroMQ ipc:// socket, as
vLLM V1 and SGLang), and streaming one OpenAI-style SSE chunk through a real ASGI server (uvicorn +
Starlette). Writes an ``engine:`` profile (``base: vllm-v1``, ``costs:``) that the serving engine
profiles can start from, with every raw sample and fit under ``measured:``.

    python -m simulator.calibrate.measure_host --out engine_profile.yaml [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import gc
import json
import os
import pickle
import platform
import random
import socket
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..errors import LastmileError
from ..runfolder import write_atomically
from ..units import fmt_time

INSTALL_HINT = ("measuring host-path costs needs msgpack, pyzmq, uvicorn, starlette and httpx: "
                "pip install 'lastmile-sim[cpu]'")

BATCHES = (1, 8, 32, 128, 512)

# reps: interleaved repetitions (plus one warm-up); steps: engine steps timed per batch size and
# repetition; ipc_messages: messages per (serializer, batch size) block; streams: concurrent HTTP
# streams; stream_tokens: chunks per stream, one run per value and repetition; stream_reps:
# repetitions of the streaming runs; idle: seconds the idle server is watched per repetition
_FULL = dict(reps=21, steps=16, ipc_messages=64, streams=8, stream_tokens=(16, 128, 512), stream_reps=9,
             idle=0.3)
_QUICK = dict(reps=3, steps=4, ipc_messages=12, streams=8, stream_tokens=(16, 256), stream_reps=1,
              idle=0.1)

_TIMEOUT_S = 60.0  # a child that has not answered by then is taken as failed


def _libraries() -> dict:
    """The optional libraries, imported; a missing one is an ImportError carrying the install hint."""
    try:
        import httpx
        import msgpack
        import starlette
        import uvicorn
        import zmq
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return {"msgpack": msgpack, "zmq": zmq, "uvicorn": uvicorn, "starlette": starlette, "httpx": httpx}


def check_out_path(path: str | os.PathLike) -> None:
    """Refuse (LastmileError) a path that exists and is not an engine profile, or whose folder is missing.

    Called before any measurement, so that a refused path costs nothing; a previous engine profile
    (a YAML mapping with a top-level ``engine:``) may be replaced.
    """
    p = Path(path)
    if not p.parent.is_dir():
        raise LastmileError(f"{p}: folder {p.parent} does not exist")
    if not p.exists() and not p.is_symlink():
        return
    try:
        content = yaml.safe_load(p.read_text()) if p.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        content = None
    if not (isinstance(content, dict) and "engine" in content):
        raise LastmileError(f"{p} exists and is not an engine profile (a YAML with a top-level 'engine:'); "
                            "refusing to overwrite it")


@contextlib.contextmanager
def _frozen_heap():
    """The heap built so far marked static for the garbage collector while timing, as engines do after
    start-up (vLLM's engine core and API server freeze their start-up heaps, vllm/v1/engine/core.py
    and vllm/entrypoints/openai/api_server.py): collections then scan only the objects the timed
    code makes, not the test harness's or the imported libraries'. The collector stays on."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _line_fit(x, y) -> tuple[float, float]:
    """Least-squares ``y = a + b*x``; returns ``(a, b)``."""
    x = np.asarray(x, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(design, np.asarray(y, dtype=float), rcond=None)
    return float(a), float(b)


# --------------------------------------------------------------------------------------------------
# 1. Per-step output objects.
# Imitates vLLM V1's OutputProcessor.process_outputs (vllm/v1/engine/output_processor.py): for each
# EngineCoreOutput of the step, look the request's state up in a dict, append the new token ids, update
# the iteration stats, and build a CompletionOutput inside a RequestOutput (vllm/outputs.py), collected
# in a list. Detokenization is left out: measure_cpu times it (detokenize_per_token).

@dataclass(slots=True)
class _CoreOutput:
    """Stands for vllm/v1/engine/__init__.py EngineCoreOutput (a msgspec Struct there)."""
    request_id: str
    new_token_ids: list
    finish_reason: str | None = None
    stop_reason: object = None


@dataclass(slots=True)
class _CompletionOutput:
    """Stands for vllm/outputs.py CompletionOutput (DELTA output kind: this step's text and ids)."""
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: object
    finish_reason: str | None = None
    stop_reason: object = None


@dataclass(slots=True)
class _RequestOutput:
    """Stands for vllm/outputs.py RequestOutput."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list
    prompt_logprobs: object
    outputs: list
    finished: bool
    num_cached_tokens: int = 0


@dataclass(slots=True)
class _RequestState:
    """Stands for output_processor.py RequestState: what the front end keeps per running request."""
    request_id: str
    prompt: str
    prompt_token_ids: list
    output_token_ids: list
    max_tokens: int
    num_generated: int = 0


@dataclass(slots=True)
class _IterationStats:
    """Stands for vllm/v1/metrics/stats.py IterationStats (the per-step counters)."""
    num_generation_tokens: int = 0
    num_finished: int = 0


_DELTAS = tuple(f" w{i}" for i in range(256))  # the step's text piece per request (detokenized elsewhere)


def _process_outputs(outputs: list, states: dict, stats: _IterationStats) -> list:
    request_outputs = []
    for out in outputs:
        state = states.get(out.request_id)
        if state is None:  # aborted meanwhile
            continue
        new_ids = out.new_token_ids
        state.output_token_ids.extend(new_ids)
        state.num_generated += len(new_ids)
        stats.num_generation_tokens += len(new_ids)
        finish = out.finish_reason
        if finish is None and state.num_generated >= state.max_tokens:
            finish = "length"
        completion = _CompletionOutput(0, _DELTAS[new_ids[-1] & 255], new_ids, None, None, finish,
                                       out.stop_reason)
        request_outputs.append(_RequestOutput(state.request_id, state.prompt, state.prompt_token_ids,
                                              None, [completion], finish is not None))
        if finish is not None:
            del states[out.request_id]
            stats.num_finished += 1
    return request_outputs


def _request_id(rng: random.Random) -> str:
    return f"chatcmpl-{rng.getrandbits(128):032x}"


class _OutputBench:
    """``batch`` running requests and the core outputs of the steps to come, for timing whole steps."""

    def __init__(self, batch: int, steps: int, rng: random.Random):
        ids = [_request_id(rng) for _ in range(batch)]
        self.states = {rid: _RequestState(rid, "Tell me a story.", [rng.randrange(128_000) for _ in range(16)],
                                          [], max_tokens=1 << 30) for rid in ids}
        self.steps = [[_CoreOutput(rid, [rng.randrange(128_000)]) for rid in ids] for _ in range(steps)]
        self.stats = _IterationStats()

    def step_ns(self) -> float:
        """Median time of one step over the prepared steps."""
        clock, samples = time.perf_counter_ns, []
        for outputs in self.steps:
            t0 = clock()
            _process_outputs(outputs, self.states, self.stats)
            samples.append(clock() - t0)
        return float(statistics.median(samples))


def _measure_outputs(cfg: dict, seed: int) -> dict:
    """Per-step times of the output processing for each batch size, interleaved over repetitions."""
    rng = random.Random(seed)
    benches = {b: _OutputBench(b, cfg["steps"], rng) for b in BATCHES}
    samples: dict[int, list[float]] = {b: [] for b in BATCHES}
    with _frozen_heap():
        for rep in range(cfg["reps"] + 1):
            row = {b: bench.step_ns() for b, bench in benches.items()}
            if rep:  # rep 0 warms up
                for b, ns in row.items():
                    samples[b].append(ns * 1e-9)
    medians = {b: statistics.median(v) for b, v in samples.items()}
    a, b = _line_fit(list(medians), list(medians.values()))
    return {"samples": samples, "median": medians, "a": a, "b": b}


# --------------------------------------------------------------------------------------------------
# 2. One step's outputs between processes.
# The engine core process sends each step's outputs to the front end over a ZeroMQ PUSH socket on
# ipc:// (vllm/v1/engine/core.py output thread, vllm/v1/engine/core_client.py), msgpack-encoded
# (vllm/v1/serial_utils.py MsgpackEncoder/MsgpackDecoder, msgspec underneath); SGLang's scheduler and
# detokenizer_manager.py use send_pyobj/recv_pyobj (pickle), as did vLLM 0.6's MQLLMEngine
# (vllm/engine/multiprocessing/engine.py). The message is [engine index, entries, timestamp], one entry
# per request: [request id, new token ids, finish reason, index, cached tokens, generated tokens].

SERIALIZERS = ("msgpack", "pickle")


def _entry(rng: random.Random, tokens: int = 1) -> list:
    return [_request_id(rng), [rng.randrange(128_000) for _ in range(tokens)], None, 0,
            rng.randrange(4096), rng.randrange(1, 4096)]


def _message(rng: random.Random, batch: int) -> list:
    entries = [_entry(rng) for _ in range(batch)]
    entries[-1][2] = "stop"  # one request finishes
    return [0, entries, time.time()]


def _codecs(msgpack) -> dict:
    """Encode and decode per serializer, as the engines call them."""
    dumps = pickle.dumps
    protocol = pickle.HIGHEST_PROTOCOL  # pyzmq's send_pyobj default

    return {
        "msgpack": (msgpack.packb, msgpack.unpackb),
        "pickle": (lambda obj: dumps(obj, protocol), pickle.loads),
    }


def _ipc_receiver(data_addr: str, ack_addr: str, plan: list) -> None:
    """Child process: for each (serializer, count) block, receive and decode ``count`` messages and
    report the block's process CPU time (all threads, ZeroMQ's I/O thread included) on the ack socket."""
    import msgpack
    import zmq

    codecs = _codecs(msgpack)
    ctx = zmq.Context()
    pull, ack = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(data_addr)
    ack.connect(ack_addr)
    gc.collect()
    gc.freeze()  # as the front end does after start-up (see _frozen_heap)
    try:
        ack.send(b"ready")
        cpu = time.process_time_ns
        for serializer, count in plan:
            decode, recv = codecs[serializer][1], pull.recv
            c0 = cpu()
            for _ in range(count):
                decode(recv())
            ack.send(struct.pack("<q", cpu() - c0))
    finally:
        pull.close(linger=0)
        ack.close(linger=1000)
        ctx.term()


def _measure_ipc(cfg: dict, seed: int, libs: dict) -> dict:
    """Sender and receiver CPU time per message, for each serializer and batch size.

    Blocks of ``ipc_messages`` messages are sent back to back; the receiver acknowledges each block
    with its CPU time, and the sender's clock stops at that acknowledgement, so that the writes its
    ZeroMQ I/O thread makes after the last send are counted (its wait costs no CPU; the one small ack
    read per block is shared by the block's messages).
    """
    import multiprocessing

    msgpack, zmq = libs["msgpack"], libs["zmq"]
    rng = random.Random(seed + 1)
    codecs = _codecs(msgpack)
    pool = {b: [_message(rng, b) for _ in range(4)] for b in BATCHES}
    sizes = {s: {b: statistics.mean(len(codecs[s][0](m)) for m in pool[b]) for b in BATCHES} for s in SERIALIZERS}
    count = cfg["ipc_messages"]
    order = [(s, b) for s in SERIALIZERS for b in BATCHES]
    plan = [(s, count) for _ in range(cfg["reps"] + 1) for s, _b in order]

    tmp = tempfile.mkdtemp(prefix="lastmile-ipc-")
    data_addr, ack_addr = f"ipc://{tmp}/outputs", f"ipc://{tmp}/ack"
    ctx = zmq.Context()
    push, ack = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.bind(data_addr)
    ack.bind(ack_addr)
    child = multiprocessing.get_context("spawn").Process(target=_ipc_receiver, args=(data_addr, ack_addr, plan),
                                                         daemon=True)
    send_s = {s: {b: [] for b in BATCHES} for s in SERIALIZERS}
    recv_s = {s: {b: [] for b in BATCHES} for s in SERIALIZERS}

    def wait_ack() -> bytes:
        if not ack.poll(_TIMEOUT_S * 1000):
            raise RuntimeError("the IPC receiver process stopped answering")
        return ack.recv()

    try:
        child.start()
        wait_ack()  # ready
        cpu = time.process_time_ns
        with _frozen_heap():
            for rep in range(cfg["reps"] + 1):
                for serializer, batch in order:
                    encode, send = codecs[serializer][0], push.send
                    msgs = [pool[batch][i % 4] for i in range(count)]
                    c0 = cpu()
                    for m in msgs:
                        send(encode(m))
                    reply = wait_ack()
                    sent_ns = cpu() - c0
                    if rep:  # rep 0 warms up
                        send_s[serializer][batch].append(sent_ns * 1e-9 / count)
                        recv_s[serializer][batch].append(struct.unpack("<q", reply)[0] * 1e-9 / count)
        child.join(_TIMEOUT_S)
    finally:
        if child.is_alive():
            child.terminate()
            child.join(5)
        push.close(linger=0)
        ack.close(linger=0)
        ctx.term()
        for name in ("outputs", "ack"):
            Path(tmp, name).unlink(missing_ok=True)
        os.rmdir(tmp)

    fits = {}
    for s in SERIALIZERS:
        x = [sizes[s][b] for b in BATCHES]
        ends = {}
        for end, samples in (("send", send_s[s]), ("recv", recv_s[s])):
            med = {b: statistics.median(v) for b, v in samples.items()}
            a, slope = _line_fit(x, list(med.values()))
            ends[end] = {"samples": samples, "median": med, "a": a, "b": slope}
        # the simulator charges a message's cost at each end (settings.message_cost): the mean end
        per_end = [(ends["send"]["median"][b] + ends["recv"]["median"][b]) / 2 for b in BATCHES]
        a, slope = _line_fit(x, per_end)
        fits[s] = {"bytes": sizes[s], "ends": ends, "a": a, "b": slope}
    fits["bytes_per_request"] = len(msgpack.packb(_entry(random.Random(seed + 2))))
    return fits


# --------------------------------------------------------------------------------------------------
# 3. One streamed chunk through an ASGI server.
# Imitates vLLM's OpenAI server: uvicorn serving a FastAPI (Starlette) app whose chat endpoint returns
# a StreamingResponse over an async generator (vllm/entrypoints/openai/serving_chat.py
# chat_completion_stream_generator) that awaits the request's output queue, filled each engine step by
# one output-handler task for all requests (vllm/v1/engine/async_llm.py output_handler,
# RequestOutputCollector); each chunk is a chat.completion.chunk dict, json.dumps'd into "data: ...\n\n".

class _ToyEngine:
    """One task that, each step, puts the next token's text into every running request's queue."""

    def __init__(self):
        self.running: dict = {}  # queue -> tokens left
        self.wake = asyncio.Event()
        self.task = None

    def add(self, queue: asyncio.Queue, tokens: int) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.run())
        self.running[queue] = tokens
        self.wake.set()

    async def run(self) -> None:
        step = 0
        while True:
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            step += 1
            for queue, left in list(self.running.items()):
                left -= 1
                queue.put_nowait((_DELTAS[step & 255], "length" if left == 0 else None))
                if left:
                    self.running[queue] = left
                else:
                    del self.running[queue]
            await asyncio.sleep(0)  # the next step: let the streams run


def _chunk(request_id: str, created: int, model: str, delta: dict, finish: str | None) -> str:
    """One SSE event. vLLM (protocol.py ChatCompletionStreamResponse) and SGLang build a pydantic model
    and call model_dump_json(); a dict through json.dumps is the lighter idiom, so this step is a floor."""
    chunk = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n"


def _stream_app(engine: _ToyEngine):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    counter = iter(range(1 << 62))

    async def chat(request):
        body = await request.json()
        queue: asyncio.Queue = asyncio.Queue()
        request_id, created, model = f"chatcmpl-{next(counter):032x}", int(time.time()), body["model"]
        engine.add(queue, int(body["max_tokens"]))

        async def chunks():
            yield _chunk(request_id, created, model, {"role": "assistant", "content": ""}, None)
            while True:
                text, finish = await queue.get()
                yield _chunk(request_id, created, model, {"content": text}, finish)
                if finish is not None:
                    break
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def cpu(request):
        return JSONResponse({"cpu_ns": time.process_time_ns()})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/cpu", cpu)])


def _stream_server(conn) -> None:
    """Child process: uvicorn on a free loopback port; sends (port, loop, http) on ``conn``, then serves."""
    import importlib.util

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    # uvicorn's "auto" picks uvloop and httptools when installed, as vLLM's server does
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    config = uvicorn.Config(_stream_app(_ToyEngine()), loop=loop, http=http, lifespan="off",
                            log_level="error", access_log=False)
    gc.collect()
    gc.freeze()  # as vLLM's API server does once started (see _frozen_heap)
    conn.send((sock.getsockname()[1], loop, http))
    conn.close()
    uvicorn.Server(config).run(sockets=[sock])


async def _drive_streams(port: int, cfg: dict, httpx) -> dict:
    """Client side: the server's CPU time per stream for each stream length, and its idle cost."""
    streams = cfg["streams"]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=_TIMEOUT_S,
                                 limits=httpx.Limits(max_connections=streams + 4)) as client:
        async def server_cpu() -> int:
            r = await client.get("/cpu")
            r.raise_for_status()
            return r.json()["cpu_ns"]

        async def one(tokens: int) -> None:
            body = {"model": "lastmile-bench", "messages": [{"role": "user", "content": "Tell me a story."}],
                    "max_tokens": tokens, "stream": True}
            data = bytearray()
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                async for piece in r.aiter_raw():
                    data += piece
            events = data.count(b"\n\n")
            if events != tokens + 2 or not data.endswith(b"data: [DONE]\n\n"):
                raise RuntimeError(f"stream of {tokens} tokens came back with {events} events")

        for _ in range(100):  # wait until the server accepts
            try:
                await server_cpu()
                break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the streaming server did not start")

        per_request = {n: [] for n in cfg["stream_tokens"]}
        raw, idle_rates, call_costs = {n: [] for n in cfg["stream_tokens"]}, [], []
        for rep in range(cfg["stream_reps"] + 1):
            # one /cpu round trip, then the idle server over a known wall time
            c0 = await server_cpu()
            c1 = await server_cpu()
            t0 = time.perf_counter()
            await asyncio.sleep(cfg["idle"])
            c2 = await server_cpu()
            call = c1 - c0
            rate = max(0.0, (c2 - c1 - call) / (time.perf_counter() - t0))  # CPU seconds per second, as ns/s
            for tokens in cfg["stream_tokens"]:
                before, t0 = await server_cpu(), time.perf_counter()
                await asyncio.gather(*(one(tokens) for _ in range(streams)))
                after, wall = await server_cpu(), time.perf_counter() - t0
                busy = after - before - call - rate * wall
                if rep:  # rep 0 warms up
                    per_request[tokens].append(busy * 1e-9 / streams)
                    raw[tokens].append((after - before) * 1e-9 / (streams * tokens))
            if rep:
                idle_rates.append(rate * 1e-9)
                call_costs.append(call * 1e-9)
    return {"per_request": per_request, "raw_per_chunk": raw, "idle_rate": idle_rates, "call": call_costs}


def _measure_stream(cfg: dict, libs: dict) -> dict:
    """The server's CPU time per streamed chunk: a line fit of its CPU per request over stream lengths."""
    import multiprocessing

    mp = multiprocessing.get_context("spawn")
    parent, child_end = mp.Pipe(duplex=False)
    server = mp.Process(target=_stream_server, args=(child_end,), daemon=True)
    server.start()
    try:
        child_end.close()
        if not parent.poll(_TIMEOUT_S):
            raise RuntimeError("the streaming server process did not start")
        port, loop, http = parent.recv()
        out = asyncio.run(_drive_streams(port, cfg, libs["httpx"]))
    finally:
        server.terminate()
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join(5)
    med = {n: statistics.median(v) for n, v in out["per_request"].items()}
    a, b = _line_fit(list(med), list(med.values()))
    out.update(median=med, a=a, b=b, loop=loop, http=http, streams=cfg["streams"])
    return out


# --------------------------------------------------------------------------------------------------
# The profile.

def _versions(libs: dict) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("msgpack", "pyzmq", "uvicorn", "starlette", "httpx", "uvloop", "httptools"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["libzmq"] = libs["zmq"].zmq_version()
    return out


def _times(values: dict) -> dict:
    return {k: fmt_time(v) for k, v in values.items()}


def _raw(outputs: dict, ipc: dict, stream: dict) -> dict:
    med = statistics.median
    raw_ipc = {}
    for s in SERIALIZERS:
        fit = ipc[s]
        ends = {end: {"per_message": _times(e["median"]),
                      "per_message_p10_p90": {b: [fmt_time(float(np.percentile(v, q))) for q in (10, 90)]
                                              for b, v in e["samples"].items()},
                      "fit_a": fmt_time(e["a"]), "fit_b_per_byte": fmt_time(e["b"])}
                for end, e in fit["ends"].items()}
        raw_ipc[s] = {"message_bytes": {b: round(v) for b, v in fit["bytes"].items()}, **ends,
                      "mean_end_fit_a": fmt_time(fit["a"]), "mean_end_fit_b_per_byte": fmt_time(fit["b"])}
    b_max = max(BATCHES)
    return {
        "output_step": _times(outputs["median"]),
        "output_step_per_request": {b: fmt_time(v / b) for b, v in outputs["median"].items()},
        f"output_per_request_at_B{b_max}_p10_p90": [
            fmt_time(float(np.percentile([v / b_max for v in outputs["samples"][b_max]], q))) for q in (10, 90)],
        "output_fit_a": fmt_time(outputs["a"]),
        "output_fit_b": fmt_time(outputs["b"]),
        "ipc": raw_ipc,
        "stream": {
            "server": f"uvicorn ({stream['loop']}, {stream['http']}) + starlette",
            "concurrent_streams": stream["streams"],
            "server_cpu_per_request": _times(stream["median"]),
            "server_cpu_per_chunk_unadjusted": {n: fmt_time(med(v)) for n, v in stream["raw_per_chunk"].items()},
            "fit_a_per_request": fmt_time(stream["a"]),
            "fit_b_per_chunk": fmt_time(stream["b"]),
            "idle_server_cpu_per_s": fmt_time(med(stream["idle_rate"])),
            "cpu_query_cost": fmt_time(med(stream["call"])),
        },
    }


def _profile(libs: dict, cfg: dict, outputs: dict, ipc: dict, stream: dict, run: dict) -> dict:
    host = socket.gethostname()
    msg = ipc["msgpack"]
    return {
        "engine": {
            "base": "vllm-v1",
            "costs": {
                "output_per_request": fmt_time(outputs["b"]),
                "detokenize_step_fixed": fmt_time(max(outputs["a"], 0.0)),  # output work per step
                "ipc_per_message": fmt_time(max(msg["a"], 0.0)),
                "ipc_per_byte": fmt_time(msg["b"]),
                "ipc_bytes_per_request": ipc["bytes_per_request"],
                "stream_per_chunk": fmt_time(stream["b"]),
                "request_overhead": fmt_time(max(stream["a"], 0.0)),
            },
        },
        "measured": {
            "source": (f"simulator.calibrate.measure_host on {host}: single-threaded medians of {cfg['reps']} "
                       f"interleaved repetitions (streaming: {cfg['stream_reps']}); ipc_* are msgpack over ZeroMQ "
                       "ipc://, CPU time at one end: the mean of the sender's (encode + send) and the receiver's "
                       "(recv + decode) line fits over message bytes; stream_per_chunk "
                       "is the uvicorn server process's CPU time per chunk, its idle cost taken off"),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "hostname": host,
            "processor": platform.processor() or platform.machine(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "libraries": _versions(libs),
            "command": run["command"],
            "quick": run["quick"],
            "seed": run["seed"],
            "repetitions": cfg["reps"],
            "steps_per_batch_timing": cfg["steps"],
            "ipc_messages_per_block": cfg["ipc_messages"],
            "stream_repetitions": cfg["stream_reps"],
            "stream_tokens": list(cfg["stream_tokens"]),
            "runtime": run["runtime"],
            "raw": _raw(outputs, ipc, stream),
        },
    }


def measure_host(out_path: str | os.PathLike | None, quick: bool = False, seed: int = 0,
                 command: str | None = None) -> dict:
    """Measure this machine's host-path engine costs; write the ``engine:`` profile to ``out_path`` (if given).

    Raises ImportError (with the install hint) when a library is missing, and LastmileError when
    ``out_path`` exists and is not an engine profile; both before measuring anything.
    Returns the profile as a dict (the same content as the YAML).
    """
    libs = _libraries()
    if out_path is not None:
        check_out_path(out_path)
    cfg = _QUICK if quick else _FULL
    started = time.perf_counter()
    outputs = _measure_outputs(cfg, seed)
    ipc = _measure_ipc(cfg, seed, libs)
    stream = _measure_stream(cfg, libs)
    profile = _profile(libs, cfg, outputs, ipc, stream, {
        "command": command or " ".join(sys.argv), "quick": quick, "seed": seed,
        "runtime": fmt_time(time.perf_counter() - started)})
    if out_path is not None:
        check_out_path(out_path)  # again: the path may have appeared while measuring
        write_atomically(out_path, yaml.safe_dump(profile, sort_keys=False, allow_unicode=True))
    return profile


def main(argv: list[str] | None = None) -> int:
    """Command line: measure, write the profile, print its ``engine:`` block."""
    parser = argparse.ArgumentParser(prog="measure_host", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="engine_profile.yaml", help="where to write the engine profile")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and chunks (a few seconds)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    try:
        profile = measure_host(args.out, quick=args.quick, seed=args.seed,
                               command=" ".join(["python -m simulator.calibrate.measure_host", *argv]))
    except (ImportError, LastmileError) as exc:
        print(f"measure_host: error: {exc}", file=sys.stderr)
        return 2
    print(yaml.safe_dump({"engine": profile["engine"]}, sort_keys=False), end="")
    print(f"wrote {args.out} in {profile['measured']['runtime']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
