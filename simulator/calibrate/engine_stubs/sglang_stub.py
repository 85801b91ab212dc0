"""A stand-in GPU for SGLang: the model worker's forward answers without running the model.

Runs inside SGLang's own environment, in every SGLang process, so it imports nothing from
``simulator``. It is imported by a generated ``sitecustomize.py`` (a folder put first on
PYTHONPATH only for SGLang runs) and patches SGLang lazily, when SGLang imports the module
concerned (a post-import hook on ``sys.meta_path``); SGLang's installed files are not edited.

What stays real: ``python -m sglang.launch_server`` -- the HTTP server with the TokenizerManager
(FastAPI/uvicorn, OpenAI-compatible /v1/completions, SSE streaming, prompt tokenization) in the
main process, the Scheduler process (its event loop, the overlap scheduler, the schedule policy,
chunked prefill, the radix cache, the req-to-token pool and KV-token allocator, the result
processing), the DetokenizerManager process (incremental detokenization), ZeroMQ between them.
SGLang still builds its model runner on ``--device cpu`` (the tiny Llama, ``--load-format
dummy``) and its KV pools on CPU memory; neither does any work during the run.

What is stubbed (the patches, each named by the SGLang attribute it replaces):

- ``TpModelWorker.forward_batch_generation``: no ForwardBatch, no model forward, no sampling.
  It puts the step on a "GPU timeline" (a step launched at ``t`` starts at ``max(t, end of the
  previous step)``) taking ``a + b * decode_requests + c * prefill_tokens`` seconds (env
  LASTMILE_STUB_A/B/C; a decode request is one of a decode batch, prefill tokens are an extend
  batch's new tokens), returns at once with the next token ids (a fixed pattern over ordinary
  ids in [LASTMILE_STUB_TOKEN_LO, LASTMILE_STUB_TOKEN_HI), never EOS) and remembers the end time.
- ``Scheduler.process_batch_result``: first sleeps until the batch's step has ended (what the
  real scheduler's ``copy_done.synchronize()`` waits for on a GPU), then runs as shipped. With
  the overlap scheduler (SGLang's default) the next batch is launched before this wait, as on a
  GPU.
- ``RotaryEmbedding`` construction: SGLang's module flag ``_is_cpu`` in
  ``sglang.srt.layers.rotary_embedding.base`` is set, so the tiny model's rotary embedding does
  not import vLLM's CUDA kernel (``vllm._custom_ops``) while the unused model is built.

``LASTMILE_STUB_LOG=PATH`` appends one CSV line per step (the same columns as the vLLM stub's):
launch, start and end (time.time()), requests, decode requests, prefill tokens, ids returned (one per
request; the scheduler drops those of a partial prefill chunk),
new requests (0: not tracked), retracted (0: not tracked). Buffered, written every second by a daemon
thread and at exit.
"""

from __future__ import annotations

import sys
import threading
import time


# one step function for both stubs (stub_step.py beside this file, on the engine processes' PYTHONPATH)
from stub_step import (LOG_PATH, STEP_A, STEP_B, STEP_C, TOKEN_HI, TOKEN_LO, env_int,  # noqa: F401
                       patch_on_import, start_log, step_seconds)



class _Timeline:
    def __init__(self):
        self.gpu_free = 0.0
        self.counter = 0
        self.rows: list = []
        self.last_flush = time.time()
        self.lock = threading.Lock()
        start_log(self.flush)  # written every second by the log thread

    def flush(self) -> None:
        if not LOG_PATH:
            return
        with self.lock:
            rows, self.rows = self.rows, []  # a list swap: the forward's append never blocks
            self.last_flush = time.time()
        if rows:
            with open(LOG_PATH, "a") as f:
                f.writelines("%.6f,%.6f,%.6f,%d,%d,%d,%d,0,0\n" % tuple(r) for r in rows)


_TL = None


def _timeline() -> _Timeline:
    global _TL
    if _TL is None:
        _TL = _Timeline()
    return _TL


def _patch_tp_worker(mod) -> None:
    import torch

    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.utils import GenerationBatchResult

    def forward_batch_generation(self, batch=None, forward_batch=None, *args, **kwargs):
        tl = _timeline()
        launch = time.time()
        reqs = batch.reqs
        n = len(reqs)
        if batch.forward_mode.is_decode():
            n_decode, n_prefill = n, 0
        else:
            n_decode, n_prefill = 0, int(batch.extend_num_tokens or 0)
        start = max(launch, tl.gpu_free)
        end = start + step_seconds(n_decode, n_prefill)
        tl.gpu_free = end
        span = max(1, TOKEN_HI - TOKEN_LO)
        ids = []
        for _ in range(n):
            tl.counter += 1
            ids.append(TOKEN_LO + (tl.counter * 7919) % span)
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=torch.tensor(ids, dtype=torch.int64),
            can_run_cuda_graph=False)
        result._lastmile_end = end
        if LOG_PATH:
            tl.rows.append([launch, start, end, n, n_decode, n_prefill, n])
        return result

    mod.TpModelWorker.forward_batch_generation = forward_batch_generation


def _patch_scheduler(mod) -> None:
    original = mod.Scheduler.process_batch_result

    def process_batch_result(self, batch, result, *args, **kwargs):
        end = getattr(result, "_lastmile_end", None)
        if end is not None:
            delay = end - time.time()
            if delay > 0:
                time.sleep(delay)
        return original(self, batch, result, *args, **kwargs)

    mod.Scheduler.process_batch_result = process_batch_result


def _patch_rope(mod) -> None:
    mod._is_cpu = True


_PATCHES = {
    "sglang.srt.managers.tp_worker": _patch_tp_worker,
    "sglang.srt.managers.scheduler": _patch_scheduler,
    "sglang.srt.layers.rotary_embedding.base": _patch_rope,
}


def install() -> None:
    patch_on_import(_PATCHES)


install()
