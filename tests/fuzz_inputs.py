"""Generated bad inputs for lastmile, and the checks that each is rejected properly (issue 9).

Every input is a mutation of an example scenario (``scenarios/llm``, ``scenarios/dit``, the
built-in default), of a small copy of a request trace, of a profile file, of the command
line (``--set``, ``--out``), or a YAML-level attack on the scenario file. Each :class:`Case`
records the attack class, the dotted key path it mutated, what it expects and how it is fed
to the simulator. Everything is deterministic given a seed.

The checks (:func:`check_cli`, :class:`ApiWorker`) assert what issue 9's acceptance asks:
exit code 2 (the API: ``simulator.errors.LastmileError``), exactly one non-empty line
starting ``lastmile: error:``, no traceback, the mutated key (or its last component, or the
file name for file-level attacks) named in the line, at most :data:`MAX_LINE` characters,
within :data:`TIMEOUT` seconds, no run folder left behind, no pre-existing file touched.
The ``name`` class is the exception: ``name: ../../escaped`` is legal and must run, writing
its folder safely under ``runs/``.

Used by ``tests/test_fuzz.py`` (default suite) and ``benchmarks/fuzz.py`` (the big run).
Bounds taken as "no real deployment exceeds" (issue 9): > 10,000 replicas or API servers,
> 10,000,000 requests, > 100,000 DiT steps, timings above one day, > 1,000,000 CPU cores;
the huge values used below stay far beyond those bounds.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"
DEFAULT_SCENARIO = ROOT / "simulator" / "config" / "default_scenario.yaml"
PYTHON = ROOT / ".venv" / "bin" / "python"
if not PYTHON.exists():  # installed elsewhere: the interpreter running the tests
    PYTHON = Path(sys.executable)
LASTMILE_ARGV = [str(PYTHON), "-m", "simulator"] if not (PYTHON.parent / "lastmile").exists() \
    else [str(PYTHON.parent / "lastmile")]

TIMEOUT = 10.0          # seconds: issue 9's "no hang past 10 s"
MAX_LINE = 300          # characters of the one error line
MEMORY_LIMIT = 4 << 30  # address-space cap of every checked process, so a 10**9 allocation cannot take the machine

# attack classes, in report order
CLASSES = (
    "wrong_type", "numeric", "huge", "unknown_key", "catalog", "distribution",
    "yaml", "encoding", "trace", "profile", "set_syntax", "out", "name", "edges",
)
CLASS_HELP = {
    "wrong_type": "bool for ints, lists/dicts/strings where scalars go, kind: [1], hardware: 3, model: {base: [1]}",
    "numeric": "negative, zero, NaN, inf, 1e308, 10**30, fractional values of numeric keys",
    "huge": "sizes past any real deployment (replicas, api_servers, requests, steps, slices, cpu_cores, max_batch)",
    "unknown_key": "typos and unknown keys, in sections, distributions, DiT model mappings and GPU overrides",
    "catalog": "unknown catalog names and missing profile files",
    "distribution": "token-count distributions with bad fields (low>high, missing value, NaN sigma, ...)",
    "yaml": "duplicate keys, sexagesimal 1:2 (file and --set), deep nesting, billion laughs, not a mapping, syntax",
    "encoding": "scenario files that are not UTF-8: Latin-1, UTF-16, UTF-32, binary",
    "trace": "bad traces: 1e30 tokens, fractional, negative, non-monotonic, missing columns, not UTF-8",
    "profile": "bad hardware profile files: not UTF-8, no top-level mapping, bad or unknown values",
    "set_syntax": "malformed --set (no '=', empty key, empty path component, a path through a scalar)",
    "out": "--out at a file, /proc/nope, a non-empty folder of unrelated files, '.', '..' (nothing may be deleted)",
    "name": "name: ../../escaped and friends: must run and write only under runs/ (safe output, exit 0)",
    "edges": "found by others: a layout beyond a node, a 5,000-digit count, a 5,000-character trace name, expert "
             "parallelism on a dense model, DP attention alone, malformed Hugging Face configs and model shapes",
}

HUGE_INT = 10**30


# ---------------------------------------------------------------------------------------------
# cases


@dataclass
class Case:
    """One generated input and what it must produce."""

    cls: str                      # attack class (CLASSES)
    desc: str                     # short human description of the mutation
    key: str                      # dotted key path mutated (or a file name / option for file-level attacks)
    base: str                     # which example it mutates
    accept: tuple = ()            # strings any one of which must appear in the message (as a word)
    scenario: Any = None          # dict written as scenario.yaml (None: no file, the built-in default)
    text: bytes | None = None     # raw bytes of scenario.yaml instead of ``scenario``
    api_dict: bool = False        # feed the API the dict itself instead of the file
    set_cli: list = field(default_factory=list)   # --set arguments (raw text)
    overrides: dict | None = None  # the API's overrides (None: this case is CLI-only)
    files: dict = field(default_factory=dict)     # name -> bytes written beside the scenario
    out: str = "dir"              # --out: dir | none | file | proc | nonempty | dot | dotdot | under_file
    expect: str = "error"         # error | safe_output
    cli: bool = True
    api: bool = True

    @property
    def ident(self) -> str:
        h = hashlib.sha1(repr((self.cls, self.desc, self.base, self.set_cli, self.out,
                               self.api_dict)).encode()).hexdigest()[:8]
        return f"{self.cls}:{self.key}:{h}"


def _accept(key: str, *more: str) -> tuple:
    parts = [key, key.rsplit(".", 1)[-1], *more]
    return tuple(dict.fromkeys(p for p in parts if p))


# ---- bases -----------------------------------------------------------------------------------


def _small_trace(name: str, rows: int = 40) -> bytes:
    src = SHARED_TRACES / name
    if src.is_file():
        with src.open("rb") as f:
            lines = [next(f) for _ in range(rows + 1)]
        return b"".join(lines)
    # ../shared is not beside the checkout: a synthetic trace of the same shape
    rng = random.Random(rows)
    if name.endswith(".jsonl"):  # Mooncake lines: ms timestamps, ids of 512-token blocks
        lines, t = [], 0
        for k in range(rows):
            t += rng.randrange(0, 2000)
            n = rng.randint(50, 3000)
            ids = [0] + list(range(1 + 8 * k, 1 + 8 * k + (n - 1) // 512))
            lines.append(f'{{"timestamp": {t}, "input_length": {n}, "output_length": {rng.randint(5, 400)}, '
                         f'"hash_ids": {ids}}}')
        return ("\n".join(lines) + "\n").encode()
    out, t = ["arrived_at,num_prefill_tokens,num_decode_tokens"], 0.0
    for _ in range(rows):
        t += rng.expovariate(4.0)
        out.append(f"{t:.6f},{rng.randint(50, 3000)},{rng.randint(5, 400)}")
    return ("\n".join(out) + "\n").encode()


def _shrink(raw: dict) -> dict:
    """Keep a base quick to simulate, so that a wrongly accepted input costs a second, not minutes."""
    kind = raw.get("kind", "llm")
    if kind == "llm":
        wl = raw.setdefault("workload", {})
        wl["requests"] = min(int(wl.get("requests", 200)), 12)
        if "concurrency" in wl and wl["concurrency"] is not None:
            wl["concurrency"] = min(int(wl["concurrency"]), 8)
    elif kind == "dit":
        raw["workload"] = {"requests": 1, "arrival": "closed", "concurrency": 1}
        raw["steps"] = min(int(raw.get("steps", 20)), 3)
    elif kind == "token_pipeline":
        raw["sequence_tokens"] = min(int(raw.get("sequence_tokens", 8192)), 4096)
    return raw


@dataclass
class Base:
    name: str          # display name, e.g. scenarios/llm/pcie_l40s.yaml or <default>
    kind: str
    raw: dict          # shrunk scenario dict
    files: dict        # trace copies
    is_default: bool = False


def load_bases() -> list[Base]:
    """The example scenarios (LLM, DiT, token pipeline) and the built-in default, shrunk."""
    out = []
    paths = [DEFAULT_SCENARIO] + sorted((ROOT / "scenarios" / "llm").glob("*.yaml")) \
        + sorted((ROOT / "scenarios" / "dit").glob("*.yaml"))
    for p in paths:
        raw = yaml.safe_load(p.read_text())
        if not isinstance(raw, dict):
            continue
        files = {}
        wl = raw.get("workload")
        if isinstance(wl, dict) and wl.get("trace"):
            name = "trace" + Path(str(wl["trace"])).suffix  # a .jsonl trace stays JSON lines
            files[name] = _small_trace(Path(str(wl["trace"])).name)
            wl["trace"] = name
        raw = _shrink(raw)
        name = "<default>" if p == DEFAULT_SCENARIO else str(p.relative_to(ROOT))
        out.append(Base(name, raw.get("kind", "llm"), raw, files, is_default=p == DEFAULT_SCENARIO))
    return out


# ---- key specifications ------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")

# value sets: (class, value)
def _vals(*pairs):
    return list(pairs)


TYPE_SCALAR = _vals(("wrong_type", [1]), ("wrong_type", {"a": 1}))
COUNT = TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", False), ("wrong_type", "many"),
                            ("numeric", 0), ("numeric", -1), ("numeric", 2.5), ("numeric", NAN),
                            ("numeric", INF), ("numeric", -INF), ("numeric", 1e308), ("numeric", HUGE_INT))
COUNT_NO_HUGE = [v for v in COUNT if v[1] is not HUGE_INT and not (isinstance(v[1], float) and v[1] == 1e308)]
NONNEG_INT = TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "few"), ("numeric", -1), ("numeric", -7),
                                 ("numeric", 1.5), ("numeric", NAN), ("numeric", INF))
FRACTION = TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "most"), ("numeric", 0), ("numeric", -0.5),
                               ("numeric", 1.5), ("numeric", NAN), ("numeric", INF), ("numeric", 1e308))
POS_FLOAT = TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "lots"), ("numeric", 0), ("numeric", -1.0),
                                ("numeric", NAN), ("numeric", INF))
SECONDS0 = TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "soon"), ("wrong_type", "5 parsecs"),
                               ("numeric", -1), ("numeric", "-5 us"), ("numeric", NAN), ("numeric", INF),
                               ("numeric", 1e308), ("numeric", "1e308 s"), ("numeric", 1e7), ("numeric", "1000 h"))
POS_SECONDS = SECONDS0 + _vals(("numeric", 0), ("numeric", "0 ms"))
QUANTITY = TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "plenty"), ("wrong_type", "3 parsecs"),
                               ("numeric", 0), ("numeric", -1), ("numeric", NAN), ("numeric", INF))
# a cap on simulated time: a long one is legal (a week-long trace), so only the impossible values
MAX_SIM_TIME = [v for v in POS_SECONDS if not (v[1] in (1e7, "1000 h", "1e308 s") or
                                              (isinstance(v[1], float) and v[1] in (INF, 1e308)))]
BYTES = QUANTITY + _vals(("numeric", "-80 GB"))
BANDWIDTH = QUANTITY + _vals(("numeric", "-3 TB/s"))
RATE = QUANTITY + _vals(("numeric", "-4/s"), ("numeric", "0/s"))
BOOL = TYPE_SCALAR + _vals(("wrong_type", "maybe"), ("wrong_type", 2.5), ("wrong_type", 7))
TOKENS = COUNT


def LITERAL(*bad):
    return TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", 3)) + [("wrong_type", b) for b in bad]


def HUGE(*values):
    return [("huge", v) for v in values]


def SECTION():
    return _vals(("wrong_type", 3), ("wrong_type", [1]), ("wrong_type", True), ("wrong_type", 2.5))


COMMON_KEYS = {
    "seed": TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "seven"), ("numeric", -1), ("numeric", -12345),
                                ("numeric", 1.5), ("numeric", NAN), ("numeric", INF)),
    "dtype": LITERAL("fp4", "bf17", "int3"),
    "kind": LITERAL("lmm", "diffusion", "LLM "),
    "name": TYPE_SCALAR,
    "record_spans": BOOL,
    "hardware": SECTION(),
    "hardware.cpu_cores": COUNT + HUGE(10**8, 10**12),
    "hardware.gpus_per_node": COUNT,
    "hardware.cuda_graphs": BOOL,
    "hardware.gpu.memory": BYTES,
    "hardware.gpu.hbm_bandwidth": BANDWIDTH,
    "hardware.gpu.sm_count": COUNT,
    "hardware.gpu.kernel_overhead": SECONDS0,
    "hardware.gpu.kernel_floor": SECONDS0,
    "hardware.gpu.gemm_mainloop": LITERAL("hopper", "warp-specialized", "pipelined"),
    "hardware.gpu.launch_overhead": SECONDS0,
    "hardware.gpu.achievable.matmul": FRACTION,
    "hardware.gpu.achievable.hbm": FRACTION,
    "hardware.gpu.peak_flops.bf16": QUANTITY,
    "hardware.client_link.latency": SECONDS0,
    "hardware.client_link.bandwidth": BANDWIDTH,
    "hardware.client_link.achievable": FRACTION,
    "hardware.host_link.latency": SECONDS0,
    "hardware.host_link.bandwidth": BANDWIDTH,
    "hardware.cpu.detokenize_per_token": SECONDS0,
    "hardware.cpu.stream_per_chunk": SECONDS0,
    "hardware.cpu.tokenize_per_token": SECONDS0,
    "hardware.cpu.stream_entry_per_request": SECONDS0,
}

LLM_KEYS = {
    "model": _vals(("wrong_type", 3), ("wrong_type", [1]), ("wrong_type", {"base": [1]}), ("wrong_type", True),
                   ("wrong_type", {"base": {"a": 1}})),
    "model.layers": COUNT_NO_HUGE,
    "model.heads": COUNT_NO_HUGE + _vals(("numeric", 7)),
    "model.hidden": COUNT_NO_HUGE,
    "model.kv_heads": COUNT_NO_HUGE,
    "model.vocab": COUNT_NO_HUGE,
    "model.top_k": COUNT_NO_HUGE,
    "parallel": SECTION(),
    "parallel.tp": COUNT + _vals(("numeric", 3)) + HUGE(10**6),
    "parallel.pp": COUNT + HUGE(10**6),
    "parallel.replicas": COUNT + HUGE(10**6, 10**7, 10**9),
    "parallel.allreduce": LITERAL("custom", "ring", "VLLM"),
    "parallel.expert_parallel": BOOL,
    "parallel.dp_attention": BOOL,
    "parallel.eplb": BOOL,
    "parallel.expert_skew": [v for v in POS_FLOAT if v[0] != "numeric" or v[1] != 0],
    "parallel.redundant_experts": NONNEG_INT,
    "serving": SECTION(),
    "serving.max_batch": COUNT + HUGE(10**12, 10**15),
    "serving.max_batched_tokens": COUNT,
    "serving.chunked_prefill": BOOL,
    "serving.overlap": LITERAL("asynch", "both", "SYNC"),
    "serving.decode_attention": LITERAL("flash", "PAGED", "static"),
    "serving.detokenizer": LITERAL("gpu", "client"),
    "serving.router": LITERAL("random", "least"),
    "serving.api_servers": COUNT + HUGE(10**6, 10**7, 10**9),
    "serving.stream_interval": COUNT,
    "serving.block_size": COUNT,
    "serving.gpu_memory_utilization": FRACTION,
    "serving.chunk_bytes_per_token": QUANTITY,
    "serving.response_header_bytes": [v for v in QUANTITY if v[1] != 0],
    "workload": SECTION(),
    "workload.requests": COUNT + HUGE(10**9, 10**12),
    "workload.arrival": LITERAL("posson", "burst", "closed-loop"),
    "workload.rate": RATE,
    "workload.burstiness": POS_FLOAT,
    "workload.concurrency": COUNT + HUGE(10**9, 10**12),
    "workload.trace_time_scale": POS_FLOAT,
    "workload.client_cpu": SECTION(),
    "workload.client_cpu.per_request": SECONDS0,
    "workload.client_cpu.per_chunk": SECONDS0,
    "workload.prompt_tokens": TOKENS + HUGE(10**12),
    "workload.output_tokens": TOKENS + HUGE(10**12),
    "slo": SECTION(),
    "slo.ttft": POS_SECONDS,
    "slo.tpot": POS_SECONDS,
    "slo.e2el": POS_SECONDS,
    "max_sim_time": MAX_SIM_TIME,
}

DIT_KEYS = {
    "model": _vals(("wrong_type", 3), ("wrong_type", [1]), ("wrong_type", {"base": [1]}), ("wrong_type", True)),
    "model.blocks": COUNT_NO_HUGE,
    "model.heads": COUNT_NO_HUGE + _vals(("numeric", 7)),
    "model.hidden": COUNT_NO_HUGE,
    "model.patch_size": COUNT_NO_HUGE,
    "model.text_mode": LITERAL("diagonal"),
    "resolution": TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "1024x"), ("wrong_type", "bigxbig"),
                                      ("numeric", 0), ("numeric", -1024), ("numeric", NAN), ("numeric", 1000.5))
    + HUGE(10**9, "1000000000x1000000000"),
    "steps": COUNT + HUGE(10**7, 10**9),
    "cfg": BOOL,
    "text_encode": BOOL,
    "gpus": COUNT_NO_HUGE,
    "parallel": SECTION(),
    "parallel.cfg": TYPE_SCALAR + _vals(("wrong_type", True), ("wrong_type", "two"), ("numeric", 0), ("numeric", 3),
                                        ("numeric", -1), ("numeric", NAN)),
    "parallel.pipefusion": COUNT + HUGE(10**6),
    "parallel.ulysses": COUNT + HUGE(10**6),
    "parallel.ring": COUNT + HUGE(10**6),
    "parallel.tensor": COUNT + HUGE(10**6),
    "parallel.distrifusion": COUNT,
    "parallel.patches": COUNT + HUGE(10**9),
    "parallel.warmup_steps": NONNEG_INT + HUGE(10**9),
    "parallel.vae_parallel": BOOL,
    "parallel.tensor_cross_attention": LITERAL("halved"),
    "delivery": SECTION(),
    "delivery.vae": BOOL,
    "delivery.base64": BOOL,
    "delivery.format": LITERAL("gif", "PNG!"),
    "delivery.compress_level": TYPE_SCALAR + _vals(("wrong_type", True), ("numeric", 10), ("numeric", -1),
                                                   ("numeric", 1.5), ("numeric", NAN)),
    "delivery.response_header_bytes": _vals(("numeric", -1), ("numeric", NAN), ("numeric", INF),
                                            ("wrong_type", True), ("wrong_type", [1])),
    "delivery.ipc_hops": NONNEG_INT + _vals(("numeric", 9)),
    "delivery.video_codec": LITERAL("av1", "H264"),
    "delivery.preset": _vals(("wrong_type", 3), ("wrong_type", "medum"), ("wrong_type", [1])),
    "kernels.attention_efficiency": FRACTION,
    "kernels.head_dim_multiple": COUNT,
    "kernels.attention": LITERAL("flash4", "sdpa"),
    "frames": COUNT + HUGE(10**6, 10**9) + _vals(("numeric", 80)),
    "serving": SECTION(),
    "serving.policy": LITERAL("lifo", "FIFO"),
    "serving.max_batch": COUNT + HUGE(10**6),
    "serving.preempt": BOOL,
    "slo": SECTION(),
    "slo.latency": POS_FLOAT,
    "workload.shapes": _vals(("wrong_type", 3), ("wrong_type", [1]), ("wrong_type", [{"resolution": 500}]),
                             ("wrong_type", []), ("wrong_type", [{"resolution": 512, "weight": -1}])),
    "workload.requests": COUNT + HUGE(10**8, 10**9),
    "workload.concurrency": COUNT + HUGE(10**8, 10**9),
    "max_sim_time": MAX_SIM_TIME,
}

TOKEN_PIPELINE_KEYS = {
    "model": _vals(("wrong_type", 3), ("wrong_type", [1]), ("wrong_type", {"base": [1]})),
    "sequence_tokens": COUNT + HUGE(10**12),
    "slices": COUNT + HUGE(10**6, 10**9),
    "parallel": SECTION(),
    "parallel.pp": COUNT + HUGE(10**6),
    "slicing": LITERAL("random"),
}

KEYS_BY_KIND = {"llm": {**COMMON_KEYS, **LLM_KEYS}, "dit": {**COMMON_KEYS, **DIT_KEYS},
                "token_pipeline": {**COMMON_KEYS, **TOKEN_PIPELINE_KEYS}}

# keys that take catalog names, and names that are not in the catalog
CATALOG = {
    "llm": {"model": ["llama-9-8b", "gpt-5", "llama3-8b-typo"]},
    "dit": {"model": ["pixart-omega", "sd9-ultra"]},
    "token_pipeline": {"model": ["llama-9-8b", "pixart-omega"]},
    "*": {"hardware.gpu": ["h1000", "rtx-9090", "h100-sxn"], "hardware.gpu_link": ["nvlink9"],
          "hardware.host_link": ["pcie9-x16"], "hardware.client_link": ["wifi7"],
          "hardware.node_link": ["ib-9000g"], "hardware.cpu": ["threadripper-9", "referense"]},
}

# sections where a typo'd or invented key may be placed, by kind
TYPO_SECTIONS = {
    "llm": ["", "serving", "parallel", "workload", "slo", "hardware", "hardware.gpu", "hardware.client_link",
            "model", "hardware.gpu.achievable"],
    "dit": ["", "parallel", "delivery", "kernels", "workload", "hardware", "hardware.gpu", "model"],
    "token_pipeline": ["", "parallel", "hardware", "model"],
}
INVENTED = ["colour", "foo_bar", "verbose_mode", "num_layers", "turbo"]


def known_key_names() -> set:
    names = set()
    for table in KEYS_BY_KIND.values():
        for k in table:
            names.update(k.split("."))
    names.update({"base", "name", "kind", "sources", "measured", "description", "dist", "value", "low", "high",
                  "median", "sigma", "max", "trace", "tp", "pp", "cfg", "gpus", "gpu", "cpu", "node_link",
                  "gpu_link", "host_link", "client_link", "fp8", "fp16", "fp32", "matmul_fp8", "allreduce_busbw",
                  "tensor", "ring", "text_encoders", "vae", "head_dim", "ffn", "experts", "tokenizer",
                  "mlp_ratio", "latent_channels", "out_channels", "vae_downsample", "text_tokens",
                  "caption_channels", "context_embedder", "modulation", "params", "blocks", "single_blocks",
                  "ffn", "rate", "layers", "vocab", "heads", "hidden", "top_k", "kv_heads", "num_layers_x"})
    names.discard("num_layers_x")
    return names


def _typo(word: str, rng: random.Random, known: set) -> str:
    for _ in range(20):
        how = rng.randrange(3)
        if how == 0 and len(word) >= 4:
            i = rng.randrange(1, len(word) - 1)
            cand = word[:i] + word[i + 1:]
        elif how == 1 and len(word) >= 3:
            i = rng.randrange(len(word) - 1)
            cand = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        else:
            cand = word + rng.choice("xsz")
        if cand not in known and cand != word:
            return cand
    return word + "_typo"


# ---- helpers on nested dicts ----------------------------------------------------------------------


def set_path(raw: dict, dotted: str, value: Any) -> None:
    """``a.b.c = value``; a catalog name on the way becomes ``{base: name}`` (as ``--set`` does)."""
    keys = dotted.split(".")
    node = raw
    for k in keys[:-1]:
        nxt = node.get(k)
        if isinstance(nxt, str):
            nxt = {"base": nxt}
        elif not isinstance(nxt, dict):
            nxt = {}
        node[k] = nxt
        node = nxt
    node[keys[-1]] = value


def get_path(raw: dict, dotted: str, default=None):
    node = raw
    for k in dotted.split("."):
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return node


def flow(value: Any) -> str:
    """A value as ``--set`` text that reads back as the same YAML value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    if text.endswith("\n..."):
        text = text[:-4].strip()
    if text.endswith("..."):
        text = text[:-3].strip()
    return text


