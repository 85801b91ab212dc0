"""Typed, validated scenario models of the DiT path (kind ``dit``) and the token pipeline.

Catalog names are resolved to dicts by the loader before validation; the ``model`` dict is
checked here by building the architecture, so a bad catalog entry or override is reported
at ``model``. Impossible parallel layouts raise :class:`ConfigError` with the key path.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from importlib import resources
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError
from .dit_arch import ArchError, DiTArch
from .models import MAX_CONTEXT, LLMSpec, ScenarioBase, Strict, Workload
from .quantities import Count, Fraction, Horizon, Int, Number
from .yamlio import loads_catalog

MAX_FRAMES = 4097
"""Most video frames one request may ask for (published text-to-video runs make 49-129 frames; this
allows minutes at 24 fps)."""

MAX_GPUS = 1 << 16
"""Most GPUs one layout may span (the largest NVLink domains hold 576; clusters 10^5)."""

# ---- image codecs (catalog/image_codecs.yaml) ---------------------------------------------


class CodecCost(Strict):
    """CPU seconds per pixel and output size as a fraction of raw 8-bit RGB."""

    seconds_per_pixel: Number = Field(ge=0)
    size_ratio: Number = Field(gt=0, le=1.5)


class PNGCodec(Strict):
    """PNG cost per zlib compression level (0-9)."""

    levels: dict[int, CodecCost]
    default_level: int = 6
    sources: dict[str, str] = {}


class SimpleCodec(CodecCost):
    sources: dict[str, str] = {}


class ImageCodecs(Strict):
    """The image-encode catalog: PNG per level, JPEG, raw."""

    png: PNGCodec
    jpeg: SimpleCodec
    raw: SimpleCodec

    def cost(self, fmt: str, level: Optional[int]) -> CodecCost:
        """(seconds per pixel, size ratio) of ``fmt`` (png|jpeg|raw) at ``level`` (PNG only)."""
        if fmt == "png":
            lvl = self.png.default_level if level is None else level
            return self.png.levels[lvl]
        return getattr(self, fmt)


@lru_cache(maxsize=None)
def image_codecs() -> ImageCodecs:
    """The shipped image-codec catalog, validated."""
    text = (resources.files("simulator.config") / "catalog" / "image_codecs.yaml").read_text()
    return ImageCodecs.model_validate(loads_catalog(text))


class VideoPreset(Strict):
    """One encoder preset: CPU seconds per pixel on one thread, the most frame threads gain, and the
    output's size relative to the codec's default preset."""

    seconds_per_pixel: Number = Field(gt=0)
    max_speedup: Annotated[Number, Field(ge=1, le=256)]
    size_factor: Annotated[Number, Field(gt=0, le=100)]


class VideoCodec(Strict):
    """An MP4 video encoder (libx264, libx265): its presets and the output's bits per pixel."""

    encoder: str
    default_preset: str
    bits_per_pixel: Annotated[Number, Field(gt=0, le=24)]
    presets: dict[str, VideoPreset]
    sources: dict[str, str] = {}

    def preset(self, name: Optional[str]) -> VideoPreset:
        return self.presets[name or self.default_preset]


@lru_cache(maxsize=None)
def video_codecs() -> dict[str, VideoCodec]:
    """The shipped video-codec catalog (``catalog/video_codecs.yaml``), validated."""
    text = (resources.files("simulator.config") / "catalog" / "video_codecs.yaml").read_text()
    return {k: VideoCodec.model_validate(v) for k, v in loads_catalog(text).items()}


