"""The controllers' own CPU per round, replayed over recorded rounds (``mirror``): every round
planned once, with the batch the engine ran, each row's controller fed its observation."""

import pytest

import control.batch
from control.registry import make_config
from control.types import RoundRecord
from validate import mirror


def _rec(req: int, rnd: int, now: float, drafted: int = 2, batch: int = 1) -> RoundRecord:
    return RoundRecord(
        request_id=req,
        round=rnd,
        now_s=now,
        k=drafted,
        drafted=drafted,
        accepted=1,
        emitted=2,
        draft_s=0.001,
        verify_s=0.004,
        context_tokens=40 + rnd,
        batch_size=batch,
    )


@pytest.fixture
def planned(monkeypatch):
    """The batch size of every ``plan_round`` call."""
    seen: list[int] = []
    real = control.batch.plan_round

    def spy(planner, members, now_s, batch):
        seen.append(batch.batch_size)
        assert len(members) == batch.batch_size
        return real(planner, members, now_s, batch)

    monkeypatch.setattr(control.batch, "plan_round", spy)
    return seen


def test_served_rounds_are_grouped_by_their_end_time(planned):
    # request 0 alone, then requests 0 and 1 together for two rounds, then 1 alone
    recs = [
        _rec(0, 0, 0.01),
        _rec(0, 1, 0.02, batch=2),
        _rec(1, 0, 0.02, batch=2),
        _rec(0, 2, 0.03, batch=2),
        _rec(1, 1, 0.03, batch=2),
        _rec(1, 2, 0.04),
    ]
    cpu = mirror.decision_cpu_by_batch("dspark", make_config("dspark"), recs, 8)
    assert planned == [1, 2, 2, 1]
    assert sorted(cpu) == [1, 2] and all(v > 0 for v in cpu.values())


def test_batch1_runs_replay_request_by_request(planned):
    # two sequential batch-1 requests whose clocks both start at 0: rounds never merge
    recs = [_rec(0, 0, 0.01), _rec(0, 1, 0.02), _rec(1, 0, 0.01), _rec(1, 1, 0.02)]
    assert mirror.decision_cpu_s("fixed", make_config("fixed"), recs, 8) > 0
    assert planned == [1, 1, 1, 1]
