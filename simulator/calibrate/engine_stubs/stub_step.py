"""What both engine stubs share: the stand-in GPU's step time and its settings, read from the
environment ``lastmile measure-engine`` sets. Imported by absolute name from the stubs' folder (on
the engine processes' PYTHONPATH); imports nothing from lastmile, which the engine's environment lacks."""

from __future__ import annotations

import atexit
import gc
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value in (None, "") else float(value)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


STEP_A = env_float("LASTMILE_STUB_A", 0.002)
STEP_B = env_float("LASTMILE_STUB_B", 10e-6)
STEP_C = env_float("LASTMILE_STUB_C", 10e-6)
TOKEN_LO = env_int("LASTMILE_STUB_TOKEN_LO", 300)
TOKEN_HI = env_int("LASTMILE_STUB_TOKEN_HI", 4000)
LOG_PATH = os.environ.get("LASTMILE_STUB_LOG") or None
LOG_HEADER = "launch,start,end,reqs,decode_reqs,prefill_tokens,sampled,new_reqs,preempted\n"

if os.environ.get("LASTMILE_STUB_GC") == "off":  # measure-engine --no-gc: CPython's cyclic collector off
    gc.disable()


def step_seconds(decode_requests: int, prefill_tokens: int) -> float:
    """The stub's deterministic GPU time of one step."""
    return STEP_A + STEP_B * decode_requests + STEP_C * prefill_tokens


LOG_EVERY_S = 1.0
"""How often a background thread writes the logged steps: the engines' processes may end without running
``atexit``, so a step log is complete once the server has been idle this long (the command waits longer
before it stops the server)."""


def start_log(flush) -> bool:
    """Open the step log the command asked for (``LASTMILE_STUB_LOG``): its header written once,
    ``flush`` run every second by a daemon thread and at exit; False when no log is asked for."""
    if not LOG_PATH:
        return False
    if not os.path.exists(LOG_PATH):
        with open(LOG_PATH, "w") as f:
            f.write(LOG_HEADER)
    atexit.register(flush)

    def every_second():
        while True:
            time.sleep(LOG_EVERY_S)
            flush()

    threading.Thread(target=every_second, name="lastmile-stub-log", daemon=True).start()
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self._inner, self._patch = inner, patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, patch)
        return spec


def patch_on_import(patches: dict) -> None:
    """Run ``patches[name](module)`` right after the engine imports module ``name`` (a post-import hook on
    ``sys.meta_path``), so the engine's installed files are never edited."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(patches))
