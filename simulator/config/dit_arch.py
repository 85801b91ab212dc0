"""The shapes of diffusion transformers, their text encoders and VAE decoders, read from the catalog.

Frozen pydantic models of a ``dits.yaml`` entry (the same validation as every other catalog
model): unknown keys, missing fields, out-of-range or mistyped values raise :class:`ArchError`
naming the field, with a did-you-mean for a misspelt key. The cost model
(``simulator.workloads.dit``) turns these shapes into operators.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from .quantities import NO_BOOL, Count, Number

BLOCK_KINDS = ("cross", "self", "joint", "single")
"""cross: PixArt (self-attn + cross-attn to text); self: class-conditioned DiT;
joint: MMDiT double-stream (SD3, FLUX double); single: FLUX single-stream (parallel attn + MLP)."""

TIME_FREQ_DIM = 256  # sinusoidal timestep features fed to every model's timestep MLP

MAX_DIM = 1 << 24
"""Largest count or width a shape field may hold (a typo beyond it would overflow the cost model)."""

MAX_PARAMS = 1e15
"""Largest parameter count (today's largest models hold ~2e12)."""

Dim = Count(MAX_DIM)
"""A positive width or count, at most ``MAX_DIM``."""
Dim0 = Annotated[int, NO_BOOL, Field(ge=0, le=MAX_DIM)]
"""A width or count that may be 0 (the feature is absent)."""
Params = Annotated[Number, Field(gt=0, le=MAX_PARAMS)]
Flag = Annotated[bool, Field(strict=True)]
"""true or false only (not "yes", not 1)."""


class ArchError(ValueError):
    """A bad shape field; ``key`` is the field's path inside the entry, for the error's key path."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class _Shape(BaseModel):
    """A catalog shape: unknown keys are errors, values immutable once read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def _validate(cls, d: Any, name: str | None, what: str, default_name: str):
        """Validate a catalog entry; raise ArchError naming the bad field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{what}: expected a mapping, got {type(d).__name__}")
        name = name or d.get("name") or default_name
        label = f"{what} {name!r}"
        try:
            return cls.model_validate({**d, "name": name})
        except ValidationError as exc:
            raise _arch_error(exc, cls, label) from None


def _arch_error(exc: ValidationError, model: type[BaseModel], label: str) -> ArchError:
    """One-line error from pydantic's first (an unknown key's first of all) error."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "lax-")))]
    key = ".".join(str(p) for p in loc)
    field = str(loc[-1])[:60] if loc else ""
    if err["type"] == "extra_forbidden":
        options = sorted(model.model_fields) if len(loc) == 1 else []
        close = difflib.get_close_matches(field, options, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return ArchError(f"{label}: unknown key {field!r}{hint}", key[:60])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return ArchError(f"{label}: missing required field {field!r}", key)
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, _FieldError):  # a check across fields names its own field
        return ArchError(f"{label}: {msg}", ".".join(str(p) for p in [*loc, cause.key]))
    return ArchError(f"{label}: {field!r}: {msg} (got {str(err.get('input'))[:40]})", key)


