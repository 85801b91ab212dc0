"""Collectives two ways on the same link parameters: closed forms, and SimPy processes.

The closed forms assume an idle fabric with one link (bandwidth ``bw`` per direction,
latency ``lat``) per GPU and a full-duplex switch; the processes run the same rounds as
real concurrent transfers on a :class:`Topology`, so under contention they slow down
while the closed forms do not. ``nbytes`` is the full buffer size on each GPU.
"""

from __future__ import annotations

from typing import Sequence

import simpy

from simulator.hardware.topology import Topology


def p2p_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """One copy on an idle link: ``lat + nbytes / bw``."""
    return latency + nbytes / bandwidth


def _ring_time(steps: int, nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    return steps * (latency + nbytes / n / bandwidth) if n > 1 else 0.0


def ring_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce: 2(n−1) steps of nbytes/n: ``2(n−1)/n·nbytes/bw + 2(n−1)·lat``."""
    return _ring_time(2 * (n - 1), nbytes, n, bandwidth, latency)


def allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """All-reduce by the faster of the ring and two-shot algorithms serving engines pick from.

    Two-shot (TensorRT-LLM's custom all-reduce on a switched fabric: reduce-scatter then
    all-gather with direct peer access) moves the ring's 2(n-1)/n buffers in two latencies
    instead of 2(n-1). (One-shot, reading all n-1 peer buffers, moves more bytes for the same
    two latencies in this model, so it never wins here.)
    """
    if n <= 1:
        return 0.0
    two_shot = 2 * latency + 2 * (n - 1) / n * nbytes / bandwidth
    return min(ring_allreduce_time(nbytes, n, bandwidth, latency), two_shot)


def allgather_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather of an ``nbytes`` result: ``(n−1)/n·nbytes/bw + (n−1)·lat``."""
    return _ring_time(n - 1, nbytes, n, bandwidth, latency)


def reduce_scatter_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of an ``nbytes`` input: ``(n−1)/n·nbytes/bw + (n−1)·lat``."""
    return _ring_time(n - 1, nbytes, n, bandwidth, latency)


def alltoall_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """All-to-all: each GPU sends nbytes/n to each of the n−1 others at once.

    Every tx and rx port carries n−1 equal flows, so each runs at bw/(n−1) and all end
    together: ``lat + (n−1)/n·nbytes/bw``.
    """
    return latency + (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def _ring_rounds(topo: Topology, gpus: Sequence[int], chunk: float, rounds: int, label: str):
    gpus = list(gpus)
    n = len(gpus)
    if n < 2:
        return
    for r in range(rounds):
        sends = [topo.send(gpus[i], gpus[(i + 1) % n], chunk, f"{label}[{r}]")
                 for i in range(n)]
        yield topo.env.all_of(sends)


def allreduce(topo: Topology, gpus: Sequence[int], nbytes: float,
              label: str = "allreduce") -> simpy.Process:
    """Ring all-reduce of ``nbytes`` on each of ``gpus``: 2(n−1) rounds of nbytes/n."""
    n = len(gpus)
    return topo.env.process(_ring_rounds(topo, gpus, nbytes / max(n, 1), 2 * (n - 1), label))


def allgather(topo: Topology, gpus: Sequence[int], nbytes: float,
              label: str = "allgather") -> simpy.Process:
    """Ring all-gather to an ``nbytes`` result: n−1 rounds of nbytes/n."""
    n = len(gpus)
    return topo.env.process(_ring_rounds(topo, gpus, nbytes / max(n, 1), n - 1, label))


def reduce_scatter(topo: Topology, gpus: Sequence[int], nbytes: float,
                   label: str = "reduce_scatter") -> simpy.Process:
    """Ring reduce-scatter of an ``nbytes`` input: n−1 rounds of nbytes/n."""
    n = len(gpus)
    return topo.env.process(_ring_rounds(topo, gpus, nbytes / max(n, 1), n - 1, label))


def _alltoall(topo: Topology, gpus: Sequence[int], nbytes_per_gpu: float, label: str):
    n = len(gpus)
    if n < 2:
        return
    chunk = nbytes_per_gpu / n
    sends = [topo.send(s, d, chunk, label) for s in gpus for d in gpus if s != d]
    yield topo.env.all_of(sends)


def alltoall(topo: Topology, gpus: Sequence[int], nbytes_per_gpu: float,
             label: str = "alltoall") -> simpy.Process:
    """All-to-all: each GPU sends ``nbytes_per_gpu / n`` to every other GPU, all at once."""
    return topo.env.process(_alltoall(topo, list(gpus), nbytes_per_gpu, label))


def p2p(topo: Topology, src: int, dst: int, nbytes: float, label: str = "p2p") -> simpy.Process:
    """One point-to-point copy (e.g. between pipeline stages)."""
    return topo.send(src, dst, nbytes, label)
