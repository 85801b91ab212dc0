"""Typed, validated scenario models. Catalog names are resolved to dicts before validation."""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from ..errors import ConfigError
from .quantities import (NO_BOOL, Bandwidth, Bytes, CallSeconds, Count, Flops, Fraction, Horizon, Int, Number,
                         PositiveSeconds, Rate, Seconds, Watts, Whole)

LOGNORMAL_TAIL_SIGMAS = 6
"""A lognormal without ``max`` is bounded at median x exp(6 sigma) for admission checks: a draw
lies beyond it with probability 1e-9 (the normal tail at 6 sigma), so no realistic run meets one."""

MAX_CONTEXT = 1 << 24
"""Most tokens a sequence may hold (16 M; the longest published context windows are 10 M)."""


class Strict(BaseModel):
    """Base model: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class Achievable(Strict):
    """Fractions of peak that real kernels reach."""

    matmul: Fraction
    matmul_fp8: Fraction
    hbm: Fraction


class PowerSpec(Strict):
    """A GPU's power (``observe.energy``): its board power limit, its idle draw, and its server's
    non-GPU power per GPU (CPUs, memory, NICs, NVSwitches, fans; None where no figure is known)."""

    max: Watts
    idle: Watts
    host: Optional[Watts] = None

    @model_validator(mode="after")
    def _ordered(self):
        if not self.idle < self.max:
            raise ValueError(f"power needs idle < max, got idle {self.idle:g} W, max {self.max:g} W")
        return self


class GPUSpec(Strict):
    """One GPU: peak compute per dtype, memory, HBM bandwidth and fixed per-kernel costs."""

    name: str
    peak_flops: dict[Literal["bf16", "fp16", "fp8", "fp4", "fp32"], Flops]
    memory: Bytes
    hbm_bandwidth: Bandwidth
    sm_count: Count(4096)
    achievable: Achievable
    kernel_overhead: Seconds
    kernel_floor: Seconds = 0.0
    launch_overhead: Seconds
    gemm_mainloop: Literal["multistage", "warp_specialized"] = "multistage"
    arch: Literal["volta", "ampere", "ada", "hopper", "blackwell", "cdna3", "other"] = "other"
    gpu_link: Optional[str] = None
    host_link: str = "pcie4-x16"
    power: Optional[PowerSpec] = None
    offering: Optional[str] = None  # the catalog's prices.yaml entry that prices it by default
    sources: dict[str, str] = {}
    measured: Optional[dict] = None


class KernelAllReduceSpec(Strict):
    """Measured closed forms of an engine's own all-reduce kernels on a link: a fixed cost and a
    per-GPU peer-read rate each for the one-shot and the two-shot kernel."""

    oneshot_latency: Seconds
    oneshot_bandwidth: Bandwidth
    twoshot_latency: Seconds
    twoshot_bandwidth: Bandwidth


class LinkSpec(Strict):
    """A link: nominal bandwidth per direction, one-way latency, achievable fraction."""

    name: str
    bandwidth: Bandwidth
    latency: Seconds
    achievable: Fraction
    allreduce_busbw: Optional[Bandwidth] = None
    fully_connected: bool = False
    kernel_allreduce: Optional[KernelAllReduceSpec] = None
    nccl_bandwidth: Optional[Bandwidth] = None
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


class NodeSpec(Strict):
    """A node type (catalog ``nodes``): how its GPUs are wired — NVLink domain, PCIe switches
    under CPU sockets, peer-to-peer capability, NICs. ``hardware.node`` selects one."""

    name: str
    gpu: str
    gpus: Count(1024)
    nvlink: Optional[LinkSpec] = None
    nvlink_domain: Count(100_000)
    nvls: bool = False
    pcie: LinkSpec
    gpus_per_switch: Annotated[int, Field(ge=0, le=1024)] = 0
    switch_uplink: Optional[LinkSpec] = None
    sockets: Count(64) = 1
    socket_link: Optional[LinkSpec] = None
    p2p: Literal["all", "switch", "none"] = "switch"
    nic: Optional[LinkSpec] = None
    nics: Annotated[int, Field(ge=0, le=1024)] = 0
    shm: Optional[LinkSpec] = None  # host-memory staging of a copy between GPUs without peer access
    sources: dict[str, str] = {}

    @model_validator(mode="after")
    def _check(self):
        if self.gpus % self.sockets:
            raise ValueError(f"{self.gpus} GPUs do not split evenly over {self.sockets} sockets")
        if self.gpus_per_switch and (self.gpus // self.sockets) % self.gpus_per_switch:
            raise ValueError(f"{self.gpus // self.sockets} GPUs per socket do not fill switches of "
                             f"{self.gpus_per_switch}")
        if self.gpus_per_switch and self.switch_uplink is None:
            raise ValueError("a node with PCIe switches needs switch_uplink")
        if self.sockets > 1 and self.socket_link is None:
            raise ValueError("a node with several sockets needs socket_link")
        if self.nvlink_domain % self.gpus:
            raise ValueError(f"nvlink_domain={self.nvlink_domain} is not a whole number of {self.gpus}-GPU nodes")
        if self.nics and self.gpus % self.nics:
            raise ValueError(f"{self.nics} NICs do not split evenly over {self.gpus} GPUs")
        return self


class CPUCosts(Strict):
    """CPU cost of each piece of Python in the serving stack, as functions of the work: per request
    (``request_overhead``, ``tokenize_per_token``), per step and per request in a step (scheduling,
    input preparation, starting the step on a replica's other GPU workers, output processing), per
    token (detokenization), per streamed chunk, and per message and byte between processes
    (serialize and send at one end, receive and deserialize at the other)."""

    name: str = "custom"
    tokenize_per_token: CallSeconds
    request_overhead: CallSeconds
    schedule_per_step: CallSeconds
    schedule_per_request: CallSeconds
    prepare_per_step: CallSeconds = 0.0
    prepare_per_request: CallSeconds = 0.0
    gc_per_request_pair: CallSeconds = 0.0
    dispatch_per_step: CallSeconds = 0.0
    detokenize_per_token: CallSeconds
    detokenize_step_fixed: CallSeconds = 0.0
    output_per_request: CallSeconds
    stream_per_chunk: CallSeconds
    stream_entry_per_request: CallSeconds = 0.0
    ipc_per_message: CallSeconds = 0.0
    ipc_per_byte: CallSeconds = 0.0
    ipc_bytes_per_request: Annotated[float, Field(ge=0, le=1e9)] = 0.0

    @property
    def has_ipc(self) -> bool:
        """Whether a message between processes costs anything (else none is booked)."""
        return bool(self.ipc_per_message or self.ipc_per_byte)
    source: str = ""
    sources: dict[str, str] = {}
    measured: Optional[dict] = None


class MLASpec(Strict):
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 Sec. 2.1): keys and values cached as
    one ``kv_lora_rank``-wide latent plus a ``rope_head_dim``-wide shared rotary key per token and
    layer; queries through a ``q_lora_rank`` bottleneck (0: projected directly)."""

    kv_lora_rank: Count(1 << 16)
    rope_head_dim: Count(1024)
    nope_head_dim: Count(1024)
    v_head_dim: Count(1024)
    q_lora_rank: Whole(1 << 16) = 0


class WeightQuant(Strict):
    """A quantized checkpoint: the format of its weights and which of them it covers (every linear
    layer but the LM head, or the MoE experts alone, as gpt-oss's MXFP4 checkpoint does)."""

    format: Literal["fp8", "mxfp4", "nvfp4", "int4"]  # each with its bits in workloads.weights (a test checks)
    modules: Literal["linear", "experts"] = "linear"
    group_size: Count(1 << 16) = 128  # int4 only: elements per fp16 scale and 4-bit zero point


class LLMSpec(Strict):
    """A decoder-only transformer's shape (dense, GQA, MLA or MoE; optionally sliding-window layers,
    leading dense layers, shared experts and a quantized checkpoint)."""

    name: str
    layers: Count(1024)
    hidden: Count(1 << 17)
    heads: Count(1024)
    kv_heads: Count(1024)
    head_dim: Count(1024)
    ffn: Count(1 << 20)
    vocab: Count(1 << 22)
    context_length: Count(MAX_CONTEXT)
    experts: Count(1024) = 1
    top_k: Count(1024) = 1
    shared_ffn: Whole(1 << 20) = 0      # intermediate size of the shared experts every token runs
    dense_layers: Whole(1024) = 0       # leading layers with a dense MLP in an MoE (DeepSeek's first_k_dense_replace)
    dense_ffn: Whole(1 << 20) = 0       # their intermediate size
    sliding_window: Optional[Count(MAX_CONTEXT)] = None
    sliding_layers: Whole(1024) = 0     # layers attending to the last sliding_window tokens only
    mla: Optional[MLASpec] = None
    weights: Optional[WeightQuant] = None
    tied_embeddings: bool = False        # the LM head is the embedding matrix (tie_word_embeddings)
    tokenizer: str = "byte-level-bpe"
    sources: dict[str, str] = {}

    @model_validator(mode="after")
    def _check(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        if (self.dense_layers or self.shared_ffn) and self.experts == 1:
            raise ValueError("dense_layers and shared_ffn describe an MoE: set experts > 1")
        if self.dense_layers >= self.layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must be fewer than layers ({self.layers})")
        if self.dense_layers and not self.dense_ffn:
            raise ValueError("dense_layers needs dense_ffn, the dense layers' intermediate size")
        if bool(self.sliding_layers) != (self.sliding_window is not None):
            raise ValueError("sliding_window and sliding_layers go together (the window, and how many layers use it)")
        if self.sliding_layers >= self.layers:
            raise ValueError(f"sliding_layers ({self.sliding_layers}) must be fewer than layers ({self.layers}): the "
                             "KV pool counts the full-attention layers' tokens")
        if self.mla is not None and self.sliding_layers:
            raise ValueError("sliding-window MLA layers are not modelled")
        if self.weights is not None and self.weights.modules == "experts" and self.experts == 1:
            raise ValueError("weights.modules: experts needs an MoE (experts > 1)")
        return self


class StepTime(Strict):
    """A GPU step given as a function of its batch instead of the roofline: ``fixed + per_decode x
    decode requests + per_prefill_token x prefill tokens`` seconds. It is what ``lastmile
    measure-engine``'s stub executor sleeps per step, so a simulated run and a real engine's host
    stack driven against the stub see the same GPU."""

    fixed: Seconds = 0.0
    per_decode: Seconds = 0.0
    per_prefill_token: Seconds = 0.0

    def of(self, decode_requests: int, prefill_tokens: int) -> float:
        return self.fixed + self.per_decode * decode_requests + self.per_prefill_token * prefill_tokens


class Hardware(Strict):
    """The box: GPU type, the links around it, the host CPU and its cost profile."""

    gpu: GPUSpec
    gpu_link: Optional[LinkSpec] = None
    host_link: LinkSpec
    node_link: Optional[LinkSpec] = None
    client_link: LinkSpec
    cpu_cores: Count(4096) = 16
    gpus_per_node: Count(1024) = 8
    cpu: CPUCosts
    cuda_graphs: bool = True
    node: Optional[NodeSpec] = None
    step_time: Optional[StepTime] = None


class LLMParallel(Strict):
    """Tensor, pipeline and data (replica) parallelism of an LLM deployment."""

    tp: Count(1024) = 1
    pp: Count(1024) = 1
    expert_parallel: bool = False  # vLLM's --enable-expert-parallel: whole experts sharded across the TP ranks
    dp_attention: bool = False     # SGLang's --enable-dp-attention: attention data-parallel over the tp ranks
    expert_skew: Annotated[float, NO_BOOL, Field(ge=0, le=4, allow_inf_nan=False)] = 0.0
    eplb: bool = False             # vLLM's --enable-eplb: DeepSeek's EPLB places (and replicates) the experts
    redundant_experts: Whole(4096) = 0  # EPLB's extra replicas (eplb_config num_redundant_experts)
    allreduce: Literal["vllm", "nccl"] = "vllm"
    replicas: Count(10_000) = 1


class Pool(Strict):
    """One pool of a disaggregated deployment: its engine replicas and their tensor parallelism."""

    replicas: Count(10_000) = 1
    tp: Count(1024) = 1


class Disaggregation(Strict):
    """Prefill/decode disaggregation (DistServe, Splitwise, Mooncake; vLLM's and SGLang's P/D modes):
    prompts are computed on the prefill pool, their KV cache crosses ``kv_link`` (a links catalog
    name or mapping; None: the topology's route between the two GPUs) to a decode replica, which
    generates every output token. ``transfer``: the whole KV after the prefill, or layer by layer
    as each layer is computed (overlapped with the prefill, as Mooncake's transfer engine and vLLM's
    NIXL connector stream it)."""

    prefill: Pool = Pool()
    decode: Pool = Pool()
    kv_link: Optional[LinkSpec] = None
    transfer: Literal["whole", "layerwise"] = "layerwise"


class GraphCapture(Strict):
    """Which steps an engine replays as a CUDA graph (one launch) rather than launching each kernel:
    those of at most ``max_tokens`` tokens (None: every size) and at most ``per_sequence`` tokens per
    sequence the engine may batch (``serving.max_batch``; None: no such bound), of every kind or
    decode-only steps."""

    max_tokens: Optional[Count(MAX_CONTEXT)] = None
    per_sequence: Optional[Count(64)] = None
    steps: Literal["all", "decode_only"] = "all"
    sizes: Optional[list[Count(MAX_CONTEXT)]] = None  # only steps of exactly these sizes (no padding)

    def for_batch(self, max_batch: int) -> "GraphCapture":
        """This capture for an engine of ``max_batch`` sequences: ``max_tokens`` bounded by
        ``per_sequence`` x ``max_batch`` (vLLM sizes its captures from max_num_seqs)."""
        if self.per_sequence is None:
            return self
        bound = self.per_sequence * max_batch
        return self.model_copy(update={"max_tokens": bound if self.max_tokens is None else min(self.max_tokens, bound),
                                       "per_sequence": None})

    def covers(self, tokens: int, prefill: bool) -> bool:
        """Whether a step of ``tokens`` tokens (``prefill``: with prompt chunks) has a captured graph: of
        a kind captured, no larger than the largest (padded up to a captured size, as vLLM and SGLang
        do) or, where only listed sizes replay (TensorRT-LLM without padding), of one of them."""
        if prefill and self.steps == "decode_only":
            return False
        if self.sizes is not None and tokens not in self.sizes:
            return False
        return self.max_tokens is None or tokens <= self.max_tokens


class EngineKernels(Strict):
    """The kernels an engine's step runs. ``decode_attention``, ``allreduce`` and ``cuda_graphs`` are
    modelled (the loader lays them under ``serving.decode_attention``, ``parallel.allreduce`` and
    ``serving.graph_capture`` where the scenario does not set them); the
    others name what the engine runs, with sources, for the figures still to model (issue 26)."""

    attention: str = ""
    decode_attention: Literal["paged", "contiguous"] = "paged"
    gemm: str = ""
    allreduce: Literal["vllm", "nccl"] = "vllm"
    sampler: str = ""
    cuda_graphs: GraphCapture = GraphCapture()


class EngineProfile(Strict):
    """A named serving stack (``serving.engine``): what it is, the CPU costs it runs with (a
    ``cpus`` catalog entry, plus ``costs`` over it) and the serving defaults it sets. The loader
    applies ``cpu``/``costs`` and ``serving`` where the scenario does not set them itself."""

    name: str = "custom"
    version: str = ""
    description: str = ""
    cpu: str = "reference"
    costs: dict = {}
    serving: dict = {}
    kernels: EngineKernels = EngineKernels()
    sources: dict[str, str] = {}
    measured: Optional[dict] = None


class KVOffload(Strict):
    """A host-memory tier for KV blocks (vLLM's CPU offloading, LMCache, SGLang HiCache): evicted
    prefix blocks and preempted requests' KV are copied there and back instead of recomputed."""

    capacity: Bytes
    link: Optional[LinkSpec] = None
    policy: Literal["write_through", "write_back"] = "write_through"


MAX_SPECULATIVE_TOKENS = 16
"""Most draft tokens per step: vLLM's examples and the EAGLE/Spec-Bench configurations propose
1-10 per request (Spec-Bench's PLD 10, EAGLE-3 chains of 3-7 in vLLM's P-EAGLE post); beyond 16
the acceptance of the last positions is nil in every published measurement."""

Acceptance = Annotated[float, NO_BOOL, Field(ge=0, le=1, allow_inf_nan=False)]
"""A per-position acceptance probability in [0, 1] (0: every draft rejected; 1: every one accepted)."""


class Speculative(Strict):
    """Speculative decoding (vLLM ``speculative_config``, SGLang ``--speculative-algorithm``): each
    decode step a proposer drafts ``tokens`` tokens per running request, the target verifies them
    and the draft's first ``a`` agree with it; the request emits a + 1 tokens (the bonus).

    ``method``: ``draft`` (a small LLM, ``draft_model``, on the same GPUs, ``draft_tp`` of them),
    ``eagle`` (a one-layer head on the target's hidden states), ``ngram`` (prompt lookup on the
    engine's CPU). ``acceptance``: the probability that each draft position is accepted given the
    ones before were — one rate for every position or a list per position (default: the method's
    sourced rate, ``pipelines.llm.speculative.SPEC_METHODS``)."""

    method: Literal["draft", "eagle", "ngram"]
    tokens: Annotated[int, NO_BOOL, Field(ge=1, le=MAX_SPECULATIVE_TOKENS)]
    draft_model: Optional[LLMSpec] = None
    draft_tp: Optional[Count(1024)] = None
    acceptance: Optional[Union[Acceptance, list[Acceptance]]] = None


class Serving(Strict):
    """Engine settings: batching, KV cache, CPU layout, overlap and streaming."""

    engine: EngineProfile = EngineProfile(name="reference")
    max_batch: Count(65_536) = 256
    max_batched_tokens: Count(MAX_CONTEXT) = 8192
    chunked_prefill: bool = True
    overlap: Literal["sync", "async", "async_output"] = "sync"
    detokenizer: Literal["engine", "separate", "api_server"] = "engine"
    api_server_process: Literal["own", "engine"] = "own"
    api_server_loop: Literal["fifo", "asyncio", "asyncio_per_output"] = "fifo"
    multi_step: Count(64) = 1
    api_servers: Count(1024) = 1
    stream_interval: Count(MAX_CONTEXT) = 1
    block_size: Count(1 << 16) = 16
    gpu_memory_utilization: Fraction = 0.9
    router: Literal["round_robin", "least_outstanding", "least_kv", "prefix_affinity", "cache_aware",
                    "session_affinity"] = "round_robin"
    prefix_caching: bool = False
    prefix_cache_insert: Literal["allocate", "after_step"] = "allocate"
    kv_offload: Optional[KVOffload] = None
    speculative: Optional[Speculative] = None
    decode_attention: Literal["paged", "contiguous"] = "paged"
    graph_capture: GraphCapture = GraphCapture()
    chunk_bytes_per_token: Bytes = 24.0
    response_header_bytes: Bytes = 200.0
    last_mile: Literal["modelled", "free"] = "modelled"


class Distribution(Strict):
    """A token-count distribution: fixed, uniform[low, high], lognormal(median, sigma), or ``random``:
    ``vllm bench serve --dataset-name random``'s lengths, uniform whole numbers in
    [floor(value x (1 - range_ratio)), ceil(value x (1 + range_ratio))] (at least 1), as
    ``vllm/benchmarks/datasets/utils.py`` ``get_sampling_params`` draws them (``--random-input-len``
    or ``--random-output-len`` with ``--random-range-ratio``; vLLM's count of the prompt's special
    tokens, which it takes off the input length, is the tokenizer's and left out here)."""

    dist: Literal["fixed", "uniform", "lognormal", "random"] = "fixed"
    value: Optional[Count(MAX_CONTEXT)] = None
    range_ratio: Annotated[Number, Field(ge=0, lt=1)] = 0.0
    low: Optional[Count(MAX_CONTEXT)] = None
    high: Optional[Count(MAX_CONTEXT)] = None
    median: Optional[Annotated[Number, Field(gt=0, le=MAX_CONTEXT)]] = None
    sigma: Optional[Annotated[Number, Field(ge=0, le=4)]] = None
    max: Optional[Count(MAX_CONTEXT)] = None

    @model_validator(mode="after")
    def _check(self):
        need = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("median", "sigma"),
                "random": ("value",)}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.dist} distribution needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self


    @property
    def upper(self) -> int:
        """The largest count it can draw; a lognormal without ``max`` is taken to 6 sigma."""
        if self.max is not None:
            return self.max
        if self.dist == "fixed":
            return self.value
        if self.dist == "uniform":
            return self.high
        if self.dist == "random":
            return self.bounds()[1]
        return int(self.median * math.exp(LOGNORMAL_TAIL_SIGMAS * self.sigma))

    def bounds(self) -> tuple[int, int]:
        """A ``random`` distribution's inclusive range, as vLLM computes it (the low end at least 1)."""
        low = max(math.floor(self.value * (1 - self.range_ratio)), 1)
        high = max(math.ceil(self.value * (1 + self.range_ratio)), 1)
        return low, high


