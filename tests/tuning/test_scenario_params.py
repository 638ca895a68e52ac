"""``[tune] scenario_params``: scenario fields (a block drafter's B) searched beside the controller,
carried by best_config.toml and applied to the tuned controller's held-out runs only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control import make_config
from control.configio import to_dict
from control.errors import ConfigError
from tests.tuning.conftest import ROOT, run_tune

BLOCK = ROOT / "configs" / "tune_block.toml"
TINY_SCN = ROOT / "configs" / "tiny.toml"
BLOCK_OV = {
    "draft.kind": "block",
    "draft.preset": "DSpark-block-7",
    "drafter.preset": "DSpark-block-7",
    "acceptance.model": "curve",
}


def _mapping(params: list[str], overrides: dict | None = None) -> dict:
    ov = BLOCK_OV if overrides is None else overrides
    return {
        "tune": {
            "controller": "dspark",
            "n_trials": 2,
            "scenario_params": params,
            "workloads": [{"name": "w", "scenario": str(TINY_SCN), "overrides": dict(ov)}],
        }
    }


def _load(data: dict):
    from tuning.config import tuning_config_from_mapping

    return tuning_config_from_mapping(data, source="cfg.toml", base_dir=ROOT / "configs")


class Recorder:
    """A stand-in simulator: records each call's scenario and scores a run by its block size."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int | None, str, float]] = []

    def __call__(self, scn, controller, config, seed, baseline, load_scale=1.0) -> dict:
        b = scn.draft.block_size
        self.calls.append((controller, config, b, scn.draft.kind, scn.workload.rate_rps))
        return {
            "throughput_tokens_per_s": float(b or 0),
            "lossy_accept_fraction": 0.0,
            "mean_accepted_length": 1.0,
        }


def test_space_has_block_size_as_int_4_to_16():
    from tuning.space import scenario_space

    (d,) = scenario_space(("draft.block_size",))
    assert (d.name, d.kind, d.lo, d.hi, d.log, d.choices) == (
        "scenario.draft.block_size",
        "int",
        4,
        16,
        False,
        (),
    )
    cfg = _load(_mapping(["draft.block_size"]))
    assert cfg.tune.scenario_params == ("draft.block_size",)


def test_default_config_has_no_scenario_params(tiny_cfg):
    from tuning.objective import Objective

    assert tiny_cfg.tune.scenario_params == ()
    assert Objective(tiny_cfg, simulate=Recorder()).scenario_dims == []


def test_trial_value_reaches_every_workload_scenario():
    from tuning.config import load_tuning_config
    from tuning.export import best_scenario, choose_best
    from tuning.study import run_study

    cfg = load_tuning_config(BLOCK, n_trials=4)
    rec = Recorder()
    study = run_study(cfg, "memory", simulate=rec)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert len(trials) == 4 and len(rec.calls) == 4 * len(cfg.tune.workloads)
    rates = [w.overrides["workload.rate_rps"] for w in cfg.tune.workloads]
    for n, t in enumerate(trials):
        b = t.params["scenario.draft.block_size"]
        assert isinstance(b, int) and 4 <= b <= 16
        mine = rec.calls[n * len(rates) : (n + 1) * len(rates)]
        # the drawn B on every workload, its other overrides kept
        assert [(c[2], c[3], c[4]) for c in mine] == [(b, "block", r) for r in rates]
        assert t.value == pytest.approx(float(b))
    best = choose_best(study, cfg)
    top = max(t.params["scenario.draft.block_size"] for t in trials)
    assert best_scenario(best) == {"draft.block_size": top}


def test_baselines_and_sweeps_run_the_scenario_as_written():
    from tuning.config import load_tuning_config
    from tuning.objective import Objective

    cfg = load_tuning_config(BLOCK)
    assert Objective(cfg, simulate=Recorder(), controller="fixed").scenario_dims == []
    assert [d.name for d in Objective(cfg, simulate=Recorder()).scenario_dims] == [
        "scenario.draft.block_size"
    ]


def test_heldout_tuned_entry_alone_runs_the_tuned_scenario():
    from tuning.config import load_tuning_config
    from tuning.evaluate import Entry, evaluate

    cfg = load_tuning_config(BLOCK)
    rec = Recorder()
    ents = [
        Entry("dspark-tuned", "dspark", make_config("dspark"), "tuned", {"draft.block_size": 11}),
        Entry("dspark-default", "dspark", make_config("dspark"), "default"),
        Entry("fixed", "fixed", make_config("fixed"), "default"),
    ]
    df = evaluate(cfg, ents, simulate=rec)
    got = dict(zip(df["controller"], df["throughput_tokens_per_s"]))
    assert got == {"dspark-tuned": 11.0, "dspark-default": 0.0, "fixed": 0.0}
    assert [(c[0], c[2]) for c in rec.calls] == [("dspark", 11), ("dspark", None), ("fixed", None)]


@pytest.mark.parametrize(
    "params, overrides, needle",
    [
        (["draft.nope"], None, "'draft.nope' is not a field of the scenario"),
        (["workload.rate_rps"], None, "'workload.rate_rps' declares no tuning range"),
        (
            ["draft.block_size"],
            {},
            (
                "'draft.block_size' = 4 does not fit workload 'w': "
                f"{TINY_SCN}: draft.block_size is set but draft.kind = 'autoregressive'"
            ),
        ),
        (["draft.block_size", "draft.block_size"], None, "names a key twice"),
    ],
)
def test_bad_scenario_params_are_one_line(params, overrides, needle):
    with pytest.raises(ConfigError) as e:
        _load(_mapping(params, overrides))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cfg.toml: tune.scenario_params") and needle in msg


def test_cli_refuses_a_block_size_on_an_autoregressive_scenario(tmp_path: Path):
    cfg = tmp_path / "tune_bad.toml"
    cfg.write_text(
        '[tune]\ncontroller = "dspark"\nn_trials = 2\nscenario_params = ["draft.block_size"]\n'
        f'[[tune.workloads]]\nname = "tiny"\nscenario = "{TINY_SCN}"\n'
    )
    r = run_tune(str(cfg), "--storage", "memory", "--out", str(tmp_path / "run"), "--quiet")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"dspark: error: {cfg}: tune.scenario_params 'draft.block_size'")
    assert str(TINY_SCN) in lines[0] and not (tmp_path / "run").exists()


def test_best_config_round_trip_with_and_without_scenario_table(tmp_path: Path):
    from tuning.export import load_best_config, load_best_scenario, write_best_config

    cfg = make_config("dspark", {"k_max": 9})
    with_t = write_best_config(tmp_path / "a.toml", "dspark", cfg, "note", {"draft.block_size": 12})
    without = write_best_config(tmp_path / "b.toml", "dspark", cfg, "note")
    assert '"draft.block_size" = 12' in with_t.read_text()
    assert "[scenario]" not in without.read_text()
    for p in (with_t, without):
        name, back = load_best_config(p)
        assert name == "dspark" and to_dict(back) == to_dict(cfg)
    assert load_best_scenario(with_t) == {"draft.block_size": 12}
    assert load_best_scenario(without) == {}
    nested = tmp_path / "c.toml"
    nested.write_text(without.read_text() + "\n[scenario.draft]\nblock_size = 5\n")
    assert load_best_scenario(nested) == {"draft.block_size": 5}
    bad = tmp_path / "d.toml"
    bad.write_text(without.read_text() + '\n[scenario]\n"draft.nope" = 5\n')
    with pytest.raises(ConfigError, match=r"d\.toml: \[scenario\] 'draft\.nope' is not a field"):
        load_best_scenario(bad)
