"""A Hugging Face ``config.json`` as a model (``model: path/to/config.json`` or the folder holding it).

The fields are those of ``transformers``' configuration classes for each ``model_type``
(``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``, ``Qwen3Config``,
``Qwen2MoeConfig``/``Qwen3MoeConfig``): ``num_hidden_layers``, ``hidden_size``,
``num_attention_heads``, ``num_key_value_heads`` (defaults to the heads: multi-head attention),
``head_dim`` (defaults to hidden / heads), ``intermediate_size`` (an MoE's per-expert
``moe_intermediate_size`` where it has one), ``vocab_size``, ``max_position_embeddings``,
``num_local_experts`` or ``num_experts`` and ``num_experts_per_tok``. What lastmile does not model
yet is a one-line error naming the field: MLA attention (``kv_lora_rank``: DeepSeek-V2/V3, Kimi),
sliding-window attention shorter than the context (``sliding_window`` with ``use_sliding_window``,
or gpt-oss's ``layer_types``), shared experts (``shared_expert_intermediate_size``,
``n_shared_experts``), and weight quantization other than FP8 (``quantization_config``: MXFP4,
NVFP4, AWQ, GPTQ); an FP8 checkpoint runs with the scenario's ``dtype: fp8``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError

ARCHITECTURES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
"""``model_type`` values read (dense and mixture-of-experts decoders with grouped-query attention)."""


def is_hf_config(value) -> bool:
    """Whether a ``model:`` value names a config.json, or a folder holding one."""
    if not isinstance(value, str) or value.endswith((".yaml", ".yml")):
        return False
    p = Path(value)
    return p.name == "config.json" or (p.suffix == "" and (p / "config.json").is_file())


def _field(cfg: dict, name: str, where: str, default=None):
    value = cfg.get(name, default)
    if value is None:
        raise ConfigError(f"{where} lacks {name}", path="model")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: {name} must be a positive whole number, got {value!r}", path="model")
    return value


def _unsupported(cfg: dict, where: str) -> None:
    """A one-line error for the first feature of the config that lastmile does not model."""
    context = cfg.get("max_position_embeddings") or 0
    window = cfg.get("sliding_window")
    checks = [
        ("kv_lora_rank", cfg.get("kv_lora_rank"), "MLA attention (DeepSeek-V2/V3, Kimi): its compressed KV and "
                                                 "attention cost are not modelled yet"),
        ("layer_types", cfg.get("layer_types") and "sliding_attention" in cfg.get("layer_types"),
         "sliding-window layers (gpt-oss, Gemma) are not modelled yet"),
        ("sliding_window", window and cfg.get("use_sliding_window", True) and window < context,
         f"a {window}-token sliding window shorter than the {context}-token context is not modelled yet"),
        ("shared_expert_intermediate_size", cfg.get("shared_expert_intermediate_size"),
         "shared experts are not modelled yet"),
        ("n_shared_experts", cfg.get("n_shared_experts"), "shared experts are not modelled yet"),
    ]
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() != "fp8":
        checks.append(("quantization_config", True, f"{quant.get('quant_method')!r} weights are not modelled yet "
                                                    "(FP8 runs with dtype: fp8)"))
    for name, present, why in checks:
        if present:
            raise ConfigError(f"{where}: {name}: {why}", path="model")


def spec_from_hf(value: str, base_dir: Path) -> dict:
    """The ``llms`` catalog fields of the model a config.json describes (with its sources)."""
    p = Path(value)
    if not p.is_absolute() and not p.exists():
        p = base_dir / p
    if p.is_dir():
        p = p / "config.json"
    where = str(p)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read ({exc.strerror or exc})", path="model") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON ({str(exc).splitlines()[0][:100]})", path="model") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} is not a config.json (a JSON object)", path="model")
    kind = cfg.get("model_type")
    _unsupported(cfg, where)  # a feature not modelled names itself, whatever the architecture
    if kind not in ARCHITECTURES:
        raise ConfigError(f"{where}: model_type {kind!r} is not read yet; known: {', '.join(ARCHITECTURES)}",
                          path="model")
    heads = _field(cfg, "num_attention_heads", where)
    hidden = _field(cfg, "hidden_size", where)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 1
    moe = experts > 1
    spec = {
        "name": str(cfg.get("_name_or_path") or p.parent.name or "hf-model"),
        "layers": _field(cfg, "num_hidden_layers", where), "hidden": hidden, "heads": heads,
        "kv_heads": _field(cfg, "num_key_value_heads", where, heads),
        "head_dim": _field(cfg, "head_dim", where, hidden // heads),
        "ffn": _field(cfg, "moe_intermediate_size" if moe and "moe_intermediate_size" in cfg else "intermediate_size",
                      where),
        "vocab": _field(cfg, "vocab_size", where),
        "context_length": _field(cfg, "max_position_embeddings", where),
        "experts": _field(cfg, "num_local_experts" if "num_local_experts" in cfg else "num_experts", where, 1),
        "top_k": _field(cfg, "num_experts_per_tok", where, 1) if moe else 1,
        "sources": {"shape": f"{where} (model_type {kind})"},
    }
    return spec
