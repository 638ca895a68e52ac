"""The feature-conditioned conv drafter (``real.feature_drafter``): causality, incremental =
teacher-forced, the engine's hidden-state hook, greedy equality, training windows, manifest."""

import json

import pytest
import torch

from control import make_controller
from real import checkpoint as ck
from real.drafters import HybridDrafter, NgramDrafter
from real.engine import Engine
from real.feature_drafter import FeatureConvConfig, FeatureConvDrafter, FeatureDrafter
from real.models import Segments
from tests.real.conftest import CFG, V, prompt, tiny_target

D_TARGET = 32  # tiny_target's d_model


def tiny_feat(seed: int = 3) -> FeatureConvDrafter:
    torch.manual_seed(seed)
    m = FeatureConvDrafter(
        FeatureConvConfig(
            vocab_size=V, d_model=16, n_blocks=2, kernel=4, d_hidden=32, d_feature=D_TARGET
        )
    )
    with torch.no_grad():  # the feature path is zero at init: give it weight
        m.feat_proj.weight.normal_(0.0, 0.3)
        m.missing.normal_(0.0, 0.3)
    return m.double().eval()


def feat_engine(hybrid: bool = False) -> Engine:
    length = CFG.max_len + CFG.k_max + 1
    d = FeatureDrafter(tiny_feat(), length, torch.float64, "cpu")
    if hybrid:
        d = HybridDrafter(d, NgramDrafter(vocab_size=V), min_match=1)
    return Engine(tiny_target(), d, CFG)


def test_receptive_field_and_causality():
    m = tiny_feat()
    assert m.receptive_field() == 1 + 2 * 3
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (2, 20), generator=g)
    feats = torch.randn(2, 20, D_TARGET, generator=g, dtype=torch.float64)
    present = torch.rand(2, 20, generator=g) < 0.5
    out = m(ids, feats, present)
    assert out.shape == (2, 20, V)
    t = 11
    ids2, feats2, present2 = ids.clone(), feats.clone(), present.clone()
    ids2[:, t + 1 :] = (ids2[:, t + 1 :] + 1) % V
    feats2[:, t + 1 :] += 1.0
    present2[:, t + 1 :] = ~present2[:, t + 1 :]
    out2 = m(ids2, feats2, present2)
    assert torch.equal(out[:, : t + 1], out2[:, : t + 1])
    assert not torch.allclose(out[:, t + 1 :], out2[:, t + 1 :])
    # the feature matters where present (and the missing vector where not)
    feats3 = feats.clone()
    feats3[:, 5] += 1.0
    out3 = m(ids, feats3, present)
    assert torch.allclose(out3[:, :5], out[:, :5])
    assert torch.allclose(out3[~present[:, 5], 5:], out[~present[:, 5], 5:])
    assert not torch.allclose(out3[present[:, 5], 5], out[present[:, 5], 5])


def test_incremental_steps_equal_teacher_forced_forward():
    """Packed steps with the known-feature prefix set reproduce ``forward`` with the same
    presence pattern (features known below ``known``, missing from there on)."""
    m = tiny_feat()
    g = torch.Generator().manual_seed(1)
    T, known = 18, 9
    ids = torch.randint(0, V, (T,), generator=g)
    h = torch.randn(T, D_TARGET, generator=g, dtype=torch.float64)  # hidden at each position
    feats = torch.cat([torch.zeros(1, D_TARGET, dtype=torch.float64), h[:-1]])[None]
    pos = torch.arange(T)
    present = ((pos >= 1) & (pos - 1 < known))[None]
    want = m(ids[None], feats, present)[0]
    st = m.new_state(32, torch.float64, "cpu", slots=2)
    st["feat"][1, :T] = h
    st["known"][1] = known
    got = [m.step_packed(ids[:5], Segments.one(1, 0, 5), st)]
    for p in range(5, T):
        got.append(m.step_packed(ids[p : p + 1], Segments.one(1, p, 1), st))
    assert torch.allclose(torch.cat(got), want, atol=1e-10)


@pytest.mark.parametrize("hybrid", [False, True])
def test_greedy_equality_in_the_engine(hybrid):
    eng = feat_engine(hybrid)
    for s in range(2):
        p = prompt(s)
        ref = eng.greedy_reference(p, 40)
        for k in (1, 2, 4, 8):
            g = eng.generate(p, 40, make_controller("fixed", {"k": k}))
            assert g.tokens == ref, (hybrid, k)
            assert sum(r.emitted for r in g.records) == 40


