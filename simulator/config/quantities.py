"""Pydantic field types that accept unit strings and hold SI floats."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer

from ..units import parse


def _parser(dimension: str):
    return BeforeValidator(lambda v: parse(v, dimension))


def _positive(v: float) -> float:
    if v <= 0:
        raise ValueError(f"must be greater than zero, got {v:g}")
    return v


def _non_negative(v: float) -> float:
    if v < 0:
        raise ValueError(f"must not be negative, got {v:g}")
    return v


def _as_float(v) -> float:
    return float(v)


# a Python function, not the builtin ``float``: pydantic reads a serializer's signature for each field
# that uses it, and a builtin's is parsed from its text signature (~0.1 ms each, 4 ms of every start)
_AS_FLOAT = PlainSerializer(_as_float, return_type=float)


# ---- bounds no real deployment exceeds -------------------------------------------------------

DAY = 86_400.0


def _at_most(limit: float, shown: str):
    def check(v: float) -> float:
        if v > limit:
            raise ValueError(f"must be at most {shown}, got {v:g}")
        return v
    return AfterValidator(check)


def _at_least(limit: float, shown: str):
    def check(v: float) -> float:
        if v < limit:
            raise ValueError(f"must be at least {shown}, got {v:g}")
        return v
    return AfterValidator(check)


# A cost, latency or SLO above a day, or a simulated horizon above ~3 years, is a typo; so is a
# link slower than 1 kB/s, a GPU outside 1 GFLOP/s-1 EFLOP/s, 1 MB-1 PB of memory, or an arrival
# rate outside one per 11 days to a million per second.
Seconds = Annotated[float, _parser("time"), AfterValidator(_non_negative), _at_most(DAY, "1 day (86400 s)"),
                    _AS_FLOAT]
PositiveSeconds = Annotated[float, _parser("time"), AfterValidator(_positive), _at_most(DAY, "1 day (86400 s)"),
                            _AS_FLOAT]
# A CPU cost per call (per request, step, token, chunk or message) above 10 s is a typo: the slowest
# per-step host work any engine reports is milliseconds (cpus.yaml).
CallSeconds = Annotated[float, _parser("time"), AfterValidator(_non_negative), _at_most(10.0, "10 s per call"),
                        _AS_FLOAT]
Horizon = Annotated[float, _parser("time"), AfterValidator(_positive), _at_most(1e8, "1e8 s (about 3 years)"),
                    _AS_FLOAT]
Bytes = Annotated[float, _parser("bytes"), AfterValidator(_positive), _at_most(1e15, "1 PB"), _AS_FLOAT]
Bandwidth = Annotated[float, _parser("bandwidth"), AfterValidator(_positive), _at_least(1e3, "1 kB/s"),
                      _at_most(1e16, "10 PB/s"), _AS_FLOAT]
Flops = Annotated[float, _parser("flops"), AfterValidator(_positive), _at_least(1e9, "1 GFLOP/s"),
                  _at_most(1e18, "1 EFLOP/s"), _AS_FLOAT]
Rate = Annotated[float, _parser("rate"), AfterValidator(_positive), _at_least(1e-6, "1e-6/s"),
                 _at_most(1e6, "1e6/s"), _AS_FLOAT]
# The power of one GPU or of a server's share per GPU: none draws 10 kW.
Watts = Annotated[float, _parser("power"), AfterValidator(_positive), _at_most(1e4, "10 kW"), _AS_FLOAT]


def _no_bool(v):
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    return v


NO_BOOL = BeforeValidator(_no_bool)
Int = Annotated[int, NO_BOOL]
Number = Annotated[float, NO_BOOL, Field(allow_inf_nan=False)]


def Count(limit: int):  # noqa: N802 - a type factory, read like a type
    """A positive whole number of at most ``limit`` (never a boolean)."""
    return Annotated[int, NO_BOOL, Field(gt=0, le=limit)]


def Whole(limit: int):  # noqa: N802 - a type factory, read like a type
    """A whole number from 0 to ``limit`` (never a boolean)."""
    return Annotated[int, NO_BOOL, Field(ge=0, le=limit)]


Fraction = Annotated[float, NO_BOOL, Field(gt=0, le=1, allow_inf_nan=False)]
"""A number in (0, 1]."""
