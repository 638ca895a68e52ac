"""The round executor of a :class:`~sim.replica.Replica` (the order of a round:
:mod:`sim.replica`): the batch view it reads, the round it fills, and the steps: decide, draw
acceptance, time, then settle (count, observe, advance)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from control.batch import BatchContext, RoundStats
from control.types import Observation
from sim.acceptance import AcceptanceModel, lossy_probability
from sim.cluster import Cluster
from sim.drafting import cap_draft_lengths, confidence_stop, resample_lossy
from sim.latency import causal_pairs
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


def per_row_confidences(rnd: Any) -> list[tuple[float, ...]]:
    """Each row's drafter confidences of the tokens it drafted (a round's confidences are
    padded to its longest draft)."""
    return [tuple(cf[:ke]) if ke else () for cf, ke in zip(rnd.confidences.tolist(), rnd.drafted)]


class BatchView:
    """The running set as the round loop reads it, kept between rounds until the set changes:
    request ids (list and numpy), controllers and their bound ``decide`` and observe methods,
    positions (numpy; authoritative while the view lives, written back to the ledger by
    :meth:`Replica.flush`), context lengths and remaining tokens (lists); under paged KV the
    KV tokens each row holds (``cap``, authoritative while the view lives) and its prompt +
    output (``total``); the tokens each row's drafter has not seen (``behind``, authoritative
    while the view lives)."""

    __slots__ = (
        "behind",
        "cap",
        "context",
        "controllers",
        "decide",
        "ids",
        "lagging",
        "observe",
        "positions",
        "remaining",
        "request_ids",
        "total",
    )
    cap: list[int]  # empty unless paged
    total: list[int]  # empty unless paged
    behind: list[int]  # tokens each row's drafter has not seen (see Replica.catch_up)
    lagging: bool  # some row's drafter is behind

    def __init__(
        self,
        request_ids: list[int],
        controllers: list,
        emitted: np.ndarray,
        prompt: list[int],
        output: list[int],
        kv_cap: dict[int, int] | None = None,
        total: list[int] | None = None,
        behind: dict[int, int] | None = None,
    ) -> None:
        self.request_ids = request_ids
        self.ids = ids = np.array(request_ids, dtype=np.int64)
        self.controllers = controllers
        self.decide = [c.decide for c in controllers]
        self.observe = [observer(c) for c in controllers]
        self.positions = emitted[ids]
        pos = self.positions.tolist()
        self.context = [prompt[i] + p for i, p in zip(request_ids, pos)]
        self.remaining = [output[i] - p for i, p in zip(request_ids, pos)]
        if kv_cap is not None and total is not None:
            self.cap = [kv_cap[i] for i in request_ids]
            self.total = [total[i] for i in request_ids]
        else:
            self.cap, self.total = [], []
        self.behind = [behind.get(i, 0) for i in request_ids] if behind else [0] * len(pos)
        self.lagging = any(self.behind)


class Round:
    """One round of a batch, filled step by step: its decisions, the (capped) draft lengths
    ``k``, drafted tokens (after the τ stop), accepted tokens, the drawn confidences and lossy
    accepts (None when not drawn), draft steps, and its cost. No ``__init__``: one is made per
    round, and the steps set its fields."""

    __slots__ = (
        "accepted",
        "catchup_tokens",
        "confidences",
        "context_tokens",
        "decisions",
        "draft_s",
        "draft_steps",
        "drafted",
        "drafting",
        "k",
        "k_array",
        "lossy",
        "max_k",
        "prefill_tokens",
        "size",
        "start_s",
        "verify_s",
        "verify_tokens",
    )
    accepted: list[int]
    catchup_tokens: int
    confidences: np.ndarray | None
    context_tokens: int
    decisions: list[Any]
    draft_s: float
    draft_steps: int
    drafted: list[int]
    drafting: int
    k: list[int]
    k_array: np.ndarray | None
    lossy: np.ndarray | None
    max_k: int
    prefill_tokens: int
    size: int
    start_s: float
    verify_s: float
    verify_tokens: int


class RoundExecutor:
    """The rounds of a replica's running batch (a base of :class:`~sim.replica.Replica`, whose
    ``__init__`` sets the state below)."""

    env: simpy.Environment
    params: EngineParams
    cluster: Cluster
    acc: AcceptanceModel
    ledger: Ledger
    counters: Any
    tracer: RoundTrace | None
    planner: Any
    planner_needs_future: bool
    planner_needs_rates: bool
    needs_future: bool
    confidences_to_controllers: bool
    caps_draft: bool
    draft_cap: int | None
    max_draft: int | None
    warmup_s: float
    round_overhead_s: float
    progress: Callable[[int], None] | None
    waiting: Any
    running: list[int]
    paged: bool
    rows_short: bool
    catches_up: bool

    if TYPE_CHECKING:  # the replica's, the KV memory's and the prefill scheduler's

        def view(self) -> BatchView: ...

        def flush(self) -> None: ...

        def finish(self, i: int, t: float) -> None: ...

        def ensure_rows(self) -> None: ...

        def grow_rows(self, batch: BatchView, rnd: Round) -> None: ...

        def chunk_stats(self, chunks: list[tuple[int, int, int]]) -> tuple[int, int, int, int]: ...

        def prefill_pressure(self) -> tuple[int, int | None]: ...

        def waiting_since(self) -> float | None: ...

    def begin_round(self) -> tuple[BatchView, Round]:
        """The running batch's round up to its timing: decisions, capped k, acceptance."""
        if self.rows_short:
            self.ensure_rows()
        batch = self.view()
        rnd = Round()
        rnd.start_s, rnd.size = self.env.now, len(batch.request_ids)
        run_lengths = self.acc.run_lengths(batch.ids, batch.positions)
        self.decide(batch, rnd, run_lengths)
        if self.paged:
            self.grow_rows(batch, rnd)
        if rnd.max_k > 0:
            self.draw_acceptance(batch, rnd, run_lengths)
        else:
            rnd.drafted, rnd.accepted = rnd.k, [0] * rnd.size
            rnd.confidences = rnd.lossy = None
            rnd.draft_steps = 0
        return batch, rnd

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
            last_useful = (
                self.ledger.reqs.output_tokens[batch.ids] - batch.positions - 1
                if self.params.draft_within_length
                else None
            )
            k_array = cap_draft_lengths(np.array(k, dtype=np.int64), self.draft_cap, last_useful)
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
        decisions = planner.plan(
            now,
            batch.controllers,
            BatchContext(
                size,
                sum(batch.context),
                self.max_draft,
                *self.prefill_pressure(),
                self.waiting_since(),
                self.cluster.block_size > 0,
            ),
        )
        if len(decisions) != size:
            raise ValueError(
                f"round planner returned {len(decisions)} decisions for a batch of {size}"
            )
        return decisions

    def draw_acceptance(self, batch: BatchView, rnd: Round, run_lengths: np.ndarray) -> None:
        """Confidences, the τ stop, accepted tokens and threshold-mode lossy accepts
        (a round with some k > 0)."""
        acc, decisions, max_k = self.acc, rnd.decisions, rnd.max_k
        any_tau = any([d.stops for d in decisions])  # noqa: C419 - τ or survival stops
        if any_tau or self.confidences_to_controllers or acc.draws_head:
            rnd.confidences = acc.confidences(batch.ids, batch.positions, run_lengths, max_k)
        else:
            acc.skip_confidences(rnd.size, max_k)
            rnd.confidences = None
        drafted = accepted = None  # numpy arrays, only when needed
        if any_tau:
            assert rnd.confidences is not None
            k = rnd.k_array if rnd.k_array is not None else np.array(rnd.k, dtype=np.int64)
            drafted, rnd.draft_steps = confidence_stop(
                rnd.confidences,
                np.array([d.tau for d in decisions]),
                k,
                np.array([d.survival for d in decisions]),
            )
            accepted = np.minimum(drafted, run_lengths)
            rnd.drafted = drafted.tolist()
        else:
            rnd.draft_steps, rnd.drafted = max_k, rnd.k
        if rnd.draft_steps and self.cluster.block_size:
            rnd.draft_steps = 1  # a block drafter (sim.block): one forward whatever k <= B
        rnd.lossy = None
        if "threshold" in [d.mode for d in decisions]:
            if drafted is None:
                drafted = (
                    rnd.k_array if rnd.k_array is not None else np.array(rnd.k, dtype=np.int64)
                )
                accepted = np.minimum(drafted, run_lengths)
            assert accepted is not None
            accepted, rnd.lossy = self.lossy_accepts(batch, decisions, accepted, drafted)
        if accepted is None:
            rnd.accepted = [
                x if x < y else y  # not min(): slower
                for x, y in zip(run_lengths.tolist(), rnd.drafted)
            ]
        else:
            rnd.accepted = accepted.tolist()

    def lossy_accepts(
        self, batch: BatchView, decisions: list, accepted: np.ndarray, drafted: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        threshold = np.array([d.mode == "threshold" for d in decisions])
        beta = np.array([d.beta for d in decisions])
        pass_probability = np.where(
            threshold, lossy_probability(beta, self.params.lossy_accept_max), 0.0
        )
        return resample_lossy(
            accepted,
            drafted,
            pass_probability,
            batch.ids,
            batch.positions,
            self.acc.rng,
            self.acc.run_lengths,
        )

    def time_round(
        self, batch: BatchView, rnd: Round, chunks: list[tuple[int, int, int]] | None = None
    ) -> float:
        """The round's modelled seconds (draft phase, verify pass with the step's prompt
        chunks, fixed overhead); counts GPU time and bytes moved."""
        cl, cnt = self.cluster, self.counters
        size = rnd.size
        context = rnd.context_tokens = sum(batch.context)
        rnd.drafting = size - rnd.k.count(0)
        tokens = rnd.verify_tokens = sum(rnd.drafted) + size
        rnd.prefill_tokens = rnd.catchup_tokens = 0
        stats = None
        if chunks:
            stats = self.chunk_stats(chunks)
            rnd.prefill_tokens = stats[1]
        draft_s = self.draft_seconds(batch, rnd, stats)
        if stats is not None:
            count, ctok, pairs, prefix = stats
            verify_s = cl.lat_t.pass_seconds(
                size, tokens, float(context), count, ctok, pairs, prefix
            )
            cnt.bytes_moved += (
                cl.roof_t.bytes_per_gpu(size, tokens, float(context + prefix)) * cl.tp
            )
        else:
            verify_s = cl.lat_t.seconds(size, tokens, float(context))
            cnt.bytes_moved += cl.roof_t.bytes_per_gpu(size, tokens, float(context)) * cl.tp
        cnt.gpu_busy_s += (
            (draft_s + verify_s) * cl.tp if cl.colocated else (verify_s * cl.tp + draft_s * cl.dtp)
        )
        rnd.draft_s, rnd.verify_s = draft_s, verify_s
        return draft_s + verify_s + self.round_overhead_s

    def draft_seconds(
        self, batch: BatchView, rnd: Round, stats: tuple[int, int, int, int] | None
    ) -> float:
        """The draft phase: ``draft_steps`` drafter steps over the drafting rows (a measured
        table's draft-phase rows, :meth:`Cluster.draft_phase_s`); the first also carries the
        drafter's share of the step's prompt chunks (``stats``) and the drafting rows' catch-up
        (:meth:`catch_up`). Without drafting, the prompt chunks' drafter pass."""
        cl, cnt = self.cluster, self.counters
        steps, size, drafting = rnd.draft_steps, rnd.size, rnd.drafting
        if self.catches_up and (batch.lagging or drafting < size):
            stats = self.catch_up(batch, rnd, stats)
        if not steps:
            if stats is None or not cl.use_drafter:
                return 0.0
            count, ctok, pairs, prefix = stats
            cnt.bytes_moved += cl.roof_d.bytes_per_gpu(count, ctok, prefix) * cl.dtp
            return cl.lat_d.pass_seconds(0, 0, 0.0, count, ctok, pairs, prefix)
        draft_context = float(
            rnd.context_tokens
            if drafting == size
            else sum([c for c, x in zip(batch.context, rnd.k) if x])
        )
        if stats is None:
            cnt.bytes_moved += (
                steps * cl.roof_d.bytes_per_gpu(drafting, drafting, draft_context) * cl.dtp
            )
            return cl.draft_phase_s(drafting, steps, draft_context, rnd.max_k)
        count, ctok, pairs, prefix = stats
        cnt.bytes_moved += (
            cl.roof_d.bytes_per_gpu(drafting, drafting, draft_context + prefix)
            + (steps - 1) * cl.roof_d.bytes_per_gpu(drafting, drafting, draft_context)
        ) * cl.dtp
        if cl.phase is not None:  # the measured phase, plus what the chunks add to its first
            # step: the drafter's rows of `count + ctok` tokens less those of `count`
            feed = cl.lat_d.seconds(count, ctok + count, prefix) - cl.lat_d.seconds(
                count, count, prefix
            )
            return cl.draft_phase_s(drafting, steps, draft_context, rnd.max_k) + max(feed, 0.0)
        return cl.lat_d.pass_seconds(
            drafting, drafting, draft_context, count, ctok, pairs, prefix
        ) + (steps - 1) * cl.lat_d.seconds(drafting, drafting, draft_context)

    def catch_up(
        self, batch: BatchView, rnd: Round, stats: tuple[int, int, int, int] | None
    ) -> tuple[int, int, int, int] | None:
        """Drafter catch-up: a row that drafted nothing in a round (k = 0) fed its token to the
        target alone, so the drafter falls one token behind; the next round it drafts in, its
        drafter first prefills the tokens it missed (a chunk of ``behind`` tokens after the
        ``context - 1 - behind`` it holds), batched into the first drafter step with the
        prompt chunks. Returns the step's chunk stats with the catch-up added; counts
        ``drafter_catchup_tokens``; moves each row's ``behind`` past this round."""
        count = tokens = pairs = prefix = 0
        behind = []
        for b, k, c in zip(batch.behind, rnd.k, batch.context):
            if not k:
                behind.append(b + 1)
                continue
            behind.append(0)
            if b:
                p = c - 1 - b
                count += 1
                tokens += b
                pairs += causal_pairs(b, p)
                prefix += p
        batch.behind, batch.lagging = behind, rnd.drafting < rnd.size
        if not count:
            return stats
        self.counters.drafter_catchup_tokens += tokens
        rnd.catchup_tokens = tokens
        if stats is not None:
            count, tokens = count + stats[0], tokens + stats[1]
            pairs, prefix = pairs + stats[2], prefix + stats[3]
        return count, tokens, pairs, prefix

    def settle(self, batch: BatchView, rnd: Round, end: float) -> None:
        """After the round's timeout: emit, count, observe, advance."""
        emitted = [
            x + 1 if x < y else y  # min(accepted + 1, remaining)
            for x, y in zip(rnd.accepted, batch.remaining)
        ]
        sentence_ends = self.acc.sentence_ends(batch.request_ids, batch.positions, emitted)
        ended, accepted, emitted_total = self.count(batch, rnd, emitted, end)
        if self.tracer is None:
            self.observe(batch, rnd, end, emitted, sentence_ends)
        else:
            self.observe_traced(batch, rnd, end, emitted, sentence_ends)
        if self.planner is not None:
            self.planner.observe_round(
                RoundStats(
                    rnd.start_s,
                    end,
                    rnd.size,
                    rnd.drafting,
                    rnd.draft_steps,
                    rnd.verify_tokens,
                    rnd.context_tokens,
                    rnd.draft_s,
                    rnd.verify_s,
                    accepted,
                    emitted_total,
                    rnd.prefill_tokens,
                    rnd.catchup_tokens,
                )
            )
        self.advance(batch, emitted, ended, end)
        if self.progress is not None:
            self.progress(self.ledger.finished)

    def count(
        self, batch: BatchView, rnd: Round, emitted: list[int], end: float
    ) -> tuple[bool, int, int]:
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
            sum([x - y for x, y in zip(accepted, emitted) if x > y]) if ended else 0
        )
        cnt.round_tokens += emitted_total
        if end >= self.warmup_s:
            cnt.measured_tokens += emitted_total
        if rnd.lossy is not None:
            cnt.lossy += int(rnd.lossy.sum())
        return ended, accepted_total, emitted_total

    def observe(
        self, batch: BatchView, rnd: Round, end: float, emitted: list[int], sentence_ends: list
    ) -> None:
        """Each controller's observation, through the bound observe_values(now_s, drafted,
        accepted, confidences, draft_s, verify_s, context, lossy, emitted, sentence_ends,
        batch_size, batch_tokens, batch_context_tokens)."""
        draft_s, verify_s, size = rnd.draft_s, rnd.verify_s, rnd.size
        tokens, context = rnd.verify_tokens, rnd.context_tokens
        planner = self.planner
        if planner is not None:  # the planner hands each member its observation
            planner.observe_members(
                batch.controllers,
                end,
                rnd.drafted,
                rnd.accepted,
                None if rnd.confidences is None else per_row_confidences(rnd),
                draft_s,
                verify_s,
                batch.context,
                rnd.lossy.tolist() if rnd.lossy is not None else [0] * size,
                emitted,
                sentence_ends,
                tokens,
                context,
            )
            return
        lossy = rnd.lossy.tolist() if rnd.lossy is not None else repeat(0)
        # (no confidences: nothing drafted, or no controller reads them)
        conf = repeat(()) if rnd.confidences is None else per_row_confidences(rnd)
        for f, ke, n, cf, cx, lo, e, se in zip(
            batch.observe, rnd.drafted, rnd.accepted, conf, batch.context, lossy, emitted,
            sentence_ends,
        ):  # fmt: skip
            f(end, ke, n, cf, draft_s, verify_s, cx, lo, e, se, size, tokens, context)

    def observe_traced(
        self, batch: BatchView, rnd: Round, end: float, emitted: list[int], sentence_ends: list
    ) -> None:
        """Each controller's Observation (``observe``), recorded with its state after it."""
        size, tracer = rnd.size, self.tracer
        assert tracer is not None
        confidences = per_row_confidences(rnd) if rnd.confidences is not None else [()] * size
        lossy = rnd.lossy.tolist() if rnd.lossy is not None else [0] * size
        for j, c in enumerate(batch.controllers):
            drafted = rnd.drafted[j]
            obs = Observation(
                end,
                drafted,
                rnd.accepted[j],
                confidences[j],
                rnd.draft_s,
                rnd.verify_s,
                batch.context[j],
                lossy[j],
                emitted[j],
                sentence_ends[j],
                size,
                rnd.verify_tokens,
                rnd.context_tokens,
            )
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
