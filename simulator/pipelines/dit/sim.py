"""The DiT path as SimPy processes: queue, text encoder, T steps on N GPUs, VAE, last mile.

A deployment serves one denoising pass at a time on all its GPUs (as xDiT does); a pass holds one
request or a batch of compatible ones (:mod:`.queue`). Each stage group (``cfg`` branch x
``pipefusion`` stage) of a pass is one SimPy process that runs its tasks (a full latent in warmup
or non-pipelined steps, one patch per task in PipeFusion's pipelined steps), waits for its inputs
(real topology transfers from the previous stage, from the last stage back to stage 0, and between
CFG branches), and records a span per task on every member GPU's track. Collectives inside a group
are priced per task by the strategies (:mod:`.strategies`), so events scale with patches x stages,
not layers. After the VAE the GPUs take the next pass while each request's own last mile (copy to
the host, pass between processes, encode on the CPU, deliver) runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import simpy

from ...config.dit_models import encode_threads, image_codecs, video_codecs
from ...hardware.collectives import allgather_time
from ...hardware.cpu import CorePool, CPUProcess
from ...hardware.topology import Topology
from ...observe.spans import SpanRecorder
from ...workloads import dit as W
from ..dit_cost import vae_eager
from ...workloads.dit_requests import Shape, own_shape, shaped
from .model import DiTModel
from .queue import POLICIES, Job, Queue
from .strategies.cfg import CFGParallel

RGB = 3
"""Channels of the decoded image."""
BASE64_INFLATION = 4.0 / 3.0
"""Base64 encodes 3 bytes as 4 characters (RFC 4648)."""
PICKLE_IPC_RATE = 1280 * 720 * 80 * RGB * 4 / 1.50757
"""Bytes per second a decoded video tensor is pickled into a multiprocessing queue (and unpickled out of
it): vLLM-Omni issue #1712 logs ``result_mq.enqueue took 1507.57 ms`` for a 720P 80-frame float32 video
(Wan2.2-I2V-A14B); two such hops, each pickled and unpickled, are 6.0 s at this rate against the ~6.5 s
of IPC serialization PR #1715 removed (37.5 s -> 31.0 s end to end)."""
IPC_BYTES_PER_CHANNEL = 4
"""The decoded frames cross processes as float32 (vLLM-Omni PR #5712: 2.09 GB of shared memory for a
720p 189-frame video whose uint8 frames are 0.52 GB)."""


@dataclass
class _Accounts:
    """Per-GPU compute, exposed-communication time and bytes sent within one pass."""

    compute: np.ndarray
    comm: np.ndarray
    comm_bytes: np.ndarray


@dataclass
class Pass:
    """The costs of one denoising pass of ``model.images`` requests of one shape: the model, the text
    encoder and VAE times of the pass, and each request's output (bytes copied, CPU encode, bytes sent)."""

    model: DiTModel
    tokens: int
    latent_token_bytes: float
    te_time: float
    vae_time: float
    output: tuple[float, float, float, float]

    @classmethod
    def build(cls, m: DiTModel) -> "Pass":
        sc, arch, lay = m.sc, m.arch, m.lay
        images = m.images
        te = (m.cost.time(W.text_encoder_ops(arch, max(1, m.batch * sc.parallel.cfg), sc.dtype))
              if sc.text_encode and arch.text_encoders else 0.0)
        vae = 0.0
        if sc.delivery.vae:
            eager = vae_eager(arch.vae, sc.kernels.vae_layout == "channels_last_3d")
            t = m.gpu.ops_time(W.vae_decode_ops(sc.height, sc.width, "bf16", images, arch.vae, sc.frames, eager))
            if sc.parallel.vae_parallel and lay.n_gpus > 1:
                img = images * _frames(sc) * sc.height * sc.width * RGB * m.act_bytes
                t = t / lay.n_gpus + allgather_time(img, lay.n_gpus, m.link.bandwidth, m.link.latency)
            vae = t
        latent_token_bytes = arch.latent_channels * arch.patch_size ** 2 * arch.patch_frames * m.act_bytes
        return cls(m, m.tokens, latent_token_bytes, te, vae, _output(sc, m.tokens * latent_token_bytes,
                                                                    m.act_bytes, sc.hardware.cpu_cores))

    @cached_property
    def step_work(self) -> float:
        """GPU seconds of one synchronous denoising step over every stage (the queue policy's measure)."""
        m = self.model
        return sum(m.task(k, self.tokens, True).compute for k in range(m.lay.pp))


