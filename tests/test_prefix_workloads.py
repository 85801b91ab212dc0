"""Workloads that carry prefix identity: Mooncake .jsonl traces, shared system prompts, multi-turn sessions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.config.loader import load_scenario
from simulator.config.trace import read_trace
from simulator.errors import ConfigError
from simulator.workloads.arrivals import make_requests, open_loop_arrivals
from simulator.workloads.prefix import PrefixIds, stream_ids, trace_ids

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# 4 lines: ms timestamps; ids cover ceil(input / 512) blocks; line 2 shares 2 blocks with line 1,
# line 4 shares 1 (its block 2 is id 7 after [1, 2]: a new chain).
LINES = [(0, 1000, 5, [1, 2]), (1500, 1300, 6, [1, 2, 3]), (1500, 400, 7, [4]), (4000, 1100, 8, [1, 5, 6])]


def _write(path, lines):
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                            for t, i, o, h in lines))
    return path


@pytest.fixture
def tiny_jsonl(tmp_path):
    return _write(tmp_path / "tiny.jsonl", LINES)


def _specs(workload, seed=0, model="llama-3.1-8b"):
    sc = load_scenario({"model": model, "hardware": {"gpu": "h100-sxm"}, "seed": seed, "workload": workload})
    return make_requests(sc.workload, np.random.default_rng(sc.seed), sc.model.context_length)


def _trace(path, **workload):
    return {"trace": str(path), "arrival": "trace", "requests": 4, **workload}


# ---- Mooncake JSON lines --------------------------------------------------------------------------

def test_jsonl_rows_timestamps_in_ms_become_seconds(tiny_jsonl):
    rows = read_trace(tiny_jsonl)
    assert rows.arrived_at.tolist() == [0.0, 1.5, 1.5, 4.0]
    assert rows.num_prefill_tokens.tolist() == [1000, 1300, 400, 1100]
    assert rows.num_decode_tokens.tolist() == [5, 6, 7, 8]
    prefix = trace_ids(rows)
    assert prefix.unit == 512
    assert [prefix.of(i).tolist() for i in range(4)] == [h for *_, h in LINES]
    assert trace_ids(rows.head(2)).ids.tolist() == [1, 2, 1, 2, 3]


def test_jsonl_time_scale_limit_and_ids_follow_the_rows(tiny_jsonl):
    s = _specs(_trace(tiny_jsonl, trace_time_scale=2.0))
    assert s.arrival.tolist() == [0.0, 3.0, 3.0, 8.0]
    assert s.prefix.of(3).tolist() == [1, 5, 6]
    s = _specs(_trace(tiny_jsonl, requests=2))
    assert len(s) == len(s.prefix) == 2
    assert s.prefix.ids.tolist() == [1, 2, 1, 2, 3]


def test_csv_trace_and_plain_synthetic_carry_no_prefix(conv_trace):
    assert _specs({"trace": str(conv_trace), "arrival": "trace", "requests": 5}).prefix is None
    assert _specs({"requests": 5}).prefix is None


def test_jsonl_repeat_shifts_ids_so_repeats_are_new_users(tiny_jsonl):
    s = _specs(_trace(tiny_jsonl, requests=6, trace_repeat=True))
    # repetition 1 is rows 0 and 1 again, every id + (6 + 1)
    assert s.prefix.of(4).tolist() == [8, 9] and s.prefix.of(5).tolist() == [8, 9, 10]
    assert s.prefix.hit_blocks().tolist() == [0, 2, 0, 1, 0, 2]


def test_prompts_cut_to_the_context_cut_their_ids(tmp_path):
    path = _write(tmp_path / "long.jsonl", [(0, 8000, 1000, list(range(16))), (10, 600, 10, [0, 99])])
    s = _specs(_trace(path, requests=2, over_context="truncate_prompt"), model="llama-3-8b")
    assert s.prompt.tolist() == [8192 - 1000, 600]
    assert s.prefix.of(0).tolist() == list(range(15))  # ceil(7192 / 512) = 15
    assert s.prefix.of(1).tolist() == [0, 99]


BAD_LINES = [
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\nnot json\n', "line 2", "not JSON"),
    ('[1, 2]\n', "line 1", "JSON object"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}\n', "line 1", "lacks key(s) hash_ids"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}\n', "line 1", "input_length"),
    ('{"timestamp": 0, "input_length": 10.5, "output_length": 1, "hash_ids": [0]}\n', "line 1", "whole number"),
    ('{"timestamp": 0, "input_length": 10, "output_length": true, "hash_ids": [0]}\n', "line 1", "output_length"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n', "line 1", "timestamp"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}\n', "line 1", "do not cover"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-3]}\n', "line 1", "non-negative"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
     '{"timestamp": 4, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n', "line 2", "must not decrease"),
    ('\n\n', None, "has no rows"),
]


@pytest.mark.parametrize("text,where,what", BAD_LINES)
def test_bad_jsonl_lines_are_one_line_errors_naming_file_and_line(tmp_path, text, where, what):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_trace(path)
    msg = str(err.value)
    assert "\n" not in msg and "bad.jsonl" in msg and what in msg and err.value.path == "workload.trace"
    if where:
        assert where in msg


def test_a_bad_jsonl_is_rejected_at_load_time(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}\n')
    with pytest.raises(ConfigError, match="line 1"):
        load_scenario({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"}, "workload": _trace(path, requests=1)})


# ---- reuse: the closed form --------------------------------------------------------------------------

def test_reuse_counts_leading_blocks_seen_before_in_order():
    p = PrefixIds.from_lists(512, [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3, 7]])
    assert p.hit_blocks().tolist() == [0, 2, 1, 0, 3]
    assert p.reuse() == 6 / 13
    assert len(p) == 5 and p.of(2).tolist() == [1, 5]


def test_reuse_follows_the_chain_not_the_id():
    # id 2 at position 1 after a different first block is not a shared prefix; nor is a later repeat
    # of a block once the chain broke
    p = PrefixIds.from_lists(16, [[1, 2], [9, 2], [1, 8, 2]])
    assert p.hit_blocks().tolist() == [0, 0, 1]
    assert PrefixIds.from_lists(16, [[]]).reuse() == 0.0


def test_prefix_ids_check_names_the_request_that_does_not_cover_its_prompt():
    p = PrefixIds.from_lists(16, [[1], [2, 3]])
    p.check(np.array([16, 17]))
    with pytest.raises(ValueError, match="request 1"):
        p.check(np.array([16, 33]))


@pytest.mark.parametrize("name,blocks,distinct", [("conversation", 288_500, 182_790)])
def test_mooncake_conversation_reuse_is_its_repeated_blocks(name, blocks, distinct):
    """The trace's README: 288,500 blocks of which 182,790 distinct; its ids never change position or
    predecessor, so every repeated id is a hit and reuse = 1 - distinct / blocks."""
    path = SHARED / "traces" / f"mooncake_{name}.jsonl"
    if not path.is_file():
        pytest.skip("../shared/traces is not beside the checkout")
    prefix = trace_ids(read_trace(path))
    assert prefix.ids.size == blocks and np.unique(prefix.ids).size == distinct
    assert prefix.reuse() == (blocks - distinct) / blocks


# ---- shared system prompts ---------------------------------------------------------------------------

def _synthetic(**workload):
    return {"requests": 30, "arrival": "constant", "rate": 1.0, "prompt_tokens": 300, "output_tokens": 10, **workload}


def test_groups_share_exactly_their_whole_shared_blocks():
    s = _specs(_synthetic(prefix={"shared_tokens": 100, "groups": 3, "block_tokens": 16}))
    ids = [s.prefix.of(i) for i in range(len(s))]
    assert all(len(x) == 19 for x in ids)  # ceil(300 / 16)
    firsts = {tuple(x[:6]) for x in ids}  # 100 // 16 = 6 shared blocks; block 6 holds tokens 96..111
    assert 1 < len(firsts) <= 3
    rest = np.concatenate([x[6:] for x in ids])
    assert np.unique(rest).size == rest.size  # nothing past the shared blocks is shared
    assert not set(rest.tolist()) & {v for f in firsts for v in f}
    groups_seen = len(firsts)
    assert s.prefix.reuse() == 6 * (30 - groups_seen) / (19 * 30)


def test_prompts_shorter_than_the_system_prompt_share_only_their_whole_blocks():
    s = _specs(_synthetic(prompt_tokens={"dist": "uniform", "low": 20, "high": 200},
                          prefix={"shared_tokens": 64, "groups": 1, "block_tokens": 16}))
    for i in range(len(s)):
        shared = min(int(s.prompt[i]), 64) // 16
        assert s.prefix.of(i)[:shared].tolist() == list(range(shared))
        assert np.all(s.prefix.of(i)[shared:] >= 4)


def test_prefix_draws_after_the_others_so_lengths_and_arrivals_are_unchanged():
    w = _synthetic(arrival="poisson", prompt_tokens={"dist": "lognormal", "median": 300, "sigma": 0.5, "max": 4000})
    plain, shared = _specs(w, seed=5), _specs({**w, "prefix": {"shared_tokens": 64, "groups": 4}}, seed=5)
    for key in ("arrival", "prompt", "output"):
        np.testing.assert_array_equal(getattr(plain, key), getattr(shared, key))


# ---- sessions ------------------------------------------------------------------------------------------

def _sessions(**workload):
    return {"requests": 9, "arrival": "constant", "rate": 1.0, "prompt_tokens": 40, "output_tokens": 8,
            "sessions": {"turns": 3, "think_time": 10}, **workload}


def test_session_turns_arrive_think_time_apart_with_growing_prompts():
    s = _specs(_sessions())
    # sessions start at 0, 1, 2 s; turn k at start + 10 k; prompt_k = 40 k + 8 (k - 1)
    assert s.arrival.tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0]
    assert s.prompt.tolist() == [40] * 3 + [88] * 3 + [136] * 3
    assert s.output.tolist() == [8] * 9


def test_session_ids_grow_by_prefix_and_sessions_share_none():
    s = _specs(_sessions())
    p = s.prefix
    for sess in range(3):
        t1, t2, t3 = (p.of(sess + 3 * k) for k in range(3))
        assert len(t1) == 3 and len(t2) == 6 and len(t3) == 9  # ceil(40/16), ceil(88/16), ceil(136/16)
        assert t2[:2].tolist() == t1[:2].tolist()  # turn 1's whole blocks (its partial third is not whole)
        assert t3[:5].tolist() == t2[:5].tolist()
        assert t3[2] != t1[2]
    per_session = [set(np.concatenate([p.of(sess + 3 * k) for k in range(3)]).tolist()) for sess in range(3)]
    assert not (per_session[0] & per_session[1]) and not (per_session[1] & per_session[2])
    assert p.hit_blocks().tolist() == [0, 0, 0, 2, 2, 2, 5, 5, 5]
    assert p.unit == 16


def test_sessions_with_a_shared_system_prompt_and_truncated_last_session():
    s = _specs(_sessions(requests=7, prefix={"shared_tokens": 32, "groups": 1, "block_tokens": 16}))
    assert len(s) == 7  # 3 sessions of 3 turns; the two latest turns are not sent
    assert s.arrival.tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 20.0]
    assert all(s.prefix.of(i)[:2].tolist() == [0, 1] for i in range(7))


def test_think_time_distribution_and_quantity():
    a = _specs(_sessions(arrival="poisson", sessions={"turns": 4, "think_time": {"dist": "exponential", "mean": "5 s"}}),
               seed=3)
    b = _specs(_sessions(arrival="poisson", sessions={"turns": 4, "think_time": {"dist": "exponential", "mean": 5}}),
               seed=3)
    np.testing.assert_array_equal(a.arrival, b.arrival)
    assert np.all(np.diff(a.arrival) >= 0)
    fixed = _specs(_sessions(sessions={"turns": 3, "think_time": "2 s"}))
    # sessions at 0, 1, 2 s, turns 2 s apart; a tie goes to the earlier session
    assert fixed.arrival.tolist() == [0.0, 1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 5.0, 6.0]
    assert fixed.prompt.tolist() == [40, 40, 88, 40, 88, 136, 88, 136, 136]


def test_same_seed_same_workload_other_seed_other_draws():
    w = _sessions(arrival="poisson", prompt_tokens={"dist": "uniform", "low": 10, "high": 300},
                  prefix={"shared_tokens": 16, "groups": 5})
    a, b, c = _specs(w, seed=1), _specs(w, seed=1), _specs(w, seed=2)
    for key in ("arrival", "prompt", "output"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    np.testing.assert_array_equal(a.prefix.ids, b.prefix.ids)
    np.testing.assert_array_equal(a.prefix.offsets, b.prefix.offsets)
    assert not np.array_equal(a.prompt, c.prompt)


def test_stream_ids_closed_form():
    # streams 0 and 1 in groups 0 and 1 with 2 shared blocks of 4 reserved per group; 16-token blocks
    p = stream_ids(np.array([0, 1, 0]), np.array([40, 50, 100]), 16, np.array([2, 2]), np.array([0, 1]), 4)
    assert [p.of(i).tolist() for i in range(3)] == [[0, 1, 13], [4, 5, 12, 14], [0, 1, 8, 9, 10, 11, 15]]


# ---- configurations that cannot hold -------------------------------------------------------------------

@pytest.mark.parametrize("workload,path,what", [
    ({"trace": "TRACE_CSV", "arrival": "trace", "prefix": {"shared_tokens": 64}}, "workload.prefix", "CSV trace"),
    ({"trace": "TRACE_JSONL", "arrival": "trace", "sessions": {"turns": 2}}, "workload.sessions", "its own prefix"),
    ({"arrival": "closed", "concurrency": 4, "sessions": {"turns": 2}}, "workload.sessions", "open-loop"),
    ({"stages": [{"rate": 1, "duration": 10}], "sessions": {"turns": 2}}, "workload.sessions", "load profile"),
    ({"prompt_tokens": 100, "prefix": {"shared_tokens": 200}}, "workload.prefix.shared_tokens", "longest prompt"),
    ({"prompt_tokens": 3000, "output_tokens": 1000, "sessions": {"turns": 3}}, "workload.prompt_tokens",
     "a session's last turn"),
    ({"sessions": {"turns": 2, "think_time": {"dist": "uniform", "low": 5}}}, "workload.sessions.think_time",
     "needs high"),
    ({"sessions": {"turns": 1001}}, "workload.sessions.turns", "1000"),
])
def test_bad_combinations_are_one_line_errors(workload, path, what, tiny_jsonl, conv_trace):
    w = {k: (str(conv_trace) if v == "TRACE_CSV" else str(tiny_jsonl) if v == "TRACE_JSONL" else v)
         for k, v in workload.items()}
    with pytest.raises(ConfigError) as err:
        load_scenario({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "workload": w})
    assert "\n" not in str(err.value) and what in str(err.value)
    assert (err.value.path or "").startswith(path)


def test_kinds_without_prompts_reject_prefix_workloads():
    sc = load_scenario({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                        "workload": {"sessions": {"turns": 2}}})
    with pytest.raises(ConfigError, match="workload.sessions"):
        open_loop_arrivals(sc.workload, np.random.default_rng(0))


# ---- nothing changes for existing scenarios ------------------------------------------------------------

def _digest(src, overrides=None):
    sc = load_scenario(src, overrides)
    s = make_requests(sc.workload, np.random.default_rng(sc.seed), sc.model.context_length)
    h = hashlib.sha256()
    for a in (s.arrival, s.prompt, s.output):
        h.update(np.ascontiguousarray(a).tobytes())
    return len(s), h.hexdigest()[:16], s.prefix


# Recorded with main at f36d5f1, before workloads carried prefix identity.
@pytest.mark.parametrize("src,overrides,n,digest", [
    (None, None, 600, "2c91acb010d8505f"),
    (None, {"workload.arrival": "gamma", "workload.burstiness": 2.0, "seed": 7,
            "workload.prompt_tokens": {"dist": "lognormal", "median": 800, "sigma": 0.5, "max": 4000}},
     600, "1bbf19b0c8bc7eaa"),
    ("scenarios/llm/chat_trace_h100.yaml", None, 2000, "6d3ce53cf9232b79"),
])
def test_existing_scenarios_draw_the_same_requests(src, overrides, n, digest, conv_trace):
    path = None if src is None else ROOT / src
    assert _digest(path, overrides) == (n, digest, None)


def test_the_mooncake_scenario_carries_the_traces_ids():
    if not (SHARED / "traces" / "mooncake_conversation.jsonl").is_file():
        pytest.skip("../shared/traces is not beside the checkout")
    sc = load_scenario(ROOT / "scenarios/llm/mooncake_conversation.yaml")
    s = make_requests(sc.workload, np.random.default_rng(sc.seed), sc.model.context_length)
    assert len(s) == len(s.prefix) == 1000 and s.prefix.unit == 512
    assert s.arrival[-1] == pytest.approx(4 * read_trace(sc.workload.trace).arrived_at[999])


@pytest.mark.parametrize("lines,line", [
    ([(0, 1000, 5, [1, 2]), (1, 600, 5, [3, 2])], 2),     # id 2 after another id
    ([(0, 1000, 5, [1, 2]), (1, 1000, 5, [2, 4])], 2),    # id 2 at another position
    ([(0, 1000, 5, [1, 2]), (1, 1000, 5, [1, 2]), (2, 2000, 5, [5, 6, 7, 1])], 3),
])
def test_a_jsonl_id_that_names_two_prefixes_is_an_error(tmp_path, lines, line):
    with pytest.raises(ConfigError, match=f"line {line}: a hash_ids id must name one prefix"):
        read_trace(_write(tmp_path / "twice.jsonl", lines))


def test_synthetic_ids_name_whole_prefixes_too():
    from simulator.config.trace import _first_misplaced_id

    s = _specs(_sessions(arrival="poisson", prompt_tokens={"dist": "uniform", "low": 10, "high": 300},
                         prefix={"shared_tokens": 48, "groups": 3}))
    assert _first_misplaced_id(s.prefix.offsets, s.prefix.ids) is None
    for sess in range(3):  # each session's 3 turns, in arrival order, with growing prompts
        turns = np.flatnonzero(s.session == sess)
        assert turns.size == 3 and np.all(np.diff(s.prompt[turns]) > 0)
    assert _specs(_synthetic()).session is None


def test_a_pipelines_call_ids_are_the_flat_ids_they_replace():
    from simulator.pipelines.request_graph.llm_stage import call_prefixes

    rng = np.random.default_rng(3)
    for _ in range(20):
        n, unit = int(rng.integers(1, 40)), int(rng.choice([4, 16]))
        prompts = rng.integers(1, 200, n)
        group = np.where(rng.random(n) < 0.6, rng.integers(0, 8, n), -1)
        # a group's calls share a static prefix no longer than any of their prompts
        shared = np.array([min(prompts[group == g]) if g >= 0 else 0 for g in group]) * (rng.random(n) < 0.8)
        # the flat construction: every unit its own id, a group's later calls copying its first's
        units = -(-prompts // unit)
        off = np.concatenate([[0], np.cumsum(units)])
        flat, lead = np.arange(off[-1]), {}
        for c in np.flatnonzero(group >= 0):
            first = lead.setdefault(group[c], c)
            full = shared[c] // unit
            if first != c and full:
                flat[off[c]:off[c] + full] = flat[off[first]:off[first] + full]
        ids = call_prefixes(unit, prompts, group, shared)
        assert len(ids) == n and ids.unit == unit
        for c in range(n):
            assert ids.of(c).tolist() == flat[off[c]:off[c + 1]].tolist()


def test_a_pool_of_prompts_is_sent_again_and_again_as_inference_perf_sends_it():
    from simulator.config.loader import load_scenario
    from simulator.workloads.arrivals import make_requests

    sc = load_scenario({"workload": {"requests": 100, "prompt_tokens": {"dist": "uniform", "low": 580, "high": 604},
                                     "prefix": {"shared_tokens": 100, "groups": 11, "prompts_per_group": 4}}})
    specs = make_requests(sc.workload, np.random.default_rng(0))
    pool = 44
    # request i sends the (i mod 44)-th prompt of one shuffled order: the same length and the same ids
    for i in range(pool, 100):
        assert specs.prompt[i] == specs.prompt[i - pool]
        assert specs.prefix.of(i).tolist()[:-1] == specs.prefix.of(i - pool).tolist()[:-1]
    first = [tuple(specs.prefix.of(i)[:100 // 16]) for i in range(pool)]
    assert len(set(first)) == 11  # 11 system prompts, each starting 4 of the pool's prompts
    assert len({tuple(specs.prefix.of(i)[:-1]) for i in range(pool)}) == pool  # and a question of its own


@pytest.mark.slow
def test_the_live_vllm_runs_20_req_s_stages_are_served_as_vllm_served_them():
    # vllm_serving_h100's 20 req/s stages (inference-perf's pooled shared-prefix prompts, prefix cache on):
    # Llama-2-7B's and Llama-2-70B's saturated when every prompt was prefilled whole (E2E +706% and far more);
    # with the pool replayed all three keep up, as vLLM did
    from simulator.validate import discover, run_family

    fam = next(f for f in discover() if f.name == "vllm_serving_h100")
    index = [i for i, c in enumerate(fam.cases) if "(20/s)" in c.name]
    rows = run_family(fam, cases=index)
    e2e = [r for r in rows if r["metric"] == "e2e_ms"]
    assert len(e2e) == 3 and all(abs(r["error_pct"]) < 25 for r in e2e), e2e
