"""The Python entry points: ``simulator.run(path_or_dict, overrides={...})``, ``load_scenario`` and
``simulate``, each dispatching on the scenario's kind through the registry (``simulator.kinds``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from . import forked, progress
from .config import loader
from .errors import ConfigError
from .kinds import KINDS

if TYPE_CHECKING:
    from .observe.result import Result


def _source_name(scenario) -> str:
    if isinstance(scenario, (str, Path)):
        return str(scenario)
    return "<default scenario>" if scenario is None else "<dict>"


def _named(exc: ConfigError, scenario) -> ConfigError:
    """The same error, naming the scenario's source where it names no file of its own."""
    return exc.moved(file=exc.file or _source_name(scenario), path=exc.path)


def load_scenario(scenario: str | Path | Mapping | None = None, overrides: Mapping[str, Any] | None = None):
    """Load and validate a scenario, then check what its kind can know before simulating.

    Every problem that the scenario alone decides (a key, a bound, a layout the model cannot take)
    is a :class:`ConfigError` here; what a layout runs into (memory) is the run's ``status``.
    """
    sc = loader.load_scenario(scenario, overrides)
    check = KINDS[sc.kind].check
    if check is not None:
        try:
            check(sc)
        except ConfigError as exc:
            raise _named(exc, scenario) from None
    return sc


def simulate(scenario, last_mile_cost: bool = False, parallel: bool = True) -> Result:
    """Run a validated scenario with its kind's pipeline; the summary is checked against the kind's type.
    With ``last_mile_cost``, a kind that has a counterfactual (LLM serving) simulates the scenario
    again with its last mile free and adds the difference (``last_mile_cost``): twice the work, done
    on a second core in a forked child where ``parallel`` and :mod:`simulator.forked` allow (the
    same figures either way)."""
    kind = KINDS[scenario.kind]
    counterfactual = kind.counterfactual if last_mile_cost else None
    other = counterfactual[0](scenario) if counterfactual is not None else None
    child = forked.start(_summary_of, kind.simulate, other) if other is not None and parallel else None
    try:
        result = kind.simulate(scenario)
        if other is not None and result.summary.get("status") != "oom":  # (a layout that did not fit ran nothing)
            counterfactual[1](result, _joined(child, kind.simulate, other))
    finally:
        if child is not None:
            child.stop()
    result.summary = kind.summary.model_validate(result.summary).model_dump(mode="json", exclude_unset=True)
    return result


def _summary_of(simulate, scenario) -> dict:
    """In a forked child: the counterfactual's summary, with nothing printed (the parent's progress speaks)."""
    progress.configure(progress.QUIET)
    return simulate(scenario).summary


def _joined(child, simulate, scenario) -> dict:
    """The counterfactual's summary: the child's, or (without a child, or where it failed) simulated
    here, so what it raises is raised as it would be without a child."""
    if child is not None:
        try:
            return child.join()
        except forked.ChildFailed:
            pass
    with progress.no_details():  # (the same deployment again: ``-v`` said what it had to say)
        return simulate(scenario).summary


def run(scenario: str | Path | Mapping | None = None, overrides: Mapping[str, Any] | None = None,
        last_mile_cost: bool = True) -> Result:
    """Load a scenario (file, dict or the built-in default), apply overrides and simulate it; an LLM
    run's summary carries ``last_mile_cost`` (the counterfactual with the last mile free, a second
    simulation) unless ``last_mile_cost=False``."""
    return run_loaded(load_scenario(scenario, overrides), scenario, last_mile_cost)


def run_loaded(sc, source: str | Path | Mapping | None = None, last_mile_cost: bool = True) -> Result:
    """Simulate a loaded scenario; an error that names no file names ``source`` (its file or dict)."""
    try:
        return simulate(sc, last_mile_cost)
    except ConfigError as exc:
        raise _named(exc, source) from None