def _token_count_branch(value) -> str:
    return "distribution" if isinstance(value, (dict, Distribution)) else "count"


# A number, or a distribution mapping: the branch is chosen by the input's type, so an error
# inside a mapping is reported as that mapping's error, not as "not a valid integer".
TokenCount = Annotated[Union[Annotated[Count(MAX_CONTEXT), Tag("count")],
                             Annotated[Distribution, Tag("distribution")]],
                       Discriminator(_token_count_branch)]


def upper_tokens(spec) -> int:
    """The largest token count a workload's ``prompt_tokens``/``output_tokens`` can produce."""
    return spec if isinstance(spec, int) else spec.upper


MAX_REQUESTS = 10_000_000
"""Most requests one run may simulate (a day of a large deployment at over 100 requests/s)."""

MAX_STAGES = 100
"""Most load stages a workload may hold (a load profile of 100 steps is already a fine ramp)."""


MAX_PREFIX_GROUPS = 1_000_000
"""Most distinct shared system prompts a workload may draw from (one per request of a large run is
already no sharing at all)."""

MAX_TURNS = 1_000
"""Most turns a session may hold (chat datasets' longest conversations hold a few hundred)."""

DEFAULT_PREFIX_BLOCK_TOKENS = 16
"""Tokens per prefix id of the synthetic workloads: vLLM's default KV block size (vllm/config/cache.py
``CacheConfig.block_size`` default 16), the granularity its prefix cache reuses."""


