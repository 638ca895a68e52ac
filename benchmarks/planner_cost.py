"""What the ``dspark`` round planner costs: microseconds per round, and its share of a round.

1. µs per round of the planner (``control.registry.make_planner("dspark")`` with
   ``make_controller`` members, default config) at B = 1, 16, 64, 256, driven through
   ``control.batch.plan_round`` and ``observe_round`` by a synthetic batch, in two call patterns:

   - *sim*: as ``sim.replica`` calls it: the scenario's SLOs told to the planner and every member,
     the members observed through the planner's ``observe_members`` (confidences only when a
     controller reads them);
   - *engine*: as ``real.engine`` calls it: ``plan_round`` with ``BatchContext(B, Σ context,
     k_max = 16)``, the members observed through ``observe_members`` with their confidences,
     no SLOs.

   A round's time is plan + ``observe_members`` + ``observe_round``; everything the
   synthetic batch does itself (acceptance draws, building observations, the round's modelled
   seconds) is outside the clock. The batch is the standard scenario's: per-request acceptance
   rates from its Beta(0.75, 10), output and prompt lengths from its lognormals; run lengths are
   geometric at the request's rate; a finished sequence leaves and a new one joins at the end
   (as the engines admit), so the planner sees arrivals and departures. A round's draft and
   verify seconds come from the standard scenario's latency model (Llama-3.1-70B, TP 8, H100), so
   the costs the planner learns are an H100's. The first ``--warmup`` rounds are not timed.
   Beside the means: the µs of a full plan, of a kept plan (item 6 of
   ``control.dspark_planner``) and the share of rounds that ran a full plan.
2. The planner's share of a simulated H100 round: a traced ``dspark`` run of the standard
   scenario (``--share-requests`` requests) gives the mean round time and the mean batch over
   rounds; the engine-pattern µs per round at that batch over the mean round time.
3. ``sim_dspark_vs_fixed``: ``benchmarks/sim_speed.py``'s measurement (tokens per CPU-second,
   standard scenario, ``--sim-size`` M output tokens) for ``fixed`` and ``dspark``, interleaved
   (fixed, dspark, fixed, dspark, ...; ``--repeats`` each), mean dspark over mean fixed. Then
   one more ``dspark`` run with the planner's calls timed apart: their share of its CPU time,
   and the ratio it would reach with those calls free (its tokens over its CPU-seconds less
   theirs, against ``fixed``'s mean rate): what no planner, however cheap, can beat.

Timings want a quiet machine: run it alone.

    .venv/bin/python benchmarks/planner_cost.py [--rounds 1000] [--sim-size 1] [--repeats 2]
        [--set KEY=VALUE ...]   # dspark config keys (e.g. replan_backoff=3), for every run

Last line: ``planner_us_b16=… planner_us_b256=… planner_share_h100=… sim_dspark_vs_fixed=…``
(engine pattern at B = 16 and 256; the share as a fraction, not a percentage).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from control.batch import BatchContext, RoundStats, Slo, plan_round  # noqa: E402
from control.registry import make_config, make_controller, make_planner  # noqa: E402

BATCHES = (1, 16, 64, 256)
PATTERNS = ("sim", "engine")
ENGINE_K_MAX = 16  # real.engine.EngineConfig.k_max's default: the engine's cap on any k
MAX_RUN = 64  # run lengths are cut here (the simulator's acceptance.max_run_tokens)
SCENARIO = ROOT / "configs" / "standard.toml"
LAST_LINE_KEYS = ("planner_us_b16", "planner_us_b256", "planner_share_h100", "sim_dspark_vs_fixed")


class Batch:
    """A synthetic running batch of ``B`` sequences, each with its controller, acceptance rate,
    context and remaining output tokens, refilled to ``B`` as sequences finish. Drafter
    confidences are uniform on [0.3, 1]; a decision's τ stops drafting at the first below it."""

    def __init__(self, scn, B: int, pattern: str, seed: int, cfg=None) -> None:
        from sim.cluster import Cluster

        self.rng = np.random.default_rng(seed)
        self.scn, self.B, self.pattern = scn, B, pattern
        self.cluster = Cluster(scn, use_drafter=True)
        self.cfg = make_config("dspark", cfg)
        self.slo = Slo(scn.slo.ttft_s, scn.slo.tpot_s) if pattern == "sim" else None
        self.planner = make_planner("dspark", self.cfg)
        if self.slo is not None:
            self.planner.set_slo(self.slo)
        self.members: list = []
        self.rate: list[float] = []
        self.context: list[int] = []
        self.left: list[int] = []
        self.now = 0.0
        self.full = False  # whether the last round ran a full plan (round)
        self.k_cap = ENGINE_K_MAX if pattern == "engine" else scn.deployment.max_draft_tokens
        self.refill()

    def _lognormal(self, length) -> int:
        mu = np.log(length.mean_tokens) - length.sigma**2 / 2
        return int(np.clip(round(self.rng.lognormal(mu, length.sigma)), 1, length.max_tokens))

    def refill(self) -> None:
        acc, w = self.scn.acceptance, self.scn.workload
        a, b = acc.beta_mean * acc.beta_concentration, (1 - acc.beta_mean) * acc.beta_concentration
        while len(self.members) < self.B:
            c = make_controller("dspark", self.cfg)
            if self.slo is not None:
                c.set_slo(self.slo)
            self.members.append(c)
            self.rate.append(float(self.rng.beta(a, b)))
            self.context.append(self._lognormal(w.prompt))
            self.left.append(self._lognormal(w.output))

    def round(self) -> tuple[float, float, float]:
        """One round; the seconds spent in plan, the members' observe calls, observe_round
        (``self.full``: whether the plan was a full one)."""
        B, members = self.B, self.members
        ctx_sum = sum(self.context)
        t0 = time.perf_counter()
        decisions = plan_round(
            self.planner, members, self.now, BatchContext(B, ctx_sum, self.k_cap)
        )
        t1 = time.perf_counter()
        self.full = self.planner.full_plan
        caps = [
            min(d.k, self.k_cap, left - 1) if left > 1 else 0
            for d, left in zip(decisions, self.left)
        ]
        confs = [self.rng.uniform(0.3, 1.0, k).tolist() for k in caps]
        ks = [drafted(cf, d.tau) for cf, d in zip(confs, decisions)]
        confs = [tuple(cf[:k]) for cf, k in zip(confs, ks)]
        runs = np.minimum(self.rng.geometric(1.0 - np.minimum(self.rate, 0.999)) - 1, MAX_RUN)
        accepted = [min(int(r), k) for r, k in zip(runs, ks)]
        emitted = [min(n + 1, left) for n, left in zip(accepted, self.left)]
        steps, drafting = max(ks), sum(1 for k in ks if k)
        verify_tokens = sum(ks) + B
        verify_s = self.cluster.lat_t.seconds(B, verify_tokens, float(ctx_sum))
        draft_s = self.cluster.draft_phase_s(drafting, steps, float(ctx_sum)) if steps else 0.0
        end = self.now + draft_s + verify_s
        t_obs = self._observe(end, ks, accepted, emitted, confs, draft_s, verify_s, ctx_sum)
        stats = RoundStats(
            self.now,
            end,
            B,
            drafting,
            steps,
            verify_tokens,
            ctx_sum,
            draft_s,
            verify_s,
            sum(accepted),
            sum(emitted),
        )
        t4 = time.perf_counter()
        self.planner.observe_round(stats)
        t5 = time.perf_counter()
        self._advance(emitted, end)
        return t1 - t0, t_obs, t5 - t4

    def _observe(self, end, ks, accepted, emitted, confs, draft_s, verify_s, ctx_sum) -> float:
        """The members' observations, handed over as the drivers do (``observe_members``:
        ``sim.rounds`` with the confidences only when a controller reads them, ``real.engine``
        always), the call timed."""
        B, tokens = self.B, sum(ks) + self.B
        reads = any(getattr(c, "reads_confidences", True) for c in self.members)
        conf = confs if self.pattern == "engine" or reads else None
        t0 = time.perf_counter()
        self.planner.observe_members(
            self.members, end, ks, accepted, conf, draft_s, verify_s, self.context, [0] * B,
            emitted, [()] * B, tokens, ctx_sum,
        )  # fmt: skip
        return time.perf_counter() - t0

    def _advance(self, emitted: list[int], end: float) -> None:
        self.now = end
        keep = [i for i, (left, e) in enumerate(zip(self.left, emitted)) if left > e]
        self.context = [self.context[i] + emitted[i] for i in keep]
        self.left = [self.left[i] - emitted[i] for i in keep]
        self.members = [self.members[i] for i in keep]
        self.rate = [self.rate[i] for i in keep]
        self.refill()


