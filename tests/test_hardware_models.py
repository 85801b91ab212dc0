"""Closed-form checks of the GPU and CPU models."""

from __future__ import annotations

import pytest

from simulator.config.loader import load_scenario
from simulator.hardware.cpu import CorePool, CPUProcess
from simulator.hardware.gpu import GPU
from simulator.hardware.ops import Op


@pytest.fixture
def a100() -> GPU:
    return GPU.from_spec(load_scenario({"hardware": {"gpu": "a100-sxm-80g"}}).hardware.gpu)


def test_memory_bound_op_is_bytes_over_bandwidth(a100):
    op = Op("copy", flops=1.0, bytes=1.7e9)
    assert a100.op_time(op) == pytest.approx(1.7e9 / (2039e9 * 0.834) + a100.kernel_overhead, rel=1e-12)


def test_a_kernel_short_of_the_bandwidth_takes_its_share(a100):
    # an unvectorised broadcast add reaching 0.374 of the achievable bandwidth (kernels.yaml vae_eager)
    op = Op("bias", flops=0.0, bytes=1.7e9, bandwidth_share=0.374)
    assert a100.op_time(op) == pytest.approx(1.7e9 / (2039e9 * 0.834 * 0.374) + a100.kernel_overhead, rel=1e-12)


def test_compute_bound_op_is_flops_over_achievable(a100):
    op = Op("softmax-ish", flops=312e12, bytes=1.0)
    assert a100.op_time(op) == pytest.approx(1.0 / 0.869 + a100.kernel_overhead, rel=1e-12)


def test_a_tiny_kernel_runs_for_the_floor_then_waits_the_gap(a100):
    # 8 KB of a norm at batch 1: far below the 3 us a kernel takes at least (ramp, one wave, tail)
    assert (a100.kernel_floor, a100.kernel_overhead) == (3e-6, 1e-6)
    assert a100.op_time(Op("norm", flops=2e4, bytes=8192)) == pytest.approx(3e-6 + 1e-6, rel=1e-12)
    # above the floor the floor does not count
    big = Op("copy", flops=0.0, bytes=1e8)
    assert a100.op_time(big) == pytest.approx(1e8 / a100.bandwidth + 1e-6, rel=1e-12)


def test_count_repeats_the_kernel(a100):
    op = Op("x", flops=0.0, bytes=1e6)
    assert a100.op_time(Op("x", flops=0.0, bytes=1e6, count=5)) == pytest.approx(5 * a100.op_time(op))


def test_large_gemm_runs_at_full_waves(a100):
    # 108 x 16 tiles of 128x128 fill exactly 16 waves on 108 SMs: no quantization loss.
    m, n, k = 128 * 108, 128 * 16, 8192
    flops = 2.0 * m * n * k
    eff, waves = a100.tiling(m, n, k)[:2]
    assert (eff, waves) == (1.0, 16)
    t = a100.op_time(Op("gemm", flops, bytes=1.0, gemm=(m, n, k)))
    compute = flops / (312e12 * 0.869)
    assert t == pytest.approx(compute + (1.0 / a100.bandwidth) / waves + a100.kernel_overhead, rel=1e-9)


def test_one_extra_tile_costs_a_wave(a100):
    eff, waves = a100.tiling(128 * 109, 128, 4096)[:2]
    assert waves == 2 and eff == pytest.approx(109 / 216)


def test_cuda_graphs_launch_once(a100):
    assert a100.launch_time(300, cuda_graphs=True) == a100.launch_overhead
    assert a100.launch_time(300, cuda_graphs=False) == pytest.approx(300 * a100.launch_overhead)


def test_cpu_process_runs_tasks_one_at_a_time():
    proc = CPUProcess("engine", CorePool(4))
    log = [proc.submit(0.0, 2.0), proc.submit(1.0, 1.0), proc.submit(5.0, 1.0)]
    assert log == [(0.0, 2.0), (2.0, 3.0), (5.0, 6.0)]
    assert proc.busy == 4.0


def test_processes_share_a_single_core():
    pool = CorePool(1)
    a, b = CPUProcess("a", pool), CPUProcess("b", pool)
    assert a.submit(0.0, 1.0) == (0.0, 1.0)
    assert b.submit(0.5, 1.0) == (1.0, 2.0)     # waits for the only core


def test_a_core_runs_a_ready_task_in_the_idle_time_before_work_booked_later():
    """Work booked ahead (a chunk's read when it arrives) leaves the core idle until then: a task
    ready earlier runs in that gap if it fits whole, else after the booking; the other core is used
    when it can start the task sooner."""
    pool = CorePool(1)
    a, b = CPUProcess("a", pool), CPUProcess("b", pool)
    assert a.submit(10.0, 1.0) == (10.0, 11.0)  # booked ahead
    assert b.submit(0.0, 2.0) == (0.0, 2.0)     # fits before it
    assert b.submit(2.0, 9.0) == (11.0, 20.0)   # does not fit in [2, 10): after it
    two = CorePool(2)
    c, d, e = CPUProcess("c", two), CPUProcess("d", two), CPUProcess("e", two)
    assert c.submit(0.0, 5.0) == (0.0, 5.0)
    assert d.submit(1.0, 5.0) == (1.0, 6.0)
    assert e.submit(2.0, 1.0) == (5.0, 6.0)     # both busy: the core that frees first


def test_processes_on_enough_cores_run_in_parallel():
    pool = CorePool(2)
    a, b = CPUProcess("a", pool), CPUProcess("b", pool)
    assert a.submit(0.0, 1.0) == (0.0, 1.0)
    assert b.submit(0.5, 1.0) == (0.5, 1.5)
