"""Cost model of diffusion-transformer inference: FLOPs and HBM bytes per operator.

Pure functions from a catalog entry (``simulator/config/catalog/dits.yaml``) to lists of
:class:`~simulator.hardware.ops.Op` for the transformer blocks, the text encoders and the
VAE decoder. A GPU model turns the ops into time; pipelines pick which ops run where.

Conventions. A multiply-add is 2 FLOP (as torch's FLOP counter, which produced the reference
figures). Matmuls carry their (m, n, k) shape; attention is one fused (flash) kernel that
never writes the score matrix; element-wise kernels (norms, modulation, activations,
residuals) are counted by the bytes they move, with a few FLOP per element. Weights are read
once per op. Under ``dtype="fp8"`` the GEMMs run in FP8 with 1-byte weights while
activations, attention and element-wise kernels stay BF16.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..config.dit_arch import TIME_FREQ_DIM, SD_VAE, DiTArch, TextEncoderArch, VAEArch
from ..hardware.ops import DTYPE_BYTES, Op


def act_bytes(dtype: str) -> int:
    """Bytes per activation element: FP8 runs keep activations in BF16."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {tuple(DTYPE_BYTES)}, got {dtype!r}")
    return 2 if dtype == "fp8" else DTYPE_BYTES[dtype]


def _act_dtype(dtype: str) -> str:
    return "bf16" if dtype == "fp8" else dtype


def _linear(name: str, m: int, n: int, k: int, dtype: str) -> Op:
    """y[m,n] = x[m,k] @ W[k,n]: weights read once, input read, output written."""
    a = act_bytes(dtype)
    return Op(name, 2.0 * m * n * k, float(k * n * DTYPE_BYTES[dtype] + (m * k + m * n) * a),
              gemm=(m, n, k), dtype=dtype)


def _eltwise(name: str, read: float, written: float, flops_per_elem: float, dtype: str) -> Op:
    """A memory-bound kernel reading ``read`` and writing ``written`` elements."""
    return Op(name, float(flops_per_elem * written), float((read + written) * act_bytes(dtype)),
              dtype=_act_dtype(dtype))


def _attention(name: str, batch: int, heads: int, q: int, kv: int, head_dim: int,
               dtype: str) -> Op:
    """Fused attention: QK^T and PV (4·q·kv·d FLOP per head); reads Q, K, V, writes O."""
    flops = 4.0 * batch * heads * q * kv * head_dim
    io = batch * heads * head_dim * (2 * q + 2 * kv) * act_bytes(dtype)
    return Op(name, flops, float(io), dtype=_act_dtype(dtype))


