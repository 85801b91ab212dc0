"""The LLM path's traffic on the shared Topology: closed forms on an idle fabric, contention on a shared
port, and the trace tracks it leaves."""

from __future__ import annotations

import inspect

import pytest
import simpy

import simulator
from simulator.config.loader import load_scenario
from simulator.hardware.allreduce import AllReduceLink, NCCLAllReduce
from simulator.hardware.collectives import allreduce_time
from simulator.hardware.link import Fabric
from simulator.hardware.topology import LinkParams, Topology
from simulator.pipelines.llm.engine import Engine
from simulator.pipelines.llm.frontend import Frontend
from simulator.pipelines.llm.links import SAMPLED_ID_BYTES, ReplicaLinks
from simulator.pipelines.llm.pools import build_cost

PCIE = LinkParams(bandwidth=25e9, latency=5e-6, name="pcie")
NV = LinkParams(bandwidth=400e9, latency=2e-6, name="nvlink", allreduce_bandwidth=300e9)


def nccl_parts(link: LinkParams, n: int, bytes_per_token: float):
    """tokens -> (fixed, transfer seconds) of one NCCL all-reduce over ``link``."""
    ar = AllReduceLink(link.latency, link.collective_bandwidth, 0.0, 1.0, 0.0, 1.0, True)
    return lambda t: NCCLAllReduce().parts(bytes_per_token * t, n, ar)


def _run(env, log, name, gen):
    def proc():
        yield from gen
        log.append((name, env.now))
    env.process(proc())


def test_max_rate_caps_a_flow_and_leaves_the_rest_to_the_others():
    env = simpy.Environment()
    fabric = Fabric(env)
    port = fabric.port("p", 10.0)
    log = []
    _run(env, log, "capped", fabric.move([port], 20.0, max_rate=2.0))
    _run(env, log, "free", fabric.move([port], 40.0))
    env.run()
    # capped at 2 B/s for 10 s; the other takes the remaining 8 B/s: 40 B in 5 s
    assert log == [("free", 5.0), ("capped", 10.0)]


def test_d2h_and_allreduce_share_a_pcie_port():
    """On a PCIe-only box the D2H of sampled ids and a TP all-reduce cross GPU 0's PCIe tx port."""
    env = simpy.Environment()
    topo = Topology(env, 2, 8, gpu_link=None, host_link=PCIE)
    links = ReplicaLinks(topo, [[0, 1]], layers=1, activation_bytes=lambda t: 1e6 * t,
                         collective_parts=nccl_parts(PCIE, 2, 1e6))
    log = []
    _run(env, log, "allreduce", links.step_comm(1, "s"))   # 2 all-reduces of 1 MB: 2 MB on the wire per GPU
    _run(env, log, "d2h", links.d2h(125_000, "d2h"))        # 1 MB of int64 ids
    env.run()
    ar_lat, d2h_lat = 2 * 2 * PCIE.latency, PCIE.latency
    assert SAMPLED_ID_BYTES == 8
    done = dict(log)
    # The D2H starts after 5 us, the all-reduce after 20 us: 15 us alone, then both share
    # gpu0.pcie.tx at half its bandwidth; the D2H (1 MB) ends first, the all-reduce then runs alone.
    alone = (ar_lat - d2h_lat) * PCIE.bandwidth
    t_d2h = ar_lat + (1e6 - alone) / (PCIE.bandwidth / 2)
    rest = 2e6 - (t_d2h - ar_lat) * PCIE.bandwidth / 2
    assert done["d2h"] == pytest.approx(t_d2h, rel=1e-12)
    assert done["allreduce"] == pytest.approx(t_d2h + rest / PCIE.bandwidth, rel=1e-12)


def test_step_comm_on_an_idle_fabric_is_the_cost_models_closed_form():
    sc = load_scenario({"model": "llama-3-70b", "hardware": {"gpu": "h100-sxm"}, "parallel": {"tp": 4, "pp": 2}})
    cost = build_cost(sc)
    env = simpy.Environment()
    topo = Topology.from_hardware(env, sc.hardware, 8)
    links = ReplicaLinks(topo, [[0, 1, 2, 3], [4, 5, 6, 7]], sc.model.layers, cost.activation_bytes,
                         cost.collective_parts)
    _run(env, [], "comm", links.step_comm(256, "s"))
    env.run()
    assert env.now == pytest.approx(cost.comm_time(256), rel=1e-12)


def test_dp_attention_all_to_alls_on_an_idle_fabric_are_the_cost_models_closed_form():
    sc = load_scenario({"model": "deepseek-v3", "dtype": "fp8", "hardware": {"gpu": "h200"},
                        "parallel": {"tp": 8, "expert_parallel": True, "dp_attention": True}})
    cost = build_cost(sc)
    env = simpy.Environment()
    topo = Topology.from_hardware(env, sc.hardware, 8)
    links = ReplicaLinks(topo, [list(range(8))], sc.model.layers, cost.activation_bytes, cost.collective_parts,
                         collectives_per_layer=cost.collectives_per_layer, collective="all-to-all")
    _run(env, [], "comm", links.step_comm(256, "s"))
    env.run()
    # a dispatch and a combine in each of the 58 MoE layers: each rank's 32 tokens x 8 experts of 7168 fp8 values,
    # 7/8 of them leaving it
    per = sc.hardware.gpu_link
    one = per.latency + 7 / 8 * 32 * 8 * 7168 * 1 / LinkParams.from_spec(per).bandwidth
    assert env.now == pytest.approx(cost.comm_time(256), rel=1e-12)
    assert cost.comm_time(256) == pytest.approx(2 * 58 * one, rel=1e-12)


