"""The narrow settings an LLM engine replica and the serving frontend read, built once from a scenario."""

from __future__ import annotations

from dataclasses import dataclass

from .run_support import declare

# How closed-form runs of steps cover the serving keys this module owns (run_support): the
# counterfactual's free last mile is zero costs, which a run reads as any others.
declare("last_mile", owner="settings")

# vLLM's SchedulerConfig.long_prefill_token_threshold default (vllm/config/scheduler.py,
# github.com/vllm-project/vllm commit 01230b40128e570a58e54e75f7e55c4d5cd9246d): 0, no clamp, so a
# prompt chunk is limited by the token budget alone. vLLM sets it to 4% of max_model_len only when
# max_num_partial_prefills > 1 (default 1); its V1 scheduler reads the threshold and nothing else
# of the partial-prefill settings. No scenario key yet: ``serving.long_prefill_token_threshold``.
LONG_PREFILL_TOKEN_THRESHOLD = 0


@dataclass(frozen=True)
class EngineSettings:
    """What one engine replica needs: batching limits, KV blocks, overlap, detokenizer placement,
    stream interval, launch mode and the CPU cost profile (for scheduling and output work).

    ``long_prefill_token_threshold`` caps the tokens one request gets in a step (0: no cap), as
    vLLM's scheduler does; it is vLLM's default until a scenario key sets it."""

    max_batch: int
    max_batched_tokens: int
    block_size: int
    chunked_prefill: bool
    overlap: str
    detokenizer: str
    stream_interval: int
    cuda_graphs: bool
    cpu: object  # a validated CPUCosts
    api_server_process: str = "own"
    multi_step: int = 1
    long_prefill_token_threshold: int = LONG_PREFILL_TOKEN_THRESHOLD
    prefix_cache_insert: str = "allocate"
    free_last_mile: bool = False  # the counterfactual: the outputs' path costs nothing (``serving.last_mile``)
    graph_capture: object = None  # a GraphCapture: which steps have captured graphs (None: every step)

    @classmethod
    def from_scenario(cls, scenario) -> "EngineSettings":
        sv = scenario.serving
        free = sv.last_mile == "free"
        return cls(sv.max_batch, sv.max_batched_tokens, sv.block_size, sv.chunked_prefill, sv.overlap,
                   sv.detokenizer, sv.stream_interval, scenario.hardware.cuda_graphs,
                   last_mile_costs(scenario.hardware.cpu, free), sv.api_server_process, sv.multi_step,
                   prefix_cache_insert=sv.prefix_cache_insert, free_last_mile=free,
                   graph_capture=sv.graph_capture.for_batch(sv.max_batch))

    def replays_graph(self, tokens: int, prefill: bool) -> bool:
        """Whether a step of ``tokens`` tokens (``prefill``: with prompt chunks in it) replays a CUDA graph:
        graphs on, and the engine captured one for such a step (``GraphCapture.covers``)."""
        return self.cuda_graphs and (self.graph_capture is None or self.graph_capture.covers(tokens, prefill))

    @property
    def outputs_cross_to_api(self) -> bool:
        """Whether a step's outputs travel to an API server in another process as a message."""
        return self.api_server_process == "own"


@dataclass(frozen=True)
class FrontendSettings:
    """What the API servers and the router need: routing policy, SSE chunk sizes, CPU costs."""

    router: str
    response_header_bytes: float
    chunk_bytes_per_token: float
    cpu: object  # a validated CPUCosts
    shared: bool = False  # each API server runs in its replica's engine process (one GIL for both)
    free_last_mile: bool = False  # the counterfactual: the outputs' path costs nothing (``serving.last_mile``)
    seed: int = 0  # the scenario's: a router's random stream (``routers.make_router``)
    client_cpu: object = None  # a validated ClientCPU: the load generator on the host's cores (``workload.client_cpu``)
    loop: str = "fifo"  # ``serving.api_server_loop``: how an API server runs its work (``frontend.API_SERVER_LOOPS``)

    @classmethod
    def from_scenario(cls, scenario) -> "FrontendSettings":
        sv = scenario.serving
        free = sv.last_mile == "free"
        return cls(sv.router, sv.response_header_bytes, sv.chunk_bytes_per_token,
                   last_mile_costs(scenario.hardware.cpu, free), sv.api_server_process == "engine", free,
                   scenario.seed, scenario.workload.client_cpu, sv.api_server_loop)


LAST_MILE_CPU_COSTS = ("detokenize_per_token", "detokenize_step_fixed", "output_per_request", "stream_per_chunk")
"""The CPU costs of the outputs' path: the last mile's detokenization, output objects and SSE chunks."""


def last_mile_costs(cpu, free: bool):
    """The CPU cost profile the engines and API servers run with: ``cpu`` itself, or, for the
    counterfactual with the last mile free, a copy whose output-path costs are zero."""
    return cpu.model_copy(update=dict.fromkeys(LAST_MILE_CPU_COSTS, 0.0)) if free else cpu


def schedule_cost(cpu, batch: int) -> float:
    """CPU seconds to schedule a step of ``batch`` requests and prepare its inputs (building the input
    tensors, their H2D copy): per step and per request, for both; and CPython's cyclic garbage collector
    in the engine's process, whose share of a step grows with the batch squared (each collection walks
    every live request's objects, and each request's allocations in the step set how often it runs:
    ``gc_per_request_pair``, measured in vLLM 0.5.3 with the collector on and off)."""
    return (cpu.schedule_per_step + cpu.schedule_per_request * batch + cpu.prepare_per_step
            + cpu.prepare_per_request * batch + cpu.gc_per_request_pair * batch * batch)


def dispatch_cost(cpu, gpus: int) -> float:
    """CPU seconds per step for an engine's driver to start the step on the replica's other GPU workers
    and collect them (vLLM V0 before 0.4.3 called each worker as a Ray task every step): none on one GPU."""
    return cpu.dispatch_per_step if gpus > 1 else 0.0


def detokenize_cost(cpu, tokens: int) -> float:
    """CPU seconds to detokenize a step's ``tokens``."""
    return cpu.detokenize_step_fixed + cpu.detokenize_per_token * tokens


def outputs_cost(cpu, chunks: int) -> float:
    """CPU seconds to build the output objects of a step's ``chunks`` (one per request it streams to)."""
    return cpu.output_per_request * chunks


def output_message_cost(settings, requests: int) -> float:
    """CPU seconds at one end of a message carrying ``requests`` entries of a step's outputs (free in
    the counterfactual with the last mile free; a request's own message in is never free)."""
    return 0.0 if settings.free_last_mile else message_cost(settings.cpu, requests)


def message_cost(cpu, requests: int, extra_bytes: float = 0.0) -> float:
    """CPU seconds at one end of an inter-process message carrying ``requests`` entries (serialize
    and send, or receive and deserialize): a per-message cost plus a per-byte cost."""
    return cpu.ipc_per_message + cpu.ipc_per_byte * (cpu.ipc_bytes_per_request * requests + extra_bytes)


TOKEN_ID_BYTES = 5.0
"""Bytes of one prompt token id in a request message: a msgpack uint32 (vllm/v1/serial_utils.py
encodes the prompt's ids as a list of ints; ids of real vocabularies exceed 65,535)."""
