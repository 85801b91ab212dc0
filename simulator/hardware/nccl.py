"""Collectives as NCCL runs them: its algorithms and protocols, priced by its own tuning model on a
Topology's routes, the fastest chosen as NCCL chooses.

NCCL (github.com/NVIDIA/nccl, commit 5067397c, NCCL 2.30.7) prices every (algorithm, protocol)
pair as ``latency + bytes / bandwidth`` and runs the cheapest (src/graph/tuning.cc,
``ncclTopoGetAlgoTime``; src/enqueue.cc). The figures below are that file's:

- **latency**: a base per algorithm and protocol plus a per-step latency by the hop's hardware
  (NVLink, PCIe, network); a ring all-reduce has 2(n-1) steps, of which 2(nodes-1) cross the
  network (n-1 and nodes-1 for all-gather and reduce-scatter);
- **bandwidth**: the ring's bottleneck — the slowest hop, each port shared by the ring's hops that
  cross it, at the bandwidth NCCL's topology model gives the link (``LinkSpec.nccl_bandwidth``:
  its NVLink per-link constants times the GPU's links, PCIe width x speed, NIC speed); between
  nodes NCCL runs a ring per NIC (channels spread over the rails), so the network hop carries the
  node's NICs together. LL moves 8 bytes of data per 16 (half the bandwidth, capped at
  ``LL_MAX_BW``); LL128 120 of 128 (0.92, NCCL's factor), and only over NVLink; Simple all of it;
- **NVLS** (NVLink SHARP, NVSwitch gen3 and later, one node, more than two GPUs): the switch
  reduces and multicasts, so each GPU's link carries its buffer out once and the result in once,
  plus one n-th of each for its own slice: algbw = B·n/(n+1) at NCCL's NVLS efficiency (0.85
  Hopper, 0.74 Blackwell), after a 25 us NVLS step.

- **Tree** (all-reduce only): a chain inside each node and a double binary tree between nodes;
  its latency is tuning.cc's ``2 * ((ppn-1) * intraLat + log2(nodes) * interLat)`` over the tree's
  base, its bus bandwidth the tree graph's (the node's chain on one or two nodes, where NCCL lets
  the chain run at up to twice the network's rate, the network beyond) times 0.92, LL a further
  1/3.8 (capped at ``LL_MAX_BW``), LL128 7/9 on one node and 120/128 across nodes; tree's bus
  bandwidth converts to algorithm bandwidth at 1/2 (tuning.cc ``ratio *= .5``);
- **NVLSTree** (all-reduce across nodes whose GPUs each sit in an NVLink SHARP domain): NVLS
  inside each node, a tree of the nodes' NICs between them. Priced from its traffic like NVLS:
  each GPU's link carries its buffer out and the result in (B x NVLS efficiency), and each
  node's NICs carry the reduced buffer once each way on two nodes (each node roots half of it),
  twice beyond (an inner tree node hears from two children); latency tuning.cc's
  ``intraLat + 2 log2(nodes) interLat`` (25 us NVLink, 20.9 us network).

A plan's ``busbw`` is nccl-tests' bus bandwidth (doc/PERFORMANCE.md): algbw x 2(n-1)/n for an
all-reduce, x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1 for send/receive.
Not modelled: CollNet (needs SHARP-capable switches), PAT (one GPU per node), and tuning.cc's
per-channel bandwidth caps (perChMax*Bws times NCCL's channel count; above every bus bandwidth
priced here at the channel counts NCCL opens on these boxes).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

PROTOCOLS = ("LL", "LL128", "Simple")

BASE_LATENCY_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
                   "nvls": {"Simple": 0.0}, "nvls_tree": {"Simple": 0.0}}
"""tuning.cc baseLat (us) per algorithm and protocol."""

HW_LATENCY_US = {
    "nvlink": {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}, "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
               "nvls": {"Simple": 25.0}, "nvls_tree": {"Simple": 25.0}},
    "pci": {"ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}, "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}},
    "net": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}, "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
            "nvls": {"Simple": 18.0}, "nvls_tree": {"Simple": 20.9}},
}
"""tuning.cc hwLat (us per step) by hardware, algorithm and protocol."""

LL_MAX_BW = {"volta": (39.0e9, 39.0e9, 20.4e9), "ampere": (87.7e9, 22.5e9, 19.0e9),
             "ada": (87.7e9, 22.5e9, 19.0e9), "hopper": (141.0e9, 45.0e9, 35.0e9),
             "blackwell": (282.0e9, 90.0e9, 70.0e9)}
"""tuning.cc llMaxBws (bytes/s) by architecture, for 1, 2 and 4+ nodes (Ada is sm89: the Ampere row)."""

LL_FACTOR, LL128_FACTOR = 0.5, 0.92
"""tuning.cc: LL carries 8 data bytes per 16 (busBw * 0.5); LL128 120 of 128 (busBw * 0.92)."""

TREE_FACTOR, TREE_LL_FACTOR = 0.92, 1 / 3.8
TREE_LL128_FACTOR = {True: 7.0 / 9.0, False: 120.0 / 128.0}  # one node / across nodes
TREE_ALGBW_RATIO = 0.5
"""tuning.cc's tree refinements: an all-reduce tree's busBw x 0.92, LL x 1/3.8 (capped at llMaxBw),
LL128 x 7/9 on one node and 120/128 across; algorithm bandwidth = tree busBw x 0.5."""

NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""tuning.cc nvlsEfficiency by architecture (0 before Hopper: no NVLink SHARP)."""

