"""``lastmile schema``: the scenario schema of each kind, as JSON Schema or as the docs/scenarios.md reference.

Both are generated from the pydantic models in ``simulator.config`` (types, defaults, bounds,
allowed values) plus one sentence per key (``field_docs``), so the reference cannot drift from
the code: a test compares the committed docs/scenarios.md with ``render_markdown()``.
"""

from __future__ import annotations

import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from ..kinds import KINDS as REGISTRY
from .field_docs import DIT_MODEL_KEYS, FIELD_DOCS

HELP = "print the JSON Schema of a scenario kind (llm, dit, token_pipeline), or the Markdown key reference"

KINDS = tuple(REGISTRY)
#: SI unit of each quantity dimension (values may be written with any unit of that dimension).
UNITS = {"time": "s", "bytes": "B", "bandwidth": "B/s", "flops": "FLOP/s", "flop": "FLOP", "rate": "1/s"}
_BOUNDS = {"_positive": "> 0", "_non_negative": ">= 0"}
_OPS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
#: Keys the loader resolves from the catalog before validation: what a user writes and its default.
CATALOG_REFS = {
    "Hardware.gpu": ("gpus", "h100-sxm"), "Hardware.gpu_link": ("links", "the GPU's gpu_link"),
    "Hardware.host_link": ("links", "the GPU's host_link"), "Hardware.node_link": ("links", "null"),
    "Hardware.client_link": ("links", "client-lan"), "Hardware.cpu": ("cpus", "the engine profile's cpu"),
    "Serving.engine": ("engines", "reference"),
    "Hardware.node": ("nodes", "null (the flat model: GPU ports only)"),
    "LLMScenario.model": ("llms", "llama-3-8b"), "DiTScenario.model": ("dits", "required"),
    "TokenPipelineScenario.model": ("llms or dits", "required"),
    "Speculative.draft_model": ("llms", "null (the method needs none, or it is an error)"),
    "Disaggregation.kv_link": ("links", "null (the topology's route between the GPUs)"),
    "KVOffload.link": ("links", "null (the GPU's host link)"),
}


@dataclass
class Row:
    """One scenario key of the reference table."""

    path: str
    type: str
    default: str
    unit: str
    allowed: str
    description: str


def scenario_models() -> dict[str, type[BaseModel]]:
    """The pydantic model of each scenario kind, from the registry of kinds."""
    return {name: kind.scenario for name, kind in REGISTRY.items()}


def _doc_key(owner: type, name: str) -> str | None:
    for cls in owner.__mro__:
        key = f"{cls.__name__}.{name}"
        if key in FIELD_DOCS or key in CATALOG_REFS:
            return key
    return None


def description(owner: type[BaseModel], name: str) -> str:
    """The key's Field description if the model has one, else its sentence in field_docs ('' if none)."""
    info = owner.model_fields[name]
    if info.description:
        return " ".join(info.description.split())
    key = _doc_key(owner, name)
    return FIELD_DOCS.get(key, "") if key else ""


def _strip(ann: Any) -> tuple[Any, list]:
    """Annotated[T, *meta] -> (T, meta); anything else -> (ann, [])."""
    if typing.get_origin(ann) is typing.Annotated:
        base, *meta = typing.get_args(ann)
        inner, more = _strip(base)
        return inner, more + meta
    return ann, []


def _dimension(meta: list) -> str | None:
    """The unit dimension of a quantity type (its BeforeValidator parses with ``units.parse(v, dim)``)."""
    for m in _flat(meta):
        if isinstance(m, BeforeValidator):
            for cell in getattr(m.func, "__closure__", None) or ():
                if isinstance(cell.cell_contents, str) and cell.cell_contents in UNITS:
                    return cell.cell_contents
    return None


def _flat(meta: list) -> list:
    """Metadata with any nested ``Field(...)`` (a FieldInfo inside Annotated) opened up."""
    out = []
    for m in meta:
        out += _flat(m.metadata) if isinstance(m, FieldInfo) else [m]
    return out


def _closure_limit(func) -> str | None:
    """'<= 1 day (86400 s)' from a validator made by ``quantities._at_most(limit, shown)`` (or _at_least)."""
    qual = getattr(func, "__qualname__", "")
    op = "<=" if qual.startswith("_at_most.") else ">=" if qual.startswith("_at_least.") else None
    shown = [c.cell_contents for c in getattr(func, "__closure__", None) or () if isinstance(c.cell_contents, str)]
    return f"{op} {shown[0]}" if op and shown else None


def _bounds(meta: list) -> list[str]:
    out = []
    for m in _flat(meta):
        if isinstance(m, AfterValidator) and getattr(m.func, "__name__", "") in _BOUNDS:
            out.append(_BOUNDS[m.func.__name__])
        elif isinstance(m, AfterValidator) and (limit := _closure_limit(m.func)):
            out.append(limit)
        for attr, op in _OPS.items():
            v = getattr(m, attr, None)
            if v is not None and not callable(v):
                out.append(f"{op} {v:g}" if isinstance(v, float) else f"{op} {v}")
    return out


