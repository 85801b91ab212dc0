"""GPUs wired into nodes: the one owner of every route, which ports a copy crosses and its latency.

Every link is full duplex: each GPU has separate tx and rx ports on its GPU link (NVLink
through an NVSwitch), on its host link (PCIe), each node has a tx and an rx port on its NIC,
and the API server has a tx port towards the clients. Contention therefore happens at
endpoints, never inside a switch. Every pipeline builds its Topology once with
:meth:`Topology.from_hardware`, so a catalog link becomes per-direction port bandwidth by one
rule (:meth:`LinkParams.from_spec`: nominal bandwidth x achievable fraction).
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
    allreduce_bandwidth: float | None = None  # bus bandwidth an all-reduce reaches (None: ``bandwidth``)
    nccl_bandwidth: float | None = None  # NCCL's topology-model figure (None: ``bandwidth``)

    def __post_init__(self):
        if not self.bandwidth > 0:
            raise ValueError(f"link {self.name!r}: bandwidth must be > 0 bytes/s, "
                             f"got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ValueError(f"link {self.name!r}: latency must be >= 0 s, got {self.latency!r}")

    @classmethod
    def from_spec(cls, spec) -> "LinkParams":
        """The one conversion from a catalog :class:`~simulator.config.models.LinkSpec`: a port
        runs at the nominal bandwidth x the achievable fraction (``effective_bandwidth``), and an
        all-reduce at the measured NCCL bus bandwidth where the catalog has one."""
        return cls(spec.effective_bandwidth, spec.latency, spec.name, spec.allreduce_bandwidth,
                   spec.nccl_bandwidth)

    @property
    def collective_bandwidth(self) -> float:
        """Bandwidth an all-reduce's bytes move at on an idle link."""
        return self.allreduce_bandwidth or self.bandwidth

    @property
    def nccl(self) -> float:
        """The bandwidth NCCL plans this link with (its topology model), else the port bandwidth."""
        return self.nccl_bandwidth or self.bandwidth


@dataclass(frozen=True)
class NodeLayout:
    """Where each GPU of a node sits (its PCIe switch, CPU socket and NIC) and the links above it:
    the graph of a catalog node type (``hardware.node``), built once per Topology."""

    gpus: int
    nvlink_domain: int
    gpus_per_switch: int
    sockets: int
    p2p: str
    switch_uplink: LinkParams | None
    socket_link: LinkParams | None
    nic: LinkParams | None
    nics: int
    nvls: bool
    shm: LinkParams | None = None  # host-memory staging (NCCL's SHM transport) of a copy without peer access

    @classmethod
    def from_spec(cls, node) -> "NodeLayout":
        """From a validated :class:`~simulator.config.models.NodeSpec`."""
        return cls(node.gpus, node.nvlink_domain, node.gpus_per_switch, node.sockets, node.p2p,
                   as_link_params(node.switch_uplink, "switch_uplink"), as_link_params(node.socket_link, "socket_link"),
                   as_link_params(node.nic, "nic"), node.nics, node.nvls, as_link_params(getattr(node, "shm", None), "shm"))

    def switch(self, local: int) -> int | None:
        """The PCIe switch of a GPU (by its index in the node), None when it sits on a root port."""
        return local // self.gpus_per_switch if self.gpus_per_switch else None

    def socket(self, local: int) -> int:
        return local // (self.gpus // self.sockets)

    def nic_of(self, local: int) -> int:
        """The NIC a GPU's inter-node traffic leaves by: its own (rail-optimised), or its group's."""
        return local // (self.gpus // self.nics) if self.nics else 0


