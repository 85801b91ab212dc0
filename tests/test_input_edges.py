"""The edges of the input: the strict YAML reader, load-time bounds, context windows, run folders."""

from __future__ import annotations

import re

import numpy as np
import pytest

import simulator
from simulator.config.loader import load_scenario, parse_override
from simulator.config.trace import fit_to_context
from simulator.config.yamlio import MAX_DEPTH, YAMLInputError, _StrictCLoader, loads, loads_catalog
from simulator.errors import ConfigError, LastmileError
from simulator.runfolder import check_out, is_run_folder, safe_name, write_run


def test_yaml_reads_no_base_60_and_keeps_numbers():
    assert loads("a: 1:2\nb: 1e3\nc: 0x10\nd: 1.5\ne: 12\nf: 1_000") == {
        "a": "1:2", "b": 1000.0, "c": 16, "d": 1.5, "e": 12, "f": 1000}
    assert parse_override("serving.max_batch=1:2") == ("serving.max_batch", "1:2")


def test_yaml_rejects_duplicate_keys_but_allows_merge_overrides():
    with pytest.raises(YAMLInputError, match="duplicate key 'a' \\(first at line 1\\)"):
        loads("a: 1\nb: 2\na: 3\n")
    assert loads("x: &x {b: 1, c: 2}\ny:\n  <<: *x\n  b: 5\n")["y"] == {"b": 5, "c": 2}


def test_catalog_files_read_alike_with_libyaml_and_pure_python():
    """The catalog is parsed with libyaml's parser (loads_catalog): the same data as the pure-Python
    strict loader, for every shipped catalog and profile file."""
    from importlib import resources

    root = resources.files("simulator.config")
    files = [f for d in ("catalog", "profiles") for f in (root / d).iterdir() if f.name.endswith(".yaml")]
    assert len(files) >= 10
    for f in files:
        text = f.read_text()
        assert loads(text, loader=_StrictCLoader) == loads(text), f.name


def test_catalog_reader_keeps_the_strict_rules_and_the_words_of_its_errors():
    assert loads_catalog("a: 1:2\nb: 1e3\nc: 0x10\nf: 1_000") == {"a": "1:2", "b": 1000.0, "c": 16, "f": 1000}
    assert loads_catalog("x: &x {b: 1, c: 2}\ny:\n  <<: *x\n  b: 5\n")["y"] == {"b": 5, "c": 2}
    for bad in ("a: 1\nb: 2\na: 3\n", "a: [1, 2\n", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)):
        with pytest.raises(YAMLInputError) as pure:
            loads(bad)
        with pytest.raises(YAMLInputError) as fast:
            loads_catalog(bad)
        assert str(fast.value) == str(pure.value)


def test_yaml_bounds_depth_and_alias_expansion():
    with pytest.raises(YAMLInputError, match="nested more than"):
        loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(YAMLInputError, match="nested more than"):
        loads("[" * 10_000)
    laughs = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
    with pytest.raises(YAMLInputError, match="expands to more than"):
        loads(laughs)


@pytest.mark.parametrize("data,byte", [(b"kind: llm\nname: caf\xe9\n", "0xe9"),
                                        ("name: x\n".encode("utf-16"), "0xff")])
def test_a_scenario_that_is_not_utf8_is_one_error(tmp_path, data, byte):
    p = tmp_path / "s.yaml"
    p.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        simulator.run(p)
    assert str(err.value).startswith(f"{p}: is not UTF-8 text (byte {byte}")


