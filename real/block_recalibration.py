"""Online recalibration of the block drafter's confidence head from the engine's own rounds.

The head is calibrated once, after training, on held-out text (``real.block_train``). On a
user's prompts its predictions drift from what verification then finds: on
``benchmarks/real_speed.py``'s unseen prompts the chain-free head said 0.96 where 0.74 of the
slots were accepted. Every round the engine verifies tells how the drafted slots fared, so the engine
refits, as it runs, a Platt map of the head's (calibrated) logit ``z``:

    p = σ(a · z + b)

maximising the log-likelihood of the verified slots (slot j of a round counts when the slots
before it were accepted: accepted when j < n, refused at j = n; slots after a refusal were never
verified) plus a Gaussian prior of ``prior_slots`` pseudo-slots' weight at ``(a, b) = (1, 0)``,
the shipped calibration: with no rounds yet the map is the identity, and a handful of rounds
moves it little. After each round the fit takes one Newton step from the last one (halved
until the objective rises), over the slots seen, forgotten at ``1/memory_slots`` a slot and
counted by logit bin (width 1/8), so a refit costs the same whatever the memory. Each round's
confidences come from the map fitted on the rounds before it, so the head's predictions, the
τ stop and the controllers' acceptance estimates never see the outcome they predict; a draft
token depends on the committed context and the tokens drafted before it, never on a
verification outcome, so verification stays exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.configio import param


@dataclass(frozen=True)
class RecalibrationConfig:
    # 8 pseudo-slots at the shipped calibration: a few rounds of a batch move the map a little,
    # a few hundred slots decide it (replayed on two to four unseen-prompt runs of
    # real_speed.py, each method's pass starting fresh, the prequential ECE was 0.044-0.059
    # for 2-8 pseudo-slots and 0.055-0.066 for 32).
    prior_slots: float = param(8.0, lo=0.0, hi=1e6, doc="weight of the shipped calibration")
    # ~4096 verified slots: many requests, and a workload that changes is followed.
    memory_slots: float = param(
        4096.0, lo=16.0, hi=1e9, doc="verified slots the fit remembers (forgetting 1/memory)"
    )
    # one Newton step after each round, from the last fit (which a round's slots move little;
    # replayed on four runs, two steps moved the ECE by at most 0.0011).
    steps: int = param(1, lo=1, hi=50, doc="Newton steps of the refit after each round")


#: The logits' bins (width 1/8 on [-12, 12]): a slot is counted in its bin, at the bin's mean
#: logit, so a refit costs the same whatever the slots remembered.
BIN_WIDTH, BIN_LIMIT = 0.125, 12.0
_BINS = int(2 * BIN_LIMIT / BIN_WIDTH) + 1

#: (a, b) of the shipped calibration: the prior's centre
_PRIOR = np.array([1.0, 0.0])


class OnlineCalibration:
    """The Platt map ``σ(a·z + b)`` of a confidence logit, refitted on verified slots. The
    slots are kept as forgotten counts by logit bin: weight, accepted weight and Σ weight·z
    (the bin's mean logit)."""

    def __init__(self, config: RecalibrationConfig | None = None) -> None:
        self.config = config or RecalibrationConfig()
        self.reset()

    def reset(self) -> None:
        """Back to the shipped calibration, no slot remembered (a fresh server)."""
        self.theta = _PRIOR.copy()  # (a, b): the identity on the shipped calibration
        self._w = np.zeros(_BINS)  # forgotten slot counts by bin
        self._s = np.zeros(_BINS)  # of which accepted
        self._wz = np.zeros(_BINS)  # Σ weight · logit

    @property
    def slots(self) -> float:
        """Verified slots the fit holds (forgotten: their weight)."""
        return float(self._w.sum())

    def apply(self, z: np.ndarray) -> np.ndarray:
        """The recalibrated probabilities of logits ``z`` (any shape)."""
        a, b = self.theta
        return 1.0 / (1.0 + np.exp(-(a * np.asarray(z, dtype=float) + b)))

    def learn(self, z: np.ndarray, accepted: np.ndarray) -> None:
        """Verified slots (their logits, and 1 / 0 for accepted / refused) join the fit, the
        older ones forgotten by ``1 − 1/memory_slots`` a slot; the map is refitted."""
        z = np.asarray(z, dtype=float).ravel()
        if not len(z):
            return
        c = self.config
        keep = (1.0 - 1.0 / c.memory_slots) ** len(z)
        zc = np.clip(z, -BIN_LIMIT, BIN_LIMIT)
        idx = np.rint((zc + BIN_LIMIT) / BIN_WIDTH).astype(np.intp)
        for arr in (self._w, self._s, self._wz):
            arr *= keep
        np.add.at(self._w, idx, 1.0)
        np.add.at(self._s, idx, np.asarray(accepted, dtype=float).ravel())
        np.add.at(self._wz, idx, zc)
        used = self._w > 0.0
        w, acc = self._w[used], self._s[used]
        x = np.stack([self._wz[used] / w, np.ones(len(w))], axis=1)
        theta = self.theta
        for _ in range(c.steps):
            p = 1.0 / (1.0 + np.exp(-(x @ theta)))
            grad = x.T @ (acc - w * p) - c.prior_slots * (theta - _PRIOR)
            hess = (x * (w * p * (1.0 - p))[:, None]).T @ x + c.prior_slots * np.eye(2)
            try:
                step = np.linalg.solve(hess, grad)
            except np.linalg.LinAlgError:  # no prior and slots that cannot tell a from b
                break
            # halved until the objective rises (a full Newton step overshoots when the slots
            # are nearly separable, and plain Newton then oscillates)
            now = self._objective(x, w, acc, theta)
            for _ in range(30):
                if self._objective(x, w, acc, theta + step) >= now:
                    theta = theta + step
                    break
                step = step / 2.0
            else:
                break
        if np.isfinite(theta).all():
            self.theta = theta

    def _objective(self, x, w, acc, theta: np.ndarray) -> float:
        """The log-likelihood of the remembered slots under ``theta`` plus the log prior."""
        s = x @ theta
        # log σ(s) = −log(1 + e^−s), log(1 − σ(s)) = −log(1 + e^s), computed without overflow
        ll = -(acc * np.logaddexp(0.0, -s) + (w - acc) * np.logaddexp(0.0, s)).sum()
        d = theta - _PRIOR
        return float(ll - 0.5 * self.config.prior_slots * (d @ d))


def verified_slots(values: list[float], drafted: int, accepted: int) -> tuple[list, list]:
    """The slots of a round that verification decided, ``(values, outcomes)`` (a value per
    slot: the head's logit or its confidence): slot j when the slots before it were accepted,
    accepted when ``j < accepted`` (a refusal at ``accepted`` ends them)."""
    upto = min(accepted + 1, drafted, len(values))
    return values[:upto], [1.0 if j < accepted else 0.0 for j in range(upto)]


@contextmanager
def shipped_calibration(drafter: Any) -> Iterator[None]:
    """Inside the block, ``drafter``'s confidences are its head's as shipped, whatever it
    learned online: tools that replay a drafter over known text (validate's rollouts, position
    traces) must not predict with a map fitted on the runs they are checked against."""
    rc = getattr(drafter, "recalibration", None)
    if rc is None:
        yield
        return
    drafter.recalibration = None
    try:
        yield
    finally:
        drafter.recalibration = rc
