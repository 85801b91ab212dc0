"""Parameter sweeps: run the cross product of a grid of scenario overrides, one tidy row per point and seed.

Points run in parallel on the local cores (a process pool) or on a Dask cluster; each point is
a deterministic simulation, so the DataFrame does not depend on where or in which order the
points ran. Every point's scenario is validated before anything runs, so a mistyped grid key or
value fails at once with the loader's one-line error instead of after an hour of simulation.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed as as_completed_futures
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from .api import load_scenario
from .config.loader import load_raw
from .errors import ConfigError, LastmileError
from .progress import Progress

#: Sweeps run from the API show a bar from this many runs when ``progress`` is left to decide.
PROGRESS_MIN_RUNS = 16


def grid_points(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None) -> list[dict]:
    """The points of a grid: the cross product of a mapping's axes in key order (the last key varies
    fastest), or a sequence of override dicts taken as they are (for axes that vary together)."""
    if grid is not None and not isinstance(grid, Mapping):
        if not all(isinstance(p, Mapping) for p in grid):
            raise ConfigError("a list of grid points must hold mappings of key -> value")
        return [dict(p) for p in grid] or [{}]
    grid = dict(grid or {})
    for key, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ConfigError(f"a grid axis needs a list of values, got {values!r}", path=key)
    keys = list(grid)
    axes = [list(grid[k]) for k in keys]
    for key, values in zip(keys, axes):
        if not values:
            raise ConfigError("a grid axis needs at least one value", path=key)
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def _flatten(summary: Mapping, prefix: str = "") -> dict:
    """Nested summary dict -> flat ``{"ttft_ms.p50": ...}``; lists become JSON strings."""
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def run_point(scenario, last_mile_cost: bool = False) -> dict:
    """Simulate one validated scenario; returns its row (status + flattened summary).

    A ConfigError raised by the simulation (an infeasible combination, such as a TP degree that
    does not divide the heads) becomes ``status = "error: <message>"`` rather than an exception.
    """
    from .api import simulate

    try:
        result = simulate(scenario, last_mile_cost)
    except ConfigError as exc:
        where = f"{exc.path}: " if exc.path else ""
        return {"status": f"error: {where}{exc.message}"}
    row = _flatten(result.summary)
    row["status"] = result.summary.get("status", "ok")
    return row


def _validate(scenario, overrides: Mapping, jobs: list[dict]) -> list:
    """Load every run's scenario up front; a bad grid key or value raises, infeasible points are kept.

    A (key, value) pair whose every point fails to load is the user's mistake (unknown key,
    wrong unit, impossible value for this scenario) and raises the loader's error. A failure
    confined to some combinations is an infeasible point and becomes an error row.
    """
    loaded: list = []
    for job in jobs:
        try:
            loaded.append(load_scenario(scenario, {**overrides, **job["overrides"]}))
        except ConfigError as exc:
            loaded.append(exc)
    failed = [isinstance(x, ConfigError) for x in loaded]
    if all(failed):
        raise loaded[0]
    keys = dict.fromkeys(k for job in jobs for k in job["point"])
    for key in keys:
        by_value: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            if key in job["point"]:
                by_value.setdefault(repr(job["point"][key]), []).append(i)
        for idxs in by_value.values():
            if all(failed[i] for i in idxs):
                raise loaded[idxs[0]]
    return loaded


def _progress_bar(total: int, progress: bool | None) -> Progress:
    """Progress over the sweep's runs: from the command line always (unless -q), from the API only on
    long interactive sweeps unless ``progress`` says otherwise."""
    return Progress(total, "sweep", "runs", enabled=progress, min_total=PROGRESS_MIN_RUNS)


def connect(address: str):
    """A Dask distributed client for ``tcp://HOST:PORT``; a clear error if the extra is missing."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise LastmileError("running on a cluster needs Dask: pip install 'lastmile-sim[cluster]'") from None
    try:
        return Client(address, timeout="10s")
    except (OSError, ValueError, TypeError) as exc:  # unreachable, or not an address Dask can parse
        raise LastmileError(f"cannot reach the Dask scheduler at {address}: {str(exc).splitlines()[0]}") from None


def completed(point, items: list, client=None, workers: int | None = None):
    """``(index, point(item))`` for each of ``items`` as it completes: on a Dask cluster (``client``), in
    ``workers`` local processes (default: all cores), or in this process where one worker or one item
    suffices. What a sweep gathers in order and a plan records as it comes."""
    if not items:
        return
    if client is not None:
        try:
            from dask.distributed import as_completed
        except ImportError:
            raise LastmileError("running on a cluster needs Dask: pip install 'lastmile-sim[cluster]'") from None
        futures = client.map(point, items, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures):
            yield index[fut.key], fut.result()
        return
    workers = min(workers or os.cpu_count() or 1, len(items))
    if workers <= 1:
        for i, item in enumerate(items):
            yield i, point(item)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        index = {pool.submit(point, item): i for i, item in enumerate(items)}
        for fut in as_completed_futures(index):
            yield index[fut], fut.result()


def sweep(scenario: str | Path | Mapping | None,
          grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
          seeds: int = 1, client=None, workers: int | None = None, progress: bool | None = None,
          overrides: Mapping[str, Any] | None = None, last_mile_cost: bool = False) -> pd.DataFrame:
    """Run the cross product of ``grid`` (dotted scenario keys -> values) for ``seeds`` seeds.

    ``grid`` may instead be a list of override dicts, run as given (axes that vary together).

    Returns one row per point and seed, in grid order: the grid values, ``seed``, ``status``
    (``ok``, ``oom`` or ``error: <message>``) and every summary metric flattened
    (``ttft_ms.p50``, ``breakdown_share.detokenize``, ...). ``overrides`` apply to every point;
    seed i uses the scenario's seed + i. ``last_mile_cost`` adds each LLM point's counterfactual with
    the last mile free (``last_mile_cost.*`` columns; twice the work). ``client`` (a ``dask.distributed.Client``) runs the
    points on a cluster; otherwise ``workers`` local processes (default: all cores).
    """
    if seeds < 1:
        raise ConfigError(f"seeds must be at least 1, got {seeds}")
    overrides = dict(overrides or {})
    base_seed = int(overrides.get("seed", load_raw(scenario)[0].get("seed", 0)))
    jobs = [{"point": point, "seed": base_seed + s, "overrides": {**point, "seed": base_seed + s}}
            for point in grid_points(grid) for s in range(seeds)]
    loaded = _validate(scenario, overrides, jobs)
    runnable = [sc for sc in loaded if not isinstance(sc, ConfigError)]
    bar = _progress_bar(len(runnable), progress)
    point = functools.partial(run_point, last_mile_cost=True) if last_mile_cost else run_point
    results = [None] * len(runnable)
    try:
        for i, row in completed(point, runnable, client, workers):
            results[i] = row
            bar.update(1)
    finally:
        bar.close()
    results = iter(results)
    rows = []
    for job, sc in zip(jobs, loaded):
        if isinstance(sc, ConfigError):
            where = f"{sc.path}: " if sc.path else ""
            body = {"status": f"error: {where}{sc.message}"}
        else:
            body = next(results)
        row = {**job["point"], "seed": job["seed"], "status": body["status"]}
        row.update({k: v for k, v in body.items() if k not in row})
        rows.append(row)
    return pd.DataFrame(rows)
