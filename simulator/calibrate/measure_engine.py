"""Measure a real serving engine's host path with a stand-in GPU: ``lastmile measure-engine vllm``.

The real ``vllm serve`` runs (the OpenAI API server process or processes, the engine-core process with
the V1 scheduler, ZeroMQ between them, the output processor, the incremental detokenizer), with one
piece replaced: its ``Executor``, by :mod:`engine_stubs.vllm_stub_executor`, a deterministic stand-in
GPU whose step takes ``a + b * decode_requests + c * prefill_tokens`` seconds. The model is a tiny
Llama config with a tokenizer trained here (nothing is downloaded); ``--load-format dummy`` loads no
weights, and the stub needs none. The real ``vllm bench serve`` drives it over loopback. For each
point (concurrency x stream interval x API servers) this module starts a fresh server, runs the
client, reads its result JSON, and records each process's CPU seconds (``/proc/PID/stat``
utime + stime) over the benchmark's main run only (from the client's "Starting main benchmark
run" line to its result banner), plus the stub's per-step log in the same window.

``lastmile measure-engine sglang`` does the same for SGLang: the real ``python -m
sglang.launch_server`` (the HTTP server and TokenizerManager in the main process, the Scheduler and
DetokenizerManager processes, ZeroMQ between them) on ``--device cpu`` with the same tiny model and
``--load-format dummy``, with :mod:`engine_stubs.sglang_stub` (imported in every SGLang process by a
generated ``sitecustomize.py``) replacing the model worker's forward with the same stub step; the
client is ``vllm bench serve`` from vLLM's environment (``client_python``). Its table has one more
column, ``cpu_s_detokenizer`` (:data:`SGLANG_CSV_COLUMNS`).

Runs in lastmile's own environment with the standard library, numpy and pandas; vLLM (and SGLang)
run in their own environments, named by ``python`` (several GB, never a dependency of lastmile).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import LastmileError
from ..runfolder import write_atomically

STUB_DIR = Path(__file__).resolve().parent / "engine_stubs"
STUB_BACKEND = "vllm_stub_executor.StubExecutor"

INSTALL_HINT = ("install the engine into its own environment: python3 -m venv .venv-vllm && "
                ".venv-vllm/bin/pip install -e '.[engine-vllm]' (several GB), then pass --python "
                ".venv-vllm/bin/python")

SGLANG_STUB_MODULE = "sglang_stub"
SGLANG_INSTALL_HINT = ("install SGLang into its own environment: python3 -m venv .venv-sglang && "
                       ".venv-sglang/bin/pip install -e '.[engine-sglang]' (about 11 GB), then pass --python "
                       ".venv-sglang/bin/python")
SGLANG_CONCURRENCY = (1, 16, 64, 256, 1024)
# SGLang's KV pool lives in CPU memory here (--device cpu); the default sizing would take most of the
# machine's memory, so it is capped at the vLLM stub's reported capacity.
SGLANG_MAX_TOTAL_TOKENS = 1 << 20

CONCURRENCY = (1, 16, 64, 256, 1024, 2048)
STREAM_INTERVAL = (1, 8)
API_SERVERS = (1, 2, 4)
SUBSET = (64, 256, 1024)  # the concurrencies measured for the api-servers and stream-interval variants

INPUT_LEN = 128
OUTPUT_LEN = 64
VOCAB = 4096

# The stub's step function (seconds): a + b per decode request + c per prefill token.
STUB_A = 2e-3
STUB_B = 10e-6
STUB_C = 10e-6

# The scheduler limits of vLLM's OpenAI server on an H100-class GPU (arg_utils defaults for a GPU
# with >= 70 GiB), set explicitly as the CPU platform's own defaults are smaller.
MAX_NUM_SEQS = 1024
MAX_NUM_BATCHED_TOKENS = 8192
MAX_MODEL_LEN = 1024

START_TIMEOUT_S = 240.0
CLIENT_TIMEOUT_S = 900.0

CSV_COLUMNS = [
    "engine", "engine_version", "async_scheduling", "concurrency", "stream_interval", "api_servers",
    "num_prompts", "input_len", "output_len", "stub_a_s", "stub_b_s", "stub_c_s",
    "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p99",
    "itl_ms_mean", "itl_ms_p50", "itl_ms_p99", "e2e_ms_mean", "output_tokens_per_s", "requests_per_s",
    "completed", "output_tokens", "chunks",
    "cpu_s_api", "cpu_s_engine_core", "cpu_s_client", "cpu_s_launcher", "cpu_s_other", "duration_s",
    "steps", "step_ms_mean", "batch_mean", "req_steps", "prefill_tokens", "gpu_busy_frac", "preempted",
]

# SGLang's table: the same columns, with the DetokenizerManager process in a column of its own
# (cpu_s_api: the main process, HTTP server + TokenizerManager; cpu_s_engine_core: the Scheduler).
SGLANG_CSV_COLUMNS = CSV_COLUMNS[:CSV_COLUMNS.index("cpu_s_client")] + ["cpu_s_detokenizer"] + \
    CSV_COLUMNS[CSV_COLUMNS.index("cpu_s_client"):]

# vLLM 0.5's and 0.6's table (``measure_engine_v0``): no launcher (0.5: one server process, cpu_s_api, its engine
# core 0), the sum over steps of the requests squared (what the garbage collector's cost follows), and the
# shares of the profiled process's py-spy samples per category of work.
V0_CSV_COLUMNS = [c for c in CSV_COLUMNS if c != "cpu_s_launcher"] + ["req_steps_sq"] + \
    ["spy_samples", "spy_schedule", "spy_output", "spy_detokenize", "spy_engine", "spy_ipc", "spy_api", "spy_loop"]

_BUILD_MODEL = r'''
import json, os, random, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
out, vocab = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
rng = random.Random(0)
letters = "etaoinshrdlucmfwypvbgkjqxz"
weights = [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.0, 2.0, 1.9, 1.5,
           1.0, 0.8, 0.2, 0.2, 0.1, 0.1, 0.1]
words = ["".join(rng.choices(letters, weights, k=rng.randint(1, 9))) for _ in range(6000)]
lines = [" ".join(rng.choices(words, k=rng.randint(5, 30))) + rng.choice([".", ",", "!", "?", ""])
         for _ in range(20000)]
special = ["<unk>", "<s>", "</s>"]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(os.path.join(out, "tokenizer.json"))
V = tok.get_vocab_size()
def dump(name, obj):
    with open(os.path.join(out, name), "w") as f:
        json.dump(obj, f, indent=1)
dump("tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
     "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 4096, "add_bos_token": False,
     "clean_up_tokenization_spaces": False})
dump("special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
dump("config.json", {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
     "head_dim": 16, "vocab_size": V, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
     "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
     "tie_word_embeddings": False, "torch_dtype": "bfloat16"})
dump("generation_config.json", {"bos_token_id": 1, "eos_token_id": 2})
print(json.dumps({"vocab_size": V, "special_ids": [tok.token_to_id(s) for s in special],
                  "first_merged_id": 3 + 256}))
'''

# run by the engine's python: exit 3 without the engine, else the versions of the packages named (JSON)
_VERSIONS = r'''
import importlib.metadata as m, importlib.util as u, json, sys
engine, names = sys.argv[1], sys.argv[2:]
if u.find_spec(engine) is None:
    sys.exit(3)
out = {}
for name in names:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
'''

# each engine's install hint and the packages whose versions a measurement records
ENGINE_PACKAGES = {
    "vllm": (INSTALL_HINT, ("vllm", "torch", "transformers", "tokenizers", "pyzmq", "uvicorn", "fastapi", "msgspec")),
    "vllm-v0": (None, ("vllm", "torch", "transformers", "tokenizers", "uvicorn", "fastapi", "pydantic", "uvloop")),
    "vllm-v0.6": (None, ("vllm", "torch", "transformers", "tokenizers", "uvicorn", "fastapi", "pydantic", "uvloop",
                         "pyzmq", "cloudpickle")),
    "sglang": (SGLANG_INSTALL_HINT, ("sglang", "sglang-kernel", "torch", "transformers", "tokenizers", "pyzmq",
                                     "uvicorn", "fastapi", "uvloop", "orjson")),
}


@dataclass
class Point:
    concurrency: int
    stream_interval: int = 1
    api_servers: int = 1
    async_scheduling: bool = True
    output_len: int = OUTPUT_LEN  # tokens each response is made to carry (``--random-output-len``, ignore_eos)

    @property
    def label(self) -> str:
        extra = "" if self.async_scheduling else " no-async"
        extra += "" if self.output_len == OUTPUT_LEN else f" out={self.output_len}"
        return f"c={self.concurrency} si={self.stream_interval} api={self.api_servers}{extra}"


def num_prompts_for(concurrency: int, quick: bool = False) -> int:
    """Prompts per point: 4 per concurrency slot, at least 100, at most 4096 (a point stays < ~2 min)."""
    if quick:
        return max(20, min(2 * concurrency, 200))
    return int(min(max(4 * concurrency, 100), 4096))


def plan(concurrency=CONCURRENCY, stream_interval=STREAM_INTERVAL, api_servers=API_SERVERS,
         subset=SUBSET, sync_point: int | None = 64, output_len=(OUTPUT_LEN,)) -> list[Point]:
    """The sweep in priority order: every concurrency at the first stream interval and API-server count,
    then the other API-server counts, then the other stream intervals, at the ``subset`` concurrencies
    (all of them when the subset does not intersect); then one point without async scheduling; last,
    the ``subset`` concurrencies at the other output lengths (which set apart the API server's costs
    per request and per output token, collinear at one length)."""
    base_si, base_api, base_out = stream_interval[0], api_servers[0], output_len[0]
    points = [Point(c, base_si, base_api, output_len=base_out) for c in concurrency]
    sub = [c for c in concurrency if c in subset] or list(concurrency)
    points += [Point(c, base_si, a, output_len=base_out) for a in api_servers[1:] for c in sub]
    points += [Point(c, s, base_api, output_len=base_out) for s in stream_interval[1:] for c in sub]
    if sync_point is not None and sync_point in concurrency:
        points.append(Point(sync_point, base_si, base_api, async_scheduling=False, output_len=base_out))
    points += [Point(c, base_si, base_api, output_len=o) for o in output_len[1:] for c in sub]
    return points


# --- the engine's environment ---------------------------------------------------------------------

def engine_versions(python: str, engine: str = "vllm") -> dict:
    """The versions in ``python``'s environment; a LastmileError (one line) when it lacks the engine."""
    if engine not in ENGINE_PACKAGES:
        raise LastmileError(f"measure-engine {engine}: not supported here (only {', '.join(ENGINE_PACKAGES)})")
    hint, packages = ENGINE_PACKAGES[engine]
    if hint is None:  # the V0 releases: their hint lives with their runner
        from .measure_engine_v0 import V0_INSTALL_HINT as hint
    exe = shutil.which(python) if os.sep not in python else python
    if not exe or not os.path.exists(exe):
        raise LastmileError(f"measure-engine {engine}: {python} does not exist; {hint}")
    try:
        proc = subprocess.run([exe, "-c", _VERSIONS, packages[0], *packages], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LastmileError(f"measure-engine {engine}: cannot run {python}: {exc}") from None
    if proc.returncode != 0:
        raise LastmileError(f"measure-engine {engine}: {python} cannot import {packages[0]}; {hint}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_model(python: str, folder: Path, vocab: int = VOCAB, engine: str = "vllm") -> dict:
    """A tiny Llama folder (config.json, tokenizer trained here, tokenizer_config.json) made by ``python``."""
    proc = subprocess.run([python, "-c", _BUILD_MODEL, str(folder), str(vocab)], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-1:])
        raise LastmileError(f"measure-engine {engine}: building the tiny model folder failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _engine_env(python: str) -> dict:
    env = dict(os.environ)
    bindir = str(Path(python).parent)
    env.update({
        "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
        "PATH": bindir + os.pathsep + env.get("PATH", ""),
    })
    env.pop("PYTHONHOME", None)
    env.pop("VIRTUAL_ENV", None)
    return env


# --- processes and their CPU time -----------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), or None when it is gone."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _parent(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _roles(root: int, rules: tuple, root_role) -> dict[int, str]:
    """Each server process's role from its title: the first of ``rules`` ((substring, role), in
    order) the title holds; else ``root_role(titles)`` for the launched process, ``other`` for the rest."""
    titles = {pid: _cmdline(pid) for pid in descendants(root)}
    roles = {}
    for pid, title in titles.items():
        role = next((r for key, r in rules if key in title), None)
        roles[pid] = role or (root_role(titles) if pid == root else "other")
    return roles


def classify(root: int) -> dict[int, str]:
    """Each server process's role: ``api``, ``engine_core``, ``launcher`` (the ``vllm serve`` process
    when separate API-server processes serve), ``other`` (resource tracker, coordinator)."""
    def launched(titles) -> str:
        return "launcher" if any("APIServer" in t for p, t in titles.items() if p != root) else "api"
    return _roles(root, (("EngineCore", "engine_core"), ("APIServer", "api")), launched)


def _snapshot(pids) -> dict[int, float]:
    return {pid: cpu_seconds(pid) for pid in pids}


def _affinity(pid: int) -> str:
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        return "?"
    return ",".join(map(str, cpus))


# --- one point ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def _stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``grace`` seconds."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class Run:
    point: Point
    row: dict = field(default_factory=dict)
    error: str | None = None


def _server_cmd(python: str, model: Path, port: int, p: Point) -> list[str]:
    vllm = str(Path(python).parent / "vllm")
    cmd = [vllm, "serve", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
           "--port", str(port), "--load-format", "dummy", "--enforce-eager",
           "--distributed-executor-backend", STUB_BACKEND, "--max-model-len", str(MAX_MODEL_LEN),
           "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
           "--stream-interval", str(p.stream_interval), "--seed", "0"]
    if p.api_servers != 1:
        cmd += ["--api-server-count", str(p.api_servers)]
    if not p.async_scheduling:
        cmd += ["--no-async-scheduling"]
    return cmd


def _client_cmd(python: str, model: Path, port: int, p: Point, n: int, result: Path) -> list[str]:
    vllm = str(Path(python).parent / "vllm")
    return [vllm, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
            "--model", "tiny", "--tokenizer", str(model), "--dataset-name", "random",
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(p.output_len), "--ignore-eos",
            "--num-prompts", str(n), "--max-concurrency", str(p.concurrency), "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result.parent),
            "--result-filename", result.name, "--disable-tqdm"]


def _step_stats(log: Path, t0: float, t1: float) -> dict:
    """The stub's steps launched in [t0, t1] (time.time())."""
    try:
        import pandas as pd

        d = pd.read_csv(log)
    except Exception:
        return {}
    d = d[(d.launch >= t0) & (d.launch <= t1)]
    if d.empty:
        return {}
    dur = d.end - d.start
    return {"steps": int(len(d)), "step_ms_mean": round(float(dur.mean()) * 1e3, 4),
            "batch_mean": round(float(d.reqs.mean()), 3), "req_steps": int(d.reqs.sum()),
            "req_steps_sq": int((d.reqs.astype("int64") ** 2).sum()),
            "prefill_tokens": int(d.prefill_tokens.sum()),
            "gpu_busy_frac": round(float(dur.sum()) / max(t1 - t0, 1e-9), 4),
            "preempted": int(d.preempted.sum())}


def _drive(run: Run, server: subprocess.Popen, server_log, ready, roles_of, ccmd: list[str], client_env: dict,
           work: Path, tag: str, result: Path, settle: float = 0.0, on_start=None, on_end=None):
    """Wait until the started ``server`` is ``ready()``, run the client ``ccmd`` against it, stop both;
    ``on_start(roles)`` and ``on_end()`` run at the client's main-run marks (a profiler's start and stop).
    Returns (roles, CPU seconds spent per pid over the client's main run, its window, affinities), or
    None with ``run.error`` set."""
    client = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode} before it was ready "
                                   f"(see {server_log.name})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {START_TIMEOUT_S:.0f} s")
            time.sleep(0.5)
        time.sleep(1.0)  # let the server's processes finish their own start
        roles = roles_of(server.pid)
        client_out = open(work / f"client_{tag}.log", "w")
        client = subprocess.Popen(ccmd, env=client_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True, cwd=work)
        marks: dict[str, tuple[float, dict]] = {}

        def read():
            for line in client.stdout:
                client_out.write(line)
                if "Starting main benchmark run" in line and "start" not in marks:
                    marks["start"] = (time.time(), _snapshot(list(roles) + [client.pid]))
                    if on_start:
                        on_start(roles)
                elif "Serving Benchmark Result" in line and "end" not in marks:
                    marks["end"] = (time.time(), _snapshot(list(roles) + [client.pid]))
                    if on_end:
                        on_end()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            client.wait(CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"client did not finish in {CLIENT_TIMEOUT_S:.0f} s") from None
        reader.join(10)
        client_out.close()
        if client.returncode != 0 or "start" not in marks or "end" not in marks or not result.exists():
            raise RuntimeError(f"client exited with {client.returncode} (see {client_out.name})")
        time.sleep(settle)
        affinity = {role: _affinity(pid) for pid, role in roles.items()}
        affinity["client"] = "?"
    except Exception as exc:
        run.error = str(exc)
        _stop(server)
        if client is not None and client.poll() is None:
            _stop(client, 5)
        server_log.close()
        return None
    _stop(server)
    server_log.close()
    (t0, c0), (t1, c1) = marks["start"], marks["end"]

    def spent(pid):
        a, b = c0.get(pid), c1.get(pid)
        return (b - a) if a is not None and b is not None else 0.0

    cpu = {}
    for pid, role in roles.items():
        cpu[role] = cpu.get(role, 0.0) + spent(pid)
    cpu["client"] = spent(client.pid)
    return cpu, (t0, t1), affinity