class SharedPrefix(Strict):
    """Shared system prompts: each request (each session, with ``sessions``) belongs to one of ``groups``
    drawn uniformly, and its prompt starts with that group's ``shared_tokens`` tokens, then tokens of its
    own. The prompt length is still drawn from ``prompt_tokens``: a prompt shorter than ``shared_tokens``
    is the first tokens of its group's system prompt, cut there."""

    shared_tokens: Annotated[int, Field(ge=0, le=MAX_CONTEXT)] = Field(
        0, description="Tokens of each group's system prompt that start its prompts (0: none, for sessions that "
                       "only set block_tokens).")
    groups: Count(MAX_PREFIX_GROUPS) = Field(1, description="Distinct system prompts; each request (or session) "
                                                            "draws one uniformly.")
    block_tokens: Count(1 << 16) = Field(DEFAULT_PREFIX_BLOCK_TOKENS, description=(
        "Tokens per prefix id (a prompt block); only whole blocks of the system prompt are shared. Default 16, "
        "vLLM's KV block size."))
    prompts_per_group: Optional[Count(1 << 20)] = Field(None, description=(
        "Distinct prompts per group (inference-perf's shared_prefix num_prompts_per_group): the workload sends "
        "groups x prompts_per_group prompts, each drawn once, shuffled, again and again (request i the (i mod "
        "pool)-th), so repeats find their whole prompt cached; unset: every request's own question."))


