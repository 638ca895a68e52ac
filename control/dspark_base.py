"""What both policies of the ``dspark`` controller do (:mod:`control.dspark` describes them):
per sequence a sliding window of rounds (:mod:`control.window`), semi-autoregressive blocks
(:mod:`control.blocks`) whose ends are the only moments the α and β loops (:mod:`control.pid`)
move, warm-up and a minimum update interval, the anomaly guard (:mod:`control.anomaly`) and the
retry cap's cool-down, and the cached :class:`Decision`. A policy's subclass says what α means
(:meth:`DSparkBaseController._alpha_error`), how α sets the draft length, and what else a round
teaches it.
"""

from __future__ import annotations

import math
from typing import Any

from control.anomaly import AnomalyGuard
from control.base import ValuesObserver
from control.blocks import BlockPlanner
from control.dspark_base_config import DSparkBaseConfig
from control.errors import ConfigError
from control.pid import PID
from control.types import Decision, Mode, valid_decision
from control.window import RoundWindow


class DSparkBaseController(ValuesObserver):
    """The state and loops both policies share; subclasses set ``policy`` and the hooks."""

    name = "dspark"
    policy = ""  # the value of DSparkConfig.policy this class runs
    records_evidence = False  # whether observe_values hands the round to _record first
    # a records_evidence policy's own keeping of a round, before the shared window, retry cap
    # and blocks: _record(now_s, drafted, n, confidences, draft_s, verify_s, context_tokens, e,
    # batch_size, batch_tokens, batch_context_tokens)
    _record: Any
    reads_confidences = False
    config: DSparkBaseConfig
    alpha: float

    def __init__(self, config: DSparkBaseConfig, alpha_max: float, alpha0: float) -> None:
        """``alpha_max`` / ``alpha0``: the ceiling and start of the α loop (the policy's)."""
        if getattr(config, "policy", self.policy) != self.policy:
            raise ConfigError(f"controller.{self.name}.policy must be '{self.policy}'")
        c = self.config = config
        self._win = RoundWindow(c.window_rounds)
        self._blocks = BlockPlanner(c.block_tokens, c.snap_tokens, c.span_tokens)
        self.slo: Any = None  # the driver's SLOs (set_slo), None until told
        self._pid_a = PID(
            c.alpha_kp, c.alpha_ki, c.alpha_kd, c.d_filter, c.alpha_min, alpha_max, alpha0
        )
        self._pid_b = PID(
            c.beta_kp, c.beta_ki, c.beta_kd, c.d_filter, c.beta_min, c.beta_max, c.beta0
        )
        self._retry = True  # whether fruitless rounds lead to a cool-down
        self._push = self._win.push_row  # bound once: observe() is on the hot path
        self._feed = self._blocks.feed
        self._guard = AnomalyGuard(
            c.anomaly_detector,
            c.anomaly_z,
            c.anomaly_sigma_floor,
            c.cusum_slack,
            c.cusum_limit,
            c.baseline_ema,
            c.baseline_min_blocks,
            c.lossy_limit,
            c.recovery_blocks,
        )
        self.reset()

    def set_slo(self, slo: Any) -> None:
        """The driver's SLOs: the TPOT the loops hold (``slo_tpot_s`` when it gives none)."""
        self.slo = slo

    # --- policy hooks --
    def _initial_k(self) -> int:  # pragma: no cover - every policy overrides it
        """The draft length before the first update."""
        raise NotImplementedError

    def _alpha_error(self, a_hat: float | None) -> float | None:  # pragma: no cover
        """The α loop's error at an update (None: α holds), from the window's â and
        ``self.latency_ratio``."""
        raise NotImplementedError

    def _after_update(self) -> None:
        """Called at every block end past warm-up, after the loops and the guard."""

    def _a_seq(self) -> float | None:
        """The sequence's long-run acceptance rate, for ``state()`` (None: not kept)."""
        return None

    # --- protocol --
    def reset(self) -> None:
        c = self.config
        self._win.clear()
        self._blocks.reset()
        self._pid_a.reset()
        self._pid_b.reset()
        self._guard.reset()
        self.alpha = self._pid_a.output
        self.beta = c.beta0
        self.k = self._initial_k()
        self.a_hat: float | None = None
        self.latency_ratio: float | None = None
        self.rounds = 0
        self.updates = 0
        self.last_update_round = -(10**9)
        self.fails = 0
        self.cooldown = 0
        self.cooldowns = 0
        self.block_index = 0
        self._pending: Decision | None = None
        # set by _rebuild() below, before any use
        self._decision: Decision = None  # type: ignore[assignment]
        self._block_decision: Decision | None = None
        self._rebuild(False)

    def decide(self, now_s: float, batch=None) -> Decision:
        return self.take_decision()

    def take_decision(self) -> Decision:
        """The sequence's own decision (the block-end one once, then the cached one); under
        the goodput policy its k is the sequence's cap (k_max, 0 in a cool-down)."""
        d = self._pending
        if d is not None:
            self._pending = None
            return d
        return self._decision

    def observe_values(
        self,
        now_s,
        drafted,
        n,
        confidences,
        draft_s,
        verify_s,
        context_tokens,
        lossy_accepts,
        e,
        sentence_ends,
        batch_size=1,
        batch_tokens=0,
        batch_context_tokens=0,
    ) -> None:
        # hot path (the simulator calls it per sequence per round): the policy's own record,
        # then what both policies do with a round (_observed)
        if self.records_evidence:
            self._record(now_s, drafted, n, confidences, draft_s, verify_s, context_tokens, e, batch_size, batch_tokens, batch_context_tokens)  # fmt: skip
        self._observed(now_s, drafted, n, draft_s, draft_s + verify_s, lossy_accepts, e, sentence_ends)  # fmt: skip

    def _observed(self, now_s, drafted, n, draft_s, round_s, lossy_accepts, e, sentence_ends):
        """What both policies do with an observed round (after the policy's record): the
        window's push, the retry cap and the blocks. Locals, no calls but the window's push and
        the block planner's feed (both bound once) unless something happens (a fruitless round,
        a cool-down step, a block boundary). A round planner that records a batch's evidence at
        once (:meth:`control.dspark_planner.DSparkPlanner.observe_members`) calls it per
        member."""
        # window.row_of, one line (this function is the hot path; the formatter would spread it)
        self._push((n, 1 if n < drafted else 0, drafted, e, draft_s, round_s, lossy_accepts, now_s))  # fmt: skip
        self.rounds += 1
        changed = False
        if self.cooldown:
            self.cooldown -= 1
            changed = self.cooldown == 0
        elif drafted and self._retry:
            if n:
                self.fails = 0
            else:
                self.fails += 1
                if self.fails >= self.config.retry_cap:
                    self.fails = 0
                    self.cooldown = self.config.cooldown_rounds
                    self.cooldowns += 1
                    changed = True
        if self._feed(e, sentence_ends):  # a block closed
            self._block_end()
            return
        if changed:
            self._rebuild(False)

    def state(self) -> dict[str, Any]:
        g = self._guard
        return {
            "k": self.k,
            "k_decided": self._decision.k,
            "mode": self._decision.mode,
            "alpha": self.alpha,
            "beta": self.beta,
            "a_hat": self.a_hat,
            "latency_ratio": self.latency_ratio,
            "alpha_integrator": self._pid_a.integrator,
            "beta_integrator": self._pid_b.integrator,
            "alpha_derivative": self._pid_a.d_state,
            "beta_derivative": self._pid_b.d_state,
            "anomaly": g.active,
            "anomaly_reason": g.last_reason,
            "anomalies": g.detections,
            "cusum": g.cusum,
            "baseline_a": g.mu,
            "fails": self.fails,
            "cooldown": self.cooldown,
            "cooldowns": self.cooldowns,
            "block_index": self.block_index,
            "block_tokens_so_far": self._blocks.tokens_in_block,
            "rounds": self.rounds,
            "updates": self.updates,
            "policy": self.policy,
            "a_seq": self._a_seq(),
        }

    # --- internals --
    def _rebuild(self, block_end: bool) -> None:
        c = self.config
        strict = self._guard.active and c.anomaly_action == "strict"
        # c.mode is one of MODES (its param choices): the Literal Decision takes
        mode: Mode = "strict" if strict else c.mode  # type: ignore[assignment]
        k = 0 if self.cooldown else self.k
        beta = self.beta
        # reuse the previous (immutable) Decision objects when nothing in them changed
        d = self._decision
        if d is None or d.k != k or d.mode != mode or d.beta != beta or d.tau != c.tau:
            d = self._decision = valid_decision(k, mode, beta, c.tau)
        if block_end:
            p = self._block_decision
            if p is None or p.k != k or p.mode != mode or p.beta != beta:
                p = self._block_decision = valid_decision(k, mode, beta, c.tau, True)
            self._pending = p

    def _block_end(self) -> None:
        c = self.config
        win = self._win
        self.block_index = self._blocks.blocks_closed
        a = win.a_hat()
        tpot = win.tpot_s() if c.tpot_source == "round_time" else win.wall_tpot_s()
        self.a_hat = a
        slo = self.slo.tpot_s if self.slo is not None else math.inf
        self.latency_ratio = (
            None if tpot is None else tpot / (slo if math.isfinite(slo) else c.slo_tpot_s)
        )
        if self.rounds >= c.warmup_rounds:
            if self.rounds - self.last_update_round >= c.min_update_rounds:
                err = self._alpha_error(a)
                if err is not None:
                    self.alpha = self._pid_a.step(err)
                if self.latency_ratio is not None:
                    self.beta = self._pid_b.step(1.0 - self.latency_ratio)
                self.last_update_round = self.rounds
                self.updates += 1
            if self._guard.check(a, win.lossy_fraction(), c.mode == "threshold"):
                self._on_anomaly()
            self._after_update()
        self._rebuild(True)

    def _on_anomaly(self) -> None:
        c = self.config
        if c.anomaly_action == "reset":
            self._pid_a.reset()
            self._pid_b.reset()
            self.alpha, self.beta = self._pid_a.output, self._pid_b.output
        elif c.anomaly_action == "raise_beta":
            self._pid_b.reset(self._pid_b.integrator + c.beta_raise)  # clears e_prev too
            self.beta = self._pid_b.output
