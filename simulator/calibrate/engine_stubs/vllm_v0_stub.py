"""A stand-in GPU for vLLM V0 (0.5.x, 0.6.x): the GPU executor's worker answers without a model.

Runs inside the old vLLM's own environment, imported by a generated ``sitecustomize.py`` (a folder
put first on PYTHONPATH only for these runs), so it imports nothing from ``simulator``. It patches
one method when vLLM imports ``vllm.executor.gpu_executor`` (a post-import hook on
``sys.meta_path``; vLLM's installed files are not edited): ``GPUExecutor._init_executor`` builds a
:class:`StubWorker` as the driver worker instead of vLLM's ``Worker`` (no CUDA context, no model,
no KV tensors).

Everything above the worker stays as shipped: ``python -m vllm.entrypoints.openai.api_server`` --
one process holding the FastAPI/uvicorn server, ``AsyncLLMEngine``'s loop (the V0 scheduler,
output processing, the incremental detokenizer, the per-request ``AsyncStream``) and
``GPUExecutorAsync.execute_model_async``, which runs the worker's ``execute_model`` in the event
loop's thread pool (``make_async``) as on a GPU.

The worker's step sleeps ``a + b * decode_requests + c * prefill_tokens`` seconds (stub_step.py;
``time.sleep`` releases the GIL, as a blocking CUDA copy does) and returns one sampled id per
sequence: a fixed pattern over ordinary vocabulary ids (never EOS). V0 is synchronous, so a step
starts when it is launched. With 0.6's async output processing the engine hands the worker a callback
that processes the previous step's outputs; the stub runs it right after the launch, where the real model
runner does (after the forward is queued, before the sampler's blocking copy), and sleeps what remains of
the step. What the real worker does on the CPU before the GPU runs (its ``prepare_input``: the model
runner's Python lists and tensors) is not run.

``LASTMILE_STUB_LOG=PATH`` appends one CSV line per step, as the other stubs do.
"""

from __future__ import annotations

import sys
import threading
import time

# one step function for every stub (stub_step.py beside this file, on the engine's PYTHONPATH)
from stub_step import LOG_PATH, TOKEN_HI, TOKEN_LO, env_int, patch_on_import, start_log, step_seconds

KV_TOKENS = env_int("LASTMILE_STUB_KV_TOKENS", 1 << 20)  # KV-cache capacity the "GPU" reports


class StubWorker:
    """The driver worker's calls the V0 engine makes, answered without a GPU."""

    def __init__(self, cache_config):
        self.cache_config = cache_config
        self.counter = 0
        self.rows: list = []
        self.lock = threading.Lock()
        start_log(self.flush)

    def determine_num_available_blocks(self):
        return KV_TOKENS // self.cache_config.block_size, 0

    def initialize_cache(self, num_gpu_blocks, num_cpu_blocks):
        self.cache_config.num_gpu_blocks = num_gpu_blocks
        self.cache_config.num_cpu_blocks = num_cpu_blocks

    def execute_model(self, execute_model_req=None):
        from vllm.sequence import CompletionSequenceGroupOutput, Logprob, SequenceOutput
        try:  # 0.5: vllm.sequence; 0.6: the sampler's module
            from vllm.sequence import SamplerOutput
        except ImportError:
            from vllm.model_executor.layers.sampler import SamplerOutput

        if execute_model_req is None:
            return []
        launch = time.time()
        groups = execute_model_req.seq_group_metadata_list
        n_decode = sum(1 for g in groups if not g.is_prompt)
        n_prefill = sum(g.token_chunk_size for g in groups if g.is_prompt)
        callback = getattr(execute_model_req, "async_callback", None)
        if callback is not None:  # 0.6's async output processing: the last step's outputs while this one runs
            callback()
        time.sleep(max(0.0, launch + step_seconds(n_decode, n_prefill) - time.time()))
        end = time.time()
        span = max(1, TOKEN_HI - TOKEN_LO)
        outputs = []
        for g in groups:
            samples = []
            for seq_id in g.seq_data:
                self.counter += 1
                token = TOKEN_LO + (self.counter * 7919) % span
                samples.append(SequenceOutput(seq_id, token, {token: Logprob(0.0)}))
            outputs.append(CompletionSequenceGroupOutput(samples, None))
        if LOG_PATH:
            with self.lock:
                self.rows.append((launch, launch, end, len(groups), n_decode, n_prefill, len(groups)))
        return [SamplerOutput(outputs=outputs)]

    def flush(self) -> None:
        if not LOG_PATH:
            return
        with self.lock:
            rows, self.rows = self.rows, []
        if rows:
            with open(LOG_PATH, "a") as f:
                f.writelines("%.6f,%.6f,%.6f,%d,%d,%d,%d,0,0\n" % r for r in rows)

    def add_lora(self, lora_request):
        return False

    def remove_lora(self, lora_id):
        return False

    def pin_lora(self, lora_id):
        return False

    def list_loras(self):
        return set()


def _patch_gpu_executor(mod) -> None:
    def _init_executor(self) -> None:
        self.driver_worker = StubWorker(self.cache_config)

    mod.GPUExecutor._init_executor = _init_executor


_PATCHES = {"vllm.executor.gpu_executor": _patch_gpu_executor}


def _pyairports() -> None:
    """outlines (a dependency of 0.5's guided decoding, imported by its OpenAI server) imports
    ``pyairports.airports.AIRPORT_LIST`` for an airport-code type; that package was withdrawn from
    PyPI (its one release left is empty), so an empty list stands in. Nothing here uses the type."""
    try:
        import pyairports.airports  # noqa: F401
    except ImportError:
        import types

        pkg, mod = types.ModuleType("pyairports"), types.ModuleType("pyairports.airports")
        mod.AIRPORT_LIST = []
        pkg.airports = mod
        sys.modules.update({"pyairports": pkg, "pyairports.airports": mod})


def install() -> None:
    _pyairports()
    patch_on_import(_PATCHES)


install()
