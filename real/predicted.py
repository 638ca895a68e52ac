"""Acceptance predicted from cheap evidence: the drafter's own confidences on new prompts.

The target is the expensive model; a user with new prompts can afford to run the DRAFTER on them
(about a tenth of the target's cost). This module turns that evidence into the simulator's
acceptance for the new workload, with a calibration learned on other prompts where the target's
acceptance WAS measured:

1. Evidence (:func:`drafter_rollout`): the drafter's greedy continuation of each prompt (the
   drafter alone, ``max_new_tokens + horizon`` tokens) and its confidence ``max q`` at every
   step. The target never runs.
2. Structure: under greedy decoding a position trace is fixed by one bit per output position,
   ``a_t`` = "the drafter's first proposal from position t equals the target's token" (once it
   agrees, the drafter's chain from t IS its first proposal from t + 1, and so on), so the run
   length from t is ``L(t) = #consecutive a_t, a_{t+1}, ... = 1`` capped at the horizon.
3. Calibration (:func:`fit_calibration`, on the calibration prompts only, where the target's
   position traces are recorded): P(a_t = 1 | c_t, a_{t-1}) by isotonic regression (pool adjacent
   violators, :func:`pav`) of the first-proposal confidence c_t, separately after an accepted and
   after a rejected position (the run-length effect: agreement comes in stretches). The drafter's
   confidences on its own rollout are not distributed like its confidences on the target's text
   (it is surer of its own words), so a quantile map from the rollout confidences of the
   calibration prompts to their target-text confidences is learned too and applied first.
4. Prediction (:func:`synthetic_positions`): per new prompt, ``samples`` seeded draws of the
   bits ``a_t`` from the calibrated probabilities along the rollout's (mapped) confidences (with
   ``level = "calibration"``, both curves shifted by one logit offset per prompt so that their
   mean along its rollout is the calibration prompts' mean along theirs: :func:`curves`); each
   draw is a position trace (``control.types.PositionRecord``: run lengths, the chain's mapped
   confidences, sentence ends of the rollout's tokens) that the simulator's ``replay`` acceptance
   model reads as it reads a recorded one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.special import expit

from control.configio import param
from control.errors import DSparkError
from control.types import PositionRecord
from real.block_recalibration import shipped_calibration
from real.models import Segments
from real.sampling import SamplingParams

_GREEDY = SamplingParams()
_EPS = 1e-6


@dataclass(frozen=True)
class PredictConfig:
    # 8 draws per prompt: the simulator's mean over them is stable to ~1% on 6 x 128 tokens.
    samples: int = param(8, lo=1, hi=1000, doc="synthetic position traces drawn per prompt")
    # 64 quantiles: enough to follow the confidence distributions of a few hundred positions.
    quantiles: int = param(64, lo=2, hi=10_000, doc="points of the rollout -> target-text map")
    # the map is applied (the drafter is surer of its own continuation than of the target's).
    map_confidences: bool = param(True, doc="map rollout confidences to target-text ones")
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of the drawn acceptance bits")
    # on: for the block drafter on configs/validate.toml's held-out prompts the per-slot model
    # (real.predicted_block) predicted every controller's accepted length closer than the chain
    # of first-proposal bits, whose structure a block drafter does not have.
    block_slots: bool = param(
        True, doc="a block drafter's prediction per block slot of its head (else the chain)"
    )
    # "calibration": a prompt's acceptance level is the calibration prompts' one and its
    # confidences only say where along the text it accepts. The drafter's confidences on a
    # prompt's rollout track its acceptance level weakly (per prompt r = 0.21) and not across
    # workloads: calibrated on code, the fitted curves put prose 19% low, the calibration level
    # 5% (benchmarks/predict_acceptance.py). "confidence": the fitted curves as they are.
    # The chain's option: a block drafter's per-slot prediction (block_slots) does not read it.
    level: str = param(
        "calibration",
        choices=("calibration", "confidence"),
        doc="where a prompt's acceptance level comes from (module doc, 4)",
    )


def pav(x, y, w=None) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic (non-decreasing) least-squares fit of ``y`` on ``x`` by pool adjacent violators;
    returns (knots x, fitted y), one knot per pooled block (at its weighted mean x)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if w is None else np.asarray(w, dtype=float)
    if not len(x):
        raise DSparkError("isotonic fit: no data")
    order = np.argsort(x, kind="stable")
    xs, ys, ws = x[order], y[order], w[order]
    val, wt, xm = [], [], []  # blocks: mean y, weight, mean x
    for xi, yi, wi in zip(xs.tolist(), ys.tolist(), ws.tolist()):
        val.append(yi)
        wt.append(wi)
        xm.append(xi)
        while len(val) > 1 and val[-2] > val[-1]:
            v2, w2, x2 = val.pop(), wt.pop(), xm.pop()
            tot = wt[-1] + w2
            val[-1] = (val[-1] * wt[-1] + v2 * w2) / tot
            xm[-1] = (xm[-1] * wt[-1] + x2 * w2) / tot
            wt[-1] = tot
    return np.asarray(xm), np.asarray(val)


def _interp(knots: tuple, x) -> np.ndarray:
    kx, ky = knots
    return np.interp(np.asarray(x, dtype=float), kx, ky)


def drafter_rollout(engine, prompt_ids, n_tokens: int) -> tuple[list[int], list[float]]:
    """:func:`_drafter_rollout` with the drafter's head as shipped, no online recalibration
    (a prediction is checked against the runs a recalibration would learn from)."""
    with shipped_calibration(engine.drafter):
        return _drafter_rollout(engine, prompt_ids, n_tokens)


@torch.inference_mode()
def _drafter_rollout(engine, prompt_ids, n_tokens: int) -> tuple[list[int], list[float]]:
    """The drafter's own greedy continuation of ``prompt_ids`` (``n_tokens`` tokens, in chunks
    of at most ``k_max + 1``) and its confidence at every step. The target does not decode; a
    drafter that reads its hidden states (block, feature) gets them from a teacher-forced target
    pass over each committed chunk of the rollout (prefill work, a pass per chunk)."""
    d = engine.drafter
    if d is None:
        raise DSparkError("a predicted acceptance needs a drafter")
    prompt = [int(t) for t in prompt_ids]
    P = len(prompt)
    if P + n_tokens + engine.cfg.k_max + 2 > engine.length:
        raise DSparkError(f"prompt of {P} + {n_tokens} rollout tokens exceeds the engine's cache")
    seq = engine.seq
    hidden = getattr(d, "wants_hidden", False)
    if hidden:  # the target's states of the prompt, as the engine's prefill hands them over
        engine._prefill(prompt)
    seq[0, :P] = torch.tensor(prompt, dtype=seq.dtype, device=seq.device)
    d.reset()
    L, confs = P, []
    h = engine.cfg.k_max + 1
    while L < P + n_tokens:
        count, c, _ = d.propose(seq, L, min(h, P + n_tokens - L), 0.0, _GREEDY, None)
        if count <= 0:
            raise DSparkError("the drafter proposed nothing at tau = 0")
        d.accept(L, count, count)
        if hidden:  # a drafter that reads the target's states: the target's teacher-forced
            # pass over the committed chunk (no target decoding: its tokens are never used)
            segs = Segments.one(0, L - 1, count, seq.device)
            engine.target.step_packed(
                seq[0, L - 1 : L - 1 + count], segs, engine.state, logits=False
            )
            engine._hand_hidden(segs)
        confs.extend(float(x) for x in c[:count])
        L += count
    return seq[0, P:L].tolist(), confs


def _first_confidences(positions: list[list[PositionRecord]]) -> tuple[np.ndarray, ...]:
    """(c_t, a_t, a_{t-1}) over every position of the recorded traces (a_{-1} = 0)."""
    c, a, prev = [], [], []
    for recs in positions:
        last = 0
        for r in recs:
            if not r.confidences:
                continue
            acc = int(r.run_length >= 1)
            c.append(r.confidences[0])
            a.append(acc)
            prev.append(last)
            last = acc
    if not c:
        raise DSparkError("calibration position traces hold no drafter confidence")
    return np.asarray(c), np.asarray(a), np.asarray(prev)


def _logit(p):
    p = np.clip(np.asarray(p, dtype=float), _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def fit_calibration(
    positions: list[list[PositionRecord]], rollout_confs: list[list[float]], cfg: PredictConfig
) -> dict:
    """The calibration (module doc, 3) from the calibration prompts' recorded position traces and
    the drafter's rollout confidences on the same prompts. A plain dict (JSON-able)."""
    c, a, prev = _first_confidences(positions)
    out: dict = {"positions": len(c), "a_rate": float(a.mean())}
    for g in (0, 1):
        m = prev == g
        if m.sum() == 0:  # never observed: the pooled fit stands in
            m = np.ones_like(prev, dtype=bool)
        kx, ky = pav(_logit(c[m]), a[m])
        out[f"after_{g}"] = {"logit": kx.tolist(), "p": ky.tolist(), "n": int((prev == g).sum())}
    qs = np.linspace(0.0, 1.0, cfg.quantiles)
    roll = np.asarray([float(x) for xs in rollout_confs for x in xs])
    if cfg.map_confidences and len(roll):
        src, dst = np.quantile(_logit(roll), qs), np.quantile(_logit(c), qs)
        out["map"] = {
            "rollout_logit": np.maximum.accumulate(src).tolist(),
            "text_logit": dst.tolist(),
        }
    if cfg.level == "calibration":  # along the calibration prompts' rollouts (mapped), or
        # along their target-text confidences where no rollout was given
        at = map_confidences(out, roll) if len(roll) else c
        out["level"] = float(np.mean(np.add(*curves(out, at))) / 2)  # the two curves' mean
    return out


