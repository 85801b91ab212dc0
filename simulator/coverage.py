"""Which validation families cover a scenario, and the caveat a run gets when one of them misses its target.

A family's metric covers a set-up when one of the cases it summarises simulates the same kind of
scenario with the same model on the same GPU (and, for LLM serving, the same engine profile): the
figures it checks were computed through the same cost model, host path and hardware as the run's. The families' misses and
the set-ups they cover are committed in ``simulator/data/fidelity.json``, written by ``lastmile
validate --write-fidelity`` with the README's fidelity table (a test keeps the two in step), so a
run reads them without re-running the suite.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

SHOWN = 2
"""Missed metrics a caveat names (the rest counted), so it stays one short line."""

FIDELITY = "fidelity.json"
"""The committed status, in the package's ``data`` folder."""


def signature(scenario) -> list[str]:
    """What a family must share with a run to cover it: kind, model, GPU, and an LLM's engine profile."""
    model = getattr(scenario, "model", None)
    name = model.get("name") if isinstance(model, dict) else getattr(model, "name", None)
    gpu = getattr(getattr(getattr(scenario, "hardware", None), "gpu", None), "name", None)
    out = [scenario.kind, str(name), str(gpu)]
    if scenario.kind == "llm":
        engine = scenario.serving.engine
        out.append(str(getattr(engine, "name", engine)))
    return out


def status_document(summary_rows: list[dict], rows: list[dict], case_setups: dict) -> dict:
    """The committed status: per family, each metric that misses its target, with its median |error|
    and the set-ups of the cases whose rows it summarises.

    ``summary_rows``: :func:`simulator.validate.summarize`'s records; ``rows``: the table's records
    (family, case, metric); ``case_setups``: (family, case) -> :func:`signature`."""
    setups: dict[tuple[str, str], list[list[str]]] = {}
    for r in rows:
        sig = case_setups.get((r["family"], r["case"]))
        got = setups.setdefault((r["family"], r["metric"]), [])
        if sig is not None and sig not in got:
            got.append(sig)
    families: dict[str, list[dict]] = {}
    for r in summary_rows:
        misses = families.setdefault(r["family"], [])
        if not r["meets_target"]:
            misses.append({"metric": r["metric"], "median_abs_pct": round(float(r["median_abs_pct"]), 1),
                           "covers": sorted(setups.get((r["family"], r["metric"]), []))})
    return {"families": {name: {"misses": misses} for name, misses in sorted(families.items())}}


@lru_cache(maxsize=1)
def committed() -> dict:
    """The status committed with the package (empty if it is missing)."""
    try:
        return json.loads(resources.files("simulator").joinpath("data", FIDELITY).read_text(encoding="utf-8"))
    except (FileNotFoundError, OSError, json.JSONDecodeError):
        return {"families": {}}


def caveat(scenario, status: dict | None = None) -> str | None:
    """One line naming the families that cover ``scenario`` and miss a target (None: none does)."""
    sig = signature(scenario)
    misses = []
    for name, fam in (status or committed())["families"].items():
        misses += [f"{name} {m['metric']} ({m['median_abs_pct']:.1f}% median |error|)"
                   for m in fam["misses"] if sig in m["covers"]]
    if not misses:
        return None
    what = "model, GPU and engine" if scenario.kind == "llm" else "model and GPU"
    shown = ", ".join(misses[:SHOWN]) + (f" and {len(misses) - SHOWN} more" if len(misses) > SHOWN else "")
    return f"validation cases of this {what} miss their targets: {shown} (README, Fidelity)"
