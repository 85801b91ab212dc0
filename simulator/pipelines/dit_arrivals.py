"""Request arrival times for the DiT path, drawn from the scenario's workload and its own rng."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError


def open_loop_arrivals(workload, rng: np.random.Generator) -> np.ndarray | None:
    """Arrival times (s) of an open-loop workload; None for ``closed`` (clients drive it)."""
    n = workload.requests
    kind = workload.arrival
    if kind == "closed":
        return None
    if kind == "all_at_once":
        return np.zeros(n)
    if kind == "constant":
        return np.arange(n) / workload.rate
    if kind == "poisson":
        return np.cumsum(rng.exponential(1.0 / workload.rate, n)) - 0.0
    if kind == "gamma":
        cv = workload.burstiness
        shape = 1.0 / (cv * cv)
        return np.cumsum(rng.gamma(shape, 1.0 / (workload.rate * shape), n))
    raise ConfigError(f"arrival {kind!r} is not supported by the DiT path "
                      "(use poisson, gamma, constant, all_at_once or closed)", path="workload.arrival")
