"""The objective: one callable that scores a controller config over workloads × seeds.

``Objective(cfg)(trial)`` suggests a config (:func:`tuning.space.suggest_config`) and the
scenario values of ``[tune] scenario_params`` (:func:`tuning.space.suggest_scenario`, written
over every instance's scenario for that trial), simulates it
on every tuning workload and seed (an *instance*), and returns the mean of the objective's
metric(s) over the instances. After each workload of a single-objective study it reports to
the pruner (step = workload index): the running mean over the workloads so far (median pruner:
comparable across trials at the same step) or the workload's own mean (Wilcoxon pruner: paired
per-workload comparison). The mean of every
summary metric is kept as a user attribute, and ``constraint`` holds
``mean lossy_accept_fraction − max_lossy_fraction`` (feasible when <= 0) for the samplers'
``constraints_func``. The same value is stored where every reader looks: Optuna >= 5's
``constraints:lossy`` (``Trial.set_constraint``) and the list ``constraints`` that
optuna-dashboard (0.21) reads to mark infeasible trials.

A single-objective trial that breaks the constraint ends PRUNED (user attribute
``infeasible``), not COMPLETE: Optuna's storage-level best trial — what optuna-dashboard shows
as "Best Trial" — takes the best COMPLETE value and ignores constraints, so only this way do the
dashboard, ``study.best_trial`` and ``best_config.toml`` name the same trial. Samplers still
learn from it: TPE sorts infeasible trials by their violation whatever their state, and the
trial's value is its full objective (reported as the last intermediate value).

The SLO objectives (:mod:`tuning.slo`) score the user's question: ``slo-capacity`` the capacity
at SLO of each instance (a bisection from the workload's knee, the default config's capacity,
within a bracket around it), ``slo-knee-goodput`` the SLO goodput at the knee (one simulation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from tuning.config import SLO_OBJECTIVES, TuningConfig, WorkloadSpec, load_workload
from tuning.space import scenario_space, suggest_config, suggest_scenario
from tuning.storage import worker_tag

# objective -> ((summary metric, direction), ...)
OBJECTIVE_METRICS: dict[str, tuple[tuple[str, str], ...]] = {
    "throughput": (("throughput_tokens_per_s", "maximize"),),
    "goodput": (("goodput_tokens_per_s", "maximize"),),
    "p99_tpot": (("tpot_p99_s", "minimize"),),
    "throughput-p99": (("throughput_tokens_per_s", "maximize"), ("tpot_p99_s", "minimize")),
    "throughput-quality": (
        ("throughput_tokens_per_s", "maximize"),
        ("lossy_accept_fraction", "minimize"),
    ),
    "slo-capacity": (("slo_capacity_load_scale", "maximize"),),
    "slo-knee-goodput": (("goodput_tokens_per_s", "maximize"),),
}
#: metrics averaged over instances and stored on every trial.
KEPT_METRICS = (
    "throughput_tokens_per_s",
    "goodput_tokens_per_s",
    "tpot_p99_s",
    "mean_accepted_length",
    "acceptance_rate",
    "lossy_accept_fraction",
    "slo_attainment",
    "slo_capacity_load_scale",
    "slo_capacity_below_bracket",
    "slo_capacity_above_bracket",
)


def directions(objective: str) -> list[str]:
    return [d for _, d in OBJECTIVE_METRICS[objective]]


def metric_names(objective: str) -> list[str]:
    return [m for m, _ in OBJECTIVE_METRICS[objective]]


class NoSlot(RuntimeError):
    """The trial was not one of the study's queued slots (the queue ran dry under a race)."""


class DuplicateSlot(RuntimeError):
    """The trial's slot is held by an earlier trial (queued twice by two commands or by a race
    with a retry): it is failed unrun, and the earlier one fills the slot."""


def slot_holder(trial: Any) -> int | None:
    """The number of the trial that fills ``trial``'s slot when that is not ``trial``: the
    smallest-numbered trial of the slot that is WAITING, RUNNING, COMPLETE or PRUNED. Every
    worker applies the same rule after its atomic claim, so exactly one trial runs a slot."""
    slot = trial.user_attrs.get("slot")
    if slot is None:
        return None
    from optuna.trial import TrialState

    live = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
    first = min(
        (
            t.number
            for t in trial.study.get_trials(deepcopy=False, states=live)
            if t.user_attrs.get("slot") == slot
        ),
        default=trial.number,
    )
    return first if first < trial.number else None


#: Optuna >= 5 takes constraints from ``Trial.set_constraint``; older ones need constraints_func.
NATIVE_CONSTRAINTS = hasattr(optuna.Trial, "set_constraint")
#: the trial system attribute optuna-dashboard reads constraint values from (a list)
DASHBOARD_CONSTRAINTS = "constraints"


