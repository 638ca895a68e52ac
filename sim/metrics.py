"""Summary metrics of one run (key names: docs/results-format.md) and the per-request table.

Definitions: acceptance_rate â = Σn / (Σn + rounds that ended in a rejection); vpr = accepted /
drafted; du = accepted drafted tokens that reached the output / drafted; mean_accepted_length =
1 + Σn / rounds; throughput = output tokens emitted after warm-up / (end − warm-up) (NaN,
with unmeasured_reason, when that window is not a finite length > 0; so are goodput and
speedup); goodput
counts only requests meeting both SLOs;
slo_attainment = share of the measured requests meeting both SLOs (unfinished ones miss); speedup = token-weighted mean TPOT of the k = 0 run
without the drafter (plain serving) with the same seed and arrivals / this run's, and
speedup_resident the same over the k = 0 run with the drafter resident (filled in by
``sim.api``); preemptions / recomputed_tokens: paged-KV preemptions and the prefill work they
sent back; prefix_cache_hit_tokens: prompt tokens found in the prefix cache (not prefilled);
drafter_catchup_tokens: tokens drafters prefilled after rounds at k = 0; gpu_busy_fraction =
busy GPU-seconds / (GPUs × end); bandwidth_utilization = bytes read (roofline byte model) /
(GPUs × end × datasheet bandwidth); lossy_accept_fraction = lossy accepts / output tokens.
"""

from __future__ import annotations

import numpy as np

from control.metrics import ratio, speculation_metrics
from sim.engine import RunData

NAN = float("nan")

SUMMARY_KEYS = (
    "controller",
    "seed",
    "load_scale",
    "offered_rps",
    "throughput_tokens_per_s",
    "goodput_tokens_per_s",
    "slo_attainment",
    "speedup",
    "speedup_resident",
    "mean_accepted_length",
    "acceptance_rate",
    "vpr",
    "du",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p90_s",
    "e2e_p99_s",
    "gpu_busy_fraction",
    "bandwidth_utilization",
    "lossy_accept_fraction",
    "requests_finished",
    "requests_unfinished",
    "requests_rejected",
    "preemptions",
    "recomputed_tokens",
    "prefix_cache_hit_tokens",
    "drafter_catchup_tokens",
    "output_tokens",
    "sim_time_s",
    "num_gpus",
    "mean_tpot_s",
    "unmeasured_reason",
)


def _pct(x: np.ndarray, q: float) -> float:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else NAN


def per_request(run: RunData) -> dict[str, np.ndarray]:
    r = run.reqs
    fin = ~np.isnan(run.finish_s)
    ttft = run.first_token_s - r.arrival_s
    e2e = run.finish_s - r.arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(
            r.output_tokens > 1, (run.finish_s - run.first_token_s) / (r.output_tokens - 1), NAN
        )
    return {"finished": fin, "ttft": ttft, "tpot": tpot, "e2e": e2e}


def slo_attainment(m: dict[str, np.ndarray], measured: np.ndarray, slo) -> float:
    """Share of the measured requests (arrived after warm-up) that finished with TTFT ≤
    ``slo.ttft_s`` and their own TPOT ≤ ``slo.tpot_s`` (a one-token output has no TPOT and
    meets it). Unfinished and rejected requests miss. NaN when no request is measured."""
    n = int(np.count_nonzero(measured))
    if n == 0:
        return NAN
    ok = measured & m["finished"] & (m["ttft"] <= slo.ttft_s) & ~(m["tpot"] > slo.tpot_s)
    return float(np.count_nonzero(ok)) / n


def unmeasured_reason(end_s: float, warmup_s: float) -> str:
    """Why no rate can be measured ('' when one can): the window from ``sim.warmup_s`` to the
    end of the run is not a finite length above 0. Throughput, goodput and speedup of such a
    run are NaN (null in summary.json) and this reason says why."""
    window = end_s - warmup_s
    if np.isfinite(window) and window > 0:
        return ""
    return (
        f"measurement window from sim.warmup_s = {warmup_s:g} s to the end of the run at "
        f"{end_s:g} s has length {window:g} s: throughput, goodput and speedup are undefined"
    )


