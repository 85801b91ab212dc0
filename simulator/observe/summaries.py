"""The typed contract of ``summary.json``: one pydantic model per scenario kind.

Every run's summary is validated against its kind's model before it reaches the user, so a key
that a pipeline forgets, misspells or adds without declaring here fails the run's tests rather
than a reader downstream. Keys are the JSON keys users read (``r.summary["ttft_ms"]["p50"]``);
undefined metrics (no request completed) are ``null``.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from .records import DIT_CATEGORIES, LLM_CATEGORIES

Share = Optional[float]
"""A fraction of a total; null when the total is empty."""


class _Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Percentiles(_Summary):
    """p50/p90/p95/p99, mean and standard deviation of one metric over the completed requests
    (null when there are none; p95 and std are null where the samples are a sketch)."""

    p50: Optional[float]
    p90: Optional[float]
    p95: Optional[float] = None
    p99: Optional[float]
    mean: Optional[float]
    std: Optional[float] = None


def _categories(names: tuple[str, ...]):
    def check(value: dict) -> dict:
        if value is not None and tuple(value) != names:
            raise ValueError(f"breakdown categories must be {', '.join(names)}, got {', '.join(value)}")
        return value
    return check


class RunSummary(_Summary):
    """What every run states: which scenario, whether it is whole, and what went wrong if not."""

    kind: str
    scenario: str
    status: Literal["ok", "truncated", "incomplete", "oom"]
    requests_total: Optional[int] = None
    requests_completed: Optional[int] = None
    warnings: list[str] = []
    message: Optional[str] = None  # status oom: what did not fit
    memory_key: Optional[str] = None  # status oom: the scenario key to change


class Throughput(_Summary):
    output_tokens_per_s: Optional[float]
    requests_per_s: Optional[float]
    total_tokens_per_s: Optional[float]


class Tokens(_Summary):
    """Prompt and generated tokens of the completed requests (vllm bench serve's totals)."""

    input_total: int
    output_total: int


class CostPercentiles(_Summary):
    """What the last mile costs in one metric (ms): the run's figure minus the counterfactual's."""

    mean: Optional[float]
    p50: Optional[float]
    p99: Optional[float]


class LastMileCost(_Summary):
    """The counterfactual with the last mile free (``pipelines.llm.counterfactual``): the time it saves
    per metric, the throughput it gains, ITL and E2E cost as shares of the run's means."""

    ttft_ms: CostPercentiles
    itl_ms: CostPercentiles
    tpot_ms: CostPercentiles
    e2e_ms: CostPercentiles
    throughput_gain: Optional[float]
    itl_share: Optional[float]
    e2e_share: Optional[float]
    free_status: Optional[str]


class SLOLimits(_Summary):
    ttft_ms: float
    tpot_ms: float
    e2el_ms: Optional[float] = None


class Goodput(_Summary):
    requests_per_s: Optional[float]
    slo_attainment: Share
    slo: SLOLimits


class ITLStalls(_Summary):
    p99_over_p50: Optional[float]
    gaps_over_2x_median: int


class EngineTimeShare(_Summary):
    """Shares of the engine's time by activity (``llm_metrics.engine_time_share``)."""

    gpu: Share
    schedule: Share
    output: Share
    api_server: Share


class StepGaps(_Summary):
    """GPU idle between consecutive steps of an engine that had work, in ms."""

    mean: Optional[float]
    max: float
    steps: int


class KVCache(_Summary):
    blocks_per_replica: int
    peak_occupancy: Share
    mean_occupancy: Share


class PrefixCacheSummary(_Summary):
    """Prefix caching over all replicas: token-weighted hit rate (vLLM's prefix-cache hit-rate
    metric), hit rate over prefix units (what a trace's block reuse counts), prefill tokens saved."""

    hit_rate: Share
    block_hit_rate: Share
    saved_prefill_tokens: int
    queried_tokens: int
    evicted_units: int


class KVTransferSummary(_Summary):
    """Prefill/decode disaggregation: each completed request's KV-cache transfer from its prefill
    replica to its decode replica, and the bytes all transfers put on the link."""

    link: str
    transfer: str
    transfer_ms: Percentiles
    bytes_total: float
    prefill_replicas: int
    decode_replicas: int


class KVOffloadSummary(_Summary):
    """The host-memory KV tier over all replicas: bytes copied out and back, loads and the tokens
    they restored (prefill not recomputed), entries dropped from a full tier."""

    stored_bytes: float
    loaded_bytes: float
    loads: int
    loaded_tokens: int
    dropped_entries: int


class SpeculativeSummary(_Summary):
    """Speculative decoding over all replicas: draft tokens per step, the per-position acceptance
    rates, the tokens a verify step is expected to emit under them, the mean it emitted
    (acceptance length: accepted drafts plus the bonus, capped by the output length), the share of
    drafts accepted, how many request-steps verified drafts, and the inter-token latency per
    received chunk (the summary's ``itl_ms``; ``itl_per_token_ms`` counts a chunk's further tokens as zero gaps)."""

    tokens: int
    acceptance: list[float]
    expected_tokens_per_step: float
    acceptance_length: Optional[float]
    draft_acceptance_rate: Share
    verify_steps: int
    itl_per_chunk_ms: Optional[Percentiles] = None  # gaps between chunks (null when ITL is sketched)


class LLMMemory(_Summary):
    weights_gib: float
    activations_gib: float
    kv_cache_gib: float
    capacity_gib: float
    sliding_kv_gib: Optional[float] = None  # the sliding-window layers' KV, reserved per batch slot


class StageSummary(_Summary):
    """One load stage (``workload.stages``) over the requests that arrived in it: the stage's
    rate and time window, how many it sent and completed, and their latencies."""

    rate: float
    start_s: float
    duration_s: float
    requests: int
    requests_completed: int
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    slo_attainment: Share


class Cost(_Summary):
    """What the run's GPU-hours cost (``observe.energy``): null figures where nothing prices the GPU."""

    usd_per_hour: Optional[float]
    usd_per_gpu_hour: Optional[float]
    price_source: Optional[str]  # cost.gpu_hour, or the prices.yaml offering
    usd: Optional[float]
    usd_per_request: Optional[float]
    usd_per_mtok_output: Optional[float] = None
    usd_per_mtok_total: Optional[float] = None
    usd_per_image: Optional[float] = None


class Energy(_Summary):
    """The run's energy (``observe.energy``): the GPUs', the hosts' and their total at the facility
    (PUE); per output token, token, request and image the GPUs' alone."""

    gpu_joules: Optional[float]  # null only where absurd timings overflow (non-finite figures are null)
    host_joules: Optional[float]
    pue: float
    total_joules: Optional[float]
    kwh: Optional[float]
    gpu_watts_mean: Optional[float]
    joules_per_output_token: Optional[float] = None
    joules_per_token: Optional[float] = None
    joules_per_image: Optional[float] = None
    joules_per_request: Optional[float]
    power_capped: bool


class LLMSummary(RunSummary):
    """An LLM serving run (``kind: llm``). A layout that does not fit in GPU memory (``status: oom``)
    ran nothing: it has the memory split, the ``message`` and the ``memory_key`` to change instead
    of the metrics, which every other run has."""

    kind: Literal["llm"]
    memory_per_gpu_gib: LLMMemory
    duration_s: Optional[float] = None
    ttft_ms: Optional[Percentiles] = None
    tokens: Optional[Tokens] = None
    itl_ms: Optional[Percentiles] = None  # per received chunk, as vllm bench serve measures it
    itl_per_token_ms: Optional[Percentiles] = None  # a chunk's further tokens counted as 0 s gaps
    tpot_ms: Optional[Percentiles] = None
    e2e_ms: Optional[Percentiles] = None
    throughput: Optional[Throughput] = None
    goodput: Optional[Goodput] = None
    breakdown_share: Optional[dict[str, Share]] = None
    last_mile_share: Share = None
    itl_last_mile_share: Share = None
    last_mile_cost: Optional[LastMileCost] = None
    itl_stalls: Optional[ITLStalls] = None
    itl_quantile_error: Optional[float] = None  # set when the ITL percentiles come from a sketch
    utilization: Optional[dict[str, Share]] = None
    engine_time_share: Optional[EngineTimeShare] = None
    step_gap_ms: Optional[StepGaps] = None
    kv_cache: Optional[KVCache] = None
    prefix_cache: Optional[PrefixCacheSummary] = None
    disaggregation: Optional[KVTransferSummary] = None
    kv_offload: Optional[KVOffloadSummary] = None
    speculative: Optional[SpeculativeSummary] = None
    steps: Optional[int] = None
    preemptions: Optional[int] = None
    stages: Optional[list[StageSummary]] = None
    cost: Optional[Cost] = None
    energy: Optional[Energy] = None

    _breakdown = field_validator("breakdown_share")(_categories(LLM_CATEGORIES))

    @model_validator(mode="after")
    def _metrics_unless_oom(self):
        ran = ("duration_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "throughput", "goodput",
               "breakdown_share", "itl_stalls", "utilization", "kv_cache", "steps", "preemptions")
        if self.status == "oom":
            if self.message is None or self.memory_key is None:
                raise ValueError("an oom summary needs message and memory_key")
        else:
            missing = [k for k in ran if k not in self.model_fields_set]
            if missing:
                raise ValueError(f"a run that ran needs {', '.join(missing)}")
        return self


class DiTUtilization(_Summary):
    gpu: dict[str, Share]
    link: dict[str, Share]
    cpu: dict[str, Share]


class DiTServingSummary(_Summary):
    """How a DiT service ran its passes (``pipelines.dit.results.serving_summary``)."""

    policy: str
    max_batch: int
    preempt: bool
    passes: int
    batch_mean: Optional[float]
    batch_max: Optional[int]
    preemptions: int
    shapes: int


class DiTGoodput(_Summary):
    images_per_s: float
    slo_attainment: Share
    slo: dict[Literal["latency_s"], float]


class DiTSummary(RunSummary):
    """A DiT run (``kind: dit``); an out-of-memory layout (``status: oom``) states the memory it
    needed and the GPU's, and null metrics."""

    kind: Literal["dit"]
    model: str
    gpu: str
    gpus: int
    resolution: str
    frames: Optional[int] = None
    steps: int
    strategy: str
    memory_needed_gib: float
    gpu_memory_gib: Optional[float] = None
    latency_s: Optional[Percentiles] = None
    breakdown_share: Optional[dict[str, Share]] = None
    breakdown_mean_s: Optional[dict[str, Optional[float]]] = None
    last_mile_share: Share = None
    memory_per_gpu_gib: Optional[float] = None
    throughput: Optional[dict[Literal["images_per_s"], Optional[float]]] = None
    cost: Optional[Cost] = None
    energy: Optional[Energy] = None
    comm_bytes_per_gpu: Optional[float] = None
    utilization: Optional[DiTUtilization] = None
    serving: Optional[DiTServingSummary] = None
    goodput: Optional[DiTGoodput] = None

    _breakdown = field_validator("breakdown_share", "breakdown_mean_s")(_categories(DIT_CATEGORIES))


class TokenPipelineSummary(RunSummary):
    """One sequence through a token-level pipeline (``kind: token_pipeline``)."""

    kind: Literal["token_pipeline"]
    model: str
    causal: bool
    sequence_tokens: int
    stages: int
    slices: int
    slicing: str
    latency_s: Percentiles
    bubble_fraction: Share
    slice_tokens: list[int]
    slice_time_s: list[float]
    slice_cost_spread: Optional[float]
    utilization: dict[Literal["gpu"], dict[str, Share]]


class PipelineStageSummary(_Summary):
    """One stage of a request pipeline over the completed requests: its resource, how many ran it
    (the rest were cache hits), its time from ready to end (queue wait included) and its wait for
    the resource, and the share of requests whose critical path passes through it."""

    resource: str
    kind: str
    role: Literal["stage", "prefix"]
    ran: int
    cache_hits: int
    time_ms: Percentiles
    wait_ms: Percentiles
    critical: Share


class CriticalPath(_Summary):
    path: str
    requests: int
    share: float


class PipelineSummary(RunSummary):
    """A request-pipeline run (``kind: pipeline``). ``breakdown_share``: each stage's share of all
    completed requests' E2E, charged along each request's critical path (the shares sum to 1; a
    stage's charge includes its queue wait)."""

    kind: Literal["pipeline"]
    output_stage: str
    duration_s: float
    ttft_ms: Percentiles
    e2e_ms: Percentiles
    latency_s: Percentiles
    throughput: dict[Literal["requests_per_s"], Optional[float]]
    breakdown_share: dict[str, Share]
    critical_paths: list[CriticalPath]
    stages: dict[str, PipelineStageSummary]
    utilization: dict[str, Share]
    llm: Optional[dict[str, "PipelineLLMSummary"]] = None
    dit: Optional[dict[str, "PipelineDiTSummary"]] = None


class PipelineLLMSummary(_Summary):
    """One llm resource of a pipeline: its calls as the serving deployment saw them (arrival at its
    API server to the client's receipt), with the LLM kind's eight categories and last mile."""

    calls: int
    calls_completed: int
    ttft_ms: Optional[Percentiles]
    tpot_ms: Optional[Percentiles]
    e2e_ms: Optional[Percentiles]
    breakdown_share: Optional[dict[str, Share]]
    last_mile_share: Share
    prefix_saved_tokens: Optional[int]

    _breakdown = field_validator("breakdown_share")(_categories(LLM_CATEGORIES))



class PipelineDiTSummary(_Summary):
    """One dit resource of a pipeline: its images as the DiT deployment saw them (handed to it to
    delivered), with the DiT kind's categories and last mile."""

    calls: int
    calls_completed: int
    latency_ms: Percentiles
    breakdown_share: dict[str, Share]
    last_mile_share: Share

    _breakdown = field_validator("breakdown_share")(_categories(DIT_CATEGORIES))


PipelineSummary.model_rebuild()
