"""Node types (``hardware.node``): the topology graph's routes, NCCL's collective model on it, and the
one-line errors of a node that contradicts the scenario."""

from __future__ import annotations

import pytest
import simpy

import simulator
from simulator.config import catalog
from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.hardware import nccl
from simulator.hardware.topology import Topology


def hardware(node: str):
    return load_scenario({"model": "llama-3-8b", "hardware": {"node": node}}).hardware


def topology(node: str, nodes: int = 1) -> Topology:
    hw = hardware(node)
    return Topology.from_hardware(simpy.Environment(), hw, nodes * hw.gpus_per_node)


def names(topo, src, dst):
    return [name for name, _ in topo.hops(src, dst)[0]]


def test_every_node_type_loads_and_runs_a_scenario():
    for name in catalog.names("nodes"):
        hw = hardware(name)
        assert hw.node.name == name and hw.gpu.name == hw.node.gpu and hw.gpus_per_node == hw.node.gpus
        r = simulator.run({"model": "llama-3-8b", "hardware": {"node": name},
                           "workload": {"requests": 2, "arrival": "all_at_once", "prompt_tokens": 64,
                                        "output_tokens": 4}})
        assert r.summary["status"] == "ok", name


def test_a_node_that_contradicts_the_gpu_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"hardware\.gpu: 'h100-sxm' is not the GPU of node 'pcie-8xl20'.*l20"):
        load_scenario({"model": "llama-3-8b", "hardware": {"node": "pcie-8xl20", "gpu": "h100-sxm"}})
    with pytest.raises(ConfigError, match=r"hardware\.gpus_per_node"):
        load_scenario({"model": "llama-3-8b", "hardware": {"node": "hgx-h100", "gpus_per_node": 4}})
    with pytest.raises(ConfigError, match=r"hardware\.node.*unknown node 'hgx-h1000'.*did you mean"):
        load_scenario({"model": "llama-3-8b", "hardware": {"node": "hgx-h1000"}})


def test_pcie_routes_climb_as_far_as_the_pair_needs():
    t = topology("pcie-8xl40s")  # 2 sockets x 1 switch of 4 GPUs, P2P under a switch only
    assert names(t, 0, 1) == ["gpu0.pcie.tx", "gpu1.pcie.rx"]
    assert names(t, 0, 5) == ["gpu0.pcie.tx", "node0.sw0.up.tx", "node0.socket0to1", "node0.sw1.up.rx",
                              "gpu5.pcie.rx"]
    pcie, socket = t.host_link.latency, t.layout.socket_link.latency
    assert t.hops(0, 5)[1] == pytest.approx(2 * pcie + socket)  # staged through host memory: a second copy
    assert t.hops(0, 1)[1] == pytest.approx(pcie)
    assert [p.name for p in t.host_route(2)[0]] == ["gpu2.pcie.tx", "node0.sw0.up.tx"]  # D2H shares the uplink


def test_nvlink_inside_a_domain_and_nics_between_nodes():
    t = topology("hgx-h100", nodes=2)
    assert names(t, 0, 5) == ["gpu0.nvlink.tx", "gpu5.nvlink.rx"]
    assert names(t, 3, 11) == ["gpu3.pcie.tx", "node0.nic3.tx", "node1.nic3.rx", "gpu11.pcie.rx"]
    rack = topology("gb200-nvl72", nodes=4)  # 4-GPU trays in one 72-GPU NVLink domain
    assert names(rack, 0, 13) == ["gpu0.nvlink.tx", "gpu13.nvlink.rx"]


def test_ring_all_reduce_is_nccls_latency_plus_bytes_over_the_bottleneck():
    t = topology("dgx-a100")
    grp = nccl.group(t, range(8), "ampere")
    assert grp.intra_bw == pytest.approx(240e9) and grp.intra_hw == "nvlink" and grp.nvls == 0
    size = 1 << 33
    simple = next(p for p in nccl.plans(grp, "all_reduce", size) if p.protocol == "Simple")
    latency = (8.4 + 14 * 3.4) * 1e-6
    assert simple.time == pytest.approx(latency + size / (240e9 * 8 / 14), rel=1e-12)
    assert nccl.best(grp, "all_reduce", 64).protocol == "LL"        # latency-bound: LL
    assert nccl.best(grp, "all_reduce", size).protocol == "Simple"  # bandwidth-bound: Simple


