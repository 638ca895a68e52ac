"""Anomaly guard of the ``dspark`` scheduler, checked once per block end.

Two detectors of a *collapse* of the acceptance estimate â (choose one, or ``off``):

- ``zscore``: an exponentially weighted baseline mean μ and variance σ² of â at past block ends;
  an anomaly when ``(μ − â) / max(σ, sigma_floor) > z_limit``.
- ``cusum``: one-sided lower CUSUM on the same baseline,
  ``S ← max(0, S + (μ − â) − slack)``; an anomaly when ``S > cusum_limit`` (then S ← 0).

The baseline only starts judging after ``min_blocks`` block ends and keeps tracking â afterwards
(so a lasting new regime stops being an anomaly once the baseline has followed it). In
threshold mode a second check fires when the fraction of lossy accepts (accepted tokens that
strict verification would have refused) exceeds ``lossy_limit``.

After a detection the guard stays *active* until ``recovery_blocks`` consecutive block ends
pass without one; the controller applies its configured action while it is active.
"""

from __future__ import annotations

import math


class AnomalyGuard:
    __slots__ = (
        "detector",
        "z_limit",
        "sigma_floor",
        "slack",
        "cusum_limit",
        "ema",
        "min_blocks",
        "lossy_limit",
        "recovery_blocks",
        "mu",
        "var",
        "n",
        "cusum",
        "active",
        "clean_blocks",
        "detections",
        "last_reason",
    )

    def __init__(
        self,
        detector: str,
        z_limit: float,
        sigma_floor: float,
        slack: float,
        cusum_limit: float,
        ema: float,
        min_blocks: int,
        lossy_limit: float,
        recovery_blocks: int,
    ) -> None:
        if detector not in ("zscore", "cusum", "off"):
            raise ValueError(f"unknown anomaly detector {detector!r}")
        self.detector = detector
        self.z_limit, self.sigma_floor = z_limit, sigma_floor
        self.slack, self.cusum_limit = slack, cusum_limit
        self.ema, self.min_blocks = ema, min_blocks
        self.lossy_limit, self.recovery_blocks = lossy_limit, recovery_blocks
        self.reset()

    def reset(self) -> None:
        self.mu = 0.0
        self.var = 0.0
        self.n = 0
        self.cusum = 0.0
        self.active = False
        self.clean_blocks = 0
        self.detections = 0
        self.last_reason = ""

    def check(self, a_hat: float | None, lossy_fraction: float, threshold_mode: bool) -> bool:
        """One block end: True when an anomaly is detected now (``active`` is updated)."""
        reason = ""
        if a_hat is not None and self.detector != "off":
            if self.n >= self.min_blocks:
                drop = self.mu - a_hat
                if self.detector == "zscore":
                    if drop / max(math.sqrt(self.var), self.sigma_floor) > self.z_limit:
                        reason = "a_hat_zscore"
                else:
                    self.cusum = max(0.0, self.cusum + drop - self.slack)
                    if self.cusum > self.cusum_limit:
                        reason = "a_hat_cusum"
                        self.cusum = 0.0
            if self.n == 0:
                self.mu = a_hat
            else:
                diff = a_hat - self.mu
                self.mu += self.ema * diff
                self.var = (1.0 - self.ema) * (self.var + self.ema * diff * diff)
            self.n += 1
        if not reason and threshold_mode and lossy_fraction > self.lossy_limit:
            reason = "lossy_accepts"
        if reason:
            self.active = True
            self.clean_blocks = 0
            self.detections += 1
            self.last_reason = reason
            return True
        if self.active:
            self.clean_blocks += 1
            if self.clean_blocks >= self.recovery_blocks:
                self.active = False
        return False
