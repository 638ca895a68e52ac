"""A latency table that profiled a block drafter (its ``block-drafter`` row names B): the
simulator prices a block scenario's draft phase as the profiled block forward at the round's k
(at most B), whatever k; a scenario of another drafter kind or block size is one line."""

import pytest
from conftest import h100_8b_scenario
from test_catchup import scripted
from test_draft_phase_table import PHASE, _table

from control.errors import ConfigError
from control.latency_rows import BLOCK_MARKER
from sim import simulate
from sim.cluster import Cluster
from sim.latency import table_block_size

B = 4  # the block size the table says it profiled (its draft-phase rows cover k = 1..4)


def _block_table(path, block: int | None = B) -> None:
    _table(path, phases=True)
    if block is not None:
        with path.open("a") as f:
            f.write(f"{BLOCK_MARKER},1,{block},0,0.0\n")


def _scenario(tmp_path, draft: dict | None, block: int | None = B):
    (tmp_path / "trace.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-01-01 00:00:00.000,100,12\n"
        "2024-01-01 00:00:00.000,120,12\n"
    )
    _block_table(tmp_path / "latency.csv", block)
    kw = {"draft": draft} if draft else {}
    return h100_8b_scenario(
        tmp_path,
        "trace.csv",
        acceptance={"rate": 0.7},
        latency={"backend": "table", "table_path": "latency.csv"},
        **kw,
    )


def test_table_block_size(tmp_path):
    _block_table(tmp_path / "a.csv")
    _block_table(tmp_path / "b.csv", None)
    assert table_block_size(tmp_path / "a.csv") == B
    assert table_block_size(tmp_path / "b.csv") == 0


def test_block_phase_is_the_profiled_forward_at_any_k(tmp_path):
    cl = Cluster(_scenario(tmp_path, {"kind": "block", "block_size": B}))
    assert cl.block_size == B and cl.phase is not None
    for k in range(1, B + 1):  # one forward keeping k slots, for one and for two rows
        assert cl.draft_phase_s(1, 1, 300.0, k) == pytest.approx(PHASE[k] * 1.1, rel=1e-12)
        assert cl.draft_phase_s(2, 1, 600.0, k) == pytest.approx(PHASE[k] * 1.2, rel=1e-12)
    # a k past B keeps B slots; steps (k for an autoregressive drafter) do not multiply it
    assert cl.draft_phase_s(1, 6, 300.0, 9) == pytest.approx(PHASE[B] * 1.1, rel=1e-12)


@pytest.mark.parametrize("k", [2, 3])
def test_simulated_rounds_pay_the_profiled_forward(tmp_path, monkeypatch, k):
    """Rows at k: every drafting round's draft time is the table's phase at (its drafting
    rows, k), the catch-up after draft-free rounds adding nothing (a block drafter keeps no
    cache)."""
    scripted(monkeypatch, lambda r: 0 if r < 3 else k)
    scn = _scenario(tmp_path, {"kind": "block", "block_size": B})
    rd = simulate(scn, "fixed", trace=True, baseline=False).rounds
    drafting = rd[rd["k"] > 0]
    assert len(drafting) >= 2 and set(drafting["k"]) == {k}
    rows = drafting.groupby("now_s")["k"].transform("size").to_numpy()  # drafting rows
    assert set(rows) == {1, 2}
    want = PHASE[k] * (1 + 0.1 * rows)
    assert drafting["draft_s"].to_numpy() == pytest.approx(want, rel=1e-12)


def test_kind_or_block_size_mismatch_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        Cluster(_scenario(tmp_path, None))
    msg = str(e.value)
    assert "\n" not in msg and "latency.csv" in msg and "draft.kind = 'block'" in msg
    with pytest.raises(ConfigError) as e:
        Cluster(_scenario(tmp_path, {"kind": "block", "block_size": 7}))
    msg = str(e.value)
    assert "\n" not in msg and "block size 4" in msg and "block_size is 7" in msg


def test_block_scenario_on_an_autoregressive_profile_prices_drafter_rows(tmp_path):
    """Without the marker the draft-phase rows time k autoregressive steps: a block scenario
    prices one drafter forward at B tokens per row from the drafter rows instead."""
    cl = Cluster(_scenario(tmp_path, {"kind": "block", "block_size": B}, block=None))
    assert cl.phase is None
    assert cl.draft_phase_s(1, 1, 300.0, 3) == pytest.approx(
        cl.lat_d.inner.seconds(1, B, 300.0), rel=1e-12
    )
