"""A ShareGPT-format dataset is sampled as vllm bench serve samples it (its shuffle, its length filter,
the model's tokenizer counting the tokens), runs behind an arrival process, and prints vLLM's block."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

import simulator
from simulator.config.sharegpt import read_sharegpt
from simulator.errors import ConfigError

tokenizers = pytest.importorskip("tokenizers")

WORDS = ("the token leaves the gpu and the host detokenizes it before the server streams a chunk to the "
         "client who waits for every word of the answer while the batch grows").split()


def _text(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A ShareGPT file of 300 conversations (some too short or too long for vLLM's filter, some of one
    turn) and a byte-level BPE tokenizer trained on it locally."""
    root = tmp_path_factory.mktemp("sharegpt")
    rng = random.Random(7)
    data = []
    for i in range(300):
        turns = [{"from": "human", "value": _text(rng, rng.choice([1, 20, 60, 120, 900]))},
                 {"from": "gpt", "value": _text(rng, rng.choice([2, 30, 80, 200]))}]
        data.append({"id": f"c{i}", "conversations": turns if i % 17 else turns[:1]})
    (root / "sharegpt.json").write_text(json.dumps(data))
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator([t["value"] for e in data for t in e["conversations"]],
                            tokenizers.trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    tok.save(str(root / "tokenizer.json"))
    return root, data, tok


def _expected(data, tok, n):
    """vLLM's sample: the entries of two turns, shuffled with seed 0, the first n valid ones."""
    entries = [e for e in data if len(e["conversations"]) >= 2]
    random.seed(0)
    random.shuffle(entries)
    out = []
    for e in entries:
        a, b = (len(tok.encode(t["value"]).ids) for t in e["conversations"][:2])
        if a >= 4 and b >= 4 and a <= 1024 and a + b <= 2048:
            out.append((a, b))
        if len(out) == n:
            break
    return out


def test_lengths_are_vllms_sample_counted_by_the_tokenizer(dataset):
    root, data, tok = dataset
    prompt, output = read_sharegpt(root / "sharegpt.json", str(root), 50)
    assert list(zip(prompt.tolist(), output.tolist())) == _expected(data, tok, 50)
    assert prompt.min() >= 4 and output.min() >= 4 and (prompt + output).max() <= 2048


def test_a_sharegpt_run_prints_vllms_block_with_per_chunk_itl(dataset, tmp_path):
    root, _, _ = dataset
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"workload: {{trace: {root / 'sharegpt.json'}, tokenizer: {root}, requests: 120, "
                        "arrival: poisson, rate: 8/s}\nserving: {stream_interval: 8}\n")
    proc = subprocess.run([sys.executable, "-m", "simulator", "run", str(scenario), "--no-write", "--no-last-mile-cost",
                           "--format", "vllm-bench", "--percentiles", "50,99"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shown = {line[:40].strip(): line[41:].strip() for line in proc.stdout.splitlines()}
    assert shown["Successful requests:"] == "120"
    itl, tpot = float(shown["Median ITL (ms):"]), float(shown["Median TPOT (ms):"])
    assert 4 * tpot < itl < 12 * tpot  # a chunk of 8 tokens: the gap between chunks, not 0


def test_sharegpt_needs_a_tokenizer_and_an_arrival_process(dataset):
    root, _, _ = dataset
    base = {"workload": {"trace": str(root / "sharegpt.json"), "requests": 10}}
    with pytest.raises(ConfigError, match="workload.tokenizer.*tokenizer.json"):
        simulator.load_scenario(base)
    with pytest.raises(ConfigError, match="workload.arrival.*no arrival times"):
        simulator.load_scenario({"workload": {**base["workload"], "tokenizer": str(root), "arrival": "trace"}})
    with pytest.raises(ConfigError, match=r"workload.requests: 400 requests asked of trace sharegpt.json, which has \d+ rows"):
        simulator.load_scenario({"workload": {**base["workload"], "tokenizer": str(root), "requests": 400}})
    r = simulator.run({"workload": {**base["workload"], "tokenizer": str(root), "rate": "4/s"}}, last_mile_cost=False)
    assert r.summary["requests_completed"] == 10
    assert np.array_equal(r.requests["prompt_tokens"].to_numpy(), read_sharegpt(root / "sharegpt.json", str(root), 10)[0])
