"""``dspark real train --block-drafter``: distil the block drafter (``real.block_drafter``)
from the shipped target, resumable.

Data, two kinds. (1) The target's own greedy continuations: prompts are windows of the
corpus's training split (validation: its val split, per workload); the target decodes
``gen_tokens`` tokens greedily from each, in float32 batches, and the outputs of the drafter's
``feature_layers`` are kept at every position the drafter can read (the last ``context`` prompt
positions and the continuation). An example is a cut L inside the continuation: the context
entries L-C .. L-1 and, as labels, the next B tokens of the continuation: exactly the target's
greedy choices given that the block's earlier tokens were accepted, so "slot j agrees with its
label" is the event the confidence head predicts (acceptance of token j given tokens < j were
accepted, under greedy verification). (2) Teacher-forced windows of the training split
(``corpus_windows``): real text around every cut, labels the target's argmax at each position
given the text (exact for the block's first token; later ones follow the text, not the
target's own choices). A batch takes ``corpus_share`` of its cuts from (2).

Loss: cross-entropy of each block position against its label, weighted ``depth_decay ** (j-1)``
(position j is verified only when the ones before it were accepted), normalised; plus the
confidence head's binary cross-entropy on the greedy cuts (the head reads detached states, so
it never pulls the drafter). After training, the head's per-position affine calibration
(Platt) is fitted on engine rounds (float32, greedy, k = B) over half of ``calib_prompts``
val-split prompts, on the positions verification reached (the ones before all accepted); the
other half scores it (ECE, 10 equal-width bins). The validation continuations give the
agreement by depth, the conditional acceptance and the ECE per position.

Generated data, model and optimizer state are saved in the work folder; a killed run resumes
at its last save, drawing exactly the batches an uninterrupted run would
(``numpy.random.default_rng([seed, step])``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from control.configio import param
from control.errors import DSparkError
from real import checkpoint as ck
from real.block_drafter import BlockConfig, BlockDrafterModel, target_layer_states
from real.models import Segments
from real.train import _load_opt, _make_opt, _opt_tensors, lr_at, token_arrays


@dataclass(frozen=True)
class BlockTrainConfig:
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of every draw (prompts, init, batches)")
    # the machine's 2 cores (shared).
    threads: int = param(2, lo=1, hi=256, doc="torch CPU threads")
    # DSpark's block; the engine's k cuts it per sequence.
    block_size: int = param(7, lo=1, hi=64, doc="draft block B")
    # 512 continuations of 128 tokens: ~62 k cuts, ~0.15 GB of fp16 features.
    sequences: int = param(512, lo=1, hi=1 << 20, doc="training prompts continued by the target")
    val_sequences: int = param(
        96, lo=4, hi=1 << 16, doc="validation prompts (val split), half code, half prose"
    )
    # the drafter's adjacent-token chain width (BlockConfig.adjacent; 0: none).
    adjacent: int = param(0, lo=0, hi=4096, doc="adjacent-token chain width (0: none)")
    # the drafter's encoder layers (BlockConfig.n_layers).
    n_layers: int = param(2, lo=1, hi=16, doc="encoder layers over context + mask slots")
    # the benchmarks' prompts are 128 tokens; shorter ones vary the target's context.
    prompt_tokens: tuple[int, ...] = param(
        (48, 80, 112, 128), lo=2, hi=4096, doc="prompt lengths, one per generation batch"
    )
    # the benchmarks generate 128 tokens a prompt.
    gen_tokens: int = param(128, lo=2, hi=4096, doc="greedy tokens the target adds to a prompt")
    gen_batch: int = param(64, lo=1, hi=1024, doc="prompts decoded together")
    # 2500 steps of 192 cuts (half greedy, half teacher-forced): ~25 min on one shared core.
    steps: int = param(2500, lo=1, hi=1_000_000, doc="optimizer steps")
    batch: int = param(192, lo=1, hi=65536, doc="cuts per step")
    lr: float = param(3e-3, lo=1e-6, hi=1.0, doc="peak learning rate")
    warmup_steps: int = param(50, lo=0, hi=100_000, doc="linear warm-up steps")
    weight_decay: float = param(0.1, lo=0.0, hi=1.0, doc="AdamW weight decay (matrices only)")
    # teacher-forced windows of the training split: real text around every cut (the greedy
    # continuations alone are few and repetitive: the first run overfit them, train CE 0.54
    # against 3.6-5.2 on validation); their labels are the target's argmax at each position
    # given the text, exact for the block's first token, the text's own prefix for later ones.
    corpus_windows: int = param(512, lo=0, hi=1 << 20, doc="teacher-forced training windows")
    corpus_tokens: int = param(256, lo=16, hi=4096, doc="tokens of a teacher-forced window")
    corpus_share: float = param(0.5, lo=0.0, hi=1.0, doc="share of a batch from those windows")
    # engine rounds on val-split prompts fit the head's calibration (half of them score it).
    calib_prompts: int = param(24, lo=0, hi=4096, doc="val prompts the engine calibrates on")
    calib_new_tokens: int = param(64, lo=1, hi=1024, doc="tokens each calibration prompt adds")
    # ~ the acceptance of a draft token: position j weighs about as often as it is verified.
    depth_decay: float = param(0.7, lo=0.0, hi=1.0, doc="loss weight ratio of position j+1 to j")
    # distillation proper: the share of each position's loss that is the KL divergence from the
    # target's own next-token distribution (read from its last layer's stored state, so it
    # costs one head product), the rest cross-entropy against the argmax label. The soft
    # targets say which wrong tokens are nearly right; 0 trains on labels alone.
    kl_share: float = param(0.5, lo=0.0, hi=1.0, doc="share of the loss from the target's KL")
    save_every: int = param(100, lo=1, hi=1_000_000, doc="steps between resumable saves")


def _log(msg: str) -> None:
    print(f"[dspark real train --block-drafter] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data
@torch.inference_mode()
def generate(target, prompts: torch.Tensor, gen: int, layers, context: int):
    """Greedy continuations of ``prompts`` ``[b, P]`` by the target (float32, batched, the
    engine's incremental path). Returns tokens ``[b, C + gen]`` (positions P-C .. P+gen-1) and
    the outputs of ``layers`` concatenated ``[b, C + gen, nf · d]`` at positions
    P-C-1 .. P+gen-2, so entry i of both belongs to token position P-C+i."""
    b, P = prompts.shape
    st = target.new_state(P + gen, torch.float32, "cpu", b)
    slots = list(range(b))
    cat = lambda: torch.cat([st["hidden_layers"][i - 1] for i in layers], -1)  # noqa: E731
    segs = Segments(slots, [0] * b, [P] * b)
    logits = target.step_packed(prompts.reshape(-1), segs, st, logits=segs.last)
    feats = [cat().view(b, P, -1)[:, P - context - 1 :]]
    toks = [prompts[:, P - context :], logits.argmax(-1)[:, None]]
    for i in range(gen - 1):
        logits = target.step_packed(toks[-1][:, 0], Segments(slots, [P + i] * b, [1] * b), st)
        feats.append(cat()[:, None])
        toks.append(logits.argmax(-1)[:, None])
    return torch.cat(toks, 1), torch.cat(feats, 1).half()


def build_data(target, tokens: np.ndarray, n: int, c: BlockTrainConfig, bc: BlockConfig, seed):
    """``n`` continuations of prompts drawn from ``tokens``: (tokens ``[n, C + gen]`` int64,
    features ``[n, C + gen, F]`` fp16)."""
    rng = np.random.default_rng(seed)
    toks, feats = [], []
    for i in range(0, n, c.gen_batch):
        b = min(c.gen_batch, n - i)
        P = int(c.prompt_tokens[(i // c.gen_batch) % len(c.prompt_tokens)])
        starts = rng.integers(0, len(tokens) - P - 1, size=b)
        prompts = torch.from_numpy(np.stack([tokens[s : s + P] for s in starts]).astype(np.int64))
        t, f = generate(target, prompts, c.gen_tokens, bc.feature_layers, bc.context)
        toks.append(t)
        feats.append(f)
        _log(f"generated {i + b}/{n} continuations")
    return torch.cat(toks), torch.cat(feats)


def cached_data(work: Path, name: str, make) -> tuple[torch.Tensor, torch.Tensor]:
    """The data set ``name`` from the work folder, made (and saved) when missing."""
    path = work / f"block_{name}.safetensors"
    if path.is_file():
        t = ck.load_tensors(path)
        return t["tokens"], t["feats"]
    toks, feats = make()
    ck.save_tensors({"tokens": toks, "feats": feats}, path)
    return toks, feats


def cached_corpus(work: Path, make):
    """The teacher-forced windows from the work folder, made (and saved) when missing."""
    path = work / "block_corpus.safetensors"
    if path.is_file():
        t = ck.load_tensors(path)
        return t["tokens"], t["feats"], t["labels"]
    toks, feats, labels = make()
    ck.save_tensors({"tokens": toks, "feats": feats, "labels": labels}, path)
    return toks, feats, labels


def trimmed(data, context: int, gen: int, work: Path):
    """Cached data made for a longer context, cut to ``context`` positions before the
    continuation (a shorter one is a one-line error)."""
    toks, feats = data
    extra = toks.shape[1] - context - gen
    if extra < 0 or feats.shape[1] != toks.shape[1]:
        raise DSparkError(
            f"{work}: cached block data holds {toks.shape[1] - gen} context positions before "
            f"{gen} generated tokens; the drafter reads {context} (delete block_*.safetensors)"
        )
    return toks[:, extra:], feats[:, extra:]


@torch.inference_mode()
def corpus_data(target, tokens: np.ndarray, n: int, T: int, layers, seed, chunk: int = 8):
    """``n`` teacher-forced windows of ``T`` tokens: (tokens ``[n, T-1]`` = positions 1..T-1,
    states ``[n, T-1, F]`` fp16 at positions 0..T-2, labels ``[n, T-1]``: the target's argmax
    for each of positions 1..T-1 given the text before it), aligned as :func:`generate`'s."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(tokens) - T, size=n)
    toks, feats, labels = [], [], []
    for i in range(0, n, chunk):
        w = torch.from_numpy(np.stack([tokens[s : s + T] for s in starts[i : i + chunk]]))
        w, last, d = w.long(), len(target.layers), target.cfg.d_model
        h = target_layer_states(target, w, tuple(sorted({*layers, last})))
        am = target.logits(h[..., -d:]).argmax(-1)
        if last not in layers:
            h = h[..., :-d]
        toks.append(w[:, 1:])
        feats.append(h[:, :-1].half())
        labels.append(am[:, :-1])
        if (i // chunk) % 16 == 15:
            _log(f"teacher-forced {i + chunk}/{n} windows")
    return torch.cat(toks), torch.cat(feats), torch.cat(labels)


def cut_batch(data, rows: torch.Tensor, cuts: torch.Tensor, C: int, B: int, teacher=None):
    """Inputs and labels of cuts ``cuts`` of rows ``rows`` of ``data`` = (tokens, states) or
    (tokens, states, labels): entries c .. c+C-1, labels c+C .. c+C+B-1 (aligned indices; see
    :func:`generate`; the labels are the tokens themselves without a labels array), and the
    token before each label, c+C-1 .. c+C+B-2 (what the adjacent-token chain reads: the last
    context token, then the text's tokens; in a greedy continuation those are the labels
    before, the tokens the block drafted when it was accepted so far). With
    ``teacher`` (a function of the stored states, see :func:`teacher_logits`), also the
    target's logits for each label position: entry e holds the state that predicts token e."""
    toks, feats = data[0], data[1]
    labels = data[2] if len(data) > 2 else toks
    ent = cuts[:, None] + torch.arange(C)
    lab = cuts[:, None] + C + torch.arange(B)
    r = rows[:, None]
    out = (toks[r, ent], feats[r, ent].float(), labels[r, lab], toks[r, lab - 1])
    return out if teacher is None else (*out, teacher(feats[r, lab].float()))


def teacher_logits(target, d_feature: int, feature_layers: tuple[int, ...]):
    """A function from stored states ``[..., nf · d_feature]`` to the target's logits, read
    from its last layer's state (one of ``feature_layers``; otherwise a one-line error)."""
    last = len(target.layers)
    if last not in feature_layers:
        raise DSparkError(
            f"block_train.kl_share > 0 needs the target's last layer ({last}) among the "
            f"drafter's feature_layers {feature_layers}"
        )
    i = sorted(feature_layers).index(last)

    @torch.no_grad()
    def logits(f: torch.Tensor) -> torch.Tensor:
        return target.logits(f[..., i * d_feature : (i + 1) * d_feature])

    return logits


def losses(
    model,
    tokens,
    feats,
    labels,
    prev,
    decay: float,
    conf_rows: int | None = None,
    teacher: torch.Tensor | None = None,
    kl_share: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss over block positions: cross-entropy against the labels, each slot reading
    the token before it from ``prev`` (teacher forcing, with the adjacent-token chain), ``kl_share`` of
    it replaced by KL(target ‖ drafter) where ``teacher`` logits are given; confidence-head BCE
    over the first ``conf_rows`` rows: the greedy continuations, whose labels are the
    acceptance events)."""
    ones = torch.ones_like(tokens, dtype=torch.bool)
    logits, conf = model(tokens, feats, ones, ones, prev=prev)
    B = labels.shape[1]
    ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    if teacher is not None and kl_share > 0:
        kl = F.kl_div(
            torch.log_softmax(logits.flatten(0, 1).float(), -1),
            torch.log_softmax(teacher.flatten(0, 1).float(), -1),
            reduction="none",
            log_target=True,
        ).sum(-1)
        ce = (1.0 - kl_share) * ce + kl_share * kl
    w = decay ** torch.arange(B, dtype=torch.float32)
    ce = (ce.view(-1, B).mean(0) * w).sum() / w.sum()
    hit = (logits.argmax(-1) == labels).float()
    m = slice(None, conf_rows)
    return ce, F.binary_cross_entropy_with_logits(conf[m].float(), hit[m])


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def predictions(model, toks, feats, C: int, B: int, stride: int = 4):
    """Raw confidence logits (before calibration), hits (slot j's argmax equals label j) and
    cross-entropies against the labels at every ``stride``-th cut of every continuation:
    ``[M, B]`` each."""
    model.eval()
    G = toks.shape[1] - C
    cuts = torch.arange(0, G - B + 1, stride)
    zs, hits, ces = [], [], []
    for r in range(toks.shape[0]):
        rows = torch.full((len(cuts),), r)
        t, f, y, prev = cut_batch((toks, feats), rows, cuts, C, B)
        ones = torch.ones_like(t, dtype=torch.bool)
        logits, conf = model(t, f, ones, ones, prev=prev)
        zs.append((conf - model.calib[1]) / model.calib[0])
        hits.append((logits.argmax(-1) == y).float())
        ces.append(F.cross_entropy(logits.transpose(1, 2).float(), y, reduction="none"))
    model.train()
    return torch.cat(zs), torch.cat(hits), torch.cat(ces)


def reached(hit: torch.Tensor) -> torch.Tensor:
    """``[M, B]``: position j is verified when every position before it was accepted."""
    ones = torch.ones_like(hit[:, :1])
    return torch.cat([ones, hit.cumprod(1)[:, :-1]], 1) > 0


def fit_calibration(z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None):
    """Per position j, (scale, shift) minimising the BCE of sigmoid(scale · z + shift) against
    ``y`` over the cuts where ``mask`` holds (Platt scaling; None: all), with a weak prior at
    the identity: ``[2, B]``."""
    w = torch.ones_like(y) if mask is None else mask.to(y.dtype)
    n = w.sum(0).clamp_min(1.0)
    p = torch.stack([torch.ones(z.shape[1]), torch.zeros(z.shape[1])]).requires_grad_(True)
    opt = torch.optim.LBFGS([p], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        bce = F.binary_cross_entropy_with_logits(z * p[0] + p[1], y, reduction="none")
        # a weak pull towards the identity keeps a position whose outcomes never vary finite
        prior = 1e-3 * ((p[0] - 1.0) ** 2 + p[1] ** 2)
        loss = ((bce * w).sum(0) / n + prior).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return p.detach()


def _r4(v: float) -> float | None:
    """``v`` rounded to 4 places; None where there was nothing to score (NaN)."""
    return round(float(v), 4) if np.isfinite(v) else None


def ece(conf: np.ndarray, hit: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: Σ_bins share · |mean confidence − mean outcome|."""
    if not len(conf):
        return float("nan")
    idx = np.minimum((np.asarray(conf) * bins).astype(int), bins - 1)
    out = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            out += float(m.mean()) * abs(float(np.mean(conf[m])) - float(np.mean(hit[m])))
    return out


def ece_floor(conf: np.ndarray, draws: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean and 95th percentile of the ECE of outcomes drawn from ``conf`` itself: what a
    perfectly calibrated predictor scores on that many predictions (the ECE's noise floor)."""
    conf = np.asarray(conf, dtype=float)
    e = [ece(conf, (rng.random(len(conf)) < conf).astype(float)) for _ in range(draws)]
    return float(np.mean(e)), float(np.quantile(e, 0.95))


def evaluate(model, vals: dict, C: int, B: int) -> dict:
    """Score the head's current calibration on every workload's validation continuations
    (``vals``: name -> (tokens, states)). The head predicts acceptance of slot j given slots
    < j were accepted, so ECE counts the positions a block reaches (every slot before them
    hit). Per workload: cross-entropy, agreement by depth (all cuts, and where reached: the
    conditional acceptance), expected accepted tokens of a full block, ECE per position and
    pooled over the reached positions; ``conf_ece_reached``: that ECE over every workload's."""
    out: dict = {}
    pooled: tuple[list, list] = ([], [])
    for n, (t, f) in vals.items():
        z, y, ce = predictions(model, t, f, C, B)
        conf = torch.sigmoid(z * model.calib[0] + model.calib[1]).detach().numpy()
        hit, seen = y.numpy(), reached(y).numpy()
        pooled[0].append(conf[seen])
        pooled[1].append(hit[seen])
        out[n] = {
            "val_ce": round(float(ce.mean()), 4),
            "val_agreement_by_depth": [round(float(a), 4) for a in hit.mean(0)],
            "val_conditional_acceptance_by_depth": [
                _r4(hit[seen[:, j], j].mean()) if seen[:, j].any() else None for j in range(B)
            ],
            "val_accepted_per_block": round(float(np.cumprod(hit, 1).sum(1).mean()), 4),
            "val_conf_ece_by_depth": [
                _r4(ece(conf[seen[:, j], j], hit[seen[:, j], j])) for j in range(B)
            ],
            "val_conf_ece_reached": round(ece(conf[seen], hit[seen]), 4),
            "val_cuts": len(hit),
        }
    out["conf_ece_reached"] = round(ece(np.concatenate(pooled[0]), np.concatenate(pooled[1])), 4)
    return out


@torch.no_grad()
def engine_rounds(model, target, prompts: list[list[int]], new_tokens: int):
    """The engine (float32, greedy, fixed k = B) drafting with ``model`` on ``prompts``: per
    round, the head's raw logits ``[R, B]``, hits and the verified positions (j <= accepted,
    j < drafted)."""
    from control import make_controller
    from real.block_drafter import BlockDrafter
    from real.engine import Engine, EngineConfig

    B = model.cfg.block_size
    cfg = EngineConfig(
        max_len=max(map(len, prompts)) + new_tokens + 8,
        target_dtype="float32",
        stop_at_eot=False,
    )
    model.eval()
    eng = Engine(
        target, BlockDrafter(model, cfg.max_len + cfg.k_max + 1, torch.float32, "cpu"), cfg
    )
    z, y, m = [], [], []
    for p in prompts:
        for r in eng.generate(p, new_tokens, make_controller("fixed", {"k": B})).records:
            if not r.drafted:
                continue
            c = torch.full((B,), 0.5, dtype=torch.float64)  # undrafted: masked out
            c[: r.drafted] = torch.tensor(r.confidences, dtype=torch.float64).clamp(1e-6, 1 - 1e-6)
            z.append((torch.logit(c).float() - model.calib[1]) / model.calib[0])
            j = torch.arange(B)
            y.append((j < r.accepted).float())
            m.append((j <= r.accepted) & (j < r.drafted))
    model.train()
    return torch.stack(z), torch.stack(y), torch.stack(m)


def engine_calibration(model, target, arrays: dict, c: BlockTrainConfig) -> dict:
    """Fit the head's calibration on engine rounds over the first half of ``calib_prompts``
    val-split prompts per workload (128-token windows at evenly spaced offsets), score it on
    the second half: ECE over the verified positions per workload and pooled, and the rounds'
    accepted tokens."""
    per = max(c.calib_prompts // 2, 2)
    prompts: dict[str, list[list[int]]] = {}
    for wl in ("code", "prose"):
        t = arrays[f"{wl}_val"]
        offs = np.linspace(0, len(t) - 129, per).astype(int)
        prompts[wl] = [t[o : o + 128].astype(np.int64).tolist() for o in offs]
    fit = [
        engine_rounds(model, target, ps[: per // 2], c.calib_new_tokens) for ps in prompts.values()
    ]
    z, y, m = (torch.cat(x) for x in zip(*fit))
    with torch.no_grad():
        model.calib.copy_(fit_calibration(z, y, m))
    out: dict = {}
    pooled: tuple[list, list] = ([], [])
    for wl, ps in prompts.items():
        z, y, m = engine_rounds(model, target, ps[per // 2 :], c.calib_new_tokens)
        conf = torch.sigmoid(z * model.calib[0] + model.calib[1]).detach().numpy()
        sel = m.numpy()
        pooled[0].append(conf[sel])
        pooled[1].append(y.numpy()[sel])
        out[wl] = {
            "engine_conf_ece": round(ece(conf[sel], y.numpy()[sel]), 4),
            "engine_accepted_per_round": round(float(y.sum(1).mean()), 4),
            "engine_rounds": len(y),
        }
    out["engine_conf_ece"] = round(ece(np.concatenate(pooled[0]), np.concatenate(pooled[1])), 4)
    _log(f"calibrated on engine rounds: {out}")
    return out


# ---------------------------------------------------------------- training
def train_loop(model, data, corpus, work: Path, c: BlockTrainConfig, teacher=None) -> dict:
    """The resumable optimisation (state in ``work``) on the greedy continuations ``data`` and
    the teacher-forced windows ``corpus`` (None: none), distilling ``teacher``'s
    distributions (:func:`teacher_logits`; None: labels alone); returns the stage's state
    dict."""
    toks = data[0]
    C, B = model.cfg.context, model.cfg.block_size
    G = toks.shape[1] - C
    n_corpus = round(c.batch * c.corpus_share) if corpus is not None else 0
    ckpt, state_path = work / "drafter_block.ckpt.safetensors", work / "drafter_block.state.json"
    opt = _make_opt(model, c.weight_decay, c.lr)
    state: dict = {"step": 0, "losses": [], "seconds": 0.0}
    if state_path.is_file() and ckpt.is_file():
        state = ck.read_json(state_path)
        tensors = ck.load_tensors(ckpt)
        ck.load_into(model, tensors, str(ckpt), prefix="model.")
        _load_opt(opt, tensors)
        _log(f"resuming at step {state['step']}")
    model.train()
    t0 = time.perf_counter()
    step = state["step"]
    while step < c.steps:
        rng = np.random.default_rng([c.seed, step])
        n = c.batch - n_corpus
        rows = torch.from_numpy(rng.integers(0, toks.shape[0], n))
        cuts = torch.from_numpy(rng.integers(0, G - B + 1, n))
        parts = [cut_batch(data, rows, cuts, C, B, teacher)]
        if n_corpus:
            assert corpus is not None
            span = corpus[0].shape[1] - C - B + 1
            rows = torch.from_numpy(rng.integers(0, corpus[0].shape[0], n_corpus))
            cuts = torch.from_numpy(rng.integers(0, span, n_corpus))
            parts.append(cut_batch(corpus, rows, cuts, C, B, teacher))
        batch = [torch.cat(x) for x in zip(*parts)]
        soft = batch.pop() if teacher is not None else None
        for g in opt.param_groups:
            g["lr"] = lr_at(step, c.lr, c.warmup_steps, c.steps)
        ce, bce = losses(model, *batch, c.depth_decay, n, soft, c.kl_share)
        opt.zero_grad(set_to_none=True)
        (ce + bce).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        state["losses"].append(round(float(ce.item()), 5))
        if step % c.save_every == 0 or step == c.steps:
            state["step"] = step
            state["seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            ck.save_tensors(
                {**{f"model.{k}": v for k, v in model.state_dict().items()}, **_opt_tensors(opt)},
                ckpt,
            )
            ck.write_json(state, state_path)
            _log(f"step {step}/{c.steps}: loss {ce.item():.3f} conf bce {bce.item():.3f}")
    return state


@torch.no_grad()
def warm_embedding(model, target) -> None:
    """Start the drafter's tied embedding from the target's, projected on its ``d_model``
    leading principal directions (the head then starts near the target's own, rank-cut)."""
    E = target.embed_tokens.weight.float()
    d = model.cfg.d_model
    if d > E.shape[1]:
        return
    _, _, V = torch.linalg.svd(E - E.mean(0), full_matrices=False)
    model.embed_tokens.weight.copy_(E @ V[:d].T)


def train_block_drafter(work: Path, ckpt_dir: Path, c: BlockTrainConfig, command: str) -> dict:
    """Distil the block drafter from the target in ``ckpt_dir`` and add it to that folder's
    manifest as ``drafter_block`` (with the target's sha256 and the block size)."""
    from real.store import add_model, load_bundle

    torch.set_num_threads(c.threads)
    work.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(ckpt_dir, names=("target",))
    target = bundle.models["target"].float().eval()
    bc = BlockConfig(
        vocab_size=target.cfg.vocab_size,
        block_size=c.block_size,
        adjacent=c.adjacent,
        n_layers=c.n_layers,
        d_feature=target.cfg.d_model,
        feature_layers=tuple(sorted({max(1, target.cfg.n_layers // 3 * i) for i in (1, 2, 3)})),
    )
    arrays = token_arrays(work, bundle.tokenizer)
    train_tokens = np.concatenate([arrays["code_train"], arrays["prose_train"]])
    data = cached_data(
        work, "train", lambda: build_data(target, train_tokens, c.sequences, c, bc, [c.seed, 1])
    )
    data = trimmed(data, bc.context, c.gen_tokens, work)
    vals = {}
    for i, wl in enumerate(("code", "prose")):  # each workload's val split, half the prompts
        make = partial(build_data, target, arrays[f"{wl}_val"], c.val_sequences // 2, c, bc)
        v = cached_data(work, f"val_{wl}", partial(make, [c.seed, 2, i]))
        vals[wl] = trimmed(v, bc.context, c.gen_tokens, work)
    torch.manual_seed(c.seed)
    model = BlockDrafterModel(bc)
    warm_embedding(model, target)
    corpus = None
    if c.corpus_windows:
        make = partial(
            corpus_data, target, train_tokens, c.corpus_windows, c.corpus_tokens, bc.feature_layers
        )
        corpus = cached_corpus(work, partial(make, [c.seed, 3]))
    teacher = None
    if c.kl_share > 0:
        teacher = teacher_logits(target, bc.d_feature, bc.feature_layers)
    res = train_loop(model, data, corpus, work, c, teacher)
    if c.calib_prompts:  # the calibration from engine rounds; else from the greedy val cuts
        engine = engine_calibration(model, target, arrays, c)
    else:
        halves = [(t[: len(t) // 2], f[: len(f) // 2]) for t, f in vals.values()]
        z, y, _ = (
            torch.cat(x)
            for x in zip(*(predictions(model, *h, bc.context, bc.block_size) for h in halves))
        )
        with torch.no_grad():
            model.calib.copy_(fit_calibration(z, y, reached(y)))
        engine = {}
    res["eval"] = evaluate(model, vals, bc.context, bc.block_size)
    for k, v in engine.items():  # per workload beside the offline scores, and pooled
        res["eval"][k] = {**res["eval"][k], **v} if isinstance(v, dict) else v
    _log(f"validation {res['eval']}")
    meta = {
        "target_sha256": bundle.manifest["models"]["target"]["sha256"],
        "block_size": str(bc.block_size),
    }
    return add_model(ckpt_dir, "drafter_block", "block", bc, model, res, command, meta)
