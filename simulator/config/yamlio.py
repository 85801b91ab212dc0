"""A strict YAML reader for scenarios, profiles, catalogs and ``--set`` values.

PyYAML's safe loader follows YAML 1.1, which reads ``1:2`` as the base-60 number 62, lets a
duplicated key silently replace the first, and expands aliases without limit (a
"billion laughs" file of a few hundred bytes becomes 10^9 values). This reader keeps YAML 1.1
otherwise, but reads sexagesimal-looking scalars as strings, rejects duplicate keys, bounds
nesting depth and the number of values the aliases expand to, and accepts UTF-8 text only.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a scenario may have (real ones use 4)."""

MAX_VALUES = 200_000
"""Most values a document may expand to after aliases (the catalog's largest file has ~3,000)."""


class YAMLInputError(ValueError):
    """A document that is not acceptable YAML; the message is one line."""


class _Strict:
    """The strict constructor: duplicate keys are errors (mixed into a loader class below)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # resolve ``<<:`` merges first: a merged key may be overridden
            seen: dict = {}
            for key_node, _ in node.value:
                if getattr(key_node, "_merged", False):
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"a mapping key must be a plain value, got {type(key).__name__}",
                        key_node.start_mark) from None
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node):
        # Keys brought in by ``<<: *anchor`` may be overridden by the mapping's own keys; mark them
        # so the duplicate check above skips them.
        explicit = {id(k) for k, _ in node.value}
        super().flatten_mapping(node)
        for key_node, _ in node.value:
            if id(key_node) not in explicit:
                key_node._merged = True


# Numbers as YAML 1.2 writes them (decimal, 0x, 0o, floats with an exponent and no dot):
# no base-60, so ``1:2`` stays a string and is rejected where a number goes.
_INT = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|0o[0-7_]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_NUMERIC_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _numbers_without_base_60(loader: type) -> None:
    """Replace the loader's implicit int and float resolvers by the YAML 1.2 forms above."""
    loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in entries if tag not in _NUMERIC_TAGS]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


class _StrictLoader(_Strict, yaml.SafeLoader):
    """SafeLoader (PyYAML's pure-Python parser) without base-60 numbers, with duplicate keys as errors."""


_numbers_without_base_60(_StrictLoader)

if hasattr(yaml, "CSafeLoader"):  # PyYAML built with libyaml
    class _StrictCLoader(_Strict, yaml.CSafeLoader):
        """The same strict loader on libyaml's parser, about ten times faster: for the package's own
        catalog files (:func:`loads_catalog`). The constructor and the resolvers, where the strict
        rules live, are the Python ones in both loaders; ``tests/test_input_edges.py`` checks that the two
        read every catalog and profile file alike."""

    _numbers_without_base_60(_StrictCLoader)
else:  # pragma: no cover - PyYAML without libyaml
    _StrictCLoader = _StrictLoader


def _check_shape(data) -> None:
    """Bound the depth and the alias-expanded size, walking shared nodes once."""
    sizes: dict[int, int] = {}
    stack = [(data, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise YAMLInputError(f"nested more than {MAX_DEPTH} levels deep")
        children = list(node.values()) if isinstance(node, dict) else node
        if done:
            size = 1 + sum(sizes.get(id(c), 1) for c in children)
            if size > MAX_VALUES:
                raise YAMLInputError(f"expands to more than {MAX_VALUES:,} values (YAML aliases?)")
            sizes[id(node)] = size
            continue
        if id(node) in sizes:
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)


def loads(text: str, *, loader: type = _StrictLoader):
    """Parse one YAML document strictly; raise YAMLInputError with a one-line reason."""
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise YAMLInputError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # a number beyond Python's digit limit for int() (4,300 digits)
        raise YAMLInputError(f"holds a number too long to read ({str(exc).split(':')[0]})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YAMLInputError(f"not valid YAML{where}: {problem}") from None
    _check_shape(data)
    return data


def loads_catalog(text: str):
    """Parse one of the package's own catalog files: :func:`loads` on libyaml's parser when PyYAML
    has it (the catalog is a few hundred lines per file; the pure-Python parser spends ~60 ms of a run
    on it). A document it rejects is read again by the pure-Python loader, so an error reads as
    :func:`loads` words it. User input (scenarios, profiles, ``--set``) keeps the pure-Python parser,
    whose behaviour the strict rules were written against."""
    try:
        return loads(text, loader=_StrictCLoader)
    except YAMLInputError:
        return loads(text)


def read_text(path: str | Path) -> str:
    """A file's text, which must be UTF-8 (a UTF-8 byte-order mark is allowed)."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YAMLInputError(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                             "save it as UTF-8") from None


def load_file(path: str | Path):
    """Read and strictly parse a YAML file."""
    return loads(read_text(path))