def test_nvls_wins_large_all_reduces_on_nvswitch_gen3_and_only_there():
    grp = nccl.group(topology("hgx-h200"), range(8), "hopper")
    big = nccl.best(grp, "all_reduce", 1 << 34)
    assert big.algorithm == "nvls"
    assert big.algbw == pytest.approx(370.8e9 * 0.85 * 8 / 9, rel=1e-12)
    assert nccl.best(grp, "all_reduce", 1 << 16).algorithm == "ring"
    assert nccl.best(grp, "all_gather", 1 << 34).algorithm == "ring"  # NVLS here is all-reduce only
    pcie = nccl.group(topology("pcie-8xl40s"), range(8), "ada")
    assert pcie.intra_hw == "pci" and all(p.protocol != "LL128" for p in nccl.plans(pcie, "all_reduce", 1 << 20))


def test_cross_socket_pcie_ring_is_held_to_the_socket_link():
    grp = nccl.group(topology("pcie-8xl40s"), range(8), "ada")
    socket = hardware("pcie-8xl40s").node.socket_link.nccl_bandwidth
    assert grp.intra_bw == pytest.approx(socket)  # the ring crosses the sockets once each way


def test_tensor_parallel_traffic_on_a_pcie_box_shows_on_switch_and_socket_tracks():
    """Issue 14's acceptance: a TP run on a PCIe box (the shipped scenario, a short workload) shows its
    all-reduce on every link it crosses: each GPU's port on its PCIe switch, both switches' uplinks to their
    CPU root complexes, and the socket link both ways."""
    import yaml
    from pathlib import Path

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "scenarios/llm/pcie_8xl40s_tp8.yaml").read_text())
    raw["workload"] = {"requests": 2, "arrival": "all_at_once", "prompt_tokens": 64, "output_tokens": 3}
    r = simulator.run(raw)
    links = r.spans[r.spans.track.str.startswith("link:")]
    tracks = set(links.track)
    assert {f"link:gpu{g}.pcie.{d}" for g in range(8) for d in ("tx", "rx")} <= tracks          # switch ports
    assert {f"link:node0.sw{s}.up.{d}" for s in (0, 1) for d in ("tx", "rx")} <= tracks        # to the root complexes
    assert {"link:node0.socket0to1", "link:node0.socket1to0"} <= tracks                         # between the sockets
    assert (links[links.track == "link:node0.socket0to1"].end > links[links.track == "link:node0.socket0to1"].start).all()


def test_tensor_parallel_all_reduce_on_a_node_type_is_the_plan_nccl_picks():
    from simulator.pipelines.llm.pools import build_cost

    sc = load_scenario({"model": "llama-3-8b", "hardware": {"node": "pcie-8xl40s"},
                        "parallel": {"tp": 8, "allreduce": "nccl"}})
    cost = build_cost(sc)
    grp = nccl.group(topology("pcie-8xl40s"), range(8), "ada")
    for tokens in (1, 64, 4096):
        plan = nccl.best(grp, "all_reduce", cost.activation_bytes(tokens))
        assert cost.allreduce_parts(tokens) == (plan.latency, cost.activation_bytes(tokens) / plan.algbw)


def test_a_node_mapping_without_a_base_is_one_line():
    with pytest.raises(ConfigError, match=r"hardware\.node: a node mapping builds on a node type: add base"):
        load_scenario({"model": "llama-3-8b", "hardware": {"node": {"gpus": 4}}})
    sc = load_scenario({"model": "llama-3-8b", "hardware": {"node": {"base": "hgx-h100", "gpus_per_switch": 4}}})
    assert sc.hardware.node.gpus_per_switch == 4 and sc.hardware.node.gpu == "h100-sxm"


def test_dit_collectives_cross_the_shared_fabric_on_a_node_type():
    """On a node type a stage group's collectives are Fabric flows on the ports its ring keeps busy (so
    they contend with other traffic there); on the flat model they stay closed forms inside the task."""
    raw = {"kind": "dit", "model": "pixart-alpha", "resolution": 1024, "steps": 4, "cfg": True,
           "delivery": {"vae": False, "format": "latent"}, "parallel": {"ulysses": 8},
           "workload": {"requests": 1, "arrival": "closed", "concurrency": 1}}
    node = simulator.run({**raw, "hardware": {"node": "dgx-a100"}})
    flat = simulator.run({**raw, "hardware": {"gpu": "a100-sxm-80g"}})
    moved = node.spans[node.spans.track.str.startswith("link:") & node.spans.name.str.endswith("collectives")]
    assert len(moved) > 0 and set(moved.track) >= {"link:gpu0.nvlink.tx", "link:gpu1.nvlink.rx"}
    assert not flat.spans.name.str.endswith("collectives").any()