class TimeDistribution(Strict):
    """A duration distribution in seconds: fixed, uniform[low, high], exponential(mean) or lognormal(median, sigma)."""

    dist: Literal["fixed", "uniform", "exponential", "lognormal"] = Field(
        "fixed", description="fixed (value), uniform (low..high), exponential (mean) or lognormal (median, sigma), "
                             "each with an optional max.")
    value: Optional[Seconds] = Field(None, description="Fixed duration.")
    low: Optional[Seconds] = Field(None, description="Uniform: shortest duration.")
    high: Optional[Seconds] = Field(None, description="Uniform: longest duration.")
    mean: Optional[PositiveSeconds] = Field(None, description="Exponential: mean duration.")
    median: Optional[PositiveSeconds] = Field(None, description="Lognormal: median duration.")
    sigma: Optional[Annotated[Number, Field(ge=0, le=4)]] = Field(None, description="Lognormal: sigma of the "
                                                                                    "underlying normal.")
    max: Optional[Seconds] = Field(None, description="Longest duration (draws are clipped).")

    @model_validator(mode="after")
    def _check(self):
        need = {"fixed": ("value",), "uniform": ("low", "high"), "exponential": ("mean",),
                "lognormal": ("median", "sigma")}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.dist} distribution needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low ({self.low:g} s) is above high ({self.high:g} s)")
        return self