@pytest.mark.parametrize("overrides,path,words", [
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"kind": [1]}, "kind", "expected one of llm"),
    ({"hardware": 3}, "hardware", "expected a mapping"),
    ({"model": {"base": [1]}}, "model.base", "catalog name"),
    ({"parallel.replicas": 10**7}, "parallel.replicas", "less than or equal to 10000"),
    ({"serving.api_servers": 10**30}, "serving.api_servers", "less than or equal to 1024"),
    ({"serving.max_batch": True}, "serving.max_batch", "expected a number"),
    ({"workload.requests": 10**9}, "workload.requests", "less than or equal to 10000000"),
    ({"hardware.cpu_cores": 10**30}, "hardware.cpu_cores", "less than or equal to 4096"),
    ({"hardware.client_link.latency": 1e308}, "hardware.client_link.latency", "at most 1 day"),
    ({"hardware.host_link.bandwidth": "1 B/s"}, "hardware.host_link.bandwidth", "at least 1 kB/s"),
    ({"workload.burstiness": float("inf")}, "workload.burstiness", "finite"),
    ({"workload.output_tokens": 10**30}, "workload.output_tokens", "less than or equal to"),
    ({"workload.prompt_tokens": {"dist": "uniform", "low": 300, "high": 100}}, "workload.prompt_tokens",
     "low (300) is above high (100)"),
    ({"workload.prompt_tokens": {"dist": "fixed"}}, "workload.prompt_tokens", "needs value"),
    ({"workload.prompt_tokens": {"dist": "fixed", "value": 3, "foo": 1}}, "workload.prompt_tokens.foo",
     "unknown key 'foo'"),
    ({"workload.prompt_tokens": {"dist": "lognormal", "median": 1e308, "sigma": 1}},
     "workload.prompt_tokens.median", "less than or equal to"),
    ({"workload.prompt_tokens": {"dist": "lognormal", "median": 100, "sigma": float("nan")}},
     "workload.prompt_tokens.sigma", "finite"),
    ({"workload.prompt_tokens": 8000}, "workload.prompt_tokens", "8,192-token context"),
])
def test_absurd_values_are_one_line_errors_at_their_key(overrides, path, words):
    with pytest.raises(LastmileError) as err:
        simulator.run(None, overrides)
    msg = str(err.value)
    assert msg.startswith(f"<default scenario>: {path}:"), msg
    assert words in msg and "\n" not in msg and len(msg) < 400


def test_a_huge_echoed_input_is_cut():
    with pytest.raises(ConfigError) as err:
        load_scenario(None, {"serving.overlap": "x" * 10**6})
    assert len(str(err.value)) < 400


def test_nested_catalog_overrides_merge_into_the_entry():
    sc = load_scenario(None, {"hardware.gpu.achievable.hbm": 0.5})
    assert sc.hardware.gpu.achievable.hbm == 0.5 and sc.hardware.gpu.achievable.matmul > 0.5


def test_dit_model_keys_are_checked():
    dit = "scenarios/dit/pixart-1024-a100-nvlink-single.yaml"
    with pytest.raises(ConfigError, match=r"model.num_layers: DiT 'pixart-alpha': unknown key 'num_layers'"):
        load_scenario(dit, {"model.num_layers": 0})
    with pytest.raises(ConfigError, match=r"model.heads: .*7 x 72 = 504 must equal hidden \(1152\)"):
        load_scenario(dit, {"model.heads": 7})


def _trace(tmp_path, rows):
    p = tmp_path / "t.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{r}\n" for r in rows))
    return str(p)


@pytest.mark.parametrize("rows,words", [
    (["0,1e30,10"], "row 2: num_prefill_tokens must be between 1 and"),
    (["0,10.5,10"], "row 2: num_prefill_tokens must be a whole number"),
    (["0,10,10", "1e30,10,10"], "row 3: arrived_at must be at most"),
    (["0,8000,500"], "row 2: prompt + output = 8,500 tokens exceed llama-3-8b's 8,192-token context"),
])
def test_trace_rows_are_checked_at_load(tmp_path, rows, words):
    over = {"workload.arrival": "trace", "workload.trace": _trace(tmp_path, rows), "workload.requests": len(rows)}
    with pytest.raises(ConfigError, match=re.escape("workload.trace: trace t.csv " + words)):
        load_scenario(None, over)


def test_more_requests_than_trace_rows_is_an_error(tmp_path):
    over = {"workload.arrival": "trace", "workload.trace": _trace(tmp_path, ["0,10,10", "1,10,10"]),
            "workload.requests": 3}
    with pytest.raises(ConfigError, match="workload.requests: 3 requests asked of trace t.csv, which has 2 rows"):
        load_scenario(None, over)


