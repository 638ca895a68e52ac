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

Two refinements on top of the map, each with a prior that leaves it out until slots say
otherwise:

- **By logit range** (``bin_width``, ``bin_prior_slots``): the head's errors on unseen text
  are not a straight line in ``z`` (on ``real_speed.py``'s unseen prompts slots the head gave
  0.15-0.25 were accepted ~0.5 of the time, slots at 0.55-0.75 ~0.1 less than said). In each
  range of ``z`` the prediction is the range's remembered accepted share, shrunk toward the
  map by ``bin_prior_slots`` pseudo-slots: ``(S_c + m·σ(a·z + b)) / (W_c + m)``.
- **By request** (``request_precision``): some prompts are harder than the head can see (one
  of six unseen prompts accepted 0.55 where the head said 0.74). Each request (the engine's
  slot, forgotten when a new request takes it) gets an offset ``d_r`` on the logit of the
  shared prediction, the maximum a posteriori one under a Gaussian prior of precision
  ``request_precision`` given the request's own verified slots so far (refitted after each of
  its rounds, under the shared map as it stood before the round).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
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
    # ranges of 0.5 in the head's logit (4 of the memory's bins): a few hundred slots fill the
    # ranges the head uses; 0 = the map alone (benchmarks/block_calibration.py on two
    # development prompt sets: 0.25-1 within the ECE's noise of each other).
    bin_width: float = param(
        0.5, lo=0.0, hi=24.0, doc="logit range of the by-range correction (0: none)"
    )
    # 16 pseudo-slots at the map: a range's own share takes over once it holds ~16 slots.
    bin_prior_slots: float = param(
        16.0, lo=0.0, hi=1e9, doc="pseudo-slots at the map in each logit range"
    )
    # a Gaussian prior of precision 4 on the request's logit offset (sd 0.5): ~25 verified
    # slots at p ~ 0.8 move it halfway to what they alone say. The spread of the requests'
    # own offsets on the development prompt sets gave precisions 0.8 and 3.7, their ECE was
    # lowest at 4-8 (benchmarks/block_calibration.py); 0 = no offset.
    request_precision: float = param(
        4.0, lo=0.0, hi=1e9, doc="prior precision of each request's logit offset (0: none)"
    )
    # a round in which a request drafts nothing (a τ or survival stop read its low
    # confidences) forgets 1/16 of its evidence: a request whose offset stopped its drafts
    # drafts again within some 16-32 such rounds, so a stop cannot keep an offset that no
    # slot checks any more.
    request_idle_rounds: float = param(
        16.0, lo=1.0, hi=1e9, doc="rounds without a draft that forget a request's offset"
    )


#: The logits' bins (width 1/8 on [-12, 12]): a slot is counted in its bin, at the bin's mean
#: logit, so a refit costs the same whatever the slots remembered.
BIN_WIDTH, BIN_LIMIT = 0.125, 12.0
_BINS = int(2 * BIN_LIMIT / BIN_WIDTH) + 1

#: (a, b) of the shipped calibration: the prior's centre
_PRIOR = np.array([1.0, 0.0])

#: Newton steps of a request offset's refit after each of its rounds (from the last offset,
#: which a round's few slots move little; the posterior is concave in d).
REQUEST_NEWTON_STEPS = 3


def _bin_of(z: np.ndarray) -> np.ndarray:
    """The memory bin of each logit (width ``BIN_WIDTH``, clipped to ±``BIN_LIMIT``)."""
    zc = np.clip(np.asarray(z, dtype=float), -BIN_LIMIT, BIN_LIMIT)
    return np.rint((zc + BIN_LIMIT) / BIN_WIDTH).astype(np.intp)


