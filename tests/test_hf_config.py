"""A Hugging Face config.json runs as the model it describes: its shape read field by field (weight and
KV bytes from closed forms of the config), and what is not modelled yet a one-line error naming the field."""

from __future__ import annotations

import json

import pytest

import simulator
from simulator.errors import ConfigError
from simulator.pipelines.llm.pools import build_cost

# Published fields (the models' config.json on the Hugging Face hub), trimmed to what is read.
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
             "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
             "max_position_embeddings": 32768, "sliding_window": 131072, "use_sliding_window": False}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 32768,
           "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
               "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
               "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8,
               "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
               "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
GPT_OSS_20B = {"model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
               "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
               "num_local_experts": 32, "sliding_window": 128, "vocab_size": 201088,
               "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
             "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
             "max_position_embeddings": 8192}


GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000,
             "max_position_embeddings": 8192, "sliding_window": 4096}
LLAMA4_SCOUT = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48,
    "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202048,
    "max_position_embeddings": 10485760, "attention_chunk_size": 8192}}
LLAMA4_MAVERICK = {"model_type": "llama4", "text_config": {
    **LLAMA4_SCOUT["text_config"], "num_local_experts": 128, "interleave_moe_layer_step": 2,
    "max_position_embeddings": 1048576}}


def _write(tmp_path, cfg, name="model"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("cfg", [QWEN25_7B, MIXTRAL], ids=["qwen2.5-7b", "mixtral-8x7b"])
def test_a_config_runs_with_the_weights_and_kv_of_its_fields(tmp_path, cfg):
    folder = _write(tmp_path, cfg)
    for model in (str(folder), str(folder / "config.json")):
        sc = simulator.load_scenario({"model": model, "workload": {"requests": 8, "prompt_tokens": 200,
                                                                   "output_tokens": 20}})
        h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        d, layers, f = h // heads, cfg["num_hidden_layers"], cfg["intermediate_size"]
        experts = cfg.get("num_local_experts", 1)
        attn = h * (heads + 2 * kv) * d + heads * d * h
        mlp = 3 * h * f * experts + (h * experts if experts > 1 else 0)
        cost = build_cost(sc)
        assert cost.weight_bytes_per_gpu() == (layers * (attn + mlp + 2 * h) + 2 * cfg["vocab_size"] * h) * 2  # bf16
        assert cost.kv_bytes_per_token_per_gpu() == 2 * layers * kv * d * 2
        assert sc.model.context_length == cfg["max_position_embeddings"] and sc.model.top_k == cfg.get(
            "num_experts_per_tok", 1)
    r = simulator.run({"model": str(folder), "parallel": {"tp": 2 if experts > 1 else 1},  # 93 GB of Mixtral: 2 GPUs
                       "workload": {"requests": 8, "prompt_tokens": 200, "output_tokens": 20}}, last_mile_cost=False)
    assert r.summary["status"] == "ok"


def test_deepseek_gpt_oss_and_qwen_moe_configs_read_as_their_catalog_shapes(tmp_path):
    for cfg, catalog in ((DEEPSEEK_V3, "deepseek-v3"), (GPT_OSS_20B, "gpt-oss-20b")):
        got = simulator.load_scenario({"model": str(_write(tmp_path, cfg, catalog))}).model.model_dump()
        want = simulator.load_scenario({"model": catalog}).model.model_dump()
        keep = lambda spec: {k: v for k, v in spec.items() if k not in ("name", "sources", "tokenizer")}  # noqa: E731
        assert keep(got) == keep(want), catalog
    qwen = simulator.load_scenario({"model": str(_write(tmp_path, QWEN2_MOE, "qwen"))}).model
    assert (qwen.experts, qwen.top_k, qwen.ffn, qwen.shared_ffn) == (60, 4, 1408, 5632)


@pytest.mark.parametrize("quant, want", [({"quant_method": "awq", "bits": 4, "group_size": 128}, ("int4", "linear", 128)),
                                         ({"quant_method": "gptq", "bits": 4, "group_size": -1}, ("int4", "linear", 65536)),
                                         ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, ("nvfp4", "linear", 128))])
def test_4bit_checkpoints_are_read_as_their_format(tmp_path, quant, want):
    model = simulator.load_scenario({"model": str(_write(tmp_path, {**QWEN25_7B, "quantization_config": quant}))}).model
    assert (model.weights.format, model.weights.modules, model.weights.group_size) == want


@pytest.mark.parametrize("cfg, field", [({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096},
                                         "sliding_window: every layer slides over 4096"),
                                        ({**GPT_OSS_20B, "layer_types": ["sliding_attention"] * 3},
                                         "layer_types: 3 entries for 24 layers"),
                                        ({**QWEN25_7B, "quantization_config": {"quant_method": "compressed-tensors"}},
                                         "quantization_config: 'compressed-tensors' weights are not modelled"),
                                        ({**QWEN25_7B, "quantization_config": {"quant_method": "gptq", "bits": 8}},
                                         "quantization_config: 8-bit gptq weights are not modelled"),
                                        ({**QWEN25_7B, "model_type": "falcon"}, "model_type 'falcon' is not read yet"),
                                        ({**QWEN25_7B, "hidden_size": "big"}, "hidden_size must be a positive whole"),
                                        ({**DEEPSEEK_V3, "qk_rope_head_dim": 0}, "qk_rope_head_dim must be a positive"),
                                        ({k: v for k, v in QWEN25_7B.items() if k != "vocab_size"}, "lacks vocab_size")])
def test_what_is_not_modelled_is_one_line_naming_the_field(tmp_path, cfg, field):
    folder = _write(tmp_path, cfg)
    with pytest.raises(ConfigError, match=f"model: .*config.json: {field}" if "lacks" not in field
                       else f"model: .*config.json {field}") as err:
        simulator.load_scenario({"model": str(folder)})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cfg, total, active", [
    (GEMMA2_9B, 9.24e9, None),  # google/gemma-2-9b model page: 9.24B parameters
    (LLAMA4_SCOUT, 109e9, 17e9),  # Meta's Llama 4 model card: Scout 17B active / 109B total (with its vision encoder)
    (LLAMA4_MAVERICK, 400e9, 17e9)], ids=["gemma-2-9b", "llama-4-scout", "llama-4-maverick"])
def test_gemma_and_llama4_read_with_their_published_sizes(tmp_path, cfg, total, active):
    from simulator.workloads.llm import LLMShape

    model = simulator.load_scenario({"model": str(_write(tmp_path, cfg))}).model
    shape = LLMShape.from_spec(model)
    assert shape.params() == pytest.approx(total, rel=0.015)
    if active:
        assert shape.active_params() == pytest.approx(active, rel=0.02)
    text = cfg.get("text_config", cfg)
    if cfg["model_type"] == "gemma2":  # half its layers slide over 4,096 tokens; its LM head is the embedding
        assert (model.sliding_window, model.sliding_layers, model.tied_embeddings) == (4096, 21, True)
    else:  # three of four layers attend in 8,192-token chunks
        assert (model.sliding_window, model.sliding_layers, model.tied_embeddings) == (8192, 36, False)
        moe_layers = 48 // text["interleave_moe_layer_step"]
        assert (model.experts, model.shared_ffn, model.layers - model.dense_layers) == (
            text["num_local_experts"], 8192, moe_layers)
