"""GPU model: per-operator roofline with tile/wave quantization and fixed per-kernel costs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from .ops import Op

TILE = 128
"""Output tile edge of a GEMM CTA: CUTLASS's SM80 and SM90 default configurations and cuBLAS's
common ones use 128x128 (CUTLASS examples/48_hopper_warp_specialized_gemm:
``TileShape = Shape<_128,_128,_64>``)."""

TILE_K = 64
"""K depth of one main-loop stage of that tile (the ``_64`` of the same TileShape): the unit in
which a software-pipelined GEMM streams its operands."""

SPLIT_K_MIN = 256


def _exposed_multistage(compute: float, memory: float, waves: int, k_stages: int) -> float:
    """Ampere/Ada multistage main loop (cp.async + synchronous ``mma.sync`` issued by the same
    warps, one 128x128 CTA per SM): at w waves, min(compute, memory)/w of the work does not
    overlap. Measured: TensorRT-LLM's 128-token first token on an A100 (16 ms) is the weights'
    read plus their GEMM math back to back (validation family llm_first_token)."""
    return min(compute, memory) / waves


def _exposed_warp_specialized(compute: float, memory: float, waves: int, k_stages: int) -> float:
    """Hopper/Blackwell warp-specialized main loop: a producer warp issues TMA loads into a ring
    of shared-memory stages while consumer warpgroups run asynchronous WGMMA (CUTLASS
    ``KernelTmaWarpSpecialized*``, media/docs/efficient_gemm.md "Warp Specialization"; FA3,
    Shah et al. 2024, sec. 3.1), so loads and math overlap except while the ring fills: one
    ``TILE_K`` stage of each tile's k_stages per wave stays exposed."""
    return min(compute, memory) / (waves * k_stages)


GEMM_MAINLOOPS = {"multistage": _exposed_multistage, "warp_specialized": _exposed_warp_specialized}
"""How much of a GEMM's memory and math fails to overlap, by the main loop its GPU's kernels run
(``gemm_mainloop`` in the GPU catalog)."""


def step_window(ready: float, gpu_free: float, compute: float, launched: float,
                comm: Callable[[float], float] | None = None) -> tuple[float, float, float]:
    """A step's (start, end) on its GPU and its communication's seconds: its kernels run as they are
    launched, so it starts once scheduled (``ready``) and the GPU is free, takes ``compute`` seconds,
    then its TP/PP communication (``comm``: when it ends, from when it begins; none without), and
    cannot end before its last launch (``launched``). The one closed form of a step's GPU time (the
    engine's closed-form step and the closed-form decode runs call it)."""
    g0 = ready if ready > gpu_free else gpu_free
    g1 = g0 + compute
    seconds = 0.0
    if comm is not None:
        end = comm(g1)
        seconds, g1 = end - g1, end
    return g0, (launched if launched > g1 else g1), seconds


@dataclass(frozen=True)
class GPU:
    """Timing model of one GPU, in SI units.

    An operator takes max(FLOPs / achievable FLOP/s, bytes / achievable HBM bandwidth), at least
    the shortest a kernel runs (``kernel_floor``: ramp-up, one wave, tail), plus the gap before
    the next kernel starts (``kernel_overhead``). A GEMM's achievable FLOP/s is further scaled by how well its
    128x128 output tiles fill the SMs (wave quantization, with split-K when there are fewer
    tiles than SMs), and the part of memory and math its main loop cannot overlap is added
    (``GEMM_MAINLOOPS``: a whole wave's worth on Ampere, one pipeline fill on Hopper).
    """

    name: str
    peak_flops: dict
    memory: float
    hbm_bandwidth: float
    sm_count: int
    matmul_eff: float
    matmul_fp8_eff: float
    hbm_eff: float
    kernel_overhead: float
    launch_overhead: float
    gemm_mainloop: str = "multistage"
    kernel_floor: float = 0.0

    @classmethod
    def from_spec(cls, spec) -> "GPU":
        """Build from a validated :class:`simulator.config.models.GPUSpec`."""
        return cls(spec.name, dict(spec.peak_flops), spec.memory, spec.hbm_bandwidth, spec.sm_count,
                   spec.achievable.matmul, spec.achievable.matmul_fp8, spec.achievable.hbm,
                   spec.kernel_overhead, spec.launch_overhead, spec.gemm_mainloop, spec.kernel_floor)

    @property
    def bandwidth(self) -> float:
        """Achievable HBM bandwidth, bytes/s."""
        return self.hbm_bandwidth * self.hbm_eff

    def flops_rate(self, dtype: str) -> float:
        """Achievable FLOP/s of a large matrix multiply in ``dtype``."""
        peak = self.peak_flops.get(dtype) or self.peak_flops["bf16"]
        # FP4: no published FP4 GEMM efficiency; the FP8 fraction (the same tensor-core pipeline, half the bits)
        return peak * (self.matmul_fp8_eff if dtype in ("fp8", "fp4") else self.matmul_eff)

    def tiling(self, m: int, n: int, k: int) -> tuple[float, int, int]:
        """(fraction of SM slots doing useful tiles, waves, K stages per tile) of an m x n x k
        GEMM, split-K spreading fewer tiles than SMs over more of them."""
        tiles = math.ceil(m / TILE) * math.ceil(n / TILE)
        split = 1
        if tiles < self.sm_count:
            split = max(1, min(self.sm_count // tiles, math.ceil(k / SPLIT_K_MIN)))
        units = tiles * split
        waves = math.ceil(units / self.sm_count)
        return units / (waves * self.sm_count), waves, max(1, math.ceil(k / split / TILE_K))

    def op_time(self, op: Op) -> float:
        """GPU time of ``op`` (all its ``count`` repetitions), seconds."""
        mem = op.bytes / (self.bandwidth * op.bandwidth_share)
        rate = self.flops_rate(op.dtype)
        if op.gemm is not None:
            eff, waves, stages = self.tiling(*op.gemm)
            comp = op.flops / (rate * eff)
            t = max(comp, mem) + GEMM_MAINLOOPS[self.gemm_mainloop](comp, mem, waves, stages)
        else:
            t = max(op.flops / rate, mem)
        return op.count * (max(t, self.kernel_floor) + self.kernel_overhead)

    def ops_time(self, ops: Iterable[Op]) -> float:
        """Total GPU time of a sequence of operators run back to back."""
        return sum(self.op_time(op) for op in ops)

    def launch_time(self, kernels: int, cuda_graphs: bool) -> float:
        """CPU time to launch ``kernels`` kernels: one graph replay, or one launch each."""
        return self.launch_overhead if cuda_graphs else kernels * self.launch_overhead
