"""Ulysses sequence parallelism (DeepSpeed-Ulysses, Jacobs et al., arXiv 2309.14509).

Each GPU holds 1/u of the image tokens; around attention an all-to-all regathers the sequence
and splits the heads instead: Q, K and V before, O after (four all-to-alls per layer, each
moving (u-1)/u of a GPU's b x q x inner tensor). yunchang's LongContextAttention, which xDiT
runs, adds its FP32 ring path once per layer even at ring degree 1.
"""

from __future__ import annotations

from ...dit_cost import eager_ops
from .base import MemoryContext, Strategy, StageContext, StageWork

ALLTOALLS_PER_LAYER = 4
"""Q, K, V before attention and O after (DeepSpeed-Ulysses, arXiv 2309.14509, sec. 3.1)."""


def gathered_kv_bytes(mem: MemoryContext, ulysses: int) -> float:
    """One layer's K and V of the full image over the GPU's heads: what a sequence-parallel
    attention holds while it runs (Ulysses after its all-to-all, Ring as its passes arrive)."""
    a, lay = mem.arch, mem.layout
    return 2 * mem.batch * mem.tokens * a.inner // (lay.tensor * ulysses) * mem.act_bytes


class Ulysses(Strategy):
    key = "ulysses"
    splits_sequence = True

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        u, n, link = self.degree, ctx.n_layers, ctx.link
        nb = ctx.batch * ctx.q * (ctx.arch.inner // ctx.layout.tensor) * ctx.act_bytes
        calls = n * ALLTOALLS_PER_LAYER
        work.comm += calls * link.alltoall_time(nb, u)
        work.comm_bytes += calls * nb * (u - 1) / u
        work.cpu_ops += calls * eager_ops("ops_per_collective")
        work.dispatch_only += calls * eager_ops("dispatch_only_per_collective")
        work.cpu_ops += n * eager_ops("ulysses_attention_ops_per_layer")
        work.dispatch_only += n * eager_ops("ulysses_attention_dispatch_only_per_layer")

    def in_flight_bytes(self, mem: MemoryContext) -> float:
        return gathered_kv_bytes(mem, self.degree)