def test_engine_hands_the_committed_hidden_states():
    """After a run, the drafter's features of every committed position but the last equal the
    target's own hidden states of the committed sequence (teacher-forced, float64)."""
    eng = feat_engine(hybrid=True)  # lookup rounds get accepted: a prefix moves forward
    p = prompt(0) * 2
    g = eng.generate(p, 40, make_controller("fixed", {"k": 4}))
    assert any(r.accepted > 0 for r in g.records)
    assert any(r.accepted < r.drafted for r in g.records)  # rejected positions were verified
    seq = torch.tensor(p + g.tokens)[None]
    h = eng.target.hidden(seq)[0]
    L = seq.shape[1]
    feat = eng.drafter.state["feat"][0]
    assert torch.allclose(feat[: L - 1], h[: L - 1], atol=1e-9)


def test_drafted_positions_are_refed_after_acceptance():
    """Tokens drafted without features are not kept in the cache even when all are accepted
    (a token-only drafter keeps the ones it fed: all but the last drafted token)."""
    from real.drafters import ModelDrafter
    from real.sampling import SamplingParams

    p = prompt(2)
    L = len(p)
    for cls, want in ((FeatureDrafter, L), (ModelDrafter, L + 3)):
        d = cls(tiny_feat(), 64, torch.float64, "cpu")
        seq = torch.zeros(1, 64, dtype=torch.long)
        seq[0, :L] = torch.tensor(p)
        n, confs, _ = d.propose(seq, L, 4, 0.0, SamplingParams(0.0, 0, 1.0), None)
        assert n == 4 and len(confs) == 4
        d.accept(L, n, n)
        assert d.valid == want, cls


@pytest.mark.parametrize("teacher_bf16", [True, False])
def test_training_windows_match_the_decode_pattern(teacher_bf16):
    """``real.train.feature_batch``: student logits equal the drafter's own forward on the full
    sequence with features present up to the cut, at every depth; the teacher's features and
    logits come from a forward in the dtype asked for (bf16 autocast or float32)."""
    from real.train import feature_batch

    m = tiny_feat().float()
    teacher = tiny_target().float()
    g = torch.Generator().manual_seed(4)
    w = torch.randint(0, V, (2, 41), generator=g)
    depth, off = 3, 1
    s, tl, y = feature_batch(m, teacher, w, depth, off, teacher_bf16)
    R = m.receptive_field()
    x = w[:, :-1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=teacher_bf16):
        h = teacher.hidden(x)
        logits = teacher.logits(h)
    feats = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1).float()
    pos = torch.arange(x.shape[1])
    cuts = list(range(R - 1 + off, x.shape[1] - depth + 1, depth))
    assert s.shape == (2 * len(cuts), depth, V) and tl.shape == s.shape
    for ci, c in enumerate(cuts[:3]):
        present = ((pos >= 1) & (pos <= c))[None].expand(2, -1)
        full = m(x, feats, present)
        for b in range(2):
            got = s[b * len(cuts) + ci]
            assert torch.allclose(got, full[b, c : c + depth], atol=1e-4)
            assert torch.equal(tl[b * len(cuts) + ci], logits[b, c : c + depth])
            assert torch.equal(y[b * len(cuts) + ci], w[b, c + 1 : c + 1 + depth])


def test_manifest_round_trip(tmp_path, monkeypatch):
    from real import corpus, store
    from real.models import TransformerConfig
    from real.store import build_model
    from real.train import TrainConfig
    from tests.real.test_checkpoints import _Tok

    monkeypatch.setattr(corpus, "corpus_hash", lambda root=None: "test")
    tcfg = TransformerConfig(
        vocab_size=300, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64
    )
    torch.manual_seed(0)
    specs = {"target": ("transformer", tcfg, build_model("transformer", tcfg))}
    res = {"step": 3, "seconds": 1.0, "losses": [1.0], "eval": {"code": {"x": 0.5}}}
    store.export_checkpoints(tmp_path, _Tok(), specs, {"target": res}, TrainConfig(), "t")
    fcfg = FeatureConvConfig(vocab_size=300, d_model=8, n_blocks=1, kernel=3, d_hidden=8)
    model = build_model("featconv", fcfg)
    with torch.no_grad():
        model.feat_proj.weight.normal_()
    store.add_model(tmp_path, "drafter_feat", "featconv", fcfg, model, res, "cmd")
    m = json.loads((tmp_path / "manifest.json").read_text())
    e = m["models"]["drafter_feat"]
    assert e["kind"] == "featconv" and e["dtype"] == "float16" and e["command"] == "cmd"
    assert e["sha256"] == ck.sha256_file(tmp_path / "drafter_feat.safetensors")
    assert e["params"] == sum(p.numel() for p in model.parameters())
    assert e["validation"] == {"code": {"x": 0.5}} and "target" in m["models"]
    got = store.load_model("drafter_feat", tmp_path).state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(got[k], v.to(torch.float16).float()), k