def as_link_params(link, name: str = "") -> LinkParams | None:
    """Normalize ``None``, a :class:`LinkParams`, a ``(bandwidth, latency)`` tuple of port
    figures, or a catalog LinkSpec (converted by :meth:`LinkParams.from_spec`)."""
    if link is None or isinstance(link, LinkParams):
        return link
    if isinstance(link, tuple):
        return LinkParams(float(link[0]), float(link[1]), name)
    if hasattr(link, "achievable"):
        return LinkParams.from_spec(link)
    raise TypeError(f"{name or 'link'}: expected None, LinkParams, (bandwidth, latency) or a "
                    f"LinkSpec, got {type(link).__name__}")


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
    as a bottleneck. Responses leave the API server on its ``client_link`` tx port.
    """

    def __init__(self, env: simpy.Environment, n_gpus: int, gpus_per_node: int,
                 gpu_link=None, host_link=None, node_link=None, recorder=None, client_link=None, node=None):
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
        self.client_link = as_link_params(client_link, "client_link")
        self.layout = node if isinstance(node, NodeLayout) or node is None else NodeLayout.from_spec(node)
        # without an environment the topology only prices routes (NCCL's view of a group): no fabric
        self.fabric = Fabric(env, recorder) if env is not None else None

    @classmethod
    def from_hardware(cls, env: simpy.Environment, hardware, n_gpus: int,
                      recorder=None) -> "Topology":
        """The topology of ``n_gpus`` GPUs of a scenario's validated ``hardware`` section."""
        return cls(env, n_gpus, hardware.gpus_per_node, hardware.gpu_link, hardware.host_link,
                   hardware.node_link, recorder, hardware.client_link, getattr(hardware, "node", None))

    @property
    def peer_link(self) -> LinkParams:
        """The link a GPU-to-GPU copy inside a node crosses: NVLink, else PCIe."""
        link = self.gpu_link or self.host_link
        if link is None:
            raise ValueError("this topology has neither a gpu_link nor a host_link")
        return link

    def client_port(self) -> Port:
        """The API server's tx port towards the clients."""
        if self.client_link is None:
            raise ValueError("this topology has no client_link")
        return self.fabric.port("client.tx", self.client_link.bandwidth)

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
        hops, latency = self.hops(src_gpu, dst_gpu)
        return [self.fabric.port(name, link.bandwidth) for name, link in hops], latency

    def hops(self, src_gpu: int, dst_gpu: int) -> tuple[list[tuple[str, LinkParams]], float]:
        """The (port name, link) pairs a ``src_gpu`` → ``dst_gpu`` copy crosses, and its latency (s)."""
        if self.layout is not None:
            return self._graph_hops(src_gpu, dst_gpu)
        return self._flat_hops(src_gpu, dst_gpu)

    def _graph_hops(self, src: int, dst: int) -> tuple[list[tuple[str, LinkParams]], float]:
        """Routes on a node type's graph: NVLink inside an NVLink domain; else up the source GPU's
        PCIe link (and its switch's uplink, unless both GPUs share a switch and may talk peer to
        peer), across the socket link where the sockets differ, and down to the destination; and
        between nodes, through each GPU's NIC. A pair that may not talk peer to peer stages
        through host memory: the same ports, a second copy's latency, and where the node type
        states its staging rate (``shm``) the sender's and the receiver's staging ports too."""
        lay = self.layout
        self._check_gpu(src)
        self._check_gpu(dst)
        if src == dst:
            return [], 0.0
        if self.gpu_link is not None and src // lay.nvlink_domain == dst // lay.nvlink_domain:
            link = self.gpu_link
            return [(f"gpu{src}.nvlink.tx", link), (f"gpu{dst}.nvlink.rx", link)], link.latency
        pcie = self._host(src)
        ns, nd = self.node_of(src), self.node_of(dst)
        a, b = src % lay.gpus, dst % lay.gpus
        if ns != nd:
            nic = lay.nic or self.node_link
            if nic is None:
                raise ValueError(f"GPUs {src} and {dst} are on nodes {ns} and {nd}, but the node has no NIC")
            return ([(f"gpu{src}.pcie.tx", pcie), (f"node{ns}.nic{lay.nic_of(a)}.tx", nic),
                     (f"node{nd}.nic{lay.nic_of(b)}.rx", nic), (f"gpu{dst}.pcie.rx", pcie)],
                    nic.latency + 2 * pcie.latency)
        sa, sb, ca, cb = lay.switch(a), lay.switch(b), lay.socket(a), lay.socket(b)
        direct = lay.p2p == "all" or (lay.p2p == "switch" and sa is not None and sa == sb)
        if sa is not None and sa == sb and direct:
            return [(f"gpu{src}.pcie.tx", pcie), (f"gpu{dst}.pcie.rx", pcie)], pcie.latency
        hops = [(f"gpu{src}.pcie.tx", pcie)]
        if sa is not None:
            hops.append((f"node{ns}.sw{sa}.up.tx", lay.switch_uplink))
        latency = pcie.latency
        if ca != cb:
            hops.append((f"node{ns}.socket{ca}to{cb}", lay.socket_link))
            latency += lay.socket_link.latency
        if sb is not None:
            hops.append((f"node{ns}.sw{sb}.up.rx", lay.switch_uplink))
        hops.append((f"gpu{dst}.pcie.rx", pcie))
        if direct:
            return hops, latency
        if lay.shm is not None:
            hops = [hops[0], (f"gpu{src}.shm.tx", lay.shm), *hops[1:], (f"gpu{dst}.shm.rx", lay.shm)]
        return hops, latency + pcie.latency

    def _flat_hops(self, src_gpu: int, dst_gpu: int) -> tuple[list[tuple[str, LinkParams]], float]:
        """The flat model (no node type): NVLink or PCIe ports at the two GPUs, NICs between nodes."""
        src_node, dst_node = self.node_of(src_gpu), self.node_of(dst_gpu)
        if src_gpu == dst_gpu:
            return [], 0.0
        if src_node != dst_node:
            link = self.node_link
            if link is None:
                raise ValueError(f"GPUs {src_gpu} and {dst_gpu} are on nodes {src_node} and "
                                 f"{dst_node} of {self.n_nodes}, but node_link is None")
            return [(f"node{src_node}.nic.tx", link), (f"node{dst_node}.nic.rx", link)], link.latency
        if self.gpu_link is not None:
            link = self.gpu_link
            return [(f"gpu{src_gpu}.nvlink.tx", link), (f"gpu{dst_gpu}.nvlink.rx", link)], link.latency
        link = self._host(src_gpu)
        return [(f"gpu{src_gpu}.pcie.tx", link), (f"gpu{dst_gpu}.pcie.rx", link)], link.latency

    def group_route(self, gpus) -> tuple[list[Port], float]:
        """Ports a ring collective over ``gpus`` keeps busy, and its slowest hop's latency: each
        GPU's copy to the next one in the ring (peer link inside a node, NICs between nodes)."""
        gpus = list(gpus)
        ports, latency = [], 0.0
        if len(gpus) < 2:
            return ports, latency
        for i, g in enumerate(gpus):
            route, lat = self.path(g, gpus[(i + 1) % len(gpus)])
            ports += route
            latency = max(latency, lat)
        return list(dict.fromkeys(ports)), latency

    def send(self, src: int, dst: int, nbytes: float, label: str = "") -> simpy.Process:
        """Copy ``nbytes`` from GPU ``src`` to GPU ``dst``; a copy to itself is free."""
        ports, latency = self.path(src, dst)
        return self.fabric.transfer(ports, nbytes, latency, label)

    def kv_route(self, src_gpu: int, dst_gpu: int, link: LinkParams | None = None) -> tuple[list[Port], float]:
        """Ports a KV-cache transfer between two GPUs crosses, and its latency: the topology's own
        route, or with ``link`` (disaggregation's ``kv_link``) that link's port at each GPU (a NIC
        per GPU, as on rail-optimised clusters)."""
        if link is None:
            return self.path(src_gpu, dst_gpu)
        return [self._port(f"gpu{src_gpu}", "kv", "tx", link), self._port(f"gpu{dst_gpu}", "kv", "rx", link)], link.latency

    def offload_route(self, gpu: int, direction: str, link: LinkParams | None = None) -> tuple[list[Port], float]:
        """Ports a KV copy between ``gpu`` and host memory crosses (``"tx"``: to the host): its host
        route, or with ``link`` (a what-if host link) that link's own port at the GPU."""
        if link is None:
            return self.host_route(gpu, direction)
        return [self._port(f"gpu{gpu}", "offload", direction, link)], link.latency

    def host_route(self, gpu: int, direction: str = "tx") -> tuple[list[Port], float]:
        """The ports of a D2H (``"tx"``) or H2D (``"rx"``) copy of ``gpu``, and its latency: its PCIe
        port, and on a node type with PCIe switches its switch's uplink too (host memory is above
        the root complex, so two GPUs under one switch share it)."""
        link = self._host(gpu)
        ports = [self._port(f"gpu{gpu}", "pcie", direction, link)]
        lay = self.layout
        if lay is not None and lay.switch(gpu % lay.gpus) is not None:
            name = f"node{self.node_of(gpu)}.sw{lay.switch(gpu % lay.gpus)}.up.{direction}"
            ports.append(self.fabric.port(name, lay.switch_uplink.bandwidth))
        return ports, link.latency

    def d2h(self, gpu: int, nbytes: float, label: str = "") -> simpy.Process:
        """Copy ``nbytes`` from ``gpu`` to host memory over its PCIe tx port."""
        ports, latency = self.host_route(gpu, "tx")
        return self.fabric.transfer(ports, nbytes, latency, label)

    def h2d(self, gpu: int, nbytes: float, label: str = "") -> simpy.Process:
        """Copy ``nbytes`` from host memory to ``gpu`` over its PCIe rx port."""
        ports, latency = self.host_route(gpu, "rx")
        return self.fabric.transfer(ports, nbytes, latency, label)
