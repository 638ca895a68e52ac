"""``benchmarks/real_speed.py``: the unseen prompt rule and the ratios it prints."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_speed  # noqa: E402


class _Enc:
    def __init__(self, ids):
        self.ids = ids


class _Tok:
    """One token per whitespace-separated word (id = its index in a growing vocabulary)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, text):
        return _Enc([self.vocab.setdefault(w, len(self.vocab)) for w in text.split()])


def test_unseen_rule_is_sorted_sized_spaced_and_centred(tmp_path):
    for i in range(10):
        (tmp_path / f"pkg{i}").mkdir()
        words = " ".join(f"w{i}_{j}" for j in range(400 + i))
        (tmp_path / f"pkg{i}" / "mod.py").write_text(words)
        (tmp_path / f"pkg{i}" / "README.md").write_text(words)
        (tmp_path / f"pkg{i}" / "LICENSE.txt").write_text(words)
    (tmp_path / "pkg0" / "tiny.py").write_text("x = 1")  # under min_bytes: never picked
    code = real_speed.unseen_files(tmp_path, "code", 1000)
    assert code == sorted(code, key=str) and len(code) == 10
    assert not any("LICENSE" in str(p) for p in real_speed.unseen_files(tmp_path, "prose", 1000))
    ps = real_speed.unseen_prompts(_Tok(), 4, 16, 1000, tmp_path)
    assert [p["kind"] for p in ps] == ["code", "prose", "code", "prose"]
    assert [p["file"] for p in ps] == [
        "pkg0/mod.py",
        "pkg0/README.md",
        "pkg9/mod.py",
        "pkg9/README.md",
    ]
    assert all(len(p["ids"]) == 16 for p in ps)
    tok = _Tok()
    ids = tok.encode((tmp_path / "pkg9" / "mod.py").read_text()).ids
    s = (len(ids) - 16) // 2
    assert (
        real_speed._window(tok, (tmp_path / "pkg9" / "mod.py").read_text(), 16) == ids[s : s + 16]
    )


def test_ratios_same_drafter_and_best():
    def row(name, tps):
        return {"controller": name, "tokens_per_s": tps}

    summary = {
        "rows": [
            row("target-only", 100.0),
            row("tf/fixed-k2", 150.0),
            row("ngram/fixed-k4", 300.0),
            row("feat/fixed-k2", 120.0),
            row("transformers-target-only", 80.0),
            row("transformers-assisted-k4", 125.0),
            row("transformers-prompt-lookup", 200.0),
        ]
    }
    r = real_speed.ratios(summary)
    assert r["best_vs_ar"] == pytest.approx(3.0) and r["best"] == "ngram/fixed-k4"
    assert r["best_vs_hf_best"] == pytest.approx(1.5)
    assert r["tf_vs_hf_assisted_same_drafter"] == pytest.approx(1.2)
    assert r["ngram_vs_hf_prompt_lookup"] == pytest.approx(1.5)
    assert r["feat_vs_ar"] == pytest.approx(1.2)
    assert r["hf_target_only_vs_ar"] == pytest.approx(0.8)


def test_the_ceiling_is_k_plus_one_tokens_over_the_verify_ratio():
    """Every draft accepted and drafting free: k + 1 tokens a round at ``verify[k]`` times the
    cost of target-only's one token a step."""
    line = real_speed.ceiling_line({2: 1.5, 4: 2.0})
    assert line.endswith("k = 2 2.00x, k = 4 2.50x")