NVLS_MAX_ARITY = 32
"""src/include/device.h NCCL_MAX_NVLS_ARITY: NVLS heads (GPU:NIC pairs, search.cc) per node at most."""

STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1}
NET_STEPS = {"all_reduce": lambda m: 2 * (m - 1), "all_gather": lambda m: m - 1, "reduce_scatter": lambda m: m - 1}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` on ``n`` ranks."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective == "sendrecv":
        return 1.0
    return (n - 1) / n


@dataclass(frozen=True)
class Plan:
    """One way NCCL can run a collective, priced: its time for ``nbytes`` and nccl-tests' busbw."""

    algorithm: str
    protocol: str
    latency: float
    algbw: float
    time: float
    busbw: float


@dataclass(frozen=True)
class Group:
    """What NCCL's model needs of a group of GPUs on a Topology: ranks, nodes, the ring's
    bottleneck inside a node and across the network, and the hardware class of its hops."""

    n: int
    nodes: int
    intra_bw: float
    net_bw: float
    intra_hw: str
    nvls: float  # NVLS bandwidth per GPU (B x efficiency), 0 where NVLS does not apply
    pair_bw: float  # bottleneck of an all-to-all: each GPU to every other at once
    pair_hw: str
    arch: str
    nic_bw: float = math.inf  # one NIC: what a single flow between nodes gets
    nvls_node: float = 0.0  # NVLS bandwidth per GPU inside each node, across nodes (NVLSTree), else 0
    heads_bw: float = math.inf  # the node's NICs an NVLSTree's heads use (at most NVLS_MAX_ARITY of them)

    @property
    def ppn(self) -> int:
        """Ranks per node (NCCL's ppn)."""
        return self.n // self.nodes


def _bottleneck(routes) -> float:
    """The slowest of ``routes`` (each a list of (port, link)) when all run at once, ports shared."""
    flows = Counter(name for hops in routes for name, _ in hops)
    return min((min(link.nccl / flows[name] for name, link in hops) for hops in routes if hops),
               default=math.inf)


def _hw(routes) -> str:
    names = [name for hops in routes for name, _ in hops]
    return "nvlink" if names and all(".nvlink." in n for n in names) else "pci"


def group(topo, gpus, arch: str = "other") -> Group:
    """The NCCL view of ``gpus`` (in ring order) on ``topo``."""
    gpus = list(gpus)
    n = len(gpus)
    lay = topo.layout
    # NCCL's "node" is what its intra-node transport reaches: a whole NVLink domain (multi-node
    # NVLink, as on NVL72) where there is one, else the host
    nvl = lay is not None and topo.gpu_link is not None
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        by_node.setdefault(g // lay.nvlink_domain if nvl else topo.node_of(g), []).append(g)
    nodes = len(by_node)
    local = next(iter(by_node.values()))
    intra = [topo.hops(local[i], local[(i + 1) % len(local)])[0] for i in range(len(local))] if len(local) > 1 else []
    intra_bw = _bottleneck(intra)
    net_bw = nic_bw = heads_bw = math.inf
    if nodes > 1:
        nic = (lay.nic if lay is not None and lay.nic is not None else topo.node_link)
        if nic is None:
            raise ValueError("a group across nodes needs the node's NIC (hardware.node or node_link)")
        # the NICs the node's GPUs reach the network by; a multi-node NVLink domain is one NCCL node
        # (its hosts' topologies fused, topo.cc ncclTopoFuseXml), so it counts every host's NICs
        rails = (len({(topo.node_of(g), lay.nic_of(g % lay.gpus)) for g in local})
                 if lay is not None and lay.nics else 1)
        net_bw, nic_bw = rails * nic.nccl, nic.nccl
        heads_bw = min(rails, NVLS_MAX_ARITY) * nic.nccl
    nvls = nvls_node = 0.0
    if nvl and lay.nvls and n > 2:  # NVLink SHARP in each domain (nodes count domains here)
        per_gpu = topo.gpu_link.nccl * NVLS_EFFICIENCY.get(arch, 0.0)
        if nodes == 1:
            nvls = per_gpu
        elif len(local) > 1:
            nvls_node = per_gpu
    pairs = [topo.hops(s, d)[0] for s in gpus for d in gpus if s != d]
    return Group(n, nodes, intra_bw, net_bw, _hw(intra) if intra else "pci", nvls, _bottleneck(pairs),
                 "net" if nodes > 1 else _hw(pairs), arch, nic_bw, nvls_node, heads_bw)


def group_on(hardware, gpus) -> Group:
    """The NCCL view of ``gpus`` (GPU indices, in ring order) of a scenario's validated ``hardware``,
    on a topology built for them (its routes alone: no environment, no fabric)."""
    from .topology import Topology

    gpus = list(gpus)
    topo = Topology.from_hardware(None, hardware, max(gpus) + 1)
    return group(topo, gpus, hardware.gpu.arch)


def plans(grp: Group, collective: str, nbytes: float) -> list[Plan]:
    """Every algorithm and protocol NCCL could run ``collective`` of ``nbytes`` with, priced."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    n = grp.n
    if n < 2:
        return [Plan("none", "none", 0.0, math.inf, 0.0, math.inf)]
    factor = bus_factor(collective, n)
    out = []
    if collective in ("alltoall", "sendrecv"):  # grouped point-to-point sends (Simple)
        hw = grp.pair_hw if collective == "alltoall" else ("net" if grp.nodes > 1 else grp.intra_hw)
        latency = (BASE_LATENCY_US["ring"]["Simple"] + HW_LATENCY_US[hw]["ring"]["Simple"]) * 1e-6
        # all-to-all: each GPU sends nbytes/n to each of the n-1 others at once, each flow at the
        # bottleneck pair rate (pair_bw: the busiest port's bandwidth over the flows on it), so the
        # buffer moves at n x pair_bw; send/receive (nccl-tests sendrecv): each GPU sends its buffer
        # to the next, all at once, the pair that crosses to the next node through one NIC
        algbw = grp.n * grp.pair_bw if collective == "alltoall" else min(grp.intra_bw, grp.nic_bw)
        time = latency + nbytes / algbw
        return [Plan("p2p", "Simple", latency, algbw, time, nbytes / time * factor)]
    steps, net_steps = STEPS[collective](n), NET_STEPS[collective](grp.nodes)
    bus = min(grp.intra_bw, grp.net_bw)
    cap = LL_MAX_BW.get(grp.arch, LL_MAX_BW["ampere"])[0 if grp.nodes == 1 else 1 if grp.nodes == 2 else 2]
    for proto in PROTOCOLS:
        if proto == "LL128" and grp.intra_hw != "nvlink":
            continue  # NCCL enables LL128 by default only over NVLink
        intra_steps = steps - net_steps
        latency = (BASE_LATENCY_US["ring"][proto] + intra_steps * HW_LATENCY_US[grp.intra_hw]["ring"][proto]
                   + net_steps * HW_LATENCY_US["net"]["ring"][proto]) * 1e-6
        busbw = {"LL": min(LL_FACTOR * bus, cap), "LL128": LL128_FACTOR * bus, "Simple": bus}[proto]
        algbw = busbw / factor
        time = latency + nbytes / algbw
        out.append(Plan("ring", proto, latency, algbw, time, nbytes / time * factor))
    if collective == "all_reduce":
        out += _tree_plans(grp, nbytes, factor, cap)
    if collective == "all_reduce" and grp.nvls > 0:
        latency = HW_LATENCY_US["nvlink"]["nvls"]["Simple"] * 1e-6
        algbw = grp.nvls * n / (n + 1)
        time = latency + nbytes / algbw
        out.append(Plan("nvls", "Simple", latency, algbw, time, nbytes / time * factor))
    if collective == "all_reduce" and grp.nvls_node > 0 and grp.nodes > 1:
        steps = max(1, math.floor(math.log2(grp.nodes)))  # tuning.cc log2i(nNodes)
        latency = (HW_LATENCY_US["nvlink"]["nvls_tree"]["Simple"]
                   + 2 * steps * HW_LATENCY_US["net"]["nvls_tree"]["Simple"]) * 1e-6
        algbw = min(grp.nvls_node, grp.heads_bw * (1.0 if grp.nodes <= 2 else 0.5))
        time = latency + nbytes / algbw
        out.append(Plan("nvls_tree", "Simple", latency, algbw, time, nbytes / time * factor))
    return out


def _tree_plans(grp: Group, nbytes: float, factor: float, ll_cap: float) -> list[Plan]:
    """NCCL's tree all-reduce, one plan per protocol (tuning.cc's tree latencies and factors)."""
    one_node = grp.nodes == 1
    # the tree graph's bandwidth: its chain on one or two nodes (NCCL lets a 2-node tree's chain run at up to
    # twice the network's rate, search.cc "increase bwIntra for trees"), the network beyond
    bw = min(grp.intra_bw, (2.0 if grp.nodes <= 2 else 1.0) * grp.net_bw)
    depth = max(0, math.floor(math.log2(grp.nodes))) if grp.nodes > 1 else 0
    out = []
    for proto in PROTOCOLS:
        if proto == "LL128" and grp.intra_hw != "nvlink":
            continue
        latency = (BASE_LATENCY_US["tree"][proto] + 2 * ((grp.ppn - 1) * HW_LATENCY_US[grp.intra_hw]["tree"][proto]
                                                         + depth * HW_LATENCY_US["net"]["tree"][proto])) * 1e-6
        bus = TREE_FACTOR * bw
        if proto == "LL":
            bus = min(bus * TREE_LL_FACTOR, ll_cap)
        elif proto == "LL128":
            bus *= TREE_LL128_FACTOR[one_node]
        algbw = bus * TREE_ALGBW_RATIO
        time = latency + nbytes / algbw
        out.append(Plan("tree", proto, latency, algbw, time, nbytes / time * factor))
    return out


def best(grp: Group, collective: str, nbytes: float) -> Plan:
    """The plan NCCL's tuning model picks: the one it predicts fastest."""
    return min(plans(grp, collective, nbytes), key=lambda p: p.time)
