"""``dspark real train``: tokenizer, target and distilled drafters, seeded and resumable.

Stages run in order and each is skipped when its output exists: tokenizer -> token arrays ->
target (next-token cross-entropy, bf16 autocast) -> conv drafter and transformer drafter
(distilled: KL(target || drafter) on teacher-forced target distributions) -> export of the shipped
checkpoints (bf16 target, fp16 drafters) with a manifest. Each training stage saves its model and
AdamW state as safetensors plus a JSON step counter every ``save_every`` steps; a killed run
resumes where it stopped. Batches are drawn from ``numpy.random.default_rng([seed, stage, step])``
so a resumed run draws exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from control.configio import param
from real import checkpoint as ck
from real import corpus, tokenizer
from real.models import ConvConfig, TransformerConfig
from real.store import build_model

STAGES = ("target", "drafter_conv", "drafter_tf", "drafter_feat")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of every draw (init, batches)")
    # 2 threads: the machine has 2 cores (shared).
    threads: int = param(2, lo=1, hi=256, doc="torch CPU threads")
    vocab_size: int = param(4096, lo=256, hi=65536, doc="BPE vocabulary size")
    # prototype: 600 steps of 16 x 512 reached 3.1 nats in ~20 min on 2 free cores.
    target_steps: int = param(600, lo=1, hi=100000, doc="target optimizer steps")
    target_batch: int = param(16, lo=1, hi=1024, doc="target sequences per step")
    target_seq_len: int = param(512, lo=8, hi=4096, doc="target tokens per sequence")
    target_lr: float = param(1.5e-3, lo=1e-6, hi=1.0, doc="target peak learning rate")
    warmup_steps: int = param(40, lo=0, hi=10000, doc="linear warm-up steps (all stages)")
    # drafters: short contexts suffice (conv receptive field is 29 tokens).
    drafter_steps: int = param(400, lo=1, hi=100000, doc="optimizer steps per drafter")
    drafter_batch: int = param(16, lo=1, hi=1024, doc="drafter sequences per step")
    drafter_seq_len: int = param(256, lo=8, hi=4096, doc="drafter tokens per sequence")
    conv_lr: float = param(3e-3, lo=1e-6, hi=1.0, doc="conv drafter peak learning rate")
    # 1: the seed's plain convs. 2 (dilations 1, 2, 4, 8: 106 tokens of view instead of 29)
    # distilled slightly worse from the 800-step target in a 150-step A/B (top-1 agreement
    # 0.246 vs 0.256, KL 1.91 vs 1.82), so it stays an option.
    conv_dilation_base: int = param(1, lo=1, hi=4, doc="conv drafter: block i dilates by base**i")
    tf_lr: float = param(3e-3, lo=1e-6, hi=1.0, doc="transformer drafter peak learning rate")
    # small decoupled weight decay, Llama-style betas.
    weight_decay: float = param(0.1, lo=0.0, hi=1.0, doc="AdamW weight decay (matrices only)")
    # the feature drafter (real.feature_drafter), distilled from the shipped target.
    feat_steps: int = param(600, lo=1, hi=100000, doc="feature conv drafter optimizer steps")
    # 5e-4: warm-started; 3e-3 (the conv drafter's) disrupted it (agreement at every depth fell
    # below the warm start's within 100 steps).
    feat_lr: float = param(5e-4, lo=1e-6, hi=1.0, doc="feature conv drafter peak learning rate")
    # 8: drafts rarely survive past 8 tokens; every window trains depths 1..8 past its cut.
    feat_depth: int = param(8, lo=1, hi=64, doc="feature drafter: draft depths trained per cut")
    # start from the token-only conv drafter's weights (its blocks, embeddings, norms).
    feat_warm_start: bool = param(True, doc="feature drafter: start from the conv drafter")
    # 0.5 ~ the acceptance rate of a draft token: depth j's loss weighs about as often as it is
    # reached; uniform weights (1) let depths >= 2 (no current feature) dominate and cut
    # depth-1 agreement (0.26 against 0.45 at depth 2 after 80 warm steps, lr 1e-3).
    feat_depth_decay: float = param(0.5, lo=0.0, hi=1.0, doc="feature drafter: depth weight decay")
    # on: the teacher's forward under bf16 autocast, as the target serves at batch 1 (the shipped
    # 200-step drafter); off: float32, a training step ~3x faster on CPUs without native bf16
    # (emulated bf16 matmuls; 3.3-4.1 against 10.6 s, batch 16 x 256, 2 threads), with features
    # that differ from the bf16 target's by bf16 rounding (validation scores against bf16).
    feat_teacher_bf16: bool = param(True, doc="feature drafter: teacher forward in bf16")
    # on: the drafter is fed the target's hidden states; off (an ablation): the feature
    # projection stays zero, so the same training sees token embeddings only.
    feat_features: bool = param(True, doc="feature drafter: train the feature path")
    eval_windows: int = param(24, lo=1, hi=10000, doc="validation windows per workload")
    save_every: int = param(25, lo=1, hi=100000, doc="steps between resumable checkpoints")


def target_config(c: TrainConfig) -> TransformerConfig:
    return TransformerConfig(vocab_size=c.vocab_size)


def conv_config(c: TrainConfig) -> ConvConfig:
    return ConvConfig(vocab_size=c.vocab_size, dilation_base=c.conv_dilation_base)


def tf_drafter_config(c: TrainConfig) -> TransformerConfig:
    # ~0.95 M parameters: the same size as the conv drafter, for a fair comparison.
    return TransformerConfig(vocab_size=c.vocab_size, d_model=128, n_layers=2, n_heads=4, d_ff=384)


def lr_at(step: int, peak: float, warmup: int, total: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac))))


def _log(msg: str) -> None:
    print(f"[dspark real train] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data
def build_tokenizer(work: Path, c: TrainConfig):
    path = work / "tokenizer.json"
    if path.is_file():
        return tokenizer.load_tokenizer(path)
    _log("training tokenizer")
    texts = corpus.documents("code", "train") + corpus.documents("prose", "train")
    tok = tokenizer.train_tokenizer(texts, c.vocab_size)
    work.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def encode_docs(tok, docs: list[str]) -> np.ndarray:
    eot = tok.token_to_id(tokenizer.EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.uint16)


def token_arrays(work: Path, tok) -> dict[str, np.ndarray]:
    out = {}
    for wl in corpus.WORKLOADS:
        for sp in corpus.SPLITS:
            path = work / f"{wl}_{sp}.npy"
            if not path.is_file():
                arr = encode_docs(tok, corpus.documents(wl, sp))
                tmp = path.with_suffix(".tmp.npy")
                np.save(tmp, arr)
                tmp.replace(path)
            out[f"{wl}_{sp}"] = np.load(path, allow_pickle=False)
    return out


def batch(tokens: np.ndarray, rng: np.random.Generator, b: int, t: int) -> torch.Tensor:
    starts = rng.integers(0, len(tokens) - t - 1, size=b)
    return torch.from_numpy(np.stack([tokens[s : s + t + 1] for s in starts]).astype(np.int64))


def eval_windows(tokens: np.ndarray, n: int, t: int) -> torch.Tensor:
    """``n`` evenly spaced windows of ``t+1`` tokens (fixed: the same for every run)."""
    n = max(1, min(n, (len(tokens) - 1) // (t + 1)))
    starts = np.linspace(0, len(tokens) - t - 2, n).astype(np.int64)
    return torch.from_numpy(np.stack([tokens[s : s + t + 1] for s in starts]).astype(np.int64))


def val_windows(arrays: dict[str, np.ndarray], c: TrainConfig, t: int) -> dict[str, torch.Tensor]:
    """Every workload's evaluation windows of ``t+1`` tokens, from its validation split."""
    return {wl: eval_windows(arrays[f"{wl}_val"], c.eval_windows, t) for wl in corpus.WORKLOADS}


