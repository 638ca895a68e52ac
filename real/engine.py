"""The speculative-decoding engine: continuous batching, driven by any ``control`` controller.

Many sequences are in flight at once, each in a slot of a static, slotted KV cache
(``slots × (max_len + k_max + 1)`` positions, per-row positions; rollback is not advancing a
row's position). Each round, for all running sequences together:

1. ``decisions = plan_round(planner, controllers, now_s, BatchContext(B, Σ context, k_max))``
   (each sequence's own ``decide`` when there is no round planner);
2. the drafter proposes up to k_i tokens per row (model drafters: one packed forward per draft
   step for every row still drafting; lookup drafters per row; stopping below τ_i);
3. ONE target forward verifies the whole batch's ragged drafts ``[last token + drafted]``, packed
   (no padding: see ``real.models``);
4. per row, acceptance (strict greedy, strict speculative sampling or the β threshold, per the
   row's decision) commits the longest valid prefix plus one target token;
5. each sequence's controller gets its ``Observation`` (measured seconds after device sync, and
   the round's batch context), a ``RoundRecord`` is kept, the planner gets ``RoundStats``;
   finished sequences free their slot.

Waiting requests are admitted at round boundaries (:meth:`Engine.admit`): one packed prefill
forward for all of them. ``stream`` / ``generate`` (one prompt) are the batch-1 case of the same
core; :meth:`Engine.run_batch` serves a list of requests with continuous batching and
``real.serve`` replays arrivals in wall-clock time. Under sampling each sequence draws from its
own generator (seeded from the request), so its output never depends on its batch-mates.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from control.batch import BatchContext, RoundStats, plan_round
from control.errors import DSparkError
from control.types import Observation, RoundRecord, draft_stop, observation_values
from real.drafter_protocol import CachedDrafter, Drafter
from real.engine_types import EngineConfig, Generation, Request, Sequence, sync
from real.models import Segments
from real.reference import TargetReference
from real.sampling import verify_greedy, verify_sampling, verify_threshold


def draft_steps(ks, drafted, block: int = 0) -> int:
    """Drafter forward steps a round ran: a row asked for ``k > 0`` tokens that drafted ``n``
    ran ``n`` steps when it drafted them all and ``n + 1`` when a τ stop ended it (the step
    that produced the stopping confidence still ran); the batch runs as many as its longest
    row. The simulator counts them the same way (``sim.drafting.confidence_stop``). A block
    drafter (``block`` = its B) runs one forward when any row drafts."""
    if block:
        return int(any(ks))
    return max((n + (n < k) for k, n in zip(ks, drafted) if k), default=0)


_NO_PROPOSAL = (0, [], None)


def survival_cut(proposal, survival: float):
    """A proposal ``(count, confidences, q rows)`` cut at its survival stop
    (:func:`control.types.draft_stop`): whether position j is kept reads the confidences of
    positions ≤ j, each known before its token was drawn, so verification stays exact."""
    n, conf, q = proposal
    if survival <= 0.0 or not n:
        return proposal
    m = draft_stop(conf, n, 0.0, survival)
    return proposal if m == n else (m, conf[:m], None if q is None else q[:m])


class Engine(TargetReference):
    """Speculative decoding with ``target`` (a ``real.models`` model) and a drafter object,
    ``cfg.slots`` sequences at a time; target-only decoding, the baseline, is
    :class:`~real.reference.TargetReference`'s."""

    def __init__(
        self,
        target: torch.nn.Module,
        drafter,
        config: EngineConfig | None = None,
        tokenizer=None,
        eot_id: int | None = None,
        sentence_end_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.cfg = c = config or EngineConfig()
        self.target, self.tokenizer = target, tokenizer
        self.device = c.device
        self.dtype = next(target.parameters()).dtype
        self.length = c.max_len + c.k_max + 1
        self.slots = c.slots
        self.state = target.new_state(self.length, self.dtype, self.device, self.slots)
        self.seq = torch.zeros(self.slots, self.length, dtype=torch.long, device=self.device)
        self.gen = torch.Generator(device=self.device)  # the target-only references' generator
        self.gen.manual_seed(c.seed)
        self.eot_id = eot_id
        self.sentence_end_ids = sentence_end_ids
        self._free = list(range(self.slots))
        self.running: list[Sequence] = []
        self.drafter = drafter
        #: the batch-1 path's round planners, one per (controller class, config), kept for the
        #: engine's life as a simulated replica keeps its own (``planner_for``)
        self._planners: dict = {}
        self._cost_rows: list | None = None  # the start-up cost profile (``seed_planner``)
        self._seeded: dict[int, object] = {}
        #: RoundStats of every round (plus the prefill passes in ``prefills``) when not None
        self.round_log: list[RoundStats] | None = None
        self.prefills: list[dict] = []
        #: tensor parallelism (``real.tp``): maps this rank's time readings to rank 0's, so that
        #: every rank's controllers see the same times; None on one process
        self.agree = None

    # ------------------------------------------------------------------ drafter
    @property
    def drafter(self) -> Drafter | None:
        return self._drafter

    @drafter.setter
    def drafter(self, d: Drafter | None) -> None:
        """Any drafter; a cached (model) drafter's cache is (re)built for the engine's slots."""
        if isinstance(d, CachedDrafter):
            if d.state["length"] < self.length:
                raise DSparkError(
                    f"drafter cache holds {d.state['length']} positions, engine needs {self.length}"
                )
            if d.state.get("slots", 1) != self.slots:
                d.allocate(self.slots)
        if d is not None and self.running:
            raise DSparkError("the drafter cannot change while sequences are running")
        self._drafter = d
        # a drafter that refits its confidences on the rounds verified (real.block_recalibration)
        self._learns = getattr(d, "recalibration", None) is not None

    # ------------------------------------------------------------------ requests and slots
    def check_request(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """The prompt as a list of ints; a request that cannot fit a slot is a one-line error."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise DSparkError("empty prompt: at least one token is needed")
        if max_new_tokens < 0:
            raise DSparkError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(ids) + max_new_tokens > self.cfg.max_len:
            raise DSparkError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) "
                f"exceeds max_len {self.cfg.max_len}"
            )
        return ids

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def _release(self, s: Sequence) -> None:
        if s.slot >= 0:
            self._free.append(s.slot)
            self._free.sort()
            s.slot = -1

    def _gen_for(self, req: Request):
        if self.cfg.sampling.greedy:
            return None  # greedy verification and threshold-greedy never draw
        g = torch.Generator(device=self.device)
        seed = self.cfg.seed + req.request_id if req.seed is None else req.seed
        g.manual_seed(int(seed) % (2**63))
        return g

    @torch.inference_mode()
    def admit(self, requests: list[Request], origin: float | None = None) -> list[Sequence]:
        """Take ``requests`` into free slots and prefill them (ONE packed target forward over
        every new prompt but its last token, which the first round feeds). Requests that do not
        fit a slot raise (``check_request``); a request with ``max_new_tokens == 0`` finishes at
        once. Returns the new sequences (running ones appended to ``self.running``)."""
        if len(requests) > len(self._free):
            raise DSparkError(f"{len(requests)} requests but {len(self._free)} free slots")
        origin = time.perf_counter() if origin is None else origin
        t0 = time.perf_counter()
        new: list[Sequence] = []
        for r in requests:
            ids = self.check_request(r.prompt, r.max_new_tokens)
            slot = self._free.pop(0)
            s = Sequence(r, slot, len(ids) + r.max_new_tokens, self._gen_for(r))
            self.seq[slot, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=self.device)
            if self._drafter is not None:
                self._drafter.reset_slot(slot)
            new.append(s)
        pre = [s for s in new if s.L > 1]
        self.prefill_rows([s.slot for s in pre], [0] * len(pre), [s.L - 1 for s in pre])
        t1 = time.perf_counter()
        if new:
            self.prefills.append(
                {
                    "start_s": t0 - origin,
                    "end_s": t1 - origin,
                    "requests": len(new),
                    "prompt_tokens": sum(s.L for s in new),
                    "prefill_tokens": sum(s.L - 1 for s in pre),
                }
            )
        for s in new:
            s.admit_s = t1 - origin
            if s.L >= s.end:
                s.done = True
                s.finish_s = s.first_token_s = t1 - origin
                self._release(s)
            else:
                self.running.append(s)
        return new

    def prefill_rows(self, slots: list[int], starts: list[int], counts: list[int]) -> None:
        """The target caches ``seq[slot, start:start+count]`` of every row: ONE packed forward,
        no logits (admission; the profiler times it as it is)."""
        if slots:
            segs = Segments(slots, starts, counts, self.device)
            self.target.step_packed(
                self.seq[segs.slot_idx, segs.pos_idx], segs, self.state, logits=False
            )
            self._hand_hidden(segs)
        sync(self.device)

    def _hand_hidden(self, segs: Segments) -> None:
        """Give a feature drafter the target's hidden states of the pass just run: the last
        layer's, or the outputs of the (1-based) ``hidden_layers`` it names, concatenated."""
        d = self._drafter
        if d is not None and getattr(d, "wants_hidden", False):
            layers = getattr(d, "hidden_layers", None)
            h = self.state["hidden"]
            if layers is not None:
                h = torch.cat([self.state["hidden_layers"][i - 1] for i in layers], dim=-1)
            d.observe_hidden(segs, h)

    def abort(self) -> None:
        """Drop every running sequence (frees their slots)."""
        for s in self.running:
            self._release(s)
        self.running = []

    # ------------------------------------------------------------------ one round
    @torch.inference_mode()
    def round(self, origin: float, planner=None) -> list[tuple[Sequence, list[int]]]:
        """One round for every running sequence; ``(sequence, tokens it committed)`` per row.
        Times (``now_s``, first token, finish) are seconds since ``origin`` (perf_counter)."""
        run = self.running
        if not run:
            return []
        B = len(run)
        slots = [s.slot for s in run]
        Ls = [s.L for s in run]
        ctx_sum = sum(Ls)
        now = time.perf_counter() - origin
        if self.agree is not None:
            (now,) = self.agree([now])
        decs, ks = self._plan_round(run, planner, now, ctx_sum)
        drafter = self._drafter
        catchup = self._catchup_tokens(slots, Ls, ks)
        t0 = time.perf_counter()
        props = self.draft(slots, Ls, ks, [d.tau for d in decs], [s.gen for s in run])
        full = [p[0] for p in props]  # before the survival stop: what the drafter ran
        if any(d.survival for d in decs):
            props = [survival_cut(p, d.survival) for p, d in zip(props, decs)]
        t1 = time.perf_counter()
        drafted = [p[0] for p in props]
        segs, ns, nxts, lossys, idl = self.verify(
            slots, Ls, drafted, decs, props, [s.gen for s in run]
        )
        t2 = time.perf_counter()
        if drafter is not None and any(ks):
            # every row whose drafter ran, a τ stop before its first token included: the
            # committed tokens it fed stay valid (else the next round feeds them again)
            drafter.accept_batch(slots, Ls, drafted, ns)
            if self._learns:  # the drafter refits its confidences on what was verified
                drafter.learn(slots, drafted, ns)
        draft_s, verify_s, end_s = t1 - t0, t2 - t1, t2 - origin
        if self.agree is not None:
            draft_s, verify_s, end_s = self.agree([draft_s, verify_s, end_s])
        verify_tokens = segs.n
        events, emitted_sum = self._commit_rows(
            planner,
            run,
            decs,
            props,
            drafted,
            segs,
            ns,
            nxts,
            lossys,
            idl,
            (end_s, draft_s, verify_s, verify_tokens, ctx_sum),
        )
        self._retire_done(run)
        stats = None
        if planner is not None or self.round_log is not None:
            stats_end = time.perf_counter() - origin
            if self.agree is not None:
                (stats_end,) = self.agree([stats_end])
            stats = RoundStats(
                start_s=now,
                end_s=stats_end,
                batch_size=B,
                drafting=sum(1 for k in ks if k),
                draft_steps=draft_steps(ks, full, getattr(drafter, "block_size", 0)),
                verify_tokens=verify_tokens,
                context_tokens=ctx_sum,
                draft_s=draft_s,
                verify_s=verify_s,
                accepted=sum(ns),
                emitted=emitted_sum,
                catchup_tokens=catchup,
            )
        if planner is not None:
            planner.observe_round(stats)
        if self.round_log is not None:
            self.round_log.append(stats)
        return events

    def _plan_round(self, run, planner, now: float, ctx_sum: int):
        """The round's per-row decisions from the planner and the draft lengths they allow."""
        c = self.cfg
        B = len(run)
        block = getattr(self._drafter, "block_size", 0) > 0  # one draft forward per round
        ctx = BatchContext(B, ctx_sum, c.k_max, block_draft=block)
        decs = plan_round(planner, [s.ctrl for s in run], now, ctx)
        if len(decs) != B:
            raise DSparkError(f"the round planner returned {len(decs)} decisions for {B} rows")
        ks = (
            [0] * B
            if self._drafter is None
            else [max(0, min(d.k, c.k_max, s.end - s.L - 1)) for d, s in zip(decs, run)]
        )
        return decs, ks

    def _commit_rows(self, planner, run, decs, props, drafted, segs, ns, nxts, lossys, idl, timing):
        """Commit every row's accepted tokens (cut at end-of-text), feed its controller the
        round's observation (through the planner when there is one) and record it. Returns
        (events, tokens emitted in all)."""
        end_s, draft_s, verify_s, verify_tokens, ctx_sum = timing
        B = len(run)
        eot = self.eot_id if self.cfg.stop_at_eot else None
        events: list[tuple[Sequence, list[int]]] = []
        emitted_sum = 0
        through_planner = planner is not None
        observations = []
        for b, s in enumerate(run):
            o, n = segs.offsets[b], ns[b]
            out = idl[o + 1 : o + 1 + n] + [nxts[b]]
            if eot is not None and eot in out:
                out = out[: out.index(eot) + 1]
                s.end = s.L + len(out)
            ends = tuple(i for i, t in enumerate(out) if t in self.sentence_end_ids)
            obs = Observation(
                end_s,
                drafted[b],
                n,
                tuple(props[b][1]),
                draft_s,
                verify_s,
                s.L,
                lossys[b],
                len(out),
                ends,
                B,
                verify_tokens,
                ctx_sum,
            )
            if through_planner:
                observations.append(obs)
            else:
                s.ctrl.observe(obs)
            if s.records is not None:
                s.records.append(
                    RoundRecord.from_round(s.req.request_id, s.rnd, decs[b], obs, s.name)
                )
            s.rnd += 1
            if not s.tokens:
                s.first_token_s = end_s
            s.tokens.extend(out)
            s.L += len(out)
            emitted_sum += len(out)
            if s.L >= s.end:
                s.done = True
                s.finish_s = end_s
            events.append((s, out))
        if through_planner:
            fields = list(zip(*[observation_values(o) for o in observations]))
            planner.observe_members(
                [s.ctrl for s in run], end_s, fields[1], fields[2], fields[3], draft_s,
                verify_s, fields[6], fields[7], fields[8], fields[9], verify_tokens, ctx_sum,
            )  # fmt: skip
        return events, emitted_sum

    def _retire_done(self, run) -> None:
        """Release the slots of the finished rows and drop them from ``running``."""
        if any(s.done for s in run):
            for s in run:
                if s.done:
                    self._release(s)
            self.running = [s for s in run if not s.done]

    def _catchup_tokens(self, slots, Ls, ks) -> int:
        """Tokens a cached drafter will feed beyond one per drafting row this round: those its
        row committed while drafting nothing (the planner's cost model prices them apart)."""
        d = self._drafter
        if not isinstance(d, CachedDrafter):
            return 0
        return sum(max(L - 1 - d.valid_of(s), 0) for s, L, k in zip(slots, Ls, ks) if k > 0)

    def draft(self, slots, Ls, ks, taus, gens) -> list:
        """The draft phase of a round: per row (count, confidences, q rows), device-synced."""
        if not any(ks):
            return [_NO_PROPOSAL] * len(slots)
        props = self._drafter.propose_batch(self.seq, slots, Ls, ks, taus, self.cfg.sampling, gens)
        sync(self.device)
        return props

    def verify(self, slots, Ls, drafted, decs, props, gens):
        """The verify phase of a round: ONE packed target forward over every row's
        ``[last token + drafted]``, per-row acceptance, the next token written, device-synced.
        Returns (segments, accepted n, next tokens, lossy counts, packed ids on the host)."""
        sp, dev, seq = self.cfg.sampling, self.device, self.seq
        B = len(slots)
        segs = Segments(slots, [L - 1 for L in Ls], [d + 1 for d in drafted], dev)
        ids = seq[segs.slot_idx, segs.pos_idx]
        logits = self.target.step_packed(ids, segs, self.state)
        self._hand_hidden(segs)
        if sp.greedy and all(d.mode == "strict" for d in decs):
            # the whole batch in one host transfer
            am, idl = torch.stack([logits.argmax(-1), ids]).tolist()
            ns, nxts, lossys = [], [], [0] * B
            for o, d in zip(segs.offsets, drafted):
                n = 0
                while n < d and am[o + n] == idl[o + 1 + n]:
                    n += 1
                ns.append(n)
                nxts.append(am[o + n])
        else:
            ns, nxts, lossys = [], [], []
            for b, (o, d, dec) in enumerate(zip(segs.offsets, drafted, decs)):
                lg, draft = logits[o : o + d + 1], ids[o + 1 : o + 1 + d]
                if dec.mode == "threshold":
                    n, nxt, lossy = verify_threshold(draft, lg, dec.beta, sp, gens[b])
                elif sp.greedy:
                    n, nxt, lossy = verify_greedy(draft, lg)
                else:
                    n, nxt, lossy = verify_sampling(
                        draft, props[b][2] if d else None, lg, sp, gens[b]
                    )
                ns.append(n)
                nxts.append(nxt)
                lossys.append(lossy)
            idl = ids.tolist()
        seq[
            segs.slot_idx.new_tensor(slots),
            segs.pos_idx.new_tensor([L + n for L, n in zip(Ls, ns)]),
        ] = torch.tensor(nxts, dtype=torch.long, device=dev)
        sync(dev)
        return segs, ns, nxts, lossys, idl

    # ------------------------------------------------------------------ many requests
    @torch.inference_mode()
    def run_batch(
        self, requests: list[Request], planner=None, on_round=None, max_running: int | None = None
    ) -> list[Sequence]:
        """Serve ``requests`` (all waiting from the start) with continuous batching: whenever
        fewer than ``max_running`` sequences (None: every slot) run at a round boundary, the
        next waiting requests (FIFO) are admitted and prefilled. A fresh state per controller is
        the caller's job. Returns the sequences in request order; ``on_round(events)`` is called
        after every round."""
        for r in requests:
            self.check_request(r.prompt, r.max_new_tokens)
        if self.running:
            raise DSparkError("run_batch needs an idle engine")
        cap = self.cfg.slots if max_running is None else max_running
        if not 1 <= cap <= self.cfg.slots:
            raise DSparkError(f"max_running = {cap} is out of range; allowed [1, {self.cfg.slots}]")
        self.seed_planner(planner)
        origin = time.perf_counter()
        waiting = list(requests)
        done: list[Sequence] = []
        try:
            while waiting or self.running:
                n = min(len(self._free), cap - len(self.running))
                if waiting and n > 0:
                    done += self.admit(waiting[:n], origin)
                    waiting = waiting[n:]
                ev = self.round(origin, planner)
                if on_round is not None:
                    on_round(ev)
        finally:
            self.abort()
        order = {id(r): i for i, r in enumerate(requests)}
        return sorted(done, key=lambda s: order[id(s.req)])

    # ------------------------------------------------------------------ one request
    def planner_for(self, controller):
        """The round planner that drives ``controller`` in ``stream``/``generate``: one per
        (controller class, config) for the engine's life, or None for a controller that decides
        alone. As in the simulator (one planner per replica for the whole run), what it learns —
        the hardware's round costs, the workload's pooled acceptance — outlives one request; a
        planner made per request would re-learn its costs from a few noisy rounds every time."""
        cfg = getattr(controller, "config", None)
        key = (type(controller), repr(cfg))
        if key not in self._planners:
            make = getattr(type(controller), "make_planner", None)
            p = make(cfg) if make is not None and cfg is not None else None
            # references that must be told the future (clairvoyant, rate oracle) are the
            # simulator's: here their sequences decide alone, as before
            hindsight = getattr(p, "needs_future", False) or getattr(p, "needs_rates", False)
            self._planners[key] = None if hindsight else p
        return self._planners[key]

    def seed_planner(self, planner) -> None:
        """Hand a planner that takes one (``seed_costs``) this engine's start-up cost profile
        (``real.profile.startup_cost_rows``, measured once per engine; its grid, and so its
        time, grows with the slots) as the prior of its cost fits; once per planner. The engine
        must be idle."""
        if (
            planner is None
            or not getattr(planner, "wants_costs_seed", False)
            or id(planner) in self._seeded
        ):
            return
        if self._cost_rows is None:
            from real.profile import startup_cost_rows

            self._cost_rows = startup_cost_rows(self)
        planner.seed_costs(self._cost_rows)
        self._seeded[id(planner)] = planner  # held: an id is never reused while seeded

    @torch.inference_mode()
    def stream(
        self,
        prompt_ids,
        max_new_tokens: int,
        controller,
        request_id: int = 0,
        records: list | None = None,
    ) -> Iterator[list[int]]:
        """Yield the tokens committed by each round (a list per round): the batch-1 case of the
        batched core (a fresh controller state, the sampling generator seeded with
        ``cfg.seed``, times from the end of the prefill)."""
        ids = self.check_request(prompt_ids, max_new_tokens)
        if self.running:
            raise DSparkError("stream/generate need an idle engine (sequences are running)")
        controller.reset()
        planner = self.planner_for(controller)
        self.seed_planner(planner)
        (s,) = self.admit(
            [Request(request_id, ids, max_new_tokens, controller, seed=self.cfg.seed)]
        )
        s.records = records
        origin = time.perf_counter()
        try:
            while self.running:
                for _, out in self.round(origin, planner):
                    yield out
        finally:
            self.abort()

    def generate(
        self, prompt_ids, max_new_tokens: int, controller, request_id: int = 0
    ) -> Generation:
        records: list[RoundRecord] = []
        self.seed_planner(self.planner_for(controller))  # a one-time start-up cost, untimed
        t0 = time.perf_counter()
        toks: list[int] = []
        for piece in self.stream(prompt_ids, max_new_tokens, controller, request_id, records):
            toks.extend(piece)
        g = Generation(toks, records, time.perf_counter() - t0)
        if self.tokenizer is not None:
            g.text = self.tokenizer.decode(toks)
        return g

    def stream_text(self, prompt_ids, max_new_tokens: int, controller) -> Iterator[str]:
        """Text pieces as they become printable (byte-level BPE may split a character)."""
        toks: list[int] = []
        shown = ""
        for piece in self.stream(prompt_ids, max_new_tokens, controller):
            toks.extend(piece)
            text = self.tokenizer.decode(toks)
            if text.endswith("\ufffd"):
                continue
            yield text[len(shown) :]
            shown = text
        text = self.tokenizer.decode(toks)
        if len(text) > len(shown):
            yield text[len(shown) :]
