"""The ideal shared-queue server of benchmarks/long_context_trace.py: exact event times."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "long_context_trace.py"
_spec = importlib.util.spec_from_file_location("long_context_trace", _PATH)
lct = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lct)
ideal_ttft = lct.ideal_ttft


def test_one_server_fcfs_queues_a_burst_in_arrival_order():
    # three arrive together: each waits for the ones before it
    ttft = ideal_ttft(np.array([0.0, 0.0, 0.0]), np.array([3.0, 1.0, 2.0]), 1)
    assert ttft.tolist() == [3.0, 4.0, 6.0]


def test_one_server_shortest_first_serves_the_waiting_shortest():
    # the first starts at once (nothing waits); then 1 s before 2 s
    ttft = ideal_ttft(np.array([0.0, 0.5, 0.5]), np.array([3.0, 2.0, 1.0]), 1, "shortest-first")
    assert ttft.tolist() == [3.0, 5.5, 3.5]


def test_two_servers_share_the_queue_and_idle_until_arrivals():
    arr = np.array([0.0, 0.0, 0.0, 10.0])
    ttft = ideal_ttft(arr, np.array([4.0, 1.0, 1.0, 1.0]), 2)
    # 0 and 1 start at 0; 2 takes the server that frees at 1; 3 finds both idle
    assert ttft.tolist() == [4.0, 1.0, 2.0, 1.0]


def test_no_waiting_when_arrivals_are_spaced():
    arr = np.arange(5) * 10.0
    svc = np.full(5, 2.5)
    assert ideal_ttft(arr, svc, 1).tolist() == svc.tolist()


def test_more_servers_never_slower_and_each_ttft_at_least_its_service():
    rng = np.random.default_rng(0)
    arr, svc = np.sort(rng.exponential(1.0, 200).cumsum()), rng.exponential(1.5, 200)
    one, two = ideal_ttft(arr, svc, 1), ideal_ttft(arr, svc, 2)
    assert (one >= svc - 1e-12).all() and (two >= svc - 1e-12).all()
    assert two.sum() <= one.sum()


def test_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order"):
        ideal_ttft(np.zeros(1), np.ones(1), 1, "lifo")