def _frames(sc) -> int:
    return sc.frames or 1


def _output(sc, latent_bytes: float, act_bytes: int, cores: int) -> tuple[float, float, float, float]:
    """(bytes copied to the host, seconds to pass it between processes, seconds to encode on the CPU, bytes
    delivered) of one request's output."""
    px = sc.height * sc.width * _frames(sc)
    d = sc.delivery
    ipc_bytes = latent_bytes if d.format == "latent" else px * RGB * IPC_BYTES_PER_CHANNEL
    ipc = d.ipc_hops * 2 * ipc_bytes / PICKLE_IPC_RATE  # each hop pickled on one side, unpickled on the other
    if d.format == "latent":
        out_bytes = d2h_bytes = latent_bytes
        enc = 0.0
    elif d.format == "mp4":
        d2h_bytes = px * RGB * act_bytes
        codec = video_codecs()[d.video_codec]
        p = codec.preset(d.preset)
        # x264's frame threads on the host's cores, up to what the preset gains from them
        enc = px * p.seconds_per_pixel / min(cores, encode_threads(cores, sc.height), p.max_speedup)
        out_bytes = px * codec.bits_per_pixel / 8 * p.size_factor
    else:
        d2h_bytes = px * RGB * act_bytes  # decoded tensor copied before uint8 conversion
        c = image_codecs().cost(d.format, d.compress_level)
        enc = px * c.seconds_per_pixel
        out_bytes = px * RGB * c.size_ratio
    if d.base64:
        out_bytes *= BASE64_INFLATION
    return d2h_bytes, ipc, enc, out_bytes + d.response_header_bytes


