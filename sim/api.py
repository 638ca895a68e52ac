"""``simulate`` one controller on a scenario, ``compare`` several on identical arrivals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from control.errors import ConfigError, DSparkError
from control.registry import make_config, make_controller, make_planner
from sim import engine
from sim.acceptance import AcceptanceModel
from sim.cluster import Cluster
from sim.config import SimConfig
from sim.metrics import requests_table, summarize
from sim.params import EngineParams
from sim.workload import Requests, generate

#: the run behind ``speedup``: k = 0 without the drafter (plain serving: no drafter memory, no
#: drafter prefill).
BASELINE = "fixed-k0"
#: the run behind ``speedup_resident``: k = 0 with the drafter resident (its memory and its
#: prefill paid, never drafting): the cost of hosting the drafter is in both.
BASELINE_RESIDENT = "fixed-k0-resident"
#: what each speedup compares against (written to summary.json; docs/results-format.md).
SPEEDUP_BASELINES = {
    "speedup": "fixed k = 0 without the drafter (plain serving), same seed and arrivals",
    "speedup_resident": "fixed k = 0 with the drafter resident (its memory and prefill paid), "
    "same seed and arrivals",
}


class SimWarning(UserWarning):
    """Something about a run's input worth one line (``dspark`` prints ``dspark: warning: ...``):
    the run goes on, e.g. requests that can never fit in KV memory are rejected and counted."""


def check_seed(seed: Any) -> int:
    """A seed is an integer >= 0 (numpy's SeedSequence takes no negative one)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed {seed!r}: allowed an integer >= 0")
    return int(seed)


def check_load_scale(load_scale: Any) -> float:
    """A load scale is a finite number > 0."""
    try:
        x = float(load_scale)
    except (TypeError, ValueError):
        raise ConfigError(f"load scale {load_scale!r}: allowed a finite number > 0") from None
    if not np.isfinite(x) or x <= 0:
        raise ConfigError(f"load scale {load_scale!r}: allowed a finite number > 0")
    return x


def check_requests(scn: SimConfig, reqs: Requests, cluster: Cluster, warn: bool = True) -> int:
    """Refuse a workload nothing of which can be measured; returns how many requests can never
    fit in one replica's KV memory (warned about once: they are rejected, not served).

    Errors (one line, key first): no request at all; no request arriving at or after
    ``sim.warmup_s``; no request that fits in KV memory."""
    n = len(reqs)
    if n == 0:
        raise ConfigError(
            "workload: no requests to simulate (an empty trace, or "
            "workload.horizon_s before the first arrival)"
        )
    warm = scn.sim.warmup_s
    last = float(np.max(reqs.arrival_s))
    if warm > 0 and last < warm:
        raise ConfigError(
            f"sim.warmup_s = {warm!r} leaves no request to measure (the last of "
            f"{n} arrives at {last:.4g} s); allowed below the last arrival"
        )
    params = EngineParams.of(scn, cluster)
    if params.kv_bytes_per_token <= 0:
        return 0
    cap = params.kv_capacity_tokens
    need = reqs.prompt_tokens.astype(np.int64) + reqs.output_tokens.astype(np.int64)
    too_big = int(np.count_nonzero(params.never_fits(need)))
    if too_big == n:
        raise DSparkError(
            f"no request fits in KV memory: the smallest needs "
            f"{int(need.min())} tokens, a replica holds {max(int(cap), 0)} (raise "
            "deployment.tp or deployment.kv_memory_fraction, or shorten "
            "workload lengths)"
        )
    if too_big and warn:
        import warnings

        warnings.warn(
            f"scenario '{scn.name}': {too_big} of {n} requests can never fit in KV "
            f"memory (over the {int(cap)} tokens a replica holds): rejected, counted in "
            "requests_rejected and requests_unfinished",
            SimWarning,
            stacklevel=2,
        )
    return too_big


def preflight(scn: SimConfig, seed: int = 0, load_scale: float = 1.0) -> Requests:
    """The checks ``simulate`` makes before it runs (seed, load scale, requests), without
    running: the requests of ``scn`` at ``seed`` and ``load_scale``."""
    seed, load_scale = check_seed(seed), check_load_scale(load_scale)
    reqs = _requests(scn, _streams(seed), load_scale)
    check_requests(scn, reqs, Cluster(scn, use_drafter=True))
    return reqs


@dataclass
class SimResult:
    summary: dict
    requests: Any  # pandas.DataFrame
    rounds: Any = None  # DataFrame of RoundRecord columns (trace=True)
    controller_trace: Any = None  # DataFrame (trace=True)
    controller_config: Any = None


def _streams(seed: int) -> dict[str, np.random.Generator]:
    names = ("arrivals", "lengths", "acceptance_init", "acceptance")
    return {
        n: np.random.default_rng(s)
        for n, s in zip(names, np.random.SeedSequence(seed).spawn(len(names)))
    }


def _requests(scn: SimConfig, streams, load_scale: float) -> Requests:
    return generate(scn.workload, streams, load_scale)


def _offered(scn: SimConfig, reqs: Requests, load_scale: float) -> float:
    if scn.workload.arrival in ("poisson", "gamma"):
        return scn.workload.rate_rps * load_scale
    span = float(reqs.arrival_s[-1] - reqs.arrival_s[0]) if len(reqs) > 1 else 0.0
    return (len(reqs) - 1) / span if span > 0 else float("nan")


def _run(
    scn: SimConfig,
    name: str,
    cfg_obj: Any,
    seed: int,
    load_scale: float,
    trace: bool,
    label: str,
    use_drafter: bool,
    progress: Any = None,
) -> tuple[dict, engine.RunData, Cluster]:
    st = _streams(seed)
    reqs = _requests(scn, st, load_scale)
    acc = AcceptanceModel(scn.acceptance, len(reqs), st["acceptance_init"], st["acceptance"])
    lens = acc.output_lengths()
    if lens is not None:
        reqs = Requests(reqs.arrival_s, reqs.prompt_tokens, lens, reqs.extra)
    cluster = Cluster(scn, use_drafter=use_drafter)
    check_requests(scn, reqs, cluster, warn=label not in (BASELINE, BASELINE_RESIDENT))
    probe = make_controller(name, cfg_obj)  # checks the config once

    def factory(_n=name, _c=cfg_obj):
        return make_controller(_n, _c)

    def planner_factory(_n=name, _c=cfg_obj):
        return make_planner(_n, _c)

    del probe
    planners = planner_factory() is not None  # a controller that plans rounds: one per replica
    cb = None
    if progress is not None:
        progress.reset(total=len(reqs))

        def cb(done):
            progress.n = done
            progress.refresh() if done == len(reqs) else progress.update(0)

    rd = engine.run(
        scn,
        cluster,
        reqs,
        factory,
        acc,
        trace=trace,
        label=label,
        progress=cb,
        make_planner=planner_factory if planners else None,
    )
    s = summarize(
        rd,
        scn,
        cluster,
        controller=label,
        seed=seed,
        load_scale=load_scale,
        offered_rps=_offered(scn, reqs, load_scale),
    )
    return s, rd, cluster


def resolve_controller_config(scn: SimConfig, name: str, controller_config: Any = None) -> Any:
    if controller_config is None:
        controller_config = scn.controller_config(name)
    return make_config(name, controller_config, source=str(scn.name))


def simulate(
    scn: SimConfig,
    controller: str = "dspark",
    controller_config: Any = None,
    seed: int = 0,
    trace: bool = False,
    baseline: bool = True,
    load_scale: float = 1.0,
    label: str | None = None,
    progress: Any = None,
    _baseline_cache: dict | None = None,
    resident_baseline: bool = False,
) -> SimResult:
    """Run ``controller`` on scenario ``scn``. ``controller_config``: None (the scenario's
    ``[controller.<name>]`` table, else defaults), a dict, or the config dataclass.

    With ``baseline`` a fixed k = 0 run without the drafter on the same seed and arrivals gives
    ``speedup`` (over plain serving); with ``resident_baseline`` too, a fixed k = 0 run with the
    drafter resident gives ``speedup_resident`` (NaN otherwise; ``compare`` runs both)."""
    if not isinstance(scn, SimConfig):
        raise ConfigError(f"simulate needs a SimConfig, got {type(scn).__name__}")
    seed, load_scale = check_seed(seed), check_load_scale(load_scale)
    cfg_obj = resolve_controller_config(scn, controller, controller_config)
    label = label or controller
    s, rd, _ = _run(scn, controller, cfg_obj, seed, load_scale, trace, label, True, progress)
    if rd.counters.measured_tokens == 0 and scn.sim.horizon_s is not None:
        raise ConfigError(
            f"sim.horizon_s = {scn.sim.horizon_s!r} ends the run before any output "
            f"token after sim.warmup_s = {scn.sim.warmup_s!r} (controller "
            f"'{label}'): nothing to measure; allowed a longer horizon"
        )
    if s["unmeasured_reason"]:
        import warnings

        warnings.warn(f"controller '{label}': {s['unmeasured_reason']}", SimWarning, stacklevel=2)
    runs = ([(BASELINE, False, "speedup")] if baseline else []) + (
        [(BASELINE_RESIDENT, True, "speedup_resident")] if baseline and resident_baseline else []
    )
    for base_label, use_drafter, key in runs:
        cache_key = (seed, load_scale, use_drafter)
        if _baseline_cache is not None and cache_key in _baseline_cache:
            base_tpot = _baseline_cache[cache_key]
        else:
            bs, _, _ = _run(
                scn,
                "fixed",
                make_config("fixed", {"k": 0}),
                seed,
                load_scale,
                False,
                base_label,
                use_drafter,
            )
            base_tpot = bs["mean_tpot_s"]
            if _baseline_cache is not None:
                _baseline_cache[cache_key] = base_tpot
        s[key] = speedup_of(base_tpot, s)
    import pandas as pd

    req = requests_table(rd, label)
    rounds = pd.DataFrame(rd.rounds) if trace else None
    ctrace = pd.DataFrame(rd.ctrl_trace) if trace else None
    return SimResult(s, req, rounds, ctrace, cfg_obj)


def speedup_of(base_tpot: float, summary: dict) -> float:
    """A run's speedup over a baseline of mean TPOT ``base_tpot`` (NaN without a TPOT, or
    when the run has no measurement window: ``unmeasured_reason``)."""
    if summary.get("unmeasured_reason"):
        return float("nan")
    m = summary["mean_tpot_s"]
    return base_tpot / m if m > 0 else float("nan")
