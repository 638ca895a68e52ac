"""The simulator mirroring the engine, replaying recorded greedy position traces with the measured
latency table, reproduces the engine's rounds exactly (k, drafted, accepted, emitted, context),
for every engine controller whose decisions do not read time — so only latency modelling can
contribute error. (The default goodput ``dspark`` chooses k from costs it measures, so its rounds
follow the latency model too: it is replayed under its seed policy here.)"""

import numpy as np
import pytest

from control.configio import to_dict
from control.registry import make_config, make_controller
from real.profile import profile, round_overhead_s
from real.tracing import PromptSetConfig, make_prompts, record_positions_full, run_requests
from tests.validate.conftest import ECFG, PCFG
from validate.metrics import compute, real_metrics
from validate.mirror import predict, write_scenario

NEW = 24
CONTROLLERS = {
    "fixed": {"k": 3},
    "hf-heuristic": {"k_max": 6},
    "dspark": {"policy": "seed"},
    "confidence-stop": {"tau": 0.5, "k_max": 6},
    "ema-hysteresis": None,
}


@pytest.fixture(scope="module")
def setup(engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    lat, _ = profile(engine, PCFG)
    lat.to_csv(d / "latency.csv", index=False)
    ps = make_prompts(
        PromptSetConfig(
            workload="random",
            n_prompts=3,
            prompt_tokens_min=5,
            prompt_tokens_max=14,
            max_new_tokens=NEW,
            seed=4,
        ),
        vocab_size=64,
    )
    pos = [record_positions_full(engine, p, NEW, request_id=i)[0] for i, p in enumerate(ps)]
    return d, lat, ps, pos


@pytest.mark.parametrize("name", list(CONTROLLERS))
def test_sim_replays_engine_rounds_exactly(engine, setup, name):
    d, lat, ps, pos = setup
    cfg = make_config(name, CONTROLLERS[name])
    recs, reqs = run_requests(engine, ps, NEW, lambda: make_controller(name, cfg), name)
    scn = write_scenario(
        d / name,
        name,
        d / "latency.csv",
        round_overhead_s(lat),
        ECFG.k_max,
        [len(p) for p in ps],
        [NEW] * len(ps),
        pos,
        None,
        {name: to_dict(cfg)},
    )
    sim_m, res = predict(scn, name, cfg)
    rd = res.rounds
    assert len(rd) == len(recs)
    for rid in range(len(ps)):
        real = [
            (r.k, r.drafted, r.accepted, r.emitted, r.context_tokens)
            for r in recs
            if r.request_id == rid
        ]
        g = rd[rd.request_id == rid]
        sim = list(zip(g.k, g.drafted, g.accepted, g.emitted, g.context_tokens))
        assert sim == real, (name, rid)
    assert any(r.accepted < r.drafted for r in recs)  # rejections were exercised
    real_m = real_metrics(recs, reqs)
    for m in ("mean_accepted_length", "acceptance_rate"):
        assert sim_m[m] == pytest.approx(real_m[m], rel=1e-12)
    # the simulated time of each round is the table's draft steps + verify + overhead
    ov = round_overhead_s(lat)
    req = res.requests.sort_values("finish_s")
    fin = req.finish_s.to_numpy()
    prefill = (req.first_token_s.to_numpy() - np.concatenate([[0.0], fin[:-1]])).sum()
    assert fin[-1] == pytest.approx(
        prefill + rd.draft_s.sum() + rd.verify_s.sum() + ov * len(rd), rel=1e-9
    )
    # draft time = one table drafter step per drafted token (no τ stop here) or per step taken
    tab_step = lat[(lat.model == "drafter") & (lat.new_tokens == 1)]
    assert ov > 0 and len(tab_step) == 3


def test_compute_matches_hand_values():
    m = compute(
        accepted=[2, 0, 3],
        drafted=[3, 3, 3],
        tokens=[4, 3],
        request_s=[1.0, 0.75],
        decode_s=[0.8, 0.6],
    )
    assert m["mean_accepted_length"] == pytest.approx(1 + 5 / 3)
    assert m["acceptance_rate"] == pytest.approx(5 / (5 + 2))
    assert m["throughput_tokens_per_s"] == pytest.approx(7 / 1.75)
    assert m["tpot_p50_s"] == pytest.approx(0.2)
