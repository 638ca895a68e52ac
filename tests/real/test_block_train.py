"""The block drafter's distillation data and calibration (real.block_train)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from control.errors import DSparkError
from real.block_drafter import BlockConfig, BlockDrafterModel, target_layer_states
from real.block_train import (
    corpus_data,
    cut_batch,
    ece,
    fit_calibration,
    generate,
    losses,
    teacher_logits,
    trimmed,
)
from tests.real.conftest import V, tiny_target


def test_generated_data_is_the_greedy_path_with_aligned_states():
    """Tokens are the prompt's last C tokens then the target's greedy continuation; entry i of
    the states is the teacher-forced output of layers (1, 2) at the position before token i;
    a cut's labels are the B tokens after its C entries."""
    target = tiny_target().float()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, V, (3, 10), generator=g)
    C, gen = 4, 12
    toks, feats = generate(target, prompts, gen, (1, 2), C)
    assert toks.shape == (3, C + gen) and feats.shape == (3, C + gen, 64)
    full = prompts.clone()
    for _ in range(gen):  # greedy, teacher-forced, one token at a time
        full = torch.cat([full, target(full)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(toks, full[:, 10 - C :])
    want = target_layer_states(target, full, (1, 2))[:, 10 - C - 1 : 10 + gen - 1]
    assert torch.allclose(feats.float(), want, rtol=2e-3, atol=1e-2)  # fp16 storage
    t, f, y, prev = cut_batch((toks, feats), torch.tensor([1, 2]), torch.tensor([0, 5]), C, 3)
    assert torch.equal(t[1], toks[2, 5:9]) and torch.equal(y[1], toks[2, 9:12])
    assert torch.equal(prev[1], toks[2, 8:11])  # the last entry, then the labels before
    assert torch.equal(y[0], full[1, 10:13])  # the cut at the prompt's end: the first 3 outputs
    assert torch.equal(f[1], feats[2, 5:9].float())


def test_trimmed_cuts_a_longer_context_and_refuses_a_shorter(tmp_path):
    toks, feats = torch.arange(20).view(2, 10), torch.zeros(2, 10, 3)
    t, f = trimmed((toks, feats), 2, 6, tmp_path)
    assert torch.equal(t, toks[:, 2:]) and f.shape == (2, 8, 3)
    with pytest.raises(DSparkError, match="holds 4 context positions before 6 generated"):
        trimmed((toks, feats), 5, 6, tmp_path)


def test_ece_and_platt_fit():
    conf = np.array([0.05, 0.15, 0.95, 0.95])
    hit = np.array([0.0, 1.0, 1.0, 0.0])
    # bins 0, 1, 9: |0.05 - 0| / 4 + |0.15 - 1| / 4 + 2 |0.95 - 0.5| / 4
    assert ece(conf, hit) == pytest.approx((0.05 + 0.85 + 0.9) / 4)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(20000, 2, generator=g)
    p = torch.sigmoid(torch.stack([2.0 * z[:, 0] - 1.0, 0.5 * z[:, 1] + 0.3], 1))
    y = torch.bernoulli(p, generator=g)
    ab = fit_calibration(z, y)
    assert ab[:, 0].tolist() == pytest.approx([2.0, -1.0], abs=0.1)
    assert ab[:, 1].tolist() == pytest.approx([0.5, 0.3], abs=0.1)


def test_teacher_forced_windows_are_aligned():
    """Token i is position 1 + i of the window, state i the layers' output at position i, label
    i the target's argmax for position 1 + i given the window before it; a cut's labels are
    those, its entries the text."""
    target = tiny_target().float()
    tokens = np.random.default_rng(0).integers(0, V, 500)
    toks, feats, labels = corpus_data(target, tokens, 3, 20, (1,), [1], chunk=2)
    assert toks.shape == labels.shape == (3, 19) and feats.shape == (3, 19, 32)
    start = np.random.default_rng([1]).integers(0, 480, size=3)[1]
    w = torch.from_numpy(tokens[start : start + 20]).long()[None]
    assert torch.equal(toks[1], w[0, 1:])
    assert torch.equal(labels[1], target(w)[0, :-1].argmax(-1))
    h = target_layer_states(target, w, (1,))[0, :-1]
    assert torch.allclose(feats[1].float(), h, rtol=2e-3, atol=1e-2)
    t, _, y, prev = cut_batch((toks, feats, labels), torch.tensor([1]), torch.tensor([3]), 4, 2)
    assert torch.equal(t[0], w[0, 4:8]) and torch.equal(y[0], labels[1, 7:9])
    assert torch.equal(prev[0], w[0, 7:9])  # the text before each label, not the target's


def test_teacher_logits_are_the_targets_own_and_the_kl_share_mixes_the_loss():
    """The target's distribution for a label is read from the stored last-layer state before
    it (its argmax is the greedy label); kl_share = 1 is the depth-weighted KL from it, 0 the
    cross-entropy; a drafter that does not read the last layer cannot distil it."""
    target = tiny_target().float()
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(0, V, (2, 10), generator=g)
    C, B, gen = 4, 3, 10
    toks, feats = generate(target, prompts, gen, (1, 2), C)
    teach = teacher_logits(target, 32, (1, 2))
    rows, cuts = torch.tensor([0, 1, 1]), torch.tensor([0, 2, 5])
    t, f, y, prev, z = cut_batch((toks, feats.float()), rows, cuts, C, B, teach)
    assert torch.equal(z.argmax(-1), y)  # greedy labels: the teacher's argmax
    full = torch.cat([prompts, toks[:, C:]], 1)
    want = target(full)[:, 10 - 1 : 10 + gen - 1]  # logits for tokens 10 .. 10+gen-1
    assert torch.allclose(z[0], want[0, 0:B], atol=5e-3)  # from fp16-stored states
    torch.manual_seed(0)
    model = BlockDrafterModel(
        BlockConfig(
            vocab_size=V,
            d_model=16,
            n_heads=2,
            d_ff=32,
            block_size=B,
            context=C,
            d_feature=32,
            feature_layers=(1, 2),
            d_conf=4,
        )
    )
    ce, _ = losses(model, t, f, y, prev, 0.5, None, z, 0.0)
    kl, _ = losses(model, t, f, y, prev, 0.5, None, z, 1.0)
    mid, _ = losses(model, t, f, y, prev, 0.5, None, z, 0.25)
    assert mid.item() == pytest.approx(0.75 * ce.item() + 0.25 * kl.item(), rel=1e-5)
    ones = torch.ones_like(t, dtype=torch.bool)
    logits, _ = model(t, f, ones, ones)
    lq, lp = torch.log_softmax(logits, -1), torch.log_softmax(z, -1)
    per = (lp.exp() * (lp - lq)).sum(-1).mean(0)  # KL(target || drafter) per position
    w = 0.5 ** torch.arange(B, dtype=torch.float32)
    assert kl.item() == pytest.approx(float((per * w).sum().detach() / w.sum()), rel=1e-4)
    with pytest.raises(DSparkError, match=r"needs the target's last layer \(2\) among"):
        teacher_logits(target, 32, (1,))