def map_confidences(cal: dict, confs) -> np.ndarray:
    """Rollout confidences mapped to target-text ones by the calibration's quantile map."""
    c = np.asarray(confs, dtype=float)
    if "map" not in cal:
        return c
    z = np.interp(_logit(c), cal["map"]["rollout_logit"], cal["map"]["text_logit"])
    return 1.0 / (1.0 + np.exp(-z))


def accept_probability(cal: dict, confs, prev: int) -> np.ndarray:
    """P(a_t = 1) at (already mapped) confidences ``confs`` after a_{t-1} = ``prev``."""
    g = cal[f"after_{int(prev)}"]
    return _interp((np.asarray(g["logit"]), np.asarray(g["p"])), _logit(confs))


def curves(cal: dict, confs) -> tuple[np.ndarray, np.ndarray]:
    """P(a_t = 1) along (already mapped) ``confs`` after a miss and after an acceptance. With a
    calibration level (``cal["level"]``) both are shifted by the one logit offset that makes
    their mean along ``confs`` that level: the order of the positions is kept."""
    p0, p1 = accept_probability(cal, confs, 0), accept_probability(cal, confs, 1)
    if "level" not in cal or not len(p0):
        return p0, p1
    l0, l1 = _logit(p0), _logit(p1)
    goal = min(max(cal["level"], 1e-4), 1 - 1e-4)

    def gap(d: float) -> float:
        return float(np.mean(expit(l0 + d) + expit(l1 + d)) / 2) - goal

    d = brentq(gap, -40.0, 40.0, xtol=1e-9)
    return expit(l0 + d), expit(l1 + d)


