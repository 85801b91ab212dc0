"""DiT stages: images rendered by lastmile's DiT path (``pipelines.dit``: text encode, denoising on
the resource's parallel layout, VAE, then the image's own last mile — copy to the host, encode,
deliver to the client) on a deployment in the pipeline's SimPy environment, shared by every stage
and request that names it.

The deployment is a :class:`~simulator.pipelines.dit.sim.DiTSim` built on the run's environment;
it renders one image at a time (its server), so images queue for it. A stage hands its image to it
when the stage becomes ready and ends when the image is delivered; the image's ten DiT
categories (queue, text_encode, denoise, comm, bubble, vae, d2h, ipc, encode, deliver) are kept per call.
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...observe.records import DIT_CATEGORIES, DIT_LAST_MILE
from ...observe.stats import stats
from ..dit.model import DiTModel
from ..dit.sim import DiTSim
from .llm_stage import resource_track

GIB = 2.0 ** 30


class DiTStage:
    """A stage on a dit resource: one image per request (the resource says which)."""

    def __init__(self, run, index: int, stage, n: int, rng: np.random.Generator):
        self.run, self.index, self.name, self.spec = run, index, stage.name, stage.spec
        self.resource = None  # bound once the run's resources are built

    def start(self, rid: int, now: float) -> None:
        self.run.start[rid, self.index] = now
        self.resource.call(rid, self.index)


class DiTDeployment:
    """One dit resource: a DiT simulation on the run's environment, with spans on a recorder of its
    own (tracks named under the resource, as an llm deployment's)."""

    def __init__(self, name: str, spec, run):
        self.name, self.run = name, run
        sc = spec.scenario
        model = DiTModel.build(sc)
        need = model.memory_per_gpu()
        if need > model.gpu.memory:  # a pipeline has no oom status: its deployment must fit
            raise ConfigError(f"the DiT does not fit in GPU memory: needs {need / GIB:.1f} GiB per GPU, the "
                              f"{sc.hardware.gpu.name} has {model.gpu.memory / GIB:.1f} GiB; use more GPUs or a "
                              "strategy that shards the model", path=f"resources.{name}.parallel")
        # its own rng (the DiT path draws nothing per image today), so the pipeline's draws stay put
        self.sim = DiTSim(model, run.env, np.random.default_rng(sc.seed))
        self.recorder = self.sim.rec
        self.owner: list[tuple[int, int]] = []  # image id -> (request, stage)

    def track(self, track: str) -> str:
        return resource_track(self.name, track)

    def call(self, rid: int, s: int) -> None:
        env, image = self.run.env, len(self.owner)
        self.owner.append((rid, s))
        done = env.event()
        done.callbacks.append(lambda _ev: self._delivered(rid, s))
        env.process(self.sim.request(image, env.now, done))

    def _delivered(self, rid: int, s: int) -> None:
        run = self.run
        run.first[rid, s] = run.env.now  # an image arrives whole
        run.finish(rid, s)

    def outcome(self, cut: bool) -> dict:
        """Its images' summary (latency, the DiT categories, last mile), each image's categories
        indexed by image id, and its spans and busy time under the resource's name."""
        import pandas as pd

        rows = pd.DataFrame(self.sim.rows, columns=["request", "latency", *DIT_CATEGORIES])
        rows = rows.set_index("request").sort_index()
        total = float(rows["latency"].sum())
        share = ({c: float(rows[c].sum()) / total for c in DIT_CATEGORIES} if total > 0
                 else {c: None for c in DIT_CATEGORIES})
        block = {"calls": len(self.owner), "calls_completed": int(len(rows)),
                 "latency_ms": stats(rows["latency"].to_numpy(float), 1e3), "breakdown_share": share,
                 "last_mile_share": sum(share[c] for c in DIT_LAST_MILE) if total > 0 else None}
        breakdown = rows[list(DIT_CATEGORIES)].rename_axis("request")
        spans = self.recorder.frame()
        spans["track"] = [self.track(t) for t in spans["track"].astype(str)]
        busy = {self.track(k): v for k, v in self.recorder.busy.items()}
        return {"summary": block, "breakdown": breakdown, "spans": spans, "busy": busy, "calls": self.calls()}

    def calls(self) -> np.ndarray:
        """Image id of each (request, stage) (-1 where none was rendered)."""
        out = np.full((self.run.n, self.run.S), -1, dtype=np.int64)
        for image, (rid, s) in enumerate(self.owner):
            out[rid, s] = image
        return out
