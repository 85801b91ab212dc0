"""Shared helpers of the DiT tests: scenarios that reproduce the reference measurements."""

from __future__ import annotations

import csv
from pathlib import Path

from simulator.config.loader import load_scenario

REF = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
if not REF.is_dir():
    REF = Path("/work/shared/reference")

_STRATEGY_KEY = {"tensor": "tensor", "pipefusion": "pipefusion", "distrifusion": "distrifusion",
                 "ulysses": "ulysses", "ring": "ring"}


EAGER_LAUNCH = "20 us"
"""CPU cost of one eager PyTorch op launched from Python: the top of the 5-20 us CPU-side
launch range in ../shared/reference/README.md (HolisticTraceAnalysis docs); the catalog's
5 us is the low end, for a C++ launch path. The legacy runs are eager (no CUDA graphs)."""


LEGACY_WARMUP_FLAG = 4
"""xDiT legacy's ``--warmup_steps`` default (legacy/scripts/run.py), used where a run records none."""


def legacy_sync_steps(flag: int) -> int:
    """Synchronous full-image steps that xDiT legacy runs for ``--warmup_steps flag``: flag + 1.

    PipeFusion: legacy/pipefuser/pipelines/pip/distri_pixartalpha.py takes
    ``warmup_timesteps = timesteps[: warmup_steps + 1]``; DistriFusion:
    legacy/pipefuser/modules/dit/patch_parallel/attn.py all-gathers synchronously while
    ``counter <= warmup_steps``. The simulator's ``parallel.warmup_steps`` counts the steps.
    """
    return flag + 1


def reference_rows(name: str) -> list[dict]:
    with open(REF / name) as f:
        return list(csv.DictReader(f))


def legacy_scenario(gpu: str, resolution: int, strategy: str, degree: int, steps: int = 20,
                    patches: int | None = None, warmup_flag: int | None = None, **extra):
    """The published xDiT legacy PixArt-alpha run: CFG on (batch 2), eager PyTorch, latent out.

    ``warmup_flag`` is the run's ``--warmup_steps`` (PipeFusion rows record 1; others the
    runner's default), translated to synchronous steps by :func:`legacy_sync_steps`.
    """
    parallel: dict = {}
    if strategy != "single":
        parallel[_STRATEGY_KEY[strategy]] = degree
    if strategy in ("pipefusion", "distrifusion"):
        flag = warmup_flag if warmup_flag is not None else (1 if strategy == "pipefusion"
                                                            else LEGACY_WARMUP_FLAG)
        parallel["warmup_steps"] = legacy_sync_steps(flag)
    if strategy == "tensor":  # legacy/pipefuser/models/distri_dit_tp.py splits attn1 and the FFN only
        parallel["tensor_cross_attention"] = "replicated"
    if strategy == "pipefusion":
        if patches is not None:
            parallel["patches"] = patches
    raw = {
        "kind": "dit", "model": "pixart-alpha", "resolution": resolution, "steps": steps,
        "dtype": "fp16",  # legacy/pipefuser/pipelines/pixartalpha.py: torch_dtype=torch.float16
        "cfg": True, "text_encode": True, "parallel": parallel,
        "delivery": {"vae": False, "format": "latent"},
        "workload": {"requests": 1, "arrival": "closed", "concurrency": 1},
        "hardware": {"gpu": {"base": gpu, "launch_overhead": EAGER_LAUNCH},
                     "cuda_graphs": False},
    }
    raw.update(extra)
    return load_scenario(raw)