def dump(raw: dict) -> bytes:
    return yaml.safe_dump(raw, default_flow_style=False, sort_keys=False, width=10**9).encode()


# ---- the generator -------------------------------------------------------------------------------------


class Generator:
    """Builds cases of each class from the bases; ``rng`` picks bases, values and delivery."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.bases = load_bases()
        self.by_kind: dict[str, list[Base]] = {}
        for b in self.bases:
            self.by_kind.setdefault(b.kind, []).append(b)
        self.known = known_key_names()

    # -- plumbing
    def base(self, kind: str | None = None, *, trace: bool = False, default_ok: bool = True) -> Base:
        pool = self.bases if kind is None else self.by_kind[kind]
        if trace:
            pool = [b for b in pool if b.files.get("trace.csv")]
        if not default_ok:
            pool = [b for b in pool if not b.is_default]
        return self.rng.choice(pool)

    def scenario_case(self, cls: str, key: str, value: Any, base: Base, desc: str, *,
                      accept: tuple | None = None, mode: str | None = None, delete: bool = False) -> Case:
        """Mutate ``key`` of ``base`` to ``value``, delivered in a file, a dict or with --set."""
        modes = ["file", "dict", "set"] if not delete else ["file", "dict"]
        mode = mode or self.rng.choice(modes)
        raw = copy.deepcopy(base.raw)
        files = dict(base.files)
        case = Case(cls=cls, desc=desc, key=key, base=base.name, accept=accept or _accept(key), files=files,
                    out=self.rng.choice(["dir", "dir", "none"]))
        if mode == "set":
            case.overrides = {key: value}
            case.set_cli = [f"{key}={flow(value)}"]
            if base.is_default:
                case.scenario = None  # the built-in default, shrunk with an extra --set
                if key not in ("workload", "workload.requests"):
                    case.set_cli.append("workload.requests=12")
                    case.overrides["workload.requests"] = 12
            else:
                case.scenario = raw
        else:
            set_path(raw, key, value)
            case.scenario = raw
            case.api_dict = mode == "dict"
        case.desc = f"{desc} [{mode}]"
        return case

    # -- classes
    def keyed(self, cls: str) -> Case:
        """wrong_type / numeric / huge: a value of that class at a key of the schema."""
        while True:
            kind = self.rng.choice(["llm", "llm", "dit", "token_pipeline"])
            table = KEYS_BY_KIND[kind]
            key = self.rng.choice(list(table))
            choices = [v for c, v in table[key] if c == cls]
            if choices:
                break
        value = self.rng.choice(choices)
        return self.scenario_case(cls, key, value, self.base(kind), f"{key}: {value!r}")

    def unknown_key(self) -> Case:
        kind = self.rng.choice(["llm", "llm", "dit", "token_pipeline"])
        base = self.base(kind)
        section = self.rng.choice(TYPO_SECTIONS[kind])
        node = get_path(base.raw, section) if section else base.raw
        if isinstance(node, dict) and node and self.rng.random() < 0.7:
            word = _typo(self.rng.choice([k for k in node if k != "base"] or ["value"]), self.rng, self.known)
        elif section in ("model", "hardware.gpu") and self.rng.random() < 0.7:
            word = _typo(self.rng.choice(["layers", "heads", "memory", "hidden", "blocks"]), self.rng, self.known)
        else:
            word = self.rng.choice(INVENTED)
            if word in self.known:
                word = word + "_x"
        key = f"{section}.{word}" if section else word
        value = self.rng.choice([1, 0, "x", 4.5])
        return self.scenario_case("unknown_key", key, value, base, f"unknown key {key}: {value!r}",
                                  accept=(key, word))

    def catalog(self) -> Case:
        kind = self.rng.choice(["llm", "llm", "dit", "token_pipeline"])
        base = self.base(kind)
        table = {**CATALOG["*"], **CATALOG[kind]}
        key = self.rng.choice(list(table))
        if self.rng.random() < 0.2 and key.startswith("hardware.g"):
            name = "no_such_profile.yaml"
        else:
            name = self.rng.choice(table[key])
        return self.scenario_case("catalog", key, name, base, f"{key}: {name}", accept=_accept(key, name))

    def distribution(self) -> Case:
        base = self.base(self.rng.choice(["llm", "llm", "dit"]))
        which = self.rng.choice(["workload.prompt_tokens", "workload.output_tokens"])
        bad = [
            ({"dist": "uniform", "low": 300, "high": 100}, "low", "low > high"),
            ({"dist": "uniform", "low": 0, "high": 100}, "low", "low 0"),
            ({"dist": "uniform", "low": 10, "high": HUGE_INT}, "high", "high 10**30"),
            ({"dist": "uniform", "low": 10}, "high", "uniform without high"),
            ({"dist": "fixed"}, "value", "fixed without value"),
            ({"dist": "fixed", "value": 0}, "value", "value 0"),
            ({"dist": "fixed", "value": -5}, "value", "value -5"),
            ({"dist": "fixed", "value": 12.5}, "value", "fractional value"),
            ({"dist": "fixed", "value": True}, "value", "value true"),
            ({"dist": "fixed", "value": HUGE_INT}, "value", "value 10**30"),
            ({"dist": "uniform", "low": 1, "high": 5, "mean": 3}, "mean", "unknown key mean"),
            ({"dist": "lognormal", "median": 100, "sigma": 0.5, "meadian": 3}, "meadian", "typo meadian"),
            ({"dist": "lognormal", "median": 100, "sigma": NAN, "max": 1000}, "sigma", "NaN sigma"),
            ({"dist": "lognormal", "median": 100, "sigma": -0.5, "max": 1000}, "sigma", "negative sigma"),
            ({"dist": "lognormal", "median": 100, "sigma": INF, "max": 1000}, "sigma", "inf sigma"),
            ({"dist": "lognormal", "median": 1e308, "sigma": 0.5}, "median", "median 1e308 without max"),
            ({"dist": "lognormal", "median": INF, "sigma": 0.5}, "median", "median inf without max"),
            ({"dist": "lognormal", "median": NAN, "sigma": 0.5, "max": 100}, "median", "median NaN"),
            ({"dist": "lognormal", "median": 100, "sigma": 200}, "sigma", "sigma 200 without max"),
            ({"dist": "lognormal", "median": 100, "sigma": 1e308}, "sigma", "sigma 1e308 without max"),
            ({"dist": "lognormal", "median": 100}, "sigma", "lognormal without sigma"),
            ({"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 0}, "max", "max 0"),
            ({"dist": "lognormal", "median": 100, "sigma": 0.5, "max": -3}, "max", "max -3"),
            ({"dist": "normal", "value": 5}, "dist", "unknown dist normal"),
            ({"dist": ["uniform"], "low": 1, "high": 2}, "dist", "dist a list"),
            ({"dist": "fixed", "value": [5]}, "value", "value a list"),
        ]
        value, inner, what = self.rng.choice(bad)
        case = self.scenario_case("distribution", which, value, base, f"{which}: {what}",
                                  accept=(f"{which}.{inner}", inner))
        case.key = f"{which}.{inner}"
        return case

    def yaml_attack(self) -> Case:
        base = self.base(default_ok=True)
        raw = copy.deepcopy(base.raw)
        attack = self.rng.choice(["dup_top", "dup_nested", "sexa_file", "sexa_set", "deep_list", "deep_map",
                                  "deep_block", "laughs", "not_mapping", "syntax", "recursive_alias"])
        case = Case(cls="yaml", desc=attack, key="scenario.yaml", base=base.name, files=dict(base.files),
                    accept=("scenario.yaml",), out=self.rng.choice(["dir", "none"]))
        text = dump(raw)
        if attack == "dup_top":
            key = self.rng.choice([k for k, v in raw.items() if not isinstance(v, dict)])
            text += f"{key}: {flow(raw[key])}\n".encode()
            case.key, case.accept, case.desc = key, (key, "scenario.yaml"), f"duplicate top-level key {key!r}"
        elif attack == "dup_nested":
            sections = [k for k, v in raw.items() if isinstance(v, dict) and v]
            sec = self.rng.choice(sections)
            inner = self.rng.choice(list(raw[sec]))
            rest = {k: v for k, v in raw.items() if k != sec}
            body = yaml.safe_dump(raw[sec], default_flow_style=False, sort_keys=False, width=10**9)
            body = "".join(f"  {line}\n" for line in body.splitlines())
            text = dump(rest) + f"{sec}:\n{body}  {inner}: {flow(raw[sec][inner])}\n".encode()
            case.key = f"{sec}.{inner}"
            case.accept = (case.key, inner, "scenario.yaml")
            case.desc = f"duplicate key {case.key!r}"
        elif attack in ("sexa_file", "sexa_set"):
            key, txt = {"llm": [("serving.max_batch", "1:2"), ("workload.requests", "1:30"), ("seed", "1:0"),
                                ("parallel.replicas", "1:1")],
                        "dit": [("steps", "1:0"), ("workload.requests", "1:2"), ("seed", "2:0")],
                        "token_pipeline": [("slices", "1:2"), ("seed", "1:0"), ("sequence_tokens", "1:0:0")],
                        }[base.kind][self.rng.randrange(3)]
            case.key, case.accept = key, _accept(key)
            if attack == "sexa_file":
                placeholder = "__SEXAGESIMAL__"
                set_path(raw, key, placeholder)
                text = dump(raw).replace(placeholder.encode(), txt.encode())
                case.desc = f"sexagesimal {key}: {txt} in the file"
            else:
                case.set_cli = [f"{key}={txt}"]
                case.overrides = {key: txt}
                case.desc = f"sexagesimal --set {key}={txt}"
                if base.is_default:
                    case.scenario, text = None, None
                    if not key.startswith("workload"):
                        case.set_cli.append("workload.requests=12")
                        case.overrides["workload.requests"] = 12
        elif attack in ("deep_list", "deep_map", "deep_block"):
            depth = self.rng.choice([1000, 10_000, 100_000] if attack != "deep_block" else [1000, 3000])
            key = self.rng.choice(["description", "serving" if base.kind == "llm" else "parallel", "nested"])
            if attack == "deep_list":
                value = "[" * depth + "1" + "]" * depth
            elif attack == "deep_map":
                value = "{a: " * depth + "1" + "}" * depth
            else:
                value = "\n" + "".join("  " * (i + 1) + "a:\n" for i in range(depth - 1)) + "  " * depth + "a: 1"
            rest = {k: v for k, v in raw.items() if k != key}
            text = dump(rest) + f"{key}: {value}\n".encode()
            case.key, case.accept = key, (key, "scenario.yaml")
            case.desc = f"{key}: nested {depth} levels ({attack})"
        elif attack == "laughs":
            levels = self.rng.choice([7, 8, 9])
            lines = ['l0: &l0 "lol"']
            for i in range(1, levels + 1):
                lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
            spot = self.rng.choice(["hardware.gpu.measured", "hardware.cpu.measured", "description",
                                    "model.sources" if base.kind != "dit" else "model.extra", "laughs"])
            placeholder = "__LAUGHS__"
            set_path(raw, spot, {"x": placeholder} if spot.endswith("measured") else placeholder)
            body = dump(raw).decode().replace(f"'{placeholder}'", f"*l{levels}").replace(placeholder, f"*l{levels}")
            # the anchors must come first: put them under a key of their own, as a document prefix
            text = ("anchors_for_laughs:\n" + "".join(f"  {ln}\n" for ln in lines) + body).encode()
            case.key, case.accept = spot, (spot, spot.rsplit(".", 1)[-1], "scenario.yaml", "anchors_for_laughs")
            case.desc = f"billion laughs: 10**{levels} nodes at {spot}"
        elif attack == "not_mapping":
            text = self.rng.choice([b"[1, 2, 3]\n", b"42\n", b"just a string\n", b"- kind: llm\n- seed: 1\n"])
            case.desc = f"not a mapping: {text!r}"
        elif attack == "syntax":
            text = self.rng.choice([
                text + b"serving: {max_batch: 4\n",
                text.replace(b"\n", b"\n\t", 1) if b"\n" in text else b"\tkind: llm\n",
                b"kind: llm\nseed: [1, 2\nname: x\n",
                text + b"key: 'unterminated\n",
                text + b": no key\n  : bad\n",
            ])
            case.desc = "YAML syntax error"
        elif attack == "recursive_alias":
            spot = self.rng.choice(["description", "hardware.gpu.measured", "name"])
            placeholder = "__REC__"
            set_path(raw, spot, placeholder)
            body = dump(raw).decode().replace(placeholder, "*rec")
            text = ("rec_anchor: &rec\n  - 1\n  - *rec\n" + body).encode()
            case.key, case.accept = spot, (spot, spot.rsplit(".", 1)[-1], "scenario.yaml", "rec_anchor")
            case.desc = f"recursive alias at {spot}"
        if case.scenario is None and text is not None and not (attack == "sexa_set" and base.is_default):
            case.text = text
        elif attack == "sexa_set" and not base.is_default:
            case.scenario = raw
        return case

    def encoding(self) -> Case:
        base = self.base(default_ok=True)
        raw = copy.deepcopy(base.raw)
        raw["description"] = "Café crème, naïve façade — über"
        text = yaml.safe_dump(raw, allow_unicode=True, sort_keys=False)
        how = self.rng.choice(["latin-1", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "binary", "tail",
                               "cp1252"])
        if how in ("latin-1", "cp1252"):
            data = text.replace("—", "-").encode(how)
        elif how == "binary":
            n = self.rng.choice([64, 512, 4096])
            data = bytes(self.rng.randrange(256) for _ in range(n))
            if data[:3] == b"\xef\xbb\xbf":
                data = b"\xff" + data
            try:  # random bytes that happen to decode as UTF-8 are not an encoding attack
                data.decode("utf-8")
                data = b"\xff\xfe\x00" + data
            except UnicodeDecodeError:
                pass
        elif how == "tail":
            data = dump(raw) + b"notes: \xff\xfe\xfa\n"
        else:
            data = text.encode(how)
        return Case(cls="encoding", desc=f"scenario encoded as {how}", key="scenario.yaml", base=base.name,
                    accept=("scenario.yaml",), text=data, files=dict(base.files),
                    out=self.rng.choice(["dir", "none"]))

    def trace(self) -> Case:
        base = self.base("llm", trace=True) if any(b.files.get("trace.csv") for b in self.bases) else None
        if base is None:  # no trace base: turn the default into one
            b0 = self.base("llm")
            raw = copy.deepcopy(b0.raw)
            raw["workload"].update({"arrival": "trace", "trace": "trace.csv"})
            base = Base(b0.name + "+trace", "llm", raw, {"trace.csv": _small_trace("splitwise_conv.csv")})
        raw = copy.deepcopy(base.raw)
        lines = base.files["trace.csv"].decode().splitlines()
        header, rows = lines[0], [r.split(",") for r in lines[1:]]
        # a row among the first ten: the run reads only as many rows as it has requests (12)
        i = self.rng.randrange(1, min(len(rows), 10))
        how = self.rng.choice(["tokens_1e30", "tokens_1e12", "fractional", "negative_tokens", "zero_decode",
                               "negative_time", "non_monotonic", "missing_column", "renamed_column", "nan",
                               "inf", "text", "latin1", "utf16", "binary", "empty", "header_only",
                               "time_1e30", "missing_file"])
        cols = {"tokens_1e30": (1, "1e30"), "tokens_1e12": (2, "1000000000000"), "fractional": (1, "120.5"),
                "negative_tokens": (1, "-40"), "zero_decode": (2, "0"), "negative_time": (0, "-3.5"),
                "nan": (2, "nan"), "inf": (1, "inf"), "text": (1, "lots"), "time_1e30": (0, "1e30")}
        data = None
        if how in cols:
            c, v = cols[how]
            if how == "time_1e30":  # from row i on, so the times stay non-decreasing: only the value is wrong
                for r in rows[i:]:
                    r[c] = v
            rows[i][c] = v
        elif how == "non_monotonic":
            rows[i][0], rows[i - 1][0] = rows[i - 1][0], str(float(rows[i][0]) + 5.0)
        elif how == "missing_column":
            drop = self.rng.randrange(3)
            header = ",".join(h for j, h in enumerate(header.split(",")) if j != drop)
            rows = [[x for j, x in enumerate(r) if j != drop] for r in rows]
        elif how == "renamed_column":
            header = header.replace("num_decode_tokens", "num_decode_tokns")
        if data is None:
            data = ("\n".join([header] + [",".join(r) for r in rows]) + "\n").encode()
        if how == "latin1":
            data = data.replace(b"num_decode_tokens", "num_décode_tokens".encode("latin-1"), 1) + \
                "0.5,12é,10\n".encode("latin-1")
        elif how == "utf16":
            data = data.decode().encode("utf-16")
        elif how == "binary":
            data = bytes(self.rng.randrange(128, 256) for _ in range(300))
        elif how == "empty":
            data = b""
        elif how == "header_only":
            data = (header + "\n").encode()
        files = {k: v for k, v in base.files.items() if k != "trace.csv"}
        if how != "missing_file":
            files["trace.csv"] = data
        else:
            raw["workload"]["trace"] = "no_such_trace.csv"
        raw["workload"]["requests"] = min(int(raw["workload"].get("requests", 12)), 12)
        case = Case(cls="trace", desc=f"trace: {how}", key="workload.trace", base=base.name,
                    accept=("workload.trace", "trace.csv", "no_such_trace.csv"), scenario=raw, files=files,
                    api_dict=self.rng.random() < 0.5, out=self.rng.choice(["dir", "none"]))
        return case

    def profile(self) -> Case:
        base = self.base()
        raw = copy.deepcopy(base.raw)
        which = self.rng.choice(["gpu", "cpu"])
        key = f"hardware.{which}"
        good = {"gpu": {"base": "h100-sxm", "memory": "80 GB"}, "cpu": {"detokenize_per_token": "20 us"}}[which]
        how = self.rng.choice(["latin1", "utf16", "binary", "no_top", "not_mapping", "bad_value", "unknown_key",
                               "syntax", "wrong_type"])
        inner = None
        if how == "latin1":
            data = (f"# profil mesuré à Paris\n{which}:\n" + "".join(f"  {k}: {v}\n" for k, v in good.items())
                    ).encode("latin-1")
        elif how == "utf16":
            data = yaml.safe_dump({which: good}).encode("utf-16")
        elif how == "binary":
            data = bytes(self.rng.randrange(128, 256) for _ in range(256))
        elif how == "no_top":
            data = yaml.safe_dump({"other": good}).encode()
        elif how == "not_mapping":
            data = b"[1, 2, 3]\n"
        elif how == "syntax":
            data = f"{which}: {{memory: 80 GB\n".encode()
        else:
            prof = dict(good)
            if how == "bad_value":
                inner = "memory" if which == "gpu" else "detokenize_per_token"
                prof[inner] = self.rng.choice(["-80 GB", 0, "lots"]) if which == "gpu" else \
                    self.rng.choice(["-5 us", "soon", "1000 h"])
            elif how == "unknown_key":
                inner = "memroy" if which == "gpu" else "detokenise_per_tokn"
                prof[inner] = 1
            else:
                inner = "memory" if which == "gpu" else "stream_per_chunk"
                prof[inner] = [1, 2]
            data = yaml.safe_dump({which: prof}).encode()
        set_path(raw, key, "prof.yaml")
        accept = (key, "prof.yaml") + ((inner, f"{key}.{inner}") if inner else ())
        return Case(cls="profile", desc=f"{which} profile: {how}", key=f"{key}.{inner}" if inner else key,
                    base=base.name, accept=accept, scenario=raw, files={**base.files, "prof.yaml": data},
                    api_dict=self.rng.random() < 0.5, out=self.rng.choice(["dir", "none"]))

    def set_syntax(self) -> Case:
        base = self.base()
        variants = [
            (["serving.max_batch"], None, "--set", "no '='"),
            (["=5"], None, "--set", "empty key"),
            ([" =5"], None, "--set", "blank key"),
            (["serving..max_batch=4"], {"serving..max_batch": 4}, "serving..max_batch", "empty path component"),
            ([".seed=4"], {".seed": 4}, ".seed", "leading dot"),
            (["seed.=4"], {"seed.": 4}, "seed.", "trailing dot"),
            (["seed.value=4"], {"seed.value": 4}, "seed", "path through a scalar"),
            (["dtype.x.y=1"], {"dtype.x.y": 1}, "dtype", "path through a scalar"),
            (["seed=[1"], {"seed": "[1"}, "seed", "unparsable value"),
            (["seed=!!python/object/apply:os.system [echo]"], {"seed": "!!python/object/apply:os.system [echo]"},
             "seed", "python tag"),
            (["seed="], {"seed": ""}, "seed", "empty value"),
            (["seed=4=5"], {"seed": "4=5"}, "seed", "two '='"),
        ]
        args, api, key, what = self.rng.choice(variants)
        raw = copy.deepcopy(base.raw)
        if base.kind == "llm" and "serving" not in raw:
            raw["serving"] = {"max_batch": 64}
        if key == "serving..max_batch" and base.kind != "llm":
            args, api, key = ["parallel..pp=4"], {"parallel..pp": 4}, "parallel..pp"
        accept = (key, args[0].split("=")[0].strip() or "--set", "--set")
        accept = tuple(dict.fromkeys(a for a in accept if a))
        return Case(cls="set_syntax", desc=f"--set {args[0]!r} ({what})", key=key, base=base.name, accept=accept,
                    scenario=None if base.is_default else raw, files=dict(base.files), set_cli=list(args),
                    overrides=api, api=api is not None, out=self.rng.choice(["dir", "none"]))

    def out_attack(self) -> Case:
        base = self.base("llm")
        how = self.rng.choice(["file", "proc", "nonempty", "dot", "dotdot", "under_file"])
        return Case(cls="out", desc=f"--out {how}", key="--out", base=base.name,
                    accept=("--out",), scenario=None if base.is_default else copy.deepcopy(base.raw),
                    files=dict(base.files), out=how, api=False,
                    set_cli=["workload.requests=12"] if base.is_default else [])

    def name_attack(self) -> Case:
        base = self.base(default_ok=False)
        raw = copy.deepcopy(base.raw)
        name = self.rng.choice(["../../escaped", "../escaped", "../../../escaped", "__ABS__/abs-escaped",
                                "a/b/../../../escaped", "..", "sub/dir/name", "./../escaped"])
        raw["name"] = name
        return Case(cls="name", desc=f"name: {name!r}", key="name", base=base.name, accept=("name",),
                    scenario=raw, files=dict(base.files), out="none", api=False, expect="safe_output")

    def edge(self) -> Case:
        """One of the edges other fuzzers found, or of the model shapes and configs: a one-line error each."""
        hf = {"model_type": "deepseek_v3", "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 4,
              "intermediate_size": 2048, "vocab_size": 1000, "max_position_embeddings": 4096}
        edges = [
            ("disaggregation", {"prefill": {"replicas": 8}, "decode": {"replicas": 1}},
             ("node_link", "parallel.tp", "disaggregation"), None),
            ("workload.trace", "t" * 5000 + ".csv", ("workload.trace", "trace"), None),
            ("parallel.expert_parallel", True, ("expert_parallel",), None),
            ("parallel.dp_attention", True, ("dp_attention",), None),
            ("model", {"base": "gpt-oss-20b", "sliding_layers": 24}, ("sliding_layers", "model"), None),
            ("model", {"base": "gpt-oss-20b", "weights": {"format": "fp3"}}, ("format", "weights", "model"), None),
            ("model", {"base": "llama-3-8b", "mla": {"kv_lora_rank": 512}}, ("mla", "model"), None),
            ("model", "config.json", ("qk_rope_head_dim",), {**hf, "kv_lora_rank": 64}),
            ("model", "config.json", ("sliding_window",), {**hf, "model_type": "mistral", "sliding_window": 1024}),
            ("model", "config.json", ("quantization_config",),
             {**hf, "model_type": "llama", "quantization_config": {"quant_method": "bitsandbytes"}}),
        ]
        if self.rng.random() < 1 / (len(edges) + 1):  # a 5,000-digit count on the command line
            digits = "9" * 5000
            base = self.base("llm", default_ok=False)
            return Case(cls="edges", desc="workload.requests: 5,000 digits [set]", key="workload.requests",
                        base=base.name, accept=("workload.requests", "requests"), scenario=copy.deepcopy(base.raw),
                        files=dict(base.files), set_cli=[f"workload.requests={digits}"], api=False)
        key, value, accept, config = self.rng.choice(edges)
        base = self.base("llm", default_ok=config is None)
        if key == "parallel.expert_parallel":  # an error on a dense model: the default's Llama-3-8B
            base = next(b for b in self.by_kind["llm"] if b.is_default)
        case = self.scenario_case("edges", key, value, base, f"{key}: {flow(value)[:60]}", accept=accept,
                                  mode="file" if config is not None else None)
        if config is not None:  # a config.json beside the scenario, named relative to it
            case.files = {**case.files, "config.json": json.dumps(config).encode()}
        return case

    def make(self, cls: str) -> Case:
        if cls in ("wrong_type", "numeric", "huge"):
            return self.keyed(cls)
        return {"unknown_key": self.unknown_key, "catalog": self.catalog, "distribution": self.distribution,
                "yaml": self.yaml_attack, "encoding": self.encoding, "trace": self.trace,
                "profile": self.profile, "set_syntax": self.set_syntax, "out": self.out_attack,
                "name": self.name_attack, "edges": self.edge}[cls]()


# how many cases of each class per round of 40 (the classes with the most distinct inputs get more)
WEIGHTS = {"wrong_type": 6, "numeric": 7, "huge": 4, "unknown_key": 3, "catalog": 2, "distribution": 3,
           "yaml": 4, "encoding": 2, "trace": 3, "profile": 2, "set_syntax": 2, "out": 1, "name": 1, "edges": 3}


def generate(n: int, seed: int = 0, classes: tuple = CLASSES) -> list[Case]:
    """``n`` cases, spread over the classes by :data:`WEIGHTS`, deterministic given ``seed``."""
    gen = Generator(seed)
    order = [c for c in classes for _ in range(WEIGHTS[c])]
    out = []
    while len(out) < n:
        for cls in order:
            if len(out) >= n:
                break
            out.append(gen.make(cls))
    return out


def one_per_class(seed: int = 0, per_class: int = 1) -> list[Case]:
    gen = Generator(seed)
    return [gen.make(c) for c in CLASSES for _ in range(per_class)]


# ---------------------------------------------------------------------------------------------
# materializing a case in a temp folder


@dataclass
class Prepared:
    case: Case
    root: Path            # the case's own folder; nothing outside cwd/runs may change under it
    cwd: Path             # where the CLI runs
    argv: list
    api_source: Any       # path (str), dict or None
    api_overrides: dict | None
    out_path: Path | None


def materialize(case: Case, root: Path) -> Prepared:
    """Write the case's files under ``root`` (created, must not exist) and build its command."""
    cwd = root / "w1" / "w2" / "w3"
    cwd.mkdir(parents=True)
    (root / "outside.txt").write_text("a file above the working folder; nothing may touch it\n")
    (cwd / "notes.txt").write_text("unrelated notes in the working folder\n")
    for name, data in case.files.items():
        (cwd / name).write_bytes(data)
    scenario_arg = None
    api_source: Any = None
    if case.text is not None:
        (cwd / "scenario.yaml").write_bytes(case.text)
        scenario_arg = api_source = "scenario.yaml"
    elif case.scenario is not None:
        scen = case.scenario
        if case.cls == "name" and isinstance(scen.get("name"), str) and "__ABS__" in scen["name"]:
            scen = dict(scen, name=scen["name"].replace("__ABS__", str(root)))
        (cwd / "scenario.yaml").write_bytes(dump(scen))
        scenario_arg = "scenario.yaml"
        api_source = copy.deepcopy(scen) if case.api_dict else "scenario.yaml"
    argv = [*LASTMILE_ARGV, "run"]
    if scenario_arg:
        argv.append(scenario_arg)
    for s in case.set_cli:
        argv += ["--set", s]
    out_path = None
    if case.out == "dir":
        out_path = cwd / "out"
    elif case.out == "file":
        out_path = cwd / "afile.txt"
        out_path.write_text("a file the user owns\n")
    elif case.out == "proc":
        out_path = Path("/proc/nope")
    elif case.out == "nonempty":
        out_path = cwd / "keep"
        (out_path / "sub").mkdir(parents=True)
        (out_path / "thesis.tex").write_text("years of work\n")
        (out_path / "sub" / "data.bin").write_bytes(bytes(range(256)))
    elif case.out == "dot":
        out_path = Path(".")
    elif case.out == "dotdot":
        out_path = Path("..")
        (cwd.parent / "sibling.txt").write_text("beside the working folder\n")
    elif case.out == "under_file":
        (cwd / "afile.txt").write_text("a file the user owns\n")
        out_path = cwd / "afile.txt" / "run"
    if out_path is not None:
        argv += ["--out", str(out_path)]
    return Prepared(case, root, cwd, argv, api_source, case.overrides if case.api else None, out_path)