def drafted(confidences: list[float], tau: float) -> int:
    """Tokens drafted of ``len(confidences)`` allowed: drafting stops at the first position
    whose confidence is below τ (0: never early)."""
    if tau > 0:
        for i, c in enumerate(confidences):
            if c < tau:
                return i
    return len(confidences)


def cost_per_round(
    scn, B: int, pattern: str, rounds: int, warmup: int, seed: int = 0, cfg=None
) -> dict:
    """Mean µs per round (plan, observe, observe_round, total) over ``rounds`` timed rounds,
    and the plan's split: µs of a full plan, of a kept one, and the share of full plans
    (``cfg``: the ``dspark`` config's overrides, None = defaults)."""
    batch = Batch(scn, B, pattern, seed, cfg)
    for _ in range(warmup):
        batch.round()
    t = np.zeros(3)
    plans = {True: [0.0, 0], False: [0.0, 0]}  # full / kept: (seconds, rounds)
    for _ in range(rounds):
        r = batch.round()
        t += r
        plans[batch.full][0] += r[0]
        plans[batch.full][1] += 1
    us = t / rounds * 1e6

    def mean_us(kind: bool) -> float:
        s, n = plans[kind]
        return s / n * 1e6 if n else float("nan")

    return {
        "plan": us[0],
        "observe": us[1],
        "observe_round": us[2],
        "total": float(us.sum()),
        "full_us": mean_us(True),
        "kept_us": mean_us(False),
        "full_share": plans[True][1] / rounds,
    }


