"""The GPU step as vLLM V1 runs it: the sum of its kernels in closed form (dense layers, paged decode
attention, fused MoE), the GEMM main loop by architecture, and the engine's all-reduce policy."""

from __future__ import annotations

import math
import typing

import pytest

from simulator.config import catalog
from simulator.config.loader import load_scenario
from simulator.config.models import GPUSpec, LLMParallel, Serving
from simulator.hardware.allreduce import ALLREDUCE_POLICIES, MIB, AllReduceLink, VLLMAllReduce
from simulator.hardware.gpu import GEMM_MAINLOOPS, GPU
from simulator.hardware.ops import Op
from simulator.pipelines.llm.pools import build_cost
from simulator.workloads.llm import KERNELS_PER_LAYER, LAYER_KERNELS, KERNELS_PER_STEP


def cost_of(**overrides):
    raw = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "dtype": "bf16",
           "workload": {"prompt_tokens": 100, "output_tokens": 10}}
    return build_cost(load_scenario(raw, overrides))


def test_layer_kernels_are_vllms_llama_decoder_layer():
    # Two fused add+RMSNorm (the residual add rides in the next norm), qkv, rotary, the paged-KV
    # write, attention, o, gate_up, SiLU-and-mul, down: ten kernels, no separate residual add.
    assert KERNELS_PER_LAYER == 10 and LAYER_KERNELS.count("add_rms_norm") == 2
    assert "residual" not in LAYER_KERNELS
    assert [op.name for op in cost_of()._linear_ops(128)] == [k for k in LAYER_KERNELS if k != "attention"]
    assert cost_of().kernels_per_step() == 32 * 10 + KERNELS_PER_STEP