def _row(engine: str, versions: dict, p: Point, n: int, stub, api_servers: int, result: Path, cpu: dict,
         window, steplog: Path, affinity: dict, cpu_columns) -> dict:
    """A point's CSV row from the client's result file, the processes' CPU seconds and the stub's log."""
    with open(result) as f:
        res = json.load(f)
    itls = res.get("itls") or []
    row = {
        "engine": engine, "engine_version": versions.get(engine), "async_scheduling": p.async_scheduling,
        "concurrency": p.concurrency, "stream_interval": p.stream_interval, "api_servers": api_servers,
        "num_prompts": n, "input_len": INPUT_LEN, "output_len": p.output_len,
        "stub_a_s": stub[0], "stub_b_s": stub[1], "stub_c_s": stub[2],
    }
    for metric in ("ttft", "tpot", "itl"):
        row[f"{metric}_ms_mean"] = res.get(f"mean_{metric}_ms")
        row[f"{metric}_ms_p50"] = res.get(f"median_{metric}_ms", res.get(f"p50_{metric}_ms"))
        row[f"{metric}_ms_p99"] = res.get(f"p99_{metric}_ms")
    row["e2e_ms_mean"] = res.get("mean_e2el_ms")
    row["output_tokens_per_s"] = res.get("output_throughput")
    row["requests_per_s"] = res.get("request_throughput")
    row["completed"] = res.get("completed")
    row["output_tokens"] = res.get("total_output_tokens")
    row["chunks"] = int(sum(len(x) + 1 for x in itls)) if itls else None
    for role in cpu_columns:
        row[f"cpu_s_{role}"] = round(cpu.get(role, 0.0), 3)
    row["duration_s"] = res.get("duration")
    row.update(_step_stats(steplog, *window))
    for key in ("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p99",
                "itl_ms_mean", "itl_ms_p50", "itl_ms_p99", "e2e_ms_mean", "output_tokens_per_s",
                "requests_per_s", "duration_s"):
        if isinstance(row.get(key), float):
            row[key] = round(row[key], 4)
    row["_affinity"] = affinity
    return row


