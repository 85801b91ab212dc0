"""PipeFusion (Wang et al., arXiv 2405.14430): layers in ``pipefusion`` stages, the image in M patches.

In pipelined steps each stage runs one patch at a time against the full image's K/V from the
previous step (stale), so a stage holds that K/V for its layers; activations peak for one
patch only once warmup steps (which run the full image) are over. Its task cost is the
point-to-point send and receive of each patch; xDiT's PipeFusion attention caches the text K/V,
so diffusers' per-call cross-attention recompute is not paid.
"""

from __future__ import annotations

from ....workloads import dit as W
from ...dit_cost import eager_ops
from .base import MemoryContext, Strategy, StageContext, StageWork


class PipeFusion(Strategy):
    key = "pipefusion"
    in_group = False
    caches_cross_kv = True  # legacy DistriCrossAttentionPP keeps the text K/V

    def __init__(self, degree: int, parallel):
        super().__init__(degree, parallel)
        self.patches = parallel.num_patches

    @property
    def label(self) -> str:
        return f"pipefusion{self.degree}(M={self.patches})"

    @property
    def weight_split(self) -> int:
        return self.degree  # each stage holds its layers only

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        work.cpu_ops += 2 * eager_ops("ops_per_p2p")  # receive this patch's input, send its output

    def activation_split(self, mem: MemoryContext) -> int:
        # warmup steps run the whole image at once; without them the peak is one patch
        return 1 if mem.layout.warmup > 0 else self.patches

    def state_bytes(self, mem: MemoryContext) -> float:
        """Stale K/V of the full image for the largest stage's layers."""
        lay = mem.layout
        return (W.kv_bytes(mem.arch, mem.tokens, mem.layers_max, mem.batch, "bf16", lay.tensor)
                * mem.act_bytes / 2)
