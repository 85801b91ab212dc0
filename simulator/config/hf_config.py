"""A Hugging Face ``config.json`` as a model (``model: path/to/config.json`` or the folder holding it).

The fields are those of ``transformers``' configuration classes for each ``model_type``
(``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``, ``Qwen3Config``,
``Qwen2MoeConfig``/``Qwen3MoeConfig``, ``DeepseekV2Config``/``DeepseekV3Config`` (Kimi K2 ships the
latter), ``GptOssConfig``, ``Gemma2Config``/``Gemma3TextConfig`` and ``Llama4TextConfig``, the last two
also inside a multimodal config's ``text_config``): ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads`` (defaults to the heads: multi-head attention), ``head_dim`` (defaults to
hidden / heads), ``intermediate_size`` (an MoE's per-expert ``moe_intermediate_size`` where it has
one), ``vocab_size``, ``max_position_embeddings``, the experts (``num_local_experts``,
``num_experts`` or ``n_routed_experts``; ``num_experts_per_tok``), shared experts
(``shared_expert_intermediate_size``, or ``n_shared_experts`` of the per-expert size), leading dense
layers (``first_k_dense_replace``, or Qwen's ``mlp_only_layers``, of ``intermediate_size``), MLA
(``kv_lora_rank``, ``q_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``),
sliding-window layers (``layer_types``, Gemma's alternation, Llama 4's chunked layers, or every layer
with ``sliding_window`` and ``use_sliding_window``), a tied LM head (``tie_word_embeddings``), Llama 4's
interleaved MoE layers (``interleave_moe_layer_step``, dense ones of ``intermediate_size_mlp``) and
shared expert, and the checkpoint's ``quantization_config`` (FP8, MXFP4, NVFP4 and 4-bit AWQ/GPTQ are read as the
weights' format, on the MoE experts alone where the attention layers are left unconverted; the
activations and the KV cache stay at the scenario's ``dtype``, as vLLM's ``kv_cache_dtype: auto``
keeps the model's dtype). What lastmile does not model is a one-line
error naming the field: every layer sliding (the KV pool counts full-attention layers), other
quantization methods and bit widths.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .paths import exists, is_dir, is_file, shown

ARCHITECTURES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                 "deepseek_v3", "kimi_k2", "gpt_oss", "gemma2", "gemma3_text", "llama4_text")
"""``model_type`` values read (dense and mixture-of-experts decoders with grouped-query or latent attention);
a multimodal config (``gemma3``, ``llama4``) is read through its ``text_config``."""

TIED_BY_DEFAULT = ("gemma2", "gemma3_text")
"""Model types whose configuration class ties the LM head to the embedding unless told otherwise
(``Gemma2Config``/``Gemma3TextConfig``: ``tie_word_embeddings=True``; the others default to False)."""


def is_hf_config(value) -> bool:
    """Whether a ``model:`` value names a config.json, or a folder holding one."""
    if not isinstance(value, str) or value.endswith((".yaml", ".yml")):
        return False
    p = Path(value)
    return p.name == "config.json" or (p.suffix == "" and is_file(p / "config.json"))


def _field(cfg: dict, name: str, where: str, default=None):
    value = cfg.get(name, default)
    if value is None:
        raise ConfigError(f"{where} lacks {name}", path="model")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: {name} must be a positive whole number, got {value!r}", path="model")
    return value


def _fail(where: str, name: str, why: str):
    raise ConfigError(f"{where}: {name}: {why}", path="model")


def _layer_types(cfg: dict, layers: int):
    """Each layer's attention as the configuration class derives it where the config does not list it:
    Gemma 2 alternates local and global layers (``Gemma2Config``: layer i slides when (i + 1) % 2),
    Gemma 3 has five local to one global (``sliding_window_pattern`` 6), Llama 4 attends in chunks
    on its RoPE layers and globally on every fourth (``no_rope_layers``, ``Llama4TextConfig``)."""
    kind = cfg.get("model_type")
    if kind in ("gemma2", "gemma3_text"):
        pattern = cfg.get("sliding_window_pattern", 2 if kind == "gemma2" else 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if kind == "llama4_text" and cfg.get("attention_chunk_size"):
        rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        return ["sliding_attention" if r else "full_attention" for r in rope]
    return None


def _sliding(cfg: dict, where: str, layers: int) -> dict:
    """The sliding-window layers: ``layer_types`` (gpt-oss, Gemma), Llama 4's chunked layers (their chunk
    taken as a window: an upper bound on what a chunk's queries see), or every layer (a window shorter
    than the context)."""
    window = cfg.get("sliding_window") or cfg.get("attention_chunk_size")
    types = cfg.get("layer_types") or _layer_types(cfg, layers)
    if isinstance(types, list) and "sliding_attention" in types:
        if len(types) != layers:
            _fail(where, "layer_types", f"{len(types)} entries for {layers} layers")
        key = "sliding_window" if cfg.get("sliding_window") else "attention_chunk_size"
        return {"sliding_window": _field(cfg, key, where), "sliding_layers": types.count("sliding_attention")}
    context = cfg.get("max_position_embeddings") or 0
    if window and cfg.get("use_sliding_window", True) and window < context:
        _fail(where, "sliding_window", f"every layer slides over {window} of the {context}-token context: not modelled "
                                       "(the KV pool counts the full-attention layers' tokens)")
    return {}


def _weights(cfg: dict, where: str, moe: bool) -> dict:
    """The checkpoint's weight format (``quantization_config``), none for an unquantized checkpoint."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict):
        return {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":  # per-tensor or block-scaled (DeepSeek's 128 x 128): the weights a byte each
        return {"weights": {"format": "fp8"}}
    skipped = " ".join(map(str, quant.get("modules_to_not_convert") or quant.get("exclude_modules") or []))
    modules = "experts" if moe and "attn" in skipped else "linear"
    if method == "mxfp4":
        return {"weights": {"format": "mxfp4", "modules": modules}}
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "NVFP4":
        return {"weights": {"format": "nvfp4", "modules": modules}}
    if method in ("awq", "gptq"):
        bits = quant.get("bits", quant.get("w_bit"))
        if bits != 4:
            _fail(where, "quantization_config", f"{bits}-bit {method} weights are not modelled (4-bit are)")
        group = quant.get("group_size", quant.get("q_group_size", 128))
        group = group if isinstance(group, int) and group > 0 else 1 << 16  # -1: one scale per column
        return {"weights": {"format": "int4", "modules": modules, "group_size": min(group, 1 << 16)}}
    _fail(where, "quantization_config", f"{quant.get('quant_method')!r} weights are not modelled (fp8, mxfp4, "
                                        "NVFP4 modelopt, 4-bit awq and gptq are read)")


def _moe(cfg: dict, where: str, layers: int) -> dict:
    """Experts, shared experts and leading dense layers of an MoE config (empty for a dense one)."""
    key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)), None)
    experts = _field(cfg, key, where) if key else 1
    if experts == 1:
        return {}
    per_expert = "moe_intermediate_size" if "moe_intermediate_size" in cfg else "intermediate_size"
    ffn = _field(cfg, per_expert, where)
    out = {"experts": experts, "top_k": _field(cfg, "num_experts_per_tok", where), "ffn": ffn}
    if cfg.get("shared_expert_intermediate_size"):
        out["shared_ffn"] = _field(cfg, "shared_expert_intermediate_size", where)
    elif cfg.get("n_shared_experts"):
        out["shared_ffn"] = _field(cfg, "n_shared_experts", where) * ffn
    elif cfg.get("model_type") == "llama4_text":  # Llama4TextMoe always runs a shared expert of the experts' size
        out["shared_ffn"] = ffn
    dense, dense_ffn = cfg.get("first_k_dense_replace") or len(cfg.get("mlp_only_layers") or []), "intermediate_size"
    step = cfg.get("interleave_moe_layer_step")
    if isinstance(step, int) and step > 1:  # Llama 4 Maverick: an MoE layer every step-th, dense between
        dense, dense_ffn = layers - layers // step, "intermediate_size_mlp"
    if dense:
        if not isinstance(dense, int) or dense >= layers:
            _fail(where, "first_k_dense_replace", f"{dense!r} dense layers of {layers}")
        out.update(dense_layers=dense, dense_ffn=_field(cfg, dense_ffn, where))
    return out


