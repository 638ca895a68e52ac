"""Online recalibration of the block drafter's confidence head from the engine's own rounds.

The head is calibrated once, after training, on held-out text (``real.block_train``). On a
user's prompts its predictions drift from what verification then finds: on
``benchmarks/real_speed.py``'s unseen prompts it said 0.96 where 0.74 of the slots were
accepted. Every round the engine verifies tells how the drafted slots fared, so the engine
refits, as it runs, a Platt map of the head's (calibrated) logit ``z``:

    p = σ(a · z + b)

maximising the log-likelihood of the verified slots (slot j of a round counts when the slots
before it were accepted: accepted when j < n, refused at j = n; slots after a refusal were never
verified) plus a Gaussian prior of ``prior_slots`` pseudo-slots' weight at ``(a, b) = (1, 0)``,
the shipped calibration: with no rounds yet the map is the identity, and a handful of rounds
moves it little. The fit is a few Newton steps from the last one after each round, over the
last ``window`` slots. Each round's confidences come from the map fitted on the rounds before
it, so the head's predictions, the τ stop and the controllers' acceptance estimates never see
the outcome they predict; draft tokens depend only on the committed context, so verification
stays exact.
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
    # a few hundred slots decide it (replayed on two unseen-prompt runs of real_speed.py, the
    # prequential ECE was 0.04 for 2-10 pseudo-slots and 0.07 for 50).
    prior_slots: float = param(8.0, lo=0.0, hi=1e6, doc="weight of the shipped calibration")
    # the last 4096 verified slots: many requests, and a workload that changes is followed.
    window: int = param(4096, lo=16, hi=1_000_000, doc="verified slots the fit remembers")
    # Newton steps after each round, from the last fit (a fit that moved by a round's slots).
    steps: int = param(2, lo=1, hi=50, doc="Newton steps of the refit after each round")


class OnlineCalibration:
    """The Platt map ``σ(a·z + b)`` of a confidence logit, refitted on verified slots."""

    def __init__(self, config: RecalibrationConfig | None = None) -> None:
        self.config = config or RecalibrationConfig()
        self.reset()

    def reset(self) -> None:
        """Back to the shipped calibration, no slot remembered (a fresh server)."""
        self.theta = _PRIOR.copy()  # (a, b): the identity on the shipped calibration
        self._z = np.zeros(0)  # the remembered slots' logits, oldest first
        self._y = np.zeros(0)  # and whether each was accepted

    @property
    def slots(self) -> int:
        """Verified slots the fit holds."""
        return len(self._y)

    def apply(self, z: np.ndarray) -> np.ndarray:
        """The recalibrated probabilities of logits ``z`` (any shape)."""
        a, b = self.theta
        return 1.0 / (1.0 + np.exp(-(a * np.asarray(z, dtype=float) + b)))

    def learn(self, z: np.ndarray, accepted: np.ndarray) -> None:
        """Verified slots (their logits, and 1 / 0 for accepted / refused) join the fit, which
        is refitted."""
        z = np.asarray(z, dtype=float).ravel()
        if not len(z):
            return
        c = self.config
        self._z = np.concatenate([self._z, z])[-c.window :]
        self._y = np.concatenate([self._y, np.asarray(accepted, dtype=float).ravel()])[-c.window :]
        x = np.stack([self._z, np.ones_like(self._z)], axis=1)
        theta = self.theta
        for _ in range(c.steps):
            s = x @ theta
            p = 1.0 / (1.0 + np.exp(-s))
            grad = x.T @ (self._y - p) - c.prior_slots * (theta - _PRIOR)
            hess = (x * (p * (1.0 - p))[:, None]).T @ x + c.prior_slots * np.eye(2)
            try:
                step = np.linalg.solve(hess, grad)
            except np.linalg.LinAlgError:  # no prior and slots that cannot tell a from b
                break
            # halved until the objective rises (a full Newton step overshoots when the slots
            # are nearly separable, and plain Newton then oscillates)
            now = self._objective(x, theta)
            for _ in range(30):
                if self._objective(x, theta + step) >= now:
                    theta = theta + step
                    break
                step = step / 2.0
            else:
                break
        if np.isfinite(theta).all():
            self.theta = theta

    def _objective(self, x: np.ndarray, theta: np.ndarray) -> float:
        """The log-likelihood of the remembered slots under ``theta`` plus the log prior."""
        s = x @ theta
        # log σ(s) = −log(1 + e^−s), log(1 − σ(s)) = −log(1 + e^s), computed without overflow
        ll = -(self._y * np.logaddexp(0.0, -s) + (1.0 - self._y) * np.logaddexp(0.0, s)).sum()
        d = theta - _PRIOR
        return float(ll - 0.5 * self.config.prior_slots * (d @ d))


#: (a, b) of the shipped calibration: the prior's centre
_PRIOR = np.array([1.0, 0.0])


def verified_slots(logits: list[float], drafted: int, accepted: int) -> tuple[list, list]:
    """The slots of a round that verification decided, ``(logits, outcomes)``: slot j when the
    slots before it were accepted, accepted when ``j < accepted`` (a refusal at ``accepted``
    ends them)."""
    upto = min(accepted + 1, drafted, len(logits))
    return logits[:upto], [1.0 if j < accepted else 0.0 for j in range(upto)]


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
