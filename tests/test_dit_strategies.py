"""DiT parallel strategies as classes: each one's share against its closed form, and the registry."""

from __future__ import annotations

import pytest

from simulator.config.dit_models import DiTParallel
from simulator.config.loader import load_scenario
from simulator.hardware.collectives import allgather_time, alltoall_time, ring_allreduce_time
from simulator.pipelines.dit import DiTModel
from simulator.pipelines.dit.strategies import REGISTRY, StageWork, compose, label
from simulator.workloads import dit as W

L, S, INNER, HIDDEN = 28, 4096, 1152, 1152  # PixArt-alpha at 1024 px: layers, tokens, widths


def model(**parallel) -> DiTModel:
    return DiTModel.build(load_scenario({
        "kind": "dit", "model": "pixart-alpha", "resolution": 1024, "steps": 4, "cfg": False,
        "parallel": parallel, "hardware": {"gpu": "a100-sxm-80g"}}))


def work_of(m: DiTModel, key: str, stage: int = 0, sync: bool = True) -> tuple[StageWork, object]:
    """What the strategy named ``key`` alone adds to stage ``stage``'s full-image task."""
    ctx = m._context(stage, S, sync)
    (s,) = [s for s in m.lay.strategies if s.key == key]
    work = StageWork()
    s.add_work(ctx, work)
    return work, ctx


def test_registry_maps_every_yaml_degree_to_a_class_in_label_order():
    degrees = {k for k, f in DiTParallel.model_fields.items() if f.annotation is not bool
               and k not in ("patches", "warmup_steps", "tensor_cross_attention")}
    assert set(REGISTRY) == degrees
    assert list(REGISTRY) == ["cfg", "pipefusion", "ulysses", "ring", "tensor", "distrifusion"]
    p = DiTParallel(cfg=2, pipefusion=2, ring=2, ulysses=2, patches=4)
    assert [s.key for s in compose(p)] == ["cfg", "pipefusion", "ulysses", "ring"]
    assert label(compose(p)) == "cfg2 x pipefusion2(M=4) x ulysses2 x ring2"
    assert label(compose(DiTParallel())) == "single"


def test_ulysses_issues_four_alltoalls_per_layer():
    u = 4
    m = model(ulysses=u)
    work, ctx = work_of(m, "ulysses")
    per_gpu = S // u * INNER * 2  # one of Q, K, V, O on one GPU, bf16
    assert work.comm_bytes == pytest.approx(L * 4 * per_gpu * (u - 1) / u, rel=1e-12)
    assert work.comm == pytest.approx(L * 4 * alltoall_time(per_gpu, u, ctx.link.bandwidth, ctx.link.latency))
    assert work.cpu_ops == L * 4 * 3 + L * 2  # 3 ops per collective, 2 FP32 casts per layer


def test_ring_passes_r_minus_one_kv_chunks_per_layer_and_merges_each():
    r = 4
    work, _ = work_of(model(ring=r), "ring")
    chunk = 2 * (S // r) * INNER * 2  # K and V of a GPU's tokens
    assert work.comm_bytes == L * (r - 1) * chunk
    (merge,) = work.ops
    assert merge.name == "ring_merge" and merge.count == L * (r - 1)
    assert merge.bytes == 38.0 * (S // r) * INNER
    assert work.cpu_ops == L * r * 13
    assert work.comm >= 0.0  # only what the chunk's attention does not hide


@pytest.mark.parametrize("cross, per_block", [("split", 3), ("replicated", 2)])
def test_tensor_parallel_allreduces_per_block(cross, per_block):
    t = 4
    work, ctx = work_of(model(tensor=t, tensor_cross_attention=cross), "tensor")
    nb = S * HIDDEN * 2
    assert work.comm_bytes == pytest.approx(L * per_block * 2 * (t - 1) / t * nb, rel=1e-12)
    assert work.comm == pytest.approx(
        L * per_block * ring_allreduce_time(nb, t, ctx.link.allreduce_bandwidth, ctx.link.latency))
    assert work.eltwise_passes == L * per_block * 2  # the bias added after each all-reduce


def test_tensor_parallel_memory_keeps_a_replicated_cross_attention_whole():
    split, repl = model(tensor=4), model(tensor=4, tensor_cross_attention="replicated")
    extra = L * 4 * HIDDEN * INNER * 2 * (1 - 1 / 4)
    assert repl.memory_per_gpu() - split.memory_per_gpu() == pytest.approx(extra, rel=1e-9)


def test_pipefusion_memory_holds_stale_kv_of_its_stage_and_one_patch_of_activations():
    n, patches = 4, 8
    m = model(pipefusion=n, patches=patches, warmup_steps=0)
    (pf,) = m.lay.strategies
    assert pf.weight_split == n and pf.label == "pipefusion4(M=8)"
    mem = m.memory_context()
    assert pf.state_bytes(mem) == W.kv_bytes(m.arch, S, L // n, 1, "bf16")
    assert pf.activation_split(mem) == patches
    assert pf.activation_split(model(pipefusion=n, patches=patches, warmup_steps=1).memory_context()) == 1


def test_distrifusion_allgather_overlaps_compute_except_in_warmup():
    n = 4
    m = model(distrifusion=n)
    (d,) = m.lay.strategies
    for sync in (True, False):
        ctx = m._context(0, S, sync)
        work = StageWork()
        d.add_overlapped(ctx, work, compute=1e-3)
        nb = L * 2 * S * INNER * 2
        t_ag = allgather_time(nb, n, ctx.link.bandwidth, ctx.link.latency)
        assert work.comm == (t_ag if sync else max(0.0, t_ag - 1e-3))
        assert work.comm_bytes == (n - 1) / n * nb
    assert d.state_bytes(m.memory_context()) == 2 * L * 2 * S * INNER * 2  # stale copy + gather target


def test_cfg_exchange_is_a_collective_call_on_the_last_stage_only():
    m = DiTModel.build(load_scenario({
        "kind": "dit", "model": "pixart-alpha", "parallel": {"cfg": 2, "pipefusion": 2},
        "hardware": {"gpu": "a100-sxm-80g"}}))
    cfg = m.lay.strategies[0]
    assert cfg.key == "cfg" and not cfg.in_group
    for stage, calls in ((0, 0), (1, 1)):
        work = StageWork()
        cfg.add_work(m._context(stage, S, True), work)
        assert work.cpu_ops == 3 * calls
    assert m.lay.n_gpus == 4 and m.lay.group == 1 and m.lay.members(1, 1) == [3]
