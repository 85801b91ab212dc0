"""``lastmile measure-engine vllm-v0`` and ``vllm-v0.6``: vLLM's V0 engine with a stub GPU, and where its CPU goes.

vLLM 0.5 served from one Python process: ``python -m vllm.entrypoints.openai.api_server`` holds the
FastAPI/uvicorn server, ``AsyncLLMEngine``'s loop (the V0 scheduler, output processing, the incremental
detokenizer, one ``AsyncStream`` per request) and the executor, whose worker runs in the event loop's
thread pool. vLLM 0.6.0 moved the engine into a process of its own behind an RPC server (ZeroMQ, one
socket per request) and processes a step's outputs while the next runs. Only the worker is replaced
(:mod:`engine_stubs.vllm_v0_stub`, imported by a generated ``sitecustomize.py``); the client is vLLM
0.33's ``vllm bench serve``, as for SGLang.

One process does several jobs, so its CPU seconds cannot be split by process as V1's are. py-spy samples
the engine's process (0.5's only one) over the benchmark's main run, and each sample is booked by the first
rule below that one of its frames matches (:data:`CATEGORIES`): the scheduler, the engine loop, output
processing, detokenization, 0.6's sending of outputs, the API server (HTTP, SSE streaming, the per-request
generators) and the asyncio loop itself. The CSV carries each category's share of the samples; the fit
(:func:`fit_v0_costs`) splits the process's CPU seconds by those shares.
"""

from __future__ import annotations

import collections
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .measure_engine import (STUB_A, STUB_B, STUB_C, STUB_DIR, Point, Run, _client_cmd, _drive, _engine_env,
                             _free_port, _healthy, _lstsq, _pinned, _point_setup, _row, _roles, stub_site)

V0_STUB_MODULE = "vllm_v0_stub"
V0_INSTALL_HINT = ("install vLLM 0.5.3 (or 0.6.0) into .venv-vllm05 (.venv-vllm06) with uv, which resolves its "
                   "2024 dependencies (the commands: pyproject.toml, engine-vllm-v0), then pass --python")
V0_MAX_NUM_SEQS = 256  # EngineArgs.max_num_seqs default (0.5.3)
V0_MAX_NUM_BATCHED_TOKENS = 2048  # max(max_model_len, 2048): 0.5.3's default without chunked prefill
SPY_RATE_HZ = 200

IDLE_LEAVES = ("vllm_v0_stub.py", "_worker (concurrent/futures/thread.py")
"""A sample whose innermost frame is one of these is idle: the executor thread in the stub's sleep (the GPU's
time, not the host's) or waiting for work. What that thread runs between (0.6's async output processing
callback, in the worker's execute_model) is booked by the rules like any other stack."""

CATEGORIES = (  # (category, text of a frame: its function or file); the first rule that any frame of a stack
    # matches books the sample. Every stack starts in the server's own run (api_server.py's run, uvicorn's
    # Server.run, 0.6's run_rpc_server, asyncio's Runner.run), so no rule names those frames.
    ("detokenize", "transformers_utils/detokenizer"),
    ("engine", "do_log_stats"),  # the engine's per-step statistics
    ("schedule", "vllm/core/"),
    ("output", "_process_model_outputs"), ("output", "vllm/engine/output_processor"),
    ("output", "process_request_outputs"), ("output", "AsyncStream.put"),
    ("ipc", "AsyncEngineRPCServer.generate"),  # 0.6's engine process: each output pickled and sent to the API server
    ("api", "vllm/entrypoints/openai/serving"), ("api", "merge_async_iterators"), ("api", "StreamingResponse"),
    ("api", "starlette/"), ("api", "fastapi/"), ("api", "anyio/"), ("api", "uvicorn/protocols"), ("api", "h11"),
    ("api", "httptools"), ("api", "pydantic"), ("api", "AsyncLLMEngine.generate"), ("api", "AsyncLLMEngine.add_request"),
    ("engine", "vllm/engine/"), ("engine", "vllm/executor/"), ("engine", "make_async"),
)
"""A sample no rule matches is the asyncio loop's own (column ``spy_loop``): its run loop in C (uvloop's
sockets, timers and wake-ups), its queues and events between tasks."""

HOST_CATEGORIES = ("schedule", "output", "detokenize", "engine", "ipc", "api", "loop")
SPY_COLUMNS = ["spy_samples"] + [f"spy_{c}" for c in HOST_CATEGORIES]  # = measure_engine.V0_CSV_COLUMNS' tail


