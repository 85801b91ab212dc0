"""The DiT path: cost model (:mod:`.model`), parallel strategies (:mod:`.strategies`), GPU
layout (:mod:`.layout`), SimPy processes (:mod:`.sim`), outputs (:mod:`.results`), and
:func:`simulate` (:mod:`.run`)."""

from __future__ import annotations

from .layout import Layout
from .model import DiTModel, TaskCost
from .results import CATEGORIES, REQUEST_COLUMNS
from .run import simulate, strategy_name
from .strategies import REGISTRY

__all__ = ["simulate", "strategy_name", "DiTModel", "TaskCost", "Layout", "CATEGORIES",
           "REQUEST_COLUMNS", "REGISTRY"]
