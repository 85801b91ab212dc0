"""Which serving settings a closed-form run of steps (``decode_runs``) covers, declared by the feature that owns each.

Every key of ``serving`` is declared once, by the module that implements it (``declare`` at import):
either a run covers any value of it, or only some, with the reason a run lacks the others. The
engine's own conditions that are not serving keys (the workload's loop, the replicas, the GPU
step, the CPU) are :data:`ENGINE_CONDITIONS`. A test fails when a serving key is not declared, so a
new feature cannot reach the fast path unclassified (issue 24).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Support:
    """Serving key ``key``: the values a run covers (``covers``), and what it lacks for the others."""

    key: str
    covers: Callable[[object], bool]
    lacks: str
    owner: str


RUN_SUPPORT: dict[str, Support] = {}
"""Serving key -> how closed-form runs cover it, as its owning module declared."""


def declare(key: str, covers: Callable[[object], bool] | None = None, lacks: str = "", owner: str = "") -> None:
    """Declare how runs cover ``serving.<key>``: every value (``covers`` None), or those ``covers`` accepts."""
    assert key not in RUN_SUPPORT or RUN_SUPPORT[key].owner == owner, f"serving.{key} declared twice"
    RUN_SUPPORT[key] = Support(key, covers or (lambda _value: True), lacks, owner)


def only(*values) -> Callable[[object], bool]:
    """A ``covers`` that accepts ``values`` alone."""
    return lambda value: value in values


def serving_blockers(serving) -> list[str]:
    """Why runs cannot cover these serving settings (a validated ``serving`` block): one line per key."""
    out = []
    for key, support in RUN_SUPPORT.items():
        value = getattr(serving, key)
        if not support.covers(value):
            out.append(f"serving.{key}={_show(value)}: {support.lacks}")
    return out


def _show(value) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return str(value).lower() if isinstance(value, bool) or value is None else str(value)
    return type(value).__name__


ENGINE_CONDITIONS: dict[str, Callable] = {
    "an open-loop workload (a closed loop's next arrival depends on a receipt)": lambda e, open_loop, n: open_loop,
    "one replica (a router's choice depends on the others' state)": lambda e, open_loop, n: n == 1,
    "a step nothing can delay once launched (a booked D2H copy: on a port of its own, or one only this replica's "
    "TP/PP traffic shares with serial steps; TP/PP traffic only on ports of its own: one replica)":
        lambda e, open_loop, n: e.closed_form,
    "CPU processes that do not contend for cores": lambda e, open_loop, n: not e.proc.pool.contended,
    "no load generator on the host's cores (workload.client_cpu)": lambda e, open_loop, n: e.sink.loadgen is None,
    "detokenization in the API server (detokenizer: api_server) only in its own process":
        lambda e, open_loop, n: e.sv.detokenizer != "api_server" or not e.sink.sv.shared,
    "a separate detokenizer process (detokenizer: separate) only with the API servers in their own processes":
        lambda e, open_loop, n: e.sv.detokenizer != "separate" or not e.sink.sv.shared,
    "a step of lag (overlap: async or async_output) only with the API servers in their own processes":
        lambda e, open_loop, n: e.sv.overlap == "sync" or not e.sink.sv.shared,
    "no long-prefill token threshold": lambda e, open_loop, n: e.sv.long_prefill_token_threshold == 0,
    "a stream interval above 1 only with the API servers in their own processes":
        lambda e, open_loop, n: e.sv.stream_interval == 1 or not e.sink.sv.shared,
    "the roofline's step time (no hardware.step_time)": lambda e, open_loop, n: e.cost.step_time is None,
}
"""What a run needs of the engine beyond its serving keys: condition -> whether ``engine`` meets it."""


def engine_blockers(engine, open_loop: bool, replicas: int) -> list[str]:
    """The :data:`ENGINE_CONDITIONS` ``engine`` does not meet."""
    return [f"needs {name}" for name, holds in ENGINE_CONDITIONS.items() if not holds(engine, open_loop, replicas)]