def h100_round(scn, requests: int, cfg=None) -> tuple[float, float]:
    """(mean round seconds, mean batch size) over the rounds of a traced ``dspark`` run of
    ``scn`` with ``requests`` requests. A round of B sequences is B rows of rounds.csv."""
    from sim import simulate

    res = simulate(
        scn.with_overrides({"workload.num_requests": requests}),
        "dspark",
        cfg,
        trace=True,
        baseline=False,
    )
    r = res.rounds
    w = 1.0 / r["batch_size"].to_numpy(dtype=float)
    n_rounds = w.sum()
    round_s = float(((r["draft_s"] + r["verify_s"]).to_numpy() * w).sum() / n_rounds)
    return round_s, float(len(r) / n_rounds)


def sim_speed_ratio(scn, size: float, repeats: int, cfg=None) -> tuple[float, dict]:
    """Mean tokens per CPU-second of ``dspark`` over ``fixed`` (interleaved runs of
    ``benchmarks/sim_speed.py``'s measurement), and every run's rate."""
    import sim_speed as speed

    rates: dict[str, list[float]] = {"fixed": [], "dspark": []}
    cfgs = {"fixed": None, "dspark": cfg}
    for name in rates:
        speed.warm(scn, name, cfgs[name])
    for _ in range(repeats):
        for name in rates:
            rates[name].append(speed.measure(scn, name, cfgs[name], size)["rate"])
    return float(np.mean(rates["dspark"]) / np.mean(rates["fixed"])), rates


#: the planner's methods the simulator calls every round (``sim.rounds``)
PLANNER_CALLS = ("plan", "observe_members", "observe_round")


def planner_part(scn, size: float, cfg=None) -> dict:
    """One more ``dspark`` run of ``sim_speed.py``'s measurement with the planner's calls
    (:data:`PLANNER_CALLS`) timed apart (``time.process_time`` around each; the runs the ratio
    reads are not instrumented): their CPU-seconds, the run's, and its tokens."""
    import sim_speed

    from control.dspark_planner import DSparkPlanner

    spent = [0.0]
    saved = {n: DSparkPlanner.__dict__[n] for n in PLANNER_CALLS}

    def timed(f):
        def call(*args, **kwargs):
            t0 = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - t0

        return call

    try:
        for n, f in saved.items():
            setattr(DSparkPlanner, n, timed(f))
        m = sim_speed.measure(scn, "dspark", cfg, size)
    finally:
        for n, f in saved.items():
            setattr(DSparkPlanner, n, f)
    return {"planner_s": spent[0], "cpu_s": m["cpu_s"], "tokens": m["tokens"]}