class DiTSim:
    """One run: environment, topology, CPU, spans, the queue, and the request processes."""

    def __init__(self, model: DiTModel, env: simpy.Environment, rng: np.random.Generator):
        self.m = model
        self.env = env
        self.rng = rng
        sc = model.sc
        hw = sc.hardware
        self.rec = SpanRecorder(enabled=sc.record_spans)
        self.topo = Topology.from_hardware(env, hw, model.lay.n_gpus, self.rec)
        self._routes: dict = {}  # stage group -> (ports, idle rate) of its collectives, on a node type
        self.client = self.topo.client_port()
        self.cpu = CPUProcess("api_server", CorePool(hw.cpu_cores), self.rec)
        self.rows: list[dict] = []
        self.started: dict[int, tuple[float, float]] = {}  # rid -> (arrival, start): begun requests
        self.shape = own_shape(sc)
        self._passes: dict = {(self.shape, 1): Pass.build(model)}
        self.queue = Queue(POLICIES[sc.serving.policy], sc.serving.max_batch)
        self.batches: list[tuple[float, int]] = []  # (start, requests) of every pass
        self._wake: simpy.Event | None = None
        env.process(self._serve())

    def pass_for(self, shape: Shape, images: int) -> Pass:
        """The costs of a pass of ``images`` requests of ``shape`` (built once)."""
        key = (shape, images)
        hit = self._passes.get(key)
        if hit is None:
            hit = self._passes[key] = Pass.build(DiTModel.build(shaped(self.m.sc, shape), images))
        return hit

    # -- denoising --

    def _collective_route(self, members: tuple):
        """The ports a stage group's collectives keep busy and the rate their bytes move at on an idle
        fabric, on a node type's topology (None on the flat model, whose collectives stay closed forms)."""
        if self.topo.layout is None or len(members) < 2:
            return None
        hit = self._routes.get(members)
        if hit is None:
            ports, _ = self.topo.group_route(members)
            hit = self._routes[members] = (ports, min(p.bandwidth for p in ports)) if ports else None
        return hit

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

    def _stage(self, label: str, ps: Pass, branch: int, stage: int, steps: range, slots: dict,
               acc: _Accounts):
        m, env = ps.model, self.env
        lay, sc = m.lay, m.sc
        members = lay.members(branch, stage)
        last = stage == lay.pp - 1
        T, Wu, M, S, b = sc.steps, lay.warmup, lay.patches, ps.tokens, m.batch
        ab = m.act_bytes
        for step in steps:
            warm = step < Wu
            patches = 1 if (warm or lay.pp == 1) else M
            q = S // patches
            tc = m.task(stage, q, warm or not lay.distri)
            for p in range(patches):
                if stage > 0:
                    yield from self._wait(self._slot(slots, (branch, stage, step, p)), members, acc)
                elif step > 0 and lay.pp > 1:
                    yield from self._wait(self._slot(slots, (branch, 0, step, p)), members, acc)
                start = env.now
                name = f"{label} s{step} p{p}"
                route = self._collective_route(tuple(members)) if tc.comm > 0 else None
                if route is None:
                    yield env.timeout(tc.compute + tc.comm)
                else:  # on a node type the group's collectives cross the shared Fabric, and contend there
                    ports, cap = route
                    yield env.timeout(tc.compute)
                    yield from self.topo.fabric.move(ports, tc.comm * cap, 0.0, f"{name} collectives",
                                                     max_rate=cap)
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
                               lay.members(other, stage),
                               CFGParallel.exchange_bytes(b, q, ps.latent_token_bytes, lay.sp), "cfg", acc)
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
                    nbytes = b * q * ps.latent_token_bytes / lay.sp
                    if nxt >= Wu and warm:  # the full latent feeds every patch of the next step
                        first = (branch, 0, nxt, 0)
                        self._send(slots, first, members, dst, nbytes, "latent", acc)
                        for pp_ in range(1, M):
                            ev = self._slot(slots, (branch, 0, nxt, pp_))
                            self._slot(slots, first).callbacks.append(
                                lambda e, ev=ev: ev.succeed(e.value))
                    else:
                        self._send(slots, (branch, 0, nxt, p), members, dst, nbytes, "latent", acc)

    # -- the service --

    def request(self, rid: int, arrival: float, done: simpy.Event | None = None, shape: Shape | None = None):
        """A request's life: queued, denoised in one or more passes, then its own last mile."""
        env = self.env
        shape = shape or self.shape
        job = Job(rid, arrival, shape, self.pass_for(shape, 1).step_work, env.event())
        self.started[rid] = (arrival, math.nan)
        self.queue.put(job, env.now)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        yield job.served
        yield from self._last_mile(job, self.pass_for(shape, 1))
        if done is not None:
            done.succeed()

    def _serve(self):
        """The GPUs' loop: take the queue's next pass, run it, repeat; sleep while the queue is empty."""
        env = self.env
        while True:
            if not self.queue.waiting:
                self._wake = env.event()
                yield self._wake
                continue
            yield from self._run_pass(self.queue.take(env.now))

    def _run_pass(self, batch: list[Job]):
        """Denoise ``batch`` together (text encoder first if new, VAE last if done); requeue it at a
        step boundary where ``serving.preempt`` lets a waiting request take the GPUs."""
        env, lead = self.env, batch[0]
        now = env.now
        for j in batch:
            j.queue += now - j.queued_at
            j.batch = max(j.batch, len(batch))
            if math.isnan(j.start):
                j.start = now
                self.started[j.rid] = (j.arrival, now)
        self.batches.append((now, len(batch)))
        ps = self.pass_for(lead.shape, len(batch))
        label = "+".join(f"r{j.rid}" for j in batch)
        if lead.steps_done == 0 and ps.te_time > 0:
            self.rec.add("gpu0", f"{label} text_encode", now, now + ps.te_time, "text_encode")
            yield env.timeout(ps.te_time)
            for j in batch:
                j.text_encode = ps.te_time
        T = lead.shape.steps
        preempt = self.m.sc.serving.preempt
        while lead.steps_done < T:
            k = lead.steps_done
            yield from self._denoise(label, ps, batch, range(k, k + 1 if preempt else T))
            if lead.steps_done < T and self.queue.ranks_ahead(batch):
                for j in batch:
                    j.preemptions += 1
                    self.queue.put(j, env.now)
                return
        yield from self._vae(label, ps, batch)

    def _denoise(self, label: str, ps: Pass, batch: list[Job], steps: range):
        """One run of ``steps`` on every stage group; each request books the phase's mean GPU compute,
        exposed communication and wall time."""
        env, lay = self.env, ps.model.lay
        n = lay.n_gpus
        t0 = env.now
        acc = _Accounts(np.zeros(n), np.zeros(n), np.zeros(n))
        slots: dict = {}
        procs = [env.process(self._stage(label, ps, c, k, steps, slots, acc))
                 for c in range(lay.cfg) for k in range(lay.pp)]
        yield env.all_of(procs)
        den, comm, nbytes = float(acc.compute.mean()), float(acc.comm.mean()), float(acc.comm_bytes.max())
        for j in batch:
            if math.isnan(j.denoise_start):
                j.denoise_start = t0
            j.denoise += den
            j.comm += comm
            j.phase += env.now - t0
            j.comm_bytes += nbytes
            j.steps_done = steps.stop

    def _vae(self, label: str, ps: Pass, batch: list[Job]):
        env, sc = self.env, ps.model.sc
        t_den = env.now
        if ps.vae_time > 0:
            gpus = range(ps.model.lay.n_gpus) if sc.parallel.vae_parallel else [0]
            for g in gpus:
                self.rec.add(f"gpu{g}", f"{label} vae", t_den, t_den + ps.vae_time, "vae")
            yield env.timeout(ps.vae_time)
        for j in batch:
            j.denoise_end, j.vae = t_den, env.now - t_den
            j.served.succeed()

    def _last_mile(self, job: Job, ps: Pass):
        """Copy the output to the host, pass it between processes, encode it on the CPU, deliver it; record
        the request's row."""
        env, sc, rid = self.env, ps.model.sc, job.rid
        t_vae = env.now
        d2h_bytes, ipc, enc, out_bytes = ps.output
        yield self.topo.d2h(0, d2h_bytes, f"r{rid} d2h")
        t_d2h = env.now
        if ipc > 0:
            _, end = self.cpu.submit(env.now, ipc, f"r{rid} ipc")
            yield env.timeout(end - env.now)
        t_ipc = env.now
        if enc > 0:
            _, end = self.cpu.submit(env.now, enc, f"r{rid} encode {sc.delivery.format}")
            yield env.timeout(end - env.now)
        t_enc = env.now
        yield self.topo.fabric.transfer([self.client], out_bytes, sc.hardware.client_link.latency,
                                        f"r{rid} deliver")
        t_done = env.now
        self.rows.append({
            "request": rid, "arrival": job.arrival, "start": job.start, "denoise_start": job.denoise_start,
            "denoise_end": job.denoise_end, "vae_end": t_vae, "d2h_end": t_d2h, "ipc_end": t_ipc,
            "encode_end": t_enc,
            "done": t_done, "latency": t_done - job.arrival, "output_bytes": out_bytes,
            "comm_bytes_per_gpu": job.comm_bytes, "width": job.shape.width, "height": job.shape.height,
            "frames": job.shape.frames or 1, "steps": job.shape.steps, "batch": job.batch,
            "preemptions": job.preemptions,
            "queue": job.queue, "text_encode": job.text_encode, "denoise": job.denoise,
            "comm": job.comm, "bubble": job.phase - job.denoise - job.comm, "vae": job.vae,
            "d2h": t_d2h - t_vae, "ipc": t_ipc - t_d2h, "encode": t_enc - t_ipc, "deliver": t_done - t_enc,
            "completed": True,
        })

    def closed_client(self, ids, shapes=None):
        for rid in ids:
            t = self.env.now
            done = self.env.event()
            self.env.process(self.request(rid, t, done, shapes[rid] if shapes else None))
            yield done

    def open_source(self, times: np.ndarray, shapes=None):
        for rid, t in enumerate(times):
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self.env.process(self.request(rid, float(t), None, shapes[rid] if shapes else None))