def _models_in(ann: Any) -> list[type[BaseModel]]:
    ann, _ = _strip(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in typing.get_args(ann) for m in _models_in(a)]


def type_text(ann: Any, meta: list = ()) -> tuple[str, str, str]:
    """(type, SI unit, allowed values) of an annotation, in words."""
    ann, more = _strip(ann)
    meta = list(meta) + more
    origin = typing.get_origin(ann)
    if origin is Literal:
        vals = typing.get_args(ann)
        kind = "int" if all(isinstance(v, int) for v in vals) else "string"
        return kind, "", " | ".join(str(v) for v in vals)
    if origin is typing.Union or type(ann).__name__ == "UnionType":
        parts = [a for a in typing.get_args(ann) if a is not type(None)]
        texts = [type_text(a, meta) for a in parts]
        t = " or ".join(dict.fromkeys(x[0] for x in texts))
        if len(parts) < len(typing.get_args(ann)):
            t += " or null"
        unit = next((x[1] for x in texts if x[1]), "")
        allowed = " | ".join(x[2] for x in texts if x[2])
        return t, unit, allowed
    if origin in (dict, typing.Dict) or ann is dict:
        return "mapping", "", ""
    if origin in (list, tuple) or ann in (list, tuple):
        return "list", "", ""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "mapping", "", ""
    dim = _dimension(meta)
    bounds = _bounds(meta)
    name = {bool: "bool", int: "int", float: "number", str: "string"}.get(ann, getattr(ann, "__name__", str(ann)))
    if dim:
        name = f"{dim} quantity"
    return name + (" " + ", ".join(bounds) if bounds else ""), UNITS.get(dim, ""), ""


def _default_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return ""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value) if value else ("{}" if isinstance(value, dict) else "[]")
    return str(value)