def test_allreduce_capped_at_bus_bandwidth_matches_the_closed_form():
    env = simpy.Environment()
    topo = Topology(env, 4, 8, gpu_link=NV, host_link=PCIE)
    links = ReplicaLinks(topo, [[0, 1, 2, 3]], layers=3, activation_bytes=lambda t: 1e5 * t,
                         collective_parts=nccl_parts(LinkParams(NV.bandwidth, NV.latency, "nv", 300e9), 4, 1e5))
    _run(env, [], "comm", links.step_comm(10, "s"))
    env.run()
    assert env.now == pytest.approx(2 * 3 * allreduce_time(1e6, 4, 300e9, NV.latency), rel=1e-12)


def test_a_sole_replicas_comm_is_booked_with_the_times_of_flows_alone():
    """One replica alone on its topology books its step's traffic on reserved ports: every transfer
    ends when the same transfer as a Fabric flow alone ends, to the bit, and its ports keep the same
    busy time and bytes; the chain's pure form (``comm_end``) gives the same end."""
    sc = load_scenario({"model": "llama-3-70b", "hardware": {"gpu": "h100-sxm"}, "parallel": {"tp": 4, "pp": 2}})
    cost = build_cost(sc)
    flows_env, booked_env = simpy.Environment(), simpy.Environment()
    stages = [[0, 1, 2, 3], [4, 5, 6, 7]]
    flows = ReplicaLinks(Topology.from_hardware(flows_env, sc.hardware, 8), stages, sc.model.layers, cost.activation_bytes,
                         cost.collective_parts)
    booked = ReplicaLinks(Topology.from_hardware(booked_env, sc.hardware, 8), stages, sc.model.layers,
                          cost.activation_bytes, cost.collective_parts, sole=True)
    assert booked.comm_booked and not flows.comm_booked
    log = []
    _run(flows_env, log, "comm", flows.step_comm(256, "s"))
    flows_env.run()
    end = booked.book_comm(256, "s", 0.0)
    assert log == [("comm", end)] and booked.comm_end(256, 0.0) == end
    assert end == pytest.approx(cost.comm_time(256), rel=1e-12)
    for name, port in flows.fabric.ports.items():
        other = booked.fabric.ports[name]
        assert (other.busy_time, other.bytes_moved) == pytest.approx((port.busy_time, port.bytes_moved), rel=1e-12)
    with pytest.raises(ValueError, match="reserved"):  # nothing else may cross its ports
        next(booked.fabric.move([booked.fabric.ports["gpu0.nvlink.tx"]], 1.0))


def test_a_sole_serial_replica_on_pcie_books_its_traffic_and_its_copies_on_the_port_they_share():
    """TP 2 on L40S (no NVLink): the all-reduces cross the GPU's PCIe port that the sampled ids leave
    by. A replica alone whose steps are serial books both, with the times of the same transfers as
    Fabric flows one after the other; steps that overlap (async scheduling), or another replica on
    the topology, leave both as flows."""
    sc = load_scenario({"model": "llama-3-8b", "hardware": {"gpu": "l40s"}, "parallel": {"tp": 2}})
    cost = build_cost(sc)

    def links(env, **kw):
        return ReplicaLinks(Topology.from_hardware(env, sc.hardware, 2), [[0, 1]], sc.model.layers,
                            cost.activation_bytes, cost.collective_parts, **kw)

    flows_env, booked_env = simpy.Environment(), simpy.Environment()
    flows, booked = links(flows_env, sole=True), links(booked_env, sole=True, serial=True)
    assert set(flows.comm_ports) & set(flows.d2h_route[0])  # they share the port
    assert not (flows.d2h_booked or flows.comm_booked) and booked.d2h_booked and booked.comm_booked
    assert not links(simpy.Environment(), serial=True).d2h_booked  # not alone on its topology
    log = []

    def step():
        yield from flows.step_comm(64, "s")
        log.append(("comm", flows_env.now))
        yield from flows.d2h(64, "d2h")
        log.append(("d2h", flows_env.now))

    flows_env.process(step())
    flows_env.run()
    comm_end = booked.book_comm(64, "s", 0.0)
    assert log == [("comm", comm_end), ("d2h", booked.booked_d2h(64, "d2h", comm_end))]
    for name, port in flows.fabric.ports.items():
        other = booked.fabric.ports[name]
        assert (other.busy_time, other.bytes_moved) == pytest.approx((port.busy_time, port.bytes_moved), rel=1e-12)


def test_tp_run_trace_has_nvlink_and_host_link_tracks():
    r = simulator.run("scenarios/llm/llama3_70b_tp4_h100.yaml",
                      overrides={"workload.requests": 8, "workload.output_tokens": 4})
    tracks = set(r.spans["track"])
    assert {f"link:gpu{i}.nvlink.{d}" for i in range(4) for d in ("tx", "rx")} <= tracks
    assert "link:gpu0.pcie.tx" in tracks
    names = set(r.spans.loc[r.spans["track"] == "link:gpu0.nvlink.tx", "name"])
    assert any(n.endswith("all-reduce") for n in names)
    assert r.summary["utilization"]["link:gpu0.nvlink.tx"] > 0


def test_engine_and_frontend_take_settings_not_the_scenario():
    for cls in (Engine, Frontend):
        params = inspect.signature(cls.__init__).parameters
        assert "scenario" not in params and "settings" in params