def categorize(lines) -> dict:
    """Samples per category from py-spy's raw (collapsed) output: ``frame;frame;... count`` lines."""
    counts = collections.Counter()
    for line in lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack or not n.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        idle = any(key in leaf for key in IDLE_LEAVES)
        cat = "idle" if idle else next((c for c, key in CATEGORIES if key in stack), "loop")
        counts[cat] += int(n)
    return dict(counts)


def spy_shares(path: Path) -> dict:
    """The CSV's ``spy_*`` columns: busy samples, and each host category's share of them (idle left out)."""
    try:
        with open(path) as f:
            counts = categorize(f)
    except OSError:
        return {}
    busy = sum(n for c, n in counts.items() if c != "idle")
    if not busy:
        return {}
    return {"spy_samples": busy, **{f"spy_{c}": round(counts.get(c, 0) / busy, 4) for c in HOST_CATEGORIES}}


def classify_v0(root: int) -> dict[int, str]:
    """vLLM 0.5: the one server process is ``api`` (it is the engine too). vLLM 0.6: the launched process is
    the API server and the process it spawns for the engine (``AsyncEngineRPCServer``) is ``engine_core``;
    the multiprocessing resource tracker is ``other``."""
    return _roles(root, (("resource_tracker", "other"), ("spawn_main", "engine_core")), lambda titles: "api")


@dataclass(frozen=True)
class Flavor:
    """What differs between the V0 releases measured: the server's flags, the process py-spy samples, the tag."""

    tag: str
    flags: tuple[str, ...]
    spy_role: str
    no_overlap_flag: str | None = None  # the flag a point without the engine's overlap adds


FLAVORS = {
    # 0.5.3: one process; --enforce-eager keeps the (stubbed) worker from capturing graphs
    "vllm-v0": Flavor("v0", ("--enforce-eager",), "api"),
    # 0.6.0: the engine in its own process; async output processing needs CUDA graphs on (config.py), which the
    # stub worker never captures; a point without overlap turns it off
    "vllm-v0.6": Flavor("v06", (), "engine_core", "--disable-async-output-proc"),
}


def _v0_server_cmd(python: str, model: Path, port: int, p: Point, flavor: Flavor = FLAVORS["vllm-v0"]) -> list[str]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
           "tiny", "--host", "127.0.0.1", "--port", str(port), "--load-format", "dummy", *flavor.flags,
           "--max-model-len", "1024", "--max-num-seqs", str(V0_MAX_NUM_SEQS),
           "--max-num-batched-tokens", str(V0_MAX_NUM_BATCHED_TOKENS), "--seed", "0", "--disable-log-requests"]
    if not p.async_scheduling and flavor.no_overlap_flag:
        cmd.append(flavor.no_overlap_flag)
    return cmd


