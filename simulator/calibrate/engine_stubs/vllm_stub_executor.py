"""A stand-in GPU for vLLM V1: an ``Executor`` that answers the engine core's calls without a model.

Runs inside vLLM's own environment (the engine-core process imports it by its qualified name,
``--distributed-executor-backend vllm_stub_executor.StubExecutor``, with this folder on
PYTHONPATH), so it imports nothing from ``simulator``. Everything else in the serving stack stays
real: the OpenAI API server(s), the engine-core process with the V1 scheduler and KV-cache manager,
ZeroMQ between them, the output processor and the incremental detokenizer.

Each engine step takes a deterministic "GPU" time, read from the environment::

    step = a + b * decode_requests + c * prefill_tokens
    LASTMILE_STUB_A  (s, default 0.002)   fixed per step
    LASTMILE_STUB_B  (s, default 10e-6)   per decode request (a scheduled request with 1 new token)
    LASTMILE_STUB_C  (s, default 10e-6)   per prefill token (tokens of requests with > 1 scheduled token)

The steps run on a "GPU timeline", as kernels on a stream: a step launched at ``t`` starts at
``max(t, end of the previous step)`` and ends ``step`` seconds later. ``execute_model`` records the
launch and returns at once (``None``, as the GPU model runner does before ``sample_tokens``);
``sample_tokens`` returns the step's output when its end time has passed (blocking: it sleeps until
then; non-blocking: a Future whose ``result()`` sleeps until then). So the host is free while the
"GPU" works, and vLLM's async scheduling (two batches in flight) overlaps as on a GPU; with
``--no-async-scheduling`` the core waits for each step.

vLLM's CPU platform switches async scheduling off unconditionally (``CpuPlatform.
check_and_update_config``: "async scheduling is not required on CPU"), while on a GPU it is on by
default. With ``LASTMILE_STUB_ASYNC=1`` (the default) this module, which the API server imports
while it builds its config (``Executor.get_class``, before the platform's check), wraps that one
platform method so that the value vLLM's own config logic chose before it (on, unless
``--no-async-scheduling``) is kept: the GPU default. That is the only vLLM code path changed.
``LASTMILE_STUB_ASYNC=0`` leaves the platform alone and reports no async support (vLLM's CPU
behaviour: one batch in flight).

Sampled ids follow a fixed pattern over ordinary vocabulary ids in [LASTMILE_STUB_TOKEN_LO,
LASTMILE_STUB_TOKEN_HI) (never a special token, so never EOS); a request whose prefill is still
partial after the step (chunked prefill) gets no token, as on the GPU model runner.

``LASTMILE_STUB_LOG=PATH`` appends one CSV line per step: launch, start and end (time.time(),
seconds), requests, decode requests, prefill tokens, sampled tokens, new requests, preempted.
Lines are buffered and written every 512 steps, at shutdown and at exit.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future

from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput


# one step function for both stubs (stub_step.py beside this file, on the engine processes' PYTHONPATH)
from stub_step import (LOG_PATH, STEP_A, STEP_B, STEP_C, TOKEN_HI, TOKEN_LO, env_int,  # noqa: F401
                       start_log, step_seconds)

ASYNC = os.environ.get("LASTMILE_STUB_ASYNC", "1") not in ("0", "false", "no")
KV_TOKENS = env_int("LASTMILE_STUB_KV_TOKENS", 1 << 20)  # KV-cache capacity the "GPU" reports


def _keep_async_scheduling() -> None:
    """Undo the CPU platform's forced ``async_scheduling = False`` (see the module docstring)."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except Exception:  # pragma: no cover - another platform: nothing to undo
        return
    original = CpuPlatform.check_and_update_config.__func__
    if getattr(original, "_lastmile_keeps_async", False):
        return

    def check_and_update_config(cls, vllm_config) -> None:
        chosen = vllm_config.scheduler_config.async_scheduling
        original(cls, vllm_config)
        if chosen:
            vllm_config.scheduler_config.async_scheduling = True

    check_and_update_config._lastmile_keeps_async = True
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


if ASYNC:
    _keep_async_scheduling()


class _DeadlineFuture(Future):
    """A Future that holds its value already and becomes done when its deadline (time.time()) passes;
    ``result()`` sleeps until then. No thread: the engine core's wait is the only clock."""

    def __init__(self, deadline: float, value):
        super().__init__()
        self._deadline = deadline
        self._value = value

    def done(self) -> bool:
        return super().done() or time.time() >= self._deadline

    def result(self, timeout=None):
        if not super().done():
            delay = self._deadline - time.time()
            if delay > 0:
                time.sleep(delay)
            self.set_result(self._value)
        return super().result()


def _done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


