"""The shapes of diffusion transformers, their text encoders and VAE decoders, read from the catalog.

Plain frozen dataclasses built by ``from_dict`` from a ``dits.yaml`` entry; a missing or bad
field raises ValueError naming it. The cost model (``simulator.workloads.dit``) turns these
shapes into operators.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

_TEXT_MODES = ("cross", "joint", "class")
_CONTEXT_EMBEDDERS = ("mlp", "linear", "none")
_MODULATIONS = ("single", "per_block")
BLOCK_KINDS = ("cross", "self", "joint", "single")
"""cross: PixArt (self-attn + cross-attn to text); self: class-conditioned DiT;
joint: MMDiT double-stream (SD3, FLUX double); single: FLUX single-stream (parallel attn + MLP)."""

_COMMON_KEYS = frozenset({"name", "kind", "params", "sources"})
_TEXT_ENCODER_KEYS = _COMMON_KEYS | {"layers", "hidden", "heads", "head_dim", "ffn", "ffn_kind", "vocab", "tokens"}
_VAE_KEYS = _COMMON_KEYS | {"block_out_channels", "downsample", "latent_channels", "layers_per_block",
                            "mid_attention", "out_channels", "quant_conv"}
_DIT_KEYS = _COMMON_KEYS | {"blocks", "double_blocks", "single_blocks", "caption_channels", "context_embedder",
                            "context_pre_only_last", "guidance_embed", "hidden", "heads", "head_dim",
                            "latent_channels", "mlp_ratio", "modulation", "num_classes", "out_channels",
                            "patch_size", "pooled_text_dim", "qk_norm", "rope", "text_encoders", "text_mode",
                            "text_tokens", "vae", "vae_downsample"}

TIME_FREQ_DIM = 256  # sinusoidal timestep features fed to every model's timestep MLP


# ---- architectures ------------------------------------------------------------------------

MAX_DIM = 1 << 24
"""Largest count or width a shape field may hold (a typo beyond it would overflow the cost model)."""


class ArchError(ValueError):
    """A bad shape field; ``key`` is the field's name inside the entry, for the error's key path."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def _req(d: Mapping, key: str, what: str):
    if key not in d or d[key] is None:
        raise ArchError(f"{what}: missing required field {key!r}", key)
    return d[key]


def _known(d: Mapping, allowed: frozenset, what: str) -> None:
    """Unknown fields are errors (``num_layers: 0`` must not be silently ignored)."""
    import difflib
    for key in d:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ArchError(f"{what}: unknown key {str(key)[:60]!r}{hint}", str(key)[:60])


def _pos_int(d: Mapping, key: str, what: str, default: int | None = None, zero_ok=False) -> int:
    v = d.get(key, default) if default is not None else _req(d, key, what)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise ArchError(f"{what}: {key!r} must be an integer, got {str(v)[:40]}", key)
    if int(v) < 0 or (int(v) == 0 and not zero_ok):
        raise ArchError(f"{what}: {key!r} must be {'>= 0' if zero_ok else '> 0'}, got {v!r}", key)
    if int(v) > MAX_DIM:
        raise ArchError(f"{what}: {key!r} must be at most {MAX_DIM:,}, got {v:g}", key)
    return int(v)


def _pos_float(d: Mapping, key: str, what: str) -> float:
    v = _req(d, key, what)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ArchError(f"{what}: {key!r} must be a number, got {str(v)[:40]}", key)
    f = float(v)
    if not 0 < f <= 1e15:
        raise ArchError(f"{what}: {key!r} must be > 0 and at most 1e15, got {v!r}", key)
    return f