def test_shipped_feature_drafter_is_exact_and_small():
    """The shipped ``drafter_feat``: <= 1.5 M parameters, its manifest entry matches the file,
    and the engine with it is token-identical to target-only greedy decoding in float32."""
    from real.bench import held_out_prompts
    from real.engine import EngineConfig
    from real.runtime import build_engine
    from real.store import CHECKPOINT_DIR, read_manifest

    e = read_manifest()["models"]["drafter_feat"]
    assert e["kind"] == "featconv" and e["params"] <= 1_500_000
    assert e["sha256"] == ck.sha256_file(CHECKPOINT_DIR / e["file"])
    eng = build_engine(
        EngineConfig(target_dtype="float32", drafter="ngram+feat", stop_at_eot=False, max_len=256)
    )
    assert isinstance(eng.drafter.model, FeatureDrafter)
    p = held_out_prompts(eng.tokenizer, "code", 1, 64)[0]
    ref = eng.greedy_reference(p, 32)
    g = eng.generate(p, 32, make_controller("fixed", {"k": 4}))
    assert g.tokens == ref
    assert sum(r.accepted for r in g.records) > 0


@pytest.mark.parametrize("teacher_bf16", [True, False])
def test_feature_loss_is_the_depth_weighted_kl(teacher_bf16):
    """``real.train.feature_loss``: KL(teacher || student) per depth, weighted by decay^(j-1) and
    normalised, on the windows of cut offset ``step % depth`` and the teacher dtype asked for."""
    from real.train import feature_batch, feature_loss

    m, teacher = tiny_feat().float(), tiny_target().float()
    w = torch.randint(0, V, (2, 41), generator=torch.Generator().manual_seed(5))
    s, tl, _ = feature_batch(m, teacher, w, 3, 1, teacher_bf16)
    lp, lq = torch.log_softmax(tl.float(), -1), torch.log_softmax(s.float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean(0)
    want = (kl[0] + 0.5 * kl[1] + 0.25 * kl[2]) / 1.75
    got = feature_loss(m, teacher, w, step=4, depth=3, decay=0.5, teacher_bf16=teacher_bf16)
    assert torch.allclose(got, want, atol=1e-6)


def test_evaluate_feature_counts_agreement_per_depth_against_the_bf16_teacher():
    from real.train import evaluate_feature, feature_batch

    m, teacher = tiny_feat().float(), tiny_target().float()
    win = torch.randint(0, V, (3, 41), generator=torch.Generator().manual_seed(6))
    ev = evaluate_feature(m, win, teacher, depth=2)
    hits, n = torch.zeros(2), 0
    for off in range(2):
        s, tl, _ = feature_batch(m, teacher, win, 2, off)  # bf16 teacher
        hits += (s.argmax(-1) == tl.argmax(-1)).float().sum(0)
        n += s.shape[0]
    assert ev["val_greedy_agreement_by_depth"] == [round(x, 4) for x in (hits / n).tolist()]
    assert ev["val_greedy_agreement"] == pytest.approx((hits[0] / n).item())


@pytest.mark.parametrize("features", [True, False])
def test_feature_student_trains_the_feature_path_only_when_asked(features):
    """``feat_features`` off (the ablation): the projection of the target's hidden states stays
    zero through training while the rest learns; on, it moves off its zero start."""
    from real.train import TrainConfig, _make_opt, feature_loss, feature_student

    teacher = tiny_target().float()
    c = TrainConfig(vocab_size=V, feat_features=features)
    m = feature_student(c, D_TARGET)
    assert torch.count_nonzero(m.feat_proj.weight) == 0  # zero at init: the warm start's output
    before = m.blocks[0].proj_in.weight.detach().clone()
    opt = _make_opt(m, 0.1, 1e-3)
    w = torch.randint(0, V, (2, 41), generator=torch.Generator().manual_seed(7))
    for step in range(2):
        opt.zero_grad()
        feature_loss(m, teacher, w, step, depth=3, decay=0.5, teacher_bf16=False).backward()
        opt.step()
    assert (torch.count_nonzero(m.feat_proj.weight) > 0) == features
    assert not torch.equal(m.blocks[0].proj_in.weight, before)


@pytest.mark.parametrize(
    "name, features", [("train_feat.toml", True), ("train_feat_nofeat.toml", False)]
)
def test_the_feature_training_configs_parse(name, features):
    from pathlib import Path

    from control.configio import from_mapping, read_toml
    from real.train import TrainConfig

    path = Path(__file__).resolve().parents[2] / "configs" / name
    c = from_mapping(TrainConfig, read_toml(path)["train"], source=str(path), prefix="train")
    assert (c.feat_teacher_bf16, c.feat_features) == (False, features)
