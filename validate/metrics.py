"""The compared metrics, computed by ONE function from rounds and per-request times, so the
simulator's prediction and the engine's measurement use the same definitions.

Requests are served one at a time (batch 1). Per request: ``tokens`` generated, ``request_s``
(prefill + every round + engine overhead), ``decode_s`` (from the end of prefill to the last
token). throughput = Σ tokens / Σ request_s; TPOT of a request = decode_s / tokens (p50, p99
over requests); mean accepted length = 1 + Σn / rounds; â = Σn / (Σn + rounds that ended in a
rejection) (docs/design.md; both from :mod:`control.metrics`).
"""

from __future__ import annotations

import numpy as np

from control.metrics import (
    acceptance_rate,
    mean_accepted_length,
    range_pct_of_median,
    round_totals,
)

METRICS = (
    "throughput_tokens_per_s",
    "mean_accepted_length",
    "acceptance_rate",
    "tpot_p50_s",
    "tpot_p99_s",
)
#: the metrics whose largest |error| is the headline number.
HEADLINE = ("throughput_tokens_per_s", "mean_accepted_length")
#: batch-1 controllers are ranked per workload by this metric (higher is better)
RANK_METRIC_BATCH1 = "throughput_tokens_per_s"
#: the latency-only (replay) headline: replayed acceptance is exact by construction, so only
#: throughput says how far the latency model is off
LATENCY_ONLY = ("throughput_tokens_per_s",)


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
    return compute(
        [r.accepted for r in records],
        [r.drafted for r in records],
        [q.output_tokens for q in requests],
        [q.seconds for q in requests],
        [q.decode_s for q in requests],
    )


