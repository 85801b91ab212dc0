"""The CPU calibration runs end to end in quick mode and writes a plausible, parseable profile."""

import pytest
import tokenizers  # noqa: F401  (the [dev] extra installs it: a missing tokenizers is a failure, not a skip)
import yaml

from simulator.calibrate.measure_cpu import _json_text, _openai_sse, main, measure_cpu
from simulator.units import parse

PROFILE_KEYS = ("tokenize_per_token", "detokenize_per_token", "detokenize_step_fixed", "stream_per_chunk")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu") / "cpu_profile.yaml"
    returned = measure_cpu(str(out), quick=True)
    written = yaml.safe_load(out.read_text())
    assert written == returned
    return written


def test_profile_keys_and_units(profile):
    cpu = profile["cpu"]
    assert cpu["name"] and "measure_cpu" in cpu["source"]
    values = {k: parse(cpu[k], "time") for k in PROFILE_KEYS}
    assert all(values[k] > 0 for k in PROFILE_KEYS if k != "detokenize_step_fixed")
    assert values["detokenize_step_fixed"] >= 0
    assert 0.05e-6 < values["detokenize_per_token"] < 1e-3
    assert 0.05e-6 < values["tokenize_per_token"] < 1e-3
    assert 0.1e-6 < values["stream_per_chunk"] < 1e-3


def test_provenance(profile):
    measured = profile["measured"]
    for key in ("date", "hostname", "platform", "python", "tokenizers", "command", "vocab_size"):
        assert measured[key] not in (None, "")
    assert measured["vocab_size"] > 1000


def test_step_cost_grows_with_batch(profile):
    steps = {b: parse(v, "time") for b, v in profile["measured"]["raw"]["batch_step"].items()}
    assert steps[64] > steps[1]
    # the OpenAI SSE chunk serializes more than a bare {"text": ...}; the timed medians are only
    # held to the same order of magnitude, as a loaded 2-core machine can swap close timings
    assert len(_openai_sse("hello")) > len(_json_text("hello"))
    sse = parse(profile["measured"]["raw"]["openai_sse_per_chunk"], "time")
    plain = parse(profile["measured"]["raw"]["json_dumps_text_per_chunk"], "time")
    assert 0.2 < sse / plain < 50


def test_missing_tokenizers_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers" or name.startswith("tokenizers."):
            raise ImportError("No module named 'tokenizers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(ImportError, match=r"lastmile-sim\[cpu\]"):
        measure_cpu(None, quick=True)


def test_cli_writes_the_out_path(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["--out", str(out), "--quick"]) == 0
    assert "detokenize_per_token" in yaml.safe_load(out.read_text())["cpu"]
    assert str(out) in capsys.readouterr().out


def test_module_cli_refuses_an_engine_out_that_is_not_an_engine_profile(tmp_path, capsys):
    notes = tmp_path / "notes.yaml"
    notes.write_text("cpu: {}\n")
    assert main(["--out", str(tmp_path / "p.yaml"), "--quick", "--engine-out", str(notes)]) == 2
    assert "not an engine profile" in capsys.readouterr().err
    assert notes.read_text() == "cpu: {}\n" and not (tmp_path / "p.yaml").exists()
