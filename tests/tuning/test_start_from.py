"""``[tune] start_from``: given controller configs are the study's first trials, after the
seed's point and the defaults, and run exactly the config written; a bad entry is one line
naming the entry and the field."""

from __future__ import annotations

import optuna
import pytest

from control.errors import ConfigError
from tuning.config import load_tuning_config
from tuning.space import params_to_config
from tuning.start import start_from_params
from tuning.study import prepare_study

from .conftest import ROOT

ROOT_CFG = "configs/tune_vllm_dsd_standard.toml"

ONE_K = [{"num_speculative_tokens": k, "k_1": k, "k_2": k, "k_3": k} for k in (1, 2, 3, 4)]


def _write(tmp_path, start_from: str) -> str:
    p = tmp_path / "tune.toml"
    p.write_text(
        "[tune]\n"
        'controller = "vllm-dsd"\n'
        f"start_from = {start_from}\n"
        "[[tune.workloads]]\n"
        'name = "t"\n'
        f'scenario = "{(ROOT / "configs" / "tiny.toml").as_posix()}"\n'
    )
    return str(p)


def test_one_k_tables_map_to_params_that_run_exactly_them():
    got = start_from_params("vllm-dsd", ONE_K)
    for k, params in zip((1, 2, 3, 4), got):
        cfg = params_to_config("vllm-dsd", params)
        assert (cfg.k_1, cfg.k_2, cfg.k_3, cfg.num_speculative_tokens, cfg.rows) == (k, k, k, k, 3)
        # the rows' ends stay the documented example's
        assert (cfg.end_bs_1, cfg.end_bs_2, cfg.max_bs) == (64, 128, 512)


@pytest.mark.parametrize(
    "entry, msg",
    [
        ("[{ k_1 = 5 }]", "tune.start_from[0]: controller.vllm-dsd: k_1 = 5 exceeds"),
        ("[{ rows = 2 }]", "tune.start_from[0]: rows = 2 is not searched by the study"),
        ("[{}, { foo = 1 }]", "tune.start_from[1]: unknown key 'controller.vllm-dsd.foo'"),
        (
            "[{ num_speculative_tokens = 17, k_1 = 17 }]",
            "tune.start_from[0]: 'num_speculative_tokens' = 17 is outside the tuned range [1, 16]",
        ),
        ("[3]", "tune.start_from[0] = 3: expected a table"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(tmp_path, entry, msg):
    path = _write(tmp_path, entry)
    with pytest.raises(ConfigError) as e:
        load_tuning_config(path)
    text = str(e.value)
    assert "\n" not in text and text.startswith(path) and msg in text, text


def test_the_study_queues_defaults_then_the_given_tables_without_duplicates(tmp_path):
    # the documented default and K = 2 given twice: each queued once, in order
    body = (
        "[{ num_speculative_tokens = 3, k_1 = 3, k_2 = 1, k_3 = 0 }, "
        + ", ".join(
            f"{{ num_speculative_tokens = {k}, k_1 = {k}, k_2 = {k}, k_3 = {k} }}"
            for k in (1, 2, 2, 3, 4)
        )
        + "]"
    )
    cfg = load_tuning_config(_write(tmp_path, body), n_trials=8)
    study = prepare_study(cfg, "memory", 8, storage=optuna.storages.InMemoryStorage())
    queued = sorted(study.get_trials(deepcopy=False), key=lambda t: t.user_attrs["slot"])
    given = [t.system_attrs.get("fixed_params", {}) for t in queued]
    cfgs = [params_to_config("vllm-dsd", p) for p in given[:5]]
    ks = [(c.k_1, c.k_2, c.k_3, c.num_speculative_tokens) for c in cfgs]
    assert ks == [(3, 1, 0, 3), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3), (4, 4, 4, 4)]
    assert given[5:] == [{}, {}, {}]  # the sampler's slots


def test_the_vllm_dsd_standard_study_starts_from_every_one_k_table():
    cfg = load_tuning_config(ROOT / ROOT_CFG)
    assert cfg.tune.objective == "slo-capacity"
    assert not {1, 2, 3} & set(cfg.tune.sim_seeds)
    got = start_from_params("vllm-dsd", cfg.tune.start_from)
    assert got == start_from_params("vllm-dsd", ONE_K)
