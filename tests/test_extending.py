"""The recipes of docs/extending.md hold: each touch point it names is the one that works."""

from __future__ import annotations

import typing

import pydantic
import pytest

import simulator
from simulator.config.dit_models import DiTParallel
from simulator.config.models import Serving
from simulator.kinds import KINDS
from simulator.observe import llm_metrics
from simulator.pipelines.dit.strategies import REGISTRY
from simulator.pipelines.llm.routers import ROUTERS

SMALL = {"workload.requests": 20, "record_spans": False}


def test_an_inline_engine_profile_over_a_catalog_entry_runs():
    res = simulator.run(None, {**SMALL, "serving.engine": {"base": "vllm-v1", "costs": {"tokenize_per_token": "2 us"}}},
                        last_mile_cost=False)
    assert res.summary["status"] == "ok"


def test_the_router_registry_and_the_config_list_agree():
    assert set(ROUTERS) == set(typing.get_args(Serving.model_fields["router"].annotation))


def test_every_dit_strategy_is_a_degree_of_the_parallel_block():
    assert set(REGISTRY) <= set(DiTParallel.model_fields)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_entry_loads_its_parts(name):
    kind = KINDS[name]
    assert callable(kind.simulate) and callable(kind.format)
    assert hasattr(kind.scenario, "model_validate") and hasattr(kind.summary, "model_validate")
    assert kind.check is None or callable(kind.check)


def test_a_summary_metric_must_be_declared(monkeypatch):
    build = llm_metrics.build_result

    def with_extra(*args, **kwargs):
        result = build(*args, **kwargs)
        result.summary["undeclared_metric"] = 1.0
        return result

    monkeypatch.setattr("simulator.pipelines.llm.serving.build_result", with_extra)
    with pytest.raises(pydantic.ValidationError, match="undeclared_metric"):
        simulator.run(None, SMALL, last_mile_cost=False)
