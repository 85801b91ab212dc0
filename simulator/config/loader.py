"""Scenario loading: YAML or dict in, catalog names resolved, overrides applied, validated model out."""

from __future__ import annotations

import copy
import reprlib
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from ..kinds import DEFAULT_KIND, KINDS, Kind
from . import catalog
from .hf_config import is_hf_config, spec_from_hf
from .paths import exists
from .yamlio import YAMLInputError, load_file, loads

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 60, 60, 4, 4, 2



def default_scenario_text() -> str:
    """The built-in default scenario's YAML."""
    return (resources.files("simulator.config") / "default_scenario.yaml").read_text()


def _suggest(word: str, options) -> str:
    import difflib  # an error's suggestion: not loaded for a run that has none

    close = difflib.get_close_matches(str(word)[:100], [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


KNOWN_SHOWN = 8
"""Catalog names an unknown-name error lists before pointing at ``lastmile catalog``: the line stays short."""


def _known(kind: str) -> str:
    """The names of catalog ``kind`` an error offers: all of them, or the first few and where the rest are."""
    names = catalog.names(kind)
    if len(names) <= KNOWN_SHOWN:
        return ", ".join(names)
    return f"{', '.join(names[:KNOWN_SHOWN])} and {len(names) - KNOWN_SHOWN} more (lastmile catalog {kind})"


def _merge(base: dict, over: Mapping) -> dict:
    """``over`` laid on ``base`` key by key, into nested mappings (so one fraction can be overridden)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key != "sources":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def set_path(raw: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c = value`` in a nested dict, expanding a catalog name on the way into ``{base: name}``."""
    keys = dotted.split(".")
    if not all(k.strip() for k in keys):
        raise ConfigError(f"--set key {dotted!r} has an empty part; write it like serving.max_batch", path=dotted)
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
        value = loads(val) if val.strip() else ""
    except YAMLInputError:
        value = val
    return key, value


class _Resolver:
    """Replaces catalog names and profile paths in a raw scenario by full entries."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.origins: dict[str, tuple[str, str]] = {}
        """Key path -> (profile file, its top-level key) for sections read from a profile file."""
        self.cpu_base = "reference"
        """What a CPU profile that names no base builds on: the engine profile's CPU costs."""

    def ref(self, value: Any, kind: str, key: str, profile_key: str | None = None, default: str | None = None) -> Any:
        """Resolve a catalog name, a profile path or a mapping; a partial mapping builds on ``default``."""
        if value is None:
            return None
        if isinstance(value, str):
            if value.endswith((".yaml", ".yml")):
                return self.profile(value, key, profile_key or kind.rstrip("s"))
            if kind == "llms" and (is_hf_config(value) or is_hf_config(str(self.base_dir / value))):
                return spec_from_hf(value, self.base_dir)
            value = {"base": value}
        if not isinstance(value, dict):
            raise ConfigError(f"expected a catalog name or a mapping, got {value!r}", path=key)
        value = dict(value)
        if default is not None and "base" not in value and "name" not in value:
            value["base"] = default
        base = value.pop("base", None)
        if base is None:
            return value
        if not isinstance(base, str):
            raise ConfigError(f"base must be a catalog name or a profile path, got {_SHORT.repr(base)}",
                              path=f"{key}.base")
        if base.endswith((".yaml", ".yml")):
            found = self.profile(base, key, profile_key or kind.rstrip("s"))
        else:
            found = catalog.entry(kind, base)
            if found is None:
                raise ConfigError(f"unknown {kind[:-1]} {base!r}{_suggest(base, catalog.names(kind))}; "
                                  f"known: {_known(kind)}", path=key)
        return _merge(found, value)

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
            data = load_file(p)
        except YAMLInputError as exc:
            raise ConfigError(str(exc), file=str(p)) from None
        if not isinstance(data, dict) or not isinstance(data.get(top), dict):
            raise ConfigError(f"has no top-level '{top}:' mapping (a {top} profile, used at {key})", file=str(p))
        self.origins[key] = (str(p), top)
        inner = dict(data[top])
        if "measured" in data:
            inner.setdefault("measured", data["measured"])
        if top == "cpu":
            # A measured CPU profile covers the costs it measured; the rest come from the reference profile.
            inner.setdefault("base", self.cpu_base)
        return self.ref(inner, f"{top}s", key, top)


def resolve_engine(raw: dict, resolver: _Resolver) -> dict | None:
    """Resolve ``serving.engine`` (a catalog name, a profile file or a mapping over one) and lay its
    serving defaults under the keys the scenario's ``serving`` does not set itself. Returns the CPU
    costs the engine runs with (``{base: <cpus entry>, ...costs}``), the default of ``hardware.cpu``."""
    serving = raw.get("serving")
    if serving is not None and not isinstance(serving, dict):
        return None  # the model's validation names the problem
    sv = dict(serving or {})
    engine = resolver.ref(sv.get("engine", "reference"), "engines", "serving.engine", default="reference")
    defaults, cpu, costs = engine.get("serving", {}), engine.get("cpu", "reference"), engine.get("costs", {})
    for key, value, kind in (("serving", defaults, dict), ("cpu", cpu, str), ("costs", costs, dict)):
        if not isinstance(value, kind):
            raise ConfigError(f"expected {'a mapping' if kind is dict else 'a cpus catalog name'}, got "
                              f"{_SHORT.repr(value)}", path=f"serving.engine.{key}")
    if catalog.entry("cpus", cpu) is None and not cpu.endswith((".yaml", ".yml")):
        raise ConfigError(f"unknown cpus entry {cpu!r}{_suggest(cpu, catalog.names('cpus'))}; known: "
                          f"{', '.join(catalog.names('cpus'))}", path="serving.engine.cpu")
    for key, value in defaults.items():
        sv.setdefault(key, value)
    _lay_kernels(raw, sv, engine.get("kernels"))
    sv["engine"] = engine
    raw["serving"] = sv
    resolver.cpu_base = cpu
    return {"base": cpu, **costs}


def _lay_kernels(raw: dict, sv: dict, kernels: Any) -> None:
    """An engine profile's modelled kernels as defaults of the keys that select them (the scenario's
    own keys win); a malformed ``kernels`` block is left to the profile's validation."""
    if not isinstance(kernels, dict):
        return
    if "decode_attention" in kernels:
        sv.setdefault("decode_attention", kernels["decode_attention"])
    graphs, own = kernels.get("cuda_graphs"), sv.get("graph_capture")
    if isinstance(graphs, dict) and (own is None or isinstance(own, dict)):
        sv["graph_capture"] = {**graphs, **(own or {})}  # key by key, as the serving defaults
    parallel = raw.get("parallel")
    if "allreduce" in kernels and (parallel is None or isinstance(parallel, dict)):
        raw["parallel"] = {"allreduce": kernels["allreduce"], **(parallel or {})}


def resolve_hardware(raw_hw: Any, resolver: _Resolver, cpu: dict | None = None) -> dict:
    """Fill a hardware section: GPU from the catalog, its default links, the CPU profile (``cpu``:
    what it defaults to and a partial mapping builds on, the reference costs unless an engine says)."""
    if raw_hw is not None and not isinstance(raw_hw, dict):
        raise ConfigError(f"expected a mapping of hardware keys (gpu, host_link, ...), got {_SHORT.repr(raw_hw)}",
                          path="hardware")
    hw = dict(raw_hw or {})
    if hw.get("node") is not None:
        _resolve_node(hw, resolver)
    hw["gpu"] = resolver.ref(hw.get("gpu", "h100-sxm"), "gpus", "hardware.gpu", default="h100-sxm")
    gpu = hw["gpu"] if isinstance(hw["gpu"], dict) else {}
    defaults = {"gpu_link": gpu.get("gpu_link"), "host_link": gpu.get("host_link", "pcie4-x16"),
                "node_link": None, "client_link": "client-lan"}
    for link, default in defaults.items():
        hw.setdefault(link, default)
        hw[link] = resolver.ref(hw[link], "links", f"hardware.{link}", default=default)
    cpu = cpu or {"base": "reference"}
    given = hw.get("cpu", cpu)
    if isinstance(given, dict) and "base" not in given and "name" not in given:
        given = {**cpu, **given}  # a partial mapping builds on the engine's costs
    hw["cpu"] = resolver.ref(given, "cpus", "hardware.cpu", default=cpu["base"])
    return hw


NODE_LINKS = ("nvlink", "pcie", "switch_uplink", "socket_link", "nic", "shm")


def _base_name(value: Any) -> Any:
    """The catalog name a hardware value builds on (a name, or a mapping's base)."""
    return value.get("base", value.get("name")) if isinstance(value, dict) else value


def _resolve_node(hw: dict, resolver: _Resolver) -> None:
    """Resolve ``hardware.node`` and lay its GPU, node size and links under the keys the scenario
    does not set; a GPU or node size that contradicts the node is an error."""
    node = resolver.ref(hw["node"], "nodes", "hardware.node")
    if not isinstance(node.get("gpu"), str):
        raise ConfigError(f"a node mapping builds on a node type: add base: <node type> (known: "
                          f"{', '.join(catalog.names('nodes'))})", path="hardware.node")
    for key in NODE_LINKS:
        if isinstance(node.get(key), (str, dict)):
            node[key] = resolver.ref(node[key], "links", f"hardware.node.{key}")
    hw["node"] = node
    gpu, name = node.get("gpu"), node.get("name")
    given = hw.get("gpu")
    if given is None:
        hw["gpu"] = gpu
    elif isinstance(given, dict) and "base" not in given and "name" not in given:
        hw["gpu"] = {"base": gpu, **given}
    elif _base_name(given) != gpu:
        raise ConfigError(f"{_SHORT.repr(_base_name(given))} is not the GPU of node {name!r}, which holds "
                          f"{gpu}; leave hardware.gpu out or choose a node with that GPU "
                          f"({', '.join(n for n in catalog.names('nodes') if (catalog.entry('nodes', n) or {}).get('gpu') == _base_name(given)) or 'none in the catalog'})",
                          path="hardware.gpu")
    gpus = node.get("gpus")
    if "gpus_per_node" in hw and hw["gpus_per_node"] != gpus:
        raise ConfigError(f"{hw['gpus_per_node']} but node {name!r} holds {gpus} GPUs; leave it out",
                          path="hardware.gpus_per_node")
    hw["gpus_per_node"] = gpus
    for key, link in (("gpu_link", "nvlink"), ("host_link", "pcie"), ("node_link", "nic")):
        if key not in hw:
            value = node.get(link)
            hw[key] = dict(value) if isinstance(value, dict) else value  # the node's own, overrides and all


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model reached by ``loc``, for did-you-mean suggestions."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list of models: the model found below the list's annotation
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = _model_inside(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_inside(annotation: Any) -> Any:
    """The pydantic model an annotation holds, through Optional, list and Annotated; else the annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation) or ():
        found = _model_inside(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation


_LOC_NOISE = ("int", "float", "Distribution", "constrained-int", "count", "distribution", "is-instance", "str")


RESOURCE_TAGS = ("cpu", "service", "llm", "dit")
"""The branches of a pipeline resource (``config.pipeline_models.Resource``): pydantic puts the one it
tried into the location (``resources.encoders.cpu.cores``), which is not a key the user wrote."""


def _clean_loc(loc: tuple) -> tuple:
    """The user's key path from a pydantic location: drop validator, union-branch and type names."""
    kept = tuple(p for p in loc if not (isinstance(p, str) and (
        p in _LOC_NOISE or p.startswith(("function-", "constrained-", "lax-", "tagged-union")))))
    return tuple(p for i, p in enumerate(kept)
                 if not (i >= 2 and kept[i - 2] == "resources" and p in RESOURCE_TAGS))


def _format_validation(exc: ValidationError, model: type[BaseModel]) -> ConfigError:
    errors = exc.errors()
    # a misspelt key is both unknown and, under its right name, missing: name the typo
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = _clean_loc(err["loc"])
    path = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        options = _field_names(model, loc[:-1])
        return ConfigError(f"unknown key {_SHORT.repr(loc[-1])}{_suggest(loc[-1], options)}", path=path)
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "missing":
        msg = "required key is missing"
    if err["type"] == "literal_error":
        msg = f"{_SHORT.repr(err.get('input'))} is not allowed; {msg.lower()}"
    elif err["type"] == "union_tag_invalid":  # a tagged union's branch named wrongly: say it as a kind
        return _wrong_kind(err.get("ctx") or {}, path)
    elif "input" in err and err["type"] not in ("missing", "value_error", "assertion_error"):
        msg = f"{msg} (got {_SHORT.repr(err['input'])})"
    return ConfigError(msg, path=path or None)


def _wrong_kind(ctx: dict, path: str) -> ConfigError:
    """A tagged union's branch (a pipeline resource's ``kind``) that is none of its kinds."""
    tag, expected = str(ctx.get("tag")), str(ctx.get("expected_tags", ""))
    kinds = [t.strip(" '") for t in expected.split(",") if t.strip(" '")]
    return ConfigError(f"kind {_SHORT.repr(tag)} is not one of {', '.join(kinds)}{_suggest(tag, kinds)}",
                       path=f"{path}.kind" if path else "kind")


def _in_profile(error: ConfigError, origins: Mapping[str, tuple[str, str]]) -> ConfigError:
    """An error inside a section read from a profile file names that file and the key in it."""
    for key, (file, top) in origins.items():
        if error.path and (error.path == key or error.path.startswith(key + ".")):
            inner = top + error.path[len(key):]
            return ConfigError(f"{error.message} (profile used at {key})", file=file, path=inner)
    return error


def _read_scenario_file(source) -> Any:
    p = Path(source)
    if not p.is_file():
        what = "is a folder, not a scenario file" if p.is_dir() else "scenario file does not exist"
        raise ConfigError(what, file=str(source))
    try:
        return load_file(p)
    except YAMLInputError as exc:
        raise ConfigError(str(exc), file=str(source)) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read ({exc.strerror})", file=str(source)) from None


def load_raw(source: str | Path | Mapping | None) -> tuple[dict, str, Path]:
    """Read a scenario into a raw dict; returns (raw, display name, directory for relative paths)."""
    if source is None:
        return loads(default_scenario_text()), "<default scenario>", Path.cwd()
    if isinstance(source, Mapping):
        try:
            raw = copy.deepcopy(dict(source))
        except RecursionError:
            raise ConfigError("nested too deeply", file="<dict>") from None
        return raw, "<dict>", Path.cwd()
    if not isinstance(source, (str, Path)):
        raise ConfigError(f"a scenario is a file path, a mapping or None, got {type(source).__name__}")
    raw = _read_scenario_file(source)
    if not isinstance(raw, dict):
        raise ConfigError("a scenario must be a YAML mapping of keys", file=str(source))
    return raw, str(source), Path(source).resolve().parent


def _kind(raw: dict) -> Kind:
    kind = raw.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str):
        raise ConfigError(f"expected one of {', '.join(KINDS)}, got {_SHORT.repr(kind)}", path="kind")
    if kind not in KINDS:
        raise ConfigError(f"unknown kind {_SHORT.repr(kind)}{_suggest(kind, KINDS)}; known: "
                          f"{', '.join(KINDS)}", path="kind")
    return KINDS[kind]


def _model_catalog(kind: Kind, model: Any) -> str:
    """The first of the kind's catalogs that holds the model's name (or base); the first if none does."""
    name = model.get("base") if isinstance(model, dict) else model
    for section in kind.catalogs:
        if isinstance(name, str) and catalog.entry(section, name) is not None:
            return section
    return kind.catalogs[0]


def _resolve(raw: dict, base_dir: Path) -> tuple[type[BaseModel], _Resolver]:
    """Fill catalog names and profile files into ``raw`` in place; returns the kind's model."""
    kind = _kind(raw)
    resolver = _Resolver(base_dir)
    raw.setdefault("kind", kind.name)
    model = raw.get("model", kind.default_model)
    raw["model"] = resolver.ref(model, _model_catalog(kind, model), "model", default=kind.default_model)
    cpu = resolve_engine(raw, resolver) if kind.name == "llm" else None
    raw["hardware"] = resolve_hardware(raw.get("hardware"), resolver, cpu)
    off = (raw.get("serving") or {}).get("kv_offload") if isinstance(raw.get("serving"), dict) else None
    if isinstance(off, dict) and off.get("link") is not None:
        off["link"] = resolver.ref(off["link"], "links", "serving.kv_offload.link")
    spec = (raw.get("serving") or {}).get("speculative") if isinstance(raw.get("serving"), dict) else None
    if isinstance(spec, dict) and spec.get("draft_model") is not None:
        spec["draft_model"] = resolver.ref(spec["draft_model"], "llms", "serving.speculative.draft_model")
    dis = raw.get("disaggregation")
    if isinstance(dis, dict) and dis.get("kv_link") is not None:
        dis["kv_link"] = resolver.ref(dis["kv_link"], "links", "disaggregation.kv_link")
    workload = raw.get("workload")
    for key in ("trace", "tokenizer"):  # files next to the scenario, unless they name one from here
        if isinstance(workload, dict) and isinstance(workload.get(key), str) and workload[key]:
            tp = Path(workload[key])
            if not tp.is_absolute() and not exists(tp):
                tp = base_dir / tp
            workload[key] = str(tp)
    return kind.scenario, resolver


def load_scenario(source: str | Path | Mapping | None = None, overrides: Mapping[str, Any] | None = None):
    """Load, resolve and validate a scenario; errors carry the file and the key path."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides are a mapping of key paths to values ({{'workload.requests': 100}}), got "
                          f"{type(overrides).__name__}")
    raw, name, base_dir = load_raw(source)
    resolver = None
    try:
        for key, value in (overrides or {}).items():
            set_path(raw, str(key), value)
        model, resolver = _resolve(raw, base_dir)
        try:
            scenario = model.model_validate(raw)
        except ValidationError as exc:
            raise _format_validation(exc, model) from None
        except RecursionError:
            raise ConfigError("nested too deeply") from None
        if getattr(getattr(scenario, "workload", None), "trace", None):
            own = getattr(scenario, "check_trace", None)  # a kind with a trace format of its own
            if own is not None:
                own()
            else:
                from .trace import check_trace  # reads the trace: loaded only when there is one

                check_trace(scenario)
    except ConfigError as exc:
        if resolver is not None:
            exc = _in_profile(exc, resolver.origins)
        raise exc.moved(file=exc.file or name, path=exc.path) from None
    return scenario


def resolved_dict(scenario: BaseModel) -> dict:
    """The scenario with every default filled in, in SI units, for the run folder."""
    return scenario.model_dump(mode="json")