def rows_of(model: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None,
            from_catalog: bool = False) -> list[Row]:
    """Every key under ``model`` in field order, nested sections after their own row."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ref = CATALOG_REFS.get(_doc_key(model, name) or "")
        t, unit, allowed = type_text(info.annotation, info.metadata)
        section = bool(_models_in(info.annotation)) and not typing.get_args(_strip(info.annotation)[0])
        if ref:
            default = ref[1]
        elif section:
            default = ""  # a section: its keys carry the defaults
        elif from_catalog:
            default = "from the catalog"
        elif defaults is not None:
            default = _default_text(getattr(defaults, name))
        elif info.is_required():
            default = "required"
        else:
            default = _default_text(info.get_default(call_default_factory=True))
        if ref:
            t = f"catalog name ({ref[0]}), profile YAML or mapping" if ref[0] != "llms or dits" else \
                "catalog name (llms or dits) or mapping"
        out.append(Row(path, t, default, unit, allowed, description(model, name)))
        nested_defaults = info.default if isinstance(info.default, BaseModel) else None
        if defaults is not None and isinstance(getattr(defaults, name), BaseModel):
            nested_defaults = getattr(defaults, name)
        for sub in _models_in(info.annotation):
            out += rows_of(sub, f"{path}.", nested_defaults, from_catalog or ref is not None)
    return out


def reference_rows() -> dict[str, list[Row]]:
    """The key reference of each scenario kind."""
    return {kind: rows_of(model) for kind, model in scenario_models().items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if text else ""


def _table(rows: list[Row]) -> list[str]:
    lines = ["| key | type | default | unit | allowed | description |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| `{r.path}` | {_cell(r.type)} | {_cell(r.default and f'`{r.default}`')} | {_cell(r.unit)} "
                     f"| {_cell(r.allowed)} | {_cell(r.description)} |")
    return lines


def render_markdown() -> str:
    """docs/scenarios.md: every scenario key of every kind, generated from the models."""
    out = [
        "# Scenario reference",
        "",
        "<!-- Generated by `lastmile schema --markdown > docs/scenarios.md`; do not edit by hand. -->",
        "",
        "Every key a scenario YAML may hold, for each `kind`, generated from the validating models",
        "(`simulator/config/`). Unknown keys are errors. Quantities take a unit as a string",
        "(`\"8 us\"`, `\"80 GiB\"`, `\"3.35 TB/s\"`, `\"989 TFLOPS\"`, `\"4/s\"`); a bare number is in the SI",
        "unit of the *unit* column. Catalog names (`lastmile catalog`) can be given where the type says",
        "so, and any of their fields overridden in place (`hardware: {gpu: {base: h100-sxm, memory: 94 GB}}`)",
        "or with `--set hardware.gpu.memory=\"94 GB\"`. A *default* of `from the catalog` means the named",
        "entry provides it. `lastmile schema KIND` prints the same as JSON Schema.",
        "",
    ]
    for kind, rows in reference_rows().items():
        out += [f"## kind: {kind}", ""]
        out += _table(rows)
        out.append("")
        if kind == "dit":
            out += ["### The DiT model mapping", "",
                    "`model` in a `dit` scenario (and a DiT `model` of a `token_pipeline`) is validated by",
                    "the pydantic model `DiTArch` (`simulator/config/dit_arch.py`) once the catalog entry it",
                    "names is merged in. Its keys:", "",
                    "| key | type | default | description |", "| --- | --- | --- | --- |"]
            for key, t, default, text in DIT_MODEL_KEYS:
                out.append(f"| `model.{key}` | {_cell(t)} | {_cell(default and f'`{default}`')} | {_cell(text)} |")
            out.append("")
    return "\n".join(out)


# ---- JSON Schema -------------------------------------------------------------------------------

def _annotate(schema: dict, model: type[BaseModel], defs: dict) -> None:
    """Add descriptions, units and what the loader accepts beyond the resolved form to ``schema``."""
    props = schema.get("properties", {})
    for name, info in model.model_fields.items():
        prop = props.get(name)
        if prop is None:
            continue
        text = description(model, name)
        if text:
            prop.setdefault("description", text)
        _, unit, _ = type_text(info.annotation, info.metadata)
        if unit:
            prop["x-unit"] = unit
            props[name] = {**{k: v for k, v in prop.items() if k not in ("type", "anyOf", "exclusiveMinimum",
                                                                          "minimum")},
                           "anyOf": [_numeric(prop), {"type": "string", "description": f"a quantity with a unit "
                                                      f"(SI unit {unit})"}]}
        ref = CATALOG_REFS.get(_doc_key(model, name) or "")
        if ref:
            props[name] = {"description": prop.get("description", ""),
                           "anyOf": [{"type": "string", "description": f"a catalog name ({ref[0]}) or a profile "
                                                                      "YAML path"},
                                     {k: v for k, v in prop.items() if k != "description"},
                                     {"type": "object", "required": ["base"],
                                      "properties": {"base": {"type": "string"}},
                                      "description": "a catalog entry (base) with some of its fields overridden"}]}
            if ref[1] != "required":
                props[name]["x-default"] = ref[1]
                _not_required(schema, name)
        if model.__name__ in ("DiTScenario", "TokenPipelineScenario") and name == "model":
            props[name]["x-keys"] = {k: f"{t}; {d}" for k, t, _, d in DIT_MODEL_KEYS}
        for sub in _models_in(info.annotation):
            if sub.__name__ in defs and not defs[sub.__name__].get("x-annotated"):
                defs[sub.__name__]["x-annotated"] = True
                _annotate(defs[sub.__name__], sub, defs)
    if "hardware" in props:
        _not_required(schema, "hardware")  # the loader fills a missing hardware section with defaults


def _not_required(schema: dict, name: str) -> None:
    req = [r for r in schema.get("required", []) if r != name]
    if req:
        schema["required"] = req
    else:
        schema.pop("required", None)


def _numeric(prop: dict) -> dict:
    """The numeric part of a quantity's generated schema (its bounds kept)."""
    if "anyOf" in prop:
        return {"anyOf": prop["anyOf"]}
    return {k: v for k, v in prop.items() if k in ("type", "exclusiveMinimum", "minimum", "maximum")}


def json_schema(kind: str) -> dict:
    """The JSON Schema of one scenario kind, with descriptions, SI units (``x-unit``) and catalog names."""
    model = scenario_models()[kind]
    schema = model.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    _annotate(schema, model, defs)
    for d in defs.values():
        d.pop("x-annotated", None)
    return _standard_bounds(schema)


_JSON_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def _standard_bounds(node: Any) -> Any:
    """Pydantic writes bounds of a ``Field`` nested in ``Annotated`` as gt/ge/lt/le; JSON Schema spells them out."""
    if isinstance(node, dict):
        return {(_JSON_BOUNDS[k] if k in _JSON_BOUNDS and isinstance(v, (int, float)) else k): _standard_bounds(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_standard_bounds(v) for v in node]
    return node


def add_arguments(p) -> None:
    p.add_argument("kind", nargs="?", choices=KINDS, help="scenario kind (default: llm)")
    p.add_argument("--markdown", action="store_true",
                   help="print the Markdown reference of every kind (docs/scenarios.md) instead")
    p.add_argument("--write-docs", metavar="PATH", help="write the Markdown reference to PATH")


def main(args) -> int:
    from .. import progress

    if args.write_docs:
        from ..runfolder import check_file_out

        check_file_out(args.write_docs, "--write-docs").write_text(render_markdown())
        progress.info(f"wrote {args.write_docs}")
        return 0
    if args.markdown:
        sys.stdout.write(render_markdown())
        return 0
    json.dump(json_schema(args.kind or "llm"), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