# ---------------------------------------------------------------- losses
def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per token, averaged."""
    lp = F.log_softmax(teacher_logits.float(), dim=-1)
    lq = F.log_softmax(student_logits.float(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1).mean()


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, teacher=None, bf16: bool = False) -> dict[str, float]:
    model.eval()
    ce = kl = agree = n = 0.0
    for i in range(0, len(windows), 8):
        w = windows[i : i + 8]
        x, y = w[:, :-1], w[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        ce += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        if teacher is not None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                tl = teacher(x)
            kl += distill_loss(logits, tl).item() * y.numel()
            agree += (logits.argmax(-1) == tl.argmax(-1)).sum().item()
        n += y.numel()
    model.train()
    out = {"val_ce": ce / n}
    if teacher is not None:
        out["val_kl"] = kl / n
        out["val_greedy_agreement"] = agree / n
    return out


# ---------------------------------------------------------------- resumable loop
def _opt_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for idx, st in opt.state_dict()["state"].items():
        for key, v in st.items():
            out[f"opt.{idx}.{key}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def _load_opt(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]) -> None:
    sd = opt.state_dict()
    state: dict[int, dict] = {}
    for name, v in tensors.items():
        if name.startswith("opt."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = v
    sd["state"] = state
    opt.load_state_dict(sd)


def _make_opt(model, weight_decay: float, lr: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on the matrices only (biases and norms undecayed)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def _stage_loss(model, teacher, x: torch.Tensor, y: torch.Tensor, bf16: bool) -> torch.Tensor:
    """One batch's training loss: next-token cross-entropy, or distillation from ``teacher``."""
    if teacher is None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        tl = teacher(x)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    return distill_loss(logits, tl)