def _duration_branch(value) -> str:
    return "distribution" if isinstance(value, (dict, TimeDistribution)) else "seconds"


Duration = Annotated[Union[Annotated[Seconds, Tag("seconds")], Annotated[TimeDistribution, Tag("distribution")]],
                     Discriminator(_duration_branch)]
"""A duration: seconds (a number or a quantity such as ``5 s``) or a :class:`TimeDistribution` mapping."""


class Sessions(Strict):
    """Multi-turn sessions: ``turns`` requests per session, each prompt the whole history so far.

    Turn 1's prompt is a user message (``prompt_tokens``); turn k's is turn k-1's prompt, its output
    (``output_tokens``) and a new message, so a session's prompts grow and each repeats the last. Sessions
    start per the arrival process (``rate`` is then the rate of new sessions) and turn k arrives
    ``think_time`` after turn k-1 *arrived*: the workload is drawn before the run, with no feedback from
    when a turn completes (a turn may arrive while the previous one still runs; a reply-driven client is
    a later improvement). ``requests`` counts turns; the sessions are ceil(requests / turns) and the
    latest turns beyond ``requests`` are not sent."""

    turns: Count(MAX_TURNS) = Field(description="Requests (turns) per session.")
    think_time: Duration = Field(0.0, description="Time from one turn's arrival to the next turn's: seconds or "
                                                  "a distribution {dist: fixed|uniform|exponential|lognormal, ...}.")


class Stage(Strict):
    """One stage of a load profile: ``int(rate x duration)`` requests at ``rate`` for ``duration``.

    inference-perf (the load generator of ../shared/reference/vllm_serving_h100.csv) runs each stage
    of its ``load.stages`` this way: ConstantLoadTimer sends ``int(rate * duration)`` requests whose
    gaps are drawn and then scaled to fill the stage exactly (inference_perf/loadgen/load_timer.py)."""

    rate: Rate
    duration: PositiveSeconds

    @property
    def requests(self) -> int:
        """Requests this stage sends: ``int(rate x duration)``, as inference-perf counts them."""
        return int(self.rate * self.duration)


class ClientCPU(Strict):
    """The load generator's own CPU on the serving host's cores: a benchmark client run on the same
    machine as the server (as ``lastmile measure-engine``'s points were, ``vllm bench serve`` over
    loopback), costing per request it sends and per streamed chunk it reads. A request's latency
    counts from when the client starts sending it; a chunk is received once the client has read it."""

    per_request: Seconds = 0.0
    per_chunk: Seconds = 0.0