def encode_threads(cores: int, height: int) -> float:
    """Threads x264 starts for a ``height``-pixel video on ``cores`` CPUs: 1.5 per CPU, at most one per two
    16-pixel macroblock rows (x264 encoder/encoder.c: ``i_threads = cpus * 3 / 2``, ``max_threads =
    (i_height + 15) / 16 / 2``)."""
    return max(1.0, min(1.5 * cores, (height + 15) // 16 // 2))


# ---- DiT scenario ----------------------------------------------------------------------------


class DiTParallel(Strict):
    """Parallel degrees in xDiT's terms; their product is the number of GPUs."""

    cfg: Literal[1, 2] = 1
    pipefusion: Count(1024) = 1
    ulysses: Count(1024) = 1
    ring: Count(1024) = 1
    tensor: Count(1024) = 1
    distrifusion: Count(1024) = 1
    patches: Optional[Count(4096)] = None
    warmup_steps: Annotated[Int, Field(ge=0)] = 1
    vae_parallel: bool = False
    # "replicated": every tensor-parallel rank runs the whole cross-attention and only the
    # self-attention and MLP are split (xDiT legacy's DistriDiTTP wraps attn1 and the FFN only)
    tensor_cross_attention: Literal["split", "replicated"] = "split"

    @property
    def gpus(self) -> int:
        return (self.cfg * self.pipefusion * self.ulysses * self.ring * self.tensor
                * self.distrifusion)

    @property
    def splits_cross_attention(self) -> bool:
        """Whether tensor parallelism splits the cross-attention's heads too."""
        return self.tensor_cross_attention == "split"

    @property
    def num_patches(self) -> int:
        """M: given, else the pipeline degree (PipeFusion's usual M = N)."""
        return self.patches if self.patches is not None else self.pipefusion


class Delivery(Strict):
    """What happens after the last denoising step: VAE, encode format, transport."""

    vae: bool = True
    format: Literal["png", "jpeg", "raw", "latent", "mp4"] = "png"
    compress_level: Optional[Annotated[Int, Field(ge=0, le=9)]] = None
    video_codec: Literal["h264", "h265"] = "h264"
    preset: Optional[str] = Field(None, description=(
        "The video encoder's preset (default the codec's: medium, as diffusers' export_to_video runs it)."))
    base64: bool = False
    ipc_hops: Annotated[Int, Field(ge=0, le=8)] = Field(0, description=(
        "Process boundaries the decoded output crosses, pickled, before it is encoded (vLLM-Omni before PR #1715: "
        "2, worker to engine core to API server; diffusers, xDiT, SGLang: 0)."))
    response_header_bytes: Annotated[Number, Field(ge=0, le=1e9)] = 200.0


MAX_BATCH_IMAGES = 256
"""Most requests one denoising pass may hold (published DiT serving batches a few to a few dozen)."""

DIT_POLICIES = ("fifo", "shortest_first")
"""Queue policies of a DiT service (``pipelines.dit.queue.POLICIES`` implements each; a test keeps
the two lists equal)."""


class DiTServing(Strict):
    """How a DiT service takes its requests: the queue's order, how many compatible requests (same
    resolution, frames and steps, at the same step) one denoising pass holds, and whether a waiting
    request the policy ranks first may take the GPUs at a step boundary."""

    policy: Literal[DIT_POLICIES] = Field("fifo", description=(
        "fifo: oldest first; shortest_first: least remaining denoising work first (SRPT, Schrage 1968)."))
    max_batch: Count(MAX_BATCH_IMAGES) = Field(1, description=(
        "Requests in one denoising pass (diffusers pipelines take a list of prompts; each prompt's CFG pair "
        "rides in the same pass)."))
    preempt: bool = Field(False, description=(
        "At each step boundary, requeue the running batch when a waiting request ranks ahead of it (its "
        "latents stay on the GPUs); needs a layout without PipeFusion or DistriFusion, whose pipelines and "
        "stale activations span steps."))


class DiTSLO(Strict):
    """A DiT service's objective: a request is good when it is delivered within ``latency`` of its arrival."""

    latency: Annotated[Number, Field(gt=0, le=1e6)] = Field(..., description="Seconds from arrival to delivery.")


class DiTShape(Strict):
    """One kind of request a DiT service gets: its resolution, step count, frames, and share of requests."""

    resolution: Union[int, str]
    steps: Optional[Count(10_000)] = None
    frames: Optional[Count(MAX_FRAMES)] = None
    weight: Annotated[Number, Field(gt=0, le=1e9)] = 1.0

    _res = field_validator("resolution")(classmethod(lambda cls, v: _resolution(v)))


class DiTWorkload(Workload):
    """A DiT workload: the arrival process, and the requests' shapes (all the scenario's own when
    neither ``shapes`` nor a trace gives them); a trace (``config.dit_trace``) sets both."""

    shapes: Optional[Annotated[list[DiTShape], Field(min_length=1, max_length=64)]] = Field(None, description=(
        "Request shapes {resolution, steps, frames, weight}, drawn per request by weight; steps and frames "
        "default to the scenario's."))

    @model_validator(mode="after")
    def _one_source(self):
        if self.shapes is not None and self.trace:
            raise ConfigError("a DiT trace gives each request's shape: drop workload.shapes or workload.trace",
                              path="workload.shapes")
        return self


class Kernels(Strict):
    """Achievable efficiency of the fused attention kernel, relative to the GEMM figure.

    ``attention_efficiency``: fraction of peak FLOP/s a FlashAttention-2 forward reaches
    (Dao, arXiv 2307.08691: 50-73% of A100 peak; the forward pass reaches the top of the
    range). ``head_dim_multiple``: FlashAttention rounds the head dimension up to a multiple
    of 32 (≤ 128) and runs the padded kernel (flash_api.cpp ``round_multiple(head_size, 32)``),
    so PixArt's 72 runs as 96.
    """

    attention_efficiency: Fraction = 0.73
    head_dim_multiple: Count(1024) = 32
    attention: Literal["flash2", "flash3"] = Field("flash2", description=(
        "The attention kernel: flash2 (the flash-attn package and PyTorch's SDPA flash backend, what diffusers, xDiT "
        "and the Wan and HunyuanVideo repositories call) or flash3 (Hopper only)."))
    vae_layout: Literal["ncdhw", "channels_last_3d"] = Field("ncdhw", description=(
        "The memory format of an eager video VAE's Conv3d weights: ncdhw (PyTorch's default: the Wan and diffusers "
        "code) or channels_last_3d (SGLang-Diffusion's default since its PR #23200), which copies every convolution's "
        "input into that layout and adds its bias in an unvectorised kernel (kernels.yaml vae_eager)."))


def parse_resolution(v) -> tuple[int, int]:
    if isinstance(v, bool):
        raise ValueError(f"resolution must be an integer or 'WIDTHxHEIGHT', got {v!r}")
    if isinstance(v, int):
        return v, v
    if isinstance(v, str):
        parts = v.lower().replace(" ", "").split("x")
        if len(parts) == 1 and parts[0].isdigit():
            return int(parts[0]), int(parts[0])
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
    raise ValueError(f"resolution must be an integer or 'WIDTHxHEIGHT', got {v!r}")


def _resolution(v):
    """A resolution as given (an int or 'WxH') whose sides are within bounds."""
    w, h = parse_resolution(v)
    if not (0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE):
        raise ValueError(f"each side must be between 1 and {MAX_SIDE} px, got {v!r}")
    return v


def _dit_arch(model: dict):
    try:
        return DiTArch.from_dict(model, model.get("name"))
    except ArchError as exc:
        raise ConfigError(str(exc), path=f"model.{exc.key}" if exc.key else "model") from None
    except ValueError as exc:
        raise ConfigError(str(exc), path="model") from None


class DiTScenario(ScenarioBase):
    """A complete DiT-inference scenario: model, image, steps, parallel layout, last mile."""

    kind: Literal["dit"] = "dit"
    name: str = "dit-scenario"
    model: dict
    resolution: Union[int, str] = 1024
    steps: Count(10_000) = 20
    cfg: bool = True
    text_encode: bool = True
    gpus: Optional[Count(MAX_GPUS)] = None
    parallel: DiTParallel = DiTParallel()
    delivery: Delivery = Delivery()
    kernels: Kernels = Kernels()
    frames: Optional[Count(MAX_FRAMES)] = Field(None, description=(
        "Frames of a video model's output (a temporal VAE's 1 + k x compression: Wan's 81 = 1 + 20 x 4)."))
    serving: DiTServing = DiTServing()
    slo: Optional[DiTSLO] = None
    workload: DiTWorkload = DiTWorkload(requests=4, arrival="closed", concurrency=1)
    max_sim_time: Optional[Horizon] = None

    _res = field_validator("resolution")(classmethod(lambda cls, v: _resolution(v)))

    def check_trace(self) -> None:
        """The loader's check of ``workload.trace``: a DiT request trace, each shape against the model and layout."""
        from .dit_trace import check_dit_trace

        arch, p = _dit_arch(self.model), self.parallel
        check_dit_trace(self, lambda w, h, steps, frames: _check_shape(arch, p, w, h, steps, frames, _OWN_SHAPE))

    @property
    def width(self) -> int:
        return parse_resolution(self.resolution)[0]

    @property
    def height(self) -> int:
        return parse_resolution(self.resolution)[1]

    @property
    def arch(self):
        """The validated :class:`~simulator.workloads.dit.DiTArch` of ``model``."""
        return _dit_arch(self.model)

    @property
    def n_gpus(self) -> int:
        return self.parallel.gpus

    @property
    def batch(self) -> int:
        """Images in one forward per GPU: 2 with CFG, unless CFG is split across GPUs."""
        return 2 if self.cfg and self.parallel.cfg == 1 else 1

    @model_validator(mode="after")
    def _check(self):
        arch = _dit_arch(self.model)
        p = self.parallel
        _check_dit_workload(self.workload)
        if self.gpus is not None and self.gpus != p.gpus:
            raise ConfigError(
                f"gpus is {self.gpus} but the parallel degrees multiply to {p.gpus} "
                f"(cfg {p.cfg} x pipefusion {p.pipefusion} x ulysses {p.ulysses} x ring {p.ring}"
                f" x tensor {p.tensor} x distrifusion {p.distrifusion})", path="gpus")
        _check_nodes(p.gpus, self.hardware)
        if p.cfg == 2 and not self.cfg:
            raise ConfigError("parallel.cfg 2 splits the two CFG branches; it needs cfg: true",
                              path="parallel.cfg")
        if arch.heads % p.ulysses:
            raise ConfigError(f"ulysses degree {p.ulysses} does not divide the model's "
                              f"{arch.heads} heads", path="parallel.ulysses")
        if arch.heads % (p.tensor * p.ulysses):
            raise ConfigError(f"tensor x ulysses ({p.tensor * p.ulysses}) does not divide the "
                              f"model's {arch.heads} heads", path="parallel.tensor")
        if p.pipefusion > arch.num_layers:
            raise ConfigError(f"pipefusion degree {p.pipefusion} exceeds the model's "
                              f"{arch.num_layers} layers", path="parallel.pipefusion")
        if p.patches is not None and p.pipefusion == 1 and p.patches != 1:
            raise ConfigError("parallel.patches needs parallel.pipefusion > 1",
                              path="parallel.patches")
        _check_shape(arch, p, self.width, self.height, self.steps, self.frames, _OWN_SHAPE)
        for i, shape in enumerate(self.workload.shapes or ()):
            w, h = parse_resolution(shape.resolution)
            at = {k: f"workload.shapes.{i}.{k}" for k in ("resolution", "steps", "frames")}
            _check_shape(arch, p, w, h, shape.steps or self.steps, shape.frames or self.frames,
                         {**at, "parallel.patches": at["resolution"], "parallel": at["resolution"],
                          "parallel.warmup_steps": at["steps"]})
        s = self.serving
        if s.preempt and (p.pipefusion > 1 or p.distrifusion > 1):
            raise ConfigError("serving.preempt needs a layout without pipefusion or distrifusion (their "
                              "pipelines and stale activations span steps)", path="serving.preempt")
        if p.distrifusion > 1 and p.gpus != p.distrifusion * p.cfg:
            raise ConfigError("distrifusion combines only with cfg parallelism",
                              path="parallel.distrifusion")
        if self.delivery.format == "latent" and self.delivery.vae:
            raise ConfigError("delivery.format latent sends the latent: set delivery.vae false",
                              path="delivery.format")
        if self.delivery.format != "latent" and not self.delivery.vae:
            raise ConfigError(f"delivery.format {self.delivery.format} needs the decoded image: "
                              "set delivery.vae true or format latent", path="delivery.vae")
        if self.delivery.compress_level is not None and self.delivery.format != "png":
            raise ConfigError("compress_level applies to png only", path="delivery.compress_level")
        _check_video_delivery(arch, self.delivery)
        if self.kernels.attention == "flash3" and self.hardware.gpu.arch != "hopper":
            raise ConfigError(f"FlashAttention-3 runs on Hopper GPUs only; the {self.hardware.gpu.name} is "
                              f"{self.hardware.gpu.arch}: use flash2", path="kernels.attention")
        return self


# ---- token pipeline ------------------------------------------------------------------------


MAX_SLICES = 4096
"""Most token slices (TeraPipe's largest configurations use a few hundred; the balanced
slicing programme grows with the square of the count)."""


class TokenPipelineParallel(Strict):
    pp: Count(1024) = 4


class TokenPipelineScenario(ScenarioBase):
    """One long sequence pushed through ``parallel.pp`` stages in ``slices`` token slices.

    ``model`` is an LLM (causal: slice i attends to every earlier token) or a DiT
    (bidirectional with stale K/V: every slice attends to all tokens).
    """

    kind: Literal["token_pipeline"] = "token_pipeline"
    name: str = "token-pipeline"
    model: dict
    sequence_tokens: Count(MAX_CONTEXT) = 8192
    parallel: TokenPipelineParallel = TokenPipelineParallel()
    slices: Count(MAX_SLICES) = 8
    slicing: Literal["uniform", "balanced"] = "uniform"

    @property
    def is_dit(self) -> bool:
        return self.model.get("kind") == "dit"

    @property
    def arch(self):
        """DiTArch for a DiT model, LLMSpec for an LLM."""
        if self.is_dit:
            return _dit_arch(self.model)
        try:
            return LLMSpec.model_validate({k: v for k, v in self.model.items() if k != "kind"})
        except ValidationError as exc:  # one line at the model's own key
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "constrained-")))
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, list(LLMSpec.model_fields), n=1, cutoff=0.6)
                msg = f"unknown key {key[:60]!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            else:
                msg = err["msg"].removeprefix("Value error, ")
            raise ConfigError(msg, path=f"model.{key}" if key else "model") from None

    @model_validator(mode="after")
    def _check(self):
        arch = self.arch
        layers = arch.num_layers if self.is_dit else arch.layers
        if self.parallel.pp > layers:
            raise ConfigError(f"pp {self.parallel.pp} exceeds the model's {layers} layers",
                              path="parallel.pp")
        if self.slices > self.sequence_tokens:
            raise ConfigError(f"{self.slices} slices exceed {self.sequence_tokens} tokens",
                              path="slices")
        _check_nodes(self.parallel.pp, self.hardware)
        if self.parallel.pp > 1 and self.hardware.gpu_link is None and self.hardware.host_link is None:
            raise ConfigError("pp > 1 needs a GPU or host link", path="hardware")
        return self