class StubExecutor(Executor):
    """vLLM ``Executor`` with a deterministic stand-in GPU (see the module docstring)."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        hf = self.model_config.hf_text_config
        self._layers = int(getattr(hf, "num_hidden_layers", 2))
        heads = int(getattr(hf, "num_attention_heads", 4))
        self._kv_heads = int(getattr(hf, "num_key_value_heads", None) or heads)
        self._head_size = int(getattr(hf, "head_dim", None) or hf.hidden_size // heads)
        self._dtype = self.model_config.dtype
        self._block_size = self.cache_config.block_size or 16
        self._prompt_len: dict[str, int] = {}
        self._pending: deque = deque()  # (scheduler_output, end) launched, not yet sampled
        self._gpu_free = 0.0
        self._counter = 0
        self._span = max(1, TOKEN_HI - TOKEN_LO)
        self._log_rows: list[list] = []
        self._last_flush = time.time()
        self._log_lock = threading.Lock()
        start_log(self._flush_log)

    # --- the engine core's calls -------------------------------------------------------------

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False,
                       single_value=False):
        name = method if isinstance(method, str) else getattr(method, "__name__", "")
        handler = getattr(self, "_rpc_" + name, None)
        result = handler(*args, **(kwargs or {})) if handler is not None else None
        value = result if single_value else [result]
        return _done(value) if non_block else value

    def _rpc_determine_available_memory(self) -> int:
        return KV_TOKENS * self._page_bytes_per_token() * self._layers

    def _rpc_get_kv_cache_spec(self) -> dict:
        return {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=self._block_size, num_kv_heads=self._kv_heads, head_size=self._head_size,
            dtype=self._dtype) for i in range(self._layers)}

    def _rpc_get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC"]

    def _rpc_get_supported_tasks(self) -> tuple:
        return ("generate",)

    def _rpc_compile_or_warm_up_model(self):
        return None

    def compile_or_warm_up_model(self) -> None:
        # the base class reads compilation times off the workers' answers; a stub compiles nothing
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        self._flush_log()

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return ASYNC

    def execute_model(self, scheduler_output, non_block: bool = False):
        """Launch the step on the "GPU" timeline; its output comes from ``sample_tokens``."""
        launch = time.time()
        n_decode = 0
        n_prefill = 0
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            if n == 1:
                n_decode += 1
            else:
                n_prefill += n
        if scheduler_output.total_num_scheduled_tokens == 0:
            # as the GPU model runner: an empty step answers at once, with an empty output
            self._forget(scheduler_output)
            return _done(EMPTY_MODEL_RUNNER_OUTPUT) if non_block else EMPTY_MODEL_RUNNER_OUTPUT
        start = max(launch, self._gpu_free)
        end = start + step_seconds(n_decode, n_prefill)
        self._gpu_free = end
        row = None
        if LOG_PATH:
            row = [launch, start, end, len(scheduler_output.num_scheduled_tokens), n_decode, n_prefill, None,
                   len(scheduler_output.scheduled_new_reqs), len(scheduler_output.preempted_req_ids or ())]
            with self._log_lock:  # the log thread's flush swaps the list
                self._log_rows.append(row)
        self._pending.append((scheduler_output, end, row))
        return _done(None) if non_block else None

    def sample_tokens(self, grammar_output, non_block: bool = False):
        scheduler_output, end, row = self._pending.popleft()
        output = self._output(scheduler_output)
        if row is not None:
            row[6] = sum(1 for s in output.sampled_token_ids if s)
            if len(self._log_rows) >= 512 or time.time() - self._last_flush > 2.0:
                self._flush_log()
        if non_block:
            return _DeadlineFuture(end, output)
        delay = end - time.time()
        if delay > 0:
            time.sleep(delay)
        return output

    def take_draft_token_ids(self):
        return None

    # --- helpers -----------------------------------------------------------------------------

    def _page_bytes_per_token(self) -> int:
        itemsize = getattr(self._dtype, "itemsize", 2)
        return 2 * self._kv_heads * self._head_size * itemsize

    def _forget(self, scheduler_output) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self._prompt_len.pop(req_id, None)

    def _output(self, so) -> ModelRunnerOutput:
        self._forget(so)
        computed = {}
        for new in so.scheduled_new_reqs:
            self._prompt_len[new.req_id] = new.prompt_len
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        lo, span = TOKEN_LO, self._span
        for req_id in req_ids:
            done_after = computed.get(req_id, 0) + so.num_scheduled_tokens[req_id]
            if done_after < self._prompt_len.get(req_id, 0):
                sampled.append([])  # a partial prefill chunk samples nothing
                continue
            self._counter += 1
            sampled.append([lo + (self._counter * 7919) % span])
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def _flush_log(self) -> None:
        """Append the rows of the sampled steps (a prefix of the launched ones) to the log."""
        if not LOG_PATH:
            return
        with self._log_lock:
            n = 0
            while n < len(self._log_rows) and self._log_rows[n][6] is not None:
                n += 1
            ready, self._log_rows = self._log_rows[:n], self._log_rows[n:]
            self._last_flush = time.time()
            if ready:
                with open(LOG_PATH, "a") as f:
                    f.writelines("%.6f,%.6f,%.6f,%d,%d,%d,%d,%d,%d\n" % tuple(r) for r in ready)
