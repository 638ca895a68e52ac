"""Pick the best trial and write the ``kind = "tune"`` run folder (docs/results-format.md).

``best_config.toml`` holds one ``[controller.<name>]`` table with every field of the config:
a scenario can include it as is, ``dspark simulate --controller-config`` reads it, and the
real engine loads it with :func:`load_best_config` (``control.make_config`` underneath).
A study that also tuned scenario fields (``[tune] scenario_params``) adds a ``[scenario]``
table of dotted keys (``"draft.block_size" = 9``): dotted overrides of the scenario the config
was tuned on, read by :func:`load_best_scenario` (empty for files without the table); the
``[controller.<name>]`` table and its readers are the same with or without it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from control import make_config
from control.configio import read_toml, to_dict, to_toml
from control.errors import ConfigError
from control.metrics import json_safe
from tuning.config import TuningConfig
from tuning.objective import directions, metric_names
from tuning.space import config_to_params, params_to_config, scenario_values


def _feasible(t: optuna.trial.FrozenTrial) -> bool:
    return all(c <= 0 for c in t.user_attrs.get("constraint", (0.0,)))


def infeasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Finished trials that broke the quality constraint (single objective: ended PRUNED with
    user attribute ``infeasible``; multi-objective: COMPLETE with a positive constraint)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if t.user_attrs.get("infeasible") or (t.state == TrialState.COMPLETE and not _feasible(t))
    ]


def objective_value(t: optuna.trial.FrozenTrial, metric: str) -> float:
    """A finished trial's single objective value: the mean metric it stored, else its value."""
    v = t.user_attrs.get(metric)
    return float(v) if v is not None else float(t.value)


def choose_best(
    study: optuna.Study, cfg: TuningConfig, slo_tpot_s: float | None = None
) -> optuna.trial.FrozenTrial:
    """The trial to export.

    Single objective: the best COMPLETE trial among the feasible ones (quality constraint);
    when none is feasible, the best of all finished ones, the infeasible (PRUNED) included.
    Multi-objective, from the Pareto front:
    ``throughput-quality`` -> the highest throughput with lossy fraction <= the limit
    (else the least lossy); ``throughput-p99`` -> the highest throughput with p99 TPOT <=
    ``slo_tpot_s`` (else the lowest p99).
    """
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    dirs = directions(cfg.tune.objective)
    if len(dirs) == 1:
        metric = metric_names(cfg.tune.objective)[0]
        pool = [t for t in done if _feasible(t)] or done + [
            t for t in infeasible_trials(study) if t.state == TrialState.PRUNED
        ]
        if not pool:
            raise ConfigError(f"study '{study.study_name}' has no completed trial to export")
        sign = 1 if dirs[0] == "maximize" else -1
        return max(pool, key=lambda t: (sign * objective_value(t, metric), -t.number))
    if not done:
        raise ConfigError(f"study '{study.study_name}' has no completed trial to export")
    front = study.best_trials
    limit = (
        cfg.tune.max_lossy_fraction
        if cfg.tune.objective == "throughput-quality"
        else (slo_tpot_s if slo_tpot_s is not None else math.inf)
    )
    ok = [t for t in front if t.values[1] <= limit]
    if ok:
        return max(ok, key=lambda t: (t.values[0], -t.number))
    return min(front, key=lambda t: (t.values[1], t.number))


def trials_table(study: optuna.Study) -> Any:
    """``trials_dataframe()`` with the objective columns under their contract names whatever
    the study's metric names: ``value`` (one objective) or ``values_0, values_1, ...``."""
    df = study.trials_dataframe()
    names = study.metric_names or []
    ren = {}
    if len(study.directions) == 1 and names:
        ren[f"value_{names[0]}"] = "value"
    else:
        ren.update({f"values_{n}": f"values_{i}" for i, n in enumerate(names)})
    return df.rename(columns=ren)


def best_config(study: optuna.Study, cfg: TuningConfig, trial: optuna.trial.FrozenTrial) -> Any:
    return params_to_config(cfg.tune.controller, trial.params, cfg.pinned())


