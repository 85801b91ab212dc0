"""lastmile: a discrete-event simulator of end-to-end inference pipelines (LLM serving and DiT).

The entry points are loaded on first use, so ``import simulator`` (and ``lastmile --version``)
does not pay for numpy, pandas and pydantic.
"""

import sys
import types

__all__ = ["run", "sweep", "load_scenario", "simulate", "ConfigError", "LastmileError"]
__version__ = "0.1.0"

_FROM = {"run": "api", "load_scenario": "api", "simulate": "api", "ConfigError": "errors",
         "LastmileError": "errors"}


def __getattr__(name: str):
    if name in _FROM:
        from importlib import import_module

        value = getattr(import_module(f"{__name__}.{_FROM[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """``simulator.sweep`` is the function, as it always was, although ``simulator.sweep`` is also a
    module: importing that module binds the package attribute to it, and this property keeps the name."""

    @property
    def sweep(self):
        from .sweep import sweep

        return sweep

    @sweep.setter
    def sweep(self, value) -> None:
        pass  # the import system binding the submodule; the name stays the function


sys.modules[__name__].__class__ = _Package
