"""The DiT path as SimPy processes: queue, text encoder, T steps on N GPUs, VAE, last mile.

One deployment serves one image at a time on all its GPUs (as xDiT does). The GPUs are
grouped as ``cfg`` branches x ``pipefusion`` stages x a lockstep group of
``ulysses x ring x tensor`` (or ``distrifusion``) GPUs. Each stage group is one SimPy
process that runs its tasks (a full image in warmup or non-pipelined steps, one patch per
task in PipeFusion's pipelined steps), waits for its inputs (real topology transfers from
the previous stage, from the last stage back to stage 0, and between CFG branches), and
records a span per task on every member GPU's track. Per-layer collectives inside a stage
(Ulysses all-to-all, ring K/V passes, tensor-parallel all-reduces, DistriFusion's
asynchronous all-gather) are aggregated per task with the closed forms of
:mod:`simulator.hardware.collectives`, so events scale with patches x stages, not layers.

Each request's latency splits into ``queue, text_encode, denoise, comm, bubble, vae, d2h,
encode, deliver``. Over the denoising phase of wall time D on n GPUs, ``denoise`` is the
mean GPU compute time, ``comm`` the mean exposed communication time, ``bubble`` the rest
(D - denoise - comm): the phase's idle device time, per GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from ..config.dit_models import DiTScenario, image_codecs, layer_split
from ..hardware.collectives import (allgather_time, alltoall_time, p2p_time,
                                    ring_allreduce_time)
from ..hardware.cpu import CorePool, CPUProcess
from ..hardware.gpu import GPU
from ..hardware.topology import LinkParams, Topology
from ..observe.perfetto import trace_events
from ..observe.result import Result, with_units
from ..observe.spans import SpanRecorder
from ..observe.stats import stats
from ..workloads import dit as W
from ..hardware.ops import DTYPE_BYTES, Op
from ..workloads.arrivals import open_loop_arrivals
from .dit_cost import DiTCost, eager_ops, unfused
from .health import assess, overload_warning, was_cut

CATEGORIES = ("queue", "text_encode", "denoise", "comm", "bubble", "vae", "d2h", "encode",
              "deliver")
GIB = 2.0 ** 30


# ---- layout and per-task cost --------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """GPU indexing: gpu = ((branch * pp + stage) * group) + member."""

    cfg: int
    pp: int
    ulysses: int
    ring: int
    tensor: int
    distri: int
    patches: int
    warmup: int

    @property
    def sp(self) -> int:
        return self.ulysses * self.ring * self.distri

    @property
    def group(self) -> int:
        return self.sp * self.tensor

    @property
    def n_gpus(self) -> int:
        return self.cfg * self.pp * self.group

    def members(self, branch: int, stage: int) -> list[int]:
        base = (branch * self.pp + stage) * self.group
        return list(range(base, base + self.group))


@dataclass(frozen=True)
class TaskCost:
    """One stage group's task: GPU compute, exposed collective time, bytes each GPU sends."""

    compute: float
    comm: float
    comm_bytes: float


