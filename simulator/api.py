"""The Python entry point: ``simulator.run(path_or_dict, overrides={...})``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .config.loader import load_scenario
from .errors import ConfigError
from .observe.result import Result
from .pipelines import simulate


def run(scenario: str | Path | Mapping | None = None, overrides: Mapping[str, Any] | None = None) -> Result:
    """Load a scenario (file, dict or the built-in default), apply overrides and simulate it."""
    sc = load_scenario(scenario, overrides)
    try:
        return simulate(sc)
    except ConfigError as exc:
        name = str(scenario) if isinstance(scenario, (str, Path)) else (
            "<default scenario>" if scenario is None else "<dict>")
        raise ConfigError(exc.message, file=exc.file or name, path=exc.path) from None
