"""Processor-sharing links and the topology's routing, checked against hand-computed times."""

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.hardware.link import Fabric
from simulator.hardware.topology import LinkParams, Topology
from simulator.observe.spans import SpanRecorder

REL = 1e-12


def _start(env, log, name, make, delay=0.0):
    """Start ``make()`` (a transfer) after ``delay`` and log ``(name, finish time)``."""
    def proc():
        if delay:
            yield env.timeout(delay)
        yield make()
        log.append((name, env.now))
    return env.process(proc())


def _finish(log):
    return dict(log)


def test_solo_transfer_takes_latency_plus_size_over_bandwidth():
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    p = fab.port("a", 100.0)
    _start(env, log, "x", lambda: fab.transfer([p], 250.0, latency=0.5))
    env.run()
    assert log == [("x", pytest.approx(0.5 + 2.5, rel=REL))]
    assert p.busy_time == pytest.approx(2.5, rel=REL)
    assert p.bytes_moved == pytest.approx(250.0, rel=REL)


def test_two_equal_transfers_on_one_port_both_take_twice_as_long():
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    p = fab.port("a", 100.0)
    _start(env, log, "x", lambda: fab.transfer([p], 100.0))
    _start(env, log, "y", lambda: fab.transfer([p], 100.0))
    env.run()
    assert _finish(log) == {"x": pytest.approx(2.0, rel=REL), "y": pytest.approx(2.0, rel=REL)}
    assert p.busy_time == pytest.approx(2.0, rel=REL)


def test_transfer_starting_midway_retimes_the_first():
    # x alone for 0.5 s moves 50 B; then both share 50 B/s: x's last 50 B end at 1.5 s;
    # y has moved 50 B by then and finishes its last 50 B alone at 100 B/s: 2.0 s.
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    p = fab.port("a", 100.0)
    _start(env, log, "x", lambda: fab.transfer([p], 100.0))
    _start(env, log, "y", lambda: fab.transfer([p], 100.0), delay=0.5)
    env.run()
    assert log == [("x", pytest.approx(1.5, rel=REL)), ("y", pytest.approx(2.0, rel=REL))]
    assert p.busy_time == pytest.approx(2.0, rel=REL)


def test_three_staggered_flows_with_unequal_sizes():
    # t=0: a (300 B) alone at 60 B/s; t=1: b (60 B) joins, 30 B/s each; t=2: c (90 B)
    # joins, 20 B/s each. At t=2 a has 210 B, b 30 B, c 90 B left. b ends at 3.5
    # (a 180, c 60 left), then 30 B/s each: c ends at 5.5 (a 120 left), a alone: 7.5.
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    p = fab.port("a", 60.0)
    _start(env, log, "a", lambda: fab.transfer([p], 300.0))
    _start(env, log, "b", lambda: fab.transfer([p], 60.0), delay=1.0)
    _start(env, log, "c", lambda: fab.transfer([p], 90.0), delay=2.0)
    env.run()
    assert [n for n, _ in log] == ["b", "c", "a"]
    assert _finish(log) == {"b": pytest.approx(3.5, rel=REL), "c": pytest.approx(5.5, rel=REL),
                            "a": pytest.approx(7.5, rel=REL)}


def test_max_min_fair_share_across_ports():
    # p1 (100 B/s) carries a and b: 50 B/s each. p2 (300 B/s) carries a and c: a is
    # bottlenecked at p1, so c gets the remaining 250 B/s and its 250 B take 1 s.
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    p1, p2 = fab.port("p1", 100.0), fab.port("p2", 300.0)
    _start(env, log, "a", lambda: fab.transfer([p1, p2], 100.0))
    _start(env, log, "b", lambda: fab.transfer([p1], 100.0))
    _start(env, log, "c", lambda: fab.transfer([p2], 250.0))
    env.run()
    assert _finish(log) == {"a": pytest.approx(2.0, rel=REL), "b": pytest.approx(2.0, rel=REL),
                            "c": pytest.approx(1.0, rel=REL)}


def test_zero_bytes_completes_after_latency_and_does_not_disturb_others():
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    p = fab.port("a", 100.0)
    _start(env, log, "big", lambda: fab.transfer([p], 100.0))
    _start(env, log, "zero", lambda: fab.transfer([p], 0.0, latency=0.25))
    env.run()
    assert _finish(log) == {"zero": pytest.approx(0.25, rel=REL), "big": pytest.approx(1.0, rel=REL)}


