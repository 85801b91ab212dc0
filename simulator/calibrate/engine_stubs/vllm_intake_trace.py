"""Timestamps at vLLM V1's request-intake points, for ``lastmile measure-engine vllm --trace-intake``.

Imported by a generated ``sitecustomize`` in every process of the server (so it imports nothing from
lastmile). It wraps, as each module is imported, the functions a request passes on its way in:
uvicorn's end of an HTTP message, the completion endpoint, the renderer's tokenization (in its thread
pool), ``AsyncLLM.add_request``, the engine core's ``preprocess_add_request`` (its input thread) and
``add_request``, and the scheduler's ``schedule``. Each entry and exit appends ``event, perf_counter,
thread, thread CPU, process CPU`` to ``trace_<pid>.csv`` in ``LASTMILE_TRACE_DIR``: perf_counter is
CLOCK_MONOTONIC, one clock for every process of the machine, so the rows line up with the client's
request start times. A wrapper costs a few microseconds; vLLM's code is not otherwise changed.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import threading
import time

from stub_step import patch_on_import

TRACE_DIR = os.environ.get("LASTMILE_TRACE_DIR") or None
_rows: list[tuple] = []


def _log(event: str) -> None:
    _rows.append((event, time.perf_counter(), threading.current_thread().name, time.thread_time(),
                  time.process_time()))


def _flush() -> None:
    rows = _rows[:]
    del _rows[:len(rows)]  # rows logged meanwhile stay for the next flush
    if rows:
        with open(os.path.join(TRACE_DIR, f"trace_{os.getpid()}.csv"), "a") as f:
            f.writelines(f"{e},{t!r},{n},{tc!r},{pc!r}\n" for e, t, n, tc, pc in rows)


def _every_second() -> None:
    while True:
        time.sleep(1.0)
        _flush()


def _wrapped(fn, tag: str):
    """``fn`` logging ``tag_b`` when it starts running and ``tag_e`` when it returns (a coroutine: when it
    finishes)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def traced(*args, **kwargs):
            _log(tag + "_b")
            try:
                return await fn(*args, **kwargs)
            finally:
                _log(tag + "_e")
    else:
        @functools.wraps(fn)
        def traced(*args, **kwargs):
            _log(tag + "_b")
            try:
                return fn(*args, **kwargs)
            finally:
                _log(tag + "_e")
    return traced


def _wrap(**targets):
    """A post-import patch wrapping ``Class.method`` of the module for each ``tag=(Class, method)``."""
    def patch(module):
        for tag, (cls, name) in targets.items():
            owner = getattr(module, cls)
            setattr(owner, name, _wrapped(getattr(owner, name), tag))
    return patch


PATCHES = {
    "uvicorn.protocols.http.httptools_impl": _wrap(http=("HttpToolsProtocol", "on_message_complete")),
    "vllm.entrypoints.openai.completion.serving": _wrap(cc=("OpenAIServingCompletion", "create_completion")),
    "vllm.renderers.base": _wrap(tok=("BaseRenderer", "_tokenize_prompt")),
    "vllm.v1.engine.async_llm": _wrap(add=("AsyncLLM", "add_request")),
    "vllm.v1.engine.core": _wrap(cpre=("EngineCore", "preprocess_add_request"), cadd=("EngineCore", "add_request")),
    "vllm.v1.core.sched.scheduler": _wrap(sch=("Scheduler", "schedule")),
}
"""Module -> the patch wrapping its intake functions (vLLM 0.33's names)."""

if TRACE_DIR:
    atexit.register(_flush)
    threading.Thread(target=_every_second, name="lastmile-intake-trace", daemon=True).start()
    patch_on_import(PATCHES)
