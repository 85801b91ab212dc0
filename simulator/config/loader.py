"""Scenario loading: YAML or dict in, catalog names resolved, overrides applied, validated model out."""

from __future__ import annotations

import copy
import difflib
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from . import catalog
from .dit_models import DiTScenario, TokenPipelineScenario
from .models import LLMScenario

SCENARIO_KINDS: dict[str, type[BaseModel]] = {"llm": LLMScenario, "dit": DiTScenario,
                                              "token_pipeline": TokenPipelineScenario}


def register_kind(kind: str, model: type[BaseModel]) -> None:
    """Make a scenario kind (``dit``, ``token_pipeline``) loadable."""
    SCENARIO_KINDS[kind] = model


def default_scenario_text() -> str:
    """The built-in default scenario's YAML."""
    return (resources.files("simulator.config") / "default_scenario.yaml").read_text()


def _suggest(word: str, options) -> str:
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def set_path(raw: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c = value`` in a nested dict, expanding a catalog name on the way into ``{base: name}``."""
    keys = dotted.split(".")
    node = raw
    for k in keys[:-1]:
        nxt = node.get(k)
        if isinstance(nxt, str):
            nxt = {"base": nxt}
        elif nxt is None:
            nxt = {}
        elif not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {dotted!r}: {k!r} holds a value, not a section", path=dotted)
        node[k] = nxt
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``key.path=value`` from the command line; the value is read as YAML (numbers, booleans, lists)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, _, val = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = yaml.safe_load(val) if val.strip() else ""
    except yaml.YAMLError:
        value = val
    return key, value


class _Resolver:
    """Replaces catalog names and profile paths in a raw scenario by full entries."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir

    def ref(self, value: Any, kind: str, key: str, profile_key: str | None = None, default: str | None = None) -> Any:
        """Resolve a catalog name, a profile path or a mapping; a partial mapping builds on ``default``."""
        if value is None:
            return None
        if isinstance(value, str):
            if value.endswith((".yaml", ".yml")):
                return self.profile(value, key, profile_key or kind.rstrip("s"))
            value = {"base": value}
        if not isinstance(value, dict):
            raise ConfigError(f"expected a catalog name or a mapping, got {value!r}", path=key)
        value = dict(value)
        if default is not None and "base" not in value and "name" not in value:
            value["base"] = default
        base = value.pop("base", None)
        if base is None:
            return value
        if isinstance(base, str) and base.endswith((".yaml", ".yml")):
            found = self.profile(base, key, profile_key or kind.rstrip("s"))
        else:
            found = catalog.entry(kind, base)
            if found is None:
                raise ConfigError(f"unknown {kind[:-1]} {base!r}{_suggest(base, catalog.names(kind))}; "
                                  f"known: {', '.join(catalog.names(kind))}", path=key)
        found.update(value)
        return found

    def profile(self, path: str, key: str, top: str) -> dict:
        p = Path(path)
        if not p.is_absolute():
            p = self.base_dir / p
        if not p.is_file():
            shipped = resources.files("simulator.config") / "profiles" / Path(path).name
            if shipped.is_file():
                p = Path(str(shipped))
        if not p.is_file():
            raise ConfigError(f"profile file {path!r} does not exist", path=key)
        try:
            data = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"profile {path!r} is not valid YAML ({str(exc).splitlines()[0]})", path=key) from None
        if not isinstance(data, dict) or not isinstance(data.get(top), dict):
            raise ConfigError(f"profile {path!r} has no top-level '{top}:' mapping", path=key)
        inner = dict(data[top])
        if "measured" in data:
            inner.setdefault("measured", data["measured"])
        if top == "cpu":
            # A measured CPU profile covers the costs it measured; the rest come from the reference profile.
            inner.setdefault("base", "reference")
        return self.ref(inner, f"{top}s", key, top)


