"""Parse quantities with units ("3.35 TB/s", "8 us", "80 GiB", "4/s") into SI floats, and format them back.

Inside the simulator every quantity is a float in SI base units (s, B, FLOP, B/s, FLOP/s, 1/s);
units exist only at the YAML boundary and in printed output.
"""

from __future__ import annotations

import math
import re

from .errors import UnitError

_PREFIX = {
    "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50,
}
_TIME = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
         "min": 60.0, "h": 3600.0}

# dimension -> (base-unit spellings, multiplier applied after the prefix)
_BASES: dict[str, dict[str, float]] = {
    "bytes": {"B": 1.0, "bytes": 1.0, "byte": 1.0, "bit": 0.125, "b": 0.125},
    "bandwidth": {"B/s": 1.0, "bit/s": 0.125, "bps": 0.125, "b/s": 0.125},
    "flops": {"FLOPS": 1.0, "FLOP/s": 1.0, "flops": 1.0, "OPS": 1.0},
    "flop": {"FLOP": 1.0, "flop": 1.0},
    "rate": {"/s": 1.0, "Hz": 1.0, "req/s": 1.0},
    "power": {"W": 1.0},
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RE = re.compile(rf"^\s*({_NUMBER})\s*([^\s\d].*?)?\s*$")

DIMENSIONS = ("time", "bytes", "bandwidth", "flops", "flop", "rate", "power", "number")

_EXAMPLES = {
    "time": '"8 us", "1.5 ms", "2 s"',
    "bytes": '"80 GiB", "512 MB"',
    "bandwidth": '"3.35 TB/s", "100 Gbit/s"',
    "flops": '"989 TFLOPS"',
    "flop": '"6.6 TFLOP"',
    "rate": '"4/s", "2.5 Hz"',
    "power": '"700 W", "1.2 kW"',
    "number": "a plain number",
}


def _unit_scale(unit: str, dimension: str) -> float | None:
    if dimension == "time":
        return _TIME.get(unit)
    if dimension == "number":
        return None
    for base, mult in sorted(_BASES[dimension].items(), key=lambda kv: -len(kv[0])):
        if unit.endswith(base):
            prefix = unit[: len(unit) - len(base)].strip()
            if prefix in _PREFIX:
                return _PREFIX[prefix] * mult
    return None


def parse(value: object, dimension: str) -> float:
    """Return ``value`` in SI base units; bare numbers are already SI."""
    if dimension not in DIMENSIONS:
        raise ValueError(f"unknown dimension {dimension!r}")
    if isinstance(value, bool):
        raise UnitError(f"expected a {dimension} like {_EXAMPLES[dimension]}, got {value!r}")
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        m = _RE.match(value)
        if not m:
            raise UnitError(f"cannot read {value!r} as a {dimension}; write it like {_EXAMPLES[dimension]}")
        number, unit = float(m.group(1)), (m.group(2) or "").strip()
        if not unit:
            result = number
        else:
            scale = _unit_scale(unit, dimension)
            if scale is None:
                raise UnitError(f"unknown unit {unit!r} for a {dimension}; write it like {_EXAMPLES[dimension]}")
            result = number * scale
    else:
        raise UnitError(f"expected a {dimension} like {_EXAMPLES[dimension]}, got {value!r}")
    if not math.isfinite(result):
        raise UnitError(f"{value!r} is not a finite {dimension}")
    return result


def fmt_time(seconds: float) -> str:
    """Human-readable duration with a sensible unit; under a picosecond, 0 (what a simulated time that
    small is, float rounding of sums such as a bubble of nothing: never a time to read)."""
    a = abs(seconds)
    if a < 1e-12:
        return "0 s"
    if a >= 1:
        return f"{seconds:.3g} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{seconds * 1e6:.3g} us"
    return f"{seconds * 1e9:.3g} ns"


def fmt_bytes(n: float) -> str:
    """Human-readable size in binary units."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