#: the last line's number formats: µs to 0.1, the share (a fraction) and the ratio to 4 digits
LAST_LINE_FORMATS = ("{:.1f}", "{:.1f}", "{:.6f}", "{:.4f}")


def last_line(values: dict) -> str:
    return " ".join(f"{k}={f.format(values[k])}" for k, f in zip(LAST_LINE_KEYS, LAST_LINE_FORMATS))


def parse_last_line(line: str) -> dict[str, float]:
    """The last line back as numbers; ValueError unless it has exactly the four keys in order."""
    pairs = [p.split("=", 1) for p in line.split()]
    if [p[0] for p in pairs] != list(LAST_LINE_KEYS) or any(len(p) != 2 for p in pairs):
        raise ValueError(f"not a planner_cost last line: {line!r}")
    return {k: float(v) for k, v in pairs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1000, help="timed rounds per batch size")
    ap.add_argument("--warmup", type=int, default=100, help="untimed rounds first")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--share-requests", type=int, default=1000, help="requests of the traced run")
    ap.add_argument("--sim-size", type=float, default=1.0, help="M output tokens per sim_speed run")
    ap.add_argument("--repeats", type=int, default=2, help="sim_speed runs of each controller")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a dspark config key"
    )
    a = ap.parse_args(argv)
    from control.configio import parse_sets
    from control.errors import DSparkError
    from sim import load_scenario

    try:  # the dspark config's overrides, checked before any run
        cfg = parse_sets(a.set) or None
        make_config("dspark", cfg, source="--set")
    except (DSparkError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    scn = load_scenario(SCENARIO)
    batches = sorted({int(x) for x in a.batches.split(",")} | {16, 256})
    print(
        f"{'B':>4s} {'pattern':7s} {'plan':>9s} {'observe':>9s} {'obs_round':>9s} {'total µs':>9s}"
        f" {'full plan':>9s} {'kept plan':>9s} {'full share':>10s}"
    )
    engine = {}
    for B in batches:
        for pattern in PATTERNS:
            c = cost_per_round(scn, B, pattern, a.rounds, a.warmup, cfg=cfg)
            if pattern == "engine":
                engine[B] = c["total"]
            print(
                f"{B:4d} {pattern:7s} {c['plan']:9.1f} {c['observe']:9.1f} "
                f"{c['observe_round']:9.1f} {c['total']:9.1f} {c['full_us']:9.1f} "
                f"{c['kept_us']:9.1f} {c['full_share']:10.3f}",
                flush=True,
            )
    round_s, mean_b = h100_round(scn, a.share_requests, cfg)
    b_star = max(1, round(mean_b))
    at = cost_per_round(scn, b_star, "engine", a.rounds, a.warmup, cfg=cfg)["total"]
    share = at * 1e-6 / round_s
    print(
        f"standard scenario (H100-SXM): mean round {round_s * 1e3:.2f} ms at a mean batch of "
        f"{mean_b:.1f}; the planner at B = {b_star} (engine pattern) {at:.1f} µs = "
        f"{share * 100:.3f}% of a round",
        flush=True,
    )
    ratio, rates = sim_speed_ratio(scn, a.sim_size, a.repeats, cfg)
    for name, r in rates.items():
        print(
            f"sim_speed {a.sim_size:g}M {name}: "
            + ", ".join(f"{x:,.0f}" for x in r)
            + " tokens/CPU-s"
        )
    part = planner_part(scn, a.sim_size, cfg)
    fixed_rate = float(np.mean(rates["fixed"]))
    free = part["tokens"] / (part["cpu_s"] - part["planner_s"]) / fixed_rate
    print(
        f"sim_speed {a.sim_size:g}M dspark, its planner's calls timed apart: "
        f"{part['planner_s']:.2f} of {part['cpu_s']:.2f} CPU-s "
        f"({part['planner_s'] / part['cpu_s']:.0%}); with those calls free it would run at "
        f"{free:.3f} of fixed's tokens per CPU-second (what no planner can beat)"
    )
    print(
        last_line(
            {
                "planner_us_b16": engine[16],
                "planner_us_b256": engine[256],
                "planner_share_h100": share,
                "sim_dspark_vs_fixed": ratio,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