def summarize(
    run: RunData, scn, cluster, *, controller: str, seed: int, load_scale: float, offered_rps: float
) -> dict:
    c = run.counters
    r = run.reqs
    m = per_request(run)
    warm = scn.sim.warmup_s
    meas = r.arrival_s >= warm
    fin = m["finished"] & meas
    window = run.end_s - warm
    reason = unmeasured_reason(run.end_s, warm)
    ttft, tpot, e2e = m["ttft"][fin], m["tpot"][fin], m["e2e"][fin]
    ok = fin & (m["ttft"] <= scn.slo.ttft_s) & ~(m["tpot"] > scn.slo.tpot_s)
    dec_tokens = (r.output_tokens[fin] - 1).sum()
    mean_tpot = ratio(float(np.nansum((run.finish_s - run.first_token_s)[fin])), float(dec_tokens))
    hw = cluster.hw
    end = max(run.end_s, 1e-12)
    out = {
        "controller": controller,
        "seed": int(seed),
        "load_scale": float(load_scale),
        "offered_rps": float(offered_rps),
        "throughput_tokens_per_s": NAN if reason else c.measured_tokens / window,
        "goodput_tokens_per_s": NAN if reason else float(r.output_tokens[ok].sum()) / window,
        "slo_attainment": slo_attainment(m, meas, scn.slo),
        "speedup": NAN,
        "speedup_resident": NAN,
        **speculation_metrics(
            rounds=c.rounds,
            accepted=c.accepted,
            rejected_rounds=c.rejected_rounds,
            drafted=c.drafted,
            accepted_emitted=c.accepted_emitted,
        ),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p90_s": _pct(tpot, 90),
        "tpot_p99_s": _pct(tpot, 99),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p90_s": _pct(e2e, 90),
        "e2e_p99_s": _pct(e2e, 99),
        "gpu_busy_fraction": c.gpu_busy_s / (cluster.num_gpus * end),
        "bandwidth_utilization": c.bytes_moved / (cluster.num_gpus * end * hw.bandwidth_bytes_s),
        "lossy_accept_fraction": ratio(c.lossy, c.round_tokens + c.prefill_tokens),
        "requests_finished": int(m["finished"].sum()),
        "requests_unfinished": int((~m["finished"]).sum()),
        "requests_rejected": int(np.count_nonzero(run.rejected)),
        "preemptions": int(c.preemptions),
        "recomputed_tokens": int(c.recomputed_tokens),
        "prefix_cache_hit_tokens": int(c.prefix_cache_hit_tokens),
        "drafter_catchup_tokens": int(c.drafter_catchup_tokens),
        "output_tokens": int(c.round_tokens + c.prefill_tokens),
        "sim_time_s": float(run.end_s),
        "num_gpus": int(cluster.num_gpus),
        "mean_tpot_s": mean_tpot,
        "unmeasured_reason": reason,
    }
    return {k: (float(v) if isinstance(v, (np.floating,)) else v) for k, v in out.items()}


def requests_table(run: RunData, controller: str):
    import pandas as pd

    r = run.reqs
    m = per_request(run)
    return pd.DataFrame(
        {
            "controller": controller,
            "request_id": np.arange(len(r)),
            "arrival_s": r.arrival_s,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "first_token_s": run.first_token_s,
            "finish_s": run.finish_s,
            "ttft_s": m["ttft"],
            "tpot_s": m["tpot"],
            "e2e_s": m["e2e"],
            "finished": m["finished"],
            "replica": run.replica,
            "emitted_tokens": run.emitted,
            "admitted_s": run.admitted_s,
            "acceptance_rate": run.acceptance_rate,
        }
    )