def train_stage(
    name: str,
    model,
    tokens: np.ndarray,
    windows: dict[str, torch.Tensor],
    work: Path,
    c: TrainConfig,
    *,
    steps: int,
    lr: float,
    bsz: int,
    seq: int,
    bf16: bool,
    teacher=None,
    loss_fn=None,
    eval_fn=None,
) -> dict:
    """``loss_fn(model, teacher, window, step)`` / ``eval_fn(model, windows, teacher)`` replace
    the default loss and evaluation (the feature drafter's)."""
    from tqdm import tqdm

    ckpt, state_path = work / f"{name}.ckpt.safetensors", work / f"{name}.state.json"
    opt = _make_opt(model, c.weight_decay, lr)
    state = {"step": 0, "losses": [], "seconds": 0.0}
    if state_path.is_file() and ckpt.is_file():
        state = ck.read_json(state_path)
        tensors = ck.load_tensors(ckpt)
        ck.load_into(model, tensors, str(ckpt), prefix="model.")
        _load_opt(opt, tensors)
        _log(f"{name}: resuming at step {state['step']}")
    if state["step"] >= steps and "eval" in state:
        return state
    stage_id = STAGES.index(name)
    model.train()
    bar = tqdm(total=steps, initial=state["step"], desc=name, mininterval=5.0, file=sys.stderr)
    t0 = time.perf_counter()
    step = state["step"]
    while step < steps:
        rng = np.random.default_rng([c.seed, stage_id, step])
        w = batch(tokens, rng, bsz, seq)
        x, y = w[:, :-1], w[:, 1:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr, c.warmup_steps, steps)
        if loss_fn is None:
            loss = _stage_loss(model, teacher, x, y, bf16)
        else:
            loss = loss_fn(model, teacher, w, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        state["losses"].append(round(float(loss.item()), 5))
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % c.save_every == 0 or step == steps:
            state["step"] = step
            state["seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            ck.save_tensors(
                {**{f"model.{k}": v for k, v in model.state_dict().items()}, **_opt_tensors(opt)},
                ckpt,
            )
            ck.write_json(state, state_path)
    bar.close()
    ev = eval_fn or (lambda m, win, t: evaluate(m, win, t, bf16))
    state["eval"] = {wl: ev(model, win, teacher) for wl, win in windows.items()}
    state["step"] = step
    ck.write_json(state, state_path)
    _log(f"{name}: done, eval {json.dumps(state['eval'])}")
    return state


def rounded(model, dtype: torch.dtype):
    """A float32 copy of ``model`` whose weights are those of the ``dtype`` export."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(dtype).float())
    return m.eval()


def run_training(work: Path, out: Path, c: TrainConfig, command: str) -> dict:
    torch.set_num_threads(c.threads)
    work.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(work, c)
    arrays = token_arrays(work, tok)
    train_tokens = np.concatenate([arrays["code_train"], arrays["prose_train"]])
    _log(
        f"corpus: {len(arrays['code_train'])} code + {len(arrays['prose_train'])} prose "
        f"training tokens"
    )
    tw = val_windows(arrays, c, c.target_seq_len)
    dw = val_windows(arrays, c, c.drafter_seq_len)
    specs = {
        "target": ("transformer", target_config(c)),
        "drafter_conv": ("conv", conv_config(c)),
        "drafter_tf": ("transformer", tf_drafter_config(c)),
    }
    results = {}
    torch.manual_seed(c.seed)
    target = build_model(*specs["target"])
    results["target"] = train_stage(
        "target",
        target,
        train_tokens,
        tw,
        work,
        c,
        steps=c.target_steps,
        lr=c.target_lr,
        bsz=c.target_batch,
        seq=c.target_seq_len,
        bf16=True,
    )
    teacher = rounded(target, torch.bfloat16)
    for name, lr in (("drafter_conv", c.conv_lr), ("drafter_tf", c.tf_lr)):
        torch.manual_seed(c.seed + 1 + STAGES.index(name))
        model = build_model(*specs[name])
        results[name] = train_stage(
            name,
            model,
            train_tokens,
            dw,
            work,
            c,
            steps=c.drafter_steps,
            lr=lr,
            bsz=c.drafter_batch,
            seq=c.drafter_seq_len,
            bf16=False,
            teacher=teacher,
        )
        specs[name] = (*specs[name], model)
    specs["target"] = (*specs["target"], target)
    from real.store import export_checkpoints

    return export_checkpoints(out, tok, specs, results, c, command)


# ---------------------------------------------------------------- the feature drafter
def feature_batch(
    model, teacher, w: torch.Tensor, depth: int, offset: int, teacher_bf16: bool = True
):
    """Student and teacher logits ``[M, depth, V]`` (plus the true next tokens ``[M, depth]``)
    of the windows of ``w`` (``[B, T+1]`` tokens): cuts c = R-1+offset, +depth, ... ; the
    window of cut c holds positions c-R+1 .. c+depth-1 (R: the drafter's receptive field, so
    its outputs equal full-sequence ones), features present at positions <= c (the committed
    prefix of a round), missing after (tokens drafted in that round); loss at c .. c+depth-1."""
    x, y = w[:, :-1], w[:, 1:]
    T, R = x.shape[1], model.receptive_field()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=teacher_bf16):
        h = teacher.hidden(x)
        tl = teacher.logits(h)
    cuts = torch.arange(R - 1 + offset, T - depth + 1, depth)
    idx = cuts[:, None] - (R - 1) + torch.arange(R - 1 + depth)  # [C, W]
    present = ((idx <= cuts[:, None]) & (idx >= 1)).expand(x.shape[0], -1, -1)
    f = model.feat_proj(model.feat_norm(h.float()))  # project once, then gather
    f = torch.where(present[..., None], f[:, (idx - 1).clamp_min(0)], model.missing)
    xin = model.embed_tokens(x[:, idx]) + f  # [B, C, W, d]
    out = model.run_blocks(xin.flatten(0, 1))[:, R - 1 :]
    lp = cuts[:, None] + torch.arange(depth)  # loss positions [C, depth]
    V = tl.shape[-1]
    return model.head(out), tl[:, lp].reshape(-1, depth, V), y[:, lp].reshape(-1, depth)


def feature_loss(
    model,
    teacher,
    w: torch.Tensor,
    step: int,
    depth: int,
    decay: float,
    teacher_bf16: bool = True,
) -> torch.Tensor:
    """KL per draft depth j = 1..depth, weighted by ``decay ** (j - 1)`` (a draft token at depth
    j is verified only when the j - 1 before it were accepted), normalised to sum 1."""
    student, tl, _ = feature_batch(model, teacher, w, depth, step % depth, teacher_bf16)
    lp = F.log_softmax(tl.float(), dim=-1)
    lq = F.log_softmax(student.float(), dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean(0)  # [depth]
    wts = decay ** torch.arange(depth, dtype=kl.dtype)
    return (kl * wts).sum() / wts.sum()


@torch.no_grad()
def evaluate_feature(model, windows: torch.Tensor, teacher, depth: int) -> dict:
    """Teacher-forced agreement by draft depth (1 = the first draft token, the target's state
    known), its mean over depths 1..depth, KL and cross-entropy; the teacher in bf16, as the
    target serves at batch 1."""
    model.eval()
    agree = torch.zeros(depth)
    kl = ce = n = 0.0
    for i in range(0, len(windows), 8):
        for off in range(depth):
            s, tl, y = feature_batch(model, teacher, windows[i : i + 8], depth, off)
            agree += (s.argmax(-1) == tl.argmax(-1)).float().sum(0)
            kl += distill_loss(s, tl).item() * y.numel()
            ce += F.cross_entropy(s.float().flatten(0, 1), y.flatten(), reduction="sum").item()
            n += y.numel()
    model.train()
    by_depth = (agree / (n / depth)).tolist()
    return {
        "val_ce": ce / n,
        "val_kl": kl / n,
        "val_greedy_agreement": by_depth[0],
        "val_greedy_agreement_mean_depth": sum(by_depth) / depth,
        "val_greedy_agreement_by_depth": [round(a, 4) for a in by_depth],
    }


def feat_config(c: TrainConfig, d_feature: int):
    from real.feature_drafter import FeatureConvConfig

    return FeatureConvConfig(
        vocab_size=c.vocab_size, dilation_base=c.conv_dilation_base, d_feature=d_feature
    )


def feature_student(c: TrainConfig, d_feature: int, warm=None):
    """The feature drafter to train: ``warm``'s weights where it has them (a token-only conv
    drafter); with ``feat_features`` off its feature projection is frozen at zero."""
    from real.feature_drafter import FeatureConvDrafter

    model = FeatureConvDrafter(feat_config(c, d_feature))
    if warm is not None:
        model.load_state_dict(warm.state_dict(), strict=False)
    if not c.feat_features:
        model.feat_proj.weight.requires_grad_(False)
    return model


def train_feature_drafter(work: Path, ckpt_dir: Path, c: TrainConfig, command: str) -> dict:
    """Distil the feature conv drafter from the shipped target (``ckpt_dir``), warm-started
    from the shipped conv drafter, and add it to ``ckpt_dir``'s manifest as ``drafter_feat``."""
    from functools import partial

    from real.store import add_model, load_bundle

    torch.set_num_threads(c.threads)
    work.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(ckpt_dir, names=("target", "drafter_conv"))
    teacher = bundle.models["target"].eval()  # bf16 weights, held in fp32
    arrays = token_arrays(work, bundle.tokenizer)
    train_tokens = np.concatenate([arrays["code_train"], arrays["prose_train"]])
    dw = val_windows(arrays, c, c.drafter_seq_len)
    torch.manual_seed(c.seed + 1 + STAGES.index("drafter_feat"))
    warm = bundle.models["drafter_conv"].float() if c.feat_warm_start else None
    model = feature_student(c, teacher.cfg.d_model, warm)
    res = train_stage(
        "drafter_feat",
        model,
        train_tokens,
        dw,
        work,
        c,
        steps=c.feat_steps,
        lr=c.feat_lr,
        bsz=c.drafter_batch,
        seq=c.drafter_seq_len,
        bf16=False,
        teacher=teacher,
        loss_fn=partial(
            feature_loss,
            depth=c.feat_depth,
            decay=c.feat_depth_decay,
            teacher_bf16=c.feat_teacher_bf16,
        ),
        # scored against the bf16 teacher whatever it trained on: the target as it serves
        eval_fn=partial(evaluate_feature, depth=c.feat_depth),
    )
    return add_model(ckpt_dir, "drafter_feat", "featconv", model.cfg, model, res, command)
