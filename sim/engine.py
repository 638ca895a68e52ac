"""The serving loop: one SimPy process per replica (:class:`sim.replica.Replica`) plus one
arrival process that routes requests to replicas. One SimPy event per round per replica, never
one per token; see :mod:`sim.replica` for a round's steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from control.batch import RoundPlanner, Slo, told_slo
from control.types import Decision
from sim.acceptance import AcceptanceModel
from sim.cluster import Cluster
from sim.ledger import Counters, Ledger
from sim.params import EngineParams
from sim.quiet_gc import quiet_gc
from sim.replica import Replica, Shared
from sim.trace import RoundTrace
from sim.workload import Requests


@dataclass
class RunData:
    reqs: Requests
    first_token_s: np.ndarray
    finish_s: np.ndarray
    emitted: np.ndarray
    replica: np.ndarray
    counters: Counters
    end_s: float
    rounds: dict | None  # RECORD_COLUMNS columns (trace=True)
    ctrl_trace: dict | None
    rejected: np.ndarray
    admitted_s: np.ndarray  # when each request's prefill first started (NaN: never)
    acceptance_rate: (
        np.ndarray
    )  # each request's own acceptance rate (AcceptanceModel.request_rates)


def run(
    scn,
    cluster: Cluster,
    reqs: Requests,
    make_ctrl: Callable[[], Any],
    acc: AcceptanceModel,
    *,
    trace: bool = False,
    label: str = "",
    progress: Any = None,
    make_planner: Callable[[], RoundPlanner | None] | None = None,
) -> RunData:
    """Simulate ``reqs`` on ``cluster`` with one ``make_ctrl()`` controller per request.

    ``make_planner``: called once per replica; a replica whose planner is not None decides
    each round with ``planner.plan`` (and tells it ``observe_round``) instead of asking each
    sequence's controller. ``progress``: called with the number of finished requests.
    """
    with quiet_gc():
        return _simulate(
            EngineParams.of(scn, cluster),
            cluster,
            reqs,
            make_ctrl,
            acc,
            trace,
            label,
            progress,
            make_planner,
        )


def _simulate(
    params: EngineParams,
    cluster: Cluster,
    reqs: Requests,
    make_ctrl: Callable[[], Any],
    acc: AcceptanceModel,
    trace: bool,
    label: str,
    progress: Any,
    make_planner: Callable[[], Any] | None,
) -> RunData:
    env = simpy.Environment()
    slo = Slo(params.slo_ttft_s, params.slo_tpot_s)
    make_ctrl = told_slo(make_ctrl, slo)
    ledger = Ledger(reqs, params.kv_bytes_per_token, progress)
    tracer = RoundTrace(label, len(reqs)) if trace else None
    probe = make_ctrl()
    # controllers that never read Observation.confidences get () (no per-token tuples); the
    # confidences are still drawn (same random stream), and built whenever τ or a trace needs them
    shared = Shared(
        env,
        params,
        cluster,
        acc,
        ledger,
        make_ctrl,
        tracer,
        needs_future=bool(getattr(probe, "needs_future", False)),
        confidences_to_controllers=bool(getattr(probe, "reads_confidences", True)) or trace,
    )
    replicas = [
        Replica(i, shared, _planner(make_planner, params, cluster)) for i in range(params.replicas)
    ]
    env.process(arrivals(env, reqs.arrival_s, replicas, params.routing, ledger.replica))
    for r in replicas:
        env.process(r.serve())
    if params.horizon_s is not None:
        env.run(until=params.horizon_s)
    else:
        env.run()
    for r in replicas:
        r.flush()
    if params.horizon_s is not None:
        end_s = float(params.horizon_s)
    else:
        end_s = float(max(ledger.last_finish_s, reqs.arrival_s[-1] if len(reqs) else 0.0))
    return RunData(
        reqs,
        ledger.first_token_s,
        ledger.finish_s,
        ledger.emitted,
        ledger.replica,
        ledger.counters,
        end_s,
        tracer.round_columns() if tracer else None,
        tracer.controllers if tracer else None,
        ledger.rejected,
        ledger.admitted_s,
        acc.request_rates(),
    )


def arrivals(
    env: simpy.Environment,
    arrival_s: np.ndarray,
    replicas: list[Replica],
    routing: str,
    replica_of: np.ndarray,
):
    """The arrival process: each request at its time to a replica (round-robin; the one with
    the fewest outstanding requests; or the one with the fewest prompt tokens waiting to be
    prefilled, then the fewest outstanding requests; lowest index first)."""
    next_rr = 0
    for i in range(len(arrival_s)):
        dt = arrival_s[i] - env.now
        if dt > 0:
            yield env.timeout(dt)
        if routing == "round-robin":
            r = replicas[next_rr]
            next_rr = (next_rr + 1) % len(replicas)
        elif routing == "least-pending-tokens":
            r = min(replicas, key=lambda x: (x.pending_prefill_tokens(), x.outstanding, x.index))
        else:
            r = min(replicas, key=lambda x: (x.outstanding, x.index))
        replica_of[i] = r.index
        r.enqueue(i)


__all__ = ["Counters", "Decision", "RunData", "run"]


def _planner(make_planner: Callable[[], Any] | None, params: EngineParams, cluster: Cluster):
    """A replica's round planner (or None), seeded with the modelled start-up profile when
    ``seed_planner_costs`` asks (as the real engine seeds its own)."""
    p = make_planner() if make_planner is not None else None
    if p is not None and hasattr(p, "set_slo"):
        p.set_slo(Slo(params.slo_ttft_s, params.slo_tpot_s))
    if p is not None and params.seed_planner_costs and getattr(p, "wants_costs_seed", False):
        p.seed_costs(cluster.cost_seed_rows(params.max_batch, params.max_draft))
    return p
