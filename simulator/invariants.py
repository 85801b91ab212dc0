"""The simulator's named invariants, each checked where it can break (``docs/invariants.md`` lists them).

An invariant that does not hold is a bug in lastmile, never bad input: it raises
:class:`InvariantError` (an ``AssertionError``) naming the invariant. Cheap checks run in every run,
at the end or once per run of steps; the per-step checks (``checking()``) run in debug runs, with
the environment variable ``LASTMILE_CHECK=1`` or inside :func:`checks_on` (the tests use it).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

INVARIANTS = {
    "BLOCKS_CONSERVED": "a replica's KV blocks held privately by requests + free + cached in the prefix cache = "
                        "its capacity, none negative (block_pool.BlockPool; every step in debug runs, every "
                        "closed-form run and the end of every run)",
    "RUN_MATCHES_POOL": "a closed-form run's own count of free blocks equals the block pool's after the run "
                        "writes its requests' blocks back (decode_runs; every run)",
    "WAIT_WITHIN": "what a step's scheduling wait is split into (detokenization, output objects, messages, streaming) lies within the wait "
                   "(observe.attribution.wait_activity; every step)",
    "FINISHED_ONCE": "no request finishes twice (frontend.Frontend.on_finish; every finish)",
    "TOKENS_CONSERVED": "a finished request generated exactly its output tokens, and the client received "
                        "every one (frontend.Frontend.on_finish; every finish)",
    "STEP_ORDERED": "a step's times are ordered: submitted <= started <= scheduled <= GPU start <= GPU end <= "
                    "copied (engine; every step in debug runs)",
    "COMM_UNQUEUED": "a step's TP/PP traffic booked in closed form finds its ports free: the traffic before it "
                     "ended by the time its kernels end (links.ReplicaLinks; every closed-form run, every step in "
                     "debug runs)",
    "BREAKDOWN_SUMS": "a request's latency breakdown sums to its E2E (observe.llm_metrics; each request "
                      "in debug runs, the totals in every run)",
}
"""Every invariant's name and what it says (where it is checked, and how often)."""


class InvariantError(AssertionError):
    """An invariant of the simulation does not hold: a bug in lastmile."""


_ENV = os.environ.get("LASTMILE_CHECK", "") not in ("", "0")
_forced = 0


def checking() -> bool:
    """Whether the per-step (debug) checks run now."""
    return _ENV or _forced > 0


@contextmanager
def checks_on():
    """Run the per-step checks inside this block (as ``LASTMILE_CHECK=1`` does for a whole process)."""
    global _forced
    _forced += 1
    try:
        yield
    finally:
        _forced -= 1


def require(name: str, holds: bool, detail) -> None:
    """Raise :class:`InvariantError` for invariant ``name`` unless ``holds``; ``detail`` (a value or a
    callable giving one, so a passing check builds no text) says what was seen."""
    if not holds:
        assert name in INVARIANTS, name
        seen = detail() if callable(detail) else detail
        raise InvariantError(f"invariant {name} broken ({INVARIANTS[name]}): {seen}")
