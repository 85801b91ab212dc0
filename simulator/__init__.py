"""lastmile: a discrete-event simulator of end-to-end inference pipelines (LLM serving and DiT)."""

from .api import load_scenario, run, simulate
from .errors import ConfigError, LastmileError
from .sweep import sweep

__all__ = ["run", "sweep", "load_scenario", "simulate", "ConfigError", "LastmileError"]
__version__ = "0.1.0"