def best_scenario(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The tuned scenario values of ``trial`` (dotted keys; empty when none was tuned)."""
    return scenario_values(trial.params)


def best_config_text(
    controller: str, config: Any, note: str = "", scenario: dict[str, Any] | None = None
) -> str:
    head = "".join(f"# {line}\n" for line in note.splitlines()) if note else ""
    data: dict[str, Any] = {"controller": {controller: to_dict(config)}}
    if scenario:
        data["scenario"] = dict(scenario)
    return head + to_toml(data)


def write_best_config(
    path: str | Path,
    controller: str,
    config: Any,
    note: str = "",
    scenario: dict[str, Any] | None = None,
) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(best_config_text(controller, config, note, scenario))
    return p


def load_best_scenario(path: str | Path) -> dict[str, Any]:
    """The ``[scenario]`` table of a ``best_config.toml`` as dotted overrides (``{}`` when the
    file has none); a key that names no scenario field is a one-line :class:`ConfigError`."""
    from tuning.space import _fields, flatten

    data = read_toml(path)
    table = data.get("scenario", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: scenario = {table!r}: expected a table [scenario]")
    values = flatten(table)
    from sim.config import SimConfig

    known = {n for n, _, _ in _fields(SimConfig)}
    for key in values:
        if key not in known:
            raise ConfigError(f"{path}: [scenario] '{key}' is not a field of the scenario")
    return values


def load_best_config(path: str | Path, controller: str | None = None) -> tuple[str, Any]:
    """``(controller name, checked config)`` from a ``best_config.toml``."""
    data = read_toml(path)
    tables = data.get("controller")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{path}: no [controller.<name>] table")
    if controller is None:
        if len(tables) != 1:
            raise ConfigError(f"{path}: several controller tables {sorted(tables)}; name one")
        controller = next(iter(tables))
    if controller not in tables:
        raise ConfigError(f"{path}: no [controller.{controller}] table; has {sorted(tables)}")
    return controller, make_config(controller, tables[controller], source=str(path))


def importances(study: optuna.Study) -> tuple[Any, str]:
    """(DataFrame ``param, importance``, evaluator name). fANOVA when scikit-learn is
    installed, else PED-ANOVA (no extra dependency); first objective of multi-objective."""
    import pandas as pd

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    empty = pd.DataFrame(columns=["param", "importance"])
    if len(done) < 3:
        return empty, "none (fewer than 3 completed trials)"
    if importlib.util.find_spec("sklearn") is not None:
        ev, name = optuna.importance.FanovaImportanceEvaluator(seed=0), "fanova"
    else:
        ev, name = optuna.importance.PedAnovaImportanceEvaluator(), "ped-anova"
    target = None if len(study.directions) == 1 else (lambda t: t.values[0])
    try:
        with warnings.catch_warnings():  # "some regimes have < 2 trials" on short studies
            warnings.simplefilter("ignore", UserWarning)
            imp = optuna.importance.get_param_importances(study, evaluator=ev, target=target)
    except (ValueError, RuntimeError) as e:
        return empty, f"{name} failed: {str(e).splitlines()[0]}"
    return pd.DataFrame({"param": list(imp), "importance": list(imp.values())}), name


def pareto(study: optuna.Study, cfg: TuningConfig) -> Any:
    import pandas as pd

    names = metric_names(cfg.tune.objective)
    rows = []
    for t in study.best_trials:
        rows.append(
            {
                "number": t.number,
                **dict(zip(names, t.values)),
                **{f"params_{k}": v for k, v in t.params.items()},
            }
        )
    return pd.DataFrame(rows)


def _is_default(controller: str, best: optuna.trial.FrozenTrial, cfg: TuningConfig) -> bool:
    """Whether the best trial ran the controller's untuned defaults (a start point)."""
    try:
        return best.params == config_to_params(controller, None, cfg.pinned())
    except (ValueError, ConfigError):  # a pinned field clashes with a default: none ran
        return False


def write_run(
    out: str | Path,
    cfg: TuningConfig,
    study: optuna.Study,
    storage_url: str,
    best: optuna.trial.FrozenTrial,
    config: Any,
    evaluation: Any = None,
    extra: dict | None = None,
    scenario: dict[str, Any] | None = None,
) -> dict:
    """Write trials.csv, best_config.toml, importances.csv, pareto.csv (multi-objective),
    evaluation.csv (when given), config.toml and summary.json; returns the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    trials_table(study).to_csv(out / "trials.csv", index=False)
    c = cfg.tune.controller
    names = metric_names(cfg.tune.objective)
    vals = best.values if len(best.values) > 1 else objective_value(best, names[0])
    write_best_config(
        out / "best_config.toml",
        c,
        config,
        f"best {c} config of study '{study.study_name}' (trial {best.number}, "
        f"objective {cfg.tune.objective} = {vals})\n"
        "a scenario's [controller.<name>] table: paste it into a scenario for `dspark simulate`; "
        "the engine loads it with tuning.export.load_best_config / control.make_config"
        + (
            "\n[scenario]: the tuned scenario fields, dotted overrides (dspark simulate --set)"
            if scenario
            else ""
        ),
        scenario,
    )
    imp, evaluator = importances(study)
    imp.to_csv(out / "importances.csv", index=False)
    if len(study.directions) > 1:
        pareto(study, cfg).to_csv(out / "pareto.csv", index=False)
    if evaluation is not None:
        evaluation.to_csv(out / "evaluation.csv", index=False)
    (out / "config.toml").write_text(to_toml(cfg))
    from tuning.storage import redact

    n_done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    summary = {
        "kind": "tune",
        "study_name": study.study_name,
        "storage": redact(storage_url),
        "objective": cfg.tune.objective,
        "directions": directions(cfg.tune.objective),
        "n_trials": n_done,
        "best_value": vals,
        "best_params": best.params,
        "best_scenario": dict(scenario or {}),
        "best_trial": best.number,
        "best_is_default": _is_default(c, best, cfg),
        "controller": c,
        "importance_evaluator": evaluator,
        "n_complete": len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
        "n_pruned": len(study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)))
        - sum(t.state == TrialState.PRUNED for t in infeasible_trials(study)),
        "n_infeasible": len(infeasible_trials(study)),
        "metric_names": names,
        "max_lossy_fraction": cfg.tune.max_lossy_fraction,
        "n_failed": len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,))),
        "tuning_workloads": [w.name for w in cfg.tune.workloads],
        "heldout_workloads": [w.name for w in cfg.evaluate.workloads],
        **(extra or {}),
    }
    summary = json_safe(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