def _choice(d: Mapping, key: str, what: str, options: tuple[str, ...], default=None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or v not in options:
        raise ArchError(f"{what}: {key!r} must be one of {options}, got {str(v)[:40]!r}", key)
    return v


def _flag(d: Mapping, key: str, what: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ArchError(f"{what}: {key!r} must be true or false, got {str(v)[:40]}", key)
    return v


def _sources(d: Mapping, what: str) -> dict:
    s = d.get("sources", {})
    if not isinstance(s, Mapping):
        raise ArchError(f"{what}: 'sources' must be a mapping of field -> text", "sources")
    return dict(s)


@dataclass(frozen=True)
class TextEncoderArch:
    """A transformer text encoder (T5 encoder or CLIP text tower) run over ``tokens`` tokens."""

    name: str
    layers: int
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    ffn_kind: str  # "gated_gelu" (T5: two input projections) or "gelu" (CLIP)
    vocab: int
    tokens: int
    params: float
    sources: Mapping = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_dict(cls, d: Mapping, name: str | None = None) -> TextEncoderArch:
        """Build and validate from a catalog entry; raise ValueError naming the bad field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"text encoder: expected a mapping, got {type(d).__name__}")
        name = name or d.get("name") or "text_encoder"
        what = f"text encoder {name!r}"
        _known(d, _TEXT_ENCODER_KEYS, what)
        return cls(
            name=name,
            layers=_pos_int(d, "layers", what), hidden=_pos_int(d, "hidden", what),
            heads=_pos_int(d, "heads", what), head_dim=_pos_int(d, "head_dim", what),
            ffn=_pos_int(d, "ffn", what),
            ffn_kind=_choice(d, "ffn_kind", what, ("gated_gelu", "gelu")),
            vocab=_pos_int(d, "vocab", what), tokens=_pos_int(d, "tokens", what),
            params=_pos_float(d, "params", what), sources=_sources(d, what),
        )


@dataclass(frozen=True)
class VAEArch:
    """An AutoencoderKL decoder: channels per resolution level, resnets per level, mid attention."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 4
    out_channels: int = 3
    downsample: int = 8
    mid_attention: bool = True
    quant_conv: bool = True
    params: float = 83.7e6
    name: str = "sd-vae"
    sources: Mapping = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_dict(cls, d: Mapping, name: str | None = None) -> VAEArch:
        """Build and validate from a catalog entry; raise ValueError naming the bad field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"vae: expected a mapping, got {type(d).__name__}")
        name = name or d.get("name") or "vae"
        what = f"vae {name!r}"
        _known(d, _VAE_KEYS, what)
        chans = _req(d, "block_out_channels", what)
        if (not isinstance(chans, (list, tuple)) or not chans
                or not all(isinstance(c, int) and c > 0 for c in chans)):
            raise ValueError(f"{what}: 'block_out_channels' must be a list of positive ints")
        down = _pos_int(d, "downsample", what)
        if down != 2 ** (len(chans) - 1):
            raise ValueError(f"{what}: downsample {down} does not match {len(chans)} levels "
                             f"(expected {2 ** (len(chans) - 1)})")
        return cls(
            block_out_channels=tuple(chans),
            layers_per_block=_pos_int(d, "layers_per_block", what),
            latent_channels=_pos_int(d, "latent_channels", what),
            out_channels=_pos_int(d, "out_channels", what, default=3),
            downsample=down,
            mid_attention=d.get("mid_attention", True) is True,
            quant_conv=_flag(d, "quant_conv", what),
            params=_pos_float(d, "params", what), name=name, sources=_sources(d, what),
        )


SD_VAE = VAEArch()
"""The 4-channel Stable Diffusion AutoencoderKL (sd-vae-ft-ema), the reference's VAE."""


@dataclass(frozen=True)
class DiTArch:
    """Shape of a diffusion transformer, its text encoders and VAE (a validated catalog entry)."""

    name: str
    segments: tuple[tuple[str, int], ...]  # (block kind, count) in execution order
    hidden: int
    heads: int
    head_dim: int
    mlp_ratio: float
    patch_size: int
    latent_channels: int
    out_channels: int
    vae_downsample: int
    text_mode: str
    text_tokens: int
    params: float
    caption_channels: int = 0
    context_embedder: str = "none"
    modulation: str = "per_block"
    pooled_text_dim: int = 0
    guidance_embed: bool = False
    qk_norm: bool = False
    rope: bool = False
    context_pre_only_last: bool = False
    num_classes: int = 0
    text_encoders: tuple[TextEncoderArch, ...] = ()
    vae: VAEArch = SD_VAE
    sources: Mapping = field(default_factory=dict, compare=False, hash=False)

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
    def from_dict(cls, d: Mapping, name: str | None = None) -> DiTArch:
        """Build and validate from a ``dits.yaml`` entry; raise ValueError naming the bad field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"DiT: expected a mapping, got {type(d).__name__}")
        name = name or d.get("name") or "dit"
        what = f"DiT {name!r}"
        if d.get("kind", "dit") != "dit":
            raise ValueError(f"{what}: kind is {d.get('kind')!r}, not 'dit'")
        _known(d, _DIT_KEYS, what)
        text_mode = _choice(d, "text_mode", what, _TEXT_MODES)
        if text_mode == "joint" and "double_blocks" in d:
            segments = (("joint", _pos_int(d, "double_blocks", what)),
                        ("single", _pos_int(d, "single_blocks", what, default=0, zero_ok=True)))
            segments = tuple(s for s in segments if s[1] > 0)
        else:
            if "double_blocks" in d or "single_blocks" in d:
                raise ValueError(f"{what}: double_blocks/single_blocks need text_mode 'joint'")
            kind = {"cross": "cross", "joint": "joint", "class": "self"}[text_mode]
            segments = ((kind, _pos_int(d, "blocks", what)),)
        hidden, heads = _pos_int(d, "hidden", what), _pos_int(d, "heads", what)
        head_dim = _pos_int(d, "head_dim", what)
        if heads * head_dim != hidden:
            # every DiT in the catalog (PixArt, SD3, FLUX, DiT) attends at its full width
            raise ArchError(f"{what}: heads x head_dim = {heads} x {head_dim} = {heads * head_dim} must equal "
                            f"hidden ({hidden})", "heads")
        text_tokens = _pos_int(d, "text_tokens", what, default=0, zero_ok=True)
        if text_mode != "class" and text_tokens == 0:
            raise ValueError(f"{what}: text_mode {text_mode!r} needs text_tokens > 0")
        encoders = d.get("text_encoders", []) or []
        if not isinstance(encoders, (list, tuple)):
            raise ValueError(f"{what}: 'text_encoders' must be a list")
        vae = d.get("vae")
        mlp_ratio = _pos_float(d, "mlp_ratio", what)
        ctx = _choice(d, "context_embedder", what, _CONTEXT_EMBEDDERS,
                      default="none" if text_mode == "class" else None)
        return cls(
            name=name, segments=segments, hidden=hidden, heads=heads, head_dim=head_dim,
            mlp_ratio=mlp_ratio,
            patch_size=_pos_int(d, "patch_size", what),
            latent_channels=_pos_int(d, "latent_channels", what),
            out_channels=_pos_int(d, "out_channels", what,
                                  default=int(d.get("latent_channels", 1) or 1)),
            vae_downsample=_pos_int(d, "vae_downsample", what, default=8),
            text_mode=text_mode, text_tokens=text_tokens,
            params=_pos_float(d, "params", what),
            caption_channels=_pos_int(d, "caption_channels", what, default=0, zero_ok=True),
            context_embedder=ctx,
            modulation=_choice(d, "modulation", what, _MODULATIONS, default="per_block"),
            pooled_text_dim=_pos_int(d, "pooled_text_dim", what, default=0, zero_ok=True),
            guidance_embed=_flag(d, "guidance_embed", what),
            qk_norm=_flag(d, "qk_norm", what), rope=_flag(d, "rope", what),
            context_pre_only_last=_flag(d, "context_pre_only_last", what),
            num_classes=_pos_int(d, "num_classes", what, default=0, zero_ok=True),
            text_encoders=tuple(TextEncoderArch.from_dict(e, e.get("name") if isinstance(e, Mapping)
                                                          else None) for e in encoders),
            vae=SD_VAE if vae is None else VAEArch.from_dict(vae),
            sources=_sources(d, what),
        )


# ---- op builders ---------------------------------------------------------------------------
