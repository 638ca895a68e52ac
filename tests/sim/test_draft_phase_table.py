"""A measured table's ``draft-phase`` rows (issue 19, item 4): the simulator prices a draft phase
of k steps from them — the engine's whole propose call, whose first step and fixed cost a line
of k drafter steps does not fit — and what a catch-up feeds in the first step on top, as the
drafter rows' cost of the extra tokens. Exact event times against the table."""

import pytest
from conftest import h100_8b_scenario
from test_catchup import scripted

from sim import simulate
from sim.cluster import Cluster

STEP = 1e-3  # one drafter step of a token per row, at every batch and context
PHASE = {1: 2.5e-3, 2: 5.5e-3, 3: 7.0e-3, 4: 9.0e-3}  # a whole phase of k steps


def _table(path, phases: bool) -> None:
    """Target rows linear in the tokens per row; drafter rows: a step, and a 32-token pass."""
    lines = ["model,batch,new_tokens,context_tokens,seconds"]
    for b in (1, 2, 4):
        for c in (0, 1000):
            for n in (1, 2, 4, 8, 64):
                lines.append(f"target,{b},{n},{c},{0.01 + 1e-3 * n * b + 1e-6 * c * b}")
            lines.append(f"drafter,{b},1,{c},{STEP}")
            lines.append(f"drafter,{b},32,{c},{STEP + 31 * 2e-5 * b}")
            if phases:
                lines += [f"draft-phase,{b},{k},{c},{s * (1 + 0.1 * b)}" for k, s in PHASE.items()]
    path.write_text("\n".join(lines) + "\n")


def _run(tmp_path, monkeypatch, phases: bool):
    (tmp_path / "trace.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-01-01 00:00:00.000,100,12\n"
        "2024-01-01 00:00:00.000,120,12\n"
    )
    _table(tmp_path / "latency.csv", phases)
    # both prompts prefilled in one step, three rounds at k = 0, then k = 3
    scripted(monkeypatch, lambda r: 0 if r < 3 else 3)
    scn = h100_8b_scenario(
        tmp_path,
        "trace.csv",
        acceptance={"rate": 0.7},
        latency={"backend": "table", "table_path": "latency.csv"},
    )
    res = simulate(scn, "fixed", trace=True, baseline=False)
    rd = res.rounds
    ends = sorted(set(rd["now_s"]))
    return Cluster(scn), rd, ends


def test_draft_phase_rows_price_the_phase_and_the_catch_up_adds_its_tokens(tmp_path, monkeypatch):
    cl, rd, ends = _run(tmp_path, monkeypatch, phases=True)
    assert cl.phase is not None
    assert (rd[rd["now_s"] < ends[3]]["draft_s"] == 0).all()  # draft-free rounds: no phase
    first = rd[rd["now_s"] == ends[3]]
    assert list(first["k"]) == [3, 3]
    ctx = float(first["context_tokens"].sum())
    behind = 3  # one token per draft-free round, per row
    prefix = float(sum(c - 1 - behind for c in first["context_tokens"]))
    phase = PHASE[3] * (1 + 0.1 * 2)  # two drafting rows, three steps
    assert cl.phase.seconds(2, 6, ctx) == pytest.approx(phase, rel=1e-12)
    feed = cl.lat_d.seconds(2, 2 * behind + 2, prefix) - cl.lat_d.seconds(2, 2, prefix)
    # the extra tokens only: `behind` more per row, 2e-5 s x batch 2 each by the drafter rows
    assert feed == pytest.approx(behind * 2e-5 * 2, rel=1e-9)
    assert first["draft_s"].iloc[0] == pytest.approx(phase + feed, rel=1e-12)
    # the next round feeds nothing extra: the phase alone (not 3 steps, not the line)
    nxt = rd[rd["now_s"] == ends[4]]
    assert nxt["draft_s"].iloc[0] == pytest.approx(phase, rel=1e-12)
    # and the round's end is its start plus phase, verify pass and the round overhead (0)
    tokens = int(nxt["drafted"].sum()) + 2
    verify = cl.lat_t.seconds(2, tokens, float(nxt["context_tokens"].sum()))
    assert ends[4] == pytest.approx(ends[3] + phase + verify, rel=1e-12)


def test_without_draft_phase_rows_a_phase_is_k_drafter_steps(tmp_path, monkeypatch):
    cl, rd, ends = _run(tmp_path, monkeypatch, phases=False)
    assert cl.phase is None
    nxt = rd[rd["now_s"] == ends[4]]
    assert nxt["draft_s"].iloc[0] == pytest.approx(3 * STEP, rel=1e-12)
    assert cl.draft_phase_s(2, 3, 1000.0) == 3 * STEP
