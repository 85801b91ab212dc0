"""Cost of a decoder-only transformer step: FLOPs and bytes per operator, timed on a GPU model.

A step is a batch of new tokens: decode tokens (one per running request, attending to its
context) and prefill chunks (n new tokens after p cached ones). Weights are read once per
step; attention reads each request's own K/V. Tensor parallelism splits heads and MLP
columns and adds two all-reduces per layer; pipeline parallelism splits the layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..config import catalog
from ..hardware.allreduce import ALLREDUCE_POLICIES, AllReduceLink
from ..hardware.collectives import alltoall_time, p2p_time
from ..hardware.gpu import GPU
from ..hardware.ops import DTYPE_BYTES, Op
from .expert_load import busiest_rank_rows, contiguous_shares, eplb_shares, expert_loads
from .weights import bits_per_weight

LAYER_KERNELS = ("add_rms_norm", "qkv", "rotary", "kv_cache_write", "attention", "o_proj",
                 "add_rms_norm", "gate_up", "silu_and_mul", "down")
"""The kernels vLLM V1 runs per dense decoder layer (vllm/model_executor/models/llama.py
``LlamaDecoderLayer.forward``): ``input_layernorm(hidden_states, residual)`` is one fused
residual-add + RMSNorm kernel (``fused_add_rms_norm``; the residual add of the previous layer
is fused into it, so there is no separate add), the QKV GEMM, ``rotary_emb`` (one in-place
kernel over q and k), the paged-KV write (``reshape_and_cache_flash``, called from the
FlashAttention backend's ``do_kv_cache_update``), the attention kernel, the O GEMM, the second
fused add + RMSNorm, the merged gate/up GEMM, ``SiluAndMul`` and the down GEMM. A MoE layer
replaces the last three with its router GEMM and the fused-MoE kernels."""

KERNELS_PER_LAYER = len(LAYER_KERNELS)
"""Kernel launches per dense decoder layer (for eager-mode launch cost)."""


@dataclass(frozen=True)
class DecodeAttentionKernel:
    """Decode attention: the fraction of *peak* HBM bandwidth its KV stream reaches and its fixed
    latency per call on top of any kernel's (``decode_attention`` in kernels.yaml, by the
    engine's KV layout); a kernel without figures of its own streams at the GPU's fraction and
    costs what any kernel does (latency 0)."""

    bandwidth_fraction: float
    latency: float

    @classmethod
    def from_catalog(cls, layout: str, gpu: GPU) -> "DecodeAttentionKernel":
        entry = catalog.kernels()["decode_attention"][layout]
        frac, lat = entry["bandwidth_fraction"], entry["latency"]
        return cls(gpu.hbm_eff if frac is None else float(frac), 0.0 if lat is None else float(lat))


@dataclass(frozen=True)
class FusedMoEKernel:
    """vLLM's fused-MoE: the BLOCK_SIZE_M its tuned config picks per step token count (each
    expert's rows are padded to a multiple of it) and the small kernels around the two grouped
    GEMMs (``fused_moe`` in kernels.yaml)."""

    block_size_m: tuple[tuple[int, int], ...]
    routing_kernels: int
    align_kernels: int

    @classmethod
    def from_catalog(cls, entry: dict) -> "FusedMoEKernel":
        table = tuple(sorted((int(k), int(v)) for k, v in entry["block_size_m"].items()))
        return cls(table, int(entry["routing_kernels"]), int(entry["align_kernels"]))

    def block_m(self, tokens: int) -> int:
        """BLOCK_SIZE_M of the config whose key is nearest ``tokens`` (vLLM's
        ``try_get_optimal_moe_config``: ``min(keys, key=lambda x: abs(x - M))``)."""
        return min(self.block_size_m, key=lambda kv: abs(kv[0] - tokens))[1]

    def padded_rows(self, tokens: float, experts: int, top_k: int, step_tokens: int | None = None) -> tuple[float, float]:
        """(experts hit, rows each grouped GEMM multiplies) for ``tokens`` tokens routed evenly to
        ``top_k`` of ``experts`` each: every hit expert's rows rounded up to BLOCK_SIZE_M (picked by
        the step's token count, ``step_tokens``, default ``tokens``)."""
        hit = experts * (1.0 - (1.0 - top_k / experts) ** tokens)
        bm = self.block_m(tokens if step_tokens is None else step_tokens)
        return hit, hit * bm * math.ceil(tokens * top_k / hit / bm)


def window_pairs(chunks, window: int) -> tuple[float, float]:
    """(causal query-key pairs, keys read) of prefill chunks (cached p, new n) in a layer whose
    queries see the last ``window`` positions: the query at position j (1-based) attends to
    min(j, window) keys (Mistral's sliding window, Jiang et al. 2023, Sec. 2)."""
    pairs = keys = 0.0
    for p, n in chunks:
        end = p + n
        if end <= window:
            pairs += n * (p + (n + 1) / 2)
        elif p >= window:
            pairs += n * window
        else:
            pairs += (window * (window + 1) - p * (p + 1)) / 2 + (end - window) * window
        keys += min(p, window) + n
    return pairs, keys


ALLREDUCES_PER_LAYER = 2
"""Megatron-LM tensor parallelism: one all-reduce after attention's output projection and one
after the MLP's down projection (Shoeybi et al. 2019, Sec. 3)."""

KERNELS_PER_STEP = 4
"""Kernels outside the layers per step: token embedding, final norm, LM head GEMM, sampling."""

LOGIT_BYTES = 4
"""Logits are fp32 for sampling (vLLM's sampler: ``logits = logits.to(torch.float32)``)."""

SAMPLING_FLOPS_PER_LOGIT = 10
"""Estimate of elementwise work per logit when sampling: temperature divide, softmax (max,
subtract, exp, sum, divide), top-k/top-p masking and the draw — about ten operations."""

ACT_HIDDEN_COPIES = 4
"""Hidden-size tensors alive per token at a layer's peak: the residual stream, the normed input,
the attention output and the projection's output (estimate)."""

ACT_FFN_COPIES = 2
"""The fused gate/up GEMM's two ffn-size outputs per token, alive until SiluAndMul."""

SAMPLING_LOGIT_PASSES = 2
"""The sampler reads the fp32 logits and writes the probabilities: two passes over HBM."""


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention's widths (``config.models.MLASpec``): the query bottleneck (0:
    none), the cached latent, the shared rotary key, and each head's non-rotary key and value."""

    q_lora: int
    kv_lora: int
    rope: int
    nope: int
    v: int


