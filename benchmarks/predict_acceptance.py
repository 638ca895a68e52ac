"""How well can acceptance on new prompts be predicted from the drafter alone, and how well could
any predictor do on a few prompts?

``dspark validate``'s predictive variant fits ``real.predicted``'s calibration on the calibration
prompts' greedy position traces and drafter rollouts, then predicts held-out prompts from their
rollouts only. This benchmark records, with the shipped models (``configs/validate.toml``'s
engine: float32, the conv drafter, batch 1), many prompt sets of ``--new-tokens`` tokens each:

- calibration sets (code, validation split): ``--cal-large`` (12 prompts each) and
  ``--cal-small`` (3 prompts each, the size of ``configs/validate_demo.toml``'s calibration
  before it took 12);
- held-out sets (code and prose, test split), ``--heldout-prompts`` prompts each; their seeds
  leave out 1 and 2, the held-out prompts of ``configs/validate.toml`` and the demo's.

For every calibration set and held-out set it predicts fixed k = ``--k``'s accepted length (tokens
a round, replayed on the position traces as the engine runs fixed k: at batch 1 under greedy
decoding the engine's own value) with each ``PredictConfig.level``, ``--samples`` draws per
prompt, and prints the error against the held-out set's real one.

Then a reference for any predictor that cannot tell prompts apart: the *population oracle* knows
each workload's pooled accepted length over all its held-out prompts exactly and predicts it for
every set; on random sets of 3, 6 and 12 of those prompts (drawn without replacement) it lands
within 10% in the printed share of draws. And the evidence a rollout carries per prompt: the correlation between a
prompt's mean rollout confidence and its acceptance rate.

    .venv/bin/python benchmarks/predict_acceptance.py [--cal-large 31,41,51,61]
        [--cal-small 11,12,13,14,15] [--code 3,4,5,6,7,8,9] [--prose 3,4,5,6,7,8]

About 3 minutes on 2 cores (recording dominates). Last line:
``predict_err_level_calibration=… predict_err_level_confidence=… oracle_within10_3=…
oracle_within10_12=…`` (mean |error| in % over the large calibration sets × held-out sets; the
oracle's shares over both workloads).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LEVELS = ("calibration", "confidence")
ORACLE_SIZES = (3, 6, 12)


def accepted_length(traces: list, k: int) -> float:
    """Fixed k's tokens per round over position traces (pooled: ``validate.metrics``)."""
    from validate.metrics import prompt_sample

    return prompt_sample(traces, k)["accepted_length"]


def record(engine, cfg, workload: str, split: str, seed: int, n: int, new: int) -> dict:
    """One prompt set: greedy position traces and drafter rollouts of its ``n`` prompts."""
    from real.positions import record_positions_full
    from real.predicted import drafter_rollout
    from real.tracing import make_prompts

    ps = dataclasses.replace(
        cfg.prompt_set(cfg.calibration.workload),
        workload=workload,
        split=split,
        seed=seed,
        n_prompts=n,
        max_new_tokens=new,
    )
    prompts = make_prompts(ps, engine.tokenizer, engine.target.embed_tokens.num_embeddings)
    pos = [record_positions_full(engine, p, new, request_id=i)[0] for i, p in enumerate(prompts)]
    rolls = [drafter_rollout(engine, p, new + cfg.engine.k_max + 1) for p in prompts]
    return {"name": f"{workload}-{split}-{seed}", "positions": pos, "rollouts": rolls}


def predicted_runs(cal: dict, s: dict, samples: int, horizon: int, seed: int) -> list:
    from real.predicted import synthetic_positions

    rng = np.random.default_rng(seed)
    return [
        synthetic_positions(cal, toks, confs, len(recs), horizon, set(), rng)
        for recs, (toks, confs) in zip(s["positions"], s["rollouts"])
        for _ in range(samples)
    ]


def errors(cal_sets, held, level: str, a) -> np.ndarray:
    """[calibration set, held-out set] % error of the predicted accepted length."""
    from real.predicted import PredictConfig, fit_calibration

    pc = PredictConfig(level=level)
    out = np.zeros((len(cal_sets), len(held)))
    for i, c in enumerate(cal_sets):
        cal = fit_calibration(c["positions"], [r[1] for r in c["rollouts"]], pc)
        for j, h in enumerate(held):
            pred = accepted_length(predicted_runs(cal, h, a.samples, a.k_max + 1, a.seed), a.k)
            out[i, j] = 100 * (pred / accepted_length(h["positions"], a.k) - 1)
    return out


