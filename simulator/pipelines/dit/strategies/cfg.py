"""CFG parallelism: the conditional and unconditional branches on two GPU groups (xDiT ``cfg``).

Each branch runs batch 1 instead of the single-GPU batch 2; after every patch of the last
stage the branches exchange their noise predictions (the SimPy path sends those bytes,
:meth:`exchange_bytes`). Its task cost is that exchange's collective call on the CPU.
"""

from __future__ import annotations

from ...dit_cost import eager_ops
from .base import Strategy, StageContext, StageWork


class CFGParallel(Strategy):
    key = "cfg"
    in_group = False

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        if ctx.last:  # the noise-prediction exchange is one collective call per task
            work.cpu_ops += eager_ops("ops_per_collective")

    @staticmethod
    def exchange_bytes(batch: int, q_tokens: int, latent_token_bytes: float, sp: int) -> float:
        """Bytes each GPU of a branch sends the other per task: its tokens' noise prediction."""
        return batch * q_tokens * latent_token_bytes / sp