def test_truncate_prompt_cuts_prompts_to_fit_the_context():
    prompt, output = np.array([100, 4000, 9000]), np.array([10, 500, 100])
    assert fit_to_context(prompt, output, 4096, "truncate_prompt").tolist() == [100, 3596, 3996]
    assert fit_to_context(prompt, output, 4096, "error").tolist() == prompt.tolist()


def test_truncated_trace_requests_reach_the_engine_cut(tmp_path):
    trace = _trace(tmp_path, ["0,4000,500", "0.5,100,20"])
    r = simulator.run(None, {"model": "llama-2-7b", "workload.arrival": "trace", "workload.trace": trace,
                             "workload.requests": 2, "workload.over_context": "truncate_prompt"})
    prompts = r.requests.filter(like="prompt").iloc[:, 0].tolist()
    assert prompts == [3596, 100]


def test_safe_names_never_leave_the_runs_folder():
    assert safe_name("../../escaped") == "escaped"
    assert safe_name("a b/c") == "a-b-c"
    assert safe_name("...") == "run"


def test_out_refuses_a_folder_of_other_files_and_keeps_them(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a lastmile run folder"):
        check_out(tmp_path)
    f = tmp_path / "notes.txt"
    with pytest.raises(ConfigError, match="names a file"):
        check_out(f)
    with pytest.raises(ConfigError, match="cannot be created: .*notes.txt is a file"):
        check_out(f / "deeper" / "run")
    assert f.read_text() == "mine"


def test_a_previous_run_folder_is_replaced_whole(tmp_path):
    r = simulator.run(None, {"workload.requests": 5, "record_spans": False})
    out = tmp_path / "run"
    write_run(r, out)
    assert is_run_folder(out)
    (out / "summary.json").write_text("{}")
    write_run(r, out)
    assert (out / "summary.json").read_text() != "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary folders left behind


def test_token_pipeline_llm_given_as_a_mapping_is_the_llm_catalogs():
    causal = "scenarios/dit/token-pipeline-causal.yaml"
    assert load_scenario(causal, {"model.layers": 16}).arch.layers == 16
    with pytest.raises(ConfigError, match=r"model.laers: unknown key 'laers' \(did you mean 'layers'\?\)"):
        load_scenario(causal, {"model.laers": 16})


def test_a_misspelt_required_key_is_named_as_the_typo():
    with pytest.raises(ConfigError, match=r"workload.stages.0.durration: unknown key 'durration' "
                                          r"\(did you mean 'duration'\?\)"):
        load_scenario(None, {"workload.stages": [{"rate": 4, "durration": 20}]})


@pytest.mark.parametrize("text,words", [
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,1_000,5\n", "row 3: num_prefill_tokens = '1_000' is not a number"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n\n1,12\n", "row 3: num_decode_tokens = '' is not a number"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n\n1,12,5,9\n", "is not a readable CSV (line 4 has 4 fields, the header 3)"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,abc,5\n", "row 3: num_prefill_tokens = 'abc' is not a number"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,inf,5\n", "row 3: num_prefill_tokens = 'inf' is not finite"),
])
def test_a_bad_trace_row_is_one_error_naming_its_row(tmp_path, text, words):
    from simulator.config.trace import read_trace

    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_trace(p)
    assert words in str(err.value)


def test_a_trace_reads_every_row_with_blank_lines_skipped_and_columns_by_name(tmp_path):
    from simulator.config.trace import read_trace

    p = tmp_path / "t.csv"
    p.write_text("num_decode_tokens,extra,arrived_at,num_prefill_tokens\n5,x,0.0,10\n\n7,y, 1.25 ,12\n")
    rows = read_trace(p)
    assert rows.arrived_at.tolist() == [0.0, 1.25]
    assert rows.num_prefill_tokens.tolist() == [10, 12] and rows.num_decode_tokens.tolist() == [5, 7]
