"""Two requests, constant latencies, scripted (replayed) acceptance: exact event times."""

import pandas as pd
import pytest
from conftest import scenario

from sim import simulate


def write_inputs(tmp_path):
    (tmp_path / "trace.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 10:00:00.000,10,4\n"
        "2023-11-16 10:00:00.005,10,3\n"
    )
    # request 0: 4 output tokens; at position 1 the next 2 drafted tokens agree.
    # request 1: 3 output tokens; nothing agrees at position 1, 5 agree at position 2.
    rows = [(0, 0, 1), (0, 1, 2), (0, 2, 1), (0, 3, 0), (1, 0, 0), (1, 1, 0), (1, 2, 5)]
    pd.DataFrame(rows, columns=["request_id", "position", "run_length"]).to_csv(
        tmp_path / "positions.csv", index=False
    )


def two_request_scenario(tmp_path, deployment: dict):
    """The two requests of :func:`write_inputs` on constant latencies (target 0.01 s, drafter
    step 0.001 s, prefill 0.02 s) with their scripted acceptance."""
    write_inputs(tmp_path)
    return scenario(
        {
            "deployment": {"max_batch": 2, **deployment},
            "latency": {
                "backend": "constant",
                "constant_target_s": 0.01,
                "constant_drafter_s": 0.001,
                "constant_prefill_s": 0.02,
            },
            "workload": {"arrival": "trace", "trace_path": "trace.csv"},
            "acceptance": {"model": "replay", "replay_path": "positions.csv"},
        },
        base=tmp_path,
    )


def check_scripted_requests(r, b_first_token_s: float, b_finish_s: float, b_ttft_s: float) -> None:
    """The request times of :func:`write_inputs` (``r`` indexed by request id): A's first token
    after its prefill at 0.02 and its end with its one round at 0.052, the scheduler-dependent
    times of B as given."""
    assert r.loc[0, "first_token_s"] == pytest.approx(0.02, abs=1e-12)
    assert r.loc[1, "first_token_s"] == pytest.approx(b_first_token_s, abs=1e-12)
    assert r.loc[0, "finish_s"] == pytest.approx(0.052, abs=1e-12)
    assert r.loc[1, "finish_s"] == pytest.approx(b_finish_s, abs=1e-12)
    assert r.loc[1, "ttft_s"] == pytest.approx(b_ttft_s, abs=1e-12)
    assert r.loc[0, "tpot_s"] == pytest.approx(0.032 / 3, abs=1e-12)


def check_scripted_rounds(res, now_s: list[float]) -> None:
    """What every scheduler gives the scripted acceptance of :func:`write_inputs`: A's one
    round, B's two (ending at ``now_s``), 2 draft steps each, and the run's summary (the run
    ends with B's last round, the one GPU busy throughout)."""
    rd = res.rounds
    assert list(rd["request_id"]) == [0, 1, 1]
    assert list(rd["accepted"]) == [2, 0, 2]
    assert list(rd["emitted"]) == [3, 1, 1]
    assert list(rd["now_s"]) == pytest.approx(now_s)
    assert list(rd["draft_s"]) == pytest.approx([0.002, 0.002, 0.002])
    assert list(rd["context_tokens"]) == [11, 11, 12]
    s = res.summary
    assert s["output_tokens"] == 7 and s["sim_time_s"] == pytest.approx(now_s[-1])
    assert s["gpu_busy_fraction"] == pytest.approx(1.0)
    assert s["mean_accepted_length"] == pytest.approx(1 + 4 / 3)


def test_exact_event_times(tmp_path):
    """The prefill-first scheduler (a whole prefill pass while the batch waits)."""
    scn = two_request_scenario(tmp_path, {"scheduler": "prefill-first"})
    res = simulate(scn, "fixed", {"k": 2}, trace=True, baseline=False)
    r = res.requests.set_index("request_id")
    # t=0 A arrives, prefill [0, 0.02]; B (t=0.005) prefill [0.02, 0.04];
    # round 1 [0.04, 0.052] = 2 draft steps x 0.001 + verify 0.01: A accepts 2 -> 3 tokens, done;
    # B accepts 0 -> 1 token; round 2 [0.052, 0.064]: B accepts 2 but needs only 1 more token.
    check_scripted_requests(r, b_first_token_s=0.04, b_finish_s=0.064, b_ttft_s=0.035)
    assert list(r["output_tokens"]) == [4, 3] and list(r["emitted_tokens"]) == [4, 3]
    # busy: prefills 0.04 + rounds 0.024 over 0.064 s on one GPU
    check_scripted_rounds(res, [0.052, 0.052, 0.064])
    s = res.summary
    # a = sum(n) / (sum(n) + rejected rounds) = 4 / (4 + 1)
    assert s["acceptance_rate"] == pytest.approx(0.8)
    assert s["vpr"] == pytest.approx(4 / 6)
    # DU: drafted tokens in the output: 2 + 0 + 1 (the last round's emission is capped)
    assert s["du"] == pytest.approx(3 / 6)


def test_exact_event_times_chunked(tmp_path):
    """The chunked scheduler: B's prompt rides in A's first round. With the constant backend a
    step costs the target forward (0.01) when it has decode rows, plus the prefill (0.02) when
    it carries prompt chunks; the drafter's first step carries the chunks at no extra cost
    (constant drafter prefill 0)."""
    scn = two_request_scenario(tmp_path, {})
    assert scn.deployment.scheduler == "chunked"  # the default
    res = simulate(scn, "fixed", {"k": 2}, trace=True, baseline=False)
    r = res.requests.set_index("request_id")
    # t=0 A arrives: a prefill-only step [0, 0.02] (A's 10 tokens < the 2048-token budget);
    # B arrives at 0.005 and waits for the next step. Step 2 [0.02, 0.052]: A's round
    # (2 draft steps x 0.001) with B's whole prompt as a chunk (verify 0.01 + prefill 0.02):
    # A accepts 2 -> 3 tokens, done at 0.052; B's first token at 0.052.
    # Step 3 [0.052, 0.064]: B accepts 0 -> 1 token; step 4 [0.064, 0.076]: B accepts 2 but
    # needs only 1 more token.
    check_scripted_requests(r, b_first_token_s=0.052, b_finish_s=0.076, b_ttft_s=0.047)
    assert list(r["emitted_tokens"]) == [4, 3]
    # busy: prefill 0.02 + steps 0.032 + 0.012 + 0.012 over 0.076 s on one GPU
    check_scripted_rounds(res, [0.052, 0.064, 0.076])
    # A's verify pass carried B's chunk: 0.01 + 0.02
    assert list(res.rounds["verify_s"]) == pytest.approx([0.03, 0.01, 0.01])
    s = res.summary
    assert s["preemptions"] == 0 and s["recomputed_tokens"] == 0
