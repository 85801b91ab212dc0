"""From ``lastmile measure-engine`` measurements to what the simulator runs: an engine profile whose
host costs are fitted from the real engine's per-process CPU seconds, and the validation family
whose reference is the measured client-side latencies.

The costs come from CPU seconds only (the engine core's per step and per scheduled request per step;
the API server's per output message, per request and per SSE chunk; SGLang's detokenizer too, fitted
by ``measure_engine.fit_host_costs``); the measured rows are read with ``measure_engine.read_csv``; no latency or throughput of the sweep is used, so the family's
TTFT, TPOT and throughput are a check of the simulated layout, not an echo of the fit.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..project import scenarios_dir
from .measure_engine import Point, write_yaml

REFERENCE = "validation/reference/host_path_{engine}.csv"
"""The measured points (``scenarios/`` relative): one row per concurrency x stream interval x API servers."""

METRICS = {"ttft_ms": "ttft_ms_mean", "tpot_ms": "tpot_ms_mean", "output_tokens_per_s": "output_tokens_per_s"}
"""Family metric -> the CSV column measured at the client (vllm bench serve's means)."""

STUB_MODEL = {"base": "llama-3-8b", "name": "tiny-llama-stub", "layers": 2, "hidden": 64, "heads": 4,
              "kv_heads": 4, "head_dim": 16, "ffn": 128, "vocab": 4096, "context_length": 4096}
"""The stub's model folder (``measure_engine._BUILD_MODEL``'s config.json): only its KV bytes matter here,
since the GPU step is the stub's function."""


def _us(seconds: float) -> str:
    return f"{max(seconds, 0.0) * 1e6:.4g} us"


_APART = {"prepare_per_step": "0 us", "prepare_per_request": "0 us", "tokenize_per_token": "0 us",
          "output_per_request": "0 us", "ipc_per_message": "0 us", "ipc_per_byte": "0 ns", "ipc_bytes_per_request": 0}
"""Terms no fit sets apart: input preparation, tokenization, output objects and messages are inside
the fitted per-step, per-request and per-chunk costs of the process that ran them."""


def profile_costs(fits: dict) -> dict:
    """CPUCosts over ``vllm-v1`` from the fitted CPU seconds: the engine core's per-step and
    per-request-per-step costs as its scheduling; the API server's per-message cost (receiving a
    step's outputs and running its output handler) as the per-step part of its output processing,
    its per-chunk cost as the SSE chunk (detokenization and output objects inside it), its
    per-request cost as its request overhead (tokenization inside it). Messages between the
    processes cost nothing apart: their serialization is inside the fitted costs at both ends."""
    eng, api = fits["engine_core"]["coefficients"], fits["api_server"]["coefficients"]
    return {**_APART, "schedule_per_step": _us(eng["per_step_s"]),
            "schedule_per_request": _us(eng["per_request_step_s"]), "request_overhead": _us(api["per_request_s"]),
            "detokenize_per_token": _us(api.get("per_token_s", 0.0)),
            "detokenize_step_fixed": _us(api.get("per_message_s", 0.0)), "stream_per_chunk": _us(api["per_chunk_s"])}


def sglang_costs(fits: dict) -> dict:
    """CPUCosts over ``sglang`` (tokenizer manager, scheduler, separate detokenizer) from the fitted CPU
    seconds: the scheduler's per-step, per-request-per-step and per-streamed-chunk costs as its
    scheduling and the entries it streams (``stream_entry_per_request``); the detokenizer's per-step
    cost as its fixed cost per message and its per-chunk cost as the output it builds per chunk; the
    tokenizer manager's per-request cost (with the detokenizer's) as the request overhead and its
    per-chunk cost as the SSE chunk. The tokenizer manager's per-message cost has no term of its own
    in this layout (its messages cost nothing apart, as for vLLM), so it is left out (notes of
    host_path_sglang)."""
    eng, det, api = (fits[k]["coefficients"] for k in ("engine_core_streamed", "detokenizer", "api_server"))
    return {**_APART, "schedule_per_step": _us(eng["per_step_s"]),
            "schedule_per_request": _us(eng["per_request_step_s"]), "stream_entry_per_request": _us(eng["per_chunk_s"]),
            "request_overhead": _us(api["per_request_s"] + det.get("per_request_s", 0.0)),
            "detokenize_step_fixed": _us(det["per_step_s"]), "detokenize_per_token": "0 us",
            "output_per_request": _us(det["per_chunk_s"]), "stream_per_chunk": _us(api["per_chunk_s"])}


def _v0_engine_costs(c: dict) -> dict:
    """What vLLM V0's engine process does in both releases, from the py-spy-split fits' coefficients ``c``: the
    scheduler's, the engine loop's and the asyncio loop's per-step work as its scheduling per step, the
    scheduler's and engine loop's per-request-step work per request, output processing's per-step part as
    the fixed part of a step's output path, detokenization per request-step as the per-token cost (one
    token a step each); prompt tokenization is inside the API server's per-request cost."""
    return {"tokenize_per_token": "0 us",
            "schedule_per_step": _us(c["schedule"]["per_step_s"] + c["engine"]["per_step_s"] + c["loop"]["per_step_s"]),
            "schedule_per_request": _us(c["schedule"]["per_request_step_s"] + c["engine"]["per_request_step_s"]),
            "detokenize_step_fixed": _us(c["output"]["per_step_s"]),
            "detokenize_per_token": _us(c["detokenize"]["per_request_step_s"])}


def _coefficients(fits: dict, names) -> dict:
    return {k: fits[k]["coefficients"] for k in names}


def v0_costs(fits: dict, gc: dict | None = None) -> dict:
    """CPUCosts of vLLM 0.5's one process from the py-spy-split fit (``measure_engine_v0.fit_v0_costs``): its
    engine's work (:func:`_v0_engine_costs`); output processing per request-step as its output objects; the
    API server's per-request cost as the request overhead and per-chunk cost, with the asyncio loop's per
    chunk, as the SSE chunk. ``gc``: the collector's fit (``measure_engine_v0.fit_gc``), where ``fits`` are of
    a sweep with it off. The model runner's input preparation is not run by the stub, so it is not among
    these terms."""
    c = _coefficients(fits, ("schedule", "engine", "output", "detokenize", "api_server", "loop"))
    return {**_v0_engine_costs(c), "output_per_request": _us(c["output"]["per_request_step_s"]),
            "request_overhead": _us(c["api_server"]["per_request_s"]),
            "stream_per_chunk": _us(c["api_server"]["per_chunk_s"] + c["loop"]["per_chunk_s"]),
            **({"gc_per_request_pair": _us(gc["coefficients"]["per_request_pair_s"])} if gc else {})}


def v06_costs(fits: dict) -> dict:
    """CPUCosts of vLLM 0.6 (the engine in its own process) from the fit of its two processes: the engine
    process's work as 0.5's (:func:`_v0_engine_costs`); its output processing per request-step, and the
    pickling and sending of each output with the loop's share per chunk, as its output objects (one per
    chunk: every token streams); the API-server process's per-request and per-chunk CPU (receiving,
    unpickling and streaming each output) as its request overhead and SSE chunk. Messages cost nothing
    apart: their pickling and sending are inside those terms."""
    c = _coefficients(fits, ("schedule", "engine", "output", "detokenize", "ipc", "loop", "api_process"))
    return {**_v0_engine_costs(c), "ipc_per_message": "0 us", "ipc_per_byte": "0 ns",
            "output_per_request": _us(c["output"]["per_request_step_s"] + c["ipc"]["per_chunk_s"]
                                      + c["loop"]["per_chunk_s"]),
            "request_overhead": _us(c["api_process"]["per_request_s"]),
            "stream_per_chunk": _us(c["api_process"]["per_chunk_s"])}


def write_profile(sidecar: dict, path: str | os.PathLike, csv_name: str) -> dict:
    """The measured engine profile (``serving.engine: PATH``) from a measurement's sidecar."""
    m = sidecar["measured"]
    doc = {"engine": {"base": "vllm-v1", "costs": profile_costs(sidecar["fits"])},
           "measured": {"source": f"lastmile measure-engine vllm ({csv_name}): the real vLLM serving stack with a "
                                  "stub GPU; costs fitted from per-process CPU seconds (simulator.calibrate.host_path)",
                        "date": m["date"], "cpu_model": m["cpu_model"], "cpus": m["cpus"],
                        "versions": m["versions"], "fits": sidecar["fits"]}}
    write_yaml(doc, path)
    return doc


def family(points: list[dict], sidecar: dict, profile, engine: str = "vllm", command: str | None = None,
           overlap: str = "async") -> dict:
    """The validation family ``host_path_ENGINE``: each measured point as a case of the stub scenario;
    ``command``: the measure-engine engine that measured it (default ``engine``; its package is the
    version named); ``overlap``: the ``serving.overlap`` of a point with the engine's overlap on (vLLM
    0.6's is ``async_output``)."""
    command = command or engine
    package = command.split("-")[0]
    stub = sidecar["stub_step"]
    limits = sidecar["server_limits"]
    base = {"record_spans": False, "model": STUB_MODEL,
            "hardware": {"gpu": "h100-sxm", "cpu_cores": int(sidecar["measured"]["cpus"]),
                         "step_time": {"fixed": stub["a_s"], "per_decode": stub["b_s"],
                                       "per_prefill_token": stub["c_s"]}},
            "serving": {"engine": profile,  # each engine's names for its limits: vLLM's, then SGLang's
                        "max_batch": int(limits.get("max_num_seqs", limits.get("max_running_requests"))),
                        "max_batched_tokens": int(limits.get("max_num_batched_tokens",
                                                             limits.get("chunked_prefill_size")))},
            "workload": {"arrival": "closed", "concurrency": 1, "requests": 100,
                         "client_cpu": client_cpu(sidecar["fits"])}}
    cases = []
    for r in points:
        prompt = round(r["prefill_tokens"] / r["completed"]) if r.get("prefill_tokens") else int(r["input_len"])
        setting = {"workload.concurrency": int(r["concurrency"]), "workload.requests": int(r["num_prompts"]),
                   "workload.prompt_tokens": prompt, "workload.output_tokens": int(r["output_len"]),
                   "serving.stream_interval": int(r["stream_interval"]), "serving.api_servers": int(r["api_servers"]),
                   "serving.overlap": overlap if r.get("async_scheduling", True) else "sync"}
        label = Point(r["concurrency"], r["stream_interval"], r["api_servers"], r.get("async_scheduling", True),
                      int(r["output_len"])).label
        cases.append({"case": label, "set": setting,
                      "measured": {m: float(f"{r[col]:.6g}") for m, col in METRICS.items()}})
    m = sidecar["measured"]
    return {"family": f"host_path_{engine}",
            "title": f"The real {package} {m['versions'].get(package)} serving stack on this CPU with a stub GPU: "
                     "client TTFT, TPOT and throughput",
            "source": f"scenarios/{REFERENCE.format(engine=engine)} (lastmile measure-engine {command}, "
                      f"{package} {m['versions'].get(package)}, {m['cpu_model']}, {m['date']})",
            "metric": "output_tokens_per_s", "notes": "", "base": base, "cases": cases}


def client_cpu(fits: dict) -> dict:
    """The benchmark client's own CPU on the same cores (``workload.client_cpu``), fitted from its process's
    CPU seconds per request sent and per SSE chunk read (``measure_engine.fit_host_costs``): the
    measurement ran ``vllm bench serve`` unpinned on the server's machine."""
    c = fits["client"]["coefficients"]
    return {"per_request": _us(c["per_request_s"]), "per_chunk": _us(c["per_chunk_s"])}


def reference_path(engine: str = "vllm") -> Path:
    return scenarios_dir() / REFERENCE.format(engine=engine)
