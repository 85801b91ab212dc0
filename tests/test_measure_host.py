"""The engine host-path measurement (measure_host) runs end to end in quick mode with the real
libraries (msgpack, pyzmq, uvicorn, starlette, httpx: the [dev] extra installs them, so a missing
one fails here instead of skipping) and writes a parseable ``engine:`` profile; a path that is not
an engine profile is refused before anything is measured."""

import builtins
import random
from pathlib import Path

import httpx  # noqa: F401
import msgpack
import pytest
import starlette  # noqa: F401
import uvicorn  # noqa: F401
import yaml
import zmq  # noqa: F401

from simulator import cli
from simulator.calibrate import measure_host as mh
from simulator.calibrate.measure_cpu import measure_cpu
from simulator.errors import LastmileError
from simulator.units import parse

TIME_COSTS = ("output_per_request", "detokenize_step_fixed", "ipc_per_message", "ipc_per_byte", "stream_per_chunk",
              "request_overhead")
UNRELATED = "cpu:\n  stream_per_chunk: 3 us\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One quick run, written over an earlier engine profile (which it may replace)."""
    out = tmp_path_factory.mktemp("engine") / "engine.yaml"
    out.write_text("engine:\n  base: vllm-v1\n  costs: {stream_per_chunk: 1 ms}\n")
    returned = mh.measure_host(str(out), quick=True, command="pytest")
    profile = yaml.safe_load(out.read_text())
    assert profile == returned
    return profile


def test_costs_have_units_and_signs(written):
    engine = written["engine"]
    assert engine["base"] == "vllm-v1"
    costs = engine["costs"]
    assert set(costs) == set(TIME_COSTS) | {"ipc_bytes_per_request"}
    for key in TIME_COSTS:
        assert isinstance(costs[key], str) and costs[key].split()[-1] in ("ns", "us", "ms", "s"), key
    values = {k: parse(costs[k], "time") for k in TIME_COSTS}
    for key in ("output_per_request", "ipc_per_byte", "stream_per_chunk"):  # the fitted slopes
        assert values[key] > 0, key
    assert values["detokenize_step_fixed"] >= 0 and values["ipc_per_message"] >= 0
    # one entry: a 41-character request id, one token id, a finish reason and three ints
    assert isinstance(costs["ipc_bytes_per_request"], int) and 45 < costs["ipc_bytes_per_request"] < 80
    assert costs["stream_per_chunk"] != "1 ms"  # the earlier profile was replaced


def test_fits_and_message_sizes(written):
    raw = written["measured"]["raw"]
    assert parse(raw["output_fit_b"], "time") > 0
    steps = {b: parse(v, "time") for b, v in raw["output_step"].items()}
    assert steps[512] > steps[1]
    for serializer in ("msgpack", "pickle"):
        fit = raw["ipc"][serializer]
        sizes = [fit["message_bytes"][b] for b in mh.BATCHES]
        assert sizes == sorted(sizes) and sizes[-1] > 100 * sizes[0]
        for end in ("send", "recv"):
            assert parse(fit[end]["fit_b_per_byte"], "time") > 0, (serializer, end)
            per_message = {b: parse(v, "time") for b, v in fit[end]["per_message"].items()}
            assert per_message[512] > per_message[1], (serializer, end)
    assert raw["ipc"]["msgpack"]["mean_end_fit_b_per_byte"] == written["engine"]["costs"]["ipc_per_byte"]
    stream = raw["stream"]
    per_request = {n: parse(v, "time") for n, v in stream["server_cpu_per_request"].items()}
    assert per_request[max(per_request)] > per_request[min(per_request)] > 0
    assert parse(stream["fit_b_per_chunk"], "time") > 0


def test_provenance(written):
    measured = written["measured"]
    for key in ("date", "hostname", "platform", "python", "command", "runtime", "source"):
        assert measured[key] not in (None, ""), key
    assert measured["quick"] is True and measured["command"] == "pytest"
    for lib in ("msgpack", "pyzmq", "uvicorn", "starlette", "httpx", "libzmq"):
        assert measured["libraries"][lib], lib


def test_bytes_per_request_is_one_msgpack_entry():
    entry = mh._entry(random.Random(0))
    assert entry[1] and len(entry[1]) == 1
    one, two = (len(msgpack.packb(mh._message(random.Random(1), b))) for b in (8, 16))
    # eight more entries cost about eight entries' bytes
    assert 0.8 < (two - one) / 8 / len(msgpack.packb(entry)) < 1.25


