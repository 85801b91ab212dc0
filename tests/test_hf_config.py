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
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "kv_lora_rank": 512,
               "num_hidden_layers": 61, "n_routed_experts": 256, "n_shared_experts": 1}
GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "sliding_window": 128,
               "quantization_config": {"quant_method": "mxfp4"}}


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
        assert cost.weight_bytes_per_gpu() == (layers * (attn + mlp + 2 * h) + cfg["vocab_size"] * h) * 2  # bf16
        assert cost.kv_bytes_per_token_per_gpu() == 2 * layers * kv * d * 2
        assert sc.model.context_length == cfg["max_position_embeddings"] and sc.model.top_k == cfg.get(
            "num_experts_per_tok", 1)
    r = simulator.run({"model": str(folder), "parallel": {"tp": 2 if experts > 1 else 1},  # 93 GB of Mixtral: 2 GPUs
                       "workload": {"requests": 8, "prompt_tokens": 200, "output_tokens": 20}}, last_mile_cost=False)
    assert r.summary["status"] == "ok"


@pytest.mark.parametrize("cfg, field", [(DEEPSEEK_V3, "kv_lora_rank: MLA attention"),
                                        (GPT_OSS_20B, "layer_types: sliding-window layers"),
                                        ({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096},
                                         "sliding_window: a 4096-token sliding window"),
                                        ({**QWEN25_7B, "model_type": "falcon"}, "model_type 'falcon' is not read yet"),
                                        ({**QWEN25_7B, "hidden_size": "big"}, "hidden_size must be a positive whole"),
                                        ({k: v for k, v in QWEN25_7B.items() if k != "vocab_size"}, "lacks vocab_size")])
def test_what_is_not_modelled_is_one_line_naming_the_field(tmp_path, cfg, field):
    folder = _write(tmp_path, cfg)
    with pytest.raises(ConfigError, match=f"model: .*config.json: {field}" if "lacks" not in field
                       else f"model: .*config.json {field}") as err:
        simulator.load_scenario({"model": str(folder)})
    assert "\n" not in str(err.value)
