"""A discrete PID loop, one step per controller update (per block end).

Position form with the integrator holding the *controlled value itself*: it starts at the
parameter's initial value (bumpless start) and integrates ``Ki · e`` each step, clamped to the
parameter's range (anti-windup by clamping: the integrator can never wind past what the output
can reach). The output is ``clip(I + Kp·e + Kd·d, out_lo, out_hi)`` where ``d`` is the
derivative of the error passed through a first-order low-pass filter,
``d ← d + λ·((e − e_prev) − d)`` (λ = 1: unfiltered; smaller: smoother).

With ``Kp = Kd = 0`` and ``Ki = γ`` one step is exactly ``x ← clip(x + γ·e)``: the seed's update
rule, bit for bit (``I + 0.0 + 0.0 == I`` in floating point).
"""

from __future__ import annotations


class PID:
    __slots__ = (
        "kp",
        "ki",
        "kd",
        "d_filter",
        "lo",
        "hi",
        "initial",
        "integrator",
        "d_state",
        "e_prev",
        "output",
    )

    def __init__(
        self, kp: float, ki: float, kd: float, d_filter: float, lo: float, hi: float, initial: float
    ) -> None:
        if not lo <= initial <= hi:
            raise ValueError(f"PID initial value {initial} outside [{lo}, {hi}]")
        if not 0.0 < d_filter <= 1.0:
            raise ValueError(f"PID derivative filter must be in (0, 1], got {d_filter}")
        self.kp, self.ki, self.kd, self.d_filter = kp, ki, kd, d_filter
        self.lo, self.hi, self.initial = lo, hi, initial
        self.reset()

    def reset(self, value: float | None = None) -> None:
        """Integrator back to ``value`` (default: the initial value); derivative state cleared."""
        v = self.initial if value is None else min(self.hi, max(self.lo, value))
        self.integrator = v
        self.output = v
        self.d_state = 0.0
        self.e_prev: float | None = None

    def step(self, error: float) -> float:
        """One update with ``error``; returns the new (clamped) output."""
        i = self.integrator + self.ki * error
        i = self.lo if i < self.lo else self.hi if i > self.hi else i
        self.integrator = i
        if self.e_prev is not None:
            self.d_state += self.d_filter * ((error - self.e_prev) - self.d_state)
        self.e_prev = error
        out = i + self.kp * error + self.kd * self.d_state
        self.output = self.lo if out < self.lo else self.hi if out > self.hi else out
        return self.output