def _pinned(cmd: list[str], cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] + cmd if cpus else cmd


STUB_ENV: dict[str, str] = {}
"""Settings of the sweep under way for the stubs in the servers' environment (``LASTMILE_STUB_GC``)."""


def _point_setup(python: str, work: Path, tag: str, stub, token_range, path: list[str]) -> tuple:
    """A point's fresh step log and result file, and the server's environment: ``path`` first on its
    PYTHONPATH, the stub's step function and id range in ``LASTMILE_STUB_*``."""
    steplog, result = work / f"steps_{tag}.csv", work / f"bench_{tag}.json"
    for f in (steplog, result):
        f.unlink(missing_ok=True)
    env = _engine_env(python)
    env.update({"PYTHONPATH": os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
                "LASTMILE_STUB_A": repr(stub[0]), "LASTMILE_STUB_B": repr(stub[1]),
                "LASTMILE_STUB_C": repr(stub[2]), "LASTMILE_STUB_LOG": str(steplog),
                "LASTMILE_STUB_TOKEN_LO": str(token_range[0]), "LASTMILE_STUB_TOKEN_HI": str(token_range[1]),
                **STUB_ENV})
    return steplog, result, env


def run_point(python: str, model: Path, p: Point, n: int, work: Path, versions: dict, token_range,
              stub=(STUB_A, STUB_B, STUB_C), client_taskset: str | None = None,
              server_taskset: str | None = None, trace_intake: bool = False) -> Run:
    """Start a fresh server for ``p``, run the client, stop the server; the point's CSV row (with
    ``trace_intake``, the intake timings of :mod:`.measure_intake` too)."""
    run = Run(p)
    tag = f"c{p.concurrency}_si{p.stream_interval}_api{p.api_servers}" + ("" if p.async_scheduling else "_sync") \
        + ("" if p.output_len == OUTPUT_LEN else f"_out{p.output_len}")
    traces = work / f"trace_{tag}"
    site = [str(stub_site(work, "vllm_intake_trace"))] if trace_intake else []
    steplog, result, env = _point_setup(python, work, tag, stub, token_range, site + [str(STUB_DIR)])
    env["LASTMILE_STUB_ASYNC"] = "1" if p.async_scheduling else "0"
    if trace_intake:
        shutil.rmtree(traces, ignore_errors=True)
        traces.mkdir(parents=True)
        env["LASTMILE_TRACE_DIR"] = str(traces)
        offset = time.time() - time.perf_counter()  # wall clock -> CLOCK_MONOTONIC, for the stub's step log
    port = _free_port()
    server_log = open(work / f"server_{tag}.log", "w")
    server = subprocess.Popen(_pinned(_server_cmd(python, model, port, p), server_taskset), env=env,
                              stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
    ccmd = _pinned(_client_cmd(python, model, port, p, n, result), client_taskset)
    # settle: the stub's log thread writes its last rows within a second of the client's end
    got = _drive(run, server, server_log, lambda: _healthy(port), classify, ccmd, _engine_env(python), work, tag,
                 result, settle=1.5)
    if got is not None:
        cpu, window, affinity = got
        run.row = _row("vllm", versions, p, n, stub, p.api_servers, result, cpu, window, steplog, affinity,
                       ("api", "engine_core", "client", "launcher", "other"))
        if trace_intake:
            from .measure_intake import intake_columns

            run.row.update(intake_columns(traces, result, steplog, offset, p.concurrency))
    return run


# --- SGLang ---------------------------------------------------------------------------------------

def classify_sglang(root: int) -> dict[int, str]:
    """Each SGLang server process's role: ``api`` (the launch_server process: HTTP server and
    TokenizerManager), ``engine_core`` (``sglang::scheduler``), ``detokenizer``
    (``sglang::detokenizer``), ``other`` (the multiprocessing resource tracker)."""
    return _roles(root, (("sglang::scheduler", "engine_core"), ("sglang::detokenizer", "detokenizer")),
                  lambda titles: "api")


def _sglang_server_cmd(python: str, model: Path, port: int, p: Point) -> list[str]:
    cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--load-format", "dummy",
           "--max-total-tokens", str(SGLANG_MAX_TOTAL_TOKENS), "--max-running-requests", str(MAX_NUM_SEQS),
           "--chunked-prefill-size", str(MAX_NUM_BATCHED_TOKENS), "--context-length", str(MAX_MODEL_LEN),
           "--stream-interval", str(p.stream_interval), "--random-seed", "0"]
    if not p.async_scheduling:
        cmd += ["--disable-overlap-schedule"]
    return cmd


