"""Pydantic field types that accept unit strings and hold SI floats."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, PlainSerializer

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


_AS_FLOAT = PlainSerializer(float, return_type=float)

Seconds = Annotated[float, _parser("time"), AfterValidator(_non_negative), _AS_FLOAT]
PositiveSeconds = Annotated[float, _parser("time"), AfterValidator(_positive), _AS_FLOAT]
Bytes = Annotated[float, _parser("bytes"), AfterValidator(_positive), _AS_FLOAT]
Bandwidth = Annotated[float, _parser("bandwidth"), AfterValidator(_positive), _AS_FLOAT]
Flops = Annotated[float, _parser("flops"), AfterValidator(_positive), _AS_FLOAT]
Rate = Annotated[float, _parser("rate"), AfterValidator(_positive), _AS_FLOAT]
