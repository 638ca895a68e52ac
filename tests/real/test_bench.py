"""The speed benchmark's accounting, on tiny float64 models (no timing is asserted)."""

import real.bench as bench
from real.bench import BenchConfig, run_bench
from real.drafters import NgramDrafter
from tests.real.conftest import V, make_engine, prompt


def test_side_by_side_drafters_are_exact_and_accounted(monkeypatch, tmp_path):
    eng = make_engine("tf")
    prompts = [prompt(20 + i) for i in range(2)]
    monkeypatch.setattr(bench, "held_out_prompts", lambda tok, w, n, length: prompts)
    bc = BenchConfig(
        prompts=2, new_tokens=24, repeats=2, hf=False, k_values="2 4", controllers="dspark"
    )
    drafters = {"tf": eng.drafter, "ngram": NgramDrafter(vocab_size=V)}
    s = run_bench(eng, bc, tmp_path, progress=False, drafters=drafters)
    rows = {r["controller"]: r for r in s["rows"]}
    assert set(rows) == {
        "target-only",
        "tf/fixed-k2",
        "tf/fixed-k4",
        "tf/dspark",
        "ngram/fixed-k2",
        "ngram/fixed-k4",
        "ngram/dspark",
    }
    # float64: every method emits exactly target-only greedy's tokens
    assert all(r["greedy_match_rate"] == 1.0 for r in rows.values())
    assert s["drafter"] == ("drafter-ngram" if s["best"].startswith("ngram/") else eng.drafter.name)
    assert eng.drafter is drafters["tf"]  # the engine gets its own drafter back
    import pandas as pd

    rounds = pd.read_csv(tmp_path / "rounds.csv")
    per = rounds.groupby("controller")["emitted"].sum()
    assert (per == 2 * 24).all() and len(per) == 6  # the last repeat's rounds, every method
    assert rows["tf/fixed-k4"]["mean_k"] <= 4 and rows["ngram/fixed-k2"]["mean_k"] <= 2
    # the copyable share is labelled with the run's own decoding
    assert any("target-only output (greedy):" in x for x in bench.summary_lines(s, tmp_path))
    s["engine_config"] = {**s["engine_config"], "temperature": 0.8}
    assert any("(temperature 0.8):" in x for x in bench.summary_lines(s, tmp_path))


def test_copyable_fraction_counts_repeats_after_a_matching_ngram():
    from real.bench import copyable_fraction

    # prompt 1 2 3 4 5; output 1 2 3 4 5 9: 1 2 3 4 was seen, followed by 5 -> the 5 is
    # copyable; "9" follows 2 3 4 5 which was seen followed by 1 -> not copyable. The first
    # output tokens' 4-grams (4 5 1 2 ...) are new.
    assert copyable_fraction([[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 5, 9]]) == 1 / 6
    # the first 7 has no earlier 7 7 7 7 to copy from (only its own context); the next two do
    assert copyable_fraction([[7, 7, 7, 7]], [[7, 7, 7]]) == 2 / 3
    assert copyable_fraction([[1, 2, 3, 4]], [[5, 6]]) == 0.0
