"""Bits per weight of quantized checkpoint formats: the element and its share of the block's scale.

A weight-only or block-scaled format stores each weight in fewer bits plus one scale per block of
elements; a decode step reads the weights once, so these bits are what a quantized layer's
weight traffic and memory scale with. The GEMM's arithmetic runs at the activations' dtype (the
scenario's ``dtype``), except NVFP4 (W4A4) on a GPU with FP4 tensor cores
(``LLMCostModel.gemm_dtype``).
"""

from __future__ import annotations

FORMAT_BITS = {
    # OCP Microscaling Formats (MX) v1.0, Sec. 5: MXFP4 is FP4 (E2M1) elements in blocks of 32
    # sharing one 8-bit E8M0 scale: 4 + 8/32 bits (gpt-oss's MoE weights, openai/gpt-oss-20b).
    "mxfp4": 4.0 + 8.0 / 32,
    # NVIDIA, "Introducing NVFP4" (developer blog, 2025-06-24): E2M1 elements in blocks of 16 with
    # one FP8 (E4M3) scale each, plus one FP32 scale per tensor (negligible): 4 + 8/16 bits.
    "nvfp4": 4.0 + 8.0 / 16,
    # FP8 (E4M3) elements; DeepSeek-V3's 128x128 block scales (weight_block_size) add 32/16384 bits.
    "fp8": 8.0,
}


def bits_per_weight(fmt: str, group_size: int = 128) -> float:
    """Bits one weight occupies in checkpoint format ``fmt``.

    ``int4`` is AWQ/GPTQ's group quantization (AutoAWQ's GEMM layout: 4-bit weights, one fp16
    scale and one packed 4-bit zero point per ``group_size`` elements of a column): 4 + 20/group.
    """
    if fmt == "int4":
        return 4.0 + (16.0 + 4.0) / group_size
    return FORMAT_BITS[fmt]
