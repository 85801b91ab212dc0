"""The catalog shipped in the package: GPUs, links, CPU profiles, LLMs and DiTs, as YAML data."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

KINDS = ("gpus", "links", "cpus", "llms", "dits")


@lru_cache(maxsize=None)
def _load(kind: str) -> dict:
    text = (resources.files("simulator.config") / "catalog" / f"{kind}.yaml").read_text()
    return yaml.safe_load(text) or {}


def names(kind: str) -> list[str]:
    """Names of the catalog entries of one kind."""
    return sorted(_load(kind))


def entry(kind: str, name: str) -> dict | None:
    """A fresh copy of one catalog entry with its ``name`` filled in, or None if unknown."""
    data = _load(kind).get(name)
    if data is None:
        return None
    out = yaml.safe_load(yaml.safe_dump(data))
    out.setdefault("name", name)
    return out
