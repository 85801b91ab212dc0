"""Request traces in the formats users have: Vidur's processed CSV, the Azure LLM inference traces of
2023/2024 (wall-clock TIMESTAMP) and BurstGPT (failed requests dropped), each replayed at its own times."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.config.trace import read_trace
from simulator.errors import ConfigError

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2519540,879,55
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,Conversation log
"""


def test_an_azure_trace_arrives_at_its_wall_clock_offsets(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text(AZURE)
    rows = read_trace(p)
    assert rows.arrived_at.tolist() == pytest.approx([0.0, 4.314579, 4.571364], abs=1e-9)
    assert rows.num_prefill_tokens.tolist() == [374, 396, 879] and rows.num_decode_tokens.tolist() == [44, 109, 55]
    r = simulator.run(None, {"workload.trace": str(p), "workload.arrival": "trace", "workload.requests": 3,
                             "record_spans": False}, last_mile_cost=False)
    assert np.allclose(r.requests["arrival_s"].to_numpy(), rows.arrived_at)


def test_burstgpt_drops_failed_requests_and_starts_at_the_first_served(tmp_path):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(BURSTGPT)
    rows = read_trace(p)
    assert rows.arrived_at.tolist() == [0.0, 113.0]
    assert rows.num_prefill_tokens.tolist() == [472, 417] and rows.num_decode_tokens.tolist() == [18, 276]


@pytest.mark.parametrize("text, says", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\nyesterday,396,5\n",
     "row 3: TIMESTAMP = 'yesterday' is not a date and time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n2023-11-16 18:15:47,396,0\n",
     "row 3: GeneratedTokens must be between 1"),
    ("Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,472,0\n", "every row failed"),
    ("Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,472,9\n45,ChatGPT,1087,0\n118,GPT-4,0,4\n",
     "row 4: Request tokens must be between 1"),
    ("time,prompt,output\n0,1,1\n", "lacks column(s) arrived_at"),
], ids=["azure-date", "azure-zero-output", "burstgpt-all-failed", "burstgpt-row-number", "unknown-header"])
def test_a_bad_row_names_the_files_own_column_and_row(tmp_path, text, says):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        read_trace(p)


def test_vllms_random_dataset_lengths_span_the_range_ratio():
    # --random-input-len 1000 --random-range-ratio 0.5: uniform whole numbers in [500, 1500]
    w = {"workload.prompt_tokens": {"dist": "random", "value": 1000, "range_ratio": 0.5},
         "workload.output_tokens": {"dist": "random", "value": 3, "range_ratio": 0.9}, "workload.requests": 400,
         "record_spans": False}
    r = simulator.run(None, w, last_mile_cost=False).requests
    assert 500 <= r.prompt_tokens.min() < 560 and 1440 < r.prompt_tokens.max() <= 1500
    assert set(r.output_tokens) <= {1, 2, 3, 4, 5, 6} and r.output_tokens.min() == 1  # floor(0.3) -> at least 1
    sc = simulator.load_scenario(None, {"workload.prompt_tokens": {"dist": "random", "value": 1000, "range_ratio": 0.5}})
    assert sc.workload.prompt_tokens.upper == 1500
    with pytest.raises(ConfigError, match="range_ratio"):
        simulator.load_scenario(None, {"workload.prompt_tokens": {"dist": "random", "value": 10, "range_ratio": 1}})
