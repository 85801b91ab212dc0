"""How a request is spread over engine replicas: one class per ``serving.router``, named in ``ROUTERS``.

A router is made per frontend (it may keep state) and asked for a replica index, given the
engines (each has ``outstanding``: requests routed to it and not yet finished).
"""

from __future__ import annotations


class RoundRobin:
    """Replicas in turn, whatever their load (a plain load balancer in front of the replicas)."""

    def __init__(self):
        self._next = 0

    def pick(self, engines) -> int:
        k = self._next
        self._next = (self._next + 1) % len(engines)
        return k


class LeastOutstanding:
    """The replica with the fewest unfinished requests, the lowest index on ties: a load-based
    choice, as vLLM's data-parallel coordinator and SGLang's router (when loads are imbalanced) make."""

    def pick(self, engines) -> int:
        return min(range(len(engines)), key=lambda i: (engines[i].outstanding, i))


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding}
"""``serving.router`` -> the router class."""
