"""Ring attention (Liu et al., arXiv 2310.01889): K/V chunks circulate r-1 times per layer.

Each GPU holds 1/r of the tokens and attends chunk by chunk while the next K/V chunk arrives;
only the part of a pass's transfer longer than the chunk's attention is exposed. After each
pass yunchang's ``_update_out_and_lse`` merges the partial output in FP32.
"""

from __future__ import annotations

from ....hardware.ops import Op
from ...dit_cost import eager_ops
from .base import MemoryContext, Strategy, StageContext, StageWork
from .ulysses import gathered_kv_bytes

# yunchang / ring-flash-attention _update_out_and_lse per pass, per output element, in FP32:
# the block output cast (read 2 B, write 4 B), out - block_out (read 8, write 4), the sigmoid
# scaling (read 4, write 4), the final subtraction (read 8, write 4) = 38 bytes; one FLOP for
# each of the subtraction, the sigmoid's exp and add, the scaling and the final subtraction.
MERGE_BYTES_PER_ELEMENT = 38.0
MERGE_FLOPS_PER_ELEMENT = 5.0

_ATTENTION = ("self_attn", "joint_attn")  # the image attention the ring splits


class Ring(Strategy):
    key = "ring"
    splits_sequence = True

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        r, n, link = self.degree, ctx.n_layers, ctx.link
        attn = [op for op in ctx.stage_ops if op.name in _ATTENTION]
        attn_layer = ctx.cost.gpu_time(attn) / max(n, 1)
        inner = ctx.arch.inner // ctx.layout.tensor
        chunk = 2 * ctx.batch * ctx.q * inner // ctx.layout.ulysses * ctx.act_bytes  # one K/V chunk
        hidden = max(0.0, link.ring_pass_time(chunk, r) - attn_layer / r)
        work.comm += n * (r - 1) * hidden
        work.comm_bytes += n * (r - 1) * chunk
        elems = ctx.batch * ctx.q * inner // ctx.layout.ulysses
        work.ops.append(Op("ring_merge", MERGE_FLOPS_PER_ELEMENT * elems,
                           MERGE_BYTES_PER_ELEMENT * elems, count=n * (r - 1)))
        work.cpu_ops += n * r * eager_ops("ops_per_ring_pass")

    def in_flight_bytes(self, mem: MemoryContext) -> float:
        return gathered_kv_bytes(mem, mem.layout.ulysses)