def _split(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise ValueError(f"tp={tp} does not divide {what} ({total})")
    return total // tp


def total_flops(ops: Iterable[Op]) -> float:
    """FLOPs of a list of ops, counting repeats."""
    return sum(op.flops * op.count for op in ops)


def total_bytes(ops: Iterable[Op]) -> float:
    """HBM bytes of a list of ops, counting repeats."""
    return sum(op.bytes * op.count for op in ops)


def merge_ops(ops: Iterable[Op]) -> list[Op]:
    """Fold identical ops into one with the summed ``count`` (first-appearance order)."""
    counts: dict[Op, int] = {}
    for op in ops:
        key = replace(op, count=1)
        counts[key] = counts.get(key, 0) + op.count
    return [replace(op, count=n) for op, n in counts.items()]


# ---- tokens --------------------------------------------------------------------------------

def image_tokens(arch: DiTArch, height_px: int, width_px: int, frames: int | None = None) -> int:
    """Tokens of one sample: (H/(vae·patch)) x (W/(vae·patch)); 4,096 at 1024² for patch 2; a video's
    times its latent frames over the temporal patch (Wan 2.1 at 832x480, 81 frames: 21 x 30 x 52 = 32,760).

    FLUX's 2x2 packing of the 16-channel latent is the same thing as patch 2.
    """
    cell = arch.vae_downsample * arch.patch_size
    if height_px <= 0 or width_px <= 0 or height_px % cell or width_px % cell:
        raise ValueError(f"{arch.name}: image {height_px}x{width_px} px must be a positive "
                         f"multiple of {cell} (VAE x{arch.vae_downsample}, patch {arch.patch_size})")
    return arch.latent_frames(frames) // arch.patch_frames * (height_px // cell) * (width_px // cell)


# ---- transformer blocks --------------------------------------------------------------------

def _stream_pre(p: str, arch: DiTArch, tokens: int, batch: int, dtype: str, tp: int,
                mod_width: int) -> list[Op]:
    """Modulation, norm and QKV projection of one stream (plus qk-norm / RoPE)."""
    D, inner_tp = arch.hidden, _split(arch.inner, tp, "heads*head_dim")
    ops = []
    if mod_width:  # adaLN: SiLU(temb) @ W[D, mod_width·D], replicated under tp
        ops.append(_linear(f"{p}adaln_mod", batch, mod_width * D, D, dtype))
    ops.append(_eltwise(f"{p}norm_mod", tokens * D, tokens * D, 7, dtype))
    ops.append(_linear(f"{p}qkv", tokens, 3 * inner_tp, D, dtype))
    if arch.qk_norm:
        ops.append(_eltwise(f"{p}qk_norm", 2 * tokens * inner_tp, 2 * tokens * inner_tp, 4, dtype))
    if arch.rope:
        ops.append(_eltwise(f"{p}rope", 2 * tokens * inner_tp, 2 * tokens * inner_tp, 3, dtype))
    return ops


def _stream_post(p: str, arch: DiTArch, tokens: int, dtype: str, tp: int) -> list[Op]:
    """Attention out-projection, gated residual, norm, MLP, gated residual of one stream."""
    D, F = arch.hidden, _split(arch.mlp_hidden, tp, "MLP hidden")
    inner_tp = arch.inner // tp
    return [
        _linear(f"{p}attn_out", tokens, D, inner_tp, dtype),
        _eltwise(f"{p}gate_residual", 2 * tokens * D, tokens * D, 2, dtype),
        _eltwise(f"{p}norm_mod", tokens * D, tokens * D, 7, dtype),
        _linear(f"{p}mlp_in", tokens, F, D, dtype),
        _eltwise(f"{p}gelu", tokens * F, tokens * F, 8, dtype),
        _linear(f"{p}mlp_out", tokens, D, F, dtype),
        _eltwise(f"{p}gate_residual", 2 * tokens * D, tokens * D, 2, dtype),
    ]


def block_ops(arch: DiTArch, q_tokens: int, kv_tokens: int, batch: int = 1,
              dtype: str = "bf16", tp: int = 1, text_tokens: int | None = None, *,
              kind: str | None = None, text_stream: bool = True,
              context_pre_only: bool = False, cross_tp: bool = True) -> list[Op]:
    """Operators of one transformer block, per GPU, for ``q_tokens`` image tokens per sample.

    The image queries attend to ``kv_tokens`` image keys/values (``kv_tokens > q_tokens`` for a
    PipeFusion patch reading stale K/V of the whole image); projections and MLP scale with
    ``q_tokens``, attention with ``q_tokens · kv_tokens``. ``text_tokens`` (default: the
    model's) is the text length: cross-attention keys (PixArt) or the joint text sequence
    (SD3/FLUX), whose K/V every query also attends to. ``text_stream=False`` skips the text
    tokens' own projections and MLP (their K/V assumed computed once and cached, e.g. by
    another patch). ``tp`` splits heads and MLP columns; adaLN modulation and norms are
    replicated, and so is a cross-attention with ``cross_tp=False`` (every rank runs all of it,
    as xDiT legacy's tensor parallel does). ``kind`` picks the block kind where a model has
    several (FLUX).
    """
    kinds = {k for k, _ in arch.segments}
    if kind is None:
        if len(kinds) != 1:
            raise ValueError(f"{arch.name} has block kinds {sorted(kinds)}: pass kind=")
        (kind,) = kinds
    elif kind not in kinds:
        raise ValueError(f"{arch.name} has no {kind!r} blocks (it has {sorted(kinds)})")
    if q_tokens <= 0 or kv_tokens < q_tokens or batch <= 0 or tp <= 0:
        raise ValueError(f"need q_tokens > 0, kv_tokens >= q_tokens, batch > 0, tp > 0; got "
                         f"q={q_tokens}, kv={kv_tokens}, batch={batch}, tp={tp}")
    T = arch.text_tokens if text_tokens is None else text_tokens
    if T < 0 or (kind == "cross" and T == 0):
        raise ValueError(f"{arch.name}: bad text_tokens {T}")
    b = _Block(arch, q_tokens, kv_tokens, batch, dtype, tp, T, text_stream, context_pre_only, cross_tp)
    return _BLOCKS[kind](b, kind)


@dataclass(frozen=True)
class _Block:
    """One block's shape on one GPU: the sizes every block kind's operators are built from."""

    arch: DiTArch
    q_tokens: int
    kv_tokens: int
    batch: int
    dtype: str
    tp: int
    T: int
    text_stream: bool
    context_pre_only: bool
    cross_tp: bool

    @property
    def heads(self) -> int:
        return _split(self.arch.heads, self.tp, "heads")

    @property
    def bq(self) -> int:
        return self.batch * self.q_tokens

    @property
    def txt(self) -> int:
        """Text tokens whose own projections and MLP run here (0 when their K/V are cached)."""
        return self.T if self.text_stream else 0


def _adaln_block(b: _Block, kind: str) -> list[Op]:
    """PixArt (``cross``) and class-conditioned DiT (``self``): adaLN, self-attention, [cross-attention], MLP."""
    arch, D, dtype = b.arch, b.arch.hidden, b.dtype
    per_block_mod = arch.modulation == "per_block"
    ops = [] if per_block_mod else [_eltwise("adaln_table", 12 * b.batch * D, 6 * b.batch * D, 1, dtype)]
    ops += _stream_pre("", arch, b.bq, b.batch, dtype, b.tp, 6 if per_block_mod else 0)
    ops.append(_attention("self_attn", b.batch, b.heads, b.q_tokens, b.kv_tokens, arch.head_dim, dtype))
    post = _stream_post("", arch, b.bq, dtype, b.tp)
    if kind == "cross":  # PixArt: x = x + CrossAttn(x, text), no norm, between attn and MLP
        c_heads, c_inner = (b.heads, arch.inner // b.tp) if b.cross_tp else (arch.heads, arch.inner)
        cross = [_linear("cross_q", b.bq, c_inner, D, dtype)]
        if b.text_stream:
            cross.append(_linear("cross_kv", b.batch * b.T, 2 * c_inner, D, dtype))
        cross += [_attention("cross_attn", b.batch, c_heads, b.q_tokens, b.T, arch.head_dim, dtype),
                  _linear("cross_out", b.bq, D, c_inner, dtype),
                  _eltwise("cross_residual", 2 * b.bq * D, b.bq * D, 1, dtype)]
        post = post[:2] + cross + post[2:]
    return ops + post


def _joint_block(b: _Block, kind: str) -> list[Op]:
    """MMDiT double stream (SD3, FLUX double): image and text streams attend jointly."""
    arch, dtype, txt = b.arch, b.dtype, b.txt
    ops = _stream_pre("img_", arch, b.bq, b.batch, dtype, b.tp, 6)
    if txt:
        ops += _stream_pre("txt_", arch, b.batch * txt, b.batch, dtype, b.tp, 2 if b.context_pre_only else 6)
    ops.append(_attention("joint_attn", b.batch, b.heads, b.q_tokens + txt, b.kv_tokens + b.T,
                          arch.head_dim, dtype))
    ops += _stream_post("img_", arch, b.bq, dtype, b.tp)
    if txt and not b.context_pre_only:
        ops += _stream_post("txt_", arch, b.batch * txt, dtype, b.tp)
    return ops


def _single_block(b: _Block, kind: str) -> list[Op]:
    """FLUX single stream: text and image share weights; attention and MLP run in parallel."""
    arch, dtype, txt, D = b.arch, b.dtype, b.txt, b.arch.hidden
    inner_tp = arch.inner // b.tp
    n = b.bq + b.batch * txt
    F = _split(arch.mlp_hidden, b.tp, "MLP hidden")
    ops = _stream_pre("", arch, n, b.batch, dtype, b.tp, 3)
    ops[2:2] = [_linear("mlp_in", n, F, D, dtype)]
    ops += [
        _attention("joint_attn", b.batch, b.heads, b.q_tokens + txt, b.kv_tokens + b.T, arch.head_dim, dtype),
        _eltwise("gelu", n * F, n * F, 8, dtype),
        _eltwise("concat", n * (inner_tp + F), n * (inner_tp + F), 0, dtype),
        _linear("proj_out", n, D, inner_tp + F, dtype),
        _eltwise("gate_residual", 2 * n * D, n * D, 2, dtype),
    ]
    return ops


_BLOCKS = {"cross": _adaln_block, "self": _adaln_block, "joint": _joint_block, "single": _single_block}
"""Block kind (``config.dit_arch.BLOCK_KINDS``) -> the builder of its operators."""


def layer_ops(arch: DiTArch, layer_index: int, q_tokens: int, kv_tokens: int, batch: int = 1,
              dtype: str = "bf16", tp: int = 1, text_tokens: int | None = None, *,
              text_stream: bool = True, cross_tp: bool = True) -> list[Op]:
    """Operators of layer ``layer_index`` (its block kind and, for SD3's last block, no text MLP)."""
    kind = arch.layer_kind(layer_index)
    last = layer_index == arch.num_layers - 1
    return block_ops(arch, q_tokens, kv_tokens, batch, dtype, tp, text_tokens, kind=kind,
                     text_stream=text_stream, cross_tp=cross_tp,
                     context_pre_only=arch.context_pre_only_last and last and kind == "joint")


def embed_ops(arch: DiTArch, q_tokens: int, batch: int = 1, dtype: str = "bf16",
              text_tokens: int | None = None, *, text_stream: bool = True) -> list[Op]:
    """Before the first block: patch embedding, timestep/guidance/pooled-text MLPs, text projection."""
    D, bq = arch.hidden, batch * q_tokens
    T = arch.text_tokens if text_tokens is None else text_tokens
    ops = [_linear("patch_embed", bq, D, arch.latent_channels * arch.patch_size ** 2, dtype)]
    if not arch.rope:
        ops.append(_eltwise("pos_embed", 2 * bq * D, bq * D, 1, dtype))
    cond = [("time", TIME_FREQ_DIM)]
    if arch.guidance_embed:
        cond.append(("guidance", TIME_FREQ_DIM))
    if arch.pooled_text_dim:
        cond.append(("pooled", arch.pooled_text_dim))
    for name, width in cond:
        ops += [_linear(f"{name}_embed_1", batch, D, width, dtype),
                _linear(f"{name}_embed_2", batch, D, D, dtype)]
    if arch.text_mode == "class":
        ops.append(_eltwise("class_embed", batch * D, batch * D, 1, dtype))
    if arch.modulation == "single":
        ops.append(_linear("adaln_single", batch, 6 * D, D, dtype))
    if text_stream and T and arch.context_embedder != "none":
        ops.append(_linear("context_embed", batch * T, D, arch.caption_channels, dtype))
        if arch.context_embedder == "mlp":
            ops += [_eltwise("context_gelu", batch * T * D, batch * T * D, 8, dtype),
                    _linear("context_embed_2", batch * T, D, D, dtype)]
    return ops


def final_ops(arch: DiTArch, q_tokens: int, batch: int = 1, dtype: str = "bf16") -> list[Op]:
    """After the last block: final norm with modulation and the projection back to latent patches."""
    D, bq = arch.hidden, batch * q_tokens
    ops = []
    if arch.modulation == "per_block":
        ops.append(_linear("final_mod", batch, 2 * D, D, dtype))
    ops += [_eltwise("final_norm_mod", bq * D, bq * D, 7, dtype),
            _linear("final_proj", bq, arch.out_channels * arch.patch_size ** 2, D, dtype)]
    return ops


def stage_ops(arch: DiTArch, start: int, stop: int, q_tokens: int, kv_tokens: int,
              batch: int = 1, dtype: str = "bf16", tp: int = 1, text_tokens: int | None = None,
              *, text_stream: bool = True, cross_tp: bool = True) -> list[Op]:
    """Operators of a pipeline stage holding layers [start, stop), identical blocks folded by count.

    The stage that holds layer 0 also runs the embeddings; the one holding the last layer, the
    final projection.
    """
    if not 0 <= start < stop <= arch.num_layers:
        raise ValueError(f"{arch.name}: bad layer range [{start}, {stop}) of {arch.num_layers}")
    ops: list[Op] = []
    if start == 0:
        ops += embed_ops(arch, q_tokens, batch, dtype, text_tokens, text_stream=text_stream)
    # runs of identical blocks: same kind, and SD3's context-pre-only last block on its own
    last = arch.num_layers - 1
    runs: list[list[int]] = []
    for i in range(start, stop):
        key = (arch.layer_kind(i), i == last)
        if runs and runs[-1][0] == key:
            runs[-1][2] += 1
        else:
            runs.append([key, i, 1])
    for _, first, n in runs:
        ops += [replace(op, count=op.count * n) for op in
                layer_ops(arch, first, q_tokens, kv_tokens, batch, dtype, tp, text_tokens,
                          text_stream=text_stream, cross_tp=cross_tp)]
    if stop == arch.num_layers:
        ops += final_ops(arch, q_tokens, batch, dtype)
    return merge_ops(ops)


def model_ops(arch: DiTArch, q_tokens: int, kv_tokens: int | None = None, batch: int = 1,
              dtype: str = "bf16", tp: int = 1, text_tokens: int | None = None, *,
              text_stream: bool = True) -> list[Op]:
    """Operators of one full forward pass (embeddings, every block, final layer)."""
    kv = q_tokens if kv_tokens is None else kv_tokens
    return stage_ops(arch, 0, arch.num_layers, q_tokens, kv, batch, dtype, tp, text_tokens,
                     text_stream=text_stream)


def forward_flops(arch: DiTArch, height: int, width: int, batch: int = 1) -> float:
    """FLOPs of one transformer forward pass at ``height`` x ``width`` pixels (no encoder, no VAE)."""
    s = image_tokens(arch, height, width)
    return total_flops(model_ops(arch, s, s, batch))


def param_count(arch: DiTArch) -> float:
    """Transformer parameters derived from the shapes (matmul weights + embedding tables), every expert's."""
    ops = model_ops(arch, 1, 1, 1, "bf16")
    table = arch.num_classes + 1 if arch.text_mode == "class" else 0
    return arch.experts * float(sum(op.gemm[1] * op.gemm[2] * op.count for op in ops if op.gemm)
                                + table * arch.hidden)


# ---- memory helpers ------------------------------------------------------------------------

def dit_memory(arch: DiTArch, dtype: str = "bf16", *, text_encoders: bool = False,
               vae: bool = False) -> float:
    """Parameter bytes of the transformer (catalog count), optionally with encoders and VAE."""
    n = arch.params
    if text_encoders:
        n += sum(e.params for e in arch.text_encoders)
    if vae:
        n += arch.vae.params
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {tuple(DTYPE_BYTES)}, got {dtype!r}")
    return n * DTYPE_BYTES[dtype]


def activation_bytes(arch: DiTArch, tokens: int, batch: int = 1, dtype: str = "bf16") -> float:
    """The hidden-state tensor of ``tokens`` tokens: what one pipeline stage hands the next."""
    return float(batch * tokens * arch.hidden * act_bytes(dtype))


def peak_activation_bytes(arch: DiTArch, tokens: int, batch: int = 1,
                          dtype: str = "bf16") -> float:
    """Largest transient working set inside a block (residual + widest intermediates).

    Flash attention never materializes the score matrix, so the MLP hidden (or, for FLUX
    single blocks, QKV + MLP hidden + their concatenation) dominates.
    """
    D, F, inner = arch.hidden, arch.mlp_hidden, arch.inner
    widest = 2 * D + 2 * F
    if any(k == "single" for k, _ in arch.segments):
        widest = max(widest, D + 3 * inner + F + (inner + F) * 2)
    return float(batch * tokens * widest * act_bytes(dtype))


def kv_bytes(arch: DiTArch, tokens: int, layers: int, batch: int = 1, dtype: str = "bf16",
             tp: int = 1) -> float:
    """K and V of ``tokens`` tokens over ``layers`` layers per GPU (stale-KV buffers)."""
    return float(2 * batch * tokens * _split(arch.inner, tp, "heads*head_dim") * layers
                 * act_bytes(dtype))


# ---- text encoders -------------------------------------------------------------------------

def _encoder_ops(enc: TextEncoderArch, batch: int, dtype: str) -> list[Op]:
    D, T, F, inner = enc.hidden, batch * enc.tokens, enc.ffn, enc.heads * enc.head_dim
    p = f"{enc.name}."
    layer = [
        _eltwise(p + "norm", T * D, T * D, 5, dtype),
        _linear(p + "qkv", T, inner + 2 * enc.kv_inner, D, dtype),
        _attention(p + "attn", batch, enc.heads, enc.tokens, enc.tokens, enc.head_dim, dtype),
        _linear(p + "attn_out", T, D, inner, dtype),
        _eltwise(p + "residual", 2 * T * D, T * D, 1, dtype),
        _eltwise(p + "norm", T * D, T * D, 5, dtype),
    ]
    if enc.ffn_kind == "gated_gelu":
        layer += [_linear(p + "wi_0", T, F, D, dtype), _linear(p + "wi_1", T, F, D, dtype),
                  _eltwise(p + "gelu_mul", 2 * T * F, T * F, 9, dtype)]
    else:
        layer += [_linear(p + "fc1", T, F, D, dtype), _eltwise(p + "gelu", T * F, T * F, 8, dtype)]
    layer += [_linear(p + "ffn_out", T, D, F, dtype),
              _eltwise(p + "residual", 2 * T * D, T * D, 1, dtype)]
    return ([_eltwise(p + "embed", T * D, T * D, 0, dtype)]
            + [replace(op, count=op.count * enc.layers) for op in merge_ops(layer)]
            + [_eltwise(p + "final_norm", T * D, T * D, 5, dtype)])


def text_encoder_ops(arch: DiTArch, batch: int = 1, dtype: str = "bf16") -> list[Op]:
    """Forward of every text encoder of ``arch`` over its own token count (empty for class models)."""
    return [op for enc in arch.text_encoders for op in _encoder_ops(enc, batch, dtype)]


def text_encoder_params(enc: TextEncoderArch) -> float:
    """Encoder parameters derived from its shape (embedding table + layers)."""
    inner = enc.heads * enc.head_dim
    ffn_in = 2 if enc.ffn_kind == "gated_gelu" else 1
    per_layer = 2 * enc.hidden * (inner + enc.kv_inner) + (ffn_in + 1) * enc.hidden * enc.ffn
    return float(enc.vocab * enc.hidden + enc.layers * per_layer)


# ---- VAE decoder ---------------------------------------------------------------------------

def _conv(name: str, pixels: int, cin: int, cout: int, ksize: int, dtype: str, depth: int = 1) -> Op:
    """A convolution as an implicit GEMM: m = output pixels, n = cout, k = cin·ksize²·depth (a 3-D
    convolution's temporal taps multiply its reduction)."""
    return _linear(name, pixels, cout, cin * ksize * ksize * depth, dtype)


@dataclass(frozen=True)
class VAEEager:
    """The element-wise kernels an eager video VAE decoder runs around its convolutions, in passes over a
    tensor (``kernels.yaml`` vae_eager, by the decoder's published code), and whether its Conv3d weights are
    channels_last_3d (each convolution's input then copied into that layout, its bias added unvectorised)."""

    norm_silu_passes: int
    cache_clone_frames: int
    pad_passes: int
    relayout_passes: int
    bias_passes: int
    bias_share_channels_last: float
    time_interleave_passes: int
    rearrange_passes: int
    channels_last: bool = False

    def bias(self, name: str, elements: float, dtype: str, conv3d: bool = True) -> Op:
        """The bias added after a convolution by a kernel of its own (unvectorised on a channels_last_3d output:
        the 3-D convolutions'; the 2-D ones run NCHW)."""
        share = self.bias_share_channels_last if self.channels_last and conv3d else 1.0
        return _passes(name + ".bias", elements, self.bias_passes, dtype, share)


def _passes(name: str, elements: float, passes: float, dtype: str, share: float = 1.0) -> Op:
    """``passes`` reads or writes of ``elements`` activations by kernels that compute nothing (copies, fills)."""
    return Op(name, 0.0, float(passes * elements * act_bytes(dtype)), dtype=_act_dtype(dtype), bandwidth_share=share)


def _cached_conv(name: str, pixels: int, cin: int, cout: int, dtype: str, depth: int, cat: float,
                 eager: VAEEager | None = None, ksize: int = 3) -> list[Op]:
    """A ``ksize`` x ``ksize`` convolution ``depth`` frames deep; with a feature cache (``cat`` > 0: the cached
    frames over a call's own) its input is first concatenated after the cached frames (torch.cat: ``cat``
    input's worth more read and all written). With the eager census (``eager``), also what the decoder's code
    runs around it: the clone of the call's last frames as the next cache (with the previous cache's last frame
    where the call has fewer), the padding (a fill and a copy, or, with no spatial padding, a clone), the copy
    into channels_last_3d, and the bias."""
    conv = _conv(name, pixels, cin, cout, ksize, dtype, depth)
    x = pixels * cin
    ops = [_eltwise(name + ".cache_cat", x * (1 + cat), x * (1 + cat), 0, dtype)] if cat else []
    if eager is None:
        return ops + [conv]
    if cat:
        frames = (depth - 1) / cat  # the call's own frames at this level
        kept = min(eager.cache_clone_frames, frames)
        ops.append(_passes(name + ".cache_clone", x * kept / frames, 2, dtype))
        if frames < eager.cache_clone_frames:  # torch.cat of the previous cache's last frame and the clone
            ops.append(_passes(name + ".cache_pair", x * eager.cache_clone_frames / frames, 2, dtype))
    padded = x * (1 + cat)
    pad = eager.pad_passes if ksize > 1 else eager.pad_passes - 1  # all-zero padding: constant_pad_nd clones
    ops.append(_passes(name + ".pad", padded, pad, dtype))
    if eager.channels_last:
        ops.append(_passes(name + ".relayout", padded, eager.relayout_passes, dtype))
    return ops + [conv, eager.bias(name, pixels * cout, dtype)]


def _norm_silu(name: str, elements: float, dtype: str, eager: VAEEager | None) -> Op:
    """A resnet's norm and activation: one fused pass each way, or the eager code's separate kernels."""
    if eager is None:
        return _eltwise(name, elements, elements, 8, dtype)
    return Op(name, 8.0 * elements, float(eager.norm_silu_passes * elements * act_bytes(dtype)),
              dtype=_act_dtype(dtype))


def _resnet(p: str, pixels: int, cin: int, cout: int, dtype: str, depth: int = 1, cat: float = 0.0,
            eager: VAEEager | None = None) -> list[Op]:
    ops = [_norm_silu(p + "norm_silu", pixels * cin, dtype, eager),
           *_cached_conv(p + "conv1", pixels, cin, cout, dtype, depth, cat, eager),
           _norm_silu(p + "norm_silu", pixels * cout, dtype, eager),
           *_cached_conv(p + "conv2", pixels, cout, cout, dtype, depth, cat, eager)]
    if cin != cout:
        ops.append(_conv(p + "shortcut", pixels, cin, cout, 1, dtype))
        if eager is not None:
            ops.append(eager.bias(p + "shortcut", pixels * cout, dtype))
    ops.append(_eltwise(p + "residual", 2 * pixels * cout, pixels * cout, 1, dtype))
    return ops


def _upsample(p: str, px: int, c: int, cout: int, dtype: str, eager: VAEEager | None) -> list[Op]:
    """A 2-D nearest upsample of every frame and its 3x3 convolution to ``cout`` channels (with the eager
    census: the copy that gathers the frames for it from an NCDHW tensor, and the bias)."""
    ops = [_eltwise(p + "upsample", px * c, 4 * px * c, 0, dtype), _conv(p + "upsample_conv", 4 * px, c, cout, 3, dtype)]
    if eager is not None:
        if not eager.channels_last:
            ops.insert(0, _passes(p + "rearrange", px * c, eager.rearrange_passes, dtype))
        ops.append(eager.bias(p + "upsample_conv", 4 * px * cout, dtype, conv3d=False))
    return ops


def vae_decode_ops(height: int, width: int, dtype: str = "bf16", batch: int = 1,
                   vae: VAEArch = SD_VAE, frames: int | None = None, eager: VAEEager | None = None) -> list[Op]:
    """AutoencoderKL decoder from the latent to ``height`` x ``width`` RGB, per its structure.

    conv_in, a mid block (resnet, single-head attention over all latent pixels, resnet), then
    one up block per level with ``layers_per_block + 1`` resnets and a nearest-2x upsample +
    3x3 conv between levels (to half the channels where ``vae.upsample_halves``), then norm and
    conv_out. Conv FLOPs scale with pixels; the mid attention with pixels², which is why 2048²
    costs 4.6x rather than 4x of 1024².

    A video VAE (``vae.temporal_downsample`` > 1, Wan-VAE's Decoder3d) runs the same levels over every
    frame with causal 3-D convolutions ``vae.conv_frames`` deep, its mid attention within each frame,
    and at each level marked in ``temporal_upsample`` a causal 3x1x1 time convolution to twice the
    channels that doubles the frames after the first (21 latent frames -> 41 -> 81). Decoded
    ``vae.chunk_latent_frames`` at a time, each 3-D convolution first concatenates the previous chunk's
    last ``conv_frames - 1`` frames before its input (Wan-VAE's feat_cache, a copy per call: SGLang PR
    #34125 attributes 0.51 s of a 2.59 s Wan-VAE decode on an H200 to these copies, the convolutions 1.26 s).
    ``eager``: the element-wise kernels the decoder's eager code runs around its convolutions (:class:`VAEEager`).
    """
    f = vae.downsample
    if height <= 0 or width <= 0 or height % f or width % f:
        raise ValueError(f"VAE decode: {height}x{width} px must be a positive multiple of {f}")
    chans = list(reversed(vae.block_out_channels))
    lat = height // f * (width // f)
    t = 1 + ((frames or 1) - 1) // vae.temporal_downsample if vae.video else 1
    depth = vae.conv_frames
    chunk = vae.chunk_latent_frames if vae.video else None
    # cached frames over a chunk's own: 2 per latent frame at the lowest level, fewer once time is upsampled
    cat = lambda: (depth - 1) / chunk if chunk else 0.0  # noqa: E731 - read as the level's chunk changes
    px = batch * t * lat
    ops: list[Op] = []
    if vae.quant_conv:
        ops.append(_conv("post_quant_conv", px, vae.latent_channels, vae.latent_channels, 1, dtype))
    ops += _cached_conv("conv_in", px, vae.latent_channels, chans[0], dtype, depth, cat(), eager)
    c = chans[0]
    ops += _resnet("mid.res0.", px, c, c, dtype, depth, cat(), eager)
    if vae.mid_attention:
        ops += [_eltwise("mid.attn_norm", px * c, px * c, 5, dtype),
                _linear("mid.attn_qkv", px, 3 * c, c, dtype),
                _attention("mid.attn", batch * t, 1, lat, lat, c, dtype),
                _linear("mid.attn_out", px, c, c, dtype),
                _eltwise("mid.attn_residual", 2 * px * c, px * c, 1, dtype)]
    ops += _resnet("mid.res1.", px, c, c, dtype, depth, cat(), eager)
    for level, cout in enumerate(chans):
        for j in range(vae.layers_per_block + 1):
            ops += _resnet(f"up{level}.res{j}.", px, c, cout, dtype, depth, cat(), eager)
            c = cout
        if level < len(chans) - 1:
            if vae.temporal_upsample and vae.temporal_upsample[level]:
                ops += _cached_conv(f"up{level}.time_conv", px, c, 2 * c, dtype, depth, cat(), eager, ksize=1)
                if eager is not None:
                    ops.append(_passes(f"up{level}.time_interleave", px * 2 * c, eager.time_interleave_passes, dtype))
                px = px // t * (2 * t - 1)
                t = 2 * t - 1
                chunk = chunk and 2 * chunk
            up = c // 2 if vae.upsample_halves else c
            ops += _upsample(f"up{level}.", px, c, up, dtype, eager)
            px *= 4
            c = up
    ops += [_norm_silu("norm_out_silu", px * c, dtype, eager),
            *_cached_conv("conv_out", px, c, vae.out_channels, dtype, depth, cat(), eager)]
    return ops


def vae_decode_flops(height: int, width: int, batch: int = 1, vae: VAEArch = SD_VAE) -> float:
    """FLOPs of one VAE decode at ``height`` x ``width`` pixels."""
    return total_flops(vae_decode_ops(height, width, "bf16", batch, vae))


def vae_decoder_params(vae: VAEArch = SD_VAE) -> float:
    """Decoder parameters derived from the structure (conv and attention weights)."""
    ops = vae_decode_ops(vae.downsample, vae.downsample, "bf16", 1, vae)
    return float(sum(op.gemm[1] * op.gemm[2] for op in ops if op.gemm))
