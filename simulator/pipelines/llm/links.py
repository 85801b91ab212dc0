"""One LLM replica's traffic on the shared Topology: per-step TP all-reduces (or DP attention's
expert all-to-alls) and PP sends, and the
D2H copy of the sampled token ids. One Fabric transfer per stage and per stage boundary per step
(not per layer), timed on an idle fabric exactly as the closed forms the cost model uses."""

from __future__ import annotations

from ...hardware.topology import Topology
SAMPLED_ID_BYTES = 8
"""Bytes per sampled token id copied to the host: int64, the dtype torch.argmax/topk return and
vLLM's sampler casts its output to (vllm/v1/sample/sampler.py: ``sampled = sampled.long()``).
(Newer vLLM V1 narrows the returned ids to int32 before the copy: 4 bytes would model it.)"""


class ReplicaLinks:
    """The routes of one replica of ``stages`` (each a list of its TP GPUs) on ``topo``."""

    def __init__(self, topo: Topology, stages: list[list[int]], layers: int, activation_bytes, collective_parts,
                 host_shared: bool = False, free_d2h: bool = False, collectives_per_layer: float = 2,
                 collective: str = "all-reduce"):
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
        shared = {p for ports, _ in (*self.groups, *self.sends) for p in ports}
        self.d2h_booked = not host_shared and not shared.intersection(self.d2h_route[0])
        if self.d2h_booked:
            self.fabric.reserve(self.d2h_route[0])
        self.env = topo.env

    @property
    def has_comm(self) -> bool:
        return bool(self.groups or self.sends)

    def step_comm(self, tokens: int, label: str):
        """The step's communication, stage by stage: the stage's collectives as one transfer (the
        fixed costs of each, 2 per layer for TP's all-reduces, and their bytes at the collective's
        rate), then its activations to the next stage."""
        nbytes = self.activation_bytes(tokens)
        fixed, transfer = self.collective_parts(tokens) if self.groups else (0.0, 0.0)
        for s in range(len(self.layers)):
            if self.groups:
                ports, _ = self.groups[s]
                k = self.per_layer * self.layers[s]
                yield from self.fabric.move(ports, k * transfer * self.cap, k * fixed, f"{label} {self.collective}",
                                            max_rate=self.cap)
            if s < len(self.sends):
                ports, lat = self.sends[s]
                yield from self.fabric.move(ports, nbytes, lat, f"{label} pp send")

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
