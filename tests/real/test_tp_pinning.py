"""``real.tp.pin_cores``: each local rank of a CPU TP group on its own, disjoint block of cores."""

import os

import pytest

from real.tp import pin_cores

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="the platform cannot pin processes"
)


@pytest.fixture
def cores():
    before = os.sched_getaffinity(0)
    yield sorted(before)
    os.sched_setaffinity(0, before)  # the test process gets all its cores back


def test_each_local_rank_gets_its_own_block_and_the_blocks_are_disjoint(cores):
    n = len(cores)
    blocks = []
    for r in range(n):
        blocks.append(pin_cores(r, n))
        assert os.sched_getaffinity(0) == blocks[-1]
        os.sched_setaffinity(0, set(cores))
    assert blocks == [{c} for c in cores]  # one core each, in order, none shared
    assert pin_cores(0, 1) == set(cores)  # one rank: every core


def test_more_ranks_than_cores_pins_nothing(cores):
    assert pin_cores(0, len(cores) + 1) is None
    assert os.sched_getaffinity(0) == set(cores)