def draw_bits(cal: dict, confs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One seeded draw of a_t along ``confs`` (a Markov chain over a_{t-1})."""
    p0, p1 = curves(cal, confs)
    u = rng.random(len(confs))
    bits = np.zeros(len(confs), dtype=np.int64)
    last = 0
    for t in range(len(confs)):
        last = int(u[t] < (p1[t] if last else p0[t]))
        bits[t] = last
    return bits


def run_lengths(bits: np.ndarray, horizon: int) -> np.ndarray:
    """L(t) = consecutive ones from t, capped at ``horizon``."""
    L = np.zeros(len(bits), dtype=np.int64)
    run = 0
    for t in range(len(bits) - 1, -1, -1):
        run = run + 1 if bits[t] else 0
        L[t] = min(run, horizon)
    return L


def synthetic_positions(
    cal: dict,
    tokens: list[int],
    confs: list[float],
    n_new: int,
    horizon: int,
    sentence_end_ids,
    rng: np.random.Generator,
    request_id: int = 0,
) -> list[PositionRecord]:
    """One drawn position trace of a prompt from its rollout (module doc, 4): ``n_new``
    positions, each with its run length and the chain of ``horizon`` mapped confidences."""
    if len(confs) < n_new + horizon - 1:
        raise DSparkError(
            f"rollout of {len(confs)} confidences; {n_new + horizon - 1} needed (n_new + horizon - 1)"
        )
    c = map_confidences(cal, confs)
    L = run_lengths(draw_bits(cal, c, rng), horizon)
    return [
        PositionRecord(
            request_id=request_id,
            position=t,
            run_length=int(L[t]),
            confidences=tuple(float(x) for x in c[t : t + horizon]),
            sentence_end=tokens[t] in sentence_end_ids,
        )
        for t in range(n_new)
    ]
