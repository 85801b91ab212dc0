"""lastmile: a discrete-event simulator of end-to-end inference pipelines (LLM serving and DiT)."""

from .api import run
from .config.loader import load_scenario
from .errors import ConfigError, LastmileError
from .sweep import sweep

__all__ = ["run", "sweep", "load_scenario", "ConfigError", "LastmileError"]
__version__ = "0.1.0"