class OnlineCalibration:
    """The Platt map ``σ(a·z + b)`` of a confidence logit, refitted on verified slots, with
    its by-range and by-request refinements (module docstring). The slots are kept as
    forgotten counts by logit bin: weight, accepted weight and Σ weight·z (the bin's mean
    logit); each request's own slots as unforgotten counts by the same bins."""

    def __init__(self, config: RecalibrationConfig | None = None) -> None:
        self.config = config or RecalibrationConfig()
        c = self.config
        group = c.bin_width / BIN_WIDTH
        if c.bin_width and (group < 1.0 or abs(group - round(group)) > 1e-9):
            raise ValueError(
                f"recalibration bin_width {c.bin_width}: a multiple of {BIN_WIDTH} is needed"
            )
        self._group = round(group)  # memory bins per logit range (0: no range)
        self.reset()

    def reset(self) -> None:
        """Back to the shipped calibration, no slot remembered (a fresh server)."""
        self.theta = _PRIOR.copy()  # (a, b): the identity on the shipped calibration
        self._w = np.zeros(_BINS)  # forgotten slot counts by bin
        self._s = np.zeros(_BINS)  # of which accepted
        self._wz = np.zeros(_BINS)  # Σ weight · logit
        self._ranges()
        #: per request key: (slot counts by bin, accepted counts by bin, Σ logit by bin, d_r)
        self._requests: dict[Any, list] = {}

    @property
    def slots(self) -> float:
        """Verified slots the fit holds (forgotten: their weight)."""
        return float(self._w.sum())

    def offset(self, key: Any) -> float:
        """The logit offset of request ``key`` (0 for one with no verified slot yet)."""
        r = self._requests.get(key)
        return 0.0 if r is None else r[3]

    def forget_request(self, key: Any) -> None:
        """A new request takes ``key``: the last one's offset and slots go."""
        self._requests.pop(key, None)

    def _shared(self, z: np.ndarray) -> np.ndarray:
        """The map with the by-range correction (no request offset), of logits ``z``."""
        a, b = self.theta
        p = 1.0 / (1.0 + np.exp(-(a * z + b)))
        g = self._group
        if not g:
            return p
        m = self.config.bin_prior_slots
        r = _bin_of(z) // g
        w = self._range_w[r]
        # a range with no slot is the map itself (not (0 + m·p) / m, which may round)
        return np.where(w > 0.0, (self._range_s[r] + m * p) / (w + m), p)

    def _ranges(self) -> None:
        """The forgotten slot and accepted counts by logit range (``_group`` memory bins each;
        the last range may hold fewer), read by :meth:`_shared`."""
        g = max(self._group, 1)
        pad = np.zeros((-_BINS) % g)
        self._range_w = np.append(self._w, pad).reshape(-1, g).sum(axis=1)
        self._range_s = np.append(self._s, pad).reshape(-1, g).sum(axis=1)

    def apply(self, z: np.ndarray, keys: Sequence[Any] | None = None) -> np.ndarray:
        """The recalibrated probabilities of logits ``z`` (any shape); ``keys``: the request
        of each row of ``z`` (its first axis), whose offset applies (None: no offsets)."""
        z = np.asarray(z, dtype=float)
        p = self._shared(z)
        if keys is None or not self.config.request_precision:
            return p
        d = np.array([self.offset(k) for k in keys], dtype=float)
        if not d.any():
            return p
        d = d.reshape((len(d),) + (1,) * (z.ndim - 1))
        q = np.clip(p, 1e-12, 1.0 - 1e-12)
        return 1.0 / (1.0 + np.exp(-(np.log(q) - np.log1p(-q) + d)))

    def learn(self, z: np.ndarray, accepted: np.ndarray, keys: Sequence[Any] | None = None) -> None:
        """Verified slots (their logits, and 1 / 0 for accepted / refused) join the fit, the
        older ones forgotten by ``1 − 1/memory_slots`` a slot; the map is refitted. ``keys``
        (one per slot): the request of each slot, whose offset is refitted first, under the
        shared map before these slots join it."""
        z = np.asarray(z, dtype=float).ravel()
        if not len(z):
            return
        accepted = np.asarray(accepted, dtype=float).ravel()
        zc = np.clip(z, -BIN_LIMIT, BIN_LIMIT)
        idx = _bin_of(zc)
        if keys is not None and self.config.request_precision:
            self._learn_requests(idx, zc, accepted, list(keys))
        c = self.config
        keep = (1.0 - 1.0 / c.memory_slots) ** len(z)
        for arr in (self._w, self._s, self._wz):
            arr *= keep
        np.add.at(self._w, idx, 1.0)
        np.add.at(self._s, idx, accepted)
        np.add.at(self._wz, idx, zc)
        self._ranges()
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

    def idle(self, key: Any) -> None:
        """Request ``key`` ran a round with no verified slot: its evidence is forgotten by
        ``1/request_idle_rounds`` and its offset refitted (toward 0)."""
        r = self._requests.get(key)
        if r is None:
            return
        keep = 1.0 - 1.0 / self.config.request_idle_rounds
        for arr in r[:3]:
            arr *= keep
        self._refit_offset(r)

    def _learn_requests(
        self, idx: np.ndarray, zc: np.ndarray, accepted: np.ndarray, keys: list
    ) -> None:
        """Each request's slots (their bins ``idx`` and clipped logits ``zc``) join its counts;
        its offset is refitted (:meth:`_refit_offset`, a Gaussian prior of precision
        ``request_precision`` at 0)."""
        for key in dict.fromkeys(keys):
            m = np.array([k == key for k in keys])
            r = self._requests.get(key)
            if r is None:
                r = self._requests[key] = [np.zeros(_BINS), np.zeros(_BINS), np.zeros(_BINS), 0.0]
            np.add.at(r[0], idx[m], 1.0)
            np.add.at(r[1], idx[m], accepted[m])
            np.add.at(r[2], idx[m], zc[m])
            self._refit_offset(r)

    def _refit_offset(self, r: list) -> None:
        """Newton steps (from the last offset: the posterior is concave in d) on the log
        posterior of request ``r``'s offset, its slots at their bins' mean logits under the
        shared map."""
        lam = self.config.request_precision
        used = r[0] > 0.0
        w, acc = r[0][used], r[1][used]
        q = np.clip(self._shared(r[2][used] / w), 1e-12, 1.0 - 1e-12)
        s = np.log(q) - np.log1p(-q)
        d = r[3]
        for _ in range(REQUEST_NEWTON_STEPS):
            p = 1.0 / (1.0 + np.exp(-(s + d)))
            d += float((acc - w * p).sum() - lam * d) / float((w * p * (1.0 - p)).sum() + lam)
        if math.isfinite(d):
            r[3] = d

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
