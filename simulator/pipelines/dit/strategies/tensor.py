"""Tensor parallelism (Megatron-LM, Shoeybi et al., arXiv 1909.08053) as xDiT legacy runs it.

Heads and MLP columns are split ``tensor`` ways; each split module (self-attention, MLP and,
with ``tensor_cross_attention: split``, the cross-attention) ends in a ring all-reduce of the
b x q x hidden output. Legacy TP adds the bias after the all-reduce on the full activation
(kernels.yaml ``diffusers_unfused``). A replicated cross-attention's weights sit whole on
every rank.
"""

from __future__ import annotations

from ...dit_cost import eager_ops, unfused
from .base import MemoryContext, Strategy, StageContext, StageWork

CROSS_ATTENTION_MATRICES = 4
"""q, k, v and out projections, each hidden x inner (diffusers Attention)."""

_LEGACY_BLOCKS = ("cross", "self")  # diffusers BasicTransformerBlock kinds (kernels.yaml)


class TensorParallel(Strategy):
    key = "tensor"

    def __init__(self, degree: int, parallel):
        super().__init__(degree, parallel)
        self.split_cross = parallel.splits_cross_attention

    @property
    def tensor_split(self) -> int:
        return self.degree

    def split_modules(self, kind: str) -> int:
        """Modules of a block of ``kind`` split (and all-reduced): attention, MLP, a split cross."""
        return 2 + int(kind == "cross" and self.split_cross)

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        t, link = self.degree, ctx.link
        kinds = ctx.kinds
        n_ar = sum(self.split_modules(k) for k in kinds)
        legacy = sum(self.split_modules(k) for k in kinds if k in _LEGACY_BLOCKS)
        work.eltwise_passes += legacy * unfused("tp_bias_passes_per_split_module")
        nb = ctx.batch * ctx.q * ctx.arch.hidden * ctx.act_bytes
        work.comm += n_ar * link.allreduce_time(nb, t)
        work.comm_bytes += n_ar * 2 * (t - 1) / t * nb
        work.cpu_ops += (n_ar * eager_ops("ops_per_collective")
                         + legacy * unfused("tp_ops_per_split_module"))

    def extra_weight_bytes(self, mem: MemoryContext) -> float:
        if self.split_cross:
            return 0.0
        a, t = mem.arch, self.degree
        n_cross = sum(a.layer_kind(i) == "cross" for i in range(a.num_layers))
        return (n_cross * CROSS_ATTENTION_MATRICES * a.hidden * a.inner * mem.weight_bytes
                * (1 - 1 / t) / mem.layout.pp)