@dataclass
class DiTModel:
    """Everything a run needs, derived once from the scenario."""

    sc: DiTScenario
    arch: W.DiTArch
    gpu: GPU
    cost: DiTCost
    lay: Layout
    tokens: int
    stages: list
    link: LinkParams
    allreduce_bw: float
    _tasks: dict = field(default_factory=dict)

    @classmethod
    def build(cls, sc: DiTScenario) -> "DiTModel":
        arch = sc.arch
        gpu = GPU.from_spec(sc.hardware.gpu)
        p = sc.parallel
        lay = Layout(p.cfg, p.pipefusion, p.ulysses, p.ring, p.tensor, p.distrifusion,
                     p.num_patches if p.pipefusion > 1 else 1,
                     min(p.warmup_steps, sc.steps) if p.pipefusion > 1 or p.distrifusion > 1
                     else 0)
        hw = sc.hardware
        spec = hw.gpu_link or hw.host_link
        link = LinkParams(spec.effective_bandwidth, spec.latency, spec.name)
        cost = DiTCost(gpu, arch.head_dim, sc.kernels.attention_efficiency,
                       sc.kernels.head_dim_multiple, eager=not hw.cuda_graphs)
        return cls(sc, arch, gpu, cost, lay, W.image_tokens(arch, sc.height, sc.width),
                   layer_split(arch.num_layers, lay.pp), link, spec.allreduce_bandwidth)

    @property
    def batch(self) -> int:
        return self.sc.batch

    @property
    def act_bytes(self) -> int:
        return W.act_bytes(self.sc.dtype)

    def task(self, stage: int, q_total: int, sync: bool) -> TaskCost:
        """Cost of stage ``stage`` over ``q_total`` query tokens (split over the SP group)."""
        key = (stage, q_total, sync)
        hit = self._tasks.get(key)
        if hit is None:
            hit = self._task(stage, q_total, sync)
            self._tasks[key] = hit
        return hit

    def _task(self, stage: int, q_total: int, sync: bool) -> TaskCost:
        lay, arch, b, ab = self.lay, self.arch, self.batch, self.act_bytes
        l0, l1 = self.stages[stage]
        n_layers = l1 - l0
        q = q_total // lay.sp
        S = self.tokens
        cross_tp = self.sc.parallel.splits_cross_attention
        ops = W.stage_ops(arch, l0, l1, q, S, b, self.sc.dtype, lay.tensor, cross_tp=cross_tp)
        bw, lat = self.link.bandwidth, self.link.latency
        comm = comm_bytes = 0.0
        # ops the Python process dispatches for this task (eager mode; see dit_cost)
        cpu_ops = sum(eager_ops("ops_per_block", arch.layer_kind(i)) for i in range(l0, l1))
        # Python-level calls that launch nothing (views, module calls), at dispatch_overhead
        light = sum(eager_ops("dispatch_only_per_block", arch.layer_kind(i))
                    for i in range(l0, l1))
        cpu_ops += eager_ops("ops_per_forward_prologue")  # on every stage (see kernels.yaml)
        if l0 == 0:
            cpu_ops += eager_ops("ops_per_patch_embed")
        if l1 == arch.num_layers:
            cpu_ops += eager_ops("ops_per_final_layer") + eager_ops("ops_per_step")
        if lay.pp > 1:  # receive this patch's input, send its output
            cpu_ops += 2 * eager_ops("ops_per_p2p")
        else:  # diffusers' own cross attention: text K/V and mask recomputed every call
            cpu_ops += sum(unfused("uncached_cross_ops_per_block")
                           for i in range(l0, l1) if arch.layer_kind(i) == "cross")
        # modules split by tensor parallelism per block (attention, MLP, and a split
        # cross-attention), each closed by an all-reduce
        split = {k: 2 + int(k == "cross" and cross_tp) if lay.tensor > 1 else 0
                 for k in {arch.layer_kind(i) for i in range(l0, l1)}}
        # diffusers BasicTransformerBlock's separate element-wise kernels (kernels.yaml
        # diffusers_unfused), on this GPU's b x q tokens; TP's bias adds on the full tensor
        legacy_tp = sum(split[arch.layer_kind(i)] for i in range(l0, l1)
                        if arch.layer_kind(i) in ("cross", "self"))
        passes = (sum(unfused("extra_passes_per_block", arch.layer_kind(i)) for i in range(l0, l1))
                  + legacy_tp * unfused("tp_bias_passes_per_split_module"))
        if passes:
            x = b * q * arch.hidden
            ops = ops + [Op("unfused_eltwise", float(x), float(passes * x * ab))]
        coll = eager_ops("ops_per_collective")
        inner = arch.inner // lay.tensor
        if lay.ulysses > 1:  # all-to-all of Q, K, V before attention and O after, per layer
            u = lay.ulysses
            nb = b * q * inner * ab
            comm += n_layers * 4 * alltoall_time(nb, u, bw, lat)
            comm_bytes += n_layers * 4 * nb * (u - 1) / u
            cpu_ops += n_layers * 4 * coll
            light += n_layers * 4 * eager_ops("dispatch_only_per_collective")
            # yunchang LongContextAttention: the ring path runs once (FP32 out cast and back)
            cpu_ops += n_layers * eager_ops("ulysses_attention_ops_per_layer")
            light += n_layers * eager_ops("ulysses_attention_dispatch_only_per_layer")
        if lay.ring > 1:  # r-1 K/V passes per layer overlapped with the chunked attention
            r = lay.ring
            attn = [op for op in ops if op.name in ("self_attn", "joint_attn")]
            attn_layer = self.cost.gpu_time(attn) / max(n_layers, 1)
            chunk = 2 * b * q * inner // lay.ulysses * ab
            comm += n_layers * (r - 1) * max(0.0, p2p_time(chunk, bw, lat) - attn_layer / r)
            comm_bytes += n_layers * (r - 1) * chunk
            # yunchang/ring-flash-attention _update_out_and_lse after each pass, in FP32: the
            # block output cast (read 2 B, write 4 B), out - block_out (8 R, 4 W), the sigmoid
            # scaling (4 R, 4 W), the final subtraction (8 R, 4 W): ~38 bytes per element
            elems = b * q * inner // lay.ulysses
            ops = ops + [Op("ring_merge", 5.0 * elems, 38.0 * elems, count=n_layers * (r - 1))]
            cpu_ops += n_layers * r * eager_ops("ops_per_ring_pass")
        if lay.tensor > 1:  # all-reduce after each split module: attention, MLP (cross-attention)
            t = lay.tensor
            n_ar = sum(split[arch.layer_kind(i)] for i in range(l0, l1))
            nb = b * q * arch.hidden * ab
            comm += n_ar * ring_allreduce_time(nb, t, self.allreduce_bw, lat)
            comm_bytes += n_ar * 2 * (t - 1) / t * nb
            cpu_ops += n_ar * coll + legacy_tp * unfused("tp_ops_per_split_module")
        if lay.distri > 1:
            cpu_ops += n_layers * eager_ops("distrifusion_ops_per_layer")
            # legacy patch_parallel/attn.py: every self-attention layer torch.cat()s the n
            # stale K/V buffers into one full-image K/V before attention: read + write it all
            kv_full = 2 * b * S * arch.inner * ab
            ops = ops + [Op("kv_concat", 0.0, 2.0 * kv_full, count=n_layers)]
        if lay.cfg > 1 and l1 == arch.num_layers:
            cpu_ops += coll
        compute = self.cost.task_time(ops, cpu_ops, light)
        if lay.distri > 1:  # async all-gather of every layer's K and V (stale next step)
            n = lay.distri
            nb = n_layers * 2 * b * S * arch.inner * ab
            t_ag = allgather_time(nb, n, bw, lat)
            comm += t_ag if sync else max(0.0, t_ag - compute)
            comm_bytes += (n - 1) / n * nb
        return TaskCost(compute, comm, comm_bytes)

    # ---- memory ----

    def memory_per_gpu(self) -> float:
        """Bytes the busiest GPU needs: weights, activations, K/V buffers, VAE workspace."""
        sc, arch, lay, b = self.sc, self.arch, self.lay, self.batch
        wbytes = DTYPE_BYTES[sc.dtype]
        ab = self.act_bytes
        S = self.tokens
        params = arch.params * wbytes / (lay.pp * lay.tensor)
        if lay.tensor > 1 and not sc.parallel.splits_cross_attention:
            # each rank holds the whole cross-attention (q, k, v, out: 4·D·inner per layer)
            n_cross = sum(arch.layer_kind(i) == "cross" for i in range(arch.num_layers))
            params += (n_cross * 4 * arch.hidden * arch.inner * wbytes * (1 - 1 / lay.tensor)
                       / lay.pp)
        if sc.text_encode:
            params += sum(e.params for e in arch.text_encoders) * ab
        if sc.delivery.vae:
            params += arch.vae.params * ab
        q_peak = S // lay.sp if (lay.pp == 1 or lay.warmup > 0) else S // lay.patches // lay.sp
        act = W.peak_activation_bytes(arch, q_peak, b, "bf16") * ab / 2
        layers_max = max(l1 - l0 for l0, l1 in self.stages)
        kv = 0.0
        if lay.pp > 1:  # stale K/V of the full image for the stage's layers
            kv += W.kv_bytes(arch, S, layers_max, b, "bf16", lay.tensor) * ab / 2
        if lay.distri > 1:  # full-image K and V of every layer: stale copy + gather target
            kv += 2 * 2 * layers_max * b * S * arch.inner * ab
        if lay.ring > 1 or lay.ulysses > 1:  # one layer's gathered K/V in flight
            kv += 2 * b * S * arch.inner // (lay.tensor * lay.ulysses) * ab
        vae_ws = 0.0
        if sc.delivery.vae:
            div = lay.n_gpus if sc.parallel.vae_parallel else 1
            vae_ws = 3.0 * sc.height * sc.width * arch.vae.block_out_channels[0] * ab / div
        return params + act + kv + vae_ws


