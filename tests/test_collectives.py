"""Collective processes on an idle fabric match their closed forms; contention slows them."""

import pytest
import simpy

from simulator.hardware import collectives as C
from simulator.hardware.topology import LinkParams, Topology

REL = 1e-12
NV = LinkParams(bandwidth=450e9, latency=3e-6, name="nvlink")
PCIE = LinkParams(bandwidth=25e9, latency=6e-6, name="pcie")
NBYTES = 64e6


def _run(topo, make):
    """Run ``make()`` on an idle fabric from t=0; return its finish time."""
    log = []

    def proc():
        yield make()
        log.append(("done", topo.env.now))

    topo.env.process(proc())
    topo.env.run()
    assert [n for n, _ in log] == ["done"]
    return log[0][1]


def _topo(n, gpu_link=NV, host_link=PCIE):
    return Topology(simpy.Environment(), n, 8, gpu_link=gpu_link, host_link=host_link)


def test_closed_forms_by_hand():
    bw, lat = 100.0, 1.0
    assert C.p2p_time(400.0, bw, lat) == pytest.approx(5.0)
    assert C.ring_allreduce_time(400.0, 4, bw, lat) == pytest.approx(6 * (1.0 + 1.0))
    assert C.allgather_time(400.0, 4, bw, lat) == pytest.approx(3 * (1.0 + 1.0))
    assert C.reduce_scatter_time(400.0, 4, bw, lat) == pytest.approx(3 * (1.0 + 1.0))
    assert C.alltoall_time(400.0, 4, bw, lat) == pytest.approx(1.0 + 3.0)
    for f in (C.ring_allreduce_time, C.allgather_time, C.reduce_scatter_time, C.alltoall_time):
        assert f(400.0, 1, bw, lat) == 0.0


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("link", [NV, None], ids=["nvlink", "pcie-only"])
@pytest.mark.parametrize("name", ["allreduce", "allgather", "reduce_scatter", "alltoall"])
def test_collective_process_matches_closed_form(name, link, n):
    topo = _topo(n, gpu_link=link)
    params = link or PCIE
    process = getattr(C, name)
    closed = {"allreduce": C.ring_allreduce_time, "allgather": C.allgather_time,
              "reduce_scatter": C.reduce_scatter_time, "alltoall": C.alltoall_time}[name]
    t = _run(topo, lambda: process(topo, range(n), NBYTES, name))
    assert t == pytest.approx(closed(NBYTES, n, params.bandwidth, params.latency), rel=REL)


def test_p2p_process_matches_closed_form():
    topo = _topo(2)
    t = _run(topo, lambda: C.p2p(topo, 0, 1, NBYTES))
    assert t == pytest.approx(C.p2p_time(NBYTES, NV.bandwidth, NV.latency), rel=REL)


def test_single_gpu_collective_is_free():
    topo = _topo(1)
    assert _run(topo, lambda: C.allreduce(topo, [0], NBYTES)) == 0.0
    assert _run(topo, lambda: C.alltoall(topo, [0], NBYTES)) == 0.0


def test_allreduce_slows_under_competing_traffic():
    # A D2H copy on every GPU shares the PCIe tx ports of a PCIe-only ring.
    topo = _topo(4, gpu_link=None)

    def both():
        for g in range(4):
            topo.d2h(g, 10 * NBYTES)
        return C.allreduce(topo, range(4), NBYTES)

    t = _run(topo, both)
    assert t > 1.5 * C.ring_allreduce_time(NBYTES, 4, PCIE.bandwidth, PCIE.latency)


def test_allreduce_picks_the_fastest_algorithm():
    from simulator.hardware.collectives import allreduce_time, ring_allreduce_time
    bw, lat = 100e9, 10e-6
    # Two-shot: the ring's bytes in two latencies, so it wins for n > 2 ...
    assert allreduce_time(8e3, 8, bw, lat) == pytest.approx(2 * lat + 2 * 7 / 8 * 8e3 / bw)
    assert allreduce_time(1e9, 8, bw, lat) == pytest.approx(2 * lat + 2 * 7 / 8 * 1e9 / bw)
    # ... and ties with the ring at n = 2.
    assert allreduce_time(1e9, 2, bw, lat) == pytest.approx(ring_allreduce_time(1e9, 2, bw, lat))
    assert allreduce_time(1e9, 1, bw, lat) == 0.0
