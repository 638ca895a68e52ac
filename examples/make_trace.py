"""Write ``examples/trace_small.csv``: a small, deterministic round trace for ``dspark replay``.

One request, 90 rounds drafted at k = 6: an easy stretch (per-token acceptance 0.9), a hard
stretch (0.3), then easy again. Drafter confidences are higher for accepted tokens; about one
emitted token in 15 ends a sentence. Draft steps cost 2 ms, a verify pass ~20 ms.
Run: ``.venv/bin/python examples/make_trace.py`` (same file every time: seeded Generator).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from control.types import RECORD_COLUMNS, RoundRecord, records_to_columns

SEED = 20240601
K = 6
STRETCHES = ((30, 0.9), (30, 0.3), (30, 0.9))  # (rounds, per-token acceptance)
SENTENCE_END_P = 1 / 15
DRAFT_STEP_S = 0.002
VERIFY_S = 0.020


def make(seed: int = SEED) -> list[RoundRecord]:
    rng = np.random.default_rng(seed)
    records, now, i = [], 0.0, 0
    for rounds, a in STRETCHES:
        for _ in range(rounds):
            ok = rng.random(K) < a
            n = int(np.argmin(ok)) if not ok.all() else K
            conf = np.where(np.arange(K) < n, rng.uniform(0.55, 1.0, K), rng.uniform(0.05, 0.7, K))
            emitted = n + 1
            ends = tuple(int(j) for j in np.flatnonzero(rng.random(emitted) < SENTENCE_END_P))
            draft_s = K * DRAFT_STEP_S
            verify_s = VERIFY_S * float(rng.uniform(0.9, 1.1))
            now += draft_s + verify_s
            records.append(
                RoundRecord(
                    request_id=0,
                    round=i,
                    now_s=round(now, 6),
                    k=K,
                    drafted=K,
                    accepted=n,
                    emitted=emitted,
                    draft_s=draft_s,
                    verify_s=round(verify_s, 6),
                    context_tokens=128 + sum(r.emitted for r in records),
                    confidences=tuple(round(float(c), 4) for c in conf),
                    sentence_ends=ends,
                    controller="fixed",
                )
            )
            i += 1
    return records


def write(path: Path) -> Path:
    cols = records_to_columns(make())
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(RECORD_COLUMNS)
        w.writerows(zip(*(cols[c] for c in RECORD_COLUMNS)))
    return path


if __name__ == "__main__":
    print(write(Path(__file__).with_name("trace_small.csv")))
