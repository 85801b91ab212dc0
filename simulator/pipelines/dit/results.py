"""A DiT run's outputs: the per-request frame, the summary dict, and the OOM result.

Each request's latency splits into ``queue, text_encode, denoise, comm, bubble, vae, d2h, ipc,
encode, deliver``. Over the denoising phase of wall time D on n GPUs, ``denoise`` is the mean
GPU compute time, ``comm`` the mean exposed communication time, ``bubble`` the rest
(D - denoise - comm): the phase's idle device time, per GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...config.dit_models import DiTScenario
from ...observe import energy
from ...observe.records import DIT_CATEGORIES, DIT_LAST_MILE
from ...observe.result import Result, with_units
from ...observe.stats import stats

CATEGORIES = DIT_CATEGORIES  # defined once, with the record schemas
GIB = 2.0 ** 30

REQUEST_COLUMNS = ("request", "arrival", "start", "denoise_start", "denoise_end", "vae_end", "d2h_end",
                   "ipc_end", "encode_end", "done", "latency", "output_bytes", "comm_bytes_per_gpu",
                   "width", "height", "frames", "steps", "batch", "preemptions", *CATEGORIES, "completed")
_NOT_SECONDS = ("request", "output_bytes", "comm_bytes_per_gpu", "width", "height", "frames", "steps", "batch",
                "preemptions", "completed")
SECONDS = tuple(c for c in REQUEST_COLUMNS if c not in _NOT_SECONDS)
"""Request columns in seconds: published as ``<name>_s``."""


def _identity(sc: DiTScenario, gpus: int, strategy: str) -> dict:
    """What the run is: model, GPU, layout, image and steps (the same keys whether it ran or not)."""
    return {"model": sc.arch.name, "gpu": sc.hardware.gpu.name, "gpus": gpus,
            "resolution": f"{sc.width}x{sc.height}", "frames": sc.frames, "steps": sc.steps, "strategy": strategy}


def oom_result(sc: DiTScenario, need: float, have: float, strategy: str) -> Result:
    """The result of a layout that does not fit: ``status: oom``, no request ran."""
    summary = {
        "kind": "dit", "scenario": sc.name, "status": "oom", **_identity(sc, sc.n_gpus, strategy),
        "memory_needed_gib": need / GIB, "memory_per_gpu_gib": need / GIB,
        "gpu_memory_gib": have / GIB,
        "message": f"does not fit in GPU memory: needs {need / GIB:.1f} GiB per GPU, the "
                   f"{sc.hardware.gpu.name} has {have / GIB:.1f} GiB; use more GPUs or a strategy that "
                   "shards the model",
        "memory_key": "parallel",
        "latency_s": stats(np.array([])), "breakdown_share": {c: None for c in CATEGORIES},
        "breakdown_mean_s": {c: None for c in CATEGORIES},
        "last_mile_share": None, "requests_total": sc.workload.requests, "requests_completed": 0,
        "throughput": {"images_per_s": 0.0},
    }
    empty = with_units(pd.DataFrame(columns=list(REQUEST_COLUMNS)), SECONDS)
    return Result("dit", sc, summary, empty, with_units(pd.DataFrame(columns=["request", *CATEGORIES,
                                                                              "latency"]), ("latency",)),
                  pd.DataFrame(columns=["track", "name", "start", "end", "category"]), [])


def request_frame(rows: list[dict], started: dict, total: int, times: np.ndarray | None) -> pd.DataFrame:
    """One row per request, in request order: completed images as recorded, the others with
    what is known (arrival; start if the server took them) and ``completed`` False."""
    by_id = {r["request"]: r for r in rows}
    out = []
    for rid in range(total):
        row = by_id.get(rid)
        if row is None:
            arrival, start = started.get(
                rid, (float(times[rid]) if times is not None else math.nan, math.nan))
            row = {c: math.nan for c in REQUEST_COLUMNS}
            row.update(request=rid, arrival=arrival, start=start, queue=start - arrival,
                       completed=False)
        out.append(row)
    df = pd.DataFrame(out, columns=list(REQUEST_COLUMNS))
    return df.astype({"request": "int64", "completed": bool})


def _cost_energy(sc: DiTScenario, model, util: dict, wall: float, images: int) -> dict:
    """The run's ``cost`` and ``energy`` (``observe.energy``) over the utilization's horizon (0 to the last
    image). A DiT's denoising is compute-bound (its GEMMs and attention run at their achievable FLOP
    rate; the few HBM bytes are left out), so the GPUs' busy seconds at the GEMMs' achievable rate are
    the FLOPs the activity model counts."""
    busy = sum(v for k, v in util.items() if k.startswith("gpu")) * wall
    dtype = sc.dtype if sc.dtype in model.gpu.peak_flops else "bf16"
    flops = busy * model.gpu.flops_rate(dtype)
    return energy.blocks(sc, model.lay.n_gpus, wall, busy, flops, 0.0, model.gpu.peak_flops[dtype], 1.0, images,
                         images, images, unit="image")


def serving_summary(sc: DiTScenario, batches: list, done: pd.DataFrame) -> dict:
    """How the service ran its passes: the policy, the batch limit, requests per pass, preemptions, and the
    distinct request shapes it served."""
    sizes = np.array([n for _, n in batches], dtype=float)
    return {"policy": sc.serving.policy, "max_batch": sc.serving.max_batch, "preempt": sc.serving.preempt,
            "passes": int(sizes.size), "batch_mean": float(sizes.mean()) if sizes.size else None,
            "batch_max": int(sizes.max()) if sizes.size else None,
            "preemptions": int(done["preemptions"].sum()) if len(done) else 0,
            "shapes": int(len(done[["width", "height", "frames", "steps"]].drop_duplicates())) if len(done) else 0}


def goodput(sc: DiTScenario, done: pd.DataFrame, span: float) -> dict | None:
    """Images delivered within ``slo.latency`` per second over the run, and the share of completed ones."""
    if sc.slo is None:
        return None
    good = int((done["latency"].to_numpy(float) <= sc.slo.latency).sum()) if len(done) else 0
    return {"images_per_s": good / span if span > 0 else 0.0, "slo_attainment": good / max(len(done), 1),
            "slo": {"latency_s": sc.slo.latency}}


def summary(sc: DiTScenario, model, done: pd.DataFrame, util: dict, need: float, strategy: str) -> dict:
    """The summary dict of a run that fitted in memory (before the health assessment)."""
    lat = done["latency"].to_numpy(float)
    total = float(lat.sum()) or 1.0
    share = ({c: float(done[c].sum()) / total for c in CATEGORIES} if len(done)
             else {c: None for c in CATEGORIES})
    first = float(done["arrival"].min()) if len(done) else 0.0
    last_done = float(done["done"].max()) if len(done) else 0.0
    return {
        **_cost_energy(sc, model, util, last_done, len(done)),
        "kind": "dit", "scenario": sc.name, "status": "ok", **_identity(sc, model.lay.n_gpus, strategy),
        "latency_s": stats(lat), "breakdown_share": share,
        "breakdown_mean_s": ({c: float(done[c].mean()) for c in CATEGORIES} if len(done)
                             else {c: None for c in CATEGORIES}),
        "last_mile_share": sum(share[c] for c in DIT_LAST_MILE) if len(done) else None,
        "memory_per_gpu_gib": need / GIB, "memory_needed_gib": need / GIB,
        "requests_completed": int(len(done)),
        "throughput": {"images_per_s": len(done) / (last_done - first) if last_done > first else 0.0},
        "goodput": goodput(sc, done, last_done - first),
        "comm_bytes_per_gpu": float(done["comm_bytes_per_gpu"].mean()) if len(done) else None,
        "utilization": {
            "gpu": {k: v for k, v in util.items() if k.startswith("gpu")},
            "link": {k: v for k, v in util.items() if k.startswith("link:")},
            "cpu": {k: v for k, v in util.items() if k.startswith("cpu:")},
        },
    }