def test_process_outputs_builds_one_output_per_request():
    bench = mh._OutputBench(4, 2, random.Random(0))
    outs = mh._process_outputs(bench.steps[0], bench.states, bench.stats)
    assert [o.request_id for o in outs] == [o.request_id for o in bench.steps[0]]
    assert all(len(o.outputs) == 1 and not o.finished for o in outs)
    assert bench.stats.num_generation_tokens == 4
    state = bench.states[outs[0].request_id]
    state.max_tokens = 2  # the next token finishes it
    outs = mh._process_outputs(bench.steps[1], bench.states, bench.stats)
    assert outs[0].finished and outs[0].outputs[0].finish_reason == "length"
    assert len(bench.states) == 3


def test_line_fit():
    a, b = mh._line_fit([1, 2, 3], [5.0, 7.0, 9.0])
    assert a == pytest.approx(3.0) and b == pytest.approx(2.0)


@pytest.mark.parametrize("content", [UNRELATED, "just some text\n", "engine: [1, 2]\n- not yaml: {\n"])
def test_unrelated_file_is_refused_and_left_intact(tmp_path, content):
    path = tmp_path / "mine.yaml"
    path.write_text(content)
    with pytest.raises(LastmileError, match="not an engine profile"):
        mh.measure_host(str(path), quick=True)
    assert path.read_text() == content
    with pytest.raises(LastmileError, match="not an engine profile"):
        measure_cpu(str(tmp_path / "cpu.yaml"), quick=True, engine_out=str(path))
    assert path.read_text() == content
    assert not (tmp_path / "cpu.yaml").exists()  # refused before measuring anything


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(LastmileError, match="does not exist"):
        mh.check_out_path(tmp_path / "nowhere" / "engine.yaml")


def test_cli_refuses_unrelated_file(tmp_path, capsys):
    path = tmp_path / "notes.yaml"
    path.write_text(UNRELATED)
    code = cli.main(["measure-cpu", "--quick", "--out", str(tmp_path / "cpu.yaml"), "--engine-out", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "not an engine profile" in err and len(err.strip().splitlines()) == 1
    assert path.read_text() == UNRELATED


@pytest.mark.parametrize("missing", ["uvicorn", "zmq", "msgpack", "httpx", "starlette"])
def test_missing_library_names_the_extra(monkeypatch, tmp_path, capsys, missing):
    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name == missing or name.startswith(missing + "."):
            raise ImportError(f"No module named {missing!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    with pytest.raises(ImportError, match=r"lastmile-sim\[cpu\]"):
        mh.measure_host(None, quick=True)
    code = cli.main(["measure-cpu", "--quick", "--out", str(tmp_path / "cpu.yaml"),
                     "--engine-out", str(tmp_path / "engine.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "msgpack, pyzmq, uvicorn, starlette and httpx" in err and "lastmile-sim[cpu]" in err
    assert not (tmp_path / "cpu.yaml").exists()


PROFILES = Path(__file__).resolve().parent.parent / "simulator" / "config" / "profiles"


@pytest.mark.parametrize("which", ["quick run", "shipped"])
def test_profile_loads_as_serving_engine(written, tmp_path, which):
    """The profile is what ``serving.engine`` takes: its costs reach the scenario's CPU costs."""
    from simulator.api import load_scenario
    from simulator.config import catalog
    from simulator.config.models import CPUCosts

    if "engines" not in catalog.KINDS or "vllm-v1" not in catalog.names("engines"):
        pytest.skip("the catalog has no vllm-v1 engine profile to build on")
    assert set(written["engine"]["costs"]) <= set(CPUCosts.model_fields)
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(written))
    if which == "shipped":
        path = PROFILES / "engine_measured_buildhost.yaml"
    costs = yaml.safe_load(path.read_text())["engine"]["costs"]
    cpu = load_scenario({"kind": "llm", "serving": {"engine": str(path)}}).hardware.cpu
    for key in TIME_COSTS:
        assert getattr(cpu, key) == pytest.approx(parse(costs[key], "time")), key
    assert cpu.ipc_bytes_per_request == costs["ipc_bytes_per_request"]
