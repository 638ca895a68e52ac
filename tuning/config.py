"""The tuning config (``configs/tune_*.toml``): what to tune, on which workloads, judged where.

::

    [tune]                      # the study
    controller = "dspark"
    objective = "throughput"
    n_trials = 200
    [[tune.workloads]]          # tuning workloads: a scenario file + dotted overrides
    name = "standard"
    scenario = "standard.toml"  # relative to this file
    overrides = { "workload.rate_rps" = 3.0 }

    [evaluate]                  # held-out judgement of the best config
    [[evaluate.workloads]]
    name = "azure-conv"
    scenario = "azure_conv.toml"

    [slo]                       # the user's SLOs (objectives slo-capacity, slo-knee-goodput)
    attainment = 0.9
    ttft_s = 2.0                # optional: every workload's TTFT SLO unless its overrides set one

A held-out workload must differ from every tuning workload (scenario or overrides);
:func:`load_tuning_config` refuses a config where one is the same as a tuning workload.

Under an SLO objective every workload needs SLOs: its scenario's ``[slo]`` table, its own
``slo.ttft_s`` / ``slo.tpot_s`` overrides, or the times of this file's ``[slo]`` (which the
loader writes into the overrides of every workload that does not set its own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from control import controller_names
from control.configio import from_mapping, param, read_toml
from control.errors import ConfigError

OBJECTIVES = (
    "throughput",
    "goodput",
    "p99_tpot",
    "throughput-p99",
    "throughput-quality",
    "slo-capacity",
    "slo-knee-goodput",
)
#: objectives that ask the user's question: capacity at their SLOs (docs/design.md)
SLO_OBJECTIVES = ("slo-capacity", "slo-knee-goodput")
SAMPLERS = ("auto", "tpe", "cmaes", "gp", "random", "nsga2")
PRUNERS = ("median", "wilcoxon", "none")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class WorkloadSpec:
    # names label rows of evaluation.csv and intermediate reports.
    name: str = param("", doc="workload name (unique within its list)")
    # a scenario file of the simulator.
    scenario: str = param("", doc="scenario TOML, relative to the tuning config's folder")
    # none: the scenario as written.
    overrides: dict = param(default_factory=dict, doc="dotted scenario overrides")

    def key(self) -> tuple:
        """Identity of the workload (what must differ between tuning and held-out)."""
        return (
            str(Path(self.scenario).resolve()),
            tuple(sorted((k, repr(v)) for k, v in self.overrides.items())),
        )


@dataclass(frozen=True)
class TuneSection:
    # the seed's scheduler is the controller this lab exists to tune.
    controller: str = param("dspark", doc="controller to tune")
    # throughput is the headline metric of speculative decoding.
    objective: str = param("throughput", choices=OBJECTIVES, doc="what the study optimises")
    # enough for TPE to leave its random start-up phase well behind.
    n_trials: int = param(100, lo=1, hi=1_000_000, doc="trials in total, across all workers")
    # auto = seeded TPE (single objective) or NSGA-II (multi-objective).
    sampler: str = param("auto", choices=SAMPLERS, doc="Optuna sampler")
    # the median rule is robust with few workloads; wilcoxon needs several instances.
    pruner: str = param("median", choices=PRUNERS, doc="pruner over per-workload reports")
    # any fixed value makes the study reproducible with one worker.
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="sampler seed (worker i uses seed + i)")
    # TPE's own default is 10; fewer would model noise.
    n_startup_trials: int = param(10, lo=0, hi=100_000, doc="random trials before the model")
    # one seed is cheap; two average out arrival noise.
    sim_seeds: tuple[int, ...] = param((0,), lo=0, doc="simulator seeds per workload")
    # "" = tuned; the throughput-quality objective pins threshold.
    mode: str = param("", choices=("", "strict", "threshold"), doc="pin the verification mode")
    # the seed's claim: quality within 0.3 %.
    max_lossy_fraction: float = param(
        0.003, lo=0.0, hi=1.0, doc="constraint: lossy accepted fraction <= this"
    )
    # "" = derived from controller and objective.
    study_name: str = param("", doc="study name in the storage")
    # none: the study searches controller fields only (tuning/scenario.py).
    scenario_params: tuple[str, ...] = param(
        (), doc="dotted scenario fields searched beside the controller, e.g. draft.block_size"
    )
    # the tuning workloads.
    workloads: tuple[WorkloadSpec, ...] = param((), doc="[[tune.workloads]] tables")
    # none: the study starts from the seed's point and the defaults only.
    start_from: tuple[dict, ...] = param(
        (), doc="controller configs enqueued as the first trials (tuning/start.py)"
    )


@dataclass(frozen=True)
class EvaluateSection:
    # seeds disjoint from the tuning seeds by default.
    sim_seeds: tuple[int, ...] = param((100, 101), lo=0, doc="simulator seeds per workload")
    # every baseline; the tuned controller and the references (clairvoyant, rate oracle) are always added.
    controllers: tuple[str, ...] = param(
        ("fixed", "hf-heuristic", "confidence-stop", "ema-hysteresis", "analytic"),
        doc="baselines to judge against",
    )
    # 0 = baselines with their defaults (fast); > 0 = each tuned with this many trials.
    baseline_trials: int = param(0, lo=0, hi=100_000, doc="trials to tune each baseline")
    # the best fixed k on the tuning workloads joins the comparison as fixed-best.
    fixed_k: tuple[int, ...] = param(
        (1, 2, 3, 4, 5, 6, 8, 10), lo=0, hi=64, doc="fixed-k sweep on the tuning workloads"
    )
    # the held-out workloads.
    workloads: tuple[WorkloadSpec, ...] = param((), doc="[[evaluate.workloads]] tables")


@dataclass(frozen=True)
class SloSection:
    """The user's SLOs and how the SLO objectives search capacity (:mod:`tuning.slo`)."""

    # DistServe's 90%: nine requests in ten meet both SLOs.
    attainment: float = param(
        0.9, lo=1e-9, hi=1.0, doc="SLO attainment the capacity must reach, in (0, 1]"
    )
    # None: each workload's scenario [slo] (or its slo.* overrides).
    ttft_s: float | None = param(None, lo=1e-6, doc="TTFT SLO of every workload, s (> 0)")
    # None: each workload's scenario [slo] (or its slo.* overrides).
    tpot_s: float | None = param(None, lo=1e-6, doc="TPOT SLO of every workload, s (> 0)")
    # ±20 % around the default's capacity: a tuned config rarely moves it further, and each
    # doubling of the bracket costs one more probe per instance.
    bracket: float = param(0.2, lo=0.01, hi=0.9, doc="trial search range: knee × (1 ± this)")
    # 3 %: below the seed-to-seed spread of the tuning workloads' capacity.
    rel_tol: float = param(0.03, lo=1e-4, hi=1.0, doc="trial bisection stops at hi/lo − 1 ≤ this")
    # sim.capacity's default precision for the knees and the held-out capacities.
    knee_rel_tol: float = param(0.02, lo=1e-4, hi=1.0, doc="knee and held-out bisection precision")
    # sim.capacity's default window: 20x either side of the workload's own load.
    knee_lo: float = param(0.05, lo=1e-6, doc="smallest load scale of the knee search")
    knee_hi: float = param(20.0, lo=1e-6, doc="largest load scale of the knee search")
    # at the knee itself: the load where a better schedule shows in SLO goodput.
    knee_load: float = param(
        1.0, lo=0.1, hi=10.0, doc="slo-knee-goodput: load scale as a multiple of the knee"
    )


