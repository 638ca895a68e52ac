"""The ``dspark`` controller as two policy classes: ``policy`` picks the class, each policy's
config holds its own fields, and a policy reads nothing of the other's."""

from __future__ import annotations

import dataclasses

import pytest

from control import make_controller
from control.dspark import (
    DSparkBaseController,
    DSparkConfig,
    DSparkController,
    GoodputPolicyController,
    SeedPolicyController,
)
from control.dspark_config import DSparkBaseConfig, GoodputPolicyConfig, SeedPolicyConfig
from control.errors import ConfigError
from control.registry import make_planner
from tests.control.helpers import obs, run


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_policy_picks_the_class_and_its_planner():
    assert type(make_controller("dspark")) is DSparkController
    assert isinstance(make_controller("dspark"), GoodputPolicyController)
    assert type(make_controller("dspark", {"policy": "seed"})) is SeedPolicyController
    assert type(DSparkController(DSparkConfig(policy="seed"))) is SeedPolicyController
    assert make_planner("dspark", {"policy": "seed"}) is None
    assert make_planner("dspark") is not None
    for c in (make_controller("dspark"), make_controller("dspark", {"policy": "seed"})):
        assert isinstance(c, DSparkBaseController)
        assert c.state()["policy"] == c.config.policy == c.policy


def test_each_field_has_one_home():
    shared = _names(DSparkBaseConfig)
    seed = _names(SeedPolicyConfig) - shared
    goodput = _names(GoodputPolicyConfig) - shared
    assert seed == {"alpha0", "alpha_max", "k_ref", "k_min", "k_hysteresis", "a_target"}
    assert not seed & goodput and len(goodput) == 34
    assert _names(DSparkConfig) == shared | seed | goodput | {"policy"}


def test_a_policy_class_refuses_the_other_policy_in_one_line():
    with pytest.raises(ConfigError, match=r"^controller.dspark.policy must be 'seed'$"):
        SeedPolicyController(DSparkConfig())
    with pytest.raises(ConfigError, match=r"^controller.dspark.policy must be 'goodput'$"):
        GoodputPolicyController(DSparkConfig(policy="seed"))


# a seed-policy script: blocks of 16 tokens, updates from the first block on
SCRIPT = [obs(15, n, draft_s=0.01, verify_s=0.02, ends=(n,)) for n in (15, 7, 7, 3, 0, 0, 0, 11)]
SHARED = {"warmup_rounds": 0, "min_update_rounds": 1, "block_tokens": 16, "snap_tokens": 0}


@pytest.mark.parametrize(
    "policy, own, other",
    [
        ("seed", {"alpha0": 1.1, "k_ref": 8.0, "a_target": 0.5}, {"prior_trials": 50.0}),
        ("goodput", {"memory_rounds": 8, "goodput_cooldown": True}, {"k_ref": 3.0, "k_min": 1}),
    ],
)
def test_a_policy_config_runs_the_same_as_the_table_and_ignores_the_other_policy(
    policy, own, other
):
    cls, policy_cfg = {
        "seed": (SeedPolicyController, SeedPolicyConfig),
        "goodput": (GoodputPolicyController, GoodputPolicyConfig),
    }[policy]
    table = make_controller("dspark", {"policy": policy, **SHARED, **own, **other})
    alone = cls(policy_cfg(**SHARED, **own))
    assert run(table, SCRIPT) == run(alone, SCRIPT)
    assert table.state() == alone.state() and table.state()["updates"] > 0
