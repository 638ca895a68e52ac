"""The serving loop: SimPy processes per replica plus one arrival process.

Per replica: admit waiting requests (FIFO) under ``max_batch`` and the KV-memory budget (a
request reserves KV for prompt + output tokens on admission), run one prefill pass for the newly
admitted (it emits their first token), then rounds. In a round every running sequence asks its
own controller for a Decision; acceptance is drawn for the whole batch with numpy; the draft
phase lasts the batch's largest draft-step count × one drafter step; one target pass verifies
Σ(k_i + 1) tokens; each controller gets its Observation with the modelled times; a request ends
when it has emitted its output length (the last round's emission is capped). One SimPy event per
round per replica, never one per token.

Speed: per replica the running set is kept as a batch view between rounds (the controllers' bound
``decide``/``observe``, positions, context lengths, remaining tokens) and rebuilt only when the
set changes; per-sequence work besides the controller calls is a few list comprehensions, and
random draws are whole-batch numpy calls in a fixed order (so results are bit-identical to the
one-array-per-round formulation).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import simpy

from control.types import Decision, Observation
from sim.acceptance import AcceptanceModel, lossy_probability
from sim.cluster import Cluster
from sim.workload import Requests


@dataclass
class Counters:
    rounds: int = 0
    accepted: int = 0
    drafted: int = 0
    rejected_rounds: int = 0
    accepted_emitted: int = 0
    lossy: int = 0
    round_tokens: int = 0
    prefill_tokens: int = 0
    gpu_busy_s: float = 0.0  # GPU-seconds
    bytes_moved: float = 0.0  # over all GPUs
    measured_tokens: int = 0  # tokens emitted after warm-up


@dataclass
class Replica:
    index: int
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    ctrls: dict = field(default_factory=dict)
    kv_used: float = 0.0
    outstanding: int = 0
    wake: Any = None
    batch: Any = None  # _Batch of the running set, rebuilt when it changes


class _Batch:
    """Per-replica view of the running set, kept between rounds until the set changes:
    controllers and their bound methods, positions (numpy, authoritative while the batch lives;
    written back to ``emitted`` by ``flush``), context lengths and remaining tokens (lists)."""

    __slots__ = ("ctrls", "ctx", "decide", "ids", "observe", "pos", "rem", "run_ids")

    def __init__(self, run_ids, ids, ctrls, decide, observe, ctx, rem, pos) -> None:
        self.run_ids, self.ids, self.ctrls = run_ids, ids, ctrls
        self.decide, self.observe = decide, observe
        self.ctx, self.rem, self.pos = ctx, rem, pos


@dataclass
class RunData:
    reqs: Requests
    first_token_s: np.ndarray
    finish_s: np.ndarray
    emitted: np.ndarray
    replica: np.ndarray
    counters: Counters
    end_s: float
    rounds: dict | None
    ctrl_trace: dict | None
    rejected: np.ndarray


_GC_LOCK = threading.Lock()
_GC_STATE: list = [0, None, False]  # runs in progress, thresholds to restore, we froze


@contextlib.contextmanager
def _quiet_gc(gen0: int = 50_000) -> Iterator[None]:
    """During a run: freeze the heap that exists before it (collections then skip the
    libraries' objects; only when nothing is frozen already, so a caller's own freeze is left
    alone) and collect the young generation less often (the loop makes many short-lived
    containers). Collection stays on (nothing changes when the caller disabled it); settings
    are restored when the last concurrent run ends. Results do not depend on it, only speed."""
    with _GC_LOCK:
        if _GC_STATE[0] == 0 and gc.isenabled():
            _GC_STATE[1] = gc.get_threshold()
            _GC_STATE[2] = gc.get_freeze_count() == 0
            if _GC_STATE[2]:
                gc.freeze()
            gc.set_threshold(max(gen0, _GC_STATE[1][0]), *_GC_STATE[1][1:])
        _GC_STATE[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_STATE[0] -= 1
            if _GC_STATE[0] == 0 and _GC_STATE[1] is not None:
                gc.set_threshold(*_GC_STATE[1])
                if _GC_STATE[2]:
                    gc.unfreeze()
                _GC_STATE[1], _GC_STATE[2] = None, False


_ROUND_COLS = ("request_id", "round", "now_s", "k", "drafted", "accepted", "emitted", "draft_s",
               "verify_s", "context_tokens", "mode", "beta", "tau", "lossy_accepts", "block_end",
               "confidences", "sentence_ends", "controller")
_CTRL_COLS = ("controller", "request_id", "now_s", "k", "alpha", "beta", "a_hat", "block_end")


def _observer(c: Any) -> Callable[..., None]:
    """``c.observe_values`` (Observation fields positionally), or an adapter for a controller
    that only has ``observe``."""
    f = getattr(c, "observe_values", None)
    if f is not None:
        return f
    obs = c.observe
    return lambda *values: obs(Observation(*values))


def run(scn, cluster: Cluster, reqs: Requests, make_ctrl: Callable[[], Any],
        acc: AcceptanceModel, *, trace: bool = False, label: str = "",
        progress: Any = None) -> RunData:
    """Simulate ``reqs`` on ``cluster`` with one ``make_ctrl()`` controller per request."""
    with _quiet_gc():
        return _run(scn, cluster, reqs, make_ctrl, acc, trace, label, progress)


def _run(scn, cluster: Cluster, reqs: Requests, make_ctrl: Callable[[], Any],
         acc: AcceptanceModel, trace: bool, label: str, progress: Any) -> RunData:
    dep = scn.deployment
    N = len(reqs)
    arrival, prompt, output = reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens
    first = np.full(N, np.nan)
    finish = np.full(N, np.nan)
    emitted = np.zeros(N, dtype=np.int64)
    rep_of = np.full(N, -1, dtype=np.int64)
    rejected = np.zeros(N, dtype=bool)
    rounds_done = np.zeros(N, dtype=np.int64)
    cnt = Counters()
    warmup = scn.sim.warmup_s
    env = simpy.Environment()
    reps = [Replica(i) for i in range(dep.replicas)]
    tp, dtp, colocated = cluster.tp, cluster.dtp, cluster.colocated
    lat_t, lat_d = cluster.lat_t, cluster.lat_d
    roof_t, roof_d = cluster.roof_t, cluster.roof_d
    kv_tok, kv_budget = cluster.kv_bytes_per_token, cluster.kv_budget_bytes
    use_drafter = cluster.use_drafter
    lossy_max = scn.acceptance.lossy_accept_max
    round_overhead_s = scn.latency.round_overhead_s
    rec = {c: [] for c in _ROUND_COLS} if trace else None
    ctr = {c: [] for c in _CTRL_COLS} if trace else None
    state = {"finished": 0, "last": 0.0}
    probe = make_ctrl()
    needs_future = bool(getattr(probe, "needs_future", False))
    # controllers that never read Observation.confidences get () (no per-token tuples); the
    # confidences are still drawn (same random stream), and built whenever τ or a trace needs them
    conf_to_ctrl = bool(getattr(probe, "reads_confidences", True)) or trace

    def arrivals():
        rr = 0
        for i in range(N):
            dt = arrival[i] - env.now
            if dt > 0:
                yield env.timeout(dt)
            if dep.routing == "round-robin":
                r = reps[rr]
                rr = (rr + 1) % len(reps)
            else:
                r = min(reps, key=lambda x: (x.outstanding, x.index))
            rep_of[i] = r.index
            r.outstanding += 1
            r.waiting.append(i)
            if r.wake is not None and not r.wake.triggered:
                r.wake.succeed()

    # per-request constants as Python lists: the hot loop indexes them one by one.
    need_l = ((prompt + output) * kv_tok).tolist()  # KV bytes reserved on admission
    prompt_l, output_l = prompt.tolist(), output.tolist()
    caps = dep.max_draft_tokens < 1024 or dep.draft_within_length  # engine caps on k

    def finish_req(r: Replica, i: int, t: float) -> None:
        finish[i] = t
        r.kv_used -= need_l[i]
        r.outstanding -= 1
        r.ctrls.pop(i, None)
        state["finished"] += 1
        state["last"] = t

    def replica(r: Replica):
        max_batch = dep.max_batch
        waiting = r.waiting
        while True:
            new = []
            while waiting and len(r.running) + len(new) < max_batch:
                i = waiting[0]
                need = need_l[i]
                if need > kv_budget:  # can never fit: reported unfinished
                    waiting.popleft()
                    rejected[i] = True
                    r.outstanding -= 1
                    continue
                if r.kv_used + need > kv_budget:
                    break
                waiting.popleft()
                r.kv_used += need
                new.append(i)
            if new:
                nb = len(new)
                ptoks = int(prompt[new].sum())
                pre = cluster.prefill_t(nb, ptoks)
                busy = pre * tp
                cnt.bytes_moved += roof_t.bytes_per_gpu(nb, ptoks, 0.0) * tp
                if use_drafter:
                    pd_ = cluster.prefill_d(nb, ptoks)
                    cnt.bytes_moved += roof_d.bytes_per_gpu(nb, ptoks, 0.0) * dtp
                    busy += pd_ * dtp
                    pre = pre + pd_ if colocated else max(pre, pd_)
                cnt.gpu_busy_s += busy
                yield env.timeout(pre)
                t = env.now
                flush(r)
                for i in new:
                    first[i] = t
                    emitted[i] = 1
                    cnt.prefill_tokens += 1
                    if t >= warmup:
                        cnt.measured_tokens += 1
                    if output_l[i] <= 1:
                        finish_req(r, i, t)
                    else:
                        r.ctrls[i] = make_ctrl()
                        r.running.append(i)
                if progress is not None:
                    progress(state["finished"])
                continue
            if not r.running:
                r.wake = env.event()
                yield r.wake
                r.wake = None
                continue
            yield from one_round(r)

    def flush(r: Replica) -> None:
        """Write the running batch's positions back and drop it (the running set changes)."""
        b = r.batch
        if b is not None:
            emitted[b.ids] = b.pos
            r.batch = None

    def batch_of(r: Replica) -> _Batch:
        run_ids = r.running
        ids = np.array(run_ids, dtype=np.int64)
        ctrls = [r.ctrls[i] for i in run_ids]
        pos = emitted[ids]
        pos_l = pos.tolist()
        return _Batch(list(run_ids), ids, ctrls, [c.decide for c in ctrls],
                      [_observer(c) for c in ctrls],
                      [prompt_l[i] + p for i, p in zip(run_ids, pos_l)],
                      [output_l[i] - p for i, p in zip(run_ids, pos_l)], pos)

    def one_round(r: Replica):
        b = r.batch
        if b is None:
            b = r.batch = batch_of(r)
        run_ids, ids, ctrls, ctxl, reml = b.run_ids, b.ids, b.ctrls, b.ctx, b.rem
        pos = b.pos
        B = len(run_ids)
        L = acc.run_lengths(ids, pos)
        now = env.now
        if needs_future:
            for c, fut in zip(ctrls, L.tolist()):
                c.set_future(fut)
        decs = [f(now) for f in b.decide]
        kl = [d.k for d in decs]
        kmax = max(kl)
        k = None
        if caps:
            k = np.array(kl, dtype=np.int64)
            if dep.max_draft_tokens < 1024:
                k = np.minimum(k, dep.max_draft_tokens)
            if dep.draft_within_length:
                k = np.minimum(k, np.maximum(output[ids] - pos - 1, 0))
            kmax = int(k.max())
            kl = k.tolist()
        lossy = None
        csum = sum(ctxl)
        if kmax > 0:
            any_tau = any([d.tau for d in decs])  # noqa: C419 - a list comp is faster here
            if any_tau or conf_to_ctrl:
                conf = acc.confidences(ids, pos, L, kmax)
            else:
                acc.skip_confidences(B, kmax)
                conf = None
            if any_tau:
                if k is None:
                    k = np.array(kl, dtype=np.int64)
                tau = np.array([d.tau for d in decs])
                j = np.arange(kmax)
                below = (conf < tau[:, None]) & (j[None, :] < k[:, None])
                has = below.any(axis=1)
                keff = np.where(has, below.argmax(axis=1), k)
                dsteps = int(np.where(keff < k, keff + 1, k).max())
                n = np.minimum(keff, L)
                kel = keff.tolist()
            else:
                keff = None
                dsteps = kmax
                kel = kl
                n = None
            if "threshold" in [d.mode for d in decs]:
                if keff is None:
                    keff = k if k is not None else np.array(kl, dtype=np.int64)
                    n = np.minimum(keff, L)
                lossy = np.zeros(B, dtype=np.int64)
                s = np.flatnonzero(np.array([d.mode == "threshold" for d in decs]) & (n < keff))
                if len(s):
                    beta = np.array([decs[i].beta for i in s.tolist()])
                    p = lossy_probability(beta, lossy_max)
                    s, p = s[p > 0], p[p > 0]  # β = 0.99 is strict: no draws at all
                if len(s):
                    cur, lo, kk = n[s].copy(), np.zeros(len(s), dtype=np.int64), keff[s]
                    active = np.ones(len(s), dtype=bool)
                    while active.any():
                        resc = active & (acc.rng.random(len(s)) < p)
                        w = np.flatnonzero(resc)
                        if not len(w):
                            break
                        cur[w] += 1
                        lo[w] += 1
                        more = acc.run_lengths(ids[s[w]], pos[s[w]] + cur[w])
                        cur[w] = np.minimum(cur[w] + more, kk[w])
                        active = resc & (cur < kk)
                    n[s] = cur
                    lossy[s] = lo
            if n is None:
                nl = [x if x < y else y for x, y in zip(L.tolist(), kel)]  # noqa: FURB136
            else:
                nl = n.tolist()
            nd = B - kl.count(0)
            if dsteps:
                dctx = float(csum if nd == B else sum([c for c, x in zip(ctxl, kl) if x]))
                d_step = lat_d.seconds(nd, nd, dctx)
            else:
                d_step = 0.0
            draft_s = dsteps * d_step
            if dsteps:
                cnt.bytes_moved += dsteps * roof_d.bytes_per_gpu(nd, nd, dctx) * dtp
        else:
            kel = kl
            nl = [0] * B
            conf = None
            draft_s = 0.0
        ksum = sum(kel)
        T = ksum + B
        csum = float(csum)
        verify_s = lat_t.seconds(B, T, csum)
        cnt.bytes_moved += roof_t.bytes_per_gpu(B, T, csum) * tp
        cnt.gpu_busy_s += (draft_s + verify_s) * tp if colocated else (verify_s * tp + draft_s * dtp)
        yield env.timeout(draft_s + verify_s + round_overhead_s)
        end = env.now
        eml = [x + 1 if x < y else y for x, y in zip(nl, reml)]  # min(n + 1, remaining)
        em = np.array(eml, dtype=np.int64)
        sends = acc.sentence_ends(run_ids, pos, eml)
        # counters
        cnt.rounds += B
        nsum = sum(nl)
        cnt.accepted += nsum
        cnt.drafted += ksum
        cnt.rejected_rounds += sum([x < y for x, y in zip(nl, kel)])
        emsum = sum(eml)
        ended = min(reml) <= kmax + 1  # some request may have emitted its last token
        # accepted tokens that were emitted: n, less the ones cut by the length limit
        cnt.accepted_emitted += nsum - (sum([x - y for x, y in zip(nl, eml) if x > y])
                                        if ended else 0)
        cnt.round_tokens += emsum
        if end >= warmup:
            cnt.measured_tokens += emsum
        if lossy is not None:
            cnt.lossy += int(lossy.sum())
        # observations
        Obs = Observation
        if rec is None:  # bound observe_values(now_s, drafted, accepted, confidences, ...)
            lol = lossy.tolist() if lossy is not None else repeat(0)
            if conf is None:  # nothing drafted, or no controller reads confidences
                for f, ke, nn, cx, lo, e, se in zip(b.observe, kel, nl, ctxl, lol, eml, sends):
                    f(end, ke, nn, (), draft_s, verify_s, cx, lo, e, se)
            else:
                for f, ke, nn, cf, cx, lo, e, se in zip(b.observe, kel, nl, conf.tolist(), ctxl,
                                                        lol, eml, sends):
                    f(end, ke, nn, tuple(cf[:ke]) if ke else (), draft_s, verify_s, cx, lo, e,
                      se)
        else:
            confl = conf.tolist() if conf is not None else [()] * B
            lol = lossy.tolist() if lossy is not None else [0] * B
            for idx, c in enumerate(ctrls):
                ke = kel[idx]
                obs = Obs(end, ke, nl[idx], tuple(confl[idx][:ke]) if ke else (),
                          draft_s, verify_s, ctxl[idx], lol[idx], eml[idx], sends[idx])
                c.observe(obs)
                d = decs[idx]
                rid = run_ids[idx]
                vals = (rid, int(rounds_done[rid]), end, d.k, obs.drafted, obs.accepted,
                        obs.emitted, draft_s, verify_s, obs.context_tokens, d.mode, d.beta, d.tau,
                        obs.lossy_accepts, d.block_end, " ".join(repr(x) for x in obs.confidences),
                        " ".join(str(x) for x in obs.sentence_ends), label)
                for col, v in zip(_ROUND_COLS, vals):
                    rec[col].append(v)
                st = c.state()
                cvals = (label, rid, end, st.get("k", d.k), st.get("alpha"), st.get("beta"),
                         st.get("a_hat"), d.block_end)
                for col, v in zip(_CTRL_COLS, cvals):
                    ctr[col].append(v)
            rounds_done[ids] += 1
        # advance the batch
        pos += em
        b.ctx = [x + y for x, y in zip(ctxl, eml)]
        b.rem = reml = [x - y for x, y in zip(reml, eml)]
        acc.advance(ids, em)
        if ended and 0 in reml:
            flush(r)
            for i, x in zip(run_ids, reml):
                if not x:
                    finish_req(r, i, end)
            r.running = [i for i, x in zip(run_ids, reml) if x]
        if progress is not None:
            progress(state["finished"])

    env.process(arrivals())
    for r in reps:
        env.process(replica(r))
    horizon = scn.sim.horizon_s
    if horizon is not None:
        env.run(until=horizon)
        end_s = float(horizon)
    else:
        env.run()
    for r in reps:
        flush(r)
    if horizon is None:
        end_s = float(max(state["last"], arrival[-1] if N else 0.0))
    return RunData(reqs, first, finish, emitted, rep_of, cnt, end_s, rec, ctr, rejected)


__all__ = ["Counters", "Decision", "RunData", "run"]