# ---- the simulation ------------------------------------------------------------------------

@dataclass
class _Accounts:
    """Per-GPU compute, exposed-communication time and bytes sent within one request."""

    compute: np.ndarray
    comm: np.ndarray
    comm_bytes: np.ndarray


class DiTSim:
    """One run: environment, topology, CPU, spans, and the request processes."""

    def __init__(self, model: DiTModel, env: simpy.Environment, rng: np.random.Generator):
        self.m = model
        self.env = env
        self.rng = rng
        sc = model.sc
        hw = sc.hardware
        self.rec = SpanRecorder(enabled=sc.record_spans)
        lay = model.lay

        def lp(spec):
            return None if spec is None else LinkParams(spec.effective_bandwidth, spec.latency,
                                                        spec.name)

        self.topo = Topology(env, lay.n_gpus, hw.gpus_per_node, lp(hw.gpu_link),
                             lp(hw.host_link), lp(hw.node_link), self.rec)
        self.client = self.topo.fabric.port("client.tx", hw.client_link.effective_bandwidth)
        self.cpu = CPUProcess("api_server", CorePool(hw.cpu_cores), self.rec)
        self.server = simpy.Resource(env, capacity=1)
        self.rows: list[dict] = []
        self.started: dict[int, tuple[float, float]] = {}  # rid -> (arrival, start): begun requests
        arch = model.arch
        S = model.tokens
        ab = model.act_bytes
        self.latent_token_bytes = arch.latent_channels * arch.patch_size ** 2 * ab
        self.te_time = (model.cost.time(W.text_encoder_ops(arch, max(1, sc.batch * sc.parallel.cfg),
                                                           sc.dtype))
                        if sc.text_encode and arch.text_encoders else 0.0)
        self.vae_time = 0.0
        if sc.delivery.vae:
            ops = W.vae_decode_ops(sc.height, sc.width, "bf16", 1, arch.vae)
            t = model.gpu.ops_time(ops)
            if sc.parallel.vae_parallel and lay.n_gpus > 1:
                img = sc.height * sc.width * 3 * ab
                t = t / lay.n_gpus + allgather_time(img, lay.n_gpus, model.link.bandwidth,
                                                    model.link.latency)
            self.vae_time = t
        self.S = S

    # -- denoising --

    def _slot(self, slots: dict, key) -> simpy.Event:
        ev = slots.get(key)
        if ev is None:
            ev = slots[key] = self.env.event()
        return ev

    def _send(self, slots, key, src: list[int], dst: list[int], nbytes: float, label: str,
              acc: _Accounts):
        """Member i of ``src`` sends ``nbytes`` to member i of ``dst``; the slot fires when all land."""
        sent_at = self.env.now
        ev = self._slot(slots, key)
        procs = [self.topo.send(s, d, nbytes, label) for s, d in zip(src, dst) if s != d]
        for s in src:
            acc.comm_bytes[s] += nbytes
        if not procs:
            ev.succeed(sent_at)
            return
        done = self.env.all_of(procs)
        done.callbacks.append(lambda _e: ev.succeed(sent_at))

    def _wait(self, ev: simpy.Event, members: list[int], acc: _Accounts):
        """Wait for an input; the part after the sender finished is exposed communication."""
        t0 = self.env.now
        sent_at = yield ev
        now = self.env.now
        exposed = max(0.0, now - max(t0, sent_at))
        if exposed > 0:
            for g in members:
                acc.comm[g] += exposed
                self.rec.add(f"gpu{g}", "wait_recv", now - exposed, now, "comm")

    def _stage(self, rid: int, branch: int, stage: int, slots: dict, acc: _Accounts):
        m, lay, env, sc = self.m, self.m.lay, self.env, self.m.sc
        members = lay.members(branch, stage)
        last = stage == lay.pp - 1
        T, Wu, M, S, b = sc.steps, lay.warmup, lay.patches, self.S, m.batch
        ab = m.act_bytes
        for step in range(T):
            warm = step < Wu
            patches = 1 if (warm or lay.pp == 1) else M
            q = S // patches
            tc = m.task(stage, q, warm or lay.distri == 1)
            for p in range(patches):
                if stage > 0:
                    yield from self._wait(self._slot(slots, (branch, stage, step, p)), members, acc)
                elif step > 0 and lay.pp > 1:
                    yield from self._wait(self._slot(slots, (branch, 0, step, p)), members, acc)
                start = env.now
                yield env.timeout(tc.compute + tc.comm)
                name = f"r{rid} s{step} p{p}"
                for g in members:
                    acc.compute[g] += tc.compute
                    acc.comm[g] += tc.comm
                    acc.comm_bytes[g] += tc.comm_bytes
                    self.rec.add(f"gpu{g}", name, start, start + tc.compute, "denoise")
                    if tc.comm > 0:
                        self.rec.add(f"gpu{g}", name + " comm", start + tc.compute, env.now, "comm")
                if last and lay.cfg == 2:  # exchange this patch's noise prediction
                    other = 1 - branch
                    self._send(slots, ("cfg", other, step, p), members,
                               lay.members(other, stage), b * q * self.latent_token_bytes
                               / lay.sp, "cfg", acc)
                    yield from self._wait(self._slot(slots, ("cfg", branch, step, p)), members,
                                          acc)
                if lay.pp == 1:
                    continue
                if not last:
                    self._send(slots, (branch, stage + 1, step, p), members,
                               lay.members(branch, stage + 1),
                               b * q * m.arch.hidden * ab / lay.sp, "act", acc)
                elif step + 1 < T:
                    nxt = step + 1
                    dst = lay.members(branch, 0)
                    nbytes = b * q * self.latent_token_bytes / lay.sp
                    if nxt >= Wu and warm:  # the full latent feeds every patch of the next step
                        first = (branch, 0, nxt, 0)
                        self._send(slots, first, members, dst, nbytes, "latent", acc)
                        for pp_ in range(1, M):
                            ev = self._slot(slots, (branch, 0, nxt, pp_))
                            self._slot(slots, first).callbacks.append(
                                lambda e, ev=ev: ev.succeed(e.value))
                    else:
                        self._send(slots, (branch, 0, nxt, p), members, dst, nbytes, "latent", acc)

    # -- one request --

    def request(self, rid: int, arrival: float, done: simpy.Event | None = None):
        env, m, sc, lay = self.env, self.m, self.m.sc, self.m.lay
        n = lay.n_gpus
        self.started[rid] = (arrival, math.nan)
        req = self.server.request()
        yield req
        t_start = env.now
        self.started[rid] = (arrival, t_start)
        if self.te_time > 0:
            self.rec.add("gpu0", f"r{rid} text_encode", env.now, env.now + self.te_time,
                         "text_encode")
            yield env.timeout(self.te_time)
        t_te = env.now
        acc = _Accounts(np.zeros(n), np.zeros(n), np.zeros(n))
        slots: dict = {}
        procs = [env.process(self._stage(rid, c, k, slots, acc))
                 for c in range(lay.cfg) for k in range(lay.pp)]
        yield env.all_of(procs)
        t_den = env.now
        if self.vae_time > 0:
            gpus = range(n) if sc.parallel.vae_parallel else [0]
            for g in gpus:
                self.rec.add(f"gpu{g}", f"r{rid} vae", env.now, env.now + self.vae_time, "vae")
            yield env.timeout(self.vae_time)
        t_vae = env.now
        self.server.release(req)
        px = sc.height * sc.width
        if sc.delivery.format == "latent":
            out_bytes = self.S * self.latent_token_bytes
            d2h_bytes = out_bytes
            enc = 0.0
        else:
            d2h_bytes = px * 3 * m.act_bytes  # decoded tensor copied before uint8 conversion
            c = image_codecs().cost(sc.delivery.format, sc.delivery.compress_level)
            enc = px * c.seconds_per_pixel
            out_bytes = px * 3 * c.size_ratio
        if sc.delivery.base64:
            out_bytes *= 4.0 / 3.0
        out_bytes += sc.delivery.response_header_bytes
        yield self.topo.d2h(0, d2h_bytes, f"r{rid} d2h")
        t_d2h = env.now
        if enc > 0:
            _, end = self.cpu.submit(env.now, enc, f"r{rid} encode {sc.delivery.format}")
            yield env.timeout(end - env.now)
        t_enc = env.now
        yield self.topo.fabric.transfer([self.client], out_bytes,
                                        sc.hardware.client_link.latency, f"r{rid} deliver")
        t_done = env.now
        D = t_den - t_te
        den = float(acc.compute.mean())
        comm = float(acc.comm.mean())
        self.rows.append({
            "request": rid, "arrival": arrival, "start": t_start, "denoise_start": t_te,
            "denoise_end": t_den, "vae_end": t_vae, "d2h_end": t_d2h, "encode_end": t_enc,
            "done": t_done, "latency": t_done - arrival, "output_bytes": out_bytes,
            "comm_bytes_per_gpu": float(acc.comm_bytes.max()),
            "queue": t_start - arrival, "text_encode": t_te - t_start, "denoise": den,
            "comm": comm, "bubble": D - den - comm, "vae": t_vae - t_den, "d2h": t_d2h - t_vae,
            "encode": t_enc - t_d2h, "deliver": t_done - t_enc, "completed": True,
        })
        if done is not None:
            done.succeed()

    def closed_client(self, ids):
        for rid in ids:
            t = self.env.now
            done = self.env.event()
            self.env.process(self.request(rid, t, done))
            yield done

    def open_source(self, times: np.ndarray):
        for rid, t in enumerate(times):
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self.env.process(self.request(rid, float(t)))