def resolve_hardware(raw_hw: Any, resolver: _Resolver) -> dict:
    """Fill a hardware section: GPU from the catalog, its default links, the CPU profile."""
    hw = dict(raw_hw or {})
    hw["gpu"] = resolver.ref(hw.get("gpu", "h100-sxm"), "gpus", "hardware.gpu", default="h100-sxm")
    gpu = hw["gpu"] if isinstance(hw["gpu"], dict) else {}
    defaults = {"gpu_link": gpu.get("gpu_link"), "host_link": gpu.get("host_link", "pcie4-x16"),
                "node_link": None, "client_link": "client-lan"}
    for link, default in defaults.items():
        hw.setdefault(link, default)
        hw[link] = resolver.ref(hw[link], "links", f"hardware.{link}", default=default)
    hw["cpu"] = resolver.ref(hw.get("cpu", "reference"), "cpus", "hardware.cpu", default="reference")
    return hw


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model reached by ``loc``, for did-you-mean suggestions."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = field.annotation
        for arg in typing.get_args(current) or ():
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
                break
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _format_validation(exc: ValidationError, model: type[BaseModel]) -> ConfigError:
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in (
        "int", "Distribution", "constrained-int", "function-after[_check(), Distribution]")))
    loc = tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p == "is-instance")))
    path = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        options = _field_names(model, loc[:-1])
        return ConfigError(f"unknown key {loc[-1]!r}{_suggest(loc[-1], options)}", path=path)
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "missing":
        msg = "required key is missing"
    if err["type"] == "literal_error":
        msg = f"{err.get('input')!r} is not allowed; {msg.lower()}"
    elif "input" in err and err["type"] not in ("missing", "value_error", "assertion_error"):
        msg = f"{msg} (got {err['input']!r})"
    return ConfigError(msg, path=path or None)


def load_raw(source: str | Path | Mapping | None) -> tuple[dict, str, Path]:
    """Read a scenario into a raw dict; returns (raw, display name, directory for relative paths)."""
    if source is None:
        return yaml.safe_load(default_scenario_text()), "<default scenario>", Path.cwd()
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), "<dict>", Path.cwd()
    p = Path(source)
    if not p.is_file():
        raise ConfigError(f"scenario file does not exist", file=str(source))
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}", file=str(source)) from None
    if not isinstance(raw, dict):
        raise ConfigError("a scenario must be a YAML mapping of keys", file=str(source))
    return raw, str(source), p.resolve().parent


def load_scenario(source: str | Path | Mapping | None = None, overrides: Mapping[str, Any] | None = None):
    """Load, resolve and validate a scenario; errors carry the file and the key path."""
    raw, name, base_dir = load_raw(source)
    try:
        for key, value in (overrides or {}).items():
            set_path(raw, key, value)
        kind = raw.get("kind", "llm")
        model = SCENARIO_KINDS.get(kind)
        if model is None:
            raise ConfigError(f"unknown kind {kind!r}{_suggest(kind, SCENARIO_KINDS)}; known: "
                              f"{', '.join(SCENARIO_KINDS)}", path="kind")
        resolver = _Resolver(base_dir)
        raw.setdefault("kind", kind)
        model_kind = "llms" if kind == "llm" else "dits"
        if kind == "token_pipeline" and isinstance(raw.get("model"), str) and catalog.entry("llms", raw["model"]):
            model_kind = "llms"
        default_model = "llama-3-8b" if kind == "llm" else None
        raw["model"] = resolver.ref(raw.get("model", default_model), model_kind, "model", default=default_model)
        raw["hardware"] = resolve_hardware(raw.get("hardware"), resolver)
        workload = raw.get("workload")
        if isinstance(workload, dict) and workload.get("trace"):
            tp = Path(str(workload["trace"]))
            if not tp.is_absolute() and not tp.is_file():
                tp = base_dir / tp
            workload["trace"] = str(tp)
        try:
            scenario = model.model_validate(raw)
        except ValidationError as exc:
            raise _format_validation(exc, model) from None
    except ConfigError as exc:
        exc.file = exc.file or name
        raise ConfigError(exc.message, file=exc.file, path=exc.path) from None
    return scenario


def resolved_dict(scenario: BaseModel) -> dict:
    """The scenario with every default filled in, in SI units, for the run folder."""
    return scenario.model_dump(mode="json")
