"""One LLM replica's traffic on the shared Topology: per-step TP all-reduces (or DP attention's
expert all-to-alls) and PP sends, and the
D2H copy of the sampled token ids. One Fabric transfer per stage and per stage boundary per step
(not per layer), timed on an idle fabric exactly as the closed forms the cost model uses."""

from __future__ import annotations

import numpy as np

from ...hardware.link import booked_copy, copy_seconds, flow_rate
from ...hardware.topology import Topology
from ...invariants import checking, require

SAMPLED_ID_BYTES = 8
"""Bytes per sampled token id copied to the host: int64, the dtype torch.argmax/topk return and
vLLM's sampler casts its output to (vllm/v1/sample/sampler.py: ``sampled = sampled.long()``).
(Newer vLLM V1 narrows the returned ids to int32 before the copy: 4 bytes would model it.)"""


class ReplicaLinks:
    """The routes of one replica of ``stages`` (each a list of its TP GPUs) on ``topo``."""

    def __init__(self, topo: Topology, stages: list[list[int]], layers: int, activation_bytes, collective_parts,
                 host_shared: bool = False, free_d2h: bool = False, collectives_per_layer: float = 2,
                 collective: str = "all-reduce", sole: bool = False, serial: bool = False):
        self.fabric = topo.fabric
        self.free_d2h = free_d2h  # the counterfactual with the last mile free: the ids are on the host at once
        self.activation_bytes = activation_bytes  # tokens -> bytes of one hidden-state tensor
        # tokens -> (fixed seconds, seconds of bytes) of one collective, as the cost model has it, and how
        # many a layer runs (the cost model's ``collective_parts`` and ``collectives_per_layer``)
        self.collective_parts, self.per_layer, self.collective = collective_parts, collectives_per_layer, collective
        pp = len(stages)
        self.tp = len(stages[0])
        self.layers = [layers // pp + (s < layers % pp) for s in range(pp)]
        self.groups = [topo.group_route(g) for g in stages] if self.tp > 1 else []
        self.cap = topo.peer_link.collective_bandwidth
        self.sends = [topo.path(stages[s][0], stages[s + 1][0]) for s in range(pp - 1)]
        self.d2h_gpu = stages[-1][0]
        self.d2h_route = topo.host_route(self.d2h_gpu, "tx")
        # The sampled ids are copied on the step's stream, after its kernels, so one replica's
        # copies are serialized; where no TP/PP traffic shares the port (NVLink boxes, one GPU)
        # they are booked in closed form instead of run as Fabric flows (same times, no events).
        # ``host_shared``: other copies (KV offload, KV transfers over PCIe) use the host route too.
        # Where the TP/PP traffic crosses the copy's port (PCIe boxes), both are booked only for
        # a replica alone on the topology whose steps are ``serial``: each step's traffic begins
        # after the previous step's copy has ended, so the port never carries two at once.
        shared = {p for ports, _ in (*self.groups, *self.sends) for p in ports}
        self.d2h_booked = not host_shared and (not shared.intersection(self.d2h_route[0]) or (sole and serial))
        if self.d2h_booked:
            self.fabric.reserve(self.d2h_route[0])
        # ``sole``: this replica's traffic is alone on the topology (one replica, nothing else built
        # on it), so its TP/PP ports carry its step's communication only, one transfer after the
        # other: booked in closed form as well (the times :meth:`Fabric.move` gives a flow alone)
        self.comm_booked = sole and self.d2h_booked and self.has_comm
        self.comm_ports = sorted(shared, key=lambda p: p.name)
        if self.comm_booked:
            self.fabric.reserve(self.comm_ports)
        self._segments: dict[int, tuple] = {}  # tokens -> the step's transfers (:meth:`segments`)
        self.env = topo.env

    @property
    def has_comm(self) -> bool:
        return bool(self.groups or self.sends)

    def segments(self, tokens: int) -> tuple:
        """The step's communication for ``tokens`` tokens, stage by stage, as transfers (ports, bytes,
        latency, what, rate cap, seconds alone): the stage's collectives as one (the fixed costs of
        each, 2 per layer for TP's all-reduces, and their bytes at the collective's rate), then its
        activations to the next stage."""
        got = self._segments.get(tokens)
        if got is None:
            nbytes = self.activation_bytes(tokens)
            fixed, transfer = self.collective_parts(tokens) if self.groups else (0.0, 0.0)
            parts = []
            for s in range(len(self.layers)):
                if self.groups:
                    ports, _ = self.groups[s]
                    k = self.per_layer * self.layers[s]
                    parts.append((ports, k * transfer * self.cap, k * fixed, self.collective, self.cap))
                if s < len(self.sends):
                    ports, lat = self.sends[s]
                    parts.append((ports, nbytes, lat, "pp send", float("inf")))
            got = self._segments[tokens] = tuple((*p, copy_seconds(p[1], flow_rate(p[0], p[4])) if p[0] else 0.0)
                                                 for p in parts)
        return got

    def step_comm(self, tokens: int, label: str):
        """The step's communication as Fabric flows (:meth:`segments`), each after the one before."""
        for ports, nbytes, lat, what, cap, _ in self.segments(tokens):
            yield from self.fabric.move(ports, nbytes, lat, f"{label} {what}", max_rate=cap)

    def comm_end(self, tokens: int, start: float) -> float:
        """When the step's communication begun at ``start`` ends, on its reserved ports (``comm_booked``):
        each transfer after the one before, as :meth:`book_comm` books them."""
        for _, _, lat, _, _, seconds in self.segments(tokens):
            start = booked_copy(start, start, lat, seconds)[1]
        return start

    def book_comm(self, tokens: int, label: str, start: float) -> float:
        """Book the step's communication begun at ``start`` on its reserved ports (their busy time,
        bytes and spans, :meth:`Fabric.book`); returns when it ends (:meth:`comm_end`'s time)."""
        segments = self.segments(tokens)
        if checking():
            self._unqueued(start)
        for ports, nbytes, lat, what, cap, _ in segments:
            start = self.fabric.book(ports, nbytes, lat, f"{label} {what}", start, cap)
        return start

    def _unqueued(self, start: float) -> None:
        """COMM_UNQUEUED: the ports are free by ``start``, so the chain of :meth:`comm_end` is the booking's."""
        busy = max(p.booked_until for p in self.comm_ports)
        require("COMM_UNQUEUED", busy <= start, lambda: f"the ports are booked until {busy!r}, the traffic begins {start!r}")

    def settle_comm(self, tokens, starts, labels=None):
        """The communication of a closed-form run's steps (``tokens`` and ``starts``: each step's, as
        arrays) booked on the reserved ports; returns each step's seconds of it. With ``labels`` (the
        steps' span labels, where spans are recorded) each is booked as :meth:`book_comm` books one;
        otherwise their ends are the same chain of additions over the steps at once, and the ports'
        busy time and bytes are added as totals."""
        if labels is not None:
            return np.array([self.book_comm(n, label, st) for n, st, label in
                             zip(tokens.tolist(), starts.tolist(), labels)]) - starts
        self._unqueued(float(starts[0]))
        uniq, which = np.unique(tokens, return_inverse=True)
        per = [self.segments(int(n)) for n in uniq]
        end, totals = starts, []
        for j, (ports, *_rest) in enumerate(per[0]):
            lat, secs, nbytes = (np.array([segs[j][c] for segs in per])[which] for c in (2, 5, 1))
            end = (end + lat) + secs  # ``booked_copy``'s begin and end, step by step
            moved = nbytes > 0
            totals.append((ports, float(secs[moved].sum()), float(nbytes[moved].sum())))
        for ports, seconds, nbytes in totals:  # every port is free once the run's last step's traffic ends
            self.fabric.settle_run(ports, float(end[-1]), seconds, nbytes)
        return end - starts

    def d2h(self, sampled: int, label: str, issued: float | None = None):
        """Copy the step's ``sampled`` token ids from the last stage's GPU to the host, issued at
        ``issued`` (default: now; a Fabric flow starts when the caller reaches it)."""
        if self.free_d2h:
            return
        if self.d2h_booked:
            end = self.booked_d2h(sampled, label, self.env.now if issued is None else issued)
            yield self.env.timeout(end - self.env.now)
        else:
            ports, lat = self.d2h_route
            yield from self.fabric.move(ports, SAMPLED_ID_BYTES * sampled, lat, label)

    def d2h_bytes(self, sampled):
        """Bytes the copy of ``sampled`` token ids moves (none in the counterfactual, where it is free)."""
        return 0 * sampled if self.free_d2h else SAMPLED_ID_BYTES * sampled

    def d2h_terms(self) -> tuple[float, float]:
        """The copy's latency and its narrowest port's bandwidth (0 and infinite when it is free)."""
        if self.free_d2h:
            return 0.0, float("inf")
        ports, lat = self.d2h_route
        return lat, min(p.bandwidth for p in ports)

    def booked_d2h(self, sampled: int, label: str, issued: float) -> float:
        """The copy's end, booked in closed form on the replica's reserved D2H port."""
        if self.free_d2h:
            return issued
        ports, lat = self.d2h_route
        return self.fabric.book(ports, SAMPLED_ID_BYTES * sampled, lat, label, issued)
