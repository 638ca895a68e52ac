"""A synthetic long-context conversation trace in the Azure CSV format (issue 13's case).

The issue ran a public long-context conversation trace (inputs averaging ~14k tokens, up to
121k, arriving in bursts) converted to ``TIMESTAMP,ContextTokens,GeneratedTokens``. That file is
not in this repository; this script writes a seeded stand-in with the same shape: lognormal
inputs (mean ~14k, clipped to 121k), lognormal outputs (mean ~340), gamma arrivals with CV 2.5
(bursts; ``--cv 1`` for Poisson) at ``--rate`` requests/s. Deterministic for a given seed.

    .venv/bin/python benchmarks/long_context_trace.py --out runs/long_context.csv
    .venv/bin/dspark simulate configs/azure_conv.toml --set workload.trace_path=... \
        --controller fixed:k=0 --controller fixed:k=4 --loads 0.25,1

``--diagnose`` runs the trace on configs/azure_conv.toml (fixed k = 0 and 4 at ``--loads``) and
splits TTFT into queueing (arrival to the first prompt chunk, ``admitted_s``) and prefill (first
chunk to first token), each against the request's isolated prefill (its prompt alone, chunked
under the same token budget, target + colocated drafter); ``--prefill-order shortest-first``
runs it with that scheduling order (``deployment.prefill_order``), ``--routing`` with that
assignment of arrivals to replicas (``deployment.routing``). Beside each row it prints the
same ratio for an ideal server (``ideal_ratio``, :func:`ideal_ttft`): the replicas share one
queue, serve it in the same order, one whole prefill at a time at its isolated speed, and decodes
cost nothing. A server that keeps that order without preempting gains on it only where the
next prompt fills a last chunk's leftover budget; ``shortest-first`` in the simulator reorders at
every chunk (shortest remaining first), so it can come in below its ideal.
"""

from __future__ import annotations

import argparse
import heapq
from pathlib import Path

import numpy as np


def make_trace(n: int = 400, rate_rps: float = 3.0, seed: int = 13, cv: float = 2.5) -> str:
    """The trace's CSV text; ``cv``: coefficient of variation of the gaps (1 = Poisson)."""
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), n)
    t = np.cumsum(gaps) - gaps[0]
    sigma_in, mean_in = 1.0, 14_000.0
    prompt = rng.lognormal(np.log(mean_in) - sigma_in**2 / 2, sigma_in, n)
    prompt = np.clip(np.rint(prompt), 64, 121_000).astype(np.int64)
    sigma_out, mean_out = 0.8, 340.0
    out = rng.lognormal(np.log(mean_out) - sigma_out**2 / 2, sigma_out, n)
    out = np.clip(np.rint(out), 1, 4096).astype(np.int64)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    base = np.datetime64("2024-01-01T00:00:00.000000")
    for ti, p, o in zip(t, prompt, out):
        stamp = base + np.timedelta64(round(ti * 1e6), "us")
        lines.append(f"{str(stamp).replace('T', ' ')},{p},{o}")
    return "\n".join(lines) + "\n"


def isolated_prefill_s(cluster, budget: int, prompt: int) -> float:
    """A prompt prefilled alone: chunks of ``budget`` tokens, each attending to its prefix,
    target then colocated drafter."""
    from sim.latency import causal_pairs

    t, done = 0.0, 0
    while done < prompt:
        n = min(budget, prompt - done)
        pairs = causal_pairs(n, done)
        t += cluster.lat_t.pass_seconds(0, 0, 0.0, 1, n, pairs, done)
        t += cluster.lat_d.pass_seconds(0, 0, 0.0, 1, n, pairs, done)
        done += n
    return t


