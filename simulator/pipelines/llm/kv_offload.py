"""A CPU-memory tier for KV blocks: evicted prefix blocks and preempted requests' KV are copied to
host memory over the host link and copied back instead of recomputed.

The mechanism follows vLLM's KV offloading (``OffloadingConnector`` with its CPU backend,
``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py`` and
``vllm/v1/kv_offload/``, vLLM 0.11; the vLLM blog "KV offloading to CPU", 2025): blocks leaving
the GPU are stored in a host-memory LRU; a new request whose prefix is found there loads it with
an asynchronous H2D copy and waits (``WAITING_FOR_REMOTE_KVS``) while other requests run; then
it prefills only what is left. LMCache and SGLang's HiCache keep a host tier the same way.
What is copied out: every prefix unit as soon as it is cached on the GPU (``write_through``, as
vLLM's offloading connector and LMCache store computed blocks) or only the units the GPU cache
evicts (``write_back``, one of SGLang HiCache's write policies); a later request that misses on
the GPU but finds its prefix in host memory loads it. Preemption by swapping (vLLM V0's ``PreemptionMode.SWAP``) copies a preempted request's KV out and
back in, where recompute would prefill it again.

Copies run on the shared Fabric over the GPU's host route (``Topology.host_route``), so they
contend with the D2H copies of sampled token ids on the same PCIe port. One flow per copy carries
one GPU's shard (each GPU of a TP group copies its own over its own link).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .run_support import declare, only

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("kv_offload", only(None), "a run loads no KV back from a host tier", "kv_offload")


@dataclass
class Load:
    """A pending copy back to the GPU: the tokens it restores, the blocks it fills, its bytes."""

    tokens: int
    blocks: int
    nbytes: float


class HostTier:
    """One replica's host-memory KV store: keys (a prefix unit id, or ``("swap", rid)`` for a
    preempted request) -> bytes, least recently used first, within ``capacity`` bytes."""

    def __init__(self, capacity: float, block_bytes: float):
        self.capacity = capacity
        self.block_bytes = block_bytes
        self.entries: OrderedDict = OrderedDict()  # key -> (bytes, tokens)
        self.used = 0.0
        self.stored_bytes = 0.0
        self.loaded_bytes = 0.0
        self.loads = 0
        self.loaded_tokens = 0  # (:meth:`loaded`)
        self.dropped = 0

    def loaded(self, tokens: int) -> None:
        """A request's KV of ``tokens`` tokens was loaded back to the GPU."""
        self.loads += 1
        self.loaded_tokens += tokens

    def store(self, key, blocks: int, tokens: int = 0) -> float:
        """Keep ``blocks`` under ``key`` (``tokens``: the KV's tokens, for a swap), evicting the least recently used entries to make room;
        returns the bytes to copy out (0 when it cannot fit or is held already)."""
        nbytes = blocks * self.block_bytes
        if key in self.entries or nbytes > self.capacity:
            return 0.0
        while self.used + nbytes > self.capacity:
            _, (b, _t) = self.entries.popitem(last=False)
            self.used -= b
            self.dropped += 1
        self.entries[key] = (nbytes, tokens)
        self.used += nbytes
        self.stored_bytes += nbytes
        return nbytes

    def has(self, key) -> bool:
        return key in self.entries

    def take(self, key) -> tuple[float, int]:
        """Mark ``key`` as used now (it is loaded back; a prefix unit stays stored, a swap leaves)."""
        nbytes, tokens = self.entries[key]
        if isinstance(key, tuple):
            del self.entries[key]
            self.used -= nbytes
        else:
            self.entries.move_to_end(key)
        self.loaded_bytes += nbytes
        return nbytes, tokens

    def stats(self) -> dict:
        return {"stored_bytes": self.stored_bytes, "loaded_bytes": self.loaded_bytes, "loads": self.loads,
                "loaded_tokens": self.loaded_tokens, "dropped_entries": self.dropped}


def merged_stats(tiers) -> dict | None:
    """The replicas' host tiers summed (None without offload)."""
    tiers = [x for x in tiers if x is not None]
    if not tiers:
        return None
    return {k: sum(x.stats()[k] for x in tiers) for k in tiers[0].stats()}


class Offloader:
    """An engine's side of the host tier: copies out (fire and forget: the blocks are free once
    the copy is issued, as vLLM's offloading worker copies before the blocks are reused) and
    copies back in (the request waits for them), as flows on ``route`` (ports, latency) of the
    replica's first GPU."""

    def __init__(self, env, fabric, out_route, in_route, tier: HostTier, write_through: bool = True):
        self.env, self.fabric, self.tier = env, fabric, tier
        self.write_through = write_through
        self.out_route, self.in_route = out_route, in_route
        self.wake = None  # the engine's wake-up (:meth:`wake_with`)

    def wake_with(self, wake) -> None:
        """Call ``wake()`` once a load is done (the engine's wake-up)."""
        self.wake = wake

    def unit_evicted(self, key: int, blocks: int) -> None:
        """A prefix unit was computed (write-through) or left the GPU cache (write-back): keep it
        in host memory (a unit held there already is not copied again)."""
        self._copy_out(self.tier.store(key, blocks), f"offload unit {key}")

    def swap_out(self, rid: int, blocks: int, tokens: int) -> None:
        """A preempted request's KV goes to host memory instead of being dropped."""
        self._copy_out(self.tier.store(("swap", rid), blocks, tokens), f"swap out r{rid}")

    def _copy_out(self, nbytes: float, label: str) -> None:
        if nbytes > 0:
            ports, latency = self.out_route
            self.fabric.transfer(ports, nbytes, latency, label)

    def load(self, rid: int, nbytes: float, done) -> None:
        """Copy ``nbytes`` back to the GPU, then ``done()`` and wake the engine."""
        self.env.process(self._load(rid, nbytes, done))

    def _load(self, rid: int, nbytes: float, done):
        ports, latency = self.in_route
        yield from self.fabric.move(ports, nbytes, latency, f"load r{rid}")
        done()
        self.wake()