def fixed_k_rounds(positions: list, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt (``positions``: one list of ``PositionRecord`` each), the tokens and rounds of
    fixed k replayed on its greedy trace as the engine runs it (``real.tracing.replay_accepted``)."""
    from real.tracing import replay_accepted

    tok, rnd = [], []
    for recs in positions:
        n = len(recs)
        rounds = replay_accepted(recs, [k] * n, [0.0] * n, k, n)
        tok.append(sum(a + 1 for _, a in rounds))
        rnd.append(len(rounds))
    return np.asarray(tok, dtype=float), np.asarray(rnd, dtype=float)


def prompt_sample(positions: list, k: int) -> dict:
    """The prompts as a sample of their workload: fixed k's accepted length over their greedy
    position traces (``positions``: one list of ``PositionRecord`` per prompt, replayed as the
    engine runs fixed k, ``real.tracing.replay_accepted``: at batch 1 the engine's own value
    exactly; pooled, tokens over rounds) and its standard error over the prompts (the ratio
    estimator's), in % of it; NaN with one prompt. An error of about that size is the prompt
    sample's: a predictor that cannot tell these prompts from other prompts of their workload
    is off by it."""
    t, r = fixed_k_rounds(positions, k)
    ratio, m = float(t.sum() / r.sum()), len(t)
    se = float("nan")
    if m > 1:
        se = float(np.sqrt(((t - ratio * r) ** 2).sum() / (m - 1) / m) / r.mean())
    return {"prompts": m, "fixed_k": k, "accepted_length": ratio, "se_pct": 100.0 * se / ratio}


def error_pct(sim: float, real: float) -> float:
    return (sim - real) / real * 100.0 if real else float("nan")


def error_columns(group: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The columns of an error table: one row per (controller, ``group``, metric), ``group`` a
    workload or a load, ``extra`` columns of the group beside it (``errors.csv``,
    ``errors_batched.csv``)."""
    return ("controller", group, *extra, "metric", "sim", "real", "real_spread", "error_pct")


def error_rows(preds: dict, real: dict, metrics, group: str) -> list[dict]:
    """One row per (controller, ``group``, metric) (:func:`error_columns`): the prediction
    ``preds[c, g][m]`` against the median of the real repeats ``real[c, g]``, their spread
    (``control.metrics.range_pct_of_median``) and the error (:func:`error_pct`)."""
    rows = []
    for (c, g), sim in preds.items():
        for m in metrics:
            vals = [r[m] for r in real[c, g]]
            med = float(np.median(vals))
            values = (c, g, m, sim[m], med, range_pct_of_median(vals), error_pct(sim[m], med))
            rows.append(dict(zip(error_columns(group), values)))
    return rows


#: a pair of controllers is told apart when a two-sided Mann-Whitney U test on their real
#: repeats gives p at most this (:func:`resolved_pairs`)
TOLD_APART_P = 0.1


def resolved_pairs(sim: dict[str, float], runs: dict[str, list[float]]) -> dict:
    """Controller pairs the real runs tell apart, and whether the simulator orders them so.

    A pair is told apart when a two-sided Mann-Whitney U test on the two controllers' real
    repeats (``runs``) gives p <= :data:`TOLD_APART_P` (SciPy; exact for small samples without
    ties). The test ranks the repeats, so one outlier repeat of a shared machine moves it
    little, and it gains power as repeats are added. At 3 repeats each its smallest p is 0.1:
    a pair is then told apart only when every repeat of one lies beyond every repeat of the
    other. (A gap between the medians above both controllers' range / median is no criterion:
    it grows stricter with every repeat, and on many repeats tells apart no pair at all.) The
    order compared is the medians' against the
    simulated values'. Returns the number of such pairs, how many of them the simulator orders
    the same way, and the ones it swaps. A full ranking also orders pairs the test does not
    tell apart (run to run, such a pair swaps in reality as well)."""
    from scipy.stats import mannwhitneyu

    names = sorted(runs)
    vals = {n: (v := np.asarray(runs[n], dtype=float))[np.isfinite(v)] for n in names}
    told, same, swapped = 0, 0, []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            va, vb = vals[a], vals[b]
            if len(va) < 2 or len(vb) < 2 or np.ptp(np.r_[va, vb]) == 0:  # all equal: no order
                continue
            if not mannwhitneyu(va, vb, alternative="two-sided").pvalue <= TOLD_APART_P:
                continue
            told += 1
            if (sim[a] - sim[b]) * (np.median(va) - np.median(vb)) > 0:
                same += 1
            else:
                swapped.append([a, b])
    return {"pairs": told, "same_order": same, "swapped": swapped}


def told_apart(rows, repeats: dict[str, list[float]]) -> dict:
    """:func:`resolved_pairs` of one metric's error rows of one group (columns ``controller``,
    ``sim``) against each controller's real repeats (:func:`repeats_of`)."""
    return resolved_pairs(dict(zip(rows["controller"], rows["sim"])), repeats)


def repeats_of(real: dict, controllers, group, metric: str) -> dict[str, list[float]]:
    """Each controller's real values of ``metric`` in ``group``, one per repeat."""
    return {c: [float(r[metric]) for r in real[c, group]] for c in controllers}


# ---------------------------------------------------------------- the batched part (serving)
#: the batched part's compared metrics (one value per controller x load)
SERVING_METRICS = (
    "throughput_tokens_per_s",
    "tpot_p50_s",
    "ttft_p50_s",
    "queue_mean_s",
    "e2e_p50_s",
    "mean_accepted_length",
)
#: the metrics of ``validate_batched_max_abs_error_pct``, with the issue's target |error| in %
SERVING_TARGETS = {"throughput_tokens_per_s": 10.0, "tpot_p50_s": 10.0, "ttft_p50_s": 20.0}
#: controllers are ranked per load by this metric (lower is better): under open-loop arrivals
#: the throughput of a load the engine sustains is the offered load, whatever the controller
RANK_METRIC = "tpot_p50_s"


def serving(
    arrival_s, admitted_s, first_token_s, finish_s, tokens, accepted: int, rounds: int
) -> dict[str, float]:
    """The batched part's metrics of one run (every request finished), per request arrays:
    arrival, admission (end of its prefill pass), first token (end of its first round), finish,
    and output tokens; ``accepted`` drafted tokens over ``rounds`` sequence-rounds.

    throughput = Σ tokens / (last finish - first arrival); TPOT of a request = (finish - first
    token) / (tokens - 1) (requests of >= 2 tokens); TTFT = first token - arrival; queueing =
    admission - arrival (waiting for a round boundary and a free slot, plus the prefill pass);
    e2e = finish - arrival; mean accepted length = 1 + accepted / rounds.
    """
    arr = np.asarray(arrival_s, dtype=float)
    adm = np.asarray(admitted_s, dtype=float)
    first = np.asarray(first_token_s, dtype=float)
    fin = np.asarray(finish_s, dtype=float)
    tok = np.asarray(tokens, dtype=float)
    span = float(fin.max() - arr.min()) if len(fin) else 0.0
    many = tok > 1
    tpot = (fin[many] - first[many]) / (tok[many] - 1)

    def p50(x) -> float:
        return float(np.percentile(x, 50)) if len(x) else float("nan")

    return {
        "throughput_tokens_per_s": float(tok.sum() / span) if span > 0 else float("nan"),
        "tpot_p50_s": p50(tpot),
        "ttft_p50_s": p50(first - arr),
        "queue_mean_s": float(np.mean(adm - arr)) if len(adm) else float("nan"),
        "e2e_p50_s": p50(fin - arr),
        "mean_accepted_length": mean_accepted_length(accepted, rounds),
    }


# ---------------------------------------------------------------- the measurement's noise floor
#: repeat counts tried for ``noise_floor``'s ``repeats_needed`` (beyond the run's own)
MORE_REPEATS = (5, 7, 10, 15, 20, 30, 50)


def log_sd(values) -> float:
    """Run-to-run standard deviation of ``log(value)`` (ddof 1): one run's relative noise
    (NaN with fewer than two positive finite values)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.log(v).std(ddof=1)) if len(v) >= 2 else float("nan")


def perfect_errors(sigmas, repeats: int, rng: np.random.Generator, draws: int) -> np.ndarray:
    """|error| in % (``draws × rows``) of a simulator that predicts every row's true value
    exactly, against the median of ``repeats`` runs each off by ``exp(N(0, σ_row²))``,
    independently (runs of one repeat share little drift: the common per-repeat factor is small
    against each run's own; ``benchmarks/noise_floor.py`` measures both on a saved run)."""
    s = np.nan_to_num(np.asarray(sigmas, dtype=float))
    z = rng.standard_normal((draws, len(s), repeats)) * s[None, :, None]
    return np.abs(np.expm1(-np.median(z, axis=2))) * 100.0


def noise_floor(
    sigmas, targets, repeats: int, rng: np.random.Generator, draws: int = 4000
) -> dict | None:
    """What a perfect simulator would score on measurements this noisy: the median and 90th
    percentile of its largest |error| over the rows, the probability that some row exceeds its
    target (``targets``: one per row, or one for all), and the fewest repeats
    (:data:`MORE_REPEATS`) that bring that probability to ≤ 10% (None if none does). ``sigmas``:
    each row's :func:`log_sd` over its repeats; None with fewer than two repeats."""
    if repeats < 2 or not len(sigmas):
        return None
    s = np.nan_to_num(np.asarray(sigmas, dtype=float))
    t = np.broadcast_to(np.asarray(targets, dtype=float), s.shape)

    def p_over(n: int) -> tuple[float, np.ndarray]:
        e = perfect_errors(s, n, rng, draws)
        return float((e > t).any(axis=1).mean()), e

    p, e = p_over(repeats)
    worst = e.max(axis=1)
    more = (n for n in MORE_REPEATS if n > repeats and p_over(n)[0] <= 0.1)
    need = repeats if p <= 0.1 else next(more, None)
    noisy = s[s > 0]
    return {
        "repeats": int(repeats),
        "rows": len(s),
        "noisy_rows": len(noisy),
        "run_sd_pct_median": float(np.median(np.expm1(noisy)) * 100.0) if len(noisy) else 0.0,
        "max_abs_error_pct_p50": float(np.median(worst)),
        "max_abs_error_pct_p90": float(np.percentile(worst, 90)),
        "p_over_target": p,
        "repeats_needed_for_p10": need,
    }


def noise_floor_of(real: dict, targets: dict[str, float], rng: np.random.Generator) -> dict | None:
    """:func:`noise_floor` of the rows an error table builds from ``real`` (``(controller,
    group) -> [metrics of one repeat, ...]``) for the metrics of ``targets`` (metric -> the
    target |error| in %).

    One run's noise is pooled over the controllers of a group (a workload, a load) per metric:
    the root mean square of their :func:`log_sd` (two degrees of freedom each at 3 repeats: one
    row's own estimate is too rough, and the largest of several would set the floor by its
    estimation error alone). A row whose repeats are all equal (a deterministic metric, e.g.
    the accepted length of a fixed k under greedy decoding) has no noise."""
    sd = {(c, g, m): log_sd([r[m] for r in runs]) for (c, g), runs in real.items() for m in targets}
    pooled: dict = {}
    for (_, g, m), v in sd.items():
        if v > 0:
            pooled.setdefault((g, m), []).append(v * v)
    sig = [float(np.sqrt(np.mean(pooled[g, m]))) if v > 0 else 0.0 for (_, g, m), v in sd.items()]
    tgt = [targets[m] for (_, _, m) in sd]
    n = min((len(v) for v in real.values()), default=0)
    return noise_floor(sig, tgt, n, rng)
