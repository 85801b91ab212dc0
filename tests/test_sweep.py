"""Sweeps: parallel == serial == Dask, bad grid keys fail up front, infeasible points become rows."""

from __future__ import annotations

import pandas as pd
import pytest

import simulator
from simulator.commands.sweep import parse_grid
from simulator.errors import ConfigError

BASE = {"workload.arrival": "closed", "workload.requests": 24, "workload.prompt_tokens": 256,
        "workload.output_tokens": 32, "record_spans": False}
GRID = {"workload.concurrency": [1, 2, 4, 8, 16], "serving.detokenizer": ["engine", "separate"],
        "serving.overlap": ["sync", "async"]}
DIT = "scenarios/dit/flux-1024-h100-single.yaml"


@pytest.fixture(scope="module")
def serial() -> pd.DataFrame:
    return simulator.sweep(None, GRID, overrides=BASE, workers=1, progress=False)


def test_twenty_points_one_row_each(serial):
    assert len(serial) == 20
    assert list(serial.columns[:5]) == [*GRID, "seed", "status"]
    assert (serial["status"] == "ok").all()
    assert {"ttft_ms.p50", "itl_ms.p99", "breakdown_share.detokenize", "itl_last_mile_share"} <= set(serial.columns)
    # the last grid key varies fastest, like itertools.product
    assert list(serial["serving.overlap"][:2]) == ["sync", "async"]
    assert list(serial["workload.concurrency"][::4]) == [1, 2, 4, 8, 16]


def test_parallel_equals_serial(serial):
    parallel = simulator.sweep(None, GRID, overrides=BASE, workers=2, progress=False)
    pd.testing.assert_frame_equal(parallel, serial)


def test_dask_local_cluster_equals_serial(serial):
    from dask import distributed  # the [dev] extra installs it: missing is a failure, not a skip
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        on_dask = simulator.sweep(None, GRID, overrides=BASE, client=client, progress=False)
    pd.testing.assert_frame_equal(on_dask, serial)


def test_seeds_add_rows_and_differ():
    random_lengths = {"workload.requests": 16, "workload.arrival": "poisson", "record_spans": False}
    df = simulator.sweep(None, {"serving.overlap": ["async"]}, seeds=2, overrides={**random_lengths, "seed": 7},
                         workers=1, progress=False)
    assert list(df["seed"]) == [7, 8]
    assert df["ttft_ms.p50"].iloc[0] != df["ttft_ms.p50"].iloc[1]


def test_unknown_grid_key_fails_up_front_with_suggestion():
    with pytest.raises(ConfigError, match=r"serving.overlapp: unknown key 'overlapp' \(did you mean 'overlap'\?\)"):
        simulator.sweep(None, {"serving.overlapp": ["sync", "async"]}, overrides=BASE, progress=False)


def test_bad_grid_value_fails_up_front():
    with pytest.raises(ConfigError, match="serving.overlap: 'asink' is not allowed"):
        simulator.sweep(None, {"serving.overlap": ["sync", "asink"]}, overrides={**BASE, "workload.concurrency": 4}, progress=False)
    with pytest.raises(ConfigError, match="unknown unit"):
        simulator.sweep(None, {"workload.rate": ["4/s", "4 parsecs"]}, progress=False,
                        overrides={"workload.requests": 4})


def test_cli_bad_grid_key_exits_2(capsys):
    from simulator.cli import main

    assert main(["sweep", "--grid", "serving.overlapp=sync,async", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'overlap'" in err[0]


def test_a_grid_value_no_point_can_take_is_the_load_error():
    # tp=3 never divides the 32 heads: known from the scenario alone, so rejected at load time
    with pytest.raises(ConfigError, match="parallel.tp: tp=3 does not divide the 32 attention heads"):
        simulator.sweep(None, {"parallel.tp": [1, 3]}, overrides={**BASE, "workload.concurrency": 4},
                        workers=1, progress=False)


def test_infeasible_combinations_are_rows():
    # tp=8 suits llama-3-8b (8 KV heads) but not as 8 GPUs x pp=8 on an 8-GPU node: only the combination fails
    df = simulator.sweep(None, {"parallel.tp": [1, 8], "parallel.pp": [1, 8]},
                         overrides={**BASE, "workload.concurrency": 4}, workers=1, progress=False)
    assert list(df["status"][:3]) == ["ok", "ok", "ok"]
    assert df["status"].iloc[3].startswith("error: hardware.node_link: a replica needs 64 GPUs")
    assert pd.isna(df["ttft_ms.p50"].iloc[3])


def test_oom_point_is_a_row():
    df = simulator.sweep(DIT, {"resolution": [1024, 4096]}, overrides={"hardware.gpu": "l40", "steps": 2,
                                                                       "workload.requests": 1},
                         workers=2, progress=False)
    assert list(df["status"]) == ["ok", "oom"]
    assert df["memory_needed_gib"].iloc[1] > 48


def test_parse_grid_reads_yaml_values():
    assert parse_grid("workload.concurrency=1,8,64") == ("workload.concurrency", [1, 8, 64])
    assert parse_grid("serving.overlap=sync,async") == ("serving.overlap", ["sync", "async"])
    with pytest.raises(ConfigError):
        parse_grid("workload.concurrency")


def test_an_llm_layout_that_does_not_fit_is_an_oom_row_like_a_dit_one():
    df = simulator.sweep(None, {"parallel.tp": [1, 4]}, overrides={**BASE, "model": "llama-3-70b",
                                                                  "workload.concurrency": 4},
                         workers=1, progress=False)
    assert list(df["status"]) == ["oom", "ok"]
    assert df["memory_key"].iloc[0] == "hardware.gpu.memory"
    assert df["memory_per_gpu_gib.weights_gib"].iloc[0] > 100
    r = simulator.run(None, {"model": "llama-3-70b"})
    assert r.summary["status"] == "oom" and r.summary["requests_completed"] == 0
    assert r.summary["message"].startswith("llama-3-70b does not fit")