def stub_site(work: Path, module: str) -> Path:
    """A folder holding only a ``sitecustomize.py`` that imports the stub ``module``, put first on PYTHONPATH
    for a server whose code the stub patches as it is imported (so every process of it, the spawned ones
    included, is patched): SGLang's, vLLM V0's."""
    site = work / f"site_{module}"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(f"import {module}  # lastmile measure-engine\n")
    return site


def _log_has(path: Path, text: str) -> bool:
    try:
        with open(path, errors="replace") as f:
            return text in f.read()
    except OSError:
        return False


def run_point_sglang(python: str, client_python: str, model: Path, p: Point, n: int, work: Path,
                     versions: dict, token_range, stub=(STUB_A, STUB_B, STUB_C),
                     client_taskset: str | None = None, server_taskset: str | None = None) -> Run:
    """As :func:`run_point`, for ``python -m sglang.launch_server`` with :mod:`engine_stubs.sglang_stub`;
    the client is ``vllm bench serve`` from ``client_python``'s environment."""
    run = Run(p)
    tag = f"sglang_c{p.concurrency}_si{p.stream_interval}" + ("" if p.async_scheduling else "_nooverlap")
    steplog, result, env = _point_setup(python, work, tag, stub, token_range, [str(stub_site(work, SGLANG_STUB_MODULE)), str(STUB_DIR)])
    port = _free_port()
    log_path = work / f"server_{tag}.log"
    server_log = open(log_path, "w")
    server = subprocess.Popen(_pinned(_sglang_server_cmd(python, model, port, p), server_taskset), env=env,
                              stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
    ccmd = _pinned(_client_cmd(client_python, model, port, p, n, result), client_taskset)

    def ready():  # SGLang answers /health before its own warm-up request; it is ready at this log line
        return _log_has(log_path, "The server is fired up and ready to roll") and _healthy(port)

    # settle: the stub's log thread writes its rows every second
    got = _drive(run, server, server_log, ready, classify_sglang, ccmd, _engine_env(client_python), work, tag,
                 result, settle=1.5)
    if got is not None:
        cpu, window, affinity = got
        run.row = _row("sglang", versions, p, n, stub, 1, result, cpu, window, steplog, affinity,
                       ("api", "engine_core", "detokenizer", "client", "launcher", "other"))
    return run


SGLANG_WHAT_RAN = {
    "real": ["python -m sglang.launch_server, main process: FastAPI/uvicorn HTTP server with the "
             "OpenAI-compatible /v1/completions, SSE streaming, and the TokenizerManager (prompt "
             "tokenization, request state, output handling)",
             "the Scheduler process (sglang::scheduler): event loop with the overlap scheduler (SGLang's "
             "default), schedule policy, chunked prefill, radix (prefix) cache, req-to-token pool and "
             "KV-token allocator, batch result processing, stream-interval logic",
             "the DetokenizerManager process (sglang::detokenizer): incremental detokenization",
             "ZeroMQ between the three processes",
             "vllm bench serve from vLLM's environment (random dataset, openai backend, streaming "
             "completions over loopback)"],
    "stubbed": ["TpModelWorker.forward_batch_generation: no ForwardBatch, model forward or sampling; a "
                "stand-in GPU step of a + b*decode_requests + c*prefill_tokens seconds on a GPU-like "
                "timeline, returning at once with deterministic next-token ids",
                "Scheduler.process_batch_result: wrapped to first sleep until the batch's stub step has "
                "ended (what copy_done.synchronize() waits for on a GPU), then runs as shipped",
                "the model: the same tiny Llama config and locally trained BPE tokenizer as the vLLM run; "
                "--device cpu --load-format dummy; SGLang builds it and its KV pools (CPU memory, capped "
                "with --max-total-tokens) but the stub never runs them",
                "sampled token ids: a fixed pattern over ordinary vocabulary ids (never EOS; the client "
                "also passes --ignore-eos)"],
    "changed": ["sglang.srt.layers.rotary_embedding.base._is_cpu set True, so building the unused tiny "
                "model's rotary embedding does not import vLLM's CUDA kernel (vllm._custom_ops is not "
                "installed in SGLang's environment)"],
}


# --- the sweep ----------------------------------------------------------------------------------

def write_csv(rows: list[dict], path: Path, columns=CSV_COLUMNS) -> None:
    import csv
    import io

    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in columns})
    write_atomically(path, text.getvalue())


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def fit_host_costs(rows: list[dict]) -> dict:
    """Least-squares host costs (CPU seconds) from the measured points (numpy lstsq, no intercept).

    engine core:  per_step * steps + per_request_step * (sum over steps of the scheduled requests)
                  (SGLang's, ``engine_core_streamed``: + per_chunk * SSE chunks, the entries it streams)
    API servers:  per_message * steps * api_servers + per_request * requests + per_chunk * SSE chunks
    client:       per_request * requests + per_chunk * SSE chunks

    Where every request has the same output length, a cost per request, per output token and per
    request-step cannot be told apart (requests x 64 = tokens, and each request is scheduled about 64
    times); where the points' output lengths differ (``--output-len``), the API servers' fit takes a
    cost per output token too (``per_token_s``: the output handler's detokenization and output per
    token, whether or not its chunk merges it). ``engine_core_per_request`` gives the engine core's
    fit with requests instead of request-steps. ``steps * api_servers`` bounds the engine-output
    messages the API servers receive (one per step per API server with a request in that step).
    """
    rows = [{k: _num(v) for k, v in r.items()} for r in rows]
    rows = [r for r in rows if r.get("steps") and r.get("chunks")]
    if len(rows) < 3:
        return {}
    col = lambda key: np.array([r[key] for r in rows], float)  # noqa: E731
    steps, req_steps, requests, chunks = col("steps"), col("req_steps"), col("completed"), col("chunks")
    messages = steps * col("api_servers")
    extra = {}
    if all("cpu_s_detokenizer" in r for r in rows):  # SGLang: the DetokenizerManager process
        extra["detokenizer"] = _lstsq(np.c_[steps, requests, chunks], col("cpu_s_detokenizer"),
                                      ["per_step_s", "per_request_s", "per_chunk_s"], rows)
        # SGLang's scheduler builds an output entry only for a request that streams this step
        # (stream_output_generation): its CPU per step, per scheduled request and per streamed chunk
        extra["engine_core_streamed"] = _lstsq(np.c_[steps, req_steps, chunks], col("cpu_s_engine_core"),
                                               ["per_step_s", "per_request_step_s", "per_chunk_s"], rows)
    return {
        "engine_core": _lstsq(np.c_[steps, req_steps], col("cpu_s_engine_core"),
                              ["per_step_s", "per_request_step_s"], rows),
        "engine_core_per_request": _lstsq(np.c_[steps, requests], col("cpu_s_engine_core"),
                                          ["per_step_s", "per_request_s"], rows),
        "api_server": _api_fit(rows, messages, requests, chunks, col),
        "client": _lstsq(np.c_[requests, chunks], col("cpu_s_client"), ["per_request_s", "per_chunk_s"], rows),
        **extra,
    }


