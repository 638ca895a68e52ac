"""tuning: Optuna studies that tune the controllers on the simulator.

- :mod:`tuning.space` — ``suggest_config(trial, controller)``: the search space, read from the
  ``param(...)`` metadata of the controllers' config dataclasses (tuned range, log scale, on/off
  switch, when a field is active, bounds taken from another field); e.g. log-scale gains with
  an off switch, block size 16-512, ordered k bounds, threshold-only fields suggested only when
  ``mode = threshold``.
- :mod:`tuning.objective` — ``Objective``: one callable scoring a config over workloads × seeds
  (throughput, goodput, p99 TPOT, or throughput vs p99 / vs quality loss), with per-workload
  reports for the median or Wilcoxon pruner and the quality constraint.
- :mod:`tuning.slo` — the user's question: capacity at SLO per trial (bisection from each
  workload's knee, the default config's capacity) or SLO goodput at the knee, and the held-out
  verdict of tuned against default with its spread over seeds.
- :mod:`tuning.study` — samplers (seeded TPE by default; NSGA-II, CMA-ES, GP, random), the
  slot queue that gives exactly ``n_trials`` across N worker processes, resume.
- :mod:`tuning.storage` — storage by URL: ``memory``, a journal file (default, in the run
  folder), ``sqlite:///`` or ``postgresql://`` (RDB with heartbeat and retry of stale trials).
- :mod:`tuning.evaluate` — the held-out matrix (controller × workload × seed).
- :mod:`tuning.export` — best trial, ``best_config.toml``, importances, Pareto front, summary.
- :mod:`tuning.run` — the whole ``dspark tune`` run.

Watching a study: ``pip install optuna-dashboard`` (not a dependency of the lab), then
``optuna-dashboard runs/tune-<study>/study.journal`` (recent optuna-dashboard versions take a
journal file path as the storage; not checked here, the dashboard is not installed), or
``optuna-dashboard postgresql://USER@HOST/DB`` / ``sqlite:///PATH`` for a database storage
(``dspark tune --storage sqlite:///runs/t.db`` works with any dashboard version).
"""

from tuning.space import config_to_params, params_to_config, space, start_points, suggest_config

__all__ = ["config_to_params", "params_to_config", "space", "start_points", "suggest_config"]
