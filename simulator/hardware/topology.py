"""GPUs wired into nodes: which ports a copy crosses, and with what latency.

Every link is full duplex: each GPU has separate tx and rx ports on its GPU link (NVLink
through an NVSwitch), on its host link (PCIe), and each node has a tx and an rx port on
its NIC. Contention therefore happens at endpoints, never inside a switch.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simulator.hardware.link import Fabric, Port


@dataclass(frozen=True)
class LinkParams:
    """Per-direction bandwidth (bytes/s) and one-way latency (s) of a link."""

    bandwidth: float
    latency: float
    name: str = ""

    def __post_init__(self):
        if not self.bandwidth > 0:
            raise ValueError(f"link {self.name!r}: bandwidth must be > 0 bytes/s, "
                             f"got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ValueError(f"link {self.name!r}: latency must be >= 0 s, got {self.latency!r}")


def as_link_params(link, name: str = "") -> LinkParams | None:
    """Normalize ``None``, a ``(bandwidth, latency)`` tuple or any object with
    ``.bandwidth`` and ``.latency`` into a validated :class:`LinkParams`."""
    if link is None or isinstance(link, LinkParams):
        return link
    if isinstance(link, tuple):
        return LinkParams(float(link[0]), float(link[1]), name)
    return LinkParams(float(link.bandwidth), float(link.latency),
                      getattr(link, "name", "") or name)


class Topology:
    """``n_gpus`` GPUs, ``gpus_per_node`` to a node, and the ports between them.

    Routing rules:

    - same node, ``gpu_link`` given (NVLink + NVSwitch): src NVLink tx + dst NVLink rx,
      so any pair runs at the full per-GPU bandwidth and contends only at its GPUs;
    - same node, no ``gpu_link`` (PCIe-only box): src PCIe tx + dst PCIe rx, so peer
      copies share the host ports with D2H/H2D copies;
    - different nodes: src node NIC tx + dst node NIC rx (``node_link`` is the node's
      aggregate NIC bandwidth per direction), with the ``node_link`` latency.

    D2H uses the GPU's PCIe tx port, H2D its PCIe rx port; the host side is not modelled
    as a bottleneck.
    """

    def __init__(self, env: simpy.Environment, n_gpus: int, gpus_per_node: int,
                 gpu_link=None, host_link=None, node_link=None, recorder=None):
        if n_gpus < 1:
            raise ValueError(f"n_gpus must be >= 1, got {n_gpus!r}")
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node!r}")
        self.env = env
        self.n_gpus = n_gpus
        self.gpus_per_node = gpus_per_node
        self.n_nodes = -(-n_gpus // gpus_per_node)
        self.gpu_link = as_link_params(gpu_link, "gpu_link")
        self.host_link = as_link_params(host_link, "host_link")
        self.node_link = as_link_params(node_link, "node_link")
        if self.n_nodes > 1 and self.node_link is None:
            raise ValueError(f"{n_gpus} GPUs at {gpus_per_node} per node span "
                             f"{self.n_nodes} nodes, but node_link is None")
        self.fabric = Fabric(env, recorder)

    def node_of(self, gpu: int) -> int:
        """Index of the node holding ``gpu``."""
        self._check_gpu(gpu)
        return gpu // self.gpus_per_node

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < self.n_gpus:
            raise ValueError(f"GPU index {gpu!r} out of range 0..{self.n_gpus - 1}")

    def _port(self, owner: str, kind: str, direction: str, link: LinkParams) -> Port:
        return self.fabric.port(f"{owner}.{kind}.{direction}", link.bandwidth)

    def _host(self, gpu: int) -> LinkParams:
        self._check_gpu(gpu)
        if self.host_link is None:
            raise ValueError("this topology has no host_link (PCIe): no D2H/H2D or PCIe peer path")
        return self.host_link

    def path(self, src_gpu: int, dst_gpu: int) -> tuple[list[Port], float]:
        """Ports a ``src_gpu`` → ``dst_gpu`` copy crosses, and its latency (s)."""
        src_node, dst_node = self.node_of(src_gpu), self.node_of(dst_gpu)
        if src_gpu == dst_gpu:
            return [], 0.0
        if src_node != dst_node:
            link = self.node_link
            return [self._port(f"node{src_node}", "nic", "tx", link),
                    self._port(f"node{dst_node}", "nic", "rx", link)], link.latency
        if self.gpu_link is not None:
            link = self.gpu_link
            return [self._port(f"gpu{src_gpu}", "nvlink", "tx", link),
                    self._port(f"gpu{dst_gpu}", "nvlink", "rx", link)], link.latency
        link = self._host(src_gpu)
        return [self._port(f"gpu{src_gpu}", "pcie", "tx", link),
                self._port(f"gpu{dst_gpu}", "pcie", "rx", link)], link.latency

    def send(self, src: int, dst: int, nbytes: float, label: str = "") -> simpy.Process:
        """Copy ``nbytes`` from GPU ``src`` to GPU ``dst``; a copy to itself is free."""
        ports, latency = self.path(src, dst)
        return self.fabric.transfer(ports, nbytes, latency, label)

    def d2h(self, gpu: int, nbytes: float, label: str = "") -> simpy.Process:
        """Copy ``nbytes`` from ``gpu`` to host memory over its PCIe tx port."""
        link = self._host(gpu)
        return self.fabric.transfer([self._port(f"gpu{gpu}", "pcie", "tx", link)],
                                    nbytes, link.latency, label)

    def h2d(self, gpu: int, nbytes: float, label: str = "") -> simpy.Process:
        """Copy ``nbytes`` from host memory to ``gpu`` over its PCIe rx port."""
        link = self._host(gpu)
        return self.fabric.transfer([self._port(f"gpu{gpu}", "pcie", "rx", link)],
                                    nbytes, link.latency, label)
