"""Claims on SQLite are exact: its transactions do not lock the row a claim reads, so without
the study's lock two workers can both see a queued trial WAITING and both run it (without the
lock, Optuna's pop on SQLite double-claimed 6 or more of 120 trials among 4 processes in each of
3 runs); a worker's claim (:func:`tuning.study.queue_only`) holds
:func:`tuning.locks.claim_lock`."""

from __future__ import annotations

import collections
import multiprocessing as mp

import optuna
import pytest

from tuning.storage import make_storage
from tuning.study import NoSlot, queue_only

N_TRIALS = 120
WORKERS = 4


def _claim_all(url: str, out) -> None:
    study = queue_only(optuna.load_study(study_name="claims", storage=make_storage(url)))
    got = []
    while True:
        try:
            got.append(study._pop_waiting_trial_id())
        except NoSlot:
            break
    out.put(got)


@pytest.mark.slow
def test_workers_on_sqlite_claim_every_queued_trial_exactly_once(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    study = optuna.create_study(study_name="claims", storage=make_storage(url))
    for i in range(N_TRIALS):
        study.enqueue_trial({"x": i}, skip_if_exists=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(url, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    claims = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    counts = collections.Counter(t for got in claims for t in got)
    assert len(counts) == N_TRIALS
    assert [t for t, n in counts.items() if n > 1] == []
