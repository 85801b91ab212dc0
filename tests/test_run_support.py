"""Every serving key says whether closed-form runs cover it (declared by the module that owns it), and
a set-up a run does not cover is stepped one event at a time, with the reason named."""

from __future__ import annotations

import pytest
import yaml

import simulator
from simulator.cli import main
from simulator.config.loader import load_scenario
from simulator.config.models import Serving
from simulator.pipelines.llm import serving as _serving  # noqa: F401  (imports every owning module)
from simulator.pipelines.llm.run_support import RUN_SUPPORT, serving_blockers

from test_decode_runs import coalesced, trace_scenario  # noqa: F401  (a fixture)

UNCOVERED = {  # a value of each restricted key that runs do not cover
    "multi_step": 4,
    "kv_offload": {"capacity": "64 GiB", "link": "pcie5-x16"},
    "speculative": {"method": "ngram", "tokens": 3},
    "api_server_loop": "asyncio",
}
NEEDS = {"api_server_loop": {"serving.api_server_process": "own"}}  # what an uncovered value needs beside it


def test_every_serving_key_is_declared_by_its_owner():
    missing = sorted(set(Serving.model_fields) - set(RUN_SUPPORT))
    assert not missing, f"serving keys no module declared for closed-form runs: {missing}"
    assert not set(RUN_SUPPORT) - set(Serving.model_fields)
    assert all(s.owner for s in RUN_SUPPORT.values())


def test_the_restricted_keys_are_the_ones_with_a_reason():
    restricted = {k for k, s in RUN_SUPPORT.items() if s.lacks}
    assert restricted == set(UNCOVERED)
    defaults = load_scenario(trace_scenario("splitwise_conv.csv", 10)).serving
    assert serving_blockers(defaults) == []  # the defaults are all covered


@pytest.mark.parametrize("key", sorted(UNCOVERED))
def test_an_uncovered_value_is_stepped_and_named(key, coalesced):  # noqa: F811
    raw = trace_scenario("splitwise_conv.csv", 60)
    over = {f"serving.{key}": UNCOVERED[key], **NEEDS.get(key, {})}
    scenario = load_scenario(raw, over)
    reasons = serving_blockers(scenario.serving)
    assert len(reasons) == 1 and reasons[0].startswith(f"serving.{key}=") and RUN_SUPPORT[key].lacks in reasons[0]
    simulator.run(raw, {**over, "record_spans": False}, last_mile_cost=False)
    assert coalesced[0] == 0


def test_verbose_run_names_what_keeps_a_replica_off_the_fast_path(tmp_path, capsys):
    """``lastmile -v run`` says which replicas step one event at a time and why (one line for replicas
    alike); a covered one says nothing."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(trace_scenario("splitwise_conv.csv", 20)))
    assert main(["-v", "run", str(path), "--no-write", "--no-last-mile-cost", "--set", "serving.multi_step=4"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "closed-form runs" in line]
    assert lines == [f"lastmile: replica 0 steps one event at a time (no closed-form runs): "
                     f"serving.multi_step=4: {RUN_SUPPORT['multi_step'].lacks}"]
    # (with the last-mile counterfactual, the same deployment simulated again: still said once)
    assert main(["-v", "run", str(path), "--no-write", "--set", "serving.stream_interval=4",
                 "--set", "serving.api_server_process=engine"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "closed-form runs" in line]
    assert lines == ["lastmile: replica 0 steps one event at a time (no closed-form runs): needs a stream interval "
                     "above 1 only with the API servers in their own processes"]
    assert main(["-v", "run", str(path), "--no-write", "--no-last-mile-cost", "--set", "parallel.replicas=3"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "closed-form runs" in line]
    assert lines == ["lastmile: all 3 replicas step one event at a time (no closed-form runs): needs one replica "
                     "(a router's choice depends on the others' state)"]
    assert main(["-v", "run", str(path), "--no-write", "--no-last-mile-cost"]) == 0
    assert "closed-form runs" not in capsys.readouterr().err
