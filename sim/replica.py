"""``Replica``: one model replica serving its own batch, as a SimPy process.

A replica owns its resources: the FIFO queue of waiting requests, the running set, the KV
memory in use and a batch view of the running set. Its process (:meth:`Replica.serve`) admits
waiting requests under ``max_batch`` and the KV budget (a request reserves KV for prompt +
output tokens on admission), runs one prefill pass for the newly admitted (it emits their first
token), then rounds. A round (:meth:`Replica.run_round`) is, in order: decide (each sequence's
controller, or the replica's round planner, gives a Decision; the engine caps k), draw
acceptance (whole-batch numpy draws), time the round (the draft phase lasts the batch's
largest draft-step count × one drafter step; one target pass verifies Σ(k_i + 1) tokens), one
SimPy timeout, then observe (each controller gets its Observation with the modelled times and
the batch context; the planner gets the round's RoundStats) and advance (positions move; a
request ends when it has emitted its output length, the last round's emission capped).

Speed: the batch view keeps the controllers' bound ``decide``/``observe_values``, positions,
context lengths and remaining tokens between rounds and is rebuilt only when the running set
changes; per-sequence work besides the controller calls is a few list comprehensions, and
random draws are whole-batch numpy calls in a fixed order (so results are bit-identical to the
one-array-per-round formulation): run lengths, confidences, lossy resampling, sentence ends,
then the acceptance model's own advance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import simpy

from control.batch import BatchContext, RoundStats
from control.types import Observation
from sim.acceptance import AcceptanceModel, lossy_probability
from sim.cluster import Cluster
from sim.drafting import cap_draft_lengths, confidence_stop, resample_lossy
from sim.ledger import Ledger
from sim.params import EngineParams
from sim.trace import RoundTrace


def observer(c: Any) -> Callable[..., None]:
    """``c.observe_values`` (Observation fields positionally), or an adapter for a controller
    that only has ``observe``."""
    f = getattr(c, "observe_values", None)
    if f is not None:
        return f
    obs = c.observe
    return lambda *values: obs(Observation(*values))


@dataclass
class Shared:
    """What all replicas of a run share: the clock, the parameters, the models, the ledger,
    the controller factory, the trace (None: untraced) and what the controllers ask for
    (``needs_future``: told each round's run lengths; ``confidences_to_controllers``: per-token
    confidence tuples are built for them)."""

    env: simpy.Environment
    params: EngineParams
    cluster: Cluster
    acc: AcceptanceModel
    ledger: Ledger
    make_ctrl: Callable[[], Any]
    tracer: RoundTrace | None
    needs_future: bool
    confidences_to_controllers: bool


class BatchView:
    """The running set as the round loop reads it, kept between rounds until the set changes:
    request ids (list and numpy), controllers and their bound ``decide`` and observe methods,
    positions (numpy; authoritative while the view lives, written back to the ledger by
    :meth:`Replica.flush`), context lengths and remaining tokens (lists)."""

    __slots__ = ("context", "controllers", "decide", "ids", "observe", "positions", "remaining",
                 "request_ids")

    def __init__(self, request_ids: list[int], controllers: list, emitted: np.ndarray,
                 prompt: list[int], output: list[int]) -> None:
        self.request_ids = request_ids
        self.ids = ids = np.array(request_ids, dtype=np.int64)
        self.controllers = controllers
        self.decide = [c.decide for c in controllers]
        self.observe = [observer(c) for c in controllers]
        self.positions = emitted[ids]
        pos = self.positions.tolist()
        self.context = [prompt[i] + p for i, p in zip(request_ids, pos)]
        self.remaining = [output[i] - p for i, p in zip(request_ids, pos)]


class Round:
    """One round of a batch, filled step by step: its decisions, the (capped) draft lengths
    ``k``, drafted tokens (after the τ stop), accepted tokens, the drawn confidences and lossy
    accepts (None when not drawn), draft steps, and its cost. No ``__init__``: one is made per
    round, and the steps set its fields."""

    __slots__ = ("accepted", "confidences", "context_tokens", "decisions", "draft_s",
                 "draft_steps", "drafted", "drafting", "k", "k_array", "lossy", "max_k", "size",
                 "start_s", "verify_s", "verify_tokens")


class Replica:
    """One replica: its waiting queue, running set, KV use, batch view and round planner."""

    def __init__(self, index: int, shared: Shared, planner: Any = None) -> None:
        self.index = index
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.controllers: dict[int, Any] = {}
        self.kv_used = 0.0
        self.outstanding = 0
        self.wake: simpy.Event | None = None
        self.batch: BatchView | None = None
        self.planner = planner
        self.planner_needs_future = bool(getattr(planner, "needs_future", False))
        self.planner_needs_rates = bool(getattr(planner, "needs_rates", False))
        # read every round: own attributes rather than chains through ``shared``
        self.env, self.params, self.cluster = shared.env, shared.params, shared.cluster
        self.acc, self.ledger, self.counters = shared.acc, shared.ledger, shared.ledger.counters
        self.make_ctrl, self.tracer = shared.make_ctrl, shared.tracer
        self.needs_future = shared.needs_future
        self.confidences_to_controllers = shared.confidences_to_controllers
        self.caps_draft, self.max_draft = shared.params.caps_draft, shared.params.max_draft
        self.warmup_s = shared.params.warmup_s
        self.round_overhead_s = shared.params.round_overhead_s
        self.progress = shared.ledger.progress

    # -- arrivals and the process -------------------------------------------------------------
    def enqueue(self, i: int) -> None:
        """Request ``i`` joins the waiting queue (wakes the replica when idle)."""
        self.outstanding += 1
        self.waiting.append(i)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def serve(self):
        """The replica's SimPy process: admit and prefill, else a round, else sleep."""
        env = self.env
        while True:
            admitted = self.admit() if self.waiting else None
            if admitted:
                yield env.timeout(self.prefill_seconds(admitted))
                self.start(admitted, env.now)
            elif self.running:
                yield from self.run_round()
            else:
                self.wake = env.event()
                yield self.wake
                self.wake = None

    # -- admission and prefill ----------------------------------------------------------------
    def admit(self) -> list[int]:
        """Waiting requests admitted in FIFO order while the batch has room and their KV fits;
        one that can never fit is rejected (reported unfinished)."""
        waiting, kv_need, budget = self.waiting, self.ledger.kv_need, self.params.kv_budget_bytes
        room = self.params.max_batch - len(self.running)
        admitted: list[int] = []
        while waiting and len(admitted) < room:
            i = waiting[0]
            need = kv_need[i]
            if need > budget:
                waiting.popleft()
                self.ledger.rejected[i] = True
                self.outstanding -= 1
                continue
            if self.kv_used + need > budget:
                break
            waiting.popleft()
            self.kv_used += need
            admitted.append(i)
        return admitted

    def prefill_seconds(self, admitted: list[int]) -> float:
        """Duration of the prefill pass of ``admitted`` (target, and drafter when deployed)."""
        cl, cnt = self.cluster, self.counters
        count = len(admitted)
        tokens = int(self.ledger.reqs.prompt_tokens[admitted].sum())
        seconds = cl.prefill_t(count, tokens)
        busy = seconds * cl.tp
        cnt.bytes_moved += cl.roof_t.bytes_per_gpu(count, tokens, 0.0) * cl.tp
        if cl.use_drafter:
            drafter_s = cl.prefill_d(count, tokens)
            cnt.bytes_moved += cl.roof_d.bytes_per_gpu(count, tokens, 0.0) * cl.dtp
            busy += drafter_s * cl.dtp
            seconds = seconds + drafter_s if cl.colocated else max(seconds, drafter_s)
        cnt.gpu_busy_s += busy
        return seconds

    def start(self, admitted: list[int], t: float) -> None:
        """After prefill: first tokens out; requests of one token end, the others run."""
        self.flush()
        ledger, cnt, warmup_s = self.ledger, self.counters, self.params.warmup_s
        for i in admitted:
            ledger.first_token_s[i] = t
            ledger.emitted[i] = 1
            cnt.prefill_tokens += 1
            if t >= warmup_s:
                cnt.measured_tokens += 1
            if ledger.output[i] <= 1:
                self.finish(i, t)
            else:
                self.controllers[i] = self.make_ctrl()
                self.running.append(i)
        ledger.report_progress()

    def finish(self, i: int, t: float) -> None:
        self.ledger.finish(i, t)
        self.kv_used -= self.ledger.kv_need[i]
        self.outstanding -= 1
        self.controllers.pop(i, None)

    def flush(self) -> None:
        """Write the batch view's positions back and drop it (the running set changes)."""
        b = self.batch
        if b is not None:
            self.ledger.emitted[b.ids] = b.positions
            self.batch = None

    # -- a round ------------------------------------------------------------------------------
    def run_round(self):
        """One round of the running batch (one SimPy timeout)."""
        batch = self.batch
        if batch is None:
            ledger = self.ledger
            batch = self.batch = BatchView(list(self.running),
                                           [self.controllers[i] for i in self.running],
                                           ledger.emitted, ledger.prompt, ledger.output)
        rnd = Round()
        rnd.start_s, rnd.size = self.env.now, len(batch.request_ids)
        run_lengths = self.acc.run_lengths(batch.ids, batch.positions)
        self.decide(batch, rnd, run_lengths)
        if rnd.max_k > 0:
            self.draw_acceptance(batch, rnd, run_lengths)
        else:
            rnd.drafted, rnd.accepted = rnd.k, [0] * rnd.size
            rnd.confidences = rnd.lossy = None
            rnd.draft_steps = 0
        yield self.env.timeout(self.time_round(batch, rnd))
        self.settle(batch, rnd, self.env.now)

    def decide(self, batch: BatchView, rnd: Round, run_lengths: np.ndarray) -> None:
        """The round's decisions (the controllers', or the planner's) and the capped k."""
        now = rnd.start_s
        if self.needs_future:
            for c, future in zip(batch.controllers, run_lengths.tolist()):
                c.set_future(future)
        if self.planner is None:
            decisions = [f(now) for f in batch.decide]
        else:
            decisions = self.plan(batch, now, run_lengths)
        rnd.decisions = decisions
        k = [d.k for d in decisions]
        if self.caps_draft:
            last_useful = (self.ledger.reqs.output_tokens[batch.ids] - batch.positions - 1
                           if self.params.draft_within_length else None)
            k_array = cap_draft_lengths(np.array(k, dtype=np.int64), self.max_draft, last_useful)
            rnd.k_array, rnd.k, rnd.max_k = k_array, k_array.tolist(), int(k_array.max())
        else:
            rnd.k_array, rnd.k, rnd.max_k = None, k, max(k)

    def plan(self, batch: BatchView, now: float, run_lengths: np.ndarray) -> list:
        """The planner's decisions for the batch (told the run lengths / true rates first
        when it asks for them)."""
        planner = self.planner
        if self.planner_needs_future:
            planner.set_futures(run_lengths.tolist())
        if self.planner_needs_rates:
            planner.set_rates(self.acc.true_rates(batch.ids, batch.positions).tolist())
        size = len(batch.request_ids)
        decisions = planner.plan(now, batch.controllers,
                                 BatchContext(size, sum(batch.context), self.max_draft))
        if len(decisions) != size:
            raise ValueError(f"round planner returned {len(decisions)} decisions for a batch "
                             f"of {size}")
        return decisions

    def draw_acceptance(self, batch: BatchView, rnd: Round, run_lengths: np.ndarray) -> None:
        """Confidences, the τ stop, accepted tokens and threshold-mode lossy accepts
        (a round with some k > 0)."""
        acc, decisions, max_k = self.acc, rnd.decisions, rnd.max_k
        any_tau = any([d.tau for d in decisions])  # noqa: C419 - a list comp is faster here
        if any_tau or self.confidences_to_controllers:
            rnd.confidences = acc.confidences(batch.ids, batch.positions, run_lengths, max_k)
        else:
            acc.skip_confidences(rnd.size, max_k)
            rnd.confidences = None
        drafted = accepted = None  # numpy arrays, only when needed
        if any_tau:
            k = rnd.k_array if rnd.k_array is not None else np.array(rnd.k, dtype=np.int64)
            drafted, rnd.draft_steps = confidence_stop(
                rnd.confidences, np.array([d.tau for d in decisions]), k)
            accepted = np.minimum(drafted, run_lengths)
            rnd.drafted = drafted.tolist()
        else:
            rnd.draft_steps, rnd.drafted = max_k, rnd.k
        rnd.lossy = None
        if "threshold" in [d.mode for d in decisions]:
            if drafted is None:
                drafted = (rnd.k_array if rnd.k_array is not None
                           else np.array(rnd.k, dtype=np.int64))
                accepted = np.minimum(drafted, run_lengths)
            accepted, rnd.lossy = self.lossy_accepts(batch, decisions, accepted, drafted)
        if accepted is None:
            rnd.accepted = [x if x < y else y  # not min(): slower
                            for x, y in zip(run_lengths.tolist(), rnd.drafted)]
        else:
            rnd.accepted = accepted.tolist()

    def lossy_accepts(self, batch: BatchView, decisions: list, accepted: np.ndarray,
                      drafted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        threshold = np.array([d.mode == "threshold" for d in decisions])
        beta = np.array([d.beta for d in decisions])
        pass_probability = np.where(
            threshold, lossy_probability(beta, self.params.lossy_accept_max), 0.0)
        return resample_lossy(accepted, drafted, pass_probability, batch.ids, batch.positions,
                              self.acc.rng, self.acc.run_lengths)

    def time_round(self, batch: BatchView, rnd: Round) -> float:
        """The round's modelled seconds (draft phase, verify pass, fixed overhead); counts
        GPU time and bytes moved."""
        cl, cnt = self.cluster, self.counters
        size, steps = rnd.size, rnd.draft_steps
        context = rnd.context_tokens = sum(batch.context)
        drafting = rnd.drafting = size - rnd.k.count(0)
        draft_s = 0.0
        if steps:
            draft_context = float(context if drafting == size else
                                  sum([c for c, x in zip(batch.context, rnd.k) if x]))
            draft_s = steps * cl.lat_d.seconds(drafting, drafting, draft_context)
            cnt.bytes_moved += steps * cl.roof_d.bytes_per_gpu(drafting, drafting,
                                                               draft_context) * cl.dtp
        tokens = rnd.verify_tokens = sum(rnd.drafted) + size
        verify_s = cl.lat_t.seconds(size, tokens, float(context))
        cnt.bytes_moved += cl.roof_t.bytes_per_gpu(size, tokens, float(context)) * cl.tp
        cnt.gpu_busy_s += ((draft_s + verify_s) * cl.tp if cl.colocated
                           else (verify_s * cl.tp + draft_s * cl.dtp))
        rnd.draft_s, rnd.verify_s = draft_s, verify_s
        return draft_s + verify_s + self.round_overhead_s

    def settle(self, batch: BatchView, rnd: Round, end: float) -> None:
        """After the round's timeout: emit, count, observe, advance."""
        emitted = [x + 1 if x < y else y  # min(accepted + 1, remaining)
                   for x, y in zip(rnd.accepted, batch.remaining)]
        sentence_ends = self.acc.sentence_ends(batch.request_ids, batch.positions, emitted)
        ended, accepted, emitted_total = self.count(batch, rnd, emitted, end)
        if self.tracer is None:
            self.observe(batch, rnd, end, emitted, sentence_ends)
        else:
            self.observe_traced(batch, rnd, end, emitted, sentence_ends)
        if self.planner is not None:
            self.planner.observe_round(RoundStats(
                rnd.start_s, end, rnd.size, rnd.drafting, rnd.draft_steps, rnd.verify_tokens,
                rnd.context_tokens, rnd.draft_s, rnd.verify_s, accepted, emitted_total))
        self.advance(batch, emitted, ended, end)
        if self.progress is not None:
            self.progress(self.ledger.finished)

    def count(self, batch: BatchView, rnd: Round, emitted: list[int],
              end: float) -> tuple[bool, int, int]:
        """Adds the round to the counters; returns (some request may have emitted its last
        token, Σ accepted, Σ emitted)."""
        cnt, accepted, drafted = self.counters, rnd.accepted, rnd.drafted
        cnt.rounds += rnd.size
        accepted_total, emitted_total = sum(accepted), sum(emitted)
        cnt.accepted += accepted_total
        cnt.drafted += rnd.verify_tokens - rnd.size
        cnt.rejected_rounds += sum([x < y for x, y in zip(accepted, drafted)])
        ended = min(batch.remaining) <= rnd.max_k + 1
        # accepted tokens that were emitted: n, less the ones cut by the length limit
        cnt.accepted_emitted += accepted_total - (
            sum([x - y for x, y in zip(accepted, emitted) if x > y]) if ended else 0)
        cnt.round_tokens += emitted_total
        if end >= self.warmup_s:
            cnt.measured_tokens += emitted_total
        if rnd.lossy is not None:
            cnt.lossy += int(rnd.lossy.sum())
        return ended, accepted_total, emitted_total

    def observe(self, batch: BatchView, rnd: Round, end: float, emitted: list[int],
                sentence_ends: list) -> None:
        """Each controller's observation, through the bound observe_values(now_s, drafted,
        accepted, confidences, draft_s, verify_s, context, lossy, emitted, sentence_ends,
        batch_size, batch_tokens, batch_context_tokens)."""
        draft_s, verify_s, size = rnd.draft_s, rnd.verify_s, rnd.size
        tokens, context = rnd.verify_tokens, rnd.context_tokens
        lossy = rnd.lossy.tolist() if rnd.lossy is not None else repeat(0)
        if rnd.confidences is None:  # nothing drafted, or no controller reads confidences
            for f, ke, n, cx, lo, e, se in zip(batch.observe, rnd.drafted, rnd.accepted,
                                               batch.context, lossy, emitted, sentence_ends):
                f(end, ke, n, (), draft_s, verify_s, cx, lo, e, se, size, tokens, context)
        else:
            for f, ke, n, cf, cx, lo, e, se in zip(batch.observe, rnd.drafted, rnd.accepted,
                                                   rnd.confidences.tolist(), batch.context,
                                                   lossy, emitted, sentence_ends):
                f(end, ke, n, tuple(cf[:ke]) if ke else (), draft_s, verify_s, cx, lo, e, se,
                  size, tokens, context)

    def observe_traced(self, batch: BatchView, rnd: Round, end: float, emitted: list[int],
                       sentence_ends: list) -> None:
        """Each controller's Observation (``observe``), recorded with its state after it."""
        size, tracer = rnd.size, self.tracer
        confidences = (rnd.confidences.tolist() if rnd.confidences is not None
                       else [()] * size)
        lossy = rnd.lossy.tolist() if rnd.lossy is not None else [0] * size
        for j, c in enumerate(batch.controllers):
            drafted = rnd.drafted[j]
            obs = Observation(end, drafted, rnd.accepted[j],
                              tuple(confidences[j][:drafted]) if drafted else (), rnd.draft_s,
                              rnd.verify_s, batch.context[j], lossy[j], emitted[j],
                              sentence_ends[j], size, rnd.verify_tokens, rnd.context_tokens)
            c.observe(obs)
            tracer.record(batch.request_ids[j], rnd.decisions[j], obs, c.state())
        tracer.round_done(batch.ids)

    def advance(self, batch: BatchView, emitted: list[int], ended: bool, end: float) -> None:
        """Positions, contexts and remaining tokens move on; finished requests leave."""
        emitted_array = np.array(emitted, dtype=np.int64)
        batch.positions += emitted_array
        batch.context = [x + y for x, y in zip(batch.context, emitted)]
        batch.remaining = remaining = [x - y for x, y in zip(batch.remaining, emitted)]
        self.acc.advance(batch.ids, emitted_array)
        if ended and 0 in remaining:
            self.flush()
            for i, x in zip(batch.request_ids, remaining):
                if not x:
                    self.finish(i, end)
            self.running = [i for i, x in zip(batch.request_ids, remaining) if x]