def test_large_batch_decode_step_is_the_sum_of_its_kernels():
    """Llama-3-8B on an H100 at batch 128, 700-token contexts: every layer's ten kernels (GEMMs
    through the warp-specialized main loop, paged decode attention at its own rate and latency)
    and the head, written out from the catalog figures."""
    c = cost_of()
    g, s, b = c.gpu, c.shape, 2
    batch, ctx = 128, 700
    peak, frac, lat = 3350e9, 0.88, 15e-6
    assert (g.hbm_bandwidth, c.attention.bandwidth_fraction, c.attention.latency) == (peak, frac, lat)
    bw, rate = peak * 0.866, 989e12 * 0.803

    def gemm(m, n, k):
        flops, nbytes = 2 * m * n * k, (n * k + m * k + m * n) * b
        tiles = math.ceil(m / 128) * math.ceil(n / 128)
        split = max(1, min(132 // tiles, math.ceil(k / 256))) if tiles < 132 else 1
        waves = math.ceil(tiles * split / 132)
        eff = tiles * split / (waves * 132)
        comp, mem = flops / (rate * eff), nbytes / bw
        return max(max(comp, mem) + min(comp, mem) / (waves * math.ceil(k / split / 64)), 3e-6) + 1e-6

    def elementwise(flops, nbytes):  # at least the 3 us kernel floor, then the 1 us gap
        return max(flops / rate, nbytes / bw, 3e-6) + 1e-6

    t, h, q, kv, f = batch, 4096, 4096, 2 * 8 * 128, 14336
    layer = (2 * elementwise(6 * t * h, 4 * t * h * b) + gemm(t, q + kv, h)
             + elementwise(6 * t * (q + kv // 2), 2 * t * (q + kv // 2) * b) + elementwise(0, 2 * t * kv * b)
             + gemm(t, h, q) + gemm(t, 2 * f, h) + elementwise(4 * t * f, 3 * t * f * b) + gemm(t, h, f))
    kv_bytes = 2 * 8 * 128 * b * batch * ctx + 2 * 32 * 128 * b * batch
    attention = max(4 * 32 * 128 * batch * ctx / rate, kv_bytes / (peak * frac)) + lat + 1e-6
    head = g.ops_time([
        Op("final_norm", 5 * batch * h, 2 * batch * h * b),
        Op("lm_head", 2 * batch * h * s.vocab, (h * s.vocab + batch * h) * b + batch * s.vocab * 4,
           gemm=(batch, s.vocab, h)),
        Op("sample", 10 * batch * s.vocab, 2 * batch * s.vocab * 4, dtype="fp32"),
    ])
    step = c.step(batch * ctx, batch)
    assert step.comm == 0.0
    assert step.compute == pytest.approx(32 * (layer + attention) + head, rel=1e-12)
    # and it stays above the step's own HBM roofline at the streaming fraction
    roofline = (c.weight_bytes_per_gpu() + c.kv_bytes_per_token_per_gpu() * batch * ctx) / (peak * 0.866)
    assert roofline < step.compute < 1.25 * roofline


def test_gemm_main_loop_exposes_a_wave_on_ampere_and_a_pipeline_fill_on_hopper():
    spec = lambda loop: GPU("x", {"bf16": 100e12}, 80e9, 1e12, 100, 1.0, 1.0, 1.0, 0.0, 0.0, loop)
    # 128 x 12800 x 6400: 100 tiles on 100 SMs, one wave, 100 K stages of 64
    op = Op("g", 2 * 128 * 12800 * 6400, 12800 * 6400 * 2, gemm=(128, 12800, 6400))
    comp, mem = op.flops / 100e12, op.bytes / 1e12
    assert spec("multistage").op_time(op) == pytest.approx(max(comp, mem) + min(comp, mem), rel=1e-12)
    assert spec("warp_specialized").op_time(op) == pytest.approx(max(comp, mem) + min(comp, mem) / 100, rel=1e-12)


def test_the_registries_are_what_the_scenario_keys_accept():
    assert set(GEMM_MAINLOOPS) == set(typing.get_args(GPUSpec.model_fields["gemm_mainloop"].annotation))
    assert set(ALLREDUCE_POLICIES) == set(typing.get_args(LLMParallel.model_fields["allreduce"].annotation))
    assert set(catalog.kernels()["decode_attention"]) - {"sources"} == set(
        typing.get_args(Serving.model_fields["decode_attention"].annotation))
    assert catalog.entry("gpus", "h100-sxm")["gemm_mainloop"] == "warp_specialized"
    assert catalog.entry("gpus", "a100-sxm-80g").get("gemm_mainloop", "multistage") == "multistage"


NV4 = AllReduceLink(8e-6, 396e9, 4.8e-6, 333e9, 12e-6, 239e9, True)
PCIE = AllReduceLink(10e-6, 27.8e9, 20e-6, 27.8e9, 20e-6, 27.8e9, False)


@pytest.mark.parametrize("n, nbytes, algorithm", [
    (2, 4 * MIB, "oneshot"),                  # two GPUs: always one-shot
    (4, 256 * 1024, "oneshot"), (4, 512 * 1024, "twoshot"),
    (8, 255 * 1024, "oneshot"), (8, 300 * 1024, "twoshot"),
    (4, 8 * MIB, "nccl"),                     # at the 8 MiB buffer: NCCL
    (3, 64 * 1024, "nccl"),                   # custom kernels support 2, 4, 6, 8 GPUs
])
def test_vllm_all_reduce_picks_its_algorithm_by_size_and_group(n, nbytes, algorithm):
    fixed, transfer = VLLMAllReduce().parts(nbytes, n, NV4)
    expected = {"oneshot": (4.8e-6, (n - 1) * nbytes / 333e9),
                "twoshot": (12e-6, 2 * (n - 1) / n * nbytes / 239e9),
                "nccl": (2 * 8e-6, 2 * (n - 1) / n * nbytes / 396e9)}[algorithm]
    assert (fixed, transfer) == pytest.approx(expected, rel=1e-12)


def test_vllm_all_reduce_needs_a_fully_connected_fabric_beyond_two_gpus():
    assert VLLMAllReduce().parts(64 * 1024, 4, PCIE)[0] == 2 * PCIE.latency  # NCCL
    assert VLLMAllReduce().parts(64 * 1024, 2, PCIE)[0] == PCIE.oneshot_latency


def test_nvlink4_custom_all_reduce_reproduces_the_published_h100_points():
    """vLLM PR #24111 (H100, in a CUDA graph): one-shot 10 us at TP4 for 0.5 MiB, 7 us at TP2;
    two-shot 43 us at TP4 for 4 MiB. The catalog's fit is within 15% of each."""
    link = build_cost(load_scenario({"model": "llama-2-70b", "hardware": {"gpu": "h100-sxm"},
                                     "parallel": {"tp": 4}, "workload": {"prompt_tokens": 100,
                                                                         "output_tokens": 10}})).allreduce_link
    oneshot = lambda n, size: link.oneshot_latency + (n - 1) * size / link.oneshot_bandwidth
    twoshot = lambda n, size: link.twoshot_latency + 2 * (n - 1) / n * size / link.twoshot_bandwidth
    for form, n, size, measured in ((oneshot, 4, 0.5 * MIB, 10e-6), (oneshot, 2, 0.5 * MIB, 7e-6),
                                    (oneshot, 4, 2 * MIB, 22e-6), (twoshot, 4, 4 * MIB, 43e-6)):
        assert form(n, size) == pytest.approx(measured, rel=0.15)
    # vLLM itself runs 0.5 MiB at TP4 two-shot (one-shot only below 512 KiB)
    assert VLLMAllReduce().time(0.5 * MIB, 4, link) == pytest.approx(twoshot(4, 0.5 * MIB), rel=1e-12)


def test_tp_decode_step_comm_is_two_all_reduces_per_layer_under_the_policy():
    c = cost_of(**{"model": "llama-2-70b", "parallel.tp": 4})
    nbytes = 16 * 8192 * 2
    assert c.comm_time(16) == pytest.approx(2 * 80 * (4.8e-6 + 3 * nbytes / 333e9), rel=1e-12)
    nccl = cost_of(**{"model": "llama-2-70b", "parallel.tp": 4, "parallel.allreduce": "nccl"})
    assert nccl.comm_time(16) == pytest.approx(2 * 80 * (2 * 8e-6 + 1.5 * nbytes / (450e9 * 0.88)), rel=1e-12)


def test_fused_moe_pads_each_experts_rows_to_the_tuned_block():
    c = cost_of(model="mixtral-8x7b", **{"parallel.tp": 2})
    moe = c.moe
    assert [moe.block_m(t) for t in (1, 40, 44, 64, 100, 200, 700, 5000)] == [16, 16, 32, 32, 32, 64, 64, 128]
    # one decode token: two experts hit, each padded to a 16-row block
    hit, rows = moe.padded_rows(1, 8, 2)
    assert (hit, rows) == pytest.approx((2.0, 32.0), rel=1e-12)
    # 512 tokens: all 8 experts, 128 rows each (BLOCK_SIZE_M 64 divides them)
    hit, rows = moe.padded_rows(512, 8, 2)
    assert rows == pytest.approx(hit * 64 * math.ceil(1024 / hit / 64), rel=1e-12)
    ops = {op.name: op for op in c._linear_ops(512)}
    assert ops["moe_w13"].gemm == (math.ceil(rows), 2 * 14336 // 2, 4096)
    assert ops["moe_w2"].gemm == (math.ceil(rows), 4096, 14336 // 2)
    # the w13 GEMM reads the weights of the experts hit, once
    assert ops["moe_w13"].bytes >= hit * 2 * 7168 * 4096 * 2
    # router, 4 routing kernels, 2 alignment kernels, w13, SiLU-and-mul, w2, moe_sum + 7 attention-side
    assert c.kernels_per_step() == 32 * (7 + 1 + 4 + 2 + 4) + KERNELS_PER_STEP


def test_paged_decode_attention_pays_its_latency_and_contiguous_the_gpus_figures():
    paged, contiguous = cost_of(), cost_of(**{"serving.decode_attention": "contiguous"})
    # one request of one token: far below the kernel floor; paged adds its 15 us latency
    assert paged.attention_time(1, 1, 0, 0, 0) == pytest.approx(32 * (3e-6 + 15e-6 + 1e-6), rel=1e-12)
    assert contiguous.attention_time(1, 1, 0, 0, 0) == pytest.approx(32 * (3e-6 + 1e-6), rel=1e-12)
    # a long context streams at the kernel's own fraction of peak (0.88) or the GPU's (0.866)
    kv = 2 * 8 * 128 * 2 * 100_000 + 2 * 32 * 128 * 2
    assert paged.attention_time(100_000, 1, 0, 0, 0) == pytest.approx(32 * (kv / (3350e9 * 0.88) + 16e-6), rel=1e-12)
    assert contiguous.attention_time(100_000, 1, 0, 0, 0) == pytest.approx(32 * (kv / (3350e9 * 0.866) + 1e-6),
                                                                           rel=1e-12)
