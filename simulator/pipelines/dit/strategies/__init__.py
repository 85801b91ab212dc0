"""DiT parallel strategies, one class per module, named in YAML by their ``parallel.*`` degree.

Adding a strategy: a module with a :class:`~.base.Strategy` subclass and one line in
``REGISTRY`` (and its degree in ``config.dit_models.DiTParallel``). A layout is the product of
the active ones (degree > 1), composed in registry order, which is also the label's order.
"""

from __future__ import annotations

from .base import Link, MemoryContext, StageContext, StageWork, Strategy
from .cfg import CFGParallel
from .distrifusion import DistriFusion
from .pipefusion import PipeFusion
from .ring import Ring
from .tensor import TensorParallel
from .ulysses import Ulysses

REGISTRY: dict[str, type[Strategy]] = {cls.key: cls for cls in (
    CFGParallel, PipeFusion, Ulysses, Ring, TensorParallel, DistriFusion)}
"""YAML ``parallel.<key>`` -> strategy class, in composition order."""


def compose(parallel) -> tuple[Strategy, ...]:
    """The active strategies of a ``DiTParallel``, in registry order."""
    return tuple(cls(getattr(parallel, key), parallel) for key, cls in REGISTRY.items()
                 if getattr(parallel, key) > 1)


def label(strategies) -> str:
    """A short label of the layout, e.g. ``cfg2 x pipefusion4(M=8) x ulysses2``."""
    return " x ".join(s.label for s in strategies) or "single"


__all__ = ["REGISTRY", "compose", "label", "Strategy", "StageContext", "StageWork", "MemoryContext",
           "Link"]