def test_tree_between_nodes_is_nccls_tree_latency_and_half_its_bus_bandwidth():
    """tuning.cc: tree latency = base + 2((ppn-1) intraLat + log2(nodes) interLat); tree busBw = 0.92 x the
    tree graph's bandwidth (the chain on two nodes, up to twice the NICs), algorithm bandwidth half of it."""
    grp = nccl.group(topology("dgx-a100", nodes=2), range(16), "ampere")
    assert (grp.nodes, grp.ppn, grp.intra_bw, grp.net_bw) == (2, 8, pytest.approx(240e9), pytest.approx(200e9))
    simple = next(p for p in nccl.plans(grp, "all_reduce", 1 << 30) if (p.algorithm, p.protocol) == ("tree", "Simple"))
    assert simple.latency == pytest.approx((8.4 + 2 * (7 * 4.0 + 1 * 14.0)) * 1e-6, rel=1e-12)
    assert simple.algbw == pytest.approx(0.92 * 240e9 * 0.5, rel=1e-12)
    ll = next(p for p in nccl.plans(grp, "all_reduce", 1 << 30) if (p.algorithm, p.protocol) == ("tree", "LL"))
    assert ll.algbw == pytest.approx(min(0.92 * 240e9 / 3.8, 22.5e9) * 0.5, rel=1e-12)
    assert {nccl.best(grp, "all_reduce", s).algorithm for s in (1 << 12, 1 << 20, 1 << 34)} == {"tree"}
    four = nccl.group(topology("dgx-a100", nodes=4), range(32), "ampere")  # beyond two nodes the ring wins big ones
    assert nccl.best(four, "all_reduce", 1 << 34).algorithm == "ring"
    assert nccl.best(four, "all_reduce", 1 << 16).algorithm == "tree"
    assert all(p.algorithm != "tree" for p in nccl.plans(grp, "all_gather", 1 << 20))  # tree is all-reduce only


def test_nvls_tree_joins_nvlink_sharp_nodes_over_their_nics():
    grp = nccl.group(topology("hgx-h100", nodes=2), range(16), "hopper")
    assert grp.nvls == 0 and grp.nvls_node == pytest.approx(370.8e9 * 0.85)
    big = nccl.best(grp, "all_reduce", 1 << 34)
    assert big.algorithm == "nvls_tree" and big.algbw == pytest.approx(min(370.8e9 * 0.85, 400e9), rel=1e-12)
    assert big.latency == pytest.approx((25.0 + 2 * 1 * 20.9) * 1e-6, rel=1e-12)
    four = nccl.group(topology("hgx-h100", nodes=4), range(32), "hopper")  # inner tree nodes: NICs carry it twice
    assert nccl.best(four, "all_reduce", 1 << 34).algbw == pytest.approx(min(370.8e9 * 0.85, 400e9 / 2), rel=1e-12)
    a100 = nccl.group(topology("dgx-a100", nodes=2), range(16), "ampere")  # NVSwitch gen2: no NVLink SHARP
    assert all(p.algorithm != "nvls_tree" for p in nccl.plans(a100, "all_reduce", 1 << 34))


def test_all_to_all_moves_each_gpus_buffer_at_its_link_rate():
    """nccl-tests alltoall: each GPU sends size/n to each of the n-1 others at once, so on a switch its bus
    bandwidth is the GPU's link (OCI's GB200 rows: 615-662 GB/s against NVLink5's 722)."""
    grp = nccl.group(topology("gb200-nvl72", nodes=2), range(8), "blackwell")
    plan = nccl.best(grp, "alltoall", 1 << 34)
    assert grp.pair_bw == pytest.approx(721.8e9 / 7)
    assert plan.algbw == pytest.approx(8 * 721.8e9 / 7, rel=1e-12)
    assert plan.busbw == pytest.approx(721.8e9, rel=1e-3)


def test_copies_staged_through_host_memory_cross_the_staging_ports_where_the_node_states_a_rate():
    """pcie-4xa100 (no PCIe switch, no P2P through a root complex): every pair stages through host memory at
    the rate measured on that box (links catalog shm-pcie4), so a ring runs at it; a box with no stated rate
    keeps its PCIe and socket links."""
    t = topology("pcie-4xa100")
    assert names(t, 0, 1) == ["gpu0.pcie.tx", "gpu0.shm.tx", "gpu1.pcie.rx", "gpu1.shm.rx"]
    assert names(t, 1, 2) == ["gpu1.pcie.tx", "gpu1.shm.tx", "node0.socket0to1", "gpu2.pcie.rx", "gpu2.shm.rx"]
    assert nccl.group(t, range(4), "ampere").intra_bw == pytest.approx(5.2e9)
    assert all(".shm." not in n for n in names(topology("pcie-8xl40s"), 0, 5))