class Workload(Strict):
    """Who sends what, when: arrival process and prompt/output lengths (or a trace).

    With ``stages`` the run plays a load profile: the stages back to back, each at its own rate
    (gaps drawn from ``arrival``), so a later stage starts on a server the earlier ones loaded;
    ``requests`` is then the stages' total and ``rate`` is unused (null).

    Prompts may carry prefix identity (which leading blocks they share with earlier prompts, for
    prefix caching): a ``.jsonl`` trace's ``hash_ids``, ``prefix`` (shared system prompts) or
    ``sessions`` (multi-turn histories); see simulator/workloads/prefix.py."""

    requests: Count(MAX_REQUESTS) = 200
    arrival: Literal["poisson", "gamma", "constant", "all_at_once", "closed", "trace"] = "poisson"
    rate: Optional[Rate] = 4.0
    burstiness: Annotated[Number, Field(ge=0.01, le=100)] = 1.0
    concurrency: Optional[Count(1_000_000)] = None
    trace: Optional[str] = None
    tokenizer: Optional[str] = Field(None, description=(
        "A ShareGPT dataset's tokenizer: the model's tokenizer.json, or the folder holding it (counts the "
        "conversations' tokens as vllm bench serve does; read locally, never downloaded)."))
    trace_time_scale: Annotated[Number, Field(ge=1e-6, le=1e6)] = 1.0
    trace_repeat: bool = False
    # A request whose prompt and output exceed the model's context: an error, or (as Vidur's
    # trace length generator does for traces of larger models) the prompt is cut to fit.
    over_context: Literal["error", "truncate_prompt"] = "error"
    prompt_tokens: TokenCount = 512
    output_tokens: TokenCount = 128
    stages: Optional[Annotated[list[Stage], Field(min_length=1, max_length=MAX_STAGES)]] = None
    prefix: Optional[SharedPrefix] = Field(None, description=(
        "Shared system prompts {shared_tokens, groups, block_tokens}: gives prompts prefix identity (block ids) "
        "for prefix caching; synthetic lengths only (a .jsonl trace carries its own)."))
    sessions: Optional[Sessions] = Field(None, description=(
        "Multi-turn sessions {turns, think_time}: each turn's prompt is the history so far; sessions start per "
        "the arrival process. Synthetic lengths only."))
    client_cpu: Optional[ClientCPU] = Field(None, description=(
        "The load generator on the serving host's cores {per_request, per_chunk}: a benchmark client on the same "
        "machine, its CPU contending with the server's processes (null: the client is elsewhere)."))

    @property
    def prompt_upper(self) -> int:
        """The longest prompt the workload can send (synthetic lengths): with sessions, the last turn's
        history, ``turns`` messages and ``turns - 1`` outputs."""
        prompt = upper_tokens(self.prompt_tokens)
        if self.sessions is None:
            return prompt
        turns = self.sessions.turns
        return turns * prompt + (turns - 1) * upper_tokens(self.output_tokens)

    @model_validator(mode="after")
    def _check(self):
        self._check_prefix_sources()
        if self.stages is not None:
            return self._check_stages()
        if self.arrival == "closed" and self.concurrency is None:
            raise ValueError("arrival 'closed' needs workload.concurrency")

        if self.arrival == "trace" and not self.trace:
            raise ValueError("arrival 'trace' needs workload.trace (a .csv or .jsonl path)")
        sharegpt = bool(self.trace) and self.trace.lower().endswith(".json")
        if sharegpt and self.arrival == "trace":
            raise ConfigError("a ShareGPT dataset has lengths but no arrival times: send it with an arrival process "
                              "(poisson, gamma, constant, all_at_once or closed)", path="workload.arrival")
        if self.tokenizer is not None and not sharegpt:
            raise ConfigError("workload.tokenizer counts a ShareGPT dataset's tokens (workload.trace: a .json file); "
                              "this workload has none", path="workload.tokenizer")
        if self.arrival in ("poisson", "gamma", "constant") and self.rate is None:
            raise ValueError(f"arrival '{self.arrival}' needs workload.rate")
        return self

    def _check_prefix_sources(self):
        """Shared prompts and sessions shape synthetic lengths: not a trace's, nor a closed loop's order."""
        if self.trace and (self.prefix is not None or self.sessions is not None):
            key = "prefix" if self.prefix is not None else "sessions"
            own = (" (a .jsonl trace carries its own prefix ids, hash_ids)" if self.trace.lower().endswith(".jsonl")
                   else " (a CSV trace has no prefix identity; a Mooncake .jsonl trace has)")
            raise ConfigError(f"{key} shape synthetic prompts and a trace sets its own; drop workload.{key} or "
                              f"workload.trace{own}", path=f"workload.{key}")
        if self.sessions is not None and self.prefix is not None and self.prefix.prompts_per_group:
            raise ConfigError("a pool of prompts sent again and again is not a session's history; drop "
                              "workload.prefix.prompts_per_group or workload.sessions",
                              path="workload.prefix.prompts_per_group")
        if self.sessions is not None:
            if self.stages is not None:
                raise ConfigError("sessions start per one arrival process, not a load profile; drop workload.stages "
                                  "or workload.sessions", path="workload.sessions")
            if self.arrival == "closed":
                raise ConfigError("sessions need an open-loop arrival (poisson, gamma, constant or all_at_once) to "
                                  "start them; the closed loop sends requests in one order with no think time",
                                  path="workload.sessions")
        if self.prefix is not None and self.prefix.shared_tokens > upper_tokens(self.prompt_tokens):
            raise ConfigError(f"{self.prefix.shared_tokens:,} shared tokens exceed the longest prompt "
                              f"({upper_tokens(self.prompt_tokens):,} tokens), so no request holds the whole system "
                              "prompt; lower shared_tokens or raise prompt_tokens", path="workload.prefix.shared_tokens")

    def _check_stages(self):
        """Stages draw their gaps from an open-loop process; they fix the request count and the rates."""
        if self.arrival not in ("poisson", "gamma", "constant"):
            raise ConfigError(f"stages need an open-loop arrival (poisson, gamma or constant) to draw each "
                              f"stage's gaps from, not {self.arrival!r}", path="workload.arrival")
        if self.trace:
            raise ConfigError("stages and a trace both set the arrival times; keep one", path="workload.stages")
        empty = [i for i, s in enumerate(self.stages) if s.requests < 1]
        if empty:
            s = self.stages[empty[0]]
            raise ConfigError(f"rate x duration is {s.rate * s.duration:g}, under one request; raise the rate or "
                              "the duration", path=f"workload.stages.{empty[0]}")
        total = sum(s.requests for s in self.stages)
        if total > MAX_REQUESTS:
            raise ConfigError(f"the stages send {total:,} requests, more than {MAX_REQUESTS:,}", path="workload.stages")
        if "requests" in self.model_fields_set and self.requests != total:
            raise ConfigError(f"{self.requests:,} differs from the stages' {total:,} requests (int(rate x duration) "
                              f"each); set it to {total} or drop it", path="workload.requests")
        if "rate" in self.model_fields_set and self.rate is not None:
            raise ConfigError("each stage has its own rate; drop workload.rate (or set it to null)",
                              path="workload.rate")
        # Derived, not user-set: written without re-validation, so the resolved scenario
        # (requests = total, rate = null) loads again as it is.
        object.__setattr__(self, "requests", total)
        object.__setattr__(self, "rate", None)
        return self