def test_port_get_or_create_and_validation():
    fab = Fabric(simpy.Environment())
    assert fab.port("a", 1.0) is fab.port("a", 1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        fab.port("b", 0.0)
    with pytest.raises(ValueError, match="nbytes"):
        fab.transfer([fab.port("a", 1.0)], -1.0)


def test_recorder_gets_one_span_per_port_and_union_busy_time():
    env, log = simpy.Environment(), []
    rec = SpanRecorder()
    fab = Fabric(env, rec)
    p, q = fab.port("a", 100.0), fab.port("b", 100.0)
    _start(env, log, "x", lambda: fab.transfer([p, q], 100.0, label="x"))
    _start(env, log, "y", lambda: fab.transfer([p], 100.0, label="y"), delay=0.5)
    env.run()
    df = rec.frame()
    assert sorted(zip(df.track, df.name)) == [("link:a", "x"), ("link:a", "y"), ("link:b", "x")]
    y = df[df.name == "y"].iloc[0]
    assert (y.start, y.end) == (pytest.approx(0.5), pytest.approx(2.0))
    assert rec.busy["link:a"] == pytest.approx(2.0, rel=REL)  # union, not 1.5 + 1.5
    assert rec.busy["link:b"] == pytest.approx(1.5, rel=REL)

    light = SpanRecorder(enabled=False)
    env2 = simpy.Environment()
    fab2 = Fabric(env2, light)
    fab2.transfer([fab2.port("a", 10.0)], 10.0)
    env2.run()
    assert light.frame().empty and light.busy == {"link:a": pytest.approx(1.0)}


NV = LinkParams(bandwidth=400e9, latency=2e-6, name="nvlink")
PCIE = LinkParams(bandwidth=25e9, latency=5e-6, name="pcie")
NIC = LinkParams(bandwidth=50e9, latency=10e-6, name="ib")


def test_full_duplex_opposite_directions_do_not_slow_each_other():
    env, log = simpy.Environment(), []
    topo = Topology(env, 2, 8, gpu_link=NV, host_link=PCIE)
    _start(env, log, "ab", lambda: topo.send(0, 1, 1e9))
    _start(env, log, "ba", lambda: topo.send(1, 0, 1e9))
    env.run()
    solo = NV.latency + 1e9 / NV.bandwidth
    assert _finish(log) == {"ab": pytest.approx(solo, rel=REL), "ba": pytest.approx(solo, rel=REL)}


def test_nvswitch_contention_only_at_shared_endpoint():
    env, log = simpy.Environment(), []
    topo = Topology(env, 4, 4, gpu_link=NV)
    _start(env, log, "01", lambda: topo.send(0, 1, 1e9))
    _start(env, log, "02", lambda: topo.send(0, 2, 1e9))  # shares gpu0's tx port
    _start(env, log, "32", lambda: topo.send(3, 1, 1e9))  # shares gpu1's rx port
    env.run()
    # All three start together; 01 and 02 share gpu0.tx, 01 and 32 share gpu1.rx: all at bw/2.
    t = NV.latency + 2e9 / NV.bandwidth
    assert _finish(log) == {k: pytest.approx(t, rel=1e-9) for k in ("01", "02", "32")}


def test_pcie_only_peer_copy_contends_with_d2h():
    env, log = simpy.Environment(), []
    topo = Topology(env, 2, 2, gpu_link=None, host_link=PCIE)
    ports, lat = topo.path(0, 1)
    assert [p.name for p in ports] == ["gpu0.pcie.tx", "gpu1.pcie.rx"] and lat == PCIE.latency
    _start(env, log, "peer", lambda: topo.send(0, 1, 1e9))
    _start(env, log, "d2h", lambda: topo.d2h(0, 1e9))
    _start(env, log, "h2d", lambda: topo.h2d(0, 1e9))  # rx direction: not contended
    env.run()
    shared = PCIE.latency + 2e9 / PCIE.bandwidth
    assert _finish(log) == {"peer": pytest.approx(shared, rel=REL),
                            "d2h": pytest.approx(shared, rel=REL),
                            "h2d": pytest.approx(PCIE.latency + 1e9 / PCIE.bandwidth, rel=REL)}


def test_cross_node_goes_through_node_nics():
    env, log = simpy.Environment(), []
    topo = Topology(env, 4, 2, gpu_link=NV, host_link=PCIE, node_link=NIC)
    ports, lat = topo.path(1, 2)
    assert [p.name for p in ports] == ["node0.nic.tx", "node1.nic.rx"] and lat == NIC.latency
    _start(env, log, "x", lambda: topo.send(1, 2, 1e9))
    _start(env, log, "y", lambda: topo.send(0, 3, 1e9))  # same NICs: shared
    env.run()
    t = NIC.latency + 2e9 / NIC.bandwidth
    assert _finish(log) == {"x": pytest.approx(t, rel=REL), "y": pytest.approx(t, rel=REL)}


def test_topology_validation():
    env = simpy.Environment()
    with pytest.raises(ValueError, match="node_link"):  # only a copy between nodes needs one
        Topology(env, 16, 8, gpu_link=NV).path(0, 8)
    with pytest.raises(ValueError, match="bandwidth"):
        LinkParams(0.0, 1e-6)
    with pytest.raises(ValueError, match="bandwidth"):
        Topology(env, 2, 2, gpu_link=(-1.0, 0.0))
    topo = Topology(env, 2, 2, gpu_link=(NV.bandwidth, NV.latency))
    assert topo.gpu_link == LinkParams(NV.bandwidth, NV.latency, "gpu_link")
    with pytest.raises(ValueError, match="out of range"):
        topo.send(0, 2, 1.0)
    with pytest.raises(ValueError, match="host_link"):
        topo.d2h(0, 1.0)


flows = st.lists(
    st.tuples(st.floats(0.0, 5.0),                       # start time
              st.floats(0.0, 1e3),                       # bytes
              st.sets(st.integers(0, 2), min_size=1)),   # which ports
    min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(flows=flows, bws=st.tuples(*[st.floats(0.5, 300.0)] * 3))
def test_property_bytes_conserved_and_ports_never_exceed_bandwidth(flows, bws):
    env, log = simpy.Environment(), []
    fab = Fabric(env)
    ports = [fab.port(f"p{i}", bw) for i, bw in enumerate(bws)]
    for k, (t0, n, which) in enumerate(flows):
        ps = [ports[i] for i in sorted(which)]
        _start(env, log, k, lambda ps=ps, n=n: fab.transfer(ps, n), delay=t0)
    env.run()
    assert len(log) == len(flows) and fab.active_flows == 0
    done = dict(log)
    for i, p in enumerate(ports):
        mine = [k for k, (_, _, which) in enumerate(flows) if i in which]
        total = sum(flows[k][1] for k in mine)
        assert p.bytes_moved == pytest.approx(total, rel=1e-9, abs=1e-6)
        assert p.busy_time * p.bandwidth >= total * (1 - 1e-9) - 1e-6
        if mine:
            first = min(flows[k][0] for k in mine)
            assert max(done[k] for k in mine) >= first + total / p.bandwidth * (1 - 1e-9) - 1e-12 * first
    for k, (t0, n, which) in enumerate(flows):
        assert done[k] - t0 >= n / min(bws[i] for i in which) * (1 - 1e-9) - 1e-12 * done[k]


def test_a_booked_copy_takes_the_time_a_lone_flow_takes_and_copies_serialize():
    """Booked copies on a reserved port (one CUDA stream's D2H) end when a lone Fabric flow would,
    queue behind each other, and forbid shared flows on the port."""
    env = simpy.Environment()
    fabric = Fabric(env)
    lone, booked = fabric.port("a", 10.0), fabric.port("b", 10.0)
    log = []

    def flow():
        yield from fabric.move([lone], 50.0, 2.0, "flow")
        log.append(("flow", env.now))

    env.process(flow())
    env.run()
    fabric.reserve([booked])
    first = fabric.book([booked], 50.0, 2.0, "copy 1", start=0.0)
    second = fabric.book([booked], 10.0, 2.0, "copy 2", start=1.0)
    assert log == [("flow", 7.0)] and first == 7.0
    assert second == 7.0 + 2.0 + 1.0          # after the first copy, then its own latency and bytes
    assert booked.busy_time == 6.0 and booked.bytes_moved == 60.0
    with pytest.raises(ValueError, match="reserved"):
        fabric.transfer([booked], 1.0)
        env.run()
