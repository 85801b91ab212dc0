"""The catalog shipped in the package: GPUs, links, CPU profiles, engine profiles, LLMs and DiTs, as YAML data."""

from __future__ import annotations

import copy
from functools import lru_cache
from importlib import resources

from .yamlio import loads_catalog

KINDS = ("gpus", "links", "nodes", "cpus", "engines", "llms", "dits")


@lru_cache(maxsize=None)
def _load(kind: str) -> dict:
    text = (resources.files("simulator.config") / "catalog" / f"{kind}.yaml").read_text()
    return loads_catalog(text) or {}


def kernels() -> dict:
    """``kernels.yaml``: sourced figures of software kernels (attention, fused MoE, eager PyTorch).
    Shared and cached: callers must not modify it."""
    return _load("kernels")


def prices() -> dict:
    """``prices.yaml``: dated on-demand list prices of cloud offerings, by name. Shared and cached."""
    return _load("prices")


def price(name: str) -> dict | None:
    """One offering's entry (gpu, gpus, usd_per_hour, per-GPU price, date, source), or None."""
    return prices().get(name) if isinstance(name, str) else None


def names(kind: str) -> list[str]:
    """Names of the catalog entries of one kind."""
    return sorted(_load(kind))


def entry(kind: str, name: str) -> dict | None:
    """A fresh copy of one catalog entry with its ``name`` filled in, or None if unknown."""
    data = _load(kind).get(name) if isinstance(name, str) else None
    if data is None:
        return None
    out = copy.deepcopy(data)
    out.setdefault("name", name)
    return out