class SLO(Strict):
    """Service-level objectives, with ``vllm bench serve --goodput``'s keys: a request is good when its
    TTFT, its TPOT (mean time per output token after the first) and, where set, its E2E latency are
    within them."""

    ttft: PositiveSeconds = 1.0
    tpot: PositiveSeconds = 0.1
    e2el: Optional[PositiveSeconds] = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data):
        if isinstance(data, dict) and "itl" in data:
            raise ConfigError("slo.itl bounded TPOT, the mean time per output token: name it slo.tpot "
                              "(slo.e2el bounds the whole request)", path="slo.itl")
        return data


class CostSpec(Strict):
    """What the run's GPUs cost and what its energy counts (``observe.energy``): a price per GPU-hour
    (``gpu_hour``, USD), or a catalog offering (``prices.yaml``) to take it from (default: the GPU's
    own), and the facility's power usage effectiveness (1.0: the servers' power alone)."""

    gpu_hour: Optional[Annotated[float, NO_BOOL, Field(gt=0, le=1000, allow_inf_nan=False)]] = None
    offering: Optional[str] = None
    pue: Annotated[float, NO_BOOL, Field(ge=1.0, le=3.0, allow_inf_nan=False)] = 1.0

    @model_validator(mode="after")
    def _offering_known(self):
        if self.offering is not None:
            from . import catalog

            if catalog.price(self.offering) is None:
                raise ConfigError(f"unknown offering {self.offering!r}; known: {', '.join(catalog.prices())}",
                                  path="cost.offering")
        return self


class ScenarioBase(Strict):
    """What every kind of scenario has: its kind, a name, a seed, the dtype and the hardware."""

    kind: str
    name: str = "scenario"
    description: str = ""
    seed: Annotated[Int, Field(ge=0, lt=2**63)] = 0
    dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    hardware: Hardware
    cost: CostSpec = CostSpec()
    record_spans: bool = True

    @model_validator(mode="after")
    def _text_names(self):
        """A name and a description are text: a lone surrogate (undecodable bytes read as str) would
        break the run folder's files and figures at the end of the run, so it is refused here."""
        for key in ("name", "description"):
            try:
                getattr(self, key).encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{key} holds a character that is not text (a lone surrogate, from bytes "
                                  "that are not UTF-8)", path=key) from None
        return self