@dataclass(frozen=True)
class LLMShape:
    """The per-GPU shape of a model under tensor and pipeline parallelism."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    experts: int = 1
    top_k: int = 1
    shared_ffn: int = 0        # shared experts' intermediate size (every token runs them)
    dense_layers: int = 0      # leading dense-MLP layers of an MoE, of intermediate size dense_ffn
    dense_ffn: int = 0
    window: int = 0            # sliding window of the sliding_layers (0: every layer attends to all)
    sliding_layers: int = 0
    mla: MLA | None = None
    weight_bits: float = 0.0   # bits per weight of the quantized checkpoint (0: the run's dtype)
    quantized: str = "linear"  # which weights carry them: every linear layer, or the routed experts
    tied: bool = False         # the LM head is the embedding matrix
    weight_format: str = ""    # the quantized checkpoint's format (config.models.WeightQuant.format), "" for none

    @classmethod
    def from_spec(cls, spec) -> "LLMShape":
        mla, quant = getattr(spec, "mla", None), getattr(spec, "weights", None)
        return cls(spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn,
                   spec.vocab, spec.experts, spec.top_k, getattr(spec, "shared_ffn", 0),
                   getattr(spec, "dense_layers", 0), getattr(spec, "dense_ffn", 0),
                   getattr(spec, "sliding_window", None) or 0, getattr(spec, "sliding_layers", 0),
                   None if mla is None else MLA(mla.q_lora_rank, mla.kv_lora_rank, mla.rope_head_dim,
                                                mla.nope_head_dim, mla.v_head_dim),
                   0.0 if quant is None else bits_per_weight(quant.format, quant.group_size),
                   "linear" if quant is None else quant.modules, getattr(spec, "tied_embeddings", False),
                   "" if quant is None else quant.format)

    def attention_params(self) -> tuple[int, int]:
        """(params split across TP ranks, params every rank holds whole) of one layer's attention.
        MLA's down-projections to the query bottleneck and the latent are replicated in vLLM
        (``ReplicatedLinear`` q_a_proj and kv_a_proj_with_mqa, vllm/model_executor/models/deepseek_v2.py)."""
        h, m = self.hidden, self.mla
        if m is None:
            hd = self.head_dim
            return h * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * h, 0
        q_in = m.q_lora or h
        split = q_in * self.heads * (m.nope + m.rope) + m.kv_lora * self.heads * (m.nope + m.v) + self.heads * m.v * h
        whole = h * (m.kv_lora + m.rope) + m.kv_lora + (h * m.q_lora + m.q_lora if m.q_lora else 0)
        return split, whole

    def layer_params(self) -> tuple[int, int]:
        """(attention params, MLP params of all experts) of one (MoE, if any) layer."""
        split, whole = self.attention_params()
        h = self.hidden
        mlp = 3 * h * self.ffn * self.experts + (h * self.experts if self.experts > 1 else 0) + 3 * h * self.shared_ffn
        return split + whole, mlp

    @property
    def vocab_matrices(self) -> int:
        """The embedding and the LM head: two matrices, or one when they are tied."""
        return 1 if self.tied else 2

    def params(self) -> int:
        """Total parameters (the embedding and the LM head, norms included)."""
        attn, mlp = self.layer_params()
        dense = self.dense_layers * (3 * self.hidden * self.dense_ffn - mlp)
        return (self.layers * (attn + mlp + 2 * self.hidden) + dense + self.vocab_matrices * self.vocab * self.hidden
                + self.hidden)

    def active_params(self) -> int:
        """Parameters touched per token (top-k experts and the shared ones only)."""
        attn, _ = self.layer_params()
        mlp = 3 * self.hidden * (self.ffn * self.top_k + self.shared_ffn)
        dense = self.dense_layers * (3 * self.hidden * self.dense_ffn - mlp)
        return self.layers * (attn + mlp + 2 * self.hidden) + dense + self.vocab_matrices * self.vocab * self.hidden

    @property
    def full_layers(self) -> int:
        """Layers attending to the whole context (their KV grows with it: what the KV pool counts)."""
        return self.layers - self.sliding_layers

    def kv_elements_per_layer(self) -> int:
        """K and V elements one token caches in one layer: MLA's latent and rotary key, else K and V per KV head."""
        if self.mla is not None:
            return self.mla.kv_lora + self.mla.rope
        return 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes of one token across the full-attention layers (whole model)."""
        return self.full_layers * self.kv_elements_per_layer() * dtype_bytes


@dataclass
class StepCost:
    """Per-step GPU time split into compute and communication, seconds."""

    compute: float
    comm: float

    @property
    def total(self) -> float:
        return self.compute + self.comm


@dataclass
class LLMCostModel:
    """Times engine steps of one model replica (tp x pp GPUs) on a GPU model and GPU link."""

    shape: LLMShape
    gpu: GPU
    dtype: str
    tp: int = 1
    pp: int = 1
    link_bandwidth: float = 0.0
    link_latency: float = 0.0
    allreduce_link: AllReduceLink | None = None
    allreduce: str = "vllm"
    attention: DecodeAttentionKernel | None = None
    moe: FusedMoEKernel | None = None
    step_time: object | None = None  # a StepTime: the step as a function of its batch, not the roofline
    expert_parallel: bool = False    # whole experts sharded across the TP ranks (vLLM --enable-expert-parallel)
    dp_attention: bool = False       # attention data-parallel over the ranks, experts all-to-all (SGLang --enable-dp-attention)
    expert_skew: float = 0.0         # Zipf exponent of the experts' popularity (0: equal)
    eplb: bool = False               # DeepSeek's EPLB places the experts (vLLM --enable-eplb)
    redundant_experts: int = 0       # EPLB's extra replicas of popular experts, over all ranks
    _gemm_cache: dict = field(default_factory=dict, repr=False)
    _head_cache: dict = field(default_factory=dict, repr=False)
    _comm_cache: dict = field(default_factory=dict, repr=False)

    @property
    def b(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def attn_dtype(self) -> str:
        return "bf16" if self.dtype == "fp8" else self.dtype

    @property
    def layers_per_stage(self) -> int:
        return math.ceil(self.shape.layers / self.pp)

    @property
    def attn_tp(self) -> int:
        """Ranks one layer's attention (and its dense MLPs) is split over: 1 under DP attention."""
        return 1 if self.dp_attention else self.tp

    @property
    def dp(self) -> int:
        """Ranks the step's requests are spread over, each running its own share (DP attention), else 1."""
        return self.tp if self.dp_attention else 1

    def per_rank(self, n: int) -> int:
        """The busiest rank's share of ``n`` tokens, sequences or requests spread over the DP
        attention ranks (``n`` itself without DP attention)."""
        return -(-n // self.dp)

    def weight_bytes(self, experts: bool = False) -> float:
        """Bytes of one weight of a linear layer (``experts``: of a routed expert): the quantized
        checkpoint's bits where it covers the layer, else the run's dtype."""
        s = self.shape
        if s.weight_bits and (experts or s.quantized == "linear"):
            return s.weight_bits / 8
        return self.b

    def gemm_dtype(self, experts: bool = False) -> str:
        """The dtype a linear layer's GEMM (``experts``: a routed expert's) multiplies in: NVFP4 weights at
        FP4 where the GPU has FP4 tensor cores (W4A4: vLLM's ModelOpt NVFP4 linear method quantizes the
        activations to FP4 too, ``scaled_fp4_quant`` then ``cutlass_scaled_fp4_mm``), anything else at
        the activations' dtype (weight-only formats dequantize in the kernel, Marlin-style)."""
        s = self.shape
        if (s.weight_format == "nvfp4" and (experts or s.quantized == "linear")
                and "fp4" in self.gpu.peak_flops):
            return "fp4"
        return self.dtype

    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds: its stage's layers' share under TP (experts whole under expert
        parallelism: the same share), replicated projections whole, and its share of the embedding
        and the LM head."""
        s, b = self.shape, self.b
        split, whole = s.attention_params()
        h = s.hidden
        wa, we = self.weight_bytes(), self.weight_bytes(experts=True)
        experts = 3 * h * s.ffn * (s.experts + self.redundant_experts) * we  # the routed experts (with replicas)
        other = (h * s.experts + 3 * h * s.shared_ffn) * wa                   # the router and the shared experts
        if self.dp_attention:  # every rank holds attention, dense MLPs, router and shared experts whole
            moe = experts / self.tp + other
            per_layer = (split + whole) * wa + moe + 2 * h * b
            dense = s.dense_layers * (3 * h * s.dense_ffn * wa - moe)
        else:
            moe = experts + other if s.experts > 1 else 3 * h * s.ffn * wa
            per_layer = (split * wa + moe) / self.tp + (whole * wa + 2 * h * b)
            dense = s.dense_layers * (3 * h * s.dense_ffn * wa - moe) / self.tp
        # the embedding and the LM head (each vocab x hidden, split over TP: vLLM's VocabParallelEmbedding
        # and ParallelLMHead) sit on the first and the last pipeline stage: one GPU holds both without PP
        # (one matrix if they are tied; with PP the last stage loads its own copy of a tied one)
        emb = (s.vocab_matrices if self.pp == 1 else 1) * s.vocab * s.hidden / self.attn_tp
        return self.layers_per_stage * (per_layer + dense / s.layers) + emb * b

    def work_per_step_and_token(self) -> tuple[float, float, float, float, float]:
        """What the energy model counts (``observe.energy``), over the whole replica: the weight bytes
        a step reads from HBM (every GPU its share, once per step), the FLOPs of a token's linear
        layers (2 per active parameter; attention's are left out: under 5% of a token's at the
        contexts served here), the KV-cache bytes one token of context adds to each later read; and
        one GPU's peak rates the activity is a fraction of (its GEMMs' dtype, HBM)."""
        gpus = self.tp * self.pp
        peak = self.gpu.peak_flops.get(self.gemm_dtype()) or self.gpu.peak_flops["bf16"]
        return (self.weight_bytes_per_gpu() * gpus, 2.0 * self.shape.active_params(),
                self.kv_bytes_per_token_per_gpu() * gpus / max(self.dp, 1), peak, self.gpu.hbm_bandwidth)

    def kv_bytes_per_token_per_gpu(self) -> float:
        """K/V bytes one token occupies on one GPU in the full-attention layers (the sliding ones'
        are :meth:`sliding_kv_bytes`). MLA's latent is one head every TP rank caches whole."""
        s = self.shape
        full = self.layers_per_stage * s.full_layers / s.layers if s.sliding_layers else self.layers_per_stage
        # under DP attention each token's KV sits whole on its request's rank: the replica pools the ranks' caches
        if s.mla is not None:
            return full * s.kv_elements_per_layer() * self.b / self.dp
        return 2 * full * max(1, s.kv_heads // self.attn_tp) * s.head_dim * self.b / self.dp

    def sliding_kv_bytes(self, sequences: int, block_size: int) -> float:
        """KV bytes the sliding-window layers hold on one GPU for ``sequences`` running requests: a
        window and one partial block each (vLLM's hybrid allocator frees the blocks a window has
        left, ``SlidingWindowManager.remove_skipped_blocks`` in vllm/v1/core/single_type_kv_cache_manager.py),
        reserved for the whole batch up front."""
        s = self.shape
        if not s.sliding_layers:
            return 0.0
        per_token = 2 * max(1, s.kv_heads // self.attn_tp) * s.head_dim * self.b
        layers = self.layers_per_stage * s.sliding_layers / s.layers
        return sequences * (s.window + block_size) * layers * per_token / self.dp

    def _linear_ops(self, t: int, dense_mlp: bool = False) -> list[Op]:
        """One layer's token-parallel ops (everything but attention) for t new tokens (``dense_mlp``:
        of one of an MoE's leading dense layers)."""
        s, b, tp, dt = self.shape, self.b, self.attn_tp, self.dtype
        h = s.hidden
        w, g = self.weight_bytes(), self.gemm_dtype()
        routed_t, t = t, self.per_rank(t)  # the step's tokens, and those of one rank (all but the experts')
        if s.mla is not None:
            ops = self._mla_ops(t)
        else:
            q_out = s.heads * s.head_dim // tp
            kv_out = 2 * max(1, s.kv_heads // tp) * s.head_dim
            ops = [
                # fused_add_rms_norm: reads x and the residual, writes the new residual and x normed.
                Op("add_rms_norm", 6 * t * h, 4 * t * h * b, dtype=dt),
                Op("qkv", 2 * t * h * (q_out + kv_out), h * (q_out + kv_out) * w + (t * h + t * (q_out + kv_out)) * b,
                   gemm=(t, q_out + kv_out, h), dtype=g),
                # rotary_embedding rotates q and k in place: reads and writes both.
                Op("rotary", 6 * t * (q_out + kv_out // 2), 2 * t * (q_out + kv_out // 2) * b, dtype=dt),
                # reshape_and_cache_flash: reads the new k and v, writes them into their cache slots.
                Op("kv_cache_write", 0.0, 2 * t * kv_out * b, dtype=dt),
                Op("o_proj", 2 * t * q_out * h, q_out * h * w + (t * q_out + t * h) * b, gemm=(t, h, q_out), dtype=g),
            ]
        ops.append(Op("add_rms_norm", 6 * t * h, 4 * t * h * b, dtype=dt))
        if s.experts == 1 or dense_mlp:
            ops += self._mlp_ops(t, (s.dense_ffn if dense_mlp else s.ffn) // tp)
        else:
            ops += self._moe_ops(routed_t)
            if s.shared_ffn:
                ops += self._mlp_ops(t, s.shared_ffn // tp, "shared_")
        return ops

    def _mlp_ops(self, t: int, f: int, prefix: str = "") -> list[Op]:
        """A dense gated MLP of (per-rank) intermediate size f: the merged gate/up GEMM, SiluAndMul, down."""
        h, b, dt, w, g = self.shape.hidden, self.b, self.dtype, self.weight_bytes(), self.gemm_dtype()
        return [
            Op(prefix + "gate_up", 4 * t * h * f, 2 * h * f * w + (t * h + 2 * t * f) * b, gemm=(t, 2 * f, h), dtype=g),
            Op(prefix + "silu_and_mul", 4 * t * f, 3 * t * f * b, dtype=dt),
            Op(prefix + "down", 2 * t * f * h, f * h * w + (t * f + t * h) * b, gemm=(t, h, f), dtype=g),
        ]

    def _mla_ops(self, t: int) -> list[Op]:
        """MLA's projections for t tokens (vLLM's DeepseekV2MLAAttention with the MLA backend): the
        query's down-projection and norm (if it has a bottleneck) and up-projection, the latent's
        down-projection and norm, rotary on the rotary parts, the latent's cache write, the latent's
        up-projection (at decode the absorbed W_UK and W_UV products, at prefill the decompression:
        the same FLOPs and weights for the step's tokens) and the output projection."""
        s, b, tp, dt, m = self.shape, self.b, self.attn_tp, self.dtype, self.shape.mla
        h, w, g = s.hidden, self.weight_bytes(), self.gemm_dtype()
        qh = s.heads // tp
        q_out, latent, up = qh * (m.nope + m.rope), m.kv_lora + m.rope, qh * (m.nope + m.v)
        ops = [Op("add_rms_norm", 6 * t * h, 4 * t * h * b, dtype=dt)]
        q_in = h
        if m.q_lora:
            ops += [Op("q_a_proj", 2 * t * h * m.q_lora, h * m.q_lora * w + (t * h + t * m.q_lora) * b,
                       gemm=(t, m.q_lora, h), dtype=g),
                    Op("q_a_norm", 5 * t * m.q_lora, 2 * t * m.q_lora * b, dtype=dt)]
            q_in = m.q_lora
        return ops + [
            Op("q_proj", 2 * t * q_in * q_out, q_in * q_out * w + (t * q_in + t * q_out) * b, gemm=(t, q_out, q_in),
               dtype=g),
            Op("kv_a_proj", 2 * t * h * latent, h * latent * w + (t * h + t * latent) * b, gemm=(t, latent, h), dtype=g),
            Op("kv_a_norm", 5 * t * m.kv_lora, 2 * t * m.kv_lora * b, dtype=dt),
            Op("rotary", 6 * t * (qh + 1) * m.rope, 2 * t * (qh + 1) * m.rope * b, dtype=dt),
            Op("kv_cache_write", 0.0, 2 * t * latent * b, dtype=dt),
            Op("kv_b_proj", 2 * t * m.kv_lora * up, m.kv_lora * up * w + (t * m.kv_lora + t * up) * b,
               gemm=(t, up, m.kv_lora), dtype=g),
            Op("o_proj", 2 * t * qh * m.v * h, qh * m.v * h * w + (t * qh * m.v + t * h) * b, gemm=(t, h, qh * m.v),
               dtype=g),
        ]

    def _moe_ops(self, t: int) -> list[Op]:
        """vLLM's FusedMoE layer for t tokens: the router GEMM (replicated on every TP rank), the
        routing kernels, the block alignment, the w13 grouped GEMM over every hit expert's padded
        rows, SiLU-and-mul, the w2 grouped GEMM and the top-k sum. Under tensor parallelism every
        rank runs each expert's 1/tp columns for all routed tokens; under expert parallelism each
        rank runs its whole experts for the tokens routed to them, and the step waits for the
        busiest rank (:func:`busiest_rank_rows`); the results are all-reduced, or, under DP
        attention, each rank routes its own share of the step's ``t`` tokens and the experts'
        inputs and outputs cross by all-to-all (:meth:`collective_parts`)."""
        s, b, dt, k = self.shape, self.b, self.dtype, self.moe
        h, e = s.hidden, s.experts
        w, we, ge = self.weight_bytes(), self.weight_bytes(experts=True), self.gemm_dtype(experts=True)
        if self.expert_parallel and self.tp > 1:
            f = s.ffn
            local = (e + self.redundant_experts) // self.tp
            routed = busiest_rank_rows(t * s.top_k, self._rank_shares, self.tp, t * min(s.top_k, local))
            hit, rows = k.padded_rows(routed, local, 1, t)
        else:
            f = s.ffn // self.tp
            routed = t * s.top_k
            hit, rows = k.padded_rows(t, e, s.top_k)
        t = self.per_rank(t)  # the tokens this rank routes
        logits = t * e * 4
        return [
            Op("router", 2 * t * h * e, h * e * w + (t * h + t * e) * b, gemm=(t, e, h), dtype=dt),
            Op("topk_softmax", 5 * t * e, logits / k.routing_kernels, count=k.routing_kernels, dtype="fp32"),
            Op("moe_align", routed, 4 * (routed + rows) / k.align_kernels, count=k.align_kernels, dtype="fp32"),
            Op("moe_w13", 2 * rows * 2 * f * h, hit * 2 * f * h * we + (routed * h + routed * 2 * f) * b,
               gemm=(math.ceil(rows), 2 * f, h), dtype=ge),
            Op("silu_and_mul", 4 * routed * f, 3 * routed * f * b, dtype=dt),
            Op("moe_w2", 2 * rows * h * f, hit * h * f * we + (routed * f + routed * h) * b,
               gemm=(math.ceil(rows), h, f), dtype=ge),
            Op("moe_sum", routed * h, (routed + t) * h * b, dtype=dt),
        ]

    def linear_time(self, t: int) -> float:
        """GPU time of all token-parallel ops of one stage's layers for t new tokens (memoized); an
        MoE's leading dense layers in their share of the stage."""
        cached = self._gemm_cache.get(t)
        if cached is None:
            s = self.shape
            layer = self.gpu.ops_time(self._linear_ops(t))
            if s.dense_layers:
                dense = self.layers_per_stage * s.dense_layers / s.layers
                cached = ((self.layers_per_stage - dense) * layer
                          + dense * self.gpu.ops_time(self._linear_ops(t, dense_mlp=True)))
            else:
                cached = self.layers_per_stage * layer
            self._gemm_cache[t] = cached
        return cached

    def head_time(self, sequences: int) -> float:
        """Final norm, LM head over the sampled positions and sampling (memoized)."""
        cached = self._head_cache.get(sequences)
        if cached is None:
            cached = self._head_cache[sequences] = self._head_time(sequences)
        return cached

    def _head_time(self, sequences: int) -> float:
        s, b = self.shape, self.b
        v = s.vocab // self.attn_tp
        n = max(self.per_rank(sequences), 1)
        ops = [
            Op("final_norm", 5 * n * s.hidden, 2 * n * s.hidden * b, dtype=self.dtype),
            Op("lm_head", 2 * n * s.hidden * v, (s.hidden * v + n * s.hidden) * b + n * v * LOGIT_BYTES,
               gemm=(n, v, s.hidden), dtype=self.dtype),
            Op("sample", SAMPLING_FLOPS_PER_LOGIT * n * s.vocab, SAMPLING_LOGIT_PASSES * n * s.vocab * LOGIT_BYTES,
               dtype="fp32"),
        ]
        return self.gpu.ops_time(ops)

    def __post_init__(self):
        # Kernel figures default to the catalog's; a bare link stands in for the kernel all-reduce.
        if self.attention is None:
            self.attention = DecodeAttentionKernel.from_catalog("paged", self.gpu)
        if self.moe is None:
            self.moe = FusedMoEKernel.from_catalog(catalog.kernels()["fused_moe"])
        self._rank_shares = None  # the ranks' shares of the routed pairs (None: equal, no placement to ask)
        self._kernels = None  # kernels_per_step, once counted
        if self.expert_parallel and self.tp > 1 and (self.expert_skew or self.eplb):
            loads = expert_loads(self.shape.experts, self.expert_skew)
            self._rank_shares = (eplb_shares(loads, self.tp, self.redundant_experts) if self.eplb
                                 else contiguous_shares(loads, self.tp))
        if self.allreduce_link is None:
            bw = self.link_bandwidth
            self.allreduce_link = AllReduceLink.without_kernels(self.link_latency, bw, bw, True)
        s, b = self.shape, self.b
        qh = s.heads // self.attn_tp
        kvh = max(1, s.kv_heads // self.attn_tp)
        hd = s.head_dim
        rate, bw = self.gpu.flops_rate(self.attn_dtype), self.gpu.bandwidth
        dbw = self.gpu.hbm_bandwidth * self.attention.bandwidth_fraction
        # Attention time per layer = max(flop_coef * work / rate, byte terms / bw, kernel floor)
        # + the kernel gap: decode at the decode kernel's rate plus its latency, prefill at the GPU's.
        g = self.gpu
        m = s.mla
        if m is None:
            self._attn = (4 * qh * hd / rate, 2 * kvh * hd * b / bw, 2 * qh * hd * b / bw, g.kernel_floor,
                          g.kernel_overhead)
            d_flop, d_kv, d_q = self._attn[0], 2 * kvh * hd * b / dbw, 2 * qh * hd * b / dbw
        else:
            # MLA (vLLM's MLA backends): prefill as multi-head attention over the decompressed keys
            # (nope + rope wide) and values (v wide); decode absorbed, every head attending to the
            # cached latent and rotary key (kv_lora + rope wide) as one shared KV head (FlashMLA).
            qk_v = m.nope + m.rope + m.v
            self._attn = (2 * qh * qk_v / rate, qh * qk_v * b / bw, qh * qk_v * b / bw, g.kernel_floor,
                          g.kernel_overhead)
            latent = m.kv_lora + m.rope
            d_flop, d_kv, d_q = 2 * qh * (latent + m.kv_lora) / rate, latent * b / dbw, qh * (latent + m.kv_lora) * b / dbw
        self._decode_attn = (d_kv, d_q, self.attention.latency + g.kernel_overhead)
        # sliding-window layers: their share of a stage's layers (0: none) and the window
        full = self.layers_per_stage
        slide = 0.0
        if s.sliding_layers:
            slide = self.layers_per_stage * s.sliding_layers / s.layers
            full = self.layers_per_stage * s.full_layers / s.layers
        self._layer_split = (full, slide, s.window)
        # what a decode-only step's attention is made of: (flop, kv byte, query byte, floor, fixed, layers, pp)
        self.decode_terms = (d_flop, *self._decode_attn[:2], g.kernel_floor, self._decode_attn[2],
                              self.layers_per_stage, self.pp)
        self._decode_base: dict[int, tuple[float, float]] = {}
        self._decode = None  # decode_timer()'s function, made on first use

    def attention_time(self, decode_context: float, decode_requests: int,
                       prefill_pairs: float, prefill_kv_tokens: float, prefill_tokens: float,
                       decode_queries: int = 1, windowed: tuple[float, float] | None = None) -> float:
        """Attention of one stage's layers.

        ``decode_context``: sum of context lengths of decoding requests; ``prefill_pairs``:
        sum over prefill chunks of n*(p + (n+1)/2), the causal query-key pairs;
        ``prefill_kv_tokens``: sum of p + n (keys read); ``prefill_tokens``: sum of n.
        ``decode_queries``: query tokens per decoding request (k + 1 when it verifies k drafts:
        each reads its context's K/V once, as the decode kernel does for a multi-token query, and
        does that many times the query-key work). ``windowed``: the prefill chunks' (pairs, keys)
        within the sliding window (:func:`window_pairs`), for the sliding-window layers, whose
        decodes read at most the window of each context.
        """
        full, slide, window = self._layer_split
        if self.dp > 1:  # the busiest rank's share of the step's requests (spread evenly)
            d = self.dp
            decode_context, prefill_pairs, prefill_kv_tokens = decode_context / d, prefill_pairs / d, prefill_kv_tokens / d
            decode_requests, prefill_tokens = self.per_rank(decode_requests), prefill_tokens / d
            windowed = None if windowed is None else (windowed[0] / d, windowed[1] / d)
        t = self._layer_attention(decode_context, decode_requests, prefill_pairs, prefill_kv_tokens, prefill_tokens,
                                  decode_queries)
        if not slide:
            return self.layers_per_stage * t
        pairs, keys = windowed if windowed is not None else (prefill_pairs, prefill_kv_tokens)
        ctx = min(decode_context, decode_requests * (window + decode_queries - 1))
        return full * t + slide * self._layer_attention(ctx, decode_requests, pairs, keys, prefill_tokens,
                                                        decode_queries)

    def _layer_attention(self, decode_context: float, decode_requests: int, prefill_pairs: float,
                         prefill_kv_tokens: float, prefill_tokens: float, decode_queries: int) -> float:
        """Attention of one layer (:meth:`attention_time`'s terms)."""
        flop, kv_byte, q_byte, floor, gap = self._attn
        d_flop = self.decode_terms[0]
        t = 0.0
        if decode_requests:
            d_kv, d_q, d_fixed = self._decode_attn
            if decode_queries == 1:
                t += max(decode_context * d_flop, decode_context * d_kv + decode_requests * d_q, floor) + d_fixed
            else:
                q = decode_queries
                t += max(decode_context * q * d_flop, decode_context * d_kv + decode_requests * q * d_q, floor) + d_fixed
        if prefill_tokens:
            t += max(prefill_pairs * flop, prefill_kv_tokens * kv_byte + prefill_tokens * q_byte, floor) + gap
        return t

    def comm_time(self, tokens: int) -> float:
        """TP all-reduces (two per layer) and PP activation sends for one step (memoized)."""
        cached = self._comm_cache.get(tokens)
        if cached is None:
            cached = self._comm_cache[tokens] = self._comm_time(tokens)
        return cached

    @property
    def collectives_per_layer(self) -> float:
        """Collectives a step runs per layer: TP's two all-reduces, or under DP attention the
        dispatch and combine all-to-alls of each MoE layer (none in its dense layers)."""
        s = self.shape
        if self.dp_attention:
            return 2.0 * (s.layers - s.dense_layers) / s.layers
        return ALLREDUCES_PER_LAYER

    def collective_parts(self, tokens: int) -> tuple[float, float]:
        """(fixed seconds, seconds of its bytes) of one of a step's collectives on an idle fabric:
        TP's all-reduce (:meth:`allreduce_parts`), or DP attention's all-to-all of one rank's
        routed hidden states (each rank sends its tokens' top-k copies, a (n-1)/n share leaving it)."""
        if not self.dp_attention:
            return self.allreduce_parts(tokens)
        s = self.shape
        nbytes = self.per_rank(tokens) * s.top_k * s.hidden * self.b
        return self.link_latency, alltoall_time(nbytes, self.tp, self.link_bandwidth, 0.0)

    def allreduce_parts(self, tokens: int) -> tuple[float, float]:
        """(fixed seconds, seconds of its bytes) of one TP all-reduce of a step's activations, as
        the engine's all-reduce policy (``parallel.allreduce``) runs it on an idle fabric."""
        policy = ALLREDUCE_POLICIES[self.allreduce]
        return policy.parts(self.activation_bytes(tokens), self.tp, self.allreduce_link)

    def peak_activation_bytes(self, max_tokens: int, max_sequences: int) -> float:
        """Activation memory a step of ``max_tokens`` tokens and ``max_sequences`` sampled
        sequences needs at its peak (what vLLM's profile run reserves), estimated as
        ``ACT_HIDDEN_COPIES`` hidden-size tensors and the MLP's gate and up outputs per token
        plus the fp32 logits of every sequence."""
        s = self.shape
        per_token = ACT_HIDDEN_COPIES * s.hidden + ACT_FFN_COPIES * s.ffn // self.tp
        return max_tokens * per_token * self.b + max_sequences * s.vocab * LOGIT_BYTES

    def activation_bytes(self, tokens: int) -> float:
        """Bytes of one hidden-state tensor of ``tokens`` tokens: what a TP all-reduce reduces
        and a PP stage sends on."""
        return tokens * self.shape.hidden * self.b

    def _comm_time(self, tokens: int) -> float:
        t = 0.0
        if self.tp > 1:
            t += self.collectives_per_layer * self.shape.layers * sum(self.collective_parts(tokens))
        if self.pp > 1:
            t += (self.pp - 1) * p2p_time(tokens * self.shape.hidden * self.b, self.link_bandwidth, self.link_latency)
        return t

    def step(self, decode_context: float, decode_requests: int, prefill_chunks=(),
             sampled: int | None = None, decode_queries: int = 1) -> StepCost:
        """Time of one engine step.

        ``prefill_chunks`` is a sequence of (cached tokens p, new tokens n); ``sampled`` is how
        many sequences get logits (default: every decode and every chunk); ``decode_queries``:
        tokens each decoding request feeds (k + 1 in a speculative verify step; its
        ``decode_context`` then sums each request's context including them).
        """
        n_new = pairs = kv = 0
        for p, n in prefill_chunks:
            n_new += n
            pairs += n * (p + (n + 1) / 2)
            kv += p + n
        if self.step_time is not None:  # a stub GPU: the step is its function of the batch
            return StepCost(compute=self.step_time.of(decode_requests, n_new), comm=0.0)
        tokens = decode_requests * decode_queries + n_new if decode_queries != 1 else decode_requests + n_new
        windowed = window_pairs(prefill_chunks, self.shape.window) if self.shape.sliding_layers else None
        stage = self.linear_time(tokens) + self.attention_time(decode_context, decode_requests, pairs, kv, n_new,
                                                               decode_queries, windowed)
        if sampled is None:
            sampled = decode_requests + len(prefill_chunks)
        return StepCost(compute=self.pp * stage + self.head_time(sampled), comm=self.comm_time(tokens))

    def decode_time(self, decode_context: float, decode_requests: int) -> float:
        """``step(ctx, n).compute`` of a decode-only step, to the last bit: the same arithmetic in the
        same order, in one call (:meth:`decode_timer`'s function)."""
        if self.step_time is not None:
            return self.step_time.of(decode_requests, 0)
        if self._decode is None:
            self._decode = self.decode_timer()
        return self._decode(decode_context, decode_requests)

    def decode_timer(self):
        """The decode step time as a plain function of (context, requests), its terms bound once: what a
        closed-form decode run calls once per step (a bound function is a cheaper call than a method)."""
        flop, d_kv, d_q, floor, d_fixed, layers, pp = self.decode_terms
        memo, linear, head = self._decode_base, self.linear_time, self.head_time
        full, slide, window = self._layer_split
        if self.dp > 1:  # the ranks' shares: the step's own arithmetic
            return lambda ctx, n: self.step(ctx, n).compute

        def decode(ctx: float, n: int) -> float:
            base = memo.get(n)
            if base is None:  # linear and head time are memoized per batch size
                base = memo[n] = (linear(n), head(n))
            return pp * (base[0] + layers * (max(ctx * flop, ctx * d_kv + n * d_q, floor) + d_fixed)) + base[1]

        def decode_sliding(ctx: float, n: int) -> float:  # attention_time's split, in its order
            base = memo.get(n)
            if base is None:
                base = memo[n] = (linear(n), head(n))
            w = min(ctx, n * window)
            attn = full * (max(ctx * flop, ctx * d_kv + n * d_q, floor) + d_fixed) + slide * (
                max(w * flop, w * d_kv + n * d_q, floor) + d_fixed)
            return pp * (base[0] + attn) + base[1]
        return decode_sliding if slide else decode

    def launch_time(self, cuda_graphs: bool) -> float:
        """CPU seconds to launch one step's kernels (none apart for a stub GPU: its step includes them)."""
        return 0.0 if self.step_time is not None else self.gpu.launch_time(self.kernels_per_step(), cuda_graphs)

    def kernels_per_step(self) -> int:
        """Kernel launches of one step (for eager-mode launch cost): each layer's operators and
        its attention, and the step's own (counted once: every replica's engine asks)."""
        if self._kernels is None:
            self._kernels = self._count_kernels()
        return self._kernels

    def _count_kernels(self) -> int:
        s = self.shape
        per_layer = sum(op.count for op in self._linear_ops(1)) + 1
        dense = sum(op.count for op in self._linear_ops(1, dense_mlp=True)) + 1 if s.dense_layers else per_layer
        return (s.layers - s.dense_layers) * per_layer + s.dense_layers * dense + KERNELS_PER_STEP

