"""Cost of a decoder-only transformer step: FLOPs and bytes per operator, timed on a GPU model.

A step is a batch of new tokens: decode tokens (one per running request, attending to its
context) and prefill chunks (n new tokens after p cached ones). Weights are read once per
step; attention reads each request's own K/V. Tensor parallelism splits heads and MLP
columns and adds two all-reduces per layer; pipeline parallelism splits the layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..hardware.collectives import allreduce_time, p2p_time
from ..hardware.gpu import GPU
from ..hardware.ops import DTYPE_BYTES, Op

KERNELS_PER_LAYER = 9
"""Kernels of one decoder layer in vLLM's LlamaDecoderLayer (eager mode): fused residual-add +
RMSNorm, QKV GEMM, rotary embedding, attention, O GEMM, fused residual-add + RMSNorm, gate/up
GEMM, SiluAndMul, down GEMM (the residual add is fused into the next norm)."""

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

    @classmethod
    def from_spec(cls, spec) -> "LLMShape":
        return cls(spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn,
                   spec.vocab, spec.experts, spec.top_k)

    def layer_params(self) -> tuple[int, int]:
        """(attention params, MLP params of all experts) of one layer."""
        h, hd = self.hidden, self.head_dim
        attn = h * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * h
        mlp = 3 * h * self.ffn * self.experts + (h * self.experts if self.experts > 1 else 0)
        return attn, mlp

    def params(self) -> int:
        """Total parameters (untied embedding and LM head, norms included)."""
        attn, mlp = self.layer_params()
        return self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def active_params(self) -> int:
        """Parameters touched per token (top-k experts only)."""
        attn, _ = self.layer_params()
        mlp = 3 * self.hidden * self.ffn * self.top_k
        return self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes of one token across all layers (whole model)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


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
    allreduce_bandwidth: float | None = None
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

    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds: its layers' share under TP plus its share of embedding/LM head."""
        s = self.shape
        attn, mlp = s.layer_params()
        per_layer = (attn + mlp) / self.tp + 2 * s.hidden
        emb = s.vocab * s.hidden / self.tp
        return (self.layers_per_stage * per_layer + emb) * self.b

    def kv_bytes_per_token_per_gpu(self) -> float:
        """K/V bytes one token occupies on one GPU."""
        kv_heads = max(1, self.shape.kv_heads // self.tp)
        return 2 * self.layers_per_stage * kv_heads * self.shape.head_dim * self.b

    def _linear_ops(self, t: int) -> list[Op]:
        """One layer's token-parallel ops (everything but attention) for t new tokens."""
        s, b, tp, dt = self.shape, self.b, self.tp, self.dtype
        h = s.hidden
        q_out = s.heads * s.head_dim // tp
        kv_out = 2 * max(1, s.kv_heads // tp) * s.head_dim
        ops = [
            Op("norm", 5 * t * h, 2 * t * h * b, dtype=dt),
            Op("qkv", 2 * t * h * (q_out + kv_out), (h * (q_out + kv_out) + t * h + t * (q_out + kv_out)) * b,
               gemm=(t, q_out + kv_out, h), dtype=dt),
            Op("rope_kv_write", 6 * t * (q_out + kv_out), 2 * t * (q_out + kv_out) * b, dtype=dt),
            Op("o_proj", 2 * t * q_out * h, (q_out * h + t * q_out + t * h) * b, gemm=(t, h, q_out), dtype=dt),
            Op("residual_norm", 8 * t * h, 4 * t * h * b, dtype=dt),
        ]
        f = s.ffn // tp
        if s.experts == 1:
            ops += [
                Op("gate_up", 4 * t * h * f, (2 * h * f + t * h + 2 * t * f) * b, gemm=(t, 2 * f, h), dtype=dt),
                Op("act_mul", 4 * t * f, 3 * t * f * b, dtype=dt),
                Op("down", 2 * t * f * h, (f * h + t * f + t * h) * b, gemm=(t, h, f), dtype=dt),
            ]
        else:
            # Expected number of distinct experts hit by t tokens choosing top_k of E each.
            e, k = s.experts, s.top_k
            active = e * (1.0 - (1.0 - k / e) ** t)
            routed = t * k
            ops += [
                Op("router", 2 * t * h * e, (h * e + t * h) * b, dtype=dt),
                Op("moe_experts", 6 * routed * h * f,
                   active * 3 * h * f * b + (2 * routed * h + 3 * routed * f) * b, dtype=dt),
                Op("moe_combine", 2 * routed * h, 2 * routed * h * b, dtype=dt),
            ]
        ops.append(Op("residual", t * h, 3 * t * h * b, dtype=dt))
        return ops

    def linear_time(self, t: int) -> float:
        """GPU time of all token-parallel ops of one stage's layers for t new tokens (memoized)."""
        cached = self._gemm_cache.get(t)
        if cached is None:
            cached = self.layers_per_stage * self.gpu.ops_time(self._linear_ops(t))
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
        v = s.vocab // self.tp
        n = max(sequences, 1)
        ops = [
            Op("final_norm", 5 * n * s.hidden, 2 * n * s.hidden * b, dtype=self.dtype),
            Op("lm_head", 2 * n * s.hidden * v, (s.hidden * v + n * s.hidden) * b + n * v * LOGIT_BYTES,
               gemm=(n, v, s.hidden), dtype=self.dtype),
            Op("sample", SAMPLING_FLOPS_PER_LOGIT * n * s.vocab, SAMPLING_LOGIT_PASSES * n * s.vocab * LOGIT_BYTES,
               dtype="fp32"),
        ]
        return self.gpu.ops_time(ops)

    def __post_init__(self):
        s, b = self.shape, self.b
        qh = s.heads // self.tp
        kvh = max(1, s.kv_heads // self.tp)
        hd = s.head_dim
        rate, bw = self.gpu.flops_rate(self.attn_dtype), self.gpu.bandwidth
        # Attention time per layer = max(flop_coef * work / rate, byte terms / bw) + overhead.
        self._attn = (4 * qh * hd / rate, 2 * kvh * hd * b / bw, 2 * qh * hd * b / bw, self.gpu.kernel_overhead)

    def attention_time(self, decode_context: float, decode_requests: int,
                       prefill_pairs: float, prefill_kv_tokens: float, prefill_tokens: float) -> float:
        """Attention of one stage's layers.

        ``decode_context``: sum of context lengths of decoding requests; ``prefill_pairs``:
        sum over prefill chunks of n*(p + (n+1)/2), the causal query-key pairs;
        ``prefill_kv_tokens``: sum of p + n (keys read); ``prefill_tokens``: sum of n.
        """
        flop, kv_byte, q_byte, k = self._attn
        t = 0.0
        if decode_requests:
            t += max(decode_context * flop, decode_context * kv_byte + decode_requests * q_byte) + k
        if prefill_tokens:
            t += max(prefill_pairs * flop, prefill_kv_tokens * kv_byte + prefill_tokens * q_byte) + k
        return self.layers_per_stage * t

    def comm_time(self, tokens: int) -> float:
        """TP all-reduces (two per layer) and PP activation sends for one step (memoized)."""
        cached = self._comm_cache.get(tokens)
        if cached is None:
            cached = self._comm_cache[tokens] = self._comm_time(tokens)
        return cached

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
            nbytes = tokens * self.shape.hidden * self.b
            bw = self.allreduce_bandwidth or self.link_bandwidth
            t += 2 * self.shape.layers * allreduce_time(nbytes, self.tp, bw, self.link_latency)
        if self.pp > 1:
            t += (self.pp - 1) * p2p_time(tokens * self.shape.hidden * self.b, self.link_bandwidth, self.link_latency)
        return t

    def step(self, decode_context: float, decode_requests: int, prefill_chunks=(),
             sampled: int | None = None) -> StepCost:
        """Time of one engine step.

        ``prefill_chunks`` is a sequence of (cached tokens p, new tokens n); ``sampled`` is how
        many sequences get logits (default: every decode and every chunk).
        """
        n_new = pairs = kv = 0
        for p, n in prefill_chunks:
            n_new += n
            pairs += n * (p + (n + 1) / 2)
            kv += p + n
        tokens = decode_requests + n_new
        stage = self.linear_time(tokens) + self.attention_time(decode_context, decode_requests, pairs, kv, n_new)
        if sampled is None:
            sampled = decode_requests + len(prefill_chunks)
        return StepCost(compute=self.pp * stage + self.head_time(sampled), comm=self.comm_time(tokens))

    def kernels_per_step(self) -> int:
        """Kernel launches of one step (for eager-mode launch cost)."""
        return self.shape.layers * KERNELS_PER_LAYER + KERNELS_PER_STEP

