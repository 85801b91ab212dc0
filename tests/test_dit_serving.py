"""DiT serving: batched passes, queue policies and step-level preemption against closed forms."""

from __future__ import annotations

import pytest

from simulator.api import simulate
from simulator.config.dit_models import DIT_POLICIES
from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.pipelines.dit import CATEGORIES, DiTModel
from simulator.pipelines.dit import run as dit_run
from simulator.pipelines.dit.queue import POLICIES
from simulator.pipelines.dit.sim import Pass
from simulator.workloads.dit_requests import Shape, shaped


def dit(**kw):
    raw = {"kind": "dit", "model": "pixart-alpha", "resolution": 512, "steps": 4, "cfg": False,
           "workload": {"requests": 2, "arrival": "all_at_once"},
           "hardware": {"gpu": "h100-sxm"}}
    raw.update(kw)
    return load_scenario(raw)


def gpu_time(ps: Pass) -> float:
    """Closed form of one pass on one GPU: text encoder, every step's task, the VAE."""
    m = ps.model
    return ps.te_time + m.sc.steps * m.task(0, ps.tokens, True).compute + ps.vae_time


def test_two_requests_batched_take_one_pass_of_the_batched_cost():
    sc = dit(serving={"max_batch": 2})
    res = simulate(sc)
    two = Pass.build(DiTModel.build(sc, 2))
    assert two.model.batch == 2
    lat = res.requests["latency_s"].to_numpy()
    last_mile = res.requests[["d2h_s", "encode_s", "deliver_s"]].sum(axis=1).to_numpy()
    assert list(res.requests["batch"]) == [2, 2]
    assert lat - last_mile == pytest.approx([gpu_time(two)] * 2, rel=1e-12)
    assert res.summary["serving"]["passes"] == 1
    # the batched pass costs more than one image's and less than two images' one after another
    one = Pass.build(DiTModel.build(sc))
    assert gpu_time(one) < gpu_time(two) < 2 * gpu_time(one)


def test_without_batching_the_second_request_queues_for_the_first_pass():
    sc = dit()
    res = simulate(sc)
    one = gpu_time(Pass.build(DiTModel.build(sc)))
    q = res.requests.sort_index()["queue_s"].to_list()
    assert q[0] == 0.0
    assert q[1] == pytest.approx(one, rel=1e-12)
    assert res.summary["serving"]["batch_max"] == 1


@pytest.mark.parametrize("serving", [{"max_batch": 3}, {"max_batch": 1},
                                     {"policy": "shortest_first", "preempt": True}])
def test_breakdown_sums_to_each_latency(serving):
    sc = dit(serving=serving, workload={"requests": 12, "arrival": "poisson", "rate": 20.0,
                                        "shapes": [{"resolution": 512}, {"resolution": 256, "steps": 2}]})
    res = simulate(sc)
    bd = res.breakdown
    assert len(bd) == 12
    assert (bd[list(CATEGORIES)].sum(axis=1) - bd["latency_s"]).abs().max() < 1e-9


def test_shapes_that_differ_never_share_a_pass():
    sc = dit(serving={"max_batch": 4}, workload={
        "requests": 8, "arrival": "all_at_once",
        "shapes": [{"resolution": 512}, {"resolution": 256}]})
    req = simulate(sc).requests
    # all eight arrive at once: one pass per shape, each holding every request of its shape
    for _, group in req.groupby("width"):
        assert list(group["batch"]) == [len(group)] * len(group)
        assert group["denoise_start_s"].nunique() == 1
    assert simulate(sc).summary["serving"]["passes"] == 2


def test_a_short_request_preempts_a_long_one_at_a_step_boundary(monkeypatch):
    """SRPT with preemption: a 256-px request arriving mid-way through a 512-px one runs next at the
    following step boundary; the long one resumes and ends one short pass later than alone."""
    base = dict(steps=8, text_encode=False, serving={"policy": "shortest_first", "preempt": True})
    long_ = Pass.build(DiTModel.build(dit(**base)))
    step = long_.model.task(0, long_.tokens, True).compute
    small = Shape(256, 256, None, 8)
    short = Pass.build(DiTModel.build(shaped(dit(**base), small)))
    # constant arrivals: request 0 at 0, request 1 two and a half steps later, and it is the small one
    monkeypatch.setattr(dit_run, "request_shapes", lambda sc, n: [Shape(512, 512, None, 8), small])
    res = simulate(dit(**base, workload={"requests": 2, "arrival": "constant", "rate": 1 / (2.5 * step)}))
    req = res.requests
    assert req.loc[0, "preemptions"] == 1 and req.loc[1, "preemptions"] == 0
    # the short one starts at the third step boundary and runs alone
    assert req.loc[1, "start_s"] == pytest.approx(3 * step, rel=1e-12)
    assert req.loc[1, "denoise_end_s"] == pytest.approx(3 * step + gpu_time(short) - short.vae_time, rel=1e-12)
    # the long one ends after its own work plus the short one's, which is what it waited
    assert req.loc[0, "vae_end_s"] == pytest.approx(gpu_time(long_) + gpu_time(short), rel=1e-12)
    assert req.loc[0, "queue_s"] == pytest.approx(gpu_time(short), rel=1e-12)


