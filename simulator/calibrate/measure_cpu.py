"""Measure the CPU last-mile costs (tokenize, incremental detokenize, SSE chunk) on this machine.

Runs the HuggingFace ``tokenizers`` library on a byte-level BPE vocabulary trained here, from
the Python standard library's sources, so that nothing is downloaded; writes a CPU profile
for the catalog (``cpu:``) and every raw figure with its provenance (``measured:``). With an
engine profile path it also measures the serving engine's host-path costs (``measure_host``).

    python -m simulator.calibrate.measure_cpu --out cpu_profile.yaml [--engine-out engine.yaml] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import random
import socket
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from ..errors import LastmileError
from ..units import fmt_time

_INSTALL_HINT = "measuring CPU costs needs HuggingFace tokenizers: pip install 'lastmile-sim[cpu]'"

# corpus characters, vocabulary, repetitions, engine steps timed per batch size and repetition,
# tokens per single-request sequence, batch sizes
_FULL = dict(corpus=12 << 20, vocab=32_000, reps=61, steps=32, seq_tokens=2048,
             batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
_QUICK = dict(corpus=1 << 20, vocab=8_192, reps=3, steps=8, seq_tokens=512,
              batches=(1, 8, 64, 256))


def _tokenizers():
    try:
        import tokenizers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from exc
    return tokenizers


def _corpus(max_chars: int, seed: int) -> list[str]:
    """Deterministic local corpus: the standard library's sources, shuffled by ``seed``, capped."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    random.Random(seed).shuffle(files)
    texts, total = [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if not texts:
        raise RuntimeError(f"no Python sources found under {stdlib} to train a tokenizer on")
    return texts


def _train_tokenizer(texts: list[str], vocab: int):
    """A GPT-2-style byte-level BPE tokenizer trained on ``texts``."""
    tk = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _decode_stream_ns(tok, ids: list[int]) -> int:
    """One request detokenized with ``DecodeStream.step``, one token at a time."""
    from tokenizers.decoders import DecodeStream

    step = DecodeStream(skip_special_tokens=False).step
    t0 = time.perf_counter_ns()
    for i in ids:
        step(tok, i)
    return time.perf_counter_ns() - t0


def _decode_stream_step_median_ns(tok, ids: list[int]) -> float:
    """Median of individually timed ``DecodeStream.step`` calls (the timer adds ~50-100 ns)."""
    from tokenizers.decoders import DecodeStream

    stream, clock, samples = DecodeStream(skip_special_tokens=False), time.perf_counter_ns, []
    for i in ids:
        t0 = clock()
        stream.step(tok, i)
        samples.append(clock() - t0)
    return float(statistics.median(samples))


def _offsets_ns(tok, ids: list[int]) -> int:
    """Prefix/read-offset detokenization (SGLang/vLLM V0 logic): two ``decode`` calls per token."""
    decode, seq = tok.decode, []
    prefix_offset = read_offset = 0
    t0 = time.perf_counter_ns()
    for i in ids:
        seq.append(i)
        prefix_text = decode(seq[prefix_offset:read_offset])
        new_text = decode(seq[prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            _delta = new_text[len(prefix_text):]
            prefix_offset, read_offset = read_offset, len(seq)
    return time.perf_counter_ns() - t0


def _deltas(tok, ids: list[int]) -> list[str]:
    """The text pieces a stream would send, one per token that completes text."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=False)
    return [d for d in (stream.step(tok, i) for i in ids) if d]


def _batch_step_ns(tok, ids: list[int], batch: int, steps: int) -> float:
    """Median time of an engine step that advances ``batch`` DecodeStreams by one token each.

    Each request reads its own stretch of ``ids``, so the batch holds different texts.
    """
    from tokenizers.decoders import DecodeStream

    span = steps + 8
    starts = [(r * 7919) % (len(ids) - span) for r in range(batch)]
    streams = [DecodeStream(skip_special_tokens=False) for _ in range(batch)]
    for s, start in zip(streams, starts):  # past each stream's first tokens
        for i in ids[start:start + 8]:
            s.step(tok, i)
    samples = []
    for k in range(8, span):
        column = [ids[start + k] for start in starts]
        t0 = time.perf_counter_ns()
        _out = [s.step(tok, i) for s, i in zip(streams, column)]
        samples.append(time.perf_counter_ns() - t0)
    return float(statistics.median(samples))


def _chunks_ns(fn: Callable[[str], str], deltas: list[str]) -> int:
    t0 = time.perf_counter_ns()
    for d in deltas:
        fn(d)
    return time.perf_counter_ns() - t0


def _json_text(delta: str) -> str:
    return json.dumps({"text": delta})


def _openai_sse(delta: str) -> str:
    chunk = {
        "id": "chatcmpl-lastmile0123456789",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "lastmile-bench",
        "choices": [{"index": 0, "delta": {"content": delta}, "logprobs": None, "finish_reason": None}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def _prompts(text: str) -> dict[int, list[str]]:
    """Prompts of 128, 1024 and 8192 characters, six of each from places spread over ``text``."""
    out = {}
    for chars in (128, 1024, 8192):
        offsets = range(0, len(text) - chars, max((len(text) - chars) // 6, 1))
        out[chars] = [text[off:off + chars] for off in offsets][:6]
    return out


def _encode_ns(tok, prompts: list[str]) -> int:
    t0 = time.perf_counter_ns()
    for p in prompts:
        tok.encode(p)
    return time.perf_counter_ns() - t0


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def _measure(tok, seq: list[int], all_ids: list[int], prompts: dict[int, list[str]], cfg: dict) -> dict:
    """Every timing, interleaved: each repetition runs each measurement once, so that the
    machine's load phases (seconds long on a shared VM) weigh on all figures alike.

    Returns lists of per-repetition samples in seconds, keyed by figure.
    """
    deltas = _deltas(tok, seq)
    samples: dict = {"stream": [], "offsets": [], "json": [], "sse": [],
                     "batch": {b: [] for b in cfg["batches"]},
                     "encode": {c: [] for c in prompts}}
    for rep in range(cfg["reps"] + 1):
        row = {
            "stream": _decode_stream_ns(tok, seq) / len(seq),
            "offsets": _offsets_ns(tok, seq) / len(seq),
            "json": _chunks_ns(_json_text, deltas) / len(deltas),
            "sse": _chunks_ns(_openai_sse, deltas) / len(deltas),
        }
        batch = {b: _batch_step_ns(tok, all_ids, b, cfg["steps"]) for b in cfg["batches"]}
        encode = {c: _encode_ns(tok, ps) / len(ps) for c, ps in prompts.items()}
        if rep == 0:  # warm-up
            continue
        for key, ns in row.items():
            samples[key].append(ns * 1e-9)
        for b, ns in batch.items():
            samples["batch"][b].append(ns * 1e-9)
        for c, ns in encode.items():
            samples["encode"][c].append(ns * 1e-9)
    samples["deltas"] = len(deltas)
    return samples


def _fit(tok, seq: list[int], prompts: dict, samples: dict) -> dict:
    """Medians and straight-line fits of the timings: per-token and per-step detokenization, encoding."""
    med = statistics.median
    batch = {b: med(v) for b, v in samples["batch"].items()}
    slope, intercept = (float(x) for x in np.polyfit(list(batch), list(batch.values()), 1))
    b_max = max(batch)
    enc_tokens = {c: sum(len(tok.encode(p).ids) for p in ps) / len(ps) for c, ps in prompts.items()}
    enc_b, enc_a = (float(x) for x in np.polyfit(list(enc_tokens.values()),
                                                    [med(v) for v in samples["encode"].values()], 1))
    return {"batch": batch, "slope": slope, "intercept": intercept, "b_max": b_max,
            "per_request_at_max": [v / b_max for v in samples["batch"][b_max]],
            "enc_tokens": enc_tokens, "enc_a": enc_a, "enc_b": enc_b, "sse_chunk": med(samples["sse"]),
            "step_median": _decode_stream_step_median_ns(tok, seq) * 1e-9}


def _raw(fits: dict, samples: dict) -> dict:
    """Every measured figure behind the profile, for the ``measured.raw`` record."""
    med = statistics.median
    batch, b_max = fits["batch"], fits["b_max"]
    return {
        "decode_stream_per_token": fmt_time(med(samples["stream"])),
        "decode_stream_step_median": fmt_time(fits["step_median"]),
        "prefix_read_offsets_per_token": fmt_time(med(samples["offsets"])),
        "batch_step": {b: fmt_time(v) for b, v in batch.items()},
        "batch_step_per_request": {b: fmt_time(v / b) for b, v in batch.items()},
        "batch_fit_a": fmt_time(fits["intercept"]),
        "batch_fit_b": fmt_time(fits["slope"]),
        f"per_request_at_B{b_max}_p10_p90": [fmt_time(_percentile(fits["per_request_at_max"], q)) for q in (10, 90)],
        "json_dumps_text_per_chunk": fmt_time(med(samples["json"])),
        "openai_sse_per_chunk": fmt_time(fits["sse_chunk"]),
        "encode_per_call": {round(fits["enc_tokens"][c]): fmt_time(med(v)) for c, v in samples["encode"].items()},
        "encode_fit_a": fmt_time(fits["enc_a"]),
        "encode_fit_b": fmt_time(fits["enc_b"]),
    }


def _profile(tk, tok, cfg: dict, fits: dict, samples: dict, run: dict) -> dict:
    """The profile: the ``cpu:`` costs the simulator reads, and the ``measured:`` provenance."""
    host = socket.gethostname()
    vocab = tok.get_vocab_size()
    processor = platform.processor() or platform.machine()
    return {
        "cpu": {
            "name": f"measured-{host}",
            "source": (f"simulator.calibrate.measure_cpu on {host} ({processor}), tokenizers {tk.__version__}, "
                       f"byte-level BPE with {vocab} ids trained on the Python stdlib; "
                       f"single-threaded medians of {cfg['reps']} interleaved repetitions"),
            "tokenize_per_token": fmt_time(max(fits["enc_b"], 0.0)),
            "detokenize_per_token": fmt_time(fits["slope"]),
            "detokenize_step_fixed": fmt_time(max(fits["intercept"], 0.0)),
            "stream_per_chunk": fmt_time(fits["sse_chunk"]),
        },
        "measured": {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "hostname": host,
            "processor": processor,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "tokenizers": tk.__version__,
            "command": run["command"],
            "quick": run["quick"],
            "seed": run["seed"],
            "vocab_size": vocab,
            "corpus_chars": run["corpus_chars"],
            "sequence_tokens": run["sequence_tokens"],
            "stream_chunks": samples["deltas"],
            "repetitions": cfg["reps"],
            "steps_per_batch_timing": cfg["steps"],
            "train_time": run["train_time"],
            "runtime": run["runtime"],
            "raw": _raw(fits, samples),
        },
    }


def measure_cpu(out_path: str | None, quick: bool = False, seed: int = 0, command: str | None = None,
                engine_out: str | None = None) -> dict:
    """Measure this machine's CPU last-mile costs; write the YAML profile to ``out_path`` (if given).

    Returns the profile as a dict (the same content as the YAML, values as unit strings);
    ``command`` is recorded as provenance (default: this process's command line). With
    ``engine_out``, the engine's host-path costs are measured too and written there as an
    ``engine:`` profile (see measure_host); its libraries and its path are checked before anything
    is measured.
    """
    tk = _tokenizers()
    if engine_out is not None:
        from . import measure_host

        measure_host._libraries()
        measure_host.check_out_path(engine_out)
    cfg = _QUICK if quick else _FULL
    started = time.perf_counter()

    texts = _corpus(cfg["corpus"], seed)
    t0 = time.perf_counter()
    tok = _train_tokenizer(texts, cfg["vocab"])
    train_s = time.perf_counter() - t0

    # Text to generate from: the corpus reversed, so that it starts on other files than training did.
    sample = "\n".join(reversed(texts))[: 100_000 if quick else 400_000]
    all_ids = tok.encode(sample).ids
    seq = all_ids[: cfg["seq_tokens"]]
    prompts = _prompts(sample)

    samples = _measure(tok, seq, all_ids, prompts, cfg)
    fits = _fit(tok, seq, prompts, samples)
    runtime = time.perf_counter() - started
    profile = _profile(tk, tok, cfg, fits, samples, {
        "command": command or " ".join(sys.argv), "quick": quick, "seed": seed,
        "corpus_chars": sum(map(len, texts)), "sequence_tokens": len(seq),
        "train_time": fmt_time(train_s), "runtime": fmt_time(runtime)})
    if out_path is not None:
        Path(out_path).write_text(yaml.safe_dump(profile, sort_keys=False, allow_unicode=True))
    if engine_out is not None:
        measure_host.measure_host(engine_out, quick=quick, seed=seed, command=command)
    return profile


def main(argv: list[str] | None = None) -> int:
    """Command line: measure and write the profile, then print its ``cpu:`` block."""
    parser = argparse.ArgumentParser(prog="measure_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="cpu_profile.yaml", help="where to write the YAML profile")
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes and repetitions (~10 s)")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the training corpus")
    parser.add_argument("--engine-out", default=None,
                        help="also measure the engine's host-path costs and write that profile here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m simulator.calibrate.measure_cpu", *argv])
    try:
        profile = measure_cpu(args.out, quick=args.quick, seed=args.seed, command=command,
                              engine_out=args.engine_out)
    except (ImportError, LastmileError) as exc:
        print(f"measure_cpu: error: {exc}", file=sys.stderr)
        return 2
    print(yaml.safe_dump({"cpu": profile["cpu"]}, sort_keys=False), end="")
    print(f"wrote {args.out} in {profile['measured']['runtime']}")
    if args.engine_out is not None:
        print(f"wrote {args.engine_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