class Infeasible(optuna.TrialPruned):
    """A finished single-objective trial that breaks the quality constraint (ends PRUNED)."""


def constraint_of(trial: optuna.trial.FrozenTrial) -> tuple[float, ...]:
    """``constraints_func`` for samplers of Optuna < 5 (module level: workers rebuild it)."""
    return tuple(trial.user_attrs.get("constraint", (0.0,)))


def default_simulate(
    scn: Any, controller: str, config: Any, seed: int, baseline: bool, load_scale: float = 1.0
) -> dict:
    from sim import simulate

    return dict(
        simulate(
            scn,
            controller,
            controller_config=config,
            seed=seed,
            trace=False,
            baseline=baseline,
            load_scale=load_scale,
        ).summary
    )


@dataclass
class Instance:
    workload: str
    seed: int
    scenario: Any
    knee: float = 1.0  # the default config's capacity at SLO (SLO objectives), load scale


class Objective:
    """Score a controller config over ``workloads × seeds``; callable on an Optuna trial.

    ``simulate`` replaces the simulator (signature of :func:`default_simulate`); used by tests
    of the storage machinery. ``require_slot``: refuse trials that are not queued slots.
    ``search`` replaces :func:`sim.capacity.search` (SLO objectives); ``knee_controller``: whose
    defaults set the knees (the study's controller unless given).
    """

    def __init__(
        self,
        cfg: TuningConfig,
        simulate: Callable[..., dict] | None = None,
        controller: str | None = None,
        objective: str | None = None,
        workloads: tuple[WorkloadSpec, ...] | None = None,
        seeds: tuple[int, ...] | None = None,
        require_slot: bool = False,
        search: Callable[..., Any] | None = None,
        knee_controller: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.controller = controller or cfg.tune.controller
        self.objective = objective or cfg.tune.objective
        self.metrics = OBJECTIVE_METRICS[self.objective]
        self.pinned = cfg.pinned() if self.controller == cfg.tune.controller else {}
        self.simulate = simulate or default_simulate
        self.require_slot = require_slot
        self.max_lossy = cfg.tune.max_lossy_fraction
        self.constrained = self.objective != "throughput-quality"
        self.report_each = cfg.tune.pruner == "wilcoxon"
        wls = workloads if workloads is not None else cfg.tune.workloads
        seeds = seeds if seeds is not None else cfg.tune.sim_seeds
        self.instances = [Instance(w.name, s, load_workload(w)) for w in wls for s in seeds]
        # [tune] scenario_params: drawn by the tuned controller's trials only
        tuned = self.controller == cfg.tune.controller and bool(cfg.tune.scenario_params)
        self.scenario_dims = scenario_space(cfg.tune.scenario_params) if tuned else []
        self._scenarios: dict[tuple, Any] = {}
        self.search = search
        if self.objective in SLO_OBJECTIVES:
            from tuning.slo import prepare_knees

            pairs = [(w, s) for w in wls for s in seeds]
            knees = prepare_knees(cfg, pairs, knee_controller, search_fn=search)
            for i, k in zip(self.instances, knees):
                i.knee = k

    def scenario_of(self, i: Instance, scenario: dict[str, Any] | None = None) -> Any:
        """Instance ``i``'s scenario with the dotted ``scenario`` overrides written in."""
        if not scenario:
            return i.scenario
        key = (id(i), tuple(sorted((k, repr(v)) for k, v in scenario.items())))
        if key not in self._scenarios:
            self._scenarios[key] = i.scenario.with_overrides(dict(scenario))
        return self._scenarios[key]

    def run(self, i: Instance, config: Any, scenario: dict[str, Any] | None = None) -> dict:
        """The summary row of ``config`` on instance ``i`` (the objective's own measure), its
        scenario with the dotted ``scenario`` overrides (a trial's tuned scenario values)."""
        scn = self.scenario_of(i, scenario)
        if self.objective == "slo-knee-goodput":
            x = i.knee * self.cfg.slo.knee_load
            return self.simulate(scn, self.controller, config, i.seed, False, load_scale=x)
        if self.objective != "slo-capacity":
            return self.simulate(scn, self.controller, config, i.seed, False)
        from sim.capacity import search
        from tuning.slo import bracket_config, capacity_row

        cc = bracket_config(self.cfg.slo, i.knee)
        r = (self.search or search)(scn, self.controller, config, self.controller, i.seed, cc)
        row = capacity_row(r, cc)
        # strict verification accepts nothing lossy: the constraint needs no simulation
        row["lossy_accept_fraction"] = 0.0
        if getattr(config, "mode", "strict") != "strict":
            s = self.simulate(
                scn, self.controller, config, i.seed, False, load_scale=row["load_scale"]
            )
            row["lossy_accept_fraction"] = s["lossy_accept_fraction"]
        return row

    def scores(
        self, config: Any, trial: Any = None, scenario: dict[str, Any] | None = None
    ) -> dict[str, float]:
        """Mean summary metrics of ``config`` over the instances (their scenarios with the dotted
        ``scenario`` overrides); with ``trial``, one report per workload (step = workload
        index) for the pruner."""
        primary = self.metrics[0][0]
        single = len(self.metrics) == 1 and trial is not None
        rows: list[dict] = []
        per_workload: list[float] = []
        for step, (name, group) in enumerate(self._by_workload()):
            mine = [self.run(i, config, scenario) for i in group]
            rows += mine
            per_workload.append(sum(float(r[primary]) for r in mine) / len(mine))
            if single:
                v = per_workload[-1] if self.report_each else sum(per_workload) / len(per_workload)
                trial.report(v, step)
                if trial.should_prune():
                    self._keep(trial, rows)
                    raise optuna.TrialPruned(f"pruned after workload {name}")
        for m, _ in self.metrics:
            if m not in rows[0]:
                raise KeyError(f"simulator summary has no metric '{m}'")
        means = {
            m: sum(float(r[m]) for r in rows) / len(rows)
            for m in {*KEPT_METRICS, *(m for m, _ in self.metrics)}
            if m in rows[0]
        }
        if trial is not None:
            self._keep(trial, rows)
        return means

    def _by_workload(self) -> list[tuple[str, list[Instance]]]:
        groups: dict[str, list[Instance]] = {}
        for i in self.instances:
            groups.setdefault(i.workload, []).append(i)
        return list(groups.items())

    def _keep(self, trial: Any, rows: list[dict]) -> float | None:
        """Store the mean metrics and the constraint on ``trial``; returns the constraint
        value (None for an unconstrained objective)."""
        for m in KEPT_METRICS:
            if rows and m in rows[0]:
                trial.set_user_attr(m, sum(float(r[m]) for r in rows) / len(rows))
        c = None
        if self.constrained:
            lossy = sum(float(r.get("lossy_accept_fraction", 0.0)) for r in rows) / len(rows)
            c = lossy - self.max_lossy
            trial.set_user_attr("constraint", [c])
            if not isinstance(trial, optuna.trial.FixedTrial):
                if hasattr(trial, "set_constraint"):
                    trial.set_constraint("lossy", c)  # Optuna >= 5: samplers read it here
                # optuna-dashboard reads the list under "constraints" (Optuna < 5's key)
                trial.storage.set_trial_system_attr(trial._trial_id, DASHBOARD_CONSTRAINTS, [c])
        trial.set_user_attr("instances", len(rows))
        return c

    def values(self, config: Any, scenario: dict[str, Any] | None = None) -> tuple[float, ...]:
        """The objective value(s) of ``config`` without a trial (independent re-check)."""
        means = self.scores(config, scenario=scenario)
        return tuple(means[m] for m, _ in self.metrics)

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        if self.require_slot and "slot" not in trial.user_attrs:
            trial.set_user_attr("stray", True)
            raise NoSlot(f"trial {trial.number} is not a queued slot")
        if self.require_slot and not isinstance(trial, optuna.trial.FixedTrial):
            holder = slot_holder(trial)
            if holder is not None:
                trial.set_user_attr("stray", True)
                trial.set_user_attr("duplicate_of", holder)
                raise DuplicateSlot(
                    f"trial {trial.number}: slot {trial.user_attrs['slot']} "
                    f"is filled by trial {holder}"
                )
        if not isinstance(trial, optuna.trial.FixedTrial) and "worker" not in trial.user_attrs:
            trial.set_user_attr("worker", worker_tag())  # samplers of tuning.study tag already
        config = suggest_config(trial, self.controller, self.pinned)
        means = self.scores(config, trial, suggest_scenario(trial, self.scenario_dims))
        vals = tuple(means[m] for m, _ in self.metrics)
        for v in vals:
            if not math.isfinite(v):
                raise ValueError(f"objective value {v} is not finite")
        c = trial.user_attrs.get("constraint", [0.0])[0] if self.constrained else 0.0
        if len(vals) == 1 and c > 0 and not isinstance(trial, optuna.trial.FixedTrial):
            # the full objective as the last intermediate value: the PRUNED trial's value
            trial.set_user_attr("infeasible", True)
            trial.report(vals[0], len(self._by_workload()))  # after the per-workload steps
            raise Infeasible(
                f"lossy accepted fraction {c + self.max_lossy:.4g} > "
                f"{self.max_lossy:g}: breaks the quality constraint"
            )
        return vals[0] if len(vals) == 1 else vals