class LLMScenario(ScenarioBase):
    """A complete LLM-serving scenario."""

    kind: Literal["llm"] = "llm"
    model: LLMSpec
    parallel: LLMParallel = LLMParallel()
    serving: Serving = Serving()
    workload: Workload = Workload()
    slo: SLO = SLO()
    max_sim_time: Optional[Horizon] = None
    coalesce_decode: bool = True
    disaggregation: Optional[Disaggregation] = None

    @model_validator(mode="after")
    def _kv_identity(self):
        """Prefix caching and prefix-affinity routing need prompts whose prefixes are known; session
        affinity needs sessions."""
        w, sv = self.workload, self.serving
        has_prefix = bool(w.trace and str(w.trace).endswith(".jsonl")) or w.prefix is not None or w.sessions is not None
        source = "a Mooncake .jsonl trace, workload.prefix or workload.sessions"
        if sv.prefix_caching and not has_prefix:
            raise ConfigError(f"serving.prefix_caching needs prompts with prefix identity: {source}",
                              path="serving.prefix_caching")
        if sv.router in ("prefix_affinity", "cache_aware") and not has_prefix:
            raise ConfigError(f"router {sv.router} needs prompts with prefix identity: {source}",
                              path="serving.router")
        if sv.router == "session_affinity" and w.sessions is None:
            raise ConfigError("router session_affinity needs sessions (workload.sessions)", path="serving.router")
        return self

    @model_validator(mode="after")
    def _pools_own_their_parallelism(self):
        """With disaggregation each pool sets its replicas and TP; ``parallel`` must not say otherwise."""
        if self.disaggregation is None:
            return self
        p = self.parallel
        for key in ("replicas", "tp", "pp"):
            if getattr(p, key) != 1:
                raise ConfigError(f"parallel.{key}={getattr(p, key)} with disaggregation: set replicas and tp in "
                                  "disaggregation.prefill and disaggregation.decode (pipeline parallelism is not "
                                  "modelled in the pools)", path=f"parallel.{key}")
        if self.serving.api_server_process == "engine":
            raise ConfigError("api_server_process: engine has no meaning with disaggregation (requests enter "
                              "the prefill pool and leave the decode pool); use own", path="serving.api_server_process")
        return self

    @model_validator(mode="after")
    def _multi_step_needs_outputs_in_bulk(self):
        """Multi-step scheduling hands outputs back every N steps: async scheduling has no such mode."""
        sv = self.serving
        if sv.multi_step > 1 and sv.overlap == "async":
            raise ConfigError(f"multi_step={sv.multi_step} runs with overlap sync or async_output (vLLM 0.6), "
                              "not with async scheduling; set serving.overlap or serving.multi_step: 1",
                              path="serving.multi_step")
        return self

    @model_validator(mode="after")
    def _speculative_fits(self):
        """A draft model shares the target's vocabulary and splits its heads over ``draft_tp``;
        other methods take no draft model; a per-position list has one rate per draft token."""
        spec = self.serving.speculative
        if spec is None:
            return self
        key = "serving.speculative"
        if spec.method == "draft":
            d = spec.draft_model
            if d is None:
                raise ConfigError("method draft needs a draft model: set serving.speculative.draft_model to a "
                                  "catalog LLM (e.g. qwama-0.5b)", path=f"{key}.draft_model")
            if d.vocab != self.model.vocab:
                raise ConfigError(f"draft model {d.name} has a {d.vocab:,}-token vocabulary but {self.model.name} has "
                                  f"{self.model.vocab:,}: a draft must share the target's tokenizer", path=f"{key}.draft_model")
            tp = spec.draft_tp or self.parallel.tp
            if d.heads % tp or (d.kv_heads % tp and tp % d.kv_heads):
                fits = [t for t in range(1, self.parallel.tp + 1) if d.heads % t == 0 and self.parallel.tp % t == 0]
                raise ConfigError(f"draft tp={tp} does not split the {d.heads} attention heads / {d.kv_heads} KV heads "
                                  f"of {d.name}; set serving.speculative.draft_tp to one of {fits} (vLLM's "
                                  "speculative_draft_tensor_parallel_size)", path=f"{key}.draft_tp")
            if tp > self.parallel.tp:
                raise ConfigError(f"draft_tp={tp} exceeds the target's tp={self.parallel.tp}: the draft runs on the "
                                  "target's GPUs", path=f"{key}.draft_tp")
        elif spec.draft_model is not None or spec.draft_tp is not None:
            raise ConfigError(f"method {spec.method} drafts without a draft model; remove draft_model/draft_tp or "
                              "use method: draft", path=f"{key}.draft_model")
        if isinstance(spec.acceptance, list) and len(spec.acceptance) != spec.tokens:
            raise ConfigError(f"acceptance lists {len(spec.acceptance)} per-position rates for tokens={spec.tokens}; "
                              "give one per draft token or a single rate", path=f"{key}.acceptance")
        if self.serving.multi_step > 1:
            raise ConfigError("speculative decoding does not run with multi-step scheduling (vLLM 0.6 refuses the "
                              "combination); set serving.multi_step: 1", path="serving.multi_step")
        if self.disaggregation is not None:
            raise ConfigError("speculative decoding with disaggregation is not modelled; remove one of them",
                              path=key)
        return self

    @model_validator(mode="after")
    def _api_servers_in_engines(self):
        """With the API server inside each engine process, there is one per replica."""
        sv, replicas = self.serving, self.parallel.replicas
        if sv.api_server_process == "engine" and "api_servers" in sv.model_fields_set and sv.api_servers != replicas:
            raise ConfigError(f"api_servers={sv.api_servers} but with api_server_process: engine each of the "
                              f"{replicas} replica(s) serves its own API from its engine process; leave api_servers "
                              f"out or set it to {replicas}", path="serving.api_servers")
        return self

    @model_validator(mode="after")
    def _asyncio_api_servers(self):
        """An asyncio API server is a process of its own (with api_server_process: engine the engine's loop runs it)."""
        sv = self.serving
        if sv.api_server_loop != "fifo" and sv.api_server_process != "own":
            raise ConfigError(f"api_server_loop: {sv.api_server_loop} runs each API server as an event loop in a process of its "
                              f"own; set api_server_process: own (it is {sv.api_server_process}), or "
                              "api_server_loop: fifo", path="serving.api_server_loop")
        return self

    @model_validator(mode="after")
    def _fits_context(self):
        """Synthetic lengths must fit the model's context window, unless prompts are cut to fit."""
        w = self.workload
        if w.trace:
            return self  # checked row by row when the trace is read (config.trace.check_trace)
        prompt, output = w.prompt_upper, upper_tokens(w.output_tokens)
        ctx = self.model.context_length
        if w.over_context == "truncate_prompt":
            if output >= ctx:
                raise ConfigError(f"up to {output:,} output tokens leave no room for a prompt in "
                                  f"{self.model.name}'s {ctx:,}-token context", path="workload.output_tokens")
        elif prompt + output > ctx:
            history = f" (a session's last turn: {w.sessions.turns} messages and outputs)" if w.sessions else ""
            raise ConfigError(f"prompts of up to {prompt:,}{history} and outputs of up to {output:,} tokens exceed "
                              f"{self.model.name}'s {ctx:,}-token context (a lognormal without max reaches "
                              f"median x exp({LOGNORMAL_TAIL_SIGMAS} sigma))", path="workload.prompt_tokens",
                              fix="lower them, set max, or set workload.over_context: truncate_prompt")
        return self