@dataclass(frozen=True)
class TuningConfig:
    tune: TuneSection = param(default_factory=TuneSection)
    evaluate: EvaluateSection = param(default_factory=EvaluateSection)
    # the scenarios' own SLOs, 90 % attainment.
    slo: SloSection = param(default_factory=SloSection)
    # where relative scenario paths resolve; set by the loader.
    base_dir: str = param("", doc="set by load_tuning_config")

    @property
    def multi_objective(self) -> bool:
        return self.tune.objective in ("throughput-p99", "throughput-quality")

    def study_name(self) -> str:
        return self.tune.study_name or f"{self.tune.controller}-{self.tune.objective}"

    def pinned(self) -> dict[str, Any]:
        """Config fields the study does not tune (the verification mode when pinned)."""
        mode = "threshold" if self.tune.objective == "throughput-quality" else self.tune.mode
        return {"mode": mode} if mode else {}


def _check(cfg: TuningConfig, source: str) -> TuningConfig:
    t, e = cfg.tune, cfg.evaluate
    names = controller_names()
    if t.controller not in names:
        raise ConfigError(
            f"{source}: tune.controller = '{t.controller}' is unknown; allowed: " + ", ".join(names)
        )
    for c in e.controllers:
        if c not in names:
            raise ConfigError(
                f"{source}: evaluate.controllers has unknown '{c}'; allowed: " + ", ".join(names)
            )
    if not t.workloads:
        raise ConfigError(f"{source}: [[tune.workloads]] is empty; at least one is needed")
    if not t.sim_seeds:
        raise ConfigError(f"{source}: tune.sim_seeds is empty")
    if not e.sim_seeds:
        raise ConfigError(f"{source}: evaluate.sim_seeds is empty")
    if cfg.pinned() and "mode" not in _fields_of(t.controller):
        raise ConfigError(f"{source}: controller '{t.controller}' has no verification mode to pin")
    if t.sampler == "cmaes" and cfg.multi_objective:
        raise ConfigError(
            f"{source}: tune.sampler = 'cmaes' is single-objective; objective "
            f"'{t.objective}' needs nsga2, tpe, gp or random"
        )
    if t.start_from:
        from tuning.start import start_from_params

        start_from_params(t.controller, t.start_from, cfg.pinned(), f"{source}: tune.start_from")
    if cfg.slo.knee_lo >= cfg.slo.knee_hi:
        raise ConfigError(
            f"{source}: slo.knee_lo = {cfg.slo.knee_lo!r} must be below "
            f"slo.knee_hi = {cfg.slo.knee_hi!r}"
        )
    base = Path(cfg.base_dir)
    resolved = {}
    for section, wls in (("tune", t.workloads), ("evaluate", e.workloads)):
        seen = set()
        out = []
        for i, w in enumerate(wls):
            where = f"{source}: {section}.workloads[{i}]"
            if not w.name or not _NAME.match(w.name):
                raise ConfigError(
                    f"{where}.name = {w.name!r}: needs a name of letters, digits, '-', '_', '.'"
                )
            if w.name in seen:
                raise ConfigError(f"{where}.name = '{w.name}' is used twice")
            seen.add(w.name)
            if not w.scenario:
                raise ConfigError(f"{where}.scenario is missing")
            p = Path(w.scenario)
            p = p if p.is_absolute() else base / p
            if not p.is_file():
                raise ConfigError(f"{where}.scenario = '{w.scenario}': file not found ({p})")
            out.append(replace(w, scenario=str(p.resolve()), overrides=_with_slo(cfg, w, p, where)))
        resolved[section] = tuple(out)
    train = {w.key(): w.name for w in resolved["tune"]}
    for w in resolved["evaluate"]:
        if w.key() in train:
            raise ConfigError(
                f"{source}: held-out workload '{w.name}' is the same as tuning "
                f"workload '{train[w.key()]}'; held-out workloads must differ"
            )
    if t.scenario_params:
        from tuning.scenario import check_scenario_params

        check_scenario_params(t.scenario_params, resolved["tune"] + resolved["evaluate"], source)
    return replace(
        cfg,
        tune=replace(t, workloads=resolved["tune"]),
        evaluate=replace(e, workloads=resolved["evaluate"]),
    )