class _FieldError(ValueError):
    """A cross-field check's failure, attributed to ``key``."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class TextEncoderArch(_Shape):
    """A transformer text encoder (T5 encoder or CLIP text tower) run over ``tokens`` tokens."""

    name: str = "text_encoder"
    kind: Optional[str] = None
    layers: Dim
    hidden: Dim
    heads: Dim
    head_dim: Dim
    kv_heads: Optional[Dim] = None           # grouped-query attention (an LLM as encoder): default heads
    ffn: Dim
    ffn_kind: Literal["gated_gelu", "gelu"]  # T5: two input projections; CLIP: one
    vocab: Dim
    tokens: Dim
    params: Params
    sources: dict[str, Any] = {}

    @property
    def kv_inner(self) -> int:
        """Width of the K and V projections: kv_heads x head_dim."""
        return (self.kv_heads or self.heads) * self.head_dim

    @classmethod
    def from_dict(cls, d: Mapping, name: str | None = None) -> "TextEncoderArch":
        """Build and validate from a catalog entry; raise ValueError naming the bad field."""
        return cls._validate(d, name, "text encoder", "text_encoder")


class VAEArch(_Shape):
    """An AutoencoderKL decoder: channels per resolution level, resnets per level, mid attention."""

    name: str = "vae"
    kind: Optional[str] = None
    block_out_channels: Annotated[tuple[Dim, ...], Field(min_length=1)]
    layers_per_block: Dim
    latent_channels: Dim
    out_channels: Dim = 3
    downsample: Dim
    mid_attention: Flag = True
    quant_conv: Flag = False
    # a video VAE: time compressed temporal_downsample-fold (the first frame alone), undone by the up
    # levels marked in temporal_upsample (each doubles the frames after the first), with causal 3-D
    # convolutions conv_frames deep; decoded one latent frame at a time with a cache of the previous
    # frames' features (Wan-VAE's feat_cache), so the workspace holds one chunk's frames
    temporal_downsample: Dim = 1
    temporal_upsample: tuple[Flag, ...] = ()
    conv_frames: Dim = 1
    chunk_latent_frames: Optional[Dim] = None  # latent frames a decoder call takes (None: the whole video)
    # each up level's 2-D upsample convolution halves the channels, so the next level's first resnet takes half
    # (Wan-VAE's Resample: Conv2d(dim, dim // 2)); AutoencoderKL's Upsample2D keeps them
    upsample_halves: Flag = False
    # the published eager code whose element-wise kernels around the convolutions the decoder runs
    # (kernels.yaml vae_eager); None: one fused norm and activation per resnet, as a compiled decoder would
    eager_code: Optional[Literal["wan"]] = None
    params: Params
    sources: dict[str, Any] = {}

    @model_validator(mode="after")
    def _levels(self):
        levels = len(self.block_out_channels)
        if self.downsample != 2 ** (levels - 1):
            raise _FieldError(f"downsample {self.downsample} does not match {levels} levels "
                              f"(expected {2 ** (levels - 1)})", "downsample")
        ups = sum(self.temporal_upsample)
        if 2 ** ups != self.temporal_downsample or len(self.temporal_upsample) not in (0, levels - 1):
            raise _FieldError(f"temporal_upsample {list(self.temporal_upsample)} must mark {levels - 1} up "
                              f"levels, log2({self.temporal_downsample}) of them true", "temporal_upsample")
        return self

    @property
    def video(self) -> bool:
        """Whether the VAE compresses time (a video model's)."""
        return self.temporal_downsample > 1

    @classmethod
    def from_dict(cls, d: Mapping, name: str | None = None) -> "VAEArch":
        """Build and validate from a catalog entry; raise ValueError naming the bad field."""
        return cls._validate(d, name, "vae", "vae")


SD_VAE = VAEArch(name="sd-vae", block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                 latent_channels=4, out_channels=3, downsample=8, mid_attention=True, quant_conv=True,
                 params=83.7e6)
"""The 4-channel Stable Diffusion AutoencoderKL (sd-vae-ft-ema), the reference's VAE."""


class DiTArch(_Shape):
    """Shape of a diffusion transformer, its text encoders and VAE (a validated catalog entry)."""

    name: str = "dit"
    kind: Literal["dit"] = "dit"
    text_mode: Literal["cross", "joint", "class"]
    blocks: Optional[Dim] = None            # cross / class / joint without double_blocks
    double_blocks: Optional[Dim] = None     # joint only (MMDiT double-stream)
    single_blocks: Optional[Dim0] = None    # joint only, after the double ones (FLUX)
    hidden: Dim
    heads: Dim
    head_dim: Dim
    mlp_ratio: Annotated[Number, Field(gt=0, le=MAX_PARAMS)]
    patch_size: Dim
    patch_frames: Dim = 1                   # a video DiT's temporal patch (Wan, HunyuanVideo: 1)
    experts: Dim = 1                        # denoising experts of one shape, one per step, all held (Wan 2.2: 2)
    latent_channels: Dim
    out_channels: Optional[Dim] = None      # default: latent_channels
    vae_downsample: Dim = 8
    text_tokens: Dim0 = 0
    params: Params
    caption_channels: Dim0 = 0
    context_embedder: Optional[Literal["mlp", "linear", "none"]] = None  # default "none" for class
    modulation: Literal["single", "per_block"] = "per_block"
    pooled_text_dim: Dim0 = 0
    guidance_embed: Flag = False
    qk_norm: Flag = False
    rope: Flag = False
    # the published eager code whose element-wise passes (FP32 rotary embedding, q/k norms) a block runs
    eager_code: Literal["diffusers", "wan", "hunyuanvideo"] = "diffusers"
    context_pre_only_last: Flag = False
    num_classes: Dim0 = 0
    text_encoders: tuple[TextEncoderArch, ...] = ()
    vae: VAEArch = SD_VAE
    sources: dict[str, Any] = {}
    _segments: tuple = PrivateAttr(())

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, d: Any) -> Any:
        """Defaults that depend on other fields: out_channels, a class model's context embedder."""
        if not isinstance(d, Mapping):
            return d
        d = dict(d)
        if d.get("out_channels") is None:
            d["out_channels"] = d.get("latent_channels")
        if d.get("context_embedder") is None and d.get("text_mode") == "class":
            d["context_embedder"] = "none"
        if d.get("text_encoders") is None:
            d.pop("text_encoders", None)
        if d.get("vae") is None:
            d.pop("vae", None)
        return d

    @model_validator(mode="after")
    def _check(self):
        if self.context_embedder is None:
            raise _FieldError("missing required field 'context_embedder'", "context_embedder")
        if self.heads * self.head_dim != self.hidden:
            # every DiT in the catalog (PixArt, SD3, FLUX, DiT) attends at its full width
            raise _FieldError(f"heads x head_dim = {self.heads} x {self.head_dim} = "
                              f"{self.heads * self.head_dim} must equal hidden ({self.hidden})", "heads")
        if self.text_mode != "class" and self.text_tokens == 0:
            raise _FieldError(f"text_mode {self.text_mode!r} needs text_tokens > 0", "text_tokens")
        self._segments = self._block_segments()
        return self

    def _block_segments(self) -> tuple[tuple[str, int], ...]:
        if self.text_mode == "joint" and self.double_blocks is not None:
            segments = (("joint", self.double_blocks), ("single", self.single_blocks or 0))
            return tuple(s for s in segments if s[1] > 0)
        if self.double_blocks is not None or self.single_blocks is not None:
            raise _FieldError("double_blocks/single_blocks need text_mode 'joint'", "double_blocks")
        if self.blocks is None:
            raise _FieldError("missing required field 'blocks'", "blocks")
        return (({"cross": "cross", "joint": "joint", "class": "self"}[self.text_mode], self.blocks),)

    @property
    def segments(self) -> tuple[tuple[str, int], ...]:
        """(block kind, count) in execution order."""
        return self._segments

    @property
    def num_layers(self) -> int:
        """Transformer blocks in one forward pass (FLUX: 19 double + 38 single = 57)."""
        return sum(n for _, n in self.segments)

    @property
    def inner(self) -> int:
        """Attention width, heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def mlp_hidden(self) -> int:
        return int(round(self.hidden * self.mlp_ratio))

    def latent_frames(self, frames: int | None) -> int:
        """Latent frames of ``frames`` output frames: 1 for an image; 1 + (frames - 1) / t for a VAE that
        compresses time t-fold keeping the first frame alone (Wan-VAE, HunyuanVideo's, CogVideoX's)."""
        td = self.vae.temporal_downsample
        return 1 if td == 1 or not frames else 1 + (frames - 1) // td

    def layer_kind(self, index: int) -> str:
        """Block kind of layer ``index`` (0-based, in execution order)."""
        if not 0 <= index < self.num_layers:
            raise ValueError(f"{self.name}: layer {index} out of range [0, {self.num_layers})")
        for kind, n in self.segments:
            if index < n:
                return kind
            index -= n
        raise AssertionError("unreachable")

    @classmethod
    def from_dict(cls, d: Mapping, name: str | None = None) -> "DiTArch":
        """Build and validate from a ``dits.yaml`` entry; raise ValueError naming the bad field."""
        if isinstance(d, Mapping) and d.get("kind", "dit") != "dit":
            raise ArchError(f"DiT {(name or d.get('name') or 'dit')!r}: kind is {d.get('kind')!r}, "
                            "not 'dit'", "kind")
        return cls._validate(d, name, "DiT", "dit")
