"""A DiT run's cost model: per-stage task times and per-GPU memory, derived once from the scenario.

The model's own work (the stage's operators, the eager-mode dispatch census of diffusers'
blocks and pipeline loop) is counted here; each parallel strategy of the layout adds its share
(:mod:`.strategies`), so no branch here names a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config.dit_models import DiTScenario, layer_split
from ...hardware.gpu import GPU
from ...hardware.ops import DTYPE_BYTES, Op
from ...hardware.topology import LinkParams
from ...workloads import dit as W
from ..dit_cost import DiTCost, eager_ops, unfused
from .layout import Layout
from .strategies import Link, MemoryContext, StageContext, StageWork

VAE_WORKSPACE_TENSORS = 3.0
"""Full-resolution feature maps of block_out_channels[0] channels alive at once in the VAE
decoder's last up block (diffusers ResnetBlock2D: its input, the GroupNorm+SiLU output, the conv
output); derived from the decoder's structure (workloads.dit.vae_decode_ops)."""


@dataclass(frozen=True)
class TaskCost:
    """One stage group's task: GPU compute, exposed collective time, bytes each GPU sends."""

    compute: float
    comm: float
    comm_bytes: float


@dataclass
class DiTModel:
    """Everything a run needs, derived once from the scenario."""

    sc: DiTScenario
    arch: W.DiTArch
    gpu: GPU
    cost: DiTCost
    lay: Layout
    tokens: int
    stages: list
    link: LinkParams        # the link a stage group's collectives cross (NVLink, else PCIe)
    images: int = 1         # requests in one denoising pass (serving.max_batch batches them)
    _tasks: dict = field(default_factory=dict)
    _groups: dict = field(default_factory=dict)  # GPU count -> NCCL group, on a node type

    @classmethod
    def build(cls, sc: DiTScenario, images: int = 1) -> "DiTModel":
        """The model of ``images`` requests of the scenario's shape in one pass."""
        arch = sc.arch
        gpu = GPU.from_spec(sc.hardware.gpu)
        lay = Layout.build(sc.parallel, sc.steps)
        hw = sc.hardware
        spec = hw.gpu_link or hw.host_link
        link = LinkParams.from_spec(spec)
        cost = DiTCost.from_kernels(gpu, arch.head_dim, sc.kernels, eager=not hw.cuda_graphs, arch=hw.gpu.arch)
        return cls(sc, arch, gpu, cost, lay, W.image_tokens(arch, sc.height, sc.width, sc.frames),
                   layer_split(arch.num_layers, lay.pp), link, images)

    def _nccl_groups(self):
        """GPU count -> NCCL's view of the first n GPUs on the node type's topology (None without
        ``hardware.node``: the flat closed forms)."""
        hw = self.sc.hardware
        if hw.node is None:
            return None
        cache = self._groups

        def groups(n: int):
            if n not in cache:
                from ...hardware.nccl import group_on

                cache[n] = group_on(hw, range(n))
            return cache[n]
        return groups

    @property
    def batch(self) -> int:
        """Samples in one forward per GPU: the pass's requests, each with its CFG pair unless CFG is split."""
        return self.sc.batch * self.images

    @property
    def act_bytes(self) -> int:
        return W.act_bytes(self.sc.dtype)

    def task(self, stage: int, q_total: int, sync: bool) -> TaskCost:
        """Cost of stage ``stage`` over ``q_total`` query tokens (split over the SP group)."""
        key = (stage, q_total, sync)
        hit = self._tasks.get(key)
        if hit is None:
            hit = self._task(stage, q_total, sync)
            self._tasks[key] = hit
        return hit

    def _context(self, stage: int, q_total: int, sync: bool) -> StageContext:
        lay, arch = self.lay, self.arch
        l0, l1 = self.stages[stage]
        q = q_total // lay.sp
        cross_tp = self.sc.parallel.splits_cross_attention
        ops = W.stage_ops(arch, l0, l1, q, self.tokens, self.batch, self.sc.dtype, lay.tensor,
                          cross_tp=cross_tp)
        return StageContext(arch, range(l0, l1), q, self.tokens, self.batch, self.act_bytes, lay,
                            Link(self.link.bandwidth, self.link.latency, self.link.collective_bandwidth,
                                 self._nccl_groups()),
                            self.cost, tuple(ops), cross_tp, sync)

    def _task(self, stage: int, q_total: int, sync: bool) -> TaskCost:
        ctx = self._context(stage, q_total, sync)
        work = StageWork(cpu_ops=_model_dispatches(ctx), dispatch_only=sum(
            eager_ops("dispatch_only_per_block", k) for k in ctx.kinds))
        for s in self.lay.strategies:
            s.add_work(ctx, work)
        if not any(s.caches_cross_kv for s in self.lay.strategies):
            # diffusers' own cross attention: text K/V and mask recomputed every call
            work.cpu_ops += sum(unfused("uncached_cross_ops_per_block") for k in ctx.kinds if k == "cross")
        # diffusers BasicTransformerBlock's separate element-wise kernels (kernels.yaml
        # diffusers_unfused) on this GPU's b x q tokens, with what the strategies add
        passes = (sum(unfused("extra_passes_per_block", k) for k in ctx.kinds) + work.eltwise_passes
                  + _qk_passes(self.arch, len(ctx.kinds), self.lay.tensor))
        ops = list(ctx.stage_ops)
        if passes:
            x = ctx.batch * ctx.q * self.arch.hidden
            ops.append(Op("unfused_eltwise", float(x), float(passes * x * ctx.act_bytes)))
        compute = self.cost.task_time(ops + work.ops, work.cpu_ops, work.dispatch_only)
        for s in self.lay.strategies:
            s.add_overlapped(ctx, work, compute)
        return TaskCost(compute, work.comm, work.comm_bytes)

    # ---- memory ----

    def memory_context(self) -> MemoryContext:
        """What the strategies' memory shares depend on."""
        return MemoryContext(self.arch, self.lay, self.tokens, self.batch, DTYPE_BYTES[self.sc.dtype],
                             self.act_bytes, max(l1 - l0 for l0, l1 in self.stages),
                             self.sc.parallel.splits_cross_attention)

    def memory_per_gpu(self) -> float:
        """Bytes the busiest GPU needs: weights, activations, K/V buffers, VAE workspace."""
        sc, arch, b, ab = self.sc, self.arch, self.batch, self.act_bytes
        mem = self.memory_context()
        strategies = self.lay.strategies
        shards = 1
        for s in strategies:
            shards *= s.weight_split
        params = arch.params * mem.weight_bytes / shards
        for s in strategies:
            params += s.extra_weight_bytes(mem)
        if sc.text_encode:
            params += sum(e.params for e in arch.text_encoders) * ab
        if sc.delivery.vae:
            params += arch.vae.params * ab
        split = 1
        for s in strategies:
            split *= s.activation_split(mem)
        act = W.peak_activation_bytes(arch, self.tokens // split, b, "bf16") * ab / 2
        kv = 0.0
        for s in strategies:
            kv += s.state_bytes(mem)
        kv += max((s.in_flight_bytes(mem) for s in strategies), default=0.0)
        return params + act + kv + self._vae_workspace()

    def _vae_workspace(self) -> float:
        sc = self.sc
        if not sc.delivery.vae:
            return 0.0
        div = self.lay.n_gpus if sc.parallel.vae_parallel else 1
        vae = self.arch.vae
        # a video VAE decodes a chunk of latent frames at a time (one where the catalog names none): the chunk's
        # output frames and the conv_frames - 1 frames cached from the previous chunk (Wan's CACHE_T = 2), the
        # same cache workloads.dit.vae_decode_ops concatenates
        chunk = vae.chunk_latent_frames or 1
        frames = chunk * vae.temporal_downsample + vae.conv_frames - 1 if vae.video else 1
        return (VAE_WORKSPACE_TENSORS * frames * sc.height * sc.width * vae.block_out_channels[0]
                * self.act_bytes * self.images / div)


def _qk_passes(arch, layers: int, tp: int) -> float:
    """Element-wise passes the eager code's FP32 rotary embedding and q/k norms add over ``layers`` blocks
    (kernels.yaml diffusers_unfused rope_passes, qk_norm_passes), on this GPU's share of q and k."""
    per_layer = ((unfused("rope_passes", arch.eager_code) if arch.rope else 0)
                 + (unfused("qk_norm_passes", arch.eager_code) if arch.qk_norm else 0))
    return layers * per_layer / tp


def _model_dispatches(ctx: StageContext) -> int:
    """Launching ops the Python process dispatches for the model's own part of a stage task."""
    kinds = ctx.kinds
    n = sum(eager_ops("ops_per_block", k) for k in kinds)
    n += eager_ops("ops_per_forward_prologue")  # on every stage (see kernels.yaml)
    if ctx.layers.start == 0:
        n += eager_ops("ops_per_patch_embed")
    if ctx.last:
        n += eager_ops("ops_per_final_layer") + eager_ops("ops_per_step")
    return n
