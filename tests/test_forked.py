"""Work in a forked child (``simulator.forked``): the last-mile counterfactual on a second core gives
the figures the serial run gives, and a child that fails leaves the parent to do the work itself."""

import os
import threading

import pytest

import simulator
from simulator import api, forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _double(x):
    return 2 * x


def _fail():
    raise ValueError("no such thing")


def test_a_child_returns_what_its_call_returned_or_says_what_it_raised():
    child = forked.start(_double, 21, parallel=False)
    assert child is not None and child.join() == 42
    child = forked.start(_fail, parallel=False)
    with pytest.raises(forked.ChildFailed, match="ValueError: no such thing"):
        child.join()


def test_a_child_given_up_is_ended():
    child = forked.start(threading.Event().wait, parallel=False)  # would wait for ever
    pid = child.pid
    child.stop()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    child.stop()  # once is enough


def test_no_child_where_another_thread_runs():
    """Forking a threaded process (a Jupyter kernel, a Dask worker) can deadlock the child."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not forked.can_fork(parallel=False)
        assert forked.start(_double, 1, parallel=False) is None
    finally:
        stop.set()
        thread.join()


SMALL = {"workload.requests": 30, "serving.engine": "vllm-v1"}


def test_the_counterfactual_in_a_child_gives_the_serial_figures(monkeypatch):
    monkeypatch.setattr(forked, "cores", lambda: 2)
    started = []
    start = forked.start
    monkeypatch.setattr(forked, "start", lambda *a, **k: started.append(1) or start(*a, **k))
    sc = simulator.load_scenario(None, SMALL)
    parallel = api.simulate(sc, last_mile_cost=True, parallel=True).summary
    assert started  # (the test ran with a child)
    serial = api.simulate(sc, last_mile_cost=True, parallel=False).summary
    assert parallel["last_mile_cost"] == serial["last_mile_cost"]
    assert parallel == serial


class _Failed:
    pid = None

    def join(self):
        raise forked.ChildFailed("killed")

    def stop(self):
        pass


def test_a_failed_child_leaves_the_counterfactual_to_the_parent(monkeypatch):
    sc = simulator.load_scenario(None, SMALL)
    serial = api.simulate(sc, last_mile_cost=True, parallel=False).summary
    monkeypatch.setattr(forked, "start", lambda *a, **k: _Failed())
    assert api.simulate(sc, last_mile_cost=True, parallel=True).summary == serial
