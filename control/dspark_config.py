"""The ``dspark`` controller's configuration (:mod:`control.dspark` describes both policies).

:class:`~control.dspark_base_config.DSparkBaseConfig` holds the fields both policies read,
:class:`GoodputPolicyConfig` (here) and :class:`~control.dspark_seed_config.SeedPolicyConfig`
each policy's own. :class:`DSparkConfig`, the ``[controller.dspark]`` table, is both of them plus
``policy``, which picks the controller class; a policy ignores the other one's fields."""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.dspark_base_config import DSparkBaseConfig
from control.dspark_seed_config import SeedPolicyConfig

__all__ = ["DSparkBaseConfig", "DSparkConfig", "GoodputPolicyConfig", "SeedPolicyConfig"]


@dataclass(frozen=True)
class GoodputPolicyConfig(DSparkBaseConfig):
    # 20 pseudo-trials: a new request starts at the pooled rate and is its own after ~8 rounds;
    # a sequence's own noise then moves its k less (4 chased it: at i.i.d. acceptance, where
    # every sequence has one rate, a quarter of its rounds drafted one token short;
    # benchmarks/controller_value.py, benchmarks/slo_value.py).
    prior_trials: float = param(
        20.0,
        lo=0.0,
        hi=1000.0,
        doc="goodput: weight of the pooled rate in a sequence's â",
        tune=(0.5, 64.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # slo-goodput: plan for the tokens of requests that meet the driver's SLOs (per-request
    # TPOT within the SLO, waiting prompts' value from their TTFT slack); with slack SLOs it is
    # the throughput plan. throughput: tokens per second of batch round time, SLOs ignored.
    objective: str = param(
        "slo-goodput",
        choices=("slo-goodput", "throughput"),
        doc="goodput: what the round plan maximises",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 1.0: a sequence's predicted TPOT (its rounds stretched by the replica's prefill share,
    # over its expected tokens) is held to the SLO itself; the spread below is the headroom.
    slo_margin: float = param(
        1.0,
        lo=0.1,
        hi=2.0,
        doc="goodput/slo-goodput: share of the TPOT SLO a plan may use",
        tune=(0.6, 1.2),
        when={"policy": ("goodput",)},
    )
    # 0 = steady state: a plan's round time is taken to last, and a sequence's TPOT is round time
    # over expected tokens. h > 0 weighs its TPOT so far as h rounds like the planned one, which
    # lost attainment in benchmarks/slo_value.py (sequences behind their SLO stop counting).
    slo_horizon_rounds: float = param(
        0.0,
        lo=0.0,
        hi=1e6,
        doc="goodput/slo-goodput: rounds a sequence's TPOT so far is weighed against (0 = none)",
        tune=(0.0, 256.0),
        when={"policy": ("goodput",)},
    )
    # 0 = off. L > 0: a sequence's TPOT so far is carried L mean outputs per sequence more
    # tokens at the planned round's time per token (its expected remaining output, where the
    # rounds' horizon above is a fixed count): a sequence behind its SLO counts while enough of
    # its life is left to recover. With the calibrated, narrow spread of
    # configs/dspark_knee.toml, L = 1 lifted attainment at the conversation knee from 0.9030 to
    # 0.9081 (fixed k = 1 0.9111, seeds 11-18); with the default spread it moved nothing
    # (benchmarks/slo_by_acceptance.py; docs/results.md, 2026-12-06).
    slo_life_horizon: float = param(
        0.0,
        lo=0.0,
        hi=1e3,
        doc="goodput/slo-goodput: mean outputs a sequence's TPOT so far is carried (0 = none)",
        tune=(0.25, 4.0),
        log=True,
        switch=True,
        when={"policy": ("goodput",)},
    )
    # 0 = never. w > 0: while the oldest waiting prompt has waited more than w × the TTFT SLO
    # (past the knee, where prompts queue), a plan ranks with slo_congested_spread, no TPOT
    # calibration and no history: the narrow, calibrated view that serves the knee loses
    # attainment there (configs/dspark_knee.toml at w = 0.5: 0.4179 / 0.1728 at loads 1.5 / 2
    # against 0.4068 / 0.1581 without it, fixed k = 1 0.4168 / 0.1675, seeds 1-2).
    slo_congested_wait: float = param(
        0.0,
        lo=0.0,
        hi=1e3,
        doc="goodput/slo-goodput: TTFT-SLO share the oldest waiting prompt waited past which "
        "plans rank by slo_congested_spread (0 = never)",
        tune=(0.1, 2.0),
        log=True,
        switch=True,
        when={"policy": ("goodput",)},
    )
    # 0.3: the default slo_spread, the view that serves loads past the knee best.
    slo_congested_spread: float = param(
        0.3,
        lo=0.0,
        hi=10.0,
        doc="goodput/slo-goodput: the predicted TPOT's relative spread while prompts queue "
        "past slo_congested_wait",
        tune=(0.01, 1.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 0.3: requests of one predicted TPOT differ by the prompt chunks they sit through, so a
    # sequence predicted at p meets the SLO with probability σ((SLO − p) / (0.3 · SLO)); 0 = a
    # hard cut (benchmarks/slo_by_acceptance.py at the two knees of benchmarks/slo_value.py).
    slo_spread: float = param(
        0.3,
        lo=0.0,
        hi=10.0,
        doc="goodput/slo-goodput: relative spread of a predicted TPOT (0 = hard cut)",
        tune=(0.01, 1.0),
        log=True,
        switch=True,
        when={"policy": ("goodput",)},
    )
    # on: every predicted TPOT is multiplied by the recent ratio of the rounds' real seconds
    # per token to what the plans predicted for them (control.tpot_calibration; at the
    # conversation trace's knee the rounds took 0.89 of their predicted seconds). Off by
    # default: on the conversation trace, with slo_spread 0.1 (configs/dspark_knee.toml),
    # capacity at SLO 1.232 -> 1.242 (fixed k = 1's) but SLO goodput at loads 1.5 / 2 0.997 /
    # 1.061 -> 0.886 / 0.832 of fixed k = 1's; with 0.3, 1.238 and 0.976 / 0.913, and on the
    # code trace 1.597 -> 1.615 (fixed k = 3 1.628) (benchmarks/slo_value.py, seeds 1-3;
    # docs/results.md, 2026-12-06).
    slo_calibrate: bool = param(
        False,
        choices=(False, True),
        doc="goodput/slo-goodput: hold predicted TPOTs to the rounds' real time per token",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # attainment: the row with the most requests expected to meet the SLO (the measure capacity
    # at SLO counts), goodput breaking ties; slo-goodput: goodput times the share of tokens from
    # sequences that meet it, which lets the long drafts of high-acceptance sequences lengthen
    # the rounds that low-acceptance ones need short (benchmarks/slo_by_acceptance.py).
    slo_rank: str = param(
        "attainment",
        choices=("attainment", "slo-goodput"),
        doc="goodput/slo-goodput: how a plan's rows are ranked against the TPOT SLO",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 0.02: the lowest cap whose expected share of the batch meeting the TPOT SLO is within
    # 0.02 of the best row's (slo_rank "attainment" only, while the SLO binds: see
    # slo_hurdle_from; in batches of at least 1 / 0.02 = 50 sequences, where 2% is a request;
    # not while prompts queue past slo_congested_wait): a longer cap must be predicted to
    # serve 2% more of the batch. At the conversation knee the best rows of caps 1 and 2
    # differ by less and the longer one lost: the best row trailed fixed k = 1 by 1.33 points
    # of attainment, this hurdle by 0.51; the code knee's small batches plan as before
    # (benchmarks/slo_by_acceptance.py's knees, development seeds 11-16; docs/results.md,
    # 2026-12-06). 0 = the best row.
    slo_rank_hurdle: float = param(
        0.02,
        lo=0.0,
        hi=1.0,
        doc="goodput/slo-goodput: share of the batch a longer cap must be predicted to add",
        tune=(0.0, 0.05),
        when={"policy": ("goodput",)},
    )
    # 0.6: the hurdle applies while the batch's mean TPOT so far is at least 0.6 of the TPOT
    # SLO (the conversation knee runs at ~0.7 of it, its load 1 at ~0.5, the code knee at
    # ~0.4); below, the best row, whose longer caps shorten every TPOT at light load (there the
    # hurdle alone cost 3-16% of mean TPOT, benchmarks/slo_value.py's workloads at loads 0.5
    # and 1; docs/results.md, 2026-12-06).
    slo_hurdle_from: float = param(
        0.6,
        lo=0.0,
        hi=10.0,
        doc="goodput/slo-goodput: the batch's mean TPOT so far, as a share of the TPOT SLO, "
        "from which slo_rank_hurdle applies",
        tune=(0.3, 1.0),
        when={"policy": ("goodput",)},
    )
    # on: no cost probe (explore_every) while the last full plan's rank hurdle bound (the
    # TPOT SLO binds: slo_hurdle_from, the batch of at least 1 / slo_rank_hurdle sequences, no
    # prompt queued past slo_congested_wait). A probe is a round at a cap the plan ranked
    # lower, paid in every sequence's TPOT (at the conversation knee 96% of the sequence-rounds
    # drafted k = 1, and the probes' k = 2 were more than half of the rest); the probes before
    # the SLO binds and the batch's own moves in size keep the cost slope read (no loss
    # measured). Development knees (seeds 11-16):
    # conversation -0.0051 -> -0.0004 of fixed k = 1's attainment, code identical (its small
    # batches never bind), past the conversation knee -0.0058 -> +0.0097 (docs/results.md,
    # 2026-12-07). Off: probes on their cadence whatever the SLO.
    slo_quiet_probes: bool = param(
        True,
        choices=(False, True),
        doc="goodput/slo-goodput: no cost probe while the SLO rank's hurdle binds",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # stretch: a sequence's planned round time is stretched by 1/(1 − ρ) (ρ, the replica's
    # recent prefill share): prompts arrive at their own rate, so a longer round carries more
    # of them. additive: the recent mean chunk seconds a round are added to every row's time,
    # a cost longer drafts amortise; it lifts attainment on the long-prompt code trace and
    # loses it on the conversation trace (benchmarks/slo_by_acceptance.py). backlog (default):
    # stretch, except while prompts wait beyond this round's pass: then the share of a
    # sequence's life those prompts will fill the pass (their rounds over its expected rounds)
    # pays this round's chunk seconds a round, the rest is stretched (control.prefill_backlog).
    # Capacity at SLO (benchmarks/slo_value.py, seeds 1-3, 0.5% tolerance): code 1.501 ->
    # 1.597 (fixed k = 3 1.628), conversation 1.238 -> 1.232 (fixed k = 1 1.242).
    slo_prefill: str = param(
        "backlog",
        choices=("stretch", "additive", "backlog"),
        doc="goodput/slo-goodput: how prompt chunks enter a sequence's predicted TPOT",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # on: a sequence predicted to miss the TPOT SLO at its goodput length drafts the shortest
    # length that meets it, when one within the cap does (control.goodput.slo_floor_plan); off:
    # the goodput plan's lengths, where a low-acceptance sequence falls to k = 0 and misses.
    # On the conversation trace past its knee it lifted attainment from 0.37-0.38 to 0.41-0.43
    # at load 1.5 (fixed k = 1: 0.41-0.43), development seeds 11-13
    # (benchmarks/slo_by_acceptance.py), and left the knees as they were.
    slo_floor: bool = param(
        True,
        choices=(False, True),
        doc="goodput/slo-goodput: raise each sequence's length to what meets the TPOT SLO",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 4: a waiting prompt about to miss its TTFT SLO is worth up to 4x the observed value of a
    # prompt token, so drafts give its chunk the pass. At 8 the long prompts of the Azure code
    # trace took rounds that its decoding sequences needed for their TPOT: at the code knee 4
    # lifted attainment by 0.2 points to fixed k = 3's and left the conversation knee as it
    # was (benchmarks/slo_field_search.py's knees, development seeds 11-16); capacity at SLO
    # on seeds 4-10 (benchmarks/slo_value.py), code 0.973 -> 0.992 of fixed k = 3,
    # conversation unchanged at 0.992 (docs/results.md, 2026-12-06).
    ttft_value_max: float = param(
        4.0,
        lo=0.0,
        hi=1000.0,
        doc="goodput/slo-goodput: cap on the TTFT urgency factor of a prompt token's value",
        tune=(1.0, 64.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 0.7: a middling drafter, used only until the first rounds of any request are seen.
    a_prior: float = param(
        0.7,
        lo=0.01,
        hi=0.99,
        doc="goodput: pooled rate before any round",
        tune=(0.3, 0.95),
        when={"policy": ("goodput",)},
    )
    # 4: explores a useful length while the cost model has seen only one token count.
    k_start: int = param(
        4,
        lo=1,
        hi=64,
        doc="goodput: cap of the first rounds (cold start)",
        tune=(1, 8),
        when={"policy": ("goodput",)},
    )
    # every 32nd round tries the neighbouring cap so the cost slope stays identifiable.
    explore_every: int = param(
        32,
        lo=0,
        hi=100_000,
        doc="goodput: rounds between cost probes at cap ± 1 (0 = never)",
        tune=(0, 256),
        when={"policy": ("goodput",)},
    )
    # 64 rounds: long enough to average a sequence's noise, short enough to follow its regime.
    memory_rounds: int = param(
        64,
        lo=1,
        hi=100_000,
        doc="goodput: forgetting horizon of acceptance evidence (rounds)",
        tune=(4, 1024),
        log=True,
        when={"policy": ("goodput",)},
    )
    # outcomes: a sequence's evidence is what verification accepted. confidence: for a drafter
    # with a calibrated confidence head (the block drafter): the evidence is what its
    # confidences predicted (the expected accepted tokens and rejection of each round), and
    # each drafted block is cut at the plan's break-even survival (control.dspark_planner,
    # item 8); with the default the survival stop is off.
    acceptance_source: str = param(
        "outcomes",
        choices=("outcomes", "confidence"),
        doc="goodput: a sequence's acceptance evidence: verification outcomes or confidences",
        when={"policy": ("goodput",)},
    )
    # the last ~4 rounds, weighed against 8 pseudo-trials of the long-run rate: a good or bad
    # stretch (easy/hard regimes) moves a sequence's â within a few rounds, noise hardly does.
    recent_rounds: int = param(
        4,
        lo=1,
        hi=10_000,
        doc="goodput: forgetting horizon of the recent-evidence estimate (rounds)",
        tune=(1, 64),
        log=True,
        when={"policy": ("goodput",)},
    )
    recent_prior: float = param(
        8.0,
        lo=0.0,
        hi=1e6,
        doc="goodput: pseudo-trials of the long-run rate in the recent estimate (large = ignore)",
        tune=(0.5, 1000.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 0.99 per round: the cost fit remembers ~100 rounds and follows a change of load.
    cost_forget: float = param(
        0.99,
        lo=0.5,
        hi=1.0,
        doc="goodput: forgetting factor of costs",
        tune=(0.9, 0.999),
        when={"policy": ("goodput",)},
    )
    # 32 rounds: an engine's measured start-up profile counts as a third of the ~100 rounds
    # the fit remembers: rounds spread over many draft lengths outweigh it, rounds crowded at
    # one length (whose timing noise would set the slope) cannot; it matters most where the
    # first rounds are slow to vary (benchmarks/real_tp.py, TP = 2 with dspark).
    # 0 = off (the engine then times nothing).
    profile_prior_rounds: float = param(
        32.0,
        lo=0.0,
        hi=1e6,
        doc="goodput: weight of a seeded cost profile, in rounds",
        when={"policy": ("goodput",)},
    )
    # 1: a prompt token that drafts push out of a full chunked-prefill pass is worth one output
    # token (the request it belongs to joins the batch that much later); 0 = only its time.
    # Under prompt_value_source = "observed" this is the prior of the learned value.
    prompt_token_value: float = param(
        1.0,
        lo=0.0,
        hi=100.0,
        doc="goodput: output tokens a displaced prompt token is worth (chunked prefill)",
        tune=(0.0, 4.0),
        when={"policy": ("goodput",)},
    )
    # observed: a prompt token is worth the output its request brings per prompt token, learned
    # as Σ emitted / Σ prefilled over the rounds (~1000 rounds' memory), prompt_token_value
    # its prior: chat-sized prompts (~300 in, ~250 out) move it toward 0.8, 14k-token prompts
    # with ~340 out toward 340/14000 = 0.024, and the drafts get the pass (measured by
    # benchmarks/prompt_value.py and the long-context trace of benchmarks/long_context_trace.py).
    # fixed: prompt_token_value as is.
    prompt_value_source: str = param(
        "observed",
        choices=("fixed", "observed"),
        doc="goodput: prompt-token value fixed, or learned from emitted / prefilled tokens",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 65536 prompt tokens (~200 chat prompts), forgotten like the evidence: the value moves once
    # a workload's prompts and outputs have been seen at scale, not while a big batch first
    # fills (a small prior lets the first prompts of a filling batch set it:
    # benchmarks/prompt_value.py, the capacity cells at B = 128/256).
    prompt_value_prior_tokens: float = param(
        65536.0,
        lo=0.0,
        hi=1e9,
        doc="goodput: prompt tokens of pseudo-evidence behind prompt_token_value (observed)",
        tune=(1024.0, 1048576.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 4 rounds: a prompt that has waited longer means prompts queue (the replica is
    # saturated). The plain step's share of its chunk's pass, paid whatever the drafts, then
    # stays out of the goodput ratio, where counting it made every draft look cheaper
    # (the 30 capacity cells' geometric mean: +0.56% on the matrix's seeds, +0.0% on seeds
    # 20-21; at batch 64-256 +0.22% on seeds 30-37; single cells move ±2% with the seeds). A
    # prompt prefilled on arrival leaves it in: the running sequences sit through the chunk,
    # and longer drafts amortise it (the Markov open-loop cells lose 0.7-0.9% of TPOT
    # without). Waits of 4 and 16 rounds part the matrix's capacity cells from its open-loop
    # ones alike; 1 mixes them.
    # 0: always out (docs/results.md, 2026-12-06).
    sunk_share_rounds: float = param(
        4.0,
        lo=0.0,
        hi=1e9,
        doc="goodput: rounds a prompt waits before the plain step's share of its chunk's pass "
        "leaves the goodput ratio",
        tune=(0.5, 64.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 2 rounds: a sequence's belief moves within a few rounds when text switches between easy
    # and hard stretches (6 seeds: 8 rounds lost 2-3% to 2 on Markov and mixed-rate cells);
    # each full plan costs ~0.3 ms of CPU, so 1 doubles the planner's cost again for ~1%.
    replan_rounds: int = param(
        2,
        lo=1,
        hi=10_000,
        doc="goodput: rounds between full plans",
        tune=(1, 32),
        log=True,
        when={"policy": ("goodput",)},
    )
    # slo-goodput without a TPOT SLO, while no prompt queues (sunk_share_rounds): rank the caps
    # by the batch's tokens per second (goodput) or by the mean over its sequences of the
    # predicted time per token (mean-tpot: each request's latency weighs alike). mean-tpot:
    # the matrix's open-loop cells 0.9996 -> 1.0028 of the best fixed k (Markov heavy and swing
    # 0.989 / 0.990 -> 0.998 / 1.004), capacity cells +0.2% (docs/results.md, 2026-12-06).
    no_slo_rank: str = param(
        "mean-tpot",
        choices=("goodput", "mean-tpot"),
        doc="slo-goodput without a TPOT SLO, no prompt queueing: rank caps by goodput or mean TPOT",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # fixed: prior_trials and recent_prior as set. predictive: prior_trials times 1/4-16 and
    # recent_prior times 1-64, the pair whose beliefs predicted the batch's outcomes best
    # (control.belief_weights). Predictive: a batch of one rate stops following each sequence's
    # noise (i.i.d. cells +0.8% at batch 1 and 16); the capacity cells' geometric mean +0.1% on
    # the benchmark's seeds, +0.2-0.6% on others; capacity at SLO unchanged (docs/results.md,
    # 2026-12-06). With acceptance_source "confidence" the weights are as set.
    belief_weights: str = param(
        "predictive",
        choices=("fixed", "predictive"),
        doc="goodput: the beliefs' pseudo-trial weights as set, or the best predicting on a grid",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 0: a full plan every replan_rounds. b > 0: each full plan that keeps every sequence's
    # planned length doubles the interval, up to 2^b · replan_rounds (at most explore_every);
    # one that changes a length, a prompt starting or ending to wait, or a new draft limit
    # from the engine re-plans at once.
    # Off: at 3 the planner's CPU at batch 16-64 roughly halves and the SLO knees' attainment
    # stays within its seed noise (10 seeds), but a kept plan holds a Markov sequence at its
    # old length after its text turns hard: the capacity-mode matrix loses 0.3% (geometric
    # mean), its Markov cells up to 2.8% (docs/results.md, 2026-12-06).
    replan_backoff: int = param(
        0,
        lo=0,
        hi=8,
        doc="goodput: doublings of the replan interval after full plans that kept every length",
        tune=(0, 4),
        when={"policy": ("goodput",)},
    )
    # off: under goodput a sequence whose drafts do not pay already stops (its â falls); a forced
    # cool-down also stops it where drafting is nearly free (the others set the round's steps).
    goodput_cooldown: bool = param(
        False,
        choices=(False, True),
        doc="goodput: also apply the retry-cap cool-down",
        tune=True,
        when={"policy": ("goodput",)},
    )


@dataclass(frozen=True)
class DSparkConfig(GoodputPolicyConfig, SeedPolicyConfig):
    # --- policy -------------------------------------------------------------------------------
    # goodput: load-aware round planning (control.dspark_planner); seed: the seed's α → k rule.
    policy: str = param(
        "goodput",
        choices=("goodput", "seed"),
        doc="goodput (load-aware, default) or seed (α → k as written)",
    )
