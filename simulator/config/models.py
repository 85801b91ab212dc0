"""Typed, validated scenario models. Catalog names are resolved to dicts before validation."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from .quantities import Bandwidth, Bytes, Flops, PositiveSeconds, Rate, Seconds


class Strict(BaseModel):
    """Base model: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Fraction = Field(gt=0, le=1)


class Achievable(Strict):
    """Fractions of peak that real kernels reach."""

    matmul: float = Fraction
    matmul_fp8: float = Fraction
    hbm: float = Fraction


class GPUSpec(Strict):
    """One GPU: peak compute per dtype, memory, HBM bandwidth and fixed per-kernel costs."""

    name: str
    peak_flops: dict[Literal["bf16", "fp16", "fp8", "fp32"], Flops]
    memory: Bytes
    hbm_bandwidth: Bandwidth
    sm_count: PositiveInt
    achievable: Achievable
    kernel_overhead: Seconds
    launch_overhead: Seconds
    gpu_link: Optional[str] = None
    host_link: str = "pcie4-x16"
    sources: dict[str, str] = {}
    measured: Optional[dict] = None


class LinkSpec(Strict):
    """A link: nominal bandwidth per direction, one-way latency, achievable fraction."""

    name: str
    bandwidth: Bandwidth
    latency: Seconds
    achievable: float = Fraction
    allreduce_busbw: Optional[Bandwidth] = None
    sources: dict[str, str] = {}

    @property
    def effective_bandwidth(self) -> float:
        """What a bulk copy reaches: nominal bandwidth x achievable fraction."""
        return self.bandwidth * self.achievable

    @property
    def allreduce_bandwidth(self) -> float:
        """Bus bandwidth of an all-reduce: the measured NCCL figure where there is one."""
        if self.allreduce_busbw is None:
            return self.effective_bandwidth
        return min(self.allreduce_busbw, self.effective_bandwidth)


class CPUCosts(Strict):
    """CPU cost of each piece of per-request Python in the serving stack."""

    name: str = "custom"
    tokenize_per_token: Seconds
    request_overhead: Seconds
    schedule_per_step: Seconds
    schedule_per_request: Seconds
    detokenize_per_token: Seconds
    detokenize_step_fixed: Seconds = 0.0
    output_per_request: Seconds
    stream_per_chunk: Seconds
    source: str = ""
    sources: dict[str, str] = {}
    measured: Optional[dict] = None


class LLMSpec(Strict):
    """A decoder-only transformer's shape (dense, GQA or MoE)."""

    name: str
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    ffn: PositiveInt
    vocab: PositiveInt
    experts: PositiveInt = 1
    top_k: PositiveInt = 1
    tokenizer: str = "byte-level-bpe"
    sources: dict[str, str] = {}

    @model_validator(mode="after")
    def _check(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        return self


class Hardware(Strict):
    """The box: GPU type, the links around it, the host CPU and its cost profile."""

    gpu: GPUSpec
    gpu_link: Optional[LinkSpec] = None
    host_link: LinkSpec
    node_link: Optional[LinkSpec] = None
    client_link: LinkSpec
    cpu_cores: PositiveInt = 16
    gpus_per_node: PositiveInt = 8
    cpu: CPUCosts
    cuda_graphs: bool = True


class LLMParallel(Strict):
    """Tensor, pipeline and data (replica) parallelism of an LLM deployment."""

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    replicas: PositiveInt = 1


class Serving(Strict):
    """Engine settings: batching, KV cache, CPU layout, overlap and streaming."""

    max_batch: PositiveInt = 256
    max_batched_tokens: PositiveInt = 8192
    chunked_prefill: bool = True
    overlap: Literal["sync", "async"] = "sync"
    detokenizer: Literal["engine", "separate", "api_server"] = "engine"
    api_servers: PositiveInt = 1
    stream_interval: PositiveInt = 1
    block_size: PositiveInt = 16
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    router: Literal["round_robin", "least_outstanding"] = "round_robin"
    chunk_bytes_per_token: Bytes = 24.0
    response_header_bytes: Bytes = 200.0


class Distribution(Strict):
    """A token-count distribution: fixed, uniform[low, high] or lognormal(median, sigma)."""

    dist: Literal["fixed", "uniform", "lognormal"] = "fixed"
    value: Optional[PositiveInt] = None
    low: Optional[PositiveInt] = None
    high: Optional[PositiveInt] = None
    median: Optional[float] = Field(None, gt=0)
    sigma: Optional[float] = Field(None, ge=0)
    max: Optional[PositiveInt] = None

    @model_validator(mode="after")
    def _check(self):
        need = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("median", "sigma")}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.dist} distribution needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self


TokenCount = Union[PositiveInt, Distribution]


class Workload(Strict):
    """Who sends what, when: arrival process and prompt/output lengths (or a trace)."""

    requests: PositiveInt = 200
    arrival: Literal["poisson", "gamma", "constant", "all_at_once", "closed", "trace"] = "poisson"
    rate: Optional[Rate] = 4.0
    burstiness: float = Field(1.0, gt=0)
    concurrency: Optional[PositiveInt] = None
    trace: Optional[str] = None
    trace_time_scale: float = Field(1.0, gt=0)
    prompt_tokens: TokenCount = 512
    output_tokens: TokenCount = 128

    @model_validator(mode="after")
    def _check(self):
        if self.arrival == "closed" and self.concurrency is None:
            raise ValueError("arrival 'closed' needs workload.concurrency")
        if self.arrival == "trace" and not self.trace:
            raise ValueError("arrival 'trace' needs workload.trace (a CSV path)")
        if self.arrival in ("poisson", "gamma", "constant") and self.rate is None:
            raise ValueError(f"arrival '{self.arrival}' needs workload.rate")
        return self


class SLO(Strict):
    """Service-level objectives; a request meets them if TTFT and its mean ITL are within."""

    ttft: PositiveSeconds = 1.0
    itl: PositiveSeconds = 0.1


class ScenarioBase(Strict):
    """What every kind of scenario has: its kind, a name, a seed, the dtype and the hardware."""

    kind: str
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    hardware: Hardware
    record_spans: bool = True


class LLMScenario(ScenarioBase):
    """A complete LLM-serving scenario."""

    kind: Literal["llm"] = "llm"
    model: LLMSpec
    parallel: LLMParallel = LLMParallel()
    serving: Serving = Serving()
    workload: Workload = Workload()
    slo: SLO = SLO()
    max_sim_time: Optional[PositiveSeconds] = None
