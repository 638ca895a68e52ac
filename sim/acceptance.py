"""Acceptance models: how many drafted tokens the target accepts, drafter confidences, sentence ends.

Every model answers, for a batch of sequences at their current output positions, the *run
length* L: how many consecutive drafted tokens strict verification would accept (capped at
``max_run_tokens``). A round that drafts ``k_eff`` tokens then accepts ``n = min(k_eff, L)``
(acceptance is a prefix). Knowing L before the decision is what lets the simulator tell the
``clairvoyant`` the future; ``true_rates`` gives each sequence's current true per-token rate (what a
rate oracle knows) without drawing anything.

Models: ``iid`` (one rate ``a``: P(L >= j) = a^j), ``decay`` (the j-th drafted token of a round
is accepted with ``rate · decay^(j-1)``), ``markov`` (per-request easy/hard regime switching per
output token; a round uses the regime it starts in), ``beta`` (per-request rate drawn from
Beta(mean, concentration): task complexity), ``mixture`` (each request's rate is one of
``mixture_rates``, drawn with ``mixture_weights``: code-like and chat-like requests in one stream),
``replay`` (greedy position trace ``positions.csv``
of ``control.PositionRecord``: L and confidences as recorded, exactly), ``curve`` (a block
drafter's confidence-head calibration curve: the j-th drafted token of a round is accepted with
``position_rates[j-1]`` given the tokens before it were, the last value repeating past the
table; ``sim.block``), with a per-request spread when ``position_concentration`` > 0: request
i draws its first-position rate ``r_i ~ Beta(c_1·κ, (1 − c_1)·κ)`` and every position's rate is
scaled by ``r_i / c_1`` (capped at 1), so the mean first-position rate stays ``c_1``.

Drafter confidence: logit-normal, with mean ``conf_accept_logit`` for tokens inside the run and
``conf_reject_logit`` for the first rejected token and beyond, so low confidence predicts
rejection. With ``head_concentration`` κ > 0 instead a calibrated confidence head (a block
drafter's, ``sim.block``): position j of a round has a confidence ``c ~ Beta(r_j·κ, (1 − r_j)·κ)``
around its rate ``r_j`` (given the positions before it were accepted) and is accepted with
probability c, so ``P(accepted | c) = c``. Drawn given the run length L already drawn from the
rates, which is the same joint law: ``Beta(r_j·κ + 1, (1 − r_j)·κ)`` inside the run,
``Beta(r_j·κ, (1 − r_j)·κ + 1)`` at the first rejection, the prior past it.

Sentence ends: each emitted token ends a sentence with ``sentence_end_rate`` (geometric gaps).

Threshold mode (the β rule, lossy): a token that strict verification rejects still passes
``p(x) >= β · max p`` with probability ``lossy_accept_max · (0.99 - β) / (0.99 - 0.7)``, clipped to
[0, 1] (0 at β = 0.99, ``lossy_accept_max`` at β = 0.7: a lower β accepts more). After such a lossy
accept the run continues with a fresh run length from the next position. Lossy accepts are
counted per round.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from control.configio import param
from control.errors import DSparkError
from sim.tables import read_table


@dataclass(frozen=True)
class AcceptanceConfig:
    # iid is the Leviathan model; the others add structure.
    model: str = param(
        "iid",
        choices=("iid", "decay", "markov", "beta", "mixture", "replay", "curve"),
        doc="acceptance model",
    )
    # a 70B target with an 8B drafter of the same family accepts ~0.7-0.8 per token.
    rate: float = param(0.75, lo=0.0, hi=1.0, doc="per-token acceptance rate (iid, decay)")
    # a few percent lower acceptance per draft position.
    decay: float = param(0.97, lo=0.0, hi=1.0, doc="per-position rate multiplier (decay)")
    # easy stretches (boilerplate, code) are accepted almost always.
    easy_rate: float = param(0.9, lo=0.0, hi=1.0, doc="rate in the easy regime (markov)")
    # hard stretches (reasoning, rare facts).
    hard_rate: float = param(0.4, lo=0.0, hi=1.0, doc="rate in the hard regime (markov)")
    # easy stretches of ~50 tokens.
    p_easy_to_hard: float = param(0.02, lo=0.0, hi=1.0, doc="per-token switch easy->hard")
    # hard stretches of ~20 tokens.
    p_hard_to_easy: float = param(0.05, lo=0.0, hi=1.0, doc="per-token switch hard->easy")
    # mean task-complexity rate.
    beta_mean: float = param(0.75, lo=0.001, hi=0.999, doc="mean per-request rate (beta)")
    # moderate heterogeneity (std ~0.13 at mean 0.75).
    beta_concentration: float = param(10.0, lo=0.01, hi=1e6, doc="Beta a+b (beta)")
    # code-like (0.85) and chat-like (0.5) requests in one stream, half and half.
    mixture_rates: tuple[float, ...] = param(
        (0.85, 0.5), lo=0.0, hi=1.0, doc="per-request rate of each class (mixture)"
    )
    mixture_weights: tuple[float, ...] = param(
        (0.5, 0.5), lo=0.0, hi=1.0, doc="share of requests in each class (mixture)"
    )
    # empty: a block preset's curve (sim.block) fills it; model = 'curve' needs one.
    position_rates: tuple[float, ...] = param(
        (), lo=0.0, hi=1.0, doc="conditional acceptance per draft position (curve)"
    )
    # 0: every request follows the curve (a calibration from per-request summaries sets it).
    position_concentration: float = param(
        0.0, lo=0.0, hi=1e6, doc="per-request spread of the curve: Beta a+b (curve; 0 = none)"
    )
    # None unless model = 'replay'; relative to the scenario file.
    replay_path: str | None = param(None, doc="positions.csv (greedy position trace)")
    # replay normally reproduces the recorded request lengths.
    replay_lengths: bool = param(True, doc="replay: output length = recorded positions")
    # beyond k_max = 64 no controller drafts.
    max_run_tokens: int = param(64, lo=1, hi=1024, doc="cap on the run length L")
    # confident when right: sigmoid(2) ~ 0.88.
    conf_accept_logit: float = param(2.0, lo=-20.0, hi=20.0, doc="mean confidence logit, accepted")
    # unsure when wrong: sigmoid(-0.5) ~ 0.38.
    conf_reject_logit: float = param(-0.5, lo=-20.0, hi=20.0, doc="mean confidence logit, rejected")
    # overlap between the two, so confidence predicts but does not decide.
    conf_logit_sd: float = param(1.0, lo=0.0, hi=20.0, doc="confidence logit std")
    # 0: the logit-normal confidences above. > 0: a calibrated confidence head (module
    # docstring): position j's confidence c ~ Beta(r·κ, (1 − r)·κ) around its rate r, and the
    # token is accepted with probability c; a smaller κ is a sharper head (more per-round
    # information), κ → ∞ a head that only knows the rate. None: the drafter's (a block
    # drafter's head, sim.block.BLOCK_HEAD_CONCENTRATION; else 0).
    head_concentration: float | None = param(
        None, lo=0.0, hi=1e6, doc="calibrated head: Beta a+b of a position's confidence (0 = off)"
    )
    # roughly one sentence per 20 tokens of chat text.
    sentence_end_rate: float = param(0.05, lo=0.0, hi=1.0, doc="P(token ends a sentence)")
    # a rejected token passes the β rule at β = 0.7 half of the time.
    lossy_accept_max: float = param(0.5, lo=0.0, hi=1.0, doc="lossy-accept probability at β = 0.7")


def lossy_probability(beta: np.ndarray, lossy_accept_max: float) -> np.ndarray:
    return np.clip(lossy_accept_max * (0.99 - beta) / (0.99 - 0.7), 0.0, 1.0)


def _empirical_rate(run_lengths: np.ndarray, cap: int) -> float:
    """Per-token acceptance rate of a recorded position trace (positions without a record,
    L = -1, are left out): Σ L / (Σ L + runs that ended in a rejection); 0 when empty."""
    L = np.minimum(run_lengths[run_lengths >= 0], cap)
    accepted, rejected = int(L.sum()), int((L < cap).sum())
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


@functools.lru_cache(maxsize=4)
def _read_positions(path: str, mtime: float) -> dict:
    import pandas as pd

    required = ("request_id", "position", "run_length")
    df = read_table(path, "position trace", required, numeric=required)
    if df.empty:
        raise DSparkError(f"{path}: position trace is empty")
    df = df.astype(dict.fromkeys(required, np.int64))
    order = np.argsort(df["request_id"].to_numpy(), kind="stable")  # groupby's row order
    rid = df["request_id"].to_numpy()[order]
    pos = df["position"].to_numpy()[order]
    run = df["run_length"].to_numpy()[order]
    confs_all = None
    if "confidences" in df.columns:
        confs_all = []
        for c in df["confidences"].to_numpy()[order]:
            try:
                confs_all.append(
                    () if (c is None or pd.isna(c)) else tuple(float(x) for x in str(c).split())
                )
            except ValueError:
                raise DSparkError(
                    f"{path}: column 'confidences' has a garbled value {c!r}"
                ) from None
    ends_all = None
    if "sentence_end" in df.columns:
        send = df["sentence_end"].astype(str).str.lower().isin(("true", "1")).to_numpy()
        ends_all = send[order]
    ids, starts = np.unique(rid, return_index=True)
    bounds = [*starts.tolist(), len(rid)]
    out = {}
    for i, r in enumerate(ids.tolist()):
        a, b = bounds[i], bounds[i + 1]
        p = pos[a:b]
        size = int(p.max()) + 1
        L = np.full(size, -1, dtype=np.int64)
        L[p] = run[a:b]
        confs: list = [()] * size
        if confs_all is not None:
            for j, c in zip(p.tolist(), confs_all[a:b]):
                confs[j] = c
        ends = np.zeros(size, dtype=bool)
        if ends_all is not None:
            ends[p] = ends_all[a:b]
        out[int(r)] = (L, confs, ends)
    return out


def read_positions(path: str) -> dict:
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        raise DSparkError(f"{path}: position trace not found") from None
    return _read_positions(path, mtime)


class AcceptanceModel:
    """Per-request acceptance state for ``n`` requests, drawn with ``rng``."""

    def __init__(
        self, cfg: AcceptanceConfig, n: int, init_rng: np.random.Generator, rng: np.random.Generator
    ) -> None:
        self.cfg, self.rng = cfg, rng
        self.H = cfg.max_run_tokens
        kind = cfg.model
        self.kind = kind
        # a calibrated head's Beta draws cannot be skipped in step (skip_confidences)
        self.draws_head = (cfg.head_concentration or 0.0) > 0 and kind != "replay"
        self.rate = np.full(n, cfg.rate)
        if kind == "beta":
            a = cfg.beta_mean * cfg.beta_concentration
            self.rate = init_rng.beta(a, cfg.beta_concentration - a, n)
        elif kind == "mixture":
            rates, w = np.asarray(cfg.mixture_rates), np.asarray(cfg.mixture_weights)
            if len(rates) != len(w) or not len(rates) or w.sum() <= 0:
                raise DSparkError(
                    f"acceptance.mixture_rates ({len(rates)}) and "
                    f"acceptance.mixture_weights ({len(w)}) need the same, "
                    f"non-zero length and a positive total weight"
                )
            self.rate = rates[init_rng.choice(len(rates), size=n, p=w / w.sum())]
        elif kind == "markov":
            pe, ph = cfg.p_easy_to_hard, cfg.p_hard_to_easy
            pi_easy = ph / (pe + ph) if pe + ph > 0 else 1.0
            self.easy = init_rng.random(n) < pi_easy
            self.rate = np.where(self.easy, cfg.easy_rate, cfg.hard_rate)
        elif kind == "curve":
            if not cfg.position_rates:
                raise DSparkError("acceptance.model = 'curve' needs acceptance.position_rates")
            r = np.asarray(cfg.position_rates, dtype=float)
            r = np.concatenate([r, np.full(max(self.H - len(r), 0), r[-1])])[: self.H]
            self.rate = np.full(n, r[0])
            kappa = cfg.position_concentration
            if kappa > 0 and 0.0 < r[0] < 1.0:  # per-request spread (module docstring)
                self.rate = init_rng.beta(r[0] * kappa, (1.0 - r[0]) * kappa, n)
                r = np.minimum(r[None, :] * (self.rate / r[0])[:, None], 1.0)
            with np.errstate(divide="ignore"):
                self.neg_log_surv = -np.cumsum(np.log(r), axis=-1)
        elif kind == "decay":
            j = np.arange(1, self.H + 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                tail = np.where(j > 1, j * (j - 1) / 2 * np.log(cfg.decay), 0.0)
                self.neg_log_surv = -(j * np.log(cfg.rate) + tail)
        elif kind == "replay":
            if not cfg.replay_path:
                raise DSparkError("acceptance.model = 'replay' needs acceptance.replay_path")
            rec = read_positions(cfg.replay_path)
            ids = sorted(rec)
            self.records = [rec[ids[i % len(ids)]] for i in range(n)]
            self.recorded_ids = [ids[i % len(ids)] for i in range(n)]
        self._log_rate: np.ndarray | None = None
        self._log_rate_src: np.ndarray | None = None
        self._replay_rates: np.ndarray | None = None
        # tokens until the next sentence end (0 = the next emitted token ends one); a list of
        # Python ints, read and written a few at a time.
        self.next_end = self._gaps(n, init_rng).tolist()

    # -- lengths -------------------------------------------------------------------------
    def output_lengths(self) -> np.ndarray | None:
        """Recorded output lengths (replay with replay_lengths), else None."""
        if self.kind == "replay" and self.cfg.replay_lengths:
            return np.array([len(r[0]) for r in self.records], dtype=np.int64)
        return None

    # -- run lengths ---------------------------------------------------------------------
    def run_lengths(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Strict run length L of each sequence at output position ``pos``."""
        H = self.H
        if self.kind == "replay":
            out = np.empty(len(ids), dtype=np.int64)
            for i, (r, p) in enumerate(zip(ids.tolist(), pos.tolist())):
                L = self.records[r][0]
                out[i] = min(int(L[p]), H) if p < len(L) and L[p] >= 0 else 0
            return out
        u = 1.0 - self.rng.random(len(ids))  # in (0, 1]
        if self.kind in ("decay", "curve"):
            if self.neg_log_surv.ndim == 2:  # a curve per request
                return (self.neg_log_surv[ids] < -np.log(u)[:, None]).sum(axis=1)
            return np.searchsorted(self.neg_log_surv, -np.log(u), side="left")
        # P(L >= j) = a^j  <=>  L = floor(log u / log a); log a = -0 (a = 1) gives the cap
        L = np.log(u)
        L /= self.log_rate[ids]
        np.minimum(L, H, out=L)
        return L.astype(np.int64)

    def true_rates(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Each sequence's true per-token acceptance probability of its next drafted token
        (the first of a round drafted at output position ``pos``): iid, decay and curve the
        configured rate (decay and curve: at draft position 1), beta the request's own rate,
        markov the rate of its current regime, replay the empirical rate of the request's recorded trace
        (Σ L / (Σ L + positions whose run ended in a rejection), L capped at
        ``max_run_tokens``). What a rate oracle knows; draws nothing from ``rng``."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.kind == "replay":
            if self._replay_rates is None:
                self._replay_rates = np.array([_empirical_rate(r[0], self.H) for r in self.records])
            return self._replay_rates[ids]
        return self.rate[ids]

    def request_rates(self) -> np.ndarray:
        """Each request's own per-token acceptance rate for the requests table: the drawn rate
        (beta, mixture; curve: at draft position 1), the configured one (iid; decay at position
        1), the recorded trace's empirical rate (replay); NaN under markov, whose rate moves
        within a request."""
        if self.kind == "markov":
            return np.full(len(self.rate), np.nan)
        if self.kind == "replay":
            return self.true_rates(np.arange(len(self.records)), np.zeros(len(self.records)))
        return self.rate.astype(float, copy=True)

    @property
    def log_rate(self) -> np.ndarray:
        lr = self._log_rate
        if lr is None or self._log_rate_src is not self.rate:
            with np.errstate(divide="ignore"):
                lr = self._log_rate = np.minimum(np.log(self.rate), -1e-300)
            self._log_rate_src = self.rate
        return lr

    # -- confidences ---------------------------------------------------------------------
    def position_rates(self, ids: np.ndarray, kmax: int) -> np.ndarray:
        """(batch, kmax) each sequence's rate at draft positions 1..kmax, given the positions
        before it were accepted (iid, beta, mixture, markov: its rate at every position)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.kind in ("decay", "curve"):
            nls = self.neg_log_surv if self.neg_log_surv.ndim == 2 else self.neg_log_surv[None, :]
            nls = nls[:, :kmax] if nls.shape[0] == 1 else nls[ids, :kmax]
            step = np.diff(nls, axis=1, prepend=0.0)
            r = np.exp(-step)
            if r.shape[1] < kmax:  # past max_run_tokens: the last rate repeats
                r = np.concatenate([r, np.repeat(r[:, -1:], kmax - r.shape[1], axis=1)], axis=1)
            return np.broadcast_to(r, (len(ids), kmax))
        return np.repeat(self.rate[ids][:, None], kmax, axis=1)

    def head_confidences(self, ids: np.ndarray, L: np.ndarray, kmax: int) -> np.ndarray:
        """(batch, kmax) a calibrated head's confidences given the run lengths ``L`` (module
        docstring): each position's Beta around its rate, updated by its outcome."""
        k = float(self.cfg.head_concentration or 0.0)
        r = np.clip(self.position_rates(ids, kmax), 1e-6, 1.0 - 1e-6)
        j = np.arange(kmax)[None, :]
        a = r * k + (j < L[:, None])
        b = (1.0 - r) * k + (j == L[:, None])
        return self.rng.beta(a, b)

    def confidences(self, ids: np.ndarray, pos: np.ndarray, L: np.ndarray, kmax: int) -> np.ndarray:
        """(batch, kmax) drafter confidences: high inside the run, low from the first reject
        (a calibrated head's with ``head_concentration`` > 0)."""
        c = self.cfg
        if self.draws_head:
            return self.head_confidences(ids, L, kmax)
        j = np.arange(kmax)
        mean = np.where(j[None, :] < L[:, None], c.conf_accept_logit, c.conf_reject_logit)
        # conf = 1 / (1 + exp(-(mean + sd · N(0, 1)))), computed in place
        conf = self.rng.standard_normal((len(ids), kmax))
        conf *= c.conf_logit_sd
        conf += mean
        np.negative(conf, out=conf)
        np.exp(conf, out=conf)
        conf += 1.0
        np.divide(1.0, conf, out=conf)
        if self.kind == "replay":
            for i, (r, p) in enumerate(zip(ids.tolist(), pos.tolist())):
                confs = self.records[r][1]
                if p < len(confs) and confs[p]:
                    m = min(len(confs[p]), kmax)
                    conf[i, :m] = confs[p][:m]
        return conf

    def skip_confidences(self, batch: int, kmax: int) -> None:
        """Draw what :meth:`confidences` would draw from ``rng`` without computing anything from
        it: when nobody reads the confidences the random stream (and every later draw) stays the
        same as when they are computed. (A calibrated head's Beta draws take a varying number
        of the stream's numbers: the simulator computes them whenever the head is on.)"""
        self.rng.standard_normal((batch, kmax))

    # -- after a round -------------------------------------------------------------------
    def advance(self, ids: np.ndarray, emitted: np.ndarray) -> None:
        if self.kind != "markov":
            return
        c = self.cfg
        pe, ph = c.p_easy_to_hard, c.p_hard_to_easy
        if pe + ph <= 0:
            return
        lam = (1.0 - pe - ph) ** emitted
        pi_e = ph / (pe + ph)
        easy = self.easy[ids]
        p_easy = np.where(easy, pi_e + (1 - pi_e) * lam, pi_e * (1 - lam))
        self.easy[ids] = self.rng.random(len(ids)) < p_easy
        self.rate[ids] = np.where(self.easy[ids], c.easy_rate, c.hard_rate)
        self._log_rate = None

    def _gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        r = self.cfg.sentence_end_rate
        if r <= 0:
            return np.full(n, np.iinfo(np.int64).max // 4, dtype=np.int64)
        return rng.geometric(r, n).astype(np.int64) - 1

    def sentence_ends(self, ids, pos, emitted) -> list:
        """Per sequence, the 0-based offsets within this round's emitted tokens that end a
        sentence (tuple, usually empty). ``ids`` and ``emitted`` are sequences of ints (Python
        lists on the simulator's hot path: a batch of a few dozen is cheaper without numpy)."""
        out: list[tuple[int, ...]] = [()] * len(ids)
        if self.kind == "replay":
            for i, (r, p, e) in enumerate(
                zip(
                    np.asarray(ids).tolist(), np.asarray(pos).tolist(), np.asarray(emitted).tolist()
                )
            ):
                ends = self.records[r][2][p : p + e]
                if ends.any():
                    out[i] = tuple(np.flatnonzero(ends).tolist())
            return out
        ne = self.next_end
        hl = []  # batch indices whose next sentence end falls inside this round
        for j, (i, e) in enumerate(zip(ids, emitted)):
            left = ne[i] - e
            if left < 0:
                hl.append(j)
            else:
                ne[i] = left
        if not hl:
            return out
        rate = self.cfg.sentence_end_rate
        cur = [ne[ids[j]] for j in hl]  # offset of that sentence end in the round
        el = [emitted[j] for j in hl]
        offs = [[o] for o in cur]
        live = list(range(len(hl)))
        while live:  # further sentence ends inside the same round (rare); one draw per pass
            more = []
            for j, g in zip(live, self.rng.geometric(rate, len(live)).tolist()):
                cur[j] += g
                if cur[j] < el[j]:
                    offs[j].append(cur[j])
                    more.append(j)
            live = more
        for j, c, e, o in zip(hl, cur, el, offs):
            ne[ids[j]] = c - e
            out[j] = tuple(o)
        return out
