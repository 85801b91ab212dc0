"""The narrow settings an LLM engine replica and the serving frontend read, built once from a scenario."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    """What one engine replica needs: batching limits, KV blocks, overlap, detokenizer placement,
    stream interval, launch mode and the CPU cost profile (for scheduling and output work)."""

    max_batch: int
    max_batched_tokens: int
    block_size: int
    chunked_prefill: bool
    overlap: str
    detokenizer: str
    stream_interval: int
    cuda_graphs: bool
    cpu: object  # a validated CPUCosts

    @classmethod
    def from_scenario(cls, scenario) -> "EngineSettings":
        sv = scenario.serving
        return cls(sv.max_batch, sv.max_batched_tokens, sv.block_size, sv.chunked_prefill, sv.overlap,
                   sv.detokenizer, sv.stream_interval, scenario.hardware.cuda_graphs, scenario.hardware.cpu)


@dataclass(frozen=True)
class FrontendSettings:
    """What the API servers and the router need: routing policy, SSE chunk sizes, CPU costs."""

    router: str
    response_header_bytes: float
    chunk_bytes_per_token: float
    cpu: object  # a validated CPUCosts

    @classmethod
    def from_scenario(cls, scenario) -> "FrontendSettings":
        sv = scenario.serving
        return cls(sv.router, sv.response_header_bytes, sv.chunk_bytes_per_token, scenario.hardware.cpu)