def test_fifo_never_preempts():
    sc = dit(steps=8, serving={"preempt": True}, workload={"requests": 6, "arrival": "poisson", "rate": 50.0,
                                                           "shapes": [{"resolution": 512}, {"resolution": 256}]})
    assert simulate(sc).summary["serving"]["preemptions"] == 0


def test_goodput_counts_the_requests_within_the_slo():
    sc = dit(workload={"requests": 4, "arrival": "all_at_once"})
    lat = sorted(simulate(sc).requests["latency_s"])
    cut = (lat[1] + lat[2]) / 2
    g = simulate(dit(workload={"requests": 4, "arrival": "all_at_once"}, slo={"latency": cut})).summary["goodput"]
    assert g["slo_attainment"] == 0.5 and g["slo"] == {"latency_s": cut}


def test_the_policies_named_in_the_config_are_the_ones_implemented():
    assert set(DIT_POLICIES) == set(POLICIES)


@pytest.mark.parametrize("override, path", [
    ({"serving": {"preempt": True}, "parallel": {"pipefusion": 2}}, "serving.preempt"),
    ({"serving": {"policy": "lifo"}}, "serving.policy"),
    ({"serving": {"max_batch": 0}}, "serving.max_batch"),
    ({"workload": {"requests": 2, "arrival": "all_at_once", "shapes": [{"resolution": 500}]}},
     "workload.shapes.0.resolution"),
    ({"workload": {"requests": 2, "arrival": "all_at_once", "shapes": [{"resolution": 512, "steps": 0}]}},
     "workload.shapes.0.steps"),
    ({"frames": 81}, "frames"),
    ({"slo": {"latency": 0}}, "slo.latency"),
])
def test_bad_serving_settings_name_their_key(override, path):
    with pytest.raises(ConfigError) as exc:
        dit(**override)
    assert exc.value.path == path


def test_a_dit_trace_sets_each_requests_arrival_and_shape(tmp_path):
    trace = tmp_path / "images.csv"
    trace.write_text("height,arrived_at,width,steps\n512,0,512,4\n256,0.25,256,2\n512,0.5,512,4\n")
    res = simulate(dit(workload={"requests": 3, "arrival": "trace", "trace": str(trace), "trace_time_scale": 2.0}))
    req = res.requests.sort_index()
    assert list(req["arrival_s"]) == [0.0, 0.5, 1.0]
    assert list(req["width"]) == [512, 256, 512] and list(req["steps"]) == [4, 2, 4]
    assert res.summary["serving"]["shapes"] == 2


@pytest.mark.parametrize("text, words", [
    ("arrived_at,width\n0,512\n", "lacks column(s) height"),
    ("arrived_at,width,height\n0,512,500\n", "row 2: resolution 512x500 must be a multiple of 16"),
    ("arrived_at,width,height\n0,512,512\n1,512,0\n", "row 3: height must be a whole number"),
    ("arrived_at,width,height\n1,512,512\n0,512,512\n", "row 3: arrived_at must be non-negative and non-decreasing"),
    ("arrived_at,width,height,steps\n0,512,512,x\n", "row 2: steps = 'x' is not a number"),
])
def test_a_bad_dit_trace_names_its_row(tmp_path, text, words):
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    with pytest.raises(ConfigError) as exc:
        dit(workload={"requests": 1, "arrival": "trace", "trace": str(trace)})
    assert exc.value.path == "workload.trace" and words in exc.value.message


def test_a_dit_trace_needs_enough_rows_and_no_shapes_beside_it(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,width,height\n0,512,512\n")
    with pytest.raises(ConfigError) as exc:
        dit(workload={"requests": 2, "arrival": "trace", "trace": str(trace)})
    assert exc.value.path == "workload.requests"
    with pytest.raises(ConfigError) as exc:
        dit(workload={"requests": 1, "arrival": "trace", "trace": str(trace), "shapes": [{"resolution": 512}]})
    assert exc.value.path == "workload.shapes"