def _with_slo(cfg: TuningConfig, w: WorkloadSpec, scn: Path, where: str) -> dict:
    """``w``'s overrides with the ``[slo]`` times it does not set itself; under an SLO
    objective, one line when the workload ends up with no SLOs at all."""
    ov = dict(w.overrides)
    for key in ("ttft_s", "tpot_s"):
        v = getattr(cfg.slo, key)
        if v is not None:
            ov.setdefault(f"slo.{key}", v)
    if cfg.tune.objective in SLO_OBJECTIVES and not {"slo.ttft_s", "slo.tpot_s"} <= set(ov):
        if "slo" not in read_toml(scn):
            raise ConfigError(
                f"{where} ('{w.name}'): {scn.name} has no [slo] table and objective "
                f"'{cfg.tune.objective}' needs SLOs; add slo.ttft_s and slo.tpot_s to [slo] "
                "or to the workload's overrides"
            )
    return ov


def _fields_of(controller: str) -> set[str]:
    import dataclasses

    from control import controller_config_class

    return {f.name for f in dataclasses.fields(controller_config_class(controller))}


def tuning_config_from_mapping(
    data: dict, source: str = "<tuning config>", base_dir: str | Path = "."
) -> TuningConfig:
    data = dict(data)
    data["base_dir"] = str(Path(base_dir).resolve())
    cfg = from_mapping(TuningConfig, data, source=source)
    return _check(cfg, source)


def load_tuning_config(path: str | Path, **tune_overrides: Any) -> TuningConfig:
    """Load and check a tuning config; ``tune_overrides`` replace ``[tune]`` keys (CLI flags)."""
    p = Path(path)
    data = read_toml(p)
    for section in ("tune", "evaluate", "slo"):
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"{p}: {section} = {data[section]!r}: expected a table [{section}]")
    tune = dict(data.get("tune", {}))
    tune.update({k: v for k, v in tune_overrides.items() if v is not None})
    data["tune"] = tune
    return tuning_config_from_mapping(data, source=str(p), base_dir=p.resolve().parent)


def load_workload(spec: WorkloadSpec) -> Any:
    """The scenario of a tuning workload, with its overrides written in."""
    from sim import load_scenario

    scn = load_scenario(spec.scenario)
    return scn.with_overrides(dict(spec.overrides)) if spec.overrides else scn