def snapshot(root: Path) -> dict:
    """relative path -> sha256 of every file (or 'dir') under ``root``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        for name in dirnames:
            out[str((d / name).relative_to(root))] = "dir"
        for name in filenames:
            p = d / name
            try:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                out[str(p.relative_to(root))] = "unreadable"
    return out


def diff_snapshots(before: dict, after: dict) -> list[str]:
    out = []
    for k in sorted(set(before) | set(after)):
        if k not in after:
            out.append(f"deleted {k}")
        elif k not in before:
            out.append(f"created {k}")
        elif before[k] != after[k]:
            out.append(f"changed {k}")
    return out


# ---------------------------------------------------------------------------------------------
# checks


_TB_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning))\b")


def names_key(line: str, accept: tuple) -> bool:
    """Whether any accepted key (or file) name appears in ``line`` as a word of its own."""
    for a in accept:
        if not a:
            continue
        if re.search(rf"(?<![\w-]){re.escape(a)}(?![\w-])", line):
            return True
    return False


@dataclass
class Outcome:
    case: Case
    via: str                      # cli | api
    ok: bool
    causes: list                  # what went wrong (empty when ok)
    output: str                   # stderr (CLI) or the exception (API), trimmed
    command: str
    seconds: float


def _trim(text: str, n: int = 1200) -> str:
    return text if len(text) <= n else text[: n // 2] + f"\n... [{len(text) - n} characters cut] ...\n" + text[-n // 2:]


def _limit_memory():  # pragma: no cover - runs in the child
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ValueError, OSError, ImportError):
        pass
    os.setsid()


def _env() -> dict:
    env = dict(os.environ)
    env.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "200"})
    env.pop("PYTHONWARNINGS", None)
    return env


def _case_root(tmp, via: str, case: Case) -> Path:
    """A fresh folder of its own for one check (the same input may be checked twice at once)."""
    import tempfile
    tag = re.sub(r"[^\w.-]", "_", case.ident)[:60]
    return Path(tempfile.mkdtemp(prefix=f"{via}-{tag}-", dir=tmp)) / "case"


def check_error_line(line_text: str, case: Case, *, prefix: str | None) -> list[str]:
    causes = []
    lines = line_text.splitlines()
    nonempty = [ln for ln in lines if ln.strip()]
    if "Traceback" in line_text:
        exc = [m.group(1) for ln in lines if (m := _TB_EXC.match(ln))]
        causes.append(f"traceback ({exc[-1] if exc else 'unknown'})")
    if len(lines) != 1 or len(nonempty) != 1:
        causes.append(f"{len(lines)} lines, not one")
    first = nonempty[0] if nonempty else ""
    if prefix and not first.startswith(prefix):
        causes.append(f"line does not start with {prefix!r}")
    if len(first) > MAX_LINE:
        causes.append(f"line of {len(first)} characters (> {MAX_LINE})")
    if first and not names_key(first, case.accept):
        causes.append("key not named")
    return causes


def check_cli(case: Case, tmp: Path) -> Outcome:
    """Run ``lastmile run`` on the case in a fresh folder under ``tmp`` and check issue 9's promises."""
    root = _case_root(tmp, "cli", case)
    prep = materialize(case, root)
    before = snapshot(root)
    command = " ".join(_shell_quote(a) for a in ["lastmile", *prep.argv[len(LASTMILE_ARGV):]])
    t0 = time.monotonic()
    proc = subprocess.Popen(prep.argv, cwd=prep.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), preexec_fn=_limit_memory)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
        hung = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        hung = True
    seconds = time.monotonic() - t0
    stderr = err.decode("utf-8", "replace")
    after = snapshot(root)
    causes = []
    if hung:
        causes.append(f"hang (killed after {TIMEOUT:g} s)")
    changes = diff_snapshots(before, after)
    if case.expect == "safe_output":
        if not hung and proc.returncode != 0:
            causes.append(f"exit {proc.returncode}, not 0")
        runs = [c for c in changes if c.startswith("created w1/w2/w3/runs")]
        other = [c for c in changes if c not in runs]
        if other:
            causes.append("wrote outside runs/: " + ", ".join(other[:4]))
        top = [c for c in runs if c.count("/") == 4]  # created w1/w2/w3/runs/<folder>
        if not hung and proc.returncode == 0 and len(top) != 1:
            causes.append(f"{len(top)} run folders under runs/, not one")
        if "Traceback" in stderr:
            causes.append("traceback")
    else:
        if not hung and proc.returncode != 2:
            causes.append("exit 0 (accepted)" if proc.returncode == 0 else f"exit {proc.returncode}")
        if not hung:
            causes += check_error_line(stderr, case, prefix="lastmile: error:")
        deleted = [c for c in changes if not c.startswith("created")]
        created = [c for c in changes if c.startswith("created")]
        if deleted:
            causes.append("pre-existing files deleted or changed: " + ", ".join(deleted[:4]))
        if created:
            causes.append("folder or file left behind: " + ", ".join(created[:3]))
    if not hung and proc.returncode and proc.returncode < 0:
        causes.append(f"killed by signal {-proc.returncode}")
    output = _trim(stderr.rstrip("\n")) or f"(no stderr; stdout: {_trim(out.decode('utf-8', 'replace'), 300)!r})"
    shutil.rmtree(root.parent, ignore_errors=True)
    return Outcome(case, "cli", not causes, causes, output, command, seconds)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _shell_quote(a: str) -> str:
    import shlex
    q = shlex.quote(a)
    return q if len(q) < 200 else q[:100] + "...'"


