"""Where a layout's GPUs sit: ``cfg`` branches x ``pipefusion`` stages x a lockstep group."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .strategies import Strategy, compose


@dataclass(frozen=True)
class Layout:
    """GPU indexing: gpu = ((branch * pp + stage) * group) + member; degrees from the strategies."""

    strategies: tuple[Strategy, ...]
    patches: int        # PipeFusion's M in pipelined steps (1 without PipeFusion)
    warmup: int         # full-image steps before patches / stale K/V take over

    @classmethod
    def build(cls, parallel, steps: int) -> "Layout":
        strategies = compose(parallel)
        staleness = parallel.pipefusion > 1 or parallel.distrifusion > 1
        return cls(strategies, parallel.num_patches if parallel.pipefusion > 1 else 1,
                   min(parallel.warmup_steps, steps) if staleness else 0)

    def degree(self, key: str) -> int:
        """The degree of the strategy named ``key`` (1 when it is not used)."""
        return next((s.degree for s in self.strategies if s.key == key), 1)

    @property
    def cfg(self) -> int:
        return self.degree("cfg")

    @property
    def pp(self) -> int:
        return self.degree("pipefusion")

    @property
    def ulysses(self) -> int:
        return self.degree("ulysses")

    @property
    def distri(self) -> bool:
        """Whether K/V is stale across steps inside the group (DistriFusion)."""
        return self.degree("distrifusion") > 1

    @property
    def sp(self) -> int:
        """Ways the image tokens are split over a lockstep group."""
        return math.prod(s.sequence_split for s in self.strategies)

    @property
    def tensor(self) -> int:
        """Ways every block's heads and MLP columns are split."""
        return math.prod(s.tensor_split for s in self.strategies)

    @property
    def group(self) -> int:
        return math.prod(s.degree for s in self.strategies if s.in_group)

    @property
    def n_gpus(self) -> int:
        return math.prod(s.degree for s in self.strategies)

    def members(self, branch: int, stage: int) -> list[int]:
        base = (branch * self.pp + stage) * self.group
        return list(range(base, base + self.group))