def ideal_ttft(
    arrival_s: np.ndarray, service_s: np.ndarray, servers: int, order: str = "fcfs"
) -> np.ndarray:
    """TTFT per request on ``servers`` identical servers sharing one queue, non-preemptive:
    a server that frees takes the waiting request that arrived first (``"fcfs"``) or the one
    with the least service (``"shortest-first"``); ties by arrival, then index."""
    if order not in ("fcfs", "shortest-first"):
        raise ValueError(f"order {order!r}: allowed fcfs, shortest-first")
    arrival_s, service_s = np.asarray(arrival_s, float), np.asarray(service_s, float)
    by_arrival = np.lexsort((np.arange(len(arrival_s)), arrival_s))
    free = [0.0] * servers  # a heap of the times the servers free
    waiting: list[tuple[float, float, int]] = []
    done = np.empty(len(arrival_s))
    nxt = 0
    while nxt < len(by_arrival) or waiting:
        t = heapq.heappop(free)
        if not waiting:  # idle until the next arrival
            t = max(t, arrival_s[by_arrival[nxt]])
        while nxt < len(by_arrival) and arrival_s[by_arrival[nxt]] <= t:
            j = int(by_arrival[nxt])
            key = arrival_s[j] if order == "fcfs" else service_s[j]
            heapq.heappush(waiting, (key, arrival_s[j], j))
            nxt += 1
        _, _, j = heapq.heappop(waiting)
        done[j] = t + service_s[j]
        heapq.heappush(free, done[j])
    return done - arrival_s


def diagnose(
    trace: Path,
    n: int,
    loads: list[float],
    prefill_order: str = "fcfs",
    routing: str = "least-outstanding",
) -> None:
    """TTFT against isolated prefill, split into queueing and prefill, per controller x load."""
    import sys

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sim import compare_runs, load_scenario
    from sim.cluster import Cluster

    root = Path(__file__).resolve().parents[1]
    scn = load_scenario(
        root / "configs" / "azure_conv.toml",
        {
            "workload.trace_path": str(trace),
            "workload.num_requests": n,
            "deployment.prefill_order": prefill_order,
            "deployment.routing": routing,
        },
    )
    ctrls = [("fixed", {"k": 0}, "fixed:k=0"), ("fixed", {"k": 4}, "fixed:k=4")]
    rq = compare_runs(scn, ctrls, seed=0, load_scales=loads, baseline=False).requests
    cl, budget = Cluster(scn), scn.deployment.max_num_batched_tokens
    iso = {p: isolated_prefill_s(cl, budget, p) for p in set(rq["prompt_tokens"].tolist())}
    for (name, load), g in rq.groupby(["controller", "load_scale"], sort=False):
        alone = g["prompt_tokens"].map(iso).to_numpy()
        ideal = ideal_ttft(g["arrival_s"].to_numpy(), alone, scn.deployment.replicas, prefill_order)
        queue = (g["admitted_s"] - g["arrival_s"]).to_numpy()
        prefill = (g["first_token_s"] - g["admitted_s"]).to_numpy()
        ttft = g["ttft_s"].to_numpy()
        print(
            f"load={load:g} {name:10s} ttft_p50={np.median(ttft):.3f} "
            f"isolated_p50={np.median(alone):.3f} ratio={np.median(ttft) / np.median(alone):.2f} "
            f"ttft_p99={np.percentile(ttft, 99):.3f} "
            f"per_request_ratio_p50={np.median(ttft / alone):.2f} "
            f"queue_p50={np.median(queue):.3f} queue_mean={queue.mean():.3f} "
            f"prefill_over_isolated_p50={np.median(prefill / alone):.2f} "
            f"ideal_ratio={np.median(ideal) / np.median(alone):.2f}",
            flush=True,
        )


def _choices(field: str) -> tuple:
    """The allowed values of a ``[deployment]`` field, as its config declares them."""
    import dataclasses
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sim.config import DeploymentConfig

    f = {f.name: f for f in dataclasses.fields(DeploymentConfig)}[field]
    return tuple(f.metadata["choices"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/long_context.csv")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rate", type=float, default=3.0, help="mean arrival rate, requests/s")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument(
        "--cv", type=float, default=2.5, help="burstiness: CV of the gaps (1 = Poisson)"
    )
    ap.add_argument("--diagnose", action="store_true", help="split TTFT (see above)")
    ap.add_argument("--loads", default="0.05,0.25,1", help="load scales of --diagnose")
    ap.add_argument(
        "--prefill-order",
        default="fcfs",
        choices=_choices("prefill_order"),
        help="deployment.prefill_order of --diagnose",
    )
    ap.add_argument(
        "--routing",
        default="least-outstanding",
        choices=_choices("routing"),
        help="deployment.routing of --diagnose (azure_conv's own: least-outstanding)",
    )
    args = ap.parse_args(argv)
    p = Path(args.out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(make_trace(args.n, args.rate, args.seed, args.cv))
    print(p)
    if args.diagnose:
        loads = [float(x) for x in args.loads.split(",")]
        diagnose(p.resolve(), args.n, loads, args.prefill_order, args.routing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