class _Spy:
    """py-spy recording the server from the client's main run to its result banner (SIGINT stops it)."""

    def __init__(self, py_spy: str, out: Path, role: str = "api"):
        self.py_spy, self.out, self.role, self.proc = py_spy, out, role, None

    def start(self, roles: dict) -> None:
        pid = next(p for p, r in roles.items() if r == self.role)
        self.proc = subprocess.Popen([self.py_spy, "record", "--format", "raw", "--rate", str(SPY_RATE_HZ),
                                      "--nonblocking", "-p", str(pid), "-o", str(self.out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def point_tag(flavor: Flavor, p: Point) -> str:
    return f"{flavor.tag}_c{p.concurrency}" + ("" if p.output_len == 64 else f"_out{p.output_len}") + \
        ("" if p.async_scheduling or not flavor.no_overlap_flag else "_sync")


def run_point_v0(python: str, client_python: str, model: Path, p: Point, n: int, work: Path, versions: dict,
                 token_range, py_spy: str, stub=(STUB_A, STUB_B, STUB_C), client_taskset: str | None = None,
                 server_taskset: str | None = None, engine: str = "vllm-v0") -> Run:
    """As ``measure_engine.run_point``, for vLLM 0.5's or 0.6's server, its engine's process profiled by py-spy."""
    run = Run(p)
    flavor = FLAVORS[engine]
    tag = point_tag(flavor, p)
    steplog, result, env = _point_setup(python, work, tag, stub, token_range,
                                        [str(stub_site(work, V0_STUB_MODULE)), str(STUB_DIR)])
    port = _free_port()
    server_log = open(work / f"server_{tag}.log", "w")
    server = subprocess.Popen(_pinned(_v0_server_cmd(python, model, port, p, flavor), server_taskset), env=env,
                              stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
    ccmd = _pinned(_client_cmd(client_python, model, port, p, n, result), client_taskset)
    spy_out = work / f"spy_{tag}.txt"
    spy_out.unlink(missing_ok=True)
    spy = _Spy(py_spy, spy_out, flavor.spy_role)
    got = _drive(run, server, server_log, lambda: _healthy(port), classify_v0, ccmd, _engine_env(client_python), work,
                 tag, result, settle=1.5, on_start=spy.start, on_end=spy.stop)
    spy.stop()
    if got is not None:
        cpu, window, affinity = got
        run.row = _row("vllm", versions, p, n, stub, 1, result, cpu, window, steplog, affinity,
                       ("api", "engine_core", "client", "other"))
        run.row.update(spy_shares(spy_out))
        run.row.update(engine=engine, async_scheduling=bool(flavor.no_overlap_flag) and p.async_scheduling)
    return run


def find_py_spy(client_python: str) -> str | None:
    """py-spy from the client's environment (``pip install py-spy``), else from PATH."""
    import shutil

    here = Path(client_python).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def profiled_cpu(rows: list[dict]) -> str:
    """The column of the process py-spy sampled: 0.6's engine process where it has one, else 0.5's only one."""
    return "cpu_s_engine_core" if any(float(r.get("cpu_s_engine_core") or 0) for r in rows) else "cpu_s_api"


def fit_v0_costs(rows: list[dict]) -> dict:
    """Each category's CPU seconds (the profiled process's, split by its py-spy shares) fitted as the simulator
    books it: the scheduler, the engine loop's own work and output processing per step and per scheduled
    request-step; detokenization per request-step (each running request gets one token a step); 0.6's
    sending of each output to the API server per chunk; the API server per request and per SSE chunk; the
    asyncio loop's own work per step (the engine loop's wake-ups) and per chunk (the streams' or the sends'
    socket writes). vLLM 0.5 profiles its one process; 0.6 its engine process, and its API-server process
    (``api_process``) is fitted whole per request and chunk. ``process`` fits the profiled process unsplit."""
    rows = [r for r in rows if r.get("steps") and r.get("chunks") and r.get("spy_samples")]
    if len(rows) < 3:
        return {}
    col = lambda key: np.array([float(r.get(key) or 0.0) for r in rows], float)  # noqa: E731
    profiled = profiled_cpu(rows)
    cpu = col(profiled)
    steps, req_steps, requests, chunks = col("steps"), col("req_steps"), col("completed"), col("chunks")
    per_step = (np.c_[steps, req_steps], ["per_step_s", "per_request_step_s"])
    fit = lambda X, cat: _lstsq(X[0], cpu * col(f"spy_{cat}"), X[1], rows)  # noqa: E731
    fits = {
        "schedule": fit(per_step, "schedule"), "engine": fit(per_step, "engine"), "output": fit(per_step, "output"),
        "detokenize": fit((np.c_[req_steps], ["per_request_step_s"]), "detokenize"),
        "ipc": fit((np.c_[chunks], ["per_chunk_s"]), "ipc"),
        "api_server": fit((np.c_[requests, chunks], ["per_request_s", "per_chunk_s"]), "api"),
        "loop": fit((np.c_[steps, chunks], ["per_step_s", "per_chunk_s"]), "loop"),
        "process": _lstsq(np.c_[steps, req_steps, requests], cpu, ["per_step_s", "per_request_step_s", "per_request_s"],
                          rows),
        "client": _lstsq(np.c_[requests, chunks], col("cpu_s_client"), ["per_request_s", "per_chunk_s"], rows),
    }
    if profiled == "cpu_s_engine_core":  # 0.6: its API server in a process of its own
        fits["api_process"] = _lstsq(np.c_[requests, chunks], col("cpu_s_api"), ["per_request_s", "per_chunk_s"], rows)
    return fits


def fit_gc(on: list[dict], off: list[dict]) -> dict:
    """CPython's cyclic garbage collector: each point's process CPU seconds with the collector on (``on``) less
    the same point's with it off (``off``, measure-engine --no-gc), fitted per request pair in a step (the sum
    over the steps of their requests squared, ``req_steps_sq``, of the run with it on)."""
    key = lambda r: (int(r["concurrency"]), int(r["output_len"]))  # noqa: E731
    offs = {key(r): r for r in off}
    rows = [r for r in on if key(r) in offs and r.get("req_steps_sq")]
    cpu = profiled_cpu(rows)
    X = np.c_[[float(r["req_steps_sq"]) for r in rows]]
    y = np.array([float(r[cpu]) - float(offs[key(r)][cpu]) for r in rows])
    return _lstsq(X, y, ["per_request_pair_s"], rows)


V0_WHAT_RAN = {
    "real": ["python -m vllm.entrypoints.openai.api_server (vLLM 0.5.3.post1), one process: FastAPI/uvicorn, the "
             "OpenAI /v1/completions with SSE streaming, prompt tokenization, AsyncLLMEngine's loop (V0 scheduler "
             "and block manager, output processing, the incremental detokenizer, one AsyncStream per request), "
             "GPUExecutorAsync.execute_model_async running the worker in the loop's thread pool",
             "vllm bench serve from vLLM 0.33's environment (random dataset, openai backend, streaming completions "
             "over loopback)"],
    "stubbed": ["the driver worker (GPUExecutor._init_executor builds a stand-in): no CUDA, model, KV tensors or "
                "model-runner input preparation; its execute_model sleeps a + b*decode_requests + c*prefill_tokens "
                "seconds (releasing the GIL, as a blocking CUDA copy does) and returns one sampled id per sequence",
                "the model: the same tiny Llama config and locally trained BPE tokenizer as the other engines' runs; "
                "--load-format dummy",
                "sampled token ids: a fixed pattern over ordinary vocabulary ids (never EOS; the client also passes "
                "--ignore-eos)"],
    "changed": ["pyairports (imported by outlines for an airport-code type, withdrawn from PyPI) is given an empty "
                "list; the environment is vLLM 0.5.3's own dependencies as of its release (uv --exclude-newer "
                "2024-07-25)"],
}

V06_WHAT_RAN = {
    "real": ["python -m vllm.entrypoints.openai.api_server (vLLM 0.6.0), two processes: the API server (FastAPI/"
             "uvicorn, the OpenAI /v1/completions with SSE streaming, prompt tokenization, the RPC client) and the "
             "engine process it spawns (AsyncEngineRPCServer: AsyncLLMEngine's loop with the V0 scheduler and block "
             "manager, output processing with async output processing, the incremental detokenizer, each "
             "RequestOutput pickled and sent over ZeroMQ), GPUExecutorAsync running the worker in the loop's thread "
             "pool",
             "vllm bench serve from vLLM 0.33's environment (random dataset, openai backend, streaming completions "
             "over loopback)"],
    "stubbed": V0_WHAT_RAN["stubbed"] + ["0.6's async output processing: the engine's callback, which processes "
                                         "the previous step's outputs, runs right after the stub step's launch, "
                                         "where the real model runner calls it"],
    "changed": V0_WHAT_RAN["changed"][:1] + ["the environment is vLLM 0.6.0's own dependencies as of its release "
                                             "(uv --exclude-newer 2024-09-06) with FastAPI 0.112.2: 0.113.0-0.114.0 "
                                             "built pydantic TypeAdapters for every request's body (about half the "
                                             "API server's CPU in a first sweep), a regression of those days "
                                             "that 0.6.0's own users did not have",
                                             "no --enforce-eager, since 0.6.0 turns async output processing off "
                                             "with it (the stub captures no graphs either way)"],
}


def sidecar_parts(engine: str, max_model_len: int) -> dict:
    """The V0 releases' sidecar headline, limits, components and columns (``measure_engine.write_sidecar``)."""
    one = engine == "vllm-v0"
    what = "host_path_vllm_v0: vLLM 0.5's one-process server" if one else \
        "host_path_vllm_v06: vLLM 0.6's API-server and engine processes"
    return {"what": what + " with a stub GPU, measured on this CPU",
            "server_limits": {"max_num_seqs": V0_MAX_NUM_SEQS, "max_num_batched_tokens": V0_MAX_NUM_BATCHED_TOKENS,
                              "max_model_len": max_model_len},
            "components": V0_WHAT_RAN if one else V06_WHAT_RAN,
            "columns": {"cpu_s_api": "the one server process (API server, engine loop and executor)" if one else
                        "the API-server process (uvicorn, the OpenAI server, the RPC client)",
                        "cpu_s_engine_core": "0 (no such process)" if one else
                        "the engine process (AsyncEngineRPCServer: AsyncLLMEngine, the executor)",
                        "spy_samples": f"py-spy samples of the {'server' if one else 'engine process'} while it was "
                                       f"busy (rate {SPY_RATE_HZ} Hz; the executor thread's sleep and wait left out)",
                        "spy_CATEGORY": "the share of those samples booked to the category: the first rule of "
                                        "measure_engine_v0.CATEGORIES that a frame of the sample's stack matches",
                        "spy_loop": "the asyncio loop's own samples (no rule matched): its run loop in C, queues "
                                    "and events",
                        "async_scheduling": "False: 0.5 runs one step at a time" if one else
                        "0.6's async output processing (False: --disable-async-output-proc)",
                        "preempted": "not tracked (0)"}}
