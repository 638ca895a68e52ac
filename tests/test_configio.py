"""Typed TOML configs: one-line errors naming file, key and allowed range; round trip to TOML."""

from dataclasses import dataclass

import pytest

from control.configio import from_mapping, load, param, to_toml, write_toml
from control.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    # a gain; small by default
    gain: float = param(0.1, lo=0.0, hi=10.0, doc="a gain")
    # a name from a fixed set
    kind: str = param("a", choices=("a", "b"), doc="the kind")


@dataclass(frozen=True)
class Outer:
    # an integer count
    n: int = param(3, lo=1, hi=9, doc="a count")
    # a list of sizes
    sizes: tuple[int, ...] = param((1, 2), lo=1, hi=512, doc="sizes")
    # an optional path
    path: str | None = param(None, doc="optional path")
    # a nested table
    inner: Inner = param(default_factory=Inner, doc="nested")


def test_defaults_and_values():
    cfg = from_mapping(Outer, {"n": 5, "sizes": [4, 8], "inner": {"gain": 2}})
    assert cfg == Outer(n=5, sizes=(4, 8), inner=Inner(gain=2.0))
    assert isinstance(cfg.inner.gain, float)


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"n": 10}, "x.toml: n = 10 is out of range; allowed [1, 9]"),
        ({"nn": 1}, "x.toml: unknown key 'nn'; allowed keys: inner, n, path, sizes"),
        ({"n": "three"}, "x.toml: n = 'three': expected an integer"),
        (
            {"inner": {"gain": -1.0}},
            "x.toml: inner.gain = -1.0 is out of range; allowed [0.0, 10.0]",
        ),
        (
            {"inner": {"kind": "c"}},
            "x.toml: inner.kind = 'c' is not allowed; allowed one of 'a', 'b'",
        ),
        ({"inner": {"bogus": 1}}, "x.toml: unknown key 'inner.bogus'; allowed keys: gain, kind"),
        ({"sizes": [4, 1000]}, "x.toml: sizes = (4, 1000) is out of range; allowed [1, 512]"),
        ({"n": True}, "x.toml: n = True: expected an integer"),
    ],
)
def test_errors_are_one_line_and_name_the_key(data, expected):
    with pytest.raises(ConfigError) as e:
        from_mapping(Outer, data, source="x.toml")
    assert str(e.value) == expected
    assert "\n" not in str(e.value)


def test_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("n = = 3\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: malformed TOML"):
        load(Outer, bad)
    with pytest.raises(ConfigError, match=r"missing\.toml: file not found"):
        load(Outer, tmp_path / "missing.toml")


def test_round_trip_through_toml(tmp_path):
    cfg = from_mapping(Outer, {"n": 7, "path": "a/b.csv", "inner": {"gain": 0.5, "kind": "b"}})
    p = write_toml(cfg, tmp_path / "cfg.toml")
    assert load(Outer, p) == cfg
    assert "[inner]" in to_toml(cfg)


def test_section_loading(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("[outer]\nn = 2\n[outer.inner]\ngain = 11.0\n")
    with pytest.raises(ConfigError) as e:
        load(Outer, p, section="outer")
    assert str(e.value) == f"{p}: outer.inner.gain = 11.0 is out of range; allowed [0.0, 10.0]"
