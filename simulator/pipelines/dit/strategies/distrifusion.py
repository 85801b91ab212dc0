"""DistriFusion (Li et al., arXiv 2402.19481): the image split in n patches, one per GPU.

Each GPU computes its patch attending to every layer's full-image K/V from the previous step,
refreshed by an asynchronous all-gather that overlaps the step's compute (synchronous in
warmup steps). Each GPU holds the stale full-image K/V of every layer plus the gather target;
xDiT legacy ``torch.cat``s the stale buffers into one K/V per layer before attention.
"""

from __future__ import annotations

from ....hardware.ops import Op
from ...dit_cost import eager_ops
from .base import MemoryContext, Strategy, StageContext, StageWork

KV_COPIES = 2
"""The stale K/V a step attends to and the buffer the all-gather fills for the next step."""


class DistriFusion(Strategy):
    key = "distrifusion"
    splits_sequence = True

    def _kv_layer_bytes(self, batch: int, tokens: int, inner: int, act_bytes: int) -> int:
        """K and V of one layer over the full image."""
        return 2 * batch * tokens * inner * act_bytes

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        n = ctx.n_layers
        work.cpu_ops += n * eager_ops("distrifusion_ops_per_layer")
        kv_full = self._kv_layer_bytes(ctx.batch, ctx.tokens, ctx.arch.inner, ctx.act_bytes)
        # the torch.cat of the stale buffers reads and writes the full K/V
        work.ops.append(Op("kv_concat", 0.0, 2.0 * kv_full, count=n))

    def add_overlapped(self, ctx: StageContext, work: StageWork, compute: float) -> None:
        n, link = self.degree, ctx.link
        nb = ctx.n_layers * self._kv_layer_bytes(ctx.batch, ctx.tokens, ctx.arch.inner, ctx.act_bytes)
        t_ag = link.allgather_time(nb, n)
        work.comm += t_ag if ctx.sync else max(0.0, t_ag - compute)
        work.comm_bytes += (n - 1) / n * nb

    def state_bytes(self, mem: MemoryContext) -> float:
        return KV_COPIES * mem.layers_max * self._kv_layer_bytes(mem.batch, mem.tokens, mem.arch.inner,
                                                                 mem.act_bytes)
