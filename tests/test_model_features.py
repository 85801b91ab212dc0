"""What today's served models are made of, each against a closed form: MLA's latent KV cache and
attention (DeepSeek-V3), sliding-window layers and MXFP4 experts (gpt-oss), shared experts and
leading dense layers, 4-bit checkpoints, and expert parallelism's whole experts and busiest rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simulator
from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.pipelines.llm.pools import build_cost
from simulator.workloads.expert_load import busiest_rank_rows, eplb_shares, expert_loads
from simulator.workloads.llm import LLMShape, window_pairs
from simulator.workloads.weights import bits_per_weight

WORKLOAD = {"requests": 16, "prompt_tokens": 300, "output_tokens": 30}
DSV3 = {"model": "deepseek-v3", "dtype": "fp8", "hardware": {"gpu": "h200"}, "parallel": {"tp": 8}, "workload": WORKLOAD}
GPT_OSS = {"model": "gpt-oss-20b", "hardware": {"gpu": "h100-sxm"}, "workload": WORKLOAD}


def _cost(raw: dict, **parallel):
    return build_cost(load_scenario({**raw, "parallel": {**raw.get("parallel", {}), **parallel}}))


def test_deepseek_v3_has_its_published_parameter_counts():
    shape = LLMShape.from_spec(load_scenario(DSV3).model)
    # DeepSeek-V3 technical report (arXiv:2412.19437), abstract: 671B total, 37B activated per token
    assert shape.params() / 1e9 == pytest.approx(671, rel=0.002)
    assert shape.active_params() / 1e9 == pytest.approx(37, rel=0.02)


def test_gpt_oss_has_its_published_parameter_counts_and_checkpoint_size():
    sc = load_scenario(GPT_OSS)
    shape = LLMShape.from_spec(sc.model)
    # gpt-oss model card (OpenAI, 2025-08-05), Table 1: 20.91B total, 3.61B active (the embedding not counted)
    assert shape.params() / 1e9 == pytest.approx(20.91, rel=0.002)
    assert (shape.active_params() - shape.vocab * shape.hidden) / 1e9 == pytest.approx(3.61, rel=0.01)
    # the experts at 4.25 bits (MXFP4), everything else bf16: the closed form of the config (the final norm left out)
    h, f, e, layers = 2880, 2880, 32, 24
    experts = layers * 3 * h * f * e
    rest = shape.params() - experts - h
    assert build_cost(sc).weight_bytes_per_gpu() == pytest.approx(experts * 4.25 / 8 + rest * 2, rel=1e-12)


def test_mla_caches_one_latent_per_token_and_layer_on_every_tp_rank():
    for tp in (1, 8):
        # (kv_lora_rank + qk_rope_head_dim) elements per layer, fp8 here; not split by TP (one latent "head")
        assert _cost(DSV3, tp=tp).kv_bytes_per_token_per_gpu() == 61 * (512 + 64) * 1


def test_mla_decode_attention_reads_the_latent_once_per_context_token():
    cost = _cost(DSV3)
    flop, d_kv, d_q, *_ = cost.decode_terms
    gpu = cost.gpu
    bw = gpu.hbm_bandwidth * cost.attention.bandwidth_fraction
    assert d_kv == pytest.approx(576 * 1 / bw, rel=1e-12)  # a 576-byte latent per token per layer (fp8)
    qh = 128 // 8
    assert flop == pytest.approx(2 * qh * (576 + 512) / gpu.flops_rate("bf16"), rel=1e-12)  # QK over 576, PV over 512


def test_sliding_layers_attend_to_the_window_and_reserve_it_per_sequence():
    cost = _cost(GPT_OSS)
    n, ctx = 64, 64 * 4000.0
    full = cost.attention_time(ctx, n, 0, 0, 0)
    # half the layers read the whole context, half read 128 tokens of each
    one = cost._layer_attention
    assert full == pytest.approx(12 * one(ctx, n, 0, 0, 0, 1) + 12 * one(n * 128.0, n, 0, 0, 0, 1), rel=1e-12)
    # the pool counts the 12 full-attention layers' KV per token; the sliding ones hold a window and a block per slot
    assert cost.kv_bytes_per_token_per_gpu() == 12 * 2 * 8 * 64 * 2
    assert cost.sliding_kv_bytes(256, 16) == 256 * (128 + 16) * 12 * 2 * 8 * 64 * 2


@given(st.lists(st.tuples(st.integers(0, 400), st.integers(1, 300)), min_size=1, max_size=4), st.integers(1, 256))
def test_window_pairs_count_each_querys_visible_keys(chunks, window):
    pairs = sum(min(j, window) for p, n in chunks for j in range(p + 1, p + n + 1))
    got, keys = window_pairs(chunks, window)
    assert got == pytest.approx(pairs, rel=1e-12)
    assert keys == sum(min(p, window) + n for p, n in chunks)


def test_shared_experts_and_dense_layers_are_in_the_weights():
    sc = load_scenario(DSV3)
    shape = LLMShape.from_spec(sc.model)
    plain = LLMShape(**{**shape.__dict__, "shared_ffn": 0, "dense_layers": 0, "dense_ffn": 0})
    h = 7168
    # one 2048-wide shared expert in each of the 58 MoE layers; 3 dense layers of 18432 for routed ones
    moe = 3 * h * 2048 * 256 + h * 256 + 3 * h * 2048
    assert shape.params() - plain.params() == 61 * 3 * h * 2048 + 3 * (3 * h * 18432 - moe)


@pytest.mark.parametrize("fmt, group, bits", [("mxfp4", 128, 4.25), ("nvfp4", 128, 4.5), ("int4", 128, 4 + 20 / 128),
                                              ("int4", 64, 4 + 20 / 64), ("fp8", 128, 8.0)])
def test_checkpoint_formats_have_their_bits_per_weight(fmt, group, bits):
    assert bits_per_weight(fmt, group) == bits


def test_every_format_a_model_may_declare_has_its_bits():
    import typing

    from simulator.config.models import WeightQuant

    formats = typing.get_args(WeightQuant.model_fields["format"].annotation)
    assert formats and all(0 < bits_per_weight(f) <= 8 for f in formats)


def test_a_4bit_checkpoint_reads_fewer_weight_bytes_per_decode_step():
    raw = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "workload": WORKLOAD}
    base = build_cost(load_scenario(raw))
    spec = load_scenario(raw).model.model_dump()
    awq = build_cost(load_scenario({**raw, "model": {**spec, "weights": {"format": "int4"}}}))
    # the linear layers' weights at 4.16 bits, embeddings and LM head at bf16
    shape = base.shape
    linear = shape.layers * sum(shape.layer_params())
    saved = linear * (2 - (4 + 20 / 128) / 8)
    assert base.weight_bytes_per_gpu() - awq.weight_bytes_per_gpu() == pytest.approx(saved, rel=1e-9)
    assert awq.decode_time(8 * 500.0, 8) < 0.5 * base.decode_time(8 * 500.0, 8)  # decode is weight-bandwidth bound


def test_busiest_rank_is_the_balls_into_bins_maximum():
    assert busiest_rank_rows(8000, None, 8, 10**9) == pytest.approx(1000 + math.sqrt(2 * 1000 * 7 / 8 * math.log(8)))
    assert busiest_rank_rows(8, None, 8, 1) == 1.0  # one token: at most min(top_k, local experts) of its pairs per rank
    assert busiest_rank_rows(100, None, 1, 10**9) == 100.0


def test_skewed_experts_load_the_busiest_rank_more_and_eplb_evens_it_out():
    assert np.allclose(expert_loads(8, 0.0), 1 / 8)
    loads = np.array([0.4, 0.2, 0.2, 0.2])
    # two replicas go to the expert with the most load per replica (expert 0 twice), then the six replicas,
    # heaviest first, to the least loaded rank with a slot left (3 each): 0.2+0.2+0.133 and 0.2+0.133+0.133
    assert np.allclose(eplb_shares(loads, 2, 2), [0.2 + 0.2 + 0.4 / 3, 0.2 + 0.8 / 3])
    mixtral = {"model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm"}, "workload": WORKLOAD,
               "parallel": {"tp": 4, "expert_parallel": True}}
    flops = {}
    for name, extra in (("uniform", {}), ("skewed", {"expert_skew": 1.0}),
                        ("eplb", {"expert_skew": 1.0, "eplb": True, "redundant_experts": 4})):
        cost = _cost(mixtral, **extra)
        flops[name] = {op.name: op for op in cost._moe_ops(512)}["moe_w2"].flops
        if name == "eplb":  # each rank holds 3 of the 12 physical experts: the replicas' weights in memory too
            expert = 3 * 4096 * 14336 * 2  # one expert of one layer, bf16
            assert cost.weight_bytes_per_gpu() - _cost(mixtral).weight_bytes_per_gpu() == pytest.approx(
                32 * 4 * expert / 4, rel=1e-9)
    assert flops["uniform"] < flops["skewed"] and flops["eplb"] < flops["skewed"]


def test_expert_parallelism_holds_whole_experts_and_waits_for_the_busiest_rank():
    mixtral = {"model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm"}, "parallel": {"tp": 4}, "workload": WORKLOAD}
    tp, ep = _cost(mixtral), _cost(mixtral, expert_parallel=True)
    assert ep.weight_bytes_per_gpu() == pytest.approx(tp.weight_bytes_per_gpu(), rel=1e-12)  # 2 whole experts = 1/4 of 8
    moe = {op.name: op for op in ep._moe_ops(512)}
    # 512 tokens x top-2 over 4 ranks: the busiest rank's pairs, each running the whole 14336-wide expert
    rows = busiest_rank_rows(1024, None, 4, 1024)
    assert moe["moe_w2"].flops >= 2 * rows * 4096 * 14336
    assert {op.name: op for op in tp._moe_ops(512)}["moe_w2"].flops < moe["moe_w2"].flops  # imbalance costs


def test_dp_attention_caches_each_token_once_and_holds_attention_whole():
    dp = {**DSV3["parallel"], "expert_parallel": True, "dp_attention": True}
    tp, dpa = _cost(DSV3, expert_parallel=True), _cost({**DSV3, "parallel": dp})
    # TP caches the latent on all 8 ranks; DP attention caches it on its request's rank: 8x the tokens
    assert dpa.kv_bytes_per_token_per_gpu() * 8 == tp.kv_bytes_per_token_per_gpu() == 61 * 576
    shape = dpa.shape
    split, whole = shape.attention_params()
    h = 7168
    moe = 3 * h * 2048 * 256 / 8 + h * 256 + 3 * h * 2048  # experts split, router and the shared expert whole
    per_layer = split + whole + moe + 2 * h
    want = 61 * per_layer + 3 * (3 * h * 18432 - moe) + 2 * shape.vocab * h  # fp8: a byte each
    assert dpa.weight_bytes_per_gpu() == pytest.approx(want, rel=1e-12)
    # the busiest rank runs its share of the decodes' attention: an eighth of the context, whole heads
    one = dpa._layer_attention
    assert dpa.attention_time(8 * 2000.0, 8, 0, 0, 0) == pytest.approx(61 * one(2000.0, 1, 0, 0, 0, 1), rel=1e-12)


@pytest.mark.parametrize("change, message", [
    ({**DSV3, "parallel": {"tp": 8, "dp_attention": True}}, "parallel.dp_attention: .* set parallel.expert_parallel"),
    ({**DSV3, "parallel": {"tp": 8, "expert_skew": 1.0}}, "parallel.expert_skew: .* set parallel.expert_parallel"),
    ({**DSV3, "parallel": {"tp": 8, "expert_parallel": True, "redundant_experts": 8}},
     "parallel.redundant_experts: .* set parallel.eplb"),
    ({**DSV3, "parallel": {"tp": 8, "expert_parallel": True, "eplb": True, "redundant_experts": 5}},
     "parallel.redundant_experts: 256 experts \\+ 5 redundant do not fill the 8 ranks"),
    ({"model": "llama-3-8b", "parallel": {"expert_parallel": True}}, "parallel.expert_parallel: .* is dense"),
    ({"model": "mixtral-8x7b", "parallel": {"tp": 16, "expert_parallel": True}, "hardware": {"node_link": "ib-400g"}},
     "parallel.tp: tp=16 does not split the 8 experts"),
])
def test_expert_parallelism_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        simulator.run({**change, "workload": WORKLOAD}, last_mile_cost=False)


@pytest.mark.parametrize("raw", [DSV3, GPT_OSS, {**GPT_OSS, "parallel": {"tp": 2, "expert_parallel": True}},
                                 {**DSV3, "parallel": {"tp": 8, "expert_parallel": True, "dp_attention": True}}],
                         ids=["deepseek-v3-tp8", "gpt-oss-20b", "gpt-oss-20b-ep2", "deepseek-v3-dp8-ep8"])
def test_the_models_serve(raw):
    r = simulator.run(raw, last_mile_cost=False)
    assert r.summary["status"] == "ok" and r.summary["requests_completed"] == 16


def test_weights_per_gpu_are_what_vllm_loads():
    # vLLM's log of Llama-3.1-8B on one GPU: "model weights take 14.99GiB" (oracle-samples/
    # oci-data-science-ai-samples, ai-quick-actions troubleshooting guide, the KV-cache example):
    # the embedding and the LM head both on the GPU
    cost = build_cost(load_scenario({"model": "llama-3.1-8b", "workload": WORKLOAD}))
    assert cost.weight_bytes_per_gpu() / 2**30 == pytest.approx(14.99, rel=0.005)
    # with PP each stage holds one of them: the larger stage's layers and one vocabulary matrix
    pp = build_cost(load_scenario({"model": "llama-3.1-8b", "parallel": {"pp": 2}, "workload": WORKLOAD}))
    shape = pp.shape
    layer = sum(shape.layer_params()) + 2 * shape.hidden
    assert pp.weight_bytes_per_gpu() == (16 * layer + shape.vocab * shape.hidden) * 2


def test_nvfp4_weights_multiply_at_fp4_where_the_gpu_has_fp4_tensor_cores():
    raw = {"model": "llama-3-8b", "workload": WORKLOAD}
    spec = load_scenario(raw).model.model_dump()
    nvfp4 = {**spec, "weights": {"format": "nvfp4"}}
    b200 = build_cost(load_scenario({**raw, "model": nvfp4, "hardware": {"gpu": "b200"}}))
    h100 = build_cost(load_scenario({**raw, "model": nvfp4, "hardware": {"gpu": "h100-sxm"}}))
    assert b200.gemm_dtype() == "fp4" and h100.gemm_dtype() == "bf16"  # Hopper has no FP4 tensor cores
    gpu = b200.gpu
    assert gpu.flops_rate("fp4") == 9000e12 * gpu.matmul_fp8_eff  # the FP8 GEMM fraction of the FP4 peak
    # a compute-bound prefill: FP4 math 4x bf16's peak, the attention and the small kernels unchanged
    bf16 = build_cost(load_scenario({**raw, "hardware": {"gpu": "b200"}}))
    assert b200.linear_time(8192) < 0.5 * bf16.linear_time(8192)
    mx = build_cost(load_scenario({**raw, "model": {**spec, "weights": {"format": "mxfp4"}}, "hardware": {"gpu": "b200"}}))
    assert mx.gemm_dtype() == "bf16"  # weight-only: dequantized in the kernel
