"""The DiT path as SimPy processes: queue, text encoder, T steps on N GPUs, VAE, last mile.

One deployment serves one image at a time on all its GPUs (as xDiT does). Each stage group
(``cfg`` branch x ``pipefusion`` stage) is one SimPy process that runs its tasks (a full image
in warmup or non-pipelined steps, one patch per task in PipeFusion's pipelined steps), waits
for its inputs (real topology transfers from the previous stage, from the last stage back to
stage 0, and between CFG branches), and records a span per task on every member GPU's track.
Collectives inside a group are priced per task by the strategies (:mod:`.strategies`), so
events scale with patches x stages, not layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from ...config.dit_models import image_codecs
from ...hardware.collectives import allgather_time
from ...hardware.cpu import CorePool, CPUProcess
from ...hardware.topology import Topology
from ...observe.spans import SpanRecorder
from ...workloads import dit as W
from .model import DiTModel
from .strategies.cfg import CFGParallel

RGB = 3
"""Channels of the decoded image."""
BASE64_INFLATION = 4.0 / 3.0
"""Base64 encodes 3 bytes as 4 characters (RFC 4648)."""


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

        self.topo = Topology.from_hardware(env, hw, lay.n_gpus, self.rec)
        self._routes: dict = {}  # stage group -> (ports, idle rate) of its collectives, on a node type
        self.client = self.topo.client_port()
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
                img = sc.height * sc.width * RGB * ab
                t = t / lay.n_gpus + allgather_time(img, lay.n_gpus, model.link.bandwidth,
                                                    model.link.latency)
            self.vae_time = t
        self.S = S
        self.output = self._output()

    def _output(self) -> tuple[float, float, float]:
        """(bytes copied to the host, CPU seconds to encode, bytes delivered) of one image."""
        sc, px = self.m.sc, self.m.sc.height * self.m.sc.width
        if sc.delivery.format == "latent":
            out_bytes = self.S * self.latent_token_bytes
            d2h_bytes = out_bytes
            enc = 0.0
        else:
            d2h_bytes = px * RGB * self.m.act_bytes  # decoded tensor copied before uint8 conversion
            c = image_codecs().cost(sc.delivery.format, sc.delivery.compress_level)
            enc = px * c.seconds_per_pixel
            out_bytes = px * RGB * c.size_ratio
        if sc.delivery.base64:
            out_bytes *= BASE64_INFLATION
        out_bytes += sc.delivery.response_header_bytes
        return d2h_bytes, enc, out_bytes

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
            tc = m.task(stage, q, warm or not lay.distri)
            for p in range(patches):
                if stage > 0:
                    yield from self._wait(self._slot(slots, (branch, stage, step, p)), members, acc)
                elif step > 0 and lay.pp > 1:
                    yield from self._wait(self._slot(slots, (branch, 0, step, p)), members, acc)
                start = env.now
                name = f"r{rid} s{step} p{p}"
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
                               CFGParallel.exchange_bytes(b, q, self.latent_token_bytes, lay.sp), "cfg", acc)
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
        d2h_bytes, enc, out_bytes = self.output
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
