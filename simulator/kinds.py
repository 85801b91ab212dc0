"""The one registry of scenario kinds: each kind names its scenario model, its model catalogs, its
feasibility check, its simulate function, its summary type and its text formatter.

Adding a kind touches this table only. Entries name their parts by dotted path and are imported
on first use, so the registry sits below every layer (it imports none of them) and a run loads
only its own kind's modules — the same late binding that entry points give plugins.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Kind:
    """One scenario kind. Each ``*_at`` field is ``"module:attribute"`` under ``simulator``."""

    name: str
    scenario_at: str
    """The pydantic model a scenario of this kind validates against."""
    simulate_at: str
    """``simulate(scenario) -> Result``."""
    summary_at: str
    """The typed summary (a pydantic model) every run's ``summary.json`` validates against."""
    format_at: str
    """``format(result) -> str``: the text ``lastmile run`` prints."""
    catalogs: tuple[str, ...]
    """Catalog sections ``model: NAME`` is looked up in, in order."""
    default_model: str | None = None
    check_at: str | None = None
    """``check(scenario)``: what can be known before simulating; raises ConfigError."""
    counterfactual_at: str | None = None
    """A module (not ``module:attribute``) with ``counterfactual_of(scenario)``, the scenario simulated
    beside a run for the last mile's cost (None: none), and ``add_last_mile_cost(result, summary)``,
    which adds the difference to the run's summary (kinds without one have no such block)."""

    def _load(self, where: str) -> Any:
        module, _, attr = where.partition(":")
        return getattr(importlib.import_module(f"simulator.{module}"), attr)

    @property
    def scenario(self) -> type:
        return self._load(self.scenario_at)

    @property
    def simulate(self) -> Callable:
        return self._load(self.simulate_at)

    @property
    def summary(self) -> type:
        return self._load(self.summary_at)

    @property
    def format(self) -> Callable:
        return self._load(self.format_at)

    @property
    def check(self) -> Callable | None:
        return self._load(self.check_at) if self.check_at else None

    @property
    def counterfactual(self) -> tuple[Callable, Callable] | None:
        """(the counterfactual of a scenario, how its summary is added to the run's), or None."""
        if not self.counterfactual_at:
            return None
        where = self.counterfactual_at
        return self._load(f"{where}:counterfactual_of"), self._load(f"{where}:add_last_mile_cost")


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("llm", scenario_at="config.models:LLMScenario", simulate_at="pipelines.llm.serving:simulate",
         summary_at="observe.summaries:LLMSummary", format_at="report.text:format_llm",
         catalogs=("llms",), default_model="llama-3-8b", check_at="pipelines.llm.pools:check_parallel",
         counterfactual_at="pipelines.llm.counterfactual"),
    Kind("dit", scenario_at="config.dit_models:DiTScenario", simulate_at="pipelines.dit:simulate",
         summary_at="observe.summaries:DiTSummary", format_at="report.dit_text:format_dit",
         catalogs=("dits",)),
    Kind("token_pipeline", scenario_at="config.dit_models:TokenPipelineScenario",
         simulate_at="pipelines.token_pipeline:simulate", summary_at="observe.summaries:TokenPipelineSummary",
         format_at="report.dit_text:format_token", catalogs=("llms", "dits")),
    Kind("pipeline", scenario_at="config.pipeline_models:PipelineScenario",
         simulate_at="pipelines.request_graph:simulate", summary_at="observe.summaries:PipelineSummary",
         format_at="report.pipeline_text:format_pipeline", catalogs=("llms",),
         check_at="pipelines.request_graph.sim:check"),
)}
"""Every kind a scenario's ``kind:`` may name; ``llm`` when it names none."""

DEFAULT_KIND = "llm"
