"""Time of DiT work on one GPU: the GPU roofline plus what it leaves out for diffusion shapes.

Two mechanisms on top of :meth:`GPU.op_time`: the fused attention kernel runs at its own
achievable fraction of peak with the head dimension padded to the kernel's tile (PixArt's
72 runs as 96), and in eager mode (``hardware.cuda_graphs: false``, as the published
PyTorch runs) a task cannot finish before the CPU has launched its kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..hardware.gpu import GPU
from ..workloads.ops import Op

_ATTN_NAMES = ("self_attn", "cross_attn", "joint_attn")


@dataclass
class DiTCost:
    """Times lists of ops for one model on one GPU type, memoized by the caller's key."""

    gpu: GPU
    head_dim: int
    attention_efficiency: float
    head_dim_multiple: int
    eager: bool
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def attention_scale(self) -> float:
        """FLOP inflation of attention: GEMM efficiency over (attention efficiency x padding)."""
        padded = math.ceil(self.head_dim / self.head_dim_multiple) * self.head_dim_multiple
        return self.gpu.matmul_eff / self.attention_efficiency * padded / self.head_dim

    def _op(self, op: Op) -> Op:
        if op.gemm is None and op.name in _ATTN_NAMES:
            return replace(op, flops=op.flops * self.attention_scale)
        return op

    def gpu_time(self, ops: list[Op]) -> float:
        """GPU-side time of the ops run back to back."""
        return sum(self.gpu.op_time(self._op(op)) for op in ops)

    def kernels(self, ops: list[Op]) -> int:
        return sum(op.count for op in ops)

    def time(self, ops: list[Op], extra_kernels: int = 0) -> float:
        """Wall time of a task: GPU time, or the CPU's launch time if that is longer (eager)."""
        t = self.gpu_time(ops)
        if self.eager:
            t = max(t, (self.kernels(ops) + extra_kernels) * self.gpu.launch_overhead)
        return t

    def cached(self, key, build) -> float:
        """``time(build())`` memoized under ``key``."""
        v = self._cache.get(key)
        if v is None:
            v = build()
            self._cache[key] = v
        return v
