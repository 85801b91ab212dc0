"""Time of DiT work on one GPU: the GPU roofline plus what it leaves out for diffusion shapes.

Two mechanisms on top of :meth:`GPU.op_time`, with their figures in
``simulator/config/catalog/kernels.yaml``:

- **Attention** is a FlashAttention-2 forward: its two GEMMs per score tile run on the
  tensor cores at the GEMM rate with the head dimension padded to the kernel's tile
  (PixArt's 72 runs as 96), and the online softmax runs on the CUDA cores in FP32, not
  overlapped with the GEMMs (Ampere/Ada). So the kernel's fraction of peak follows the chip's
  tensor-to-FP32 ratio: ~61% of peak on an A100 (16x), ~76% on an L20 (2x).
- **Eager mode** (``hardware.cuda_graphs: false``, as the published PyTorch runs): the CPU
  dispatches every PyTorch op from Python at ``launch_overhead`` each, plus every
  non-launching call (views, reshapes, module ``__call__``) at ``dispatch_overhead``, and a
  task cannot end before its ops were issued. The op counts are a census of the code the published runs
  executed (diffusers blocks, pipeline loop, scheduler, collectives); small per-GPU shares
  (8 GPUs at 1024², many PipeFusion patches) become CPU-bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..config import catalog
from ..hardware.gpu import GPU
from ..hardware.ops import Op
from ..workloads.dit import VAEEager

_ATTN_NAMES = ("self_attn", "cross_attn", "joint_attn")


def kernel_catalog() -> dict:
    """``simulator/config/catalog/kernels.yaml`` (sourced kernel and eager-PyTorch figures)."""
    return catalog.kernels()


def attention_fraction(arch: str, kernel: str, head_dim: int) -> float | None:
    """The fraction of peak a FlashAttention forward reaches on ``arch`` at head dimension ``head_dim`` where it
    is measured as a whole (``kernels.yaml`` flash_attention.measured_fraction: the next head dimension listed at
    or above, else the largest); None where the GEMM + FP32-softmax model holds."""
    by_dim = kernel_catalog()["flash_attention"]["measured_fraction"].get(arch, {}).get(kernel)
    if not by_dim:
        return None
    dims = sorted(int(d) for d in by_dim)
    return float(by_dim[next((d for d in dims if d >= head_dim), dims[-1])])


def vae_eager(vae, channels_last: bool) -> VAEEager | None:
    """The element-wise kernels ``vae``'s eager decoder code runs around its convolutions (``kernels.yaml``
    vae_eager, by ``vae.eager_code``; None without a census), its Conv3d weights channels_last_3d or not."""
    if vae.eager_code is None:
        return None
    census = {k: v for k, v in kernel_catalog()["vae_eager"][vae.eager_code].items() if k != "sources"}
    return VAEEager(**census, channels_last=channels_last)


def eager_ops(key: str, kind: str | None = None) -> int:
    """Ops dispatched per unit of work (``ops_per_block`` needs the block ``kind``)."""
    e = kernel_catalog()["eager_pytorch"]
    return int(e[key][kind] if kind is not None else e[key])


def dispatch_overhead() -> float:
    """CPU seconds of one Python-level call that launches no kernel (view, module call)."""
    return float(kernel_catalog()["eager_pytorch"]["dispatch_overhead"])


def _softmax_flops() -> float:
    return float(kernel_catalog()["flash_attention"]["nonmatmul_flops_per_score"])


@dataclass
class DiTCost:
    """Times lists of ops for one model on one GPU type.

    ``attention_efficiency`` is only used when ``softmax_flops`` is set to 0 (a flat fraction
    of peak for the fused attention instead of the GEMM + FP32-softmax model).
    """

    gpu: GPU
    head_dim: int
    attention_efficiency: float
    head_dim_multiple: int
    eager: bool
    softmax_flops: float = field(default_factory=_softmax_flops)
    attention_fraction: float | None = None  # a measured fraction of peak for the kernel on this architecture

    @classmethod
    def from_kernels(cls, gpu: GPU, head_dim: int, kernels, eager: bool, arch: str = "other") -> "DiTCost":
        """The cost model under a scenario's ``kernels`` settings (config.dit_models.Kernels) on a GPU of
        architecture ``arch``."""
        padded = math.ceil(head_dim / kernels.head_dim_multiple) * kernels.head_dim_multiple
        return cls(gpu, head_dim, kernels.attention_efficiency, kernels.head_dim_multiple, eager=eager,
                   attention_fraction=attention_fraction(arch, kernels.attention, padded))

    @property
    def padded_head_dim(self) -> int:
        return math.ceil(self.head_dim / self.head_dim_multiple) * self.head_dim_multiple

    @property
    def attention_scale(self) -> float:
        """FLOP inflation of attention relative to a GEMM of the same FLOPs on this GPU."""
        pad = self.padded_head_dim / self.head_dim
        if self.attention_fraction is not None:  # the kernel's measured fraction of peak on this architecture
            return self.gpu.matmul_eff / self.attention_fraction * pad
        if not self.softmax_flops:
            return self.gpu.matmul_eff / self.attention_efficiency * pad
        rate = self.gpu.flops_rate("bf16")
        fp32 = self.gpu.peak_flops.get("fp32") or self.gpu.peak_flops["bf16"] / 16
        # per FLOP of 4·d per score: padded GEMM time + softmax time, in GEMM-FLOP units
        return pad + self.softmax_flops / (4.0 * self.head_dim) * rate / fp32

    def _op(self, op: Op) -> Op:
        if op.gemm is None and op.name in _ATTN_NAMES:
            return replace(op, flops=op.flops * self.attention_scale)
        return op

    def gpu_time(self, ops: list[Op]) -> float:
        """GPU-side time of the ops run back to back."""
        return sum(self.gpu.op_time(self._op(op)) for op in ops)

    def kernels(self, ops: list[Op]) -> int:
        return sum(op.count for op in ops)

    def time(self, ops: list[Op]) -> float:
        """Wall time of a task: GPU time, or the CPU's launch time if that is longer (eager)."""
        t = self.gpu_time(ops)
        if self.eager:
            t = max(t, self.kernels(ops) * self.gpu.launch_overhead)
        return t

    def task_time(self, ops: list[Op], cpu_ops: int, dispatch_only: int = 0) -> float:
        """Wall time of a task whose Python side dispatches ``cpu_ops`` launching ops and
        ``dispatch_only`` non-launching calls (views, module calls) in eager mode, or none."""
        t = self.gpu_time(ops)
        if self.eager:
            t = max(t, cpu_ops * self.gpu.launch_overhead + dispatch_only * dispatch_overhead())
        return t


def unfused(key: str, kind: str | None = None) -> int:
    """``diffusers_unfused`` census entry (per-kind where ``kind`` is given; 0 if absent)."""
    e = kernel_catalog()["diffusers_unfused"][key]
    return int(e.get(kind, 0) if isinstance(e, dict) else e)