def _mla(cfg: dict, where: str) -> dict:
    """MLA's widths (DeepSeek-V2/V3, Kimi K2); its head_dim is the query's nope + rope width."""
    if not cfg.get("kv_lora_rank"):
        return {}
    mla = {"kv_lora_rank": _field(cfg, "kv_lora_rank", where), "rope_head_dim": _field(cfg, "qk_rope_head_dim", where),
           "nope_head_dim": _field(cfg, "qk_nope_head_dim", where), "v_head_dim": _field(cfg, "v_head_dim", where),
           "q_lora_rank": _field(cfg, "q_lora_rank", where) if cfg.get("q_lora_rank") is not None else 0}
    return {"mla": mla, "head_dim": mla["rope_head_dim"] + mla["nope_head_dim"]}


def spec_from_hf(value: str, base_dir: Path) -> dict:
    """The ``llms`` catalog fields of the model a config.json describes (with its sources)."""
    p = Path(value)
    if not p.is_absolute() and not exists(p):
        p = base_dir / p
    if is_dir(p):
        p = p / "config.json"
    where = shown(p)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read ({exc.strerror or exc})", path="model") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON ({str(exc).splitlines()[0][:100]})", path="model") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} is not a config.json (a JSON object)", path="model")
    wrapper = cfg.get("model_type")
    if wrapper in ("gemma3", "llama4") and isinstance(cfg.get("text_config"), dict):  # a multimodal model's decoder
        cfg = {"quantization_config": cfg.get("quantization_config"), **cfg["text_config"]}
        cfg.setdefault("model_type", f"{wrapper}_text")
    kind = cfg.get("model_type")
    if kind not in ARCHITECTURES:
        raise ConfigError(f"{where}: model_type {kind!r} is not read yet; known: {', '.join(ARCHITECTURES)}",
                          path="model")
    heads = _field(cfg, "num_attention_heads", where)
    hidden = _field(cfg, "hidden_size", where)
    layers = _field(cfg, "num_hidden_layers", where)
    spec = {
        "name": str(cfg.get("_name_or_path") or p.parent.name or "hf-model"),
        "layers": layers, "hidden": hidden, "heads": heads,
        "kv_heads": _field(cfg, "num_key_value_heads", where, heads),
        "head_dim": _field(cfg, "head_dim", where, hidden // heads),
        "ffn": _field(cfg, "intermediate_size", where),
        "vocab": _field(cfg, "vocab_size", where),
        "context_length": _field(cfg, "max_position_embeddings", where),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", kind in TIED_BY_DEFAULT)),
        "sources": {"shape": f"{where} (model_type {kind})"},
    }
    moe = _moe(cfg, where, layers)
    spec.update(moe)
    spec.update(_mla(cfg, where))
    spec.update(_sliding(cfg, where, layers))
    spec.update(_weights(cfg, where, bool(moe)))
    return spec
