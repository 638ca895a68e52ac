"""Edges of the shared foundation used by the controllers (configio, types, registry), so that
``pytest tests/control --cov=control`` measures the whole package."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from control import Decision, Observation, RoundRecord, make_config, make_controller
from control.configio import (
    allowed_text,
    describe,
    from_mapping,
    load,
    param,
    read_toml,
    to_dict,
    to_toml,
    write_toml,
)
from control.errors import ConfigError
from control.registry import controller_names
from control.types import PositionRecord, records_from_rows, records_to_columns, valid_decision
from tests.control.helpers import CONTROLLER_NAMES


@dataclass(frozen=True)
class Sub:
    x: int = param(1, lo=0, doc="x")


@dataclass(frozen=True)
class Every:
    f: float = param(1.0, hi=5.0, doc="upper bound only")
    i: int | None = param(None, doc="optional int")
    lit: Literal["a", "b"] = param("a", doc="a literal")
    items: list[int] = param(default_factory=list, doc="a list")
    table: dict = param(default_factory=dict, doc="a table")
    sub: Sub = param(default_factory=Sub, doc="nested")
    anything: Any = param(None, doc="any")
    flag: bool = param(False, doc="bool")
    name: str = param("n", doc="str")
    subs: tuple[Sub, ...] = param((), doc="list of tables")
    plain: int = field(default=0)

    def __post_init__(self) -> None:
        if self.f == 4.0:
            raise ValueError("f may not be 4")
        if self.f == 3.0:
            raise ConfigError("f may not be 3")


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"f": 6.0}, "f = 6.0 is out of range; allowed <= 5.0"),
        ({"f": "x"}, "f = 'x': expected a number"),
        ({"f": float("nan")}, "f = nan: expected a number"),
        ({"f": True}, "expected a number"),
        ({"i": "x"}, "i = 'x': expected an integer"),
        ({"lit": "c"}, "lit = 'c': allowed one of 'a', 'b'"),
        ({"items": 3}, "items = 3: expected a list"),
        ({"table": 3}, "table = 3: expected a table"),
        ({"sub": 3}, "sub: expected a table [sub]"),
        ({"flag": 1}, "flag = 1: expected true or false"),
        ({"name": 1}, "name = 1: expected a string"),
        ({"f": 4.0}, "Every: f may not be 4"),
        ({"f": 3.0}, "f may not be 3"),
        ({"sub": {"x": -1}}, "sub.x = -1 is out of range; allowed >= 0"),
    ],
)
def test_configio_errors(data, needle):
    with pytest.raises(ConfigError, match=r"^x\.toml: ") as e:
        from_mapping(Every, data, source="x.toml")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_configio_values_and_text(tmp_path):
    cfg = from_mapping(
        Every,
        {
            "i": 3.0,
            "items": [1, 2],
            "table": {"a": 1},
            "sub": Sub(2),
            "anything": [1],
            "flag": True,
            "subs": [{"x": 4}],
            "plain": 2,
        },
    )
    assert cfg.i == 3 and cfg.items == (1, 2) and cfg.sub == Sub(2) and cfg.subs == (Sub(4),)
    assert to_dict(cfg)["subs"] == [{"x": 4}] and "i" in to_dict(cfg)
    assert "i" not in to_dict(Every())
    assert to_toml({"every": Sub(5), "k": 1}).count("x = 5") == 1
    p = write_toml(Sub(7), tmp_path / "d" / "s.toml")
    assert load(Sub, p) == Sub(7) and read_toml(p) == {"x": 7}
    rows = {r[0]: r for r in describe(Every)}
    assert (
        rows["items"][1] == []
        and rows["f"][2] == "<= 5.0"
        and rows["sub"][2] == "any value of its type"
    )
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"cannot read|malformed"):
        read_toml(tmp_path / "bin.toml")
    assert allowed_text(Every.__dataclass_fields__["lit"]) == "any value of its type"


def test_registry_paths():
    assert set(controller_names()) == set(CONTROLLER_NAMES)
    cfg = make_config("dspark")
    assert make_config("dspark", cfg) is cfg
    assert make_controller("dspark", cfg).config is cfg
    with pytest.raises(ConfigError, match="unknown controller 'x'"):
        make_controller("x")
    with pytest.raises(ConfigError, match="controller 'dspark' needs a DSparkConfig, got int"):
        make_config("dspark", 3)


@pytest.mark.parametrize("mode", ["strict", "threshold"])
def test_a_valid_decision_built_without_checks_is_the_checked_one(mode):
    """Equal, equally hashed, the same repr and the same derived ``stops`` flag, every field
    as given."""
    cases = [
        (0, 0.85, 0.0, False, 0.0),
        (3, 0.5, 0.2, True, 0.0),
        (16, 1.0, 0.0, False, 0.4),
        (1, 0.7, 0.3, True, 0.1),
    ]
    for k, beta, tau, end, survival in cases:
        d = valid_decision(k, mode, beta, tau, end, survival)
        ref = Decision(k=k, mode=mode, beta=beta, tau=tau, block_end=end, survival=survival)
        assert d == ref and hash(d) == hash(ref) and repr(d) == repr(ref)
        assert d.stops == ref.stops == (tau > 0.0 or survival > 0.0)
        with pytest.raises(AttributeError):
            d.k = 2  # type: ignore[misc]


def test_types_checks_and_round_trip():
    with pytest.raises(ValueError):
        Decision(k=-1)
    with pytest.raises(ValueError):
        Decision(k=1, mode="loose")
    with pytest.raises(ValueError):
        Observation(now_s=0.0, drafted=2, accepted=3)
    with pytest.raises(ValueError):
        Observation(now_s=0.0, drafted=2, accepted=1, confidences=(0.5,))
    o = Observation(
        now_s=1.0, drafted=3, accepted=1, confidences=(0.9, 0.2, 0.1), sentence_ends=(1,)
    )
    assert o.emitted == 2 and o.rejected
    rec = RoundRecord.from_round(4, 2, Decision(k=3, block_end=True), o, controller="dspark")
    cols = records_to_columns([rec])
    assert cols["confidences"] == ["0.9 0.2 0.1"]
    rows = [{c: v[0] for c, v in cols.items()}]
    back = records_from_rows(rows)[0]
    assert back == rec and back.observation() == o
    rows[0]["confidences"] = float("nan")
    rows[0]["controller"] = None
    rows[0]["block_end"] = "True"
    assert records_from_rows(rows)[0].confidences == () and records_from_rows(rows)[0].block_end
    rows[0]["sentence_ends"] = [1]
    assert records_from_rows(rows)[0].sentence_ends == (1,)
    with pytest.raises(KeyError):
        records_from_rows([{"request_id": 1}])
    pos = PositionRecord(1, 2, 3, (0.5,), True)
    assert (
        records_from_rows(
            [{c: v[0] for c, v in records_to_columns([pos], PositionRecord).items()}],
            PositionRecord,
        )[0]
        == pos
    )
