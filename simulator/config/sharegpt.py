"""ShareGPT-format datasets (``workload.trace: conversations.json``), read as ``vllm bench serve --dataset-name
sharegpt`` reads them: prompt and output lengths counted by the model's own tokenizer, no arrival times.

vLLM 0.33.0's ``ShareGPTDataset`` (``vllm/benchmarks/datasets/datasets.py``) keeps the entries with at
least two ``conversations`` turns, shuffles them with ``random.seed(seed); random.shuffle``, and takes,
in that order, the first entries whose first turn (the prompt) and second turn (the completion) pass
``is_valid_sequence``: at least 4 tokens each, a prompt of at most 1,024 and a total of at most 2,048.
The lengths are ``len(tokenizer(text).input_ids)`` (special tokens added, as the Hugging Face tokenizer
adds them by default). Here the tokenizer is a local ``tokenizer.json`` (``workload.tokenizer``: the
file, or the model folder holding it), read with the ``tokenizers`` library; nothing is downloaded.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from ..errors import ConfigError

MIN_LEN, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048
"""vLLM's ``is_valid_sequence`` defaults (vllm/benchmarks/datasets/datasets.py)."""
SEED = 0
"""The shuffle's seed: ``vllm bench serve --seed``'s default, so the same file gives the same sample."""
KEY = "workload.trace"


def is_sharegpt(path: str | Path) -> bool:
    """Whether a trace is a ShareGPT-format JSON dataset (a ``.json`` file)."""
    return Path(path).suffix.lower() == ".json"


def _tokenizer(path: str | None):
    if not path:
        raise ConfigError("a ShareGPT dataset's lengths are counted by the model's tokenizer: set workload.tokenizer "
                          "to its tokenizer.json (or the model folder holding it)", path="workload.tokenizer")
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(f"tokenizer {str(p)!r} does not exist", path="workload.tokenizer")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("counting a ShareGPT dataset's tokens needs the tokenizers library: "
                          "pip install -e '.[datasets]'", path="workload.tokenizer") from None
    try:
        return Tokenizer.from_file(str(p))
    except Exception as exc:  # noqa: BLE001 - the library's own parse errors, as one line
        raise ConfigError(f"tokenizer {p.name} cannot be read ({str(exc).splitlines()[0][:120]})",
                          path="workload.tokenizer") from None


def _entries(p: Path) -> list:
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p.name} is not a ShareGPT JSON file ({str(exc).splitlines()[0][:120]})", path=KEY) from None
    if not isinstance(data, list):
        raise ConfigError(f"{p.name} is not a ShareGPT JSON file: it holds a {type(data).__name__}, not a list of "
                          "conversations", path=KEY)
    return [e for e in data if isinstance(e, dict) and isinstance(e.get("conversations"), list)
            and len(e["conversations"]) >= 2]


def _text(turn) -> str | None:
    return turn.get("value") if isinstance(turn, dict) and isinstance(turn.get("value"), str) else None


def read_sharegpt(path: str | Path, tokenizer: str | None, limit: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output token counts of the first ``limit`` valid conversations in vLLM's sample
    order (fewer when the file has fewer); a one-line error naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        what = "is not a regular file (a folder, a device or a pipe)" if p.exists() else "does not exist"
        raise ConfigError(f"trace file {str(p)!r} {what}", path=KEY)
    tok = _tokenizer(tokenizer)
    data = _entries(p)
    random.Random(seed).shuffle(data)  # random.seed(seed); random.shuffle(data), as vLLM does
    prompts, outputs = [], []
    for entry in data:
        if len(prompts) >= limit:
            break
        prompt, completion = _text(entry["conversations"][0]), _text(entry["conversations"][1])
        if prompt is None or completion is None:
            continue
        n_in, n_out = len(tok.encode(prompt).ids), len(tok.encode(completion).ids)
        if n_in < MIN_LEN or n_out < MIN_LEN or n_in > MAX_PROMPT or n_in + n_out > MAX_TOTAL:
            continue
        prompts.append(n_in)
        outputs.append(n_out)
    if not prompts:
        raise ConfigError(f"{p.name} has no conversation vLLM would sample (two turns of at least {MIN_LEN} tokens, "
                          f"a prompt of at most {MAX_PROMPT:,} and {MAX_TOTAL:,} in all)", path=KEY)
    return np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64)
