"""The compared metrics, computed by ONE function from rounds and per-request times, so the
simulator's prediction and the engine's measurement use the same definitions.

Requests are served one at a time (batch 1). Per request: ``tokens`` generated, ``request_s``
(prefill + every round + engine overhead), ``decode_s`` (from the end of prefill to the last
token). throughput = Σ tokens / Σ request_s; TPOT of a request = decode_s / tokens (p50, p99
over requests); mean accepted length = 1 + Σn / rounds; â = Σn / (Σn + rounds that ended in a
rejection) (DESIGN.md; both from :mod:`control.metrics`).
"""

from __future__ import annotations

import numpy as np

from control.metrics import acceptance_rate, mean_accepted_length, round_totals

METRICS = ("throughput_tokens_per_s", "mean_accepted_length", "acceptance_rate", "tpot_p50_s",
           "tpot_p99_s")
#: the metrics whose largest |error| is the headline number.
HEADLINE = ("throughput_tokens_per_s", "mean_accepted_length")


def compute(accepted, drafted, tokens, request_s, decode_s) -> dict[str, float]:
    t = round_totals(accepted, drafted)
    tok = np.asarray(tokens, dtype=float)
    req = np.asarray(request_s, dtype=float)
    dec = np.asarray(decode_s, dtype=float)
    tpot = dec / np.maximum(tok, 1.0)
    return {
        "throughput_tokens_per_s": float(tok.sum() / req.sum()) if req.sum() > 0 else float("nan"),
        "mean_accepted_length": mean_accepted_length(t["accepted"], t["rounds"]),
        "acceptance_rate": acceptance_rate(t["accepted"], t["rejected_rounds"]),
        "tpot_p50_s": float(np.percentile(tpot, 50)) if len(tpot) else float("nan"),
        "tpot_p99_s": float(np.percentile(tpot, 99)) if len(tpot) else float("nan"),
    }


def real_metrics(records, requests) -> dict[str, float]:
    """From ``RoundRecord``s and ``real.tracing.RequestRun``s."""
    return compute([r.accepted for r in records], [r.drafted for r in records],
                   [q.output_tokens for q in requests], [q.seconds for q in requests],
                   [q.decode_s for q in requests])


def error_pct(sim: float, real: float) -> float:
    return (sim - real) / real * 100.0 if real else float("nan")


def spread_pct(values) -> float:
    """Run-to-run spread (max - min) / median, in %."""
    v = np.asarray(values, dtype=float)
    med = float(np.median(v))
    return float((v.max() - v.min()) / abs(med) * 100.0) if med else float("nan")