def oracle(held, k: int, draws: int, seed: int) -> dict[int, float]:
    """Share of random n-prompt sets within 10% of their workload's pooled accepted length (NaN
    for a size no workload has that many prompts for)."""
    from validate.metrics import fixed_k_rounds

    rng = np.random.default_rng(seed)
    hits = {n: [] for n in ORACLE_SIZES}
    for wl in sorted({h["name"].split("-")[0] for h in held}):
        runs = [L for h in held if h["name"].startswith(wl + "-") for L in h["positions"]]
        tok, rnd = fixed_k_rounds(runs, k)  # each prompt replayed once; a set sums its own
        pop = float(tok.sum() / rnd.sum())
        for n in (n for n in ORACLE_SIZES if n <= len(runs)):
            for _ in range(draws):
                pick = rng.choice(len(runs), n, replace=False)
                set_len = float(tok[pick].sum() / rnd[pick].sum())
                hits[n].append(abs(pop / set_len - 1) <= 0.10)
    return {n: float(np.mean(v)) if v else float("nan") for n, v in hits.items()}


def rollout_evidence(sets) -> float:
    """Correlation over prompts of the mean rollout confidence and the acceptance rate."""
    x = [np.mean(r[1]) for s in sets for r in s["rollouts"]]
    y = [np.mean([p.run_length >= 1 for p in recs]) for s in sets for recs in s["positions"]]
    return float(np.corrcoef(x, y)[0, 1])


def seeds(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cal-large", default="31,41,51,61", help="seeds of 12-prompt calibrations")
    ap.add_argument("--cal-small", default="11,12,13,14,15", help="seeds of 3-prompt calibrations")
    ap.add_argument("--code", default="3,4,5,6,7,8,9", help="seeds of held-out code sets")
    ap.add_argument("--prose", default="3,4,5,6,7,8", help="seeds of held-out prose sets")
    ap.add_argument("--heldout-prompts", type=int, default=6, help="prompts per held-out set")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--k", type=int, default=6, help="the fixed k whose accepted length is scored")
    ap.add_argument("--samples", type=int, default=8, help="predicted traces drawn per prompt")
    ap.add_argument("--draws", type=int, default=2000, help="oracle bootstrap draws per size")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    import torch

    from validate.config import load_validate
    from validate.harness import build_engine

    torch.set_num_threads(1)
    cfg = load_validate(ROOT / "configs" / "validate.toml")
    engine = build_engine(cfg)
    a.k_max = cfg.engine.k_max
    new = a.new_tokens

    def sets(wl, split, ss, n):
        return [record(engine, cfg, wl, split, s, n, new) for s in seeds(ss)]

    large, small = sets("code", "val", a.cal_large, 12), sets("code", "val", a.cal_small, 3)
    held = sets("code", "test", a.code, a.heldout_prompts)
    held += sets("prose", "test", a.prose, a.heldout_prompts)
    names = [h["name"] for h in held]
    print(f"held-out sets ({a.heldout_prompts} prompts × {new} tokens): " + ", ".join(names))
    print(
        "real fixed-k accepted length: "
        + ", ".join(f"{accepted_length(h['positions'], a.k):.3f}" for h in held)
    )
    err = {}
    for level in LEVELS:
        for label, cs in (("12 prompts", large), ("3 prompts", small)):
            e = errors(cs, held, level, a)
            err[level, label] = e
            code = e[:, [i for i, n in enumerate(names) if n.startswith("code")]]
            prose = e[:, [i for i, n in enumerate(names) if n.startswith("prose")]]
            print(
                f"level={level:11s} calibration {label:10s} mean |error| "
                f"{np.abs(e).mean():5.1f}%  within 10%: {np.mean(np.abs(e) <= 10):.2f}  "
                f"max {np.abs(e).max():5.1f}%  bias code {code.mean():+5.1f}% "
                f"prose {prose.mean():+5.1f}%"
            )
    orc = oracle(held, a.k, a.draws, a.seed)
    print(
        "population oracle within 10%: "
        + ", ".join(f"{n} prompts {orc[n]:.2f}" for n in ORACLE_SIZES)
    )
    print(
        f"per prompt, mean rollout confidence vs acceptance rate: r = "
        f"{rollout_evidence(large + small + held):.2f}"
    )
    print(
        f"predict_err_level_calibration={np.abs(err['calibration', '12 prompts']).mean():.2f} "
        f"predict_err_level_confidence={np.abs(err['confidence', '12 prompts']).mean():.2f} "
        f"oracle_within10_3={orc[3]:.3f} oracle_within10_12={orc[12]:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
