"""The narrow settings an LLM engine replica and the serving frontend read, built once from a scenario."""

from __future__ import annotations

from dataclasses import dataclass

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
    long_prefill_token_threshold: int = LONG_PREFILL_TOKEN_THRESHOLD

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