def _api_fit(rows, messages, requests, chunks, col) -> dict:
    """The API servers' CPU seconds per message, request and chunk, and per output token where the output
    lengths differ (else it is inside the per-request cost)."""
    names = ["per_message_s", "per_request_s", "per_chunk_s"]
    X = np.c_[messages, requests, chunks]
    if len({r["output_len"] for r in rows}) > 1:
        X, names = np.c_[X, col("output_tokens")], names + ["per_token_s"]
    return _lstsq(X, col("cpu_s_api"), names, rows)


def _num(value):
    if isinstance(value, str):
        if value in ("True", "False"):
            return value == "True"
        try:
            return float(value) if any(ch in value for ch in ".eE") else int(value)
        except ValueError:
            return value
    return value


def read_csv(path) -> list[dict]:
    import csv

    with open(path) as f:
        return [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _lstsq(X, y, names, rows) -> dict:
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    pred = X @ coef
    resid = y - pred
    return {
        "coefficients": {n: float(f"{c:.4g}") for n, c in zip(names, coef)},
        "rms_residual_s": float(f"{np.sqrt(np.mean(resid ** 2)):.4g}"),
        "rms_rel_residual": float(f"{np.sqrt(np.mean((resid / np.maximum(np.abs(y), 1e-9)) ** 2)):.3g}"),
        "max_abs_rel_residual": float(f"{np.max(np.abs(resid) / np.maximum(np.abs(y), 1e-9)):.3g}"),
        "points": [{"point": Point(r["concurrency"], r["stream_interval"], r["api_servers"],
                                   r.get("async_scheduling", True), int(r.get("output_len", OUTPUT_LEN))).label,
                    "measured_s": round(float(a), 3), "fitted_s": round(float(b), 3)}
                   for r, a, b in zip(rows, y, pred)],
    }


WHAT_RAN = {
    "real": ["vllm serve: the OpenAI-compatible API server process(es) (FastAPI/uvicorn, SSE streaming, "
             "request validation, tokenization of the prompt, the output processor and incremental "
             "detokenizer)",
             "the engine-core process (EngineCore busy loop, V1 scheduler with chunked prefill and prefix "
             "caching, KV-cache manager/block pool, request state, output serialization)",
             "ZeroMQ + msgspec IPC between API server(s) and engine core",
             "vllm bench serve (random dataset, openai backend, streaming completions over loopback)"],
    "stubbed": ["the Executor (no worker, no model runner, no model, no KV tensors): stand-in GPU whose "
                "step time is a + b*decode_requests + c*prefill_tokens, on a GPU-like timeline",
                "the model: a tiny Llama config (2 layers, hidden 64) with a BPE tokenizer trained locally "
                "on a generated corpus; --load-format dummy; no weights are loaded anywhere",
                "sampled token ids: a fixed pattern over ordinary vocabulary ids (never EOS; the client "
                "also passes --ignore-eos)"],
    "changed": ["vLLM's CPU platform forces async_scheduling off; the stub module keeps vLLM's own "
                "choice (on, as on a GPU) by wrapping CpuPlatform.check_and_update_config, unless a point "
                "says async_scheduling=False (then --no-async-scheduling and the platform as shipped)"],
}


def _sidecar_parts(engine: str) -> dict:
    """What differs between the engines' sidecars: the headline, the server's limits, what ran, the columns."""
    if engine == "sglang":
        return {"what": "host_path_sglang: the real SGLang serving stack with a stub GPU, measured on this CPU",
                "server_limits": {"max_running_requests": MAX_NUM_SEQS, "chunked_prefill_size": MAX_NUM_BATCHED_TOKENS,
                                  "context_length": MAX_MODEL_LEN, "max_total_tokens": SGLANG_MAX_TOTAL_TOKENS},
                "components": SGLANG_WHAT_RAN,
                "columns": {"cpu_s_api": "the launch_server process (HTTP server + TokenizerManager)",
                            "cpu_s_engine_core": "the Scheduler process (sglang::scheduler)",
                            "cpu_s_detokenizer": "the DetokenizerManager process (sglang::detokenizer)",
                            "cpu_s_other": "the multiprocessing resource tracker",
                            "async_scheduling": "SGLang's overlap scheduler (False: --disable-overlap-schedule)",
                            "api_servers": "always 1 (one TokenizerManager)", "preempted": "not tracked (0)"}}
    if engine in V0_ENGINES:
        from .measure_engine_v0 import sidecar_parts

        return sidecar_parts(engine, MAX_MODEL_LEN)
    return {"what": "host_path_vllm: the real vLLM serving stack with a stub GPU, measured on this CPU",
            "server_limits": {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                              "max_model_len": MAX_MODEL_LEN},
            "components": WHAT_RAN}


INTAKE_NOTE = ("--trace-intake: vLLM's intake functions logged perf_counter and CPU clocks "
               "(engine_stubs/vllm_intake_trace.py); the intake_* and schedule_cpu_ms columns are medians per call "
               "(simulator/calibrate/measure_intake.py), the chain columns at concurrency 1 only")


def write_sidecar(meta: dict, path: Path) -> None:
    parts = _sidecar_parts(meta.get("engine", "vllm"))
    doc = {"what": parts["what"],
           "measured": {k: meta[k] for k in ("date", "cpu_model", "cpus", "kernel", "versions", "quick",
                                             "wall_s", "client_taskset", "server_taskset", "affinity", "python_gc")},
           **({"intake_trace": INTAKE_NOTE} if meta.get("trace_intake") else {}),
           "stub_step": {"formula": "a + b * decode_requests + c * prefill_tokens (seconds)",
                         "a_s": STUB_A, "b_s": STUB_B, "c_s": STUB_C},
           "server_limits": parts["server_limits"],
           "commands": {"server": meta["server_cmd_example"], "client": meta["client_cmd_example"]},
           "components": parts["components"],
           "cpu_window": "utime+stime from /proc/PID/stat, from the client's "
           "'Starting main benchmark run' line to its result banner (warm-up request and start-up excluded)",
           "failures": meta["failures"], "fits": meta["fits"]}
    if "columns" in parts:
        doc["columns"] = parts["columns"]
        doc["client_versions"] = meta.get("client_versions")
    write_yaml(doc, path)


def write_yaml(doc: dict, path) -> None:
    """``doc`` as YAML at ``path``, whole or not at all (a temporary file renamed into place)."""
    import yaml

    write_atomically(path, yaml.safe_dump(doc, sort_keys=False, width=110))


V0_ENGINES = ("vllm-v0", "vllm-v0.6")  # the V0 releases, run by measure_engine_v0


def _client_side(engine: str, client_python, stream_interval, api_servers) -> tuple:
    """The client's python and versions, py-spy (the V0 releases), and the sweep's stream intervals and API
    servers as the engine has them: SGLang and the V0 releases run one API server; V0 streams every token."""
    if engine == "vllm":
        return client_python, None, None, stream_interval, api_servers
    client_python = os.path.abspath(client_python or ".venv-vllm/bin/python")
    client_versions = engine_versions(client_python, "vllm")
    if engine == "sglang":
        return client_python, client_versions, None, stream_interval, (1,)
    from .measure_engine_v0 import find_py_spy

    py_spy = find_py_spy(client_python)
    if py_spy is None:
        raise LastmileError(f"measure-engine {engine}: py-spy not found (it splits a process's CPU by kind of work); "
                            f"{client_python} -m pip install py-spy")
    return client_python, client_versions, py_spy, (1,), (1,)


def _run_point(engine: str, python: str, client_python, py_spy, model: Path, p: Point, n: int, work: Path,
               versions: dict, token_range, pin: dict) -> Run:
    if engine == "sglang":
        return run_point_sglang(python, client_python, model, p, n, work, versions, token_range, **pin)
    if engine in V0_ENGINES:
        from .measure_engine_v0 import run_point_v0

        return run_point_v0(python, client_python, model, p, n, work, versions, token_range, py_spy, **pin,
                            engine=engine)
    return run_point(python, model, p, n, work, versions, token_range, **pin)


def _say_point(say, i: int, total: int, engine: str, run: Run, seconds: float) -> None:
    p, r = run.point, run.row
    if run.error:
        say(f"measure-engine: {i}/{total} {engine} {p.label} FAILED: {run.error}")
        return
    say(f"measure-engine: {i}/{total} {engine} {p.label} ttft={r['ttft_ms_mean']:.1f}ms "
        f"tpot={r['tpot_ms_mean']:.2f}ms itl_p99={r['itl_ms_p99']:.1f}ms "
        f"{r['output_tokens_per_s']:.0f} tok/s cpu api={r['cpu_s_api']:.1f}s "
        f"core={r.get('cpu_s_engine_core', 0.0):.1f}s client={r['cpu_s_client']:.1f}s ({seconds:.0f} s)")


def _engine_parts(engine: str) -> tuple:
    """The engine's server command (python, model, port, point), CSV columns, fit and whether it has an overlap
    a point can turn off."""
    if engine in V0_ENGINES:
        from . import measure_engine_v0 as v0m

        flavor = v0m.FLAVORS[engine]
        return (lambda *a: v0m._v0_server_cmd(*a, flavor)), V0_CSV_COLUMNS, v0m.fit_v0_costs, \
            bool(flavor.no_overlap_flag)
    if engine == "sglang":
        return _sglang_server_cmd, SGLANG_CSV_COLUMNS, fit_host_costs, True
    return _server_cmd, CSV_COLUMNS, fit_host_costs, True


def measure_engine(engine: str, python: str, out: str | os.PathLike, *, concurrency=CONCURRENCY,
                   stream_interval=STREAM_INTERVAL, api_servers=API_SERVERS, quick: bool = False,
                   work_dir: str | None = None, client_taskset: str | None = None,
                   server_taskset: str | None = None, progress=None,
                   client_python: str | None = None, output_len=(OUTPUT_LEN,), python_gc: bool = True,
                   trace_intake: bool = False) -> dict:
    """Run the sweep, write the CSV at ``out`` and its sidecar (``.yaml``) next to it; the summary.
    ``python_gc=False`` turns CPython's cyclic garbage collector off in the engine's processes (the stubs do
    it at import), to measure what the collector costs.

    ``engine="sglang"`` or a V0 release (``vllm-v0``, ``vllm-v0.6``): ``python`` is the engine's environment
    and ``client_python`` vLLM's (its ``vllm bench serve`` is the client, and the V0 releases' py-spy; default
    .venv-vllm/bin/python); one API server (``api_servers`` is ignored). ``trace_intake`` (vLLM V1 only) adds each point's
    intake timings (:mod:`.measure_intake`) to its row."""
    if trace_intake and engine != "vllm":
        raise LastmileError(f"measure-engine {engine}: --trace-intake traces vLLM V1's intake (engine vllm) only")
    python = os.path.abspath(python)  # the engine's commands run from the work folder (not resolved: a venv's python is a link)
    versions = engine_versions(python, engine)
    STUB_ENV["LASTMILE_STUB_GC"] = "on" if python_gc else "off"  # every point's server environment takes it
    client_python, client_versions, py_spy, stream_interval, api_servers = _client_side(
        engine, client_python, stream_interval, api_servers)
    server_cmd, columns, fit, overlap = _engine_parts(engine)
    out = Path(out)
    if not out.parent.is_dir():
        raise LastmileError(f"{out}: folder {out.parent} does not exist")
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    if quick:
        concurrency, stream_interval, api_servers = tuple(concurrency)[:2], tuple(stream_interval)[:1], \
            tuple(api_servers)[:1]
    points = plan(concurrency, stream_interval, api_servers, sync_point=None if quick or not overlap else 64,
                  output_len=tuple(output_len))
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="lastmile-measure-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-llama"
    info = build_model(python, model, engine=engine)
    token_range = (info["first_merged_id"], info["vocab_size"])
    rows, failures = [], []
    started = time.time()
    pin = {"client_taskset": client_taskset, "server_taskset": server_taskset}
    if trace_intake:
        from .measure_intake import COLUMNS as INTAKE_COLUMNS

        pin["trace_intake"], columns = True, tuple(columns) + INTAKE_COLUMNS
    for i, p in enumerate(points, 1):
        n = num_prompts_for(p.concurrency, quick)
        say(f"measure-engine: {i}/{len(points)} {engine} {p.label} prompts={n} ...")
        t = time.time()
        run = _run_point(engine, python, client_python, py_spy, model, p, n, work, versions, token_range, pin)
        _say_point(say, i, len(points), engine, run, time.time() - t)
        if run.error:
            failures.append({"point": p.label, "error": run.error})
            continue
        rows.append(run.row)
        write_csv(rows, out, columns)
    meta = {
        "engine": engine, "versions": versions, "cpu_model": _cpu_model(), "cpus": os.cpu_count(),
        "kernel": platform.release(), "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": python, "work_dir": str(work), "wall_s": round(time.time() - started, 1),
        "client_taskset": client_taskset, "server_taskset": server_taskset,
        "affinity": rows[0]["_affinity"] if rows else {},
        "client_versions": client_versions,
        "server_cmd_example": " ".join(server_cmd(python, model, 8000, points[0])),
        "client_cmd_example": " ".join(_client_cmd(client_python or python, model, 8000, points[0],
                                                   num_prompts_for(points[0].concurrency, quick),
                                                   work / "bench.json")),
        "failures": failures, "fits": fit(rows), "quick": quick, "python_gc": "on" if python_gc else "off",
        "trace_intake": trace_intake,
    }
    write_sidecar(meta, out.with_suffix(".yaml"))
    with open(work / "meta.json", "w") as f:
        json.dump(meta, f, indent=1, default=str)
    return {"rows": rows, "meta": meta, "out": str(out)}