MAX_SIDE = 16_384
"""Largest image side in pixels (published DiT outputs reach 8K; PixArt-Sigma's 4K is common)."""

MAX_IMAGES = 100_000
MAX_IMAGES_IN_FLIGHT = 10_000


_OWN_SHAPE = {k: k for k in ("resolution", "steps", "frames", "parallel.patches", "parallel",
                              "parallel.warmup_steps")}
"""Where a shape error points for the scenario's own shape (a workload shape maps these keys to its entry)."""


def _check_shape(arch, p, width: int, height: int, steps: int, frames, at: dict) -> None:
    """One request shape against the model and the layout; ``at`` maps each key to its path."""
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise ConfigError(f"each side must be between 1 and {MAX_SIDE} px, got {width}x{height}",
                          path=at["resolution"])
    cell = arch.vae_downsample * arch.patch_size
    if width % cell or height % cell:
        raise ConfigError(f"resolution {width}x{height} must be a multiple of "
                          f"{cell} px (VAE {arch.vae_downsample}x, patch {arch.patch_size})",
                          path=at["resolution"])
    td = arch.vae.temporal_downsample
    if td > 1 and frames is None:
        raise ConfigError(f"{arch.name} makes video: set frames (1 + k x {td}, e.g. {1 + 20 * td})",
                          path=at["frames"])
    if td == 1 and frames not in (None, 1):
        raise ConfigError(f"{arch.name} makes images (its VAE has no temporal compression): drop frames",
                          path=at["frames"])
    if td > 1 and (frames - 1) % td:
        raise ConfigError(f"frames {frames} must be 1 + k x {td} (the VAE compresses time {td}x, its first "
                          f"frame alone): e.g. {1 + (frames - 1) // td * td} or {1 + ((frames - 1) // td + 1) * td}",
                          path=at["frames"])
    lf = arch.latent_frames(frames)
    if lf % arch.patch_frames:
        raise ConfigError(f"{lf} latent frames do not split into patches of {arch.patch_frames} frames",
                          path=at["frames"])
    rows = lf // arch.patch_frames * (height // cell)
    tokens = rows * (width // cell)
    m = p.num_patches
    if p.pipefusion > 1 and (m > rows or rows % m):
        raise ConfigError(f"{m} patches do not fit the latent height: {rows} token rows "
                          f"at {height} px must split evenly", path=at["parallel.patches"])
    sp = p.ulysses * p.ring * p.distrifusion
    if tokens % sp:
        raise ConfigError(f"{tokens} image tokens do not split over ulysses x ring x "
                          f"distrifusion = {sp}", path=at["parallel"])
    if p.warmup_steps > steps:
        raise ConfigError(f"warmup_steps {p.warmup_steps} exceeds steps {steps}",
                          path=at["parallel.warmup_steps"])


def _check_video_delivery(arch, d) -> None:
    """A video model sends mp4 (or raw frames, or the latent); an image model never sends mp4."""
    if arch.vae.video and d.format in ("png", "jpeg"):
        raise ConfigError(f"{arch.name} makes video: deliver mp4 (or raw, or latent), not {d.format}",
                          path="delivery.format")
    if not arch.vae.video and d.format == "mp4":
        raise ConfigError(f"{arch.name} makes images: deliver png, jpeg, raw or latent", path="delivery.format")
    if d.preset is not None:
        presets = video_codecs()[d.video_codec].presets
        if d.format != "mp4":
            raise ConfigError("delivery.preset applies to mp4 only", path="delivery.preset")
        if d.preset not in presets:
            close = difflib.get_close_matches(d.preset, list(presets), n=1)
            raise ConfigError(f"unknown {d.video_codec} preset {d.preset[:40]!r}"
                              + (f" (did you mean {close[0]!r}?)" if close else f"; one of {', '.join(presets)}"),
                              path="delivery.preset")


def _check_dit_workload(w) -> None:
    """Image counts no real DiT service reaches in one simulated run."""
    if w.requests > MAX_IMAGES:
        raise ConfigError(f"must be at most {MAX_IMAGES:,} images, got {w.requests:,}", path="workload.requests")
    if w.concurrency is not None and w.concurrency > MAX_IMAGES_IN_FLIGHT:
        raise ConfigError(f"must be at most {MAX_IMAGES_IN_FLIGHT:,} images in flight, got {w.concurrency:,}",
                          path="workload.concurrency")


def _check_nodes(gpus: int, hardware) -> None:
    """GPUs beyond one node talk over the node link, which must then be given."""
    if gpus > hardware.gpus_per_node and hardware.node_link is None:
        raise ConfigError(f"{gpus} GPUs span more than one {hardware.gpus_per_node}-GPU node; "
                          "set hardware.node_link (e.g. ib-400g)", path="hardware.node_link")


def layer_split(layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous near-equal layer ranges [start, stop) for ``stages`` pipeline stages."""
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for i in range(stages):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out