# ---- results -------------------------------------------------------------------------------

def _oom_result(sc: DiTScenario, need: float, have: float) -> Result:
    summary = {
        "kind": "dit", "name": sc.name, "status": "oom",
        "memory_needed_gib": need / GIB, "memory_per_gpu_gib": need / GIB,
        "gpu_memory_gib": have / GIB, "gpus": sc.n_gpus,
        "message": f"needs {need / GIB:.1f} GiB per GPU, the {sc.hardware.gpu.name} has "
                   f"{have / GIB:.1f} GiB",
        "latency_s": stats(np.array([])), "breakdown_share": {c: None for c in CATEGORIES},
        "last_mile_share": None, "requests_total": sc.workload.requests, "requests_completed": 0,
        "throughput": {"images_per_s": 0.0},
    }
    empty = with_units(pd.DataFrame(columns=list(REQUEST_COLUMNS)), SECONDS)
    return Result("dit", sc, summary, empty, with_units(pd.DataFrame(columns=["request", *CATEGORIES,
                                                                              "latency"]), ("latency",)),
                  pd.DataFrame(columns=["track", "name", "start", "end", "category"]), [])


def simulate(sc: DiTScenario) -> Result:
    """Run a DiT scenario; a layout that does not fit in memory returns ``status: oom``."""
    model = DiTModel.build(sc)
    need = model.memory_per_gpu()
    if need > model.gpu.memory:
        return _oom_result(sc, need, model.gpu.memory)
    env = simpy.Environment()
    rng = np.random.default_rng(sc.seed)
    sim = DiTSim(model, env, rng)
    wl = sc.workload
    times = open_loop_arrivals(wl, rng)
    if times is None:
        ids = list(range(wl.requests))
        for c in range(wl.concurrency):
            env.process(sim.closed_client(ids[c::wl.concurrency]))
    else:
        env.process(sim.open_source(times))
    env.run(until=sc.max_sim_time)
    req = _request_frame(sim, wl.requests, times)
    done = req[req["completed"]]
    bd = done[["request", *CATEGORIES, "latency"]].reset_index(drop=True)
    lat = done["latency"].to_numpy(float)
    cut = was_cut(env, sc.max_sim_time)
    horizon = float(env.now) if cut else (float(done["done"].max()) if len(done) else 0.0)
    total = float(lat.sum()) or 1.0
    share = ({c: float(done[c].sum()) / total for c in CATEGORIES} if len(done)
             else {c: None for c in CATEGORIES})
    spans = sim.rec.frame()
    util = sim.rec.utilization(horizon)
    first = float(done["arrival"].min()) if len(done) else 0.0
    last_done = float(done["done"].max()) if len(done) else 0.0
    summary = {
        "kind": "dit", "name": sc.name, "status": "ok", "model": model.arch.name,
        "gpu": sc.hardware.gpu.name, "gpus": model.lay.n_gpus,
        "resolution": f"{sc.width}x{sc.height}", "steps": sc.steps,
        "strategy": strategy_name(sc),
        "latency_s": stats(lat), "breakdown_share": share,
        "last_mile_share": (share["d2h"] + share["encode"] + share["deliver"]) if len(done) else None,
        "memory_per_gpu_gib": need / GIB, "memory_needed_gib": need / GIB,
        "requests_completed": int(len(done)),
        "throughput": {"images_per_s": len(done) / (last_done - first) if last_done > first else 0.0},
        "comm_bytes_per_gpu": float(done["comm_bytes_per_gpu"].mean()) if len(done) else None,
        "utilization": {
            "gpu": {k: v for k, v in util.items() if k.startswith("gpu")},
            "link": {k: v for k, v in util.items() if k.startswith("link:")},
            "cpu": {k: v for k, v in util.items() if k.startswith("cpu:")},
        },
    }
    overload = None
    if times is not None:
        overload = overload_warning(req["arrival"].to_numpy(float), req["done"].to_numpy(float),
                                    req["latency"].to_numpy(float), req["completed"].to_numpy(bool),
                                    unit="images")
    assess(summary, wl.requests, len(done), cut, sc.max_sim_time, [overload], unit="image")
    return Result("dit", sc, summary, with_units(req, SECONDS), with_units(bd, ("latency",)), spans,
                  trace_events(spans) if sc.record_spans else [])