# ---- the API, in a long-lived worker process (one import, hangs and memory blow-ups contained) -----

_WORKER = textwrap.dedent(r'''
    import os, pickle, struct, sys, time, traceback
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    import simulator
    from simulator.errors import LastmileError
    inp, outp = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    def send(obj):
        data = pickle.dumps(obj)
        outp.write(struct.pack("<Q", len(data)) + data); outp.flush()
    send({"ready": True})
    while True:
        head = inp.read(8)
        if len(head) < 8:
            break
        job = pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
        os.chdir(job["cwd"])
        t0 = time.monotonic()
        try:
            r = simulator.run(job["source"], job["overrides"])
            res = {"raised": False, "returned": type(r).__name__}
        except BaseException as exc:
            msg = str(exc)
            res = {"raised": True, "type": type(exc).__name__, "lastmile": isinstance(exc, LastmileError),
                   "message": msg[:4000], "message_len": len(msg),
                   "tb": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]}
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                res["fatal"] = True
        res["seconds"] = time.monotonic() - t0
        send(res)
''')


class ApiWorker:
    """``simulator.run`` in a child process that is killed and restarted on a hang or a crash."""

    def __init__(self):
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([str(PYTHON), "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=_env(), preexec_fn=_limit_memory,
                                     cwd=str(ROOT))
        msg = self._recv(60.0)
        if not (isinstance(msg, dict) and msg.get("ready")):
            raise RuntimeError(f"the API worker did not start: {msg!r}")

    def close(self):
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc.wait()
            self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _recv(self, timeout: float):
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        need = 8
        length = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return "timeout"
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return "crash"
            buf += chunk
            if length is None and len(buf) >= 8:
                length = struct.unpack("<Q", buf[:8])[0]
                need = 8 + length
            if length is not None and len(buf) >= need:
                return pickle.loads(buf[8:need])

    def call(self, cwd: Path, source, overrides):
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        data = pickle.dumps({"cwd": str(cwd), "source": source, "overrides": overrides})
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return "crash"
        res = self._recv(TIMEOUT)
        if not isinstance(res, dict):
            code = self.proc.poll()
            self.close()
            return res if code is None or code >= 0 else f"crash (signal {-code})"
        if res.get("fatal"):
            self.close()
        return res

    def check(self, case: Case, tmp: Path) -> Outcome:
        root = _case_root(tmp, "api", case)
        prep = materialize(case, root)
        before = snapshot(root)
        src = prep.api_source
        command = f"simulator.run({_short_repr(src)}, {_short_repr(prep.api_overrides)})"
        t0 = time.monotonic()
        res = self.call(prep.cwd, src, prep.api_overrides)
        seconds = time.monotonic() - t0
        causes = []
        if res == "timeout":
            causes.append(f"hang (killed after {TIMEOUT:g} s)")
            output = "(no answer)"
        elif isinstance(res, str):
            causes.append(f"process {res}")
            output = "(the worker died)"
        elif not res["raised"]:
            causes.append(f"accepted (returned a {res['returned']})")
            output = f"returned a {res['returned']}"
        else:
            msg = res["message"]
            output = f"{res['type']}: {msg}"
            if not res["lastmile"]:
                causes.append(f"raised {res['type']}, not LastmileError")
                output += "\n" + _trim(res["tb"], 1500)
            if res["message_len"] > len(msg):
                causes.append(f"message of {res['message_len']} characters")
            if "\n" in msg.strip() or not msg.strip():
                causes.append(f"{len(msg.strip().splitlines())} lines, not one")
            first = msg.strip().splitlines()[0] if msg.strip() else ""
            if len(first) > MAX_LINE:
                causes.append(f"line of {len(first)} characters (> {MAX_LINE})")
            if first and not names_key(first, case.accept):
                causes.append("key not named")
        changes = diff_snapshots(before, snapshot(root))
        if changes:
            causes.append("files changed: " + ", ".join(changes[:4]))
        shutil.rmtree(root.parent, ignore_errors=True)
        return Outcome(case, "api", not causes, causes, _trim(output), command, seconds)


def _short_repr(v, n: int = 160) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 20] + f"...<{len(r)} chars>"
