"""Inter-token latency as the clients saw it, in the two views the field uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sketch import QuantileSketch


@dataclass(frozen=True)
class ITL:
    """The inter-token latency the clients saw: ``chunks``, each received chunk's gap to the
    request's previous chunk (what ``vllm bench serve``, genai-perf and aiperf call ITL; an array, or
    a sketch where they outgrew the exact store), and ``zeros``, the tokens that arrived in a chunk
    after its first (0 s apart in the per-token view)."""

    chunks: np.ndarray | QuantileSketch
    zeros: int = 0

    def per_token(self) -> np.ndarray | QuantileSketch:
        """Every token's gap: the chunks' gaps, then a zero per further token of a chunk."""
        if isinstance(self.chunks, QuantileSketch):
            out = self.chunks.copy()
            out.add_zeros(self.zeros)
            return out
        return np.concatenate([self.chunks, np.zeros(self.zeros)]) if self.zeros else self.chunks
