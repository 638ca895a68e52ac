"""The peer controllers on the batched real engine: their round planners drive continuous
batching unchanged, and greedy output stays each request's own target-only greedy output."""

import dataclasses

import pytest

from control import make_config, make_controller
from control.registry import make_planner
from real.engine import Request
from tests.real.conftest import CFG, make_engine, prompt

PEERS = ("vllm-dsd", "vllm-adaptive-k", "vllm-adaptive-verification", "sglang-adaptive")


#: timing-free configs: adaptive verification's budget would follow the engine's measured start-up
#: profile, under which a loaded CPU may find that no draft pays (no token accepted, a CI flake);
#: unseeded, it verifies every window until its own cost fit is ready, as the module says
CONFIGS = {"vllm-adaptive-verification": {"profile_prior_rounds": 0.0}}


@pytest.mark.parametrize("name", PEERS)
def test_peer_planner_on_the_batched_engine(name):
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=3))
    cfg = make_config(name, CONFIGS.get(name))
    reqs = [Request(i, prompt(40 + i), 24, make_controller(name, cfg)) for i in range(5)]
    ref = [eng.greedy_reference(r.prompt, 24) for r in reqs]
    seqs = eng.run_batch(reqs, make_planner(name, cfg))
    assert [s.tokens for s in seqs] == ref
    rounds = [r for s in seqs for r in s.records]
    assert all(r.mode == "strict" for r in rounds)
    assert any(r.batch_size > 1 for r in rounds) and any(r.accepted for r in rounds)