REQUEST_COLUMNS = ("request", "arrival", "start", "denoise_start", "denoise_end", "vae_end", "d2h_end",
                   "encode_end", "done", "latency", "output_bytes", "comm_bytes_per_gpu",
                   *CATEGORIES, "completed")
SECONDS = tuple(c for c in REQUEST_COLUMNS if c not in ("request", "output_bytes", "comm_bytes_per_gpu", "completed"))
"""Request columns in seconds: published as ``<name>_s``."""


def _request_frame(sim: DiTSim, total: int, times: np.ndarray | None) -> pd.DataFrame:
    """One row per request, in request order: completed images as recorded, the others with
    what is known (arrival; start if the server took them) and ``completed`` False."""
    rows = {r["request"]: r for r in sim.rows}
    out = []
    for rid in range(total):
        row = rows.get(rid)
        if row is None:
            arrival, start = sim.started.get(
                rid, (float(times[rid]) if times is not None else math.nan, math.nan))
            row = {c: math.nan for c in REQUEST_COLUMNS}
            row.update(request=rid, arrival=arrival, start=start, queue=start - arrival,
                       completed=False)
        out.append(row)
    df = pd.DataFrame(out, columns=list(REQUEST_COLUMNS))
    return df.astype({"request": "int64", "completed": bool})


def strategy_name(sc: DiTScenario) -> str:
    """A short label of the layout, e.g. ``cfg2 x pipefusion4(M=8) x ulysses2``."""
    p = sc.parallel
    parts = []
    if p.cfg > 1:
        parts.append("cfg2")
    if p.pipefusion > 1:
        parts.append(f"pipefusion{p.pipefusion}(M={p.num_patches})")
    for k in ("ulysses", "ring", "tensor", "distrifusion"):
        if getattr(p, k) > 1:
            parts.append(f"{k}{getattr(p, k)}")
    return " x ".join(parts) or "single"
