"""Time the kernels the engine profiles name (issue 26), where torch can run them on one GPU: FP8 GEMMs
over the token counts of a step (M = 1 to 8,192), and attention at prefill and decode shapes.

Each function takes ``timer(fn) -> seconds per call`` (measure_gpu's CUDA-event timer) and returns
plain floats; ``measure_gpu`` writes them under ``measured.raw`` beside what they imply. All-reduce
needs more than one GPU and is not timed here (``nccl_collectives`` holds nccl-tests' figures).
"""

from __future__ import annotations

# Token counts of a step: decode batches to whole prefill chunks (vLLM's default token budget 8,192).
FP8_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
FP8_NK = (8192, 8192)  # N, K of the weight: a 70B-class projection, the bf16 sweep's width
# Prefill: one causal sequence of S tokens; Llama-3-8B's attention (32 query heads, 8 KV heads, 128 dims).
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
PREFILL_S = (512, 2048, 8192)
# Decode: B requests of L cached tokens each, one query token per request.
DECODE_BL = ((1, 4096), (32, 2048), (128, 1024))


def fp8_support(torch) -> str | None:
    """None where this GPU and torch run FP8 GEMMs (``torch._scaled_mm``, sm_89 and later), else why not."""
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
        return f"torch {torch.__version__} has no _scaled_mm"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"sm_{major}{minor} has no FP8 tensor cores (sm_89 and later)"
    return None


def measure_fp8_gemm(torch, timer) -> dict[int, dict[str, float]]:
    """Per M of ``FP8_M``: seconds and FLOP/s of an FP8 (e4m3) GEMM M x N x K with per-tensor scales
    and a bf16 output, as cuBLASLt runs vLLM's and TensorRT-LLM's FP8 linear layers."""
    n, k = FP8_NK
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    out = {}
    for m in FP8_M:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        seconds = timer(lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        out[m] = {"seconds": seconds, "flops": 2.0 * m * n * k / seconds}
        del a
    return out


def _attention(torch, q, k, v, causal: bool):
    """(a call of fused attention, the KV heads it reads): grouped-query heads where torch supports
    them (2.5 and later), else the KV heads repeated to the query heads (which reads that many)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        sdpa(q, k, v, is_causal=causal, enable_gqa=True)
        return (lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=True)), k.shape[1]
    except TypeError:
        rep = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return (lambda: sdpa(q, kr, vr, is_causal=causal)), q.shape[1]


def measure_prefill_attention(torch, timer) -> dict[int, dict[str, float]]:
    """Per S of ``PREFILL_S``: seconds and FLOP/s of causal attention over one sequence of S tokens
    (2 matmuls of S x S / 2 causal pairs per head)."""
    out = {}
    for s in PREFILL_S:
        q = torch.randn(1, HEADS, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, KV_HEADS, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, KV_HEADS, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        call, _ = _attention(torch, q, k, v, True)
        seconds = timer(call)
        flops = 4.0 * HEADS * HEAD_DIM * s * (s + 1) / 2
        out[s] = {"seconds": seconds, "flops": flops / seconds}
        del q, k, v
    return out


def measure_decode_attention(torch, timer) -> dict[tuple[int, int], dict[str, float]]:
    """Per (B, L) of ``DECODE_BL``: seconds and KV bytes read per second of one query token per request
    over a contiguous KV cache of L tokens (the kernel of ``serving.decode_attention: contiguous``)."""
    out = {}
    for b, length in DECODE_BL:
        q = torch.randn(b, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, KV_HEADS, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, KV_HEADS, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        call, heads = _attention(torch, q, k, v, False)
        seconds = timer(call)
        kv_bytes = 2.0 * b * heads * length * HEAD_DIM * 2  # K and V, bf16
        out[(b, length)] = {"seconds": seconds, "bandwidth": kv_bytes / seconds}
        del q, k, v
    return out
