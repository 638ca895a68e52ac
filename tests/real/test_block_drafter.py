"""The block drafter (real.block_drafter): one forward a round, lossless verification, the
confidence head's predictions as the round's confidences, the target's layers handed over."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from control import make_controller
from control.types import Decision
from real.block_drafter import BlockConfig, BlockDrafter, BlockDrafterModel, target_layer_states
from real.engine import Engine, Request, draft_steps
from real.quality import FixedDecision
from real.sampling import SamplingParams
from tests.real.conftest import CFG, V, prompt, tiny_target

LENGTH = CFG.max_len + CFG.k_max + 1


def tiny_block(
    block: int = 5, layers=(1, 2), seed: int = 4, adjacent: int = 0
) -> BlockDrafterModel:
    """A random block drafter; with ``adjacent``, its chain is live (not the zero start)."""
    torch.manual_seed(seed)
    cfg = BlockConfig(
        vocab_size=V,
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_ff=32,
        block_size=block,
        context=4,
        d_feature=32,
        feature_layers=layers,
        d_conf=8,
        adjacent=adjacent,
    )
    model = BlockDrafterModel(cfg)
    if adjacent:
        with torch.no_grad():
            model.adj_o.weight.normal_(0.0, 0.5)
    return model.double().eval()


class OracleBlock(BlockDrafter):
    """A block drafter whose first ``right`` slots put their mass on the target's greedy
    continuation and the others on a wrong token; confidences 0.9, 0.8, ... (as the head's
    logits): exact acceptance."""

    def __init__(self, target, right: int, slots: int = 1, block: int = 5) -> None:
        super().__init__(tiny_block(block), LENGTH, torch.float64, "cpu", slots)
        self.target, self.right = target, right
        self.conf = torch.tensor([0.9 - 0.1 * j for j in range(block)], dtype=torch.float64)

    def block_logits(self, seq, slots, Ls, heads=None):
        B = self.block_size
        logits = torch.full((len(slots), B, V), -10.0, dtype=torch.float64)
        for r, (s, L) in enumerate(zip(slots, Ls)):
            ids = seq[s, :L].tolist()
            for j in range(B):
                nxt = int(self.target(torch.tensor([ids]))[0, -1].argmax())
                logits[r, j, nxt if j < self.right else (nxt + 1) % V] = 10.0
                ids.append(nxt)
        H = B if heads is None else heads
        return logits[:, :H], torch.logit(self.conf[:H]).expand(len(slots), -1)


@pytest.mark.parametrize("right,k,expect", [(2, 4, 2), (5, 3, 3), (0, 4, 0), (5, 9, 5)])
def test_exact_acceptance_and_greedy_equality(right, k, expect):
    """Every round accepts exactly min(right, k, B) tokens; output equals target-only greedy;
    the round's confidences are the head's (the first ``drafted``); one drafter forward."""
    target = tiny_target()
    eng = Engine(target, OracleBlock(target, right), CFG)
    p = prompt(1)
    ref = eng.greedy_reference(p, 40)
    eng.round_log = []
    g = eng.generate(p, 40, make_controller("fixed", {"k": k}))
    assert g.tokens == ref
    assert sum(r.k == k for r in g.records) >= 4
    for r in g.records:  # the engine cuts k to the tokens left - 1, the drafter to B = 5
        kk = min(r.k, len(p) + 40 - r.context_tokens - 1, 5)
        assert r.drafted == kk and r.accepted == min(expect, kk)
        assert r.confidences == pytest.approx([0.9 - 0.1 * j for j in range(r.drafted)])
    assert {s.draft_steps for s in eng.round_log if s.drafting} == {1}


def test_greedy_equality_batch_4():
    """Batch 4 (continuous batching, 6 requests) equals target-only greedy per request, with
    a drafter that is right for 3 slots."""
    target = tiny_target()
    cfg = dataclasses.replace(CFG, slots=4)
    eng = Engine(target, OracleBlock(target, 3, slots=4), cfg)
    reqs = [Request(i, prompt(10 + i), 30, make_controller("fixed", {"k": 4})) for i in range(6)]
    out = eng.run_batch(reqs)
    for s, r in zip(out, reqs):
        assert s.tokens == eng.greedy_reference(r.prompt, 30)
        end = len(r.prompt) + 30
        assert all(x.accepted == min(3, end - x.context_tokens - 1) for x in s.records)


@pytest.mark.parametrize("adjacent", [0, 8])
def test_untrained_drafter_greedy_equality_and_features(adjacent):
    """A real (random) block drafter, with and without the adjacent-token chain: output equals
    target-only at batch 1 and 4; at batch 1 the target states it holds are the projection of
    the teacher-forced outputs of its layers (1, 2) at every committed position but the
    last."""
    target = tiny_target()
    for slots in (4, 1):
        cfg = dataclasses.replace(CFG, slots=slots)
        d = BlockDrafter(tiny_block(adjacent=adjacent), LENGTH, torch.float64, "cpu", slots)
        eng = Engine(target, d, cfg)
        reqs = [
            Request(i, prompt(20 + i), 25, make_controller("fixed", {"k": 5}))
            for i in range(slots + 1)
        ]
        for s in eng.run_batch(reqs):
            assert s.tokens == eng.greedy_reference(s.req.prompt, 25)
    g = eng.generate(prompt(30), 25, make_controller("fixed", {"k": 5}))
    ids = torch.tensor([prompt(30) + g.tokens])
    n = ids.shape[1] - 1
    want = d.model.features(target_layer_states(target, ids, (1, 2))[0, :n])
    assert torch.allclose(d.state["feat"][0, :n], want, atol=1e-9)


def test_tau_stop_before_low_confidence_and_draft_steps():
    """τ cuts the block before the first slot whose confidence is below it (0.9, 0.8, 0.7, ..:
    τ = 0.75 keeps 2); a block drafter's round counts one forward."""
    target = tiny_target()
    eng = Engine(target, OracleBlock(target, 5), CFG)
    g = eng.generate(prompt(2), 20, FixedDecision(Decision(k=5, tau=0.75)))
    assert all(r.drafted == min(2, 12 + 20 - r.context_tokens - 1) for r in g.records)
    assert draft_steps([5, 0, 3], [2, 0, 0], block=7) == 1
    assert draft_steps([0, 0], [0, 0], block=7) == 0


def test_survival_stop_cuts_the_block_at_the_running_product():
    """The survival stop keeps a slot while the running product of the head's confidences
    (0.9, 0.72, 0.504, 0.353, ..) is at or above it: 0.5 keeps 3 of 5, 0.8 one; each round
    reports the kept slots' confidences, one forward, and the output is target-only's."""
    target = tiny_target()
    for survival, keep in ((0.5, 3), (0.8, 1)):
        eng = Engine(target, OracleBlock(target, 5), CFG)
        eng.round_log = []
        p = prompt(2)
        g = eng.generate(p, 20, FixedDecision(Decision(k=5, survival=survival)))
        assert g.tokens == eng.greedy_reference(p, 20)
        assert all(r.drafted == min(keep, 12 + 20 - r.context_tokens - 1) for r in g.records)
        assert all(r.survival == survival and len(r.confidences) == r.drafted for r in g.records)
        assert {s.draft_steps for s in eng.round_log if s.drafting} == {1}


def test_sampling_q_rows_are_the_drawn_distributions():
    """Under sampling each proposal's q rows are the processed distributions of the block's
    slots (what verification divides by), and the drawn tokens follow them."""
    torch.manual_seed(0)
    target = tiny_target()
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu")
    eng = Engine(target, d, dataclasses.replace(CFG, temperature=1.3))
    p = prompt(3)
    eng.seq[0, : len(p)] = torch.tensor(p)
    eng.prefill_rows([0], [0], [len(p) - 1])
    sp = SamplingParams(temperature=1.3)
    logits, _ = d.block(eng.seq, [0], [len(p)], heads=3)
    from real.sampling import probs

    counts = torch.zeros(V, dtype=torch.float64)
    n = 3000
    gen = torch.Generator().manual_seed(5)
    for _ in range(n):
        k, _, q = d.propose_batch(eng.seq, [0], [len(p)], [3], [0.0], sp, [gen])[0]
        assert k == 3 and torch.equal(q, probs(logits, sp)[0, :3])
        counts[int(eng.seq[0, len(p) + 1])] += 1
    q1 = probs(logits, sp)[0, 1]
    assert (counts / n - q1).abs().max() < 4 * (q1 * (1 - q1) / n).sqrt().max() + 1e-3


def _prefilled(d: BlockDrafter, temperature: float | None = None):
    """An engine over the tiny target with drafter ``d``, prompt 3 prefilled."""
    target = tiny_target()
    cfg = CFG if temperature is None else dataclasses.replace(CFG, temperature=temperature)
    eng = Engine(target, d, cfg)
    p = prompt(3)
    eng.seq[0, : len(p)] = torch.tensor(p)
    eng.prefill_rows([0], [0], [len(p) - 1])
    return eng, p


def test_adjacent_chain_reads_the_token_before_each_slot():
    """The greedy chain (the engine's path) equals teacher forcing on its own argmax tokens
    (the training path) bit for bit; feeding another token before slot 3 changes slots 3 on
    and leaves slots 1-2 as they were."""
    d = BlockDrafter(tiny_block(adjacent=8), LENGTH, torch.float64, "cpu")
    eng, p = _prefilled(d)
    inputs = d._inputs(eng.seq, [0], [len(p)])
    logits, conf = d.model(*inputs, projected=True)
    prev = torch.cat([inputs[0][:, -1:], logits.argmax(-1)[:, :-1]], 1)
    forced, fconf = d.model(*inputs, projected=True, prev=prev)
    assert torch.equal(forced, logits) and torch.equal(fconf, conf)
    other = prev.clone()
    other[0, 2] = (other[0, 2] + 1) % V
    moved, _ = d.model(*inputs, projected=True, prev=other)
    assert torch.equal(moved[:, :2], logits[:, :2])
    assert all(not torch.allclose(moved[0, j], logits[0, j]) for j in range(2, 5))


def test_sampled_chain_q_rows_follow_the_drawn_tokens():
    """Under sampling with the chain, each proposal's q row j is the processed distribution of
    slot j given the tokens drawn before it (teacher forcing on them), the rows verification
    divides by; slot 2's token follows that conditional distribution (given slot 1's most
    frequent draw)."""
    from real.sampling import probs

    model = tiny_block(adjacent=8)
    with torch.no_grad():  # sharper than the default init: slot 1 has a frequent token
        model.embed_tokens.weight.normal_(0.0, 1.0)
    d = BlockDrafter(model, LENGTH, torch.float64, "cpu")
    eng, p = _prefilled(d, 1.0)
    sp, L = SamplingParams(temperature=1.0), len(p)
    inputs = d._inputs(eng.seq, [0], [L])
    gen = torch.Generator().manual_seed(5)
    pairs: dict[int, list[int]] = {}
    for i in range(2500):
        k, _, q = d.propose_batch(eng.seq, [0], [L], [3], [0.0], sp, [gen])[0]
        drawn = eng.seq[0, L : L + 3]
        if i < 20:
            prev = torch.cat([inputs[0][0, -1:], drawn[:2]])[None]
            forced, _ = d.model(*inputs, heads=3, projected=True, prev=prev)
            assert k == 3 and torch.allclose(q, probs(forced, sp)[0], atol=1e-12)
        pairs.setdefault(int(drawn[0]), []).append(int(drawn[1]))
    t1, seen = max(pairs.items(), key=lambda kv: len(kv[1]))
    prev = torch.tensor([[int(inputs[0][0, -1]), t1]])
    q2 = probs(d.model(*inputs, heads=2, projected=True, prev=prev)[0], sp)[0, 1]
    freq = torch.bincount(torch.tensor(seen), minlength=V).double() / len(seen)
    assert len(seen) > 300
    assert (freq - q2).abs().max() < 4 * (q2 * (1 - q2) / len(seen)).sqrt().max() + 1e-3


def test_sampled_chain_rows_draw_as_they_would_alone():
    """Three rows drafted together under sampling (k = 4, 2, 3; τ = 0) draw the tokens and q
    rows each draws alone with the same generator state: the chain runs for the longest k,
    a row stops drawing at its own k, and no row's draws move another's."""
    model = tiny_block(adjacent=8)
    d = BlockDrafter(model, LENGTH, torch.float64, "cpu", slots=3)
    eng = Engine(tiny_target(), d, dataclasses.replace(CFG, slots=3, temperature=1.3))
    ps = [prompt(5), prompt(6), prompt(7)]
    for s, p in enumerate(ps):
        eng.seq[s, : len(p)] = torch.tensor(p)
    eng.prefill_rows([0, 1, 2], [0, 0, 0], [len(p) - 1 for p in ps])
    sp, Ls, ks = SamplingParams(temperature=1.3), [len(p) for p in ps], [4, 2, 3]
    gens = [torch.Generator().manual_seed(10 + s) for s in range(3)]
    together = d.propose_batch(eng.seq, [0, 1, 2], Ls, ks, [0.0] * 3, sp, gens)
    drawn = [eng.seq[s, Ls[s] : Ls[s] + ks[s]].clone() for s in range(3)]
    for s in range(3):
        g = torch.Generator().manual_seed(10 + s)
        n, cf, q = d.propose_batch(eng.seq, [s], [Ls[s]], [ks[s]], [0.0], sp, [g])[0]
        assert n == together[s][0] == ks[s]
        assert torch.equal(eng.seq[s, Ls[s] : Ls[s] + n], drawn[s])
        assert torch.allclose(q, together[s][2], atol=1e-12)
        assert cf == pytest.approx(together[s][1], abs=1e-12)
        assert torch.equal(g.get_state(), gens[s].get_state())  # as many draws, no more


@pytest.mark.parametrize(
    ("tau", "recalibrate", "adjacent", "survival"),
    [
        (0.0, False, 0, 0.0),
        (0.5, False, 0, 0.0),
        (0.2, True, 0, 0.0),
        (0.2, "refined", 0, 0.0),
        (0.0, False, 8, 0.0),
        (0.5, False, 8, 0.0),
        (0.0, False, 8, 0.3),
    ],
)
def test_sampling_stays_exact(tau, recalibrate, adjacent, survival):
    """Speculative sampling with the block drafter (B = 4, k = 4) emits tokens distributed as
    the target's: 1200 tokens at temperature 1.5, each token's randomised PIT under the
    target's exact conditional distribution is uniform (χ² over 5 bins below the p = 0.001
    critical value, as tests/real/test_tau_exact.py). Rounds that accept 2 or more tokens
    occur, so later block positions are verified; with τ = 0.5 the head's predictions cut the
    blocks (at positions 2 and 3 here); recalibrated by the engine round by round (τ = 0.2), the
    τ stop reads a map fitted on earlier rounds' outcomes (this random head turns out
    anti-correlated with acceptance, and the map's slope falls below 0); with the map's
    by-range and by-request refinements as well (the default: here ~0.2 of the verified
    slots are accepted, the refinements bring the confidences down to τ within a few rounds and
    the stop then keeps most rounds from drafting); with the
    adjacent-token chain (drawn slot by slot, the τ stop read before each draw) as well; and
    with the survival stop (survival 0.3), which cuts the drawn block where the running product
    of the head's confidences falls below it."""
    from real.block_recalibration import OnlineCalibration, RecalibrationConfig
    from tests.real import test_tau_exact as te

    tgt, _ = te._pair("tf")
    torch.manual_seed(7)
    cfg = BlockConfig(
        vocab_size=te.V,
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_ff=32,
        block_size=4,
        context=4,
        d_feature=16,
        feature_layers=(1,),
        d_conf=8,
        adjacent=adjacent,
    )
    model = BlockDrafterModel(cfg)
    with torch.no_grad():  # a sharper, varied drafter and head than the default init
        model.embed_tokens.weight.normal_(0.0, 1.0)
        if adjacent:
            model.adj_o.weight.normal_(0.0, 0.5)
        model.conf_out.weight.normal_(0.0, 1.0)
        model.calib[1].copy_(torch.tensor([4.0, 1.0, 0.0, -1.0]))  # confident early, less later
    rc = None
    if recalibrate == "refined":
        rc = OnlineCalibration()
    elif recalibrate:  # the map alone
        rc = OnlineCalibration(RecalibrationConfig(bin_width=0.0, request_precision=0.0))
    d = BlockDrafter(model.double().eval(), te.LENGTH, torch.float64, "cpu", recalibration=rc)
    eng = Engine(tgt, d, te.CFG)
    dec = Decision(k=4, tau=tau, survival=survival)
    chi2, tv, recs = te._run(eng, None, lambda: FixedDecision(dec))
    share = [sum(r.drafted == j for r in recs) / len(recs) for j in range(5)]
    if recalibrate is True:  # the map moved, and its τ stop cut some rounds and kept others whole
        assert rc is not None and rc.slots > 500 and rc.theta[0] < 0.5, rc.theta
        assert share[0] > 0.05 and share[4] > 0.05, share
    elif rc is not None:  # the refined confidences reached τ: the stop keeps most rounds out
        assert rc.slots > 5 and share[0] > 0.5, share
    assert chi2 < te.CHI2_CRIT, f"tau {tau}: chi2 {chi2:.1f}, TV {tv:.3f}"
    if recalibrate != "refined":
        assert sum(r.accepted >= 2 for r in recs) >= (20 if tau < 0.5 else 5)
    assert all(c >= tau for r in recs for c in r.confidences)
    assert all(math.prod(r.confidences) >= survival for r in recs)
    if (tau or survival) and rc is None:  # the head cuts the blocks, at several positions
        assert share[4] < (0.6 if adjacent else 0.05), share
        assert sum(s > 0.05 for s in share) >= (3 if adjacent else 2), share


def test_mismatched_block_checkpoint_is_one_line(tmp_path):
    """A block checkpoint from another target, with another block size than its config, that
    reads layers the target lacks, whose tensors are for another B, or whose bytes are corrupt:
    one line naming the file and the mismatch."""
    from control.errors import DSparkError
    from real import checkpoint as ck
    from real.block_drafter import check_bundle
    from real.store import Bundle

    target, model = tiny_target(), tiny_block()
    path = tmp_path / "drafter_block.safetensors"
    sha = "a" * 64

    def bundle(meta: dict, entry: dict, m=model) -> Bundle:
        ck.save_tensors(m.state_dict(), path, meta)
        manifest = {
            "models": {"target": {"sha256": sha}, "drafter_block": {"file": path.name, **entry}}
        }
        return Bundle(None, {"target": target, "drafter_block": m}, manifest, tmp_path)

    def fails(b: Bundle, what: str) -> None:
        with pytest.raises(DSparkError) as e:
            check_bundle(b)
        assert str(path) in str(e.value) and what in str(e.value) and "\n" not in str(e.value)

    check_bundle(bundle({"target_sha256": sha, "block_size": "5"}, {"target_sha256": sha}))
    fails(bundle({"target_sha256": "b" * 64}, {}), "distilled from another target (file")
    fails(bundle({}, {"target_sha256": "c" * 64}), "(manifest entry names target sha256 cccc")
    fails(bundle({"block_size": "8"}, {}), "holds block size 8, its manifest config says 5")
    fails(bundle({}, {}, tiny_block(layers=(1, 3))), "the target has 2 layers of width 32")
    good = bundle({}, {})
    path.write_bytes(b"\x00garbage")
    fails(good, "is unreadable")
    ck.save_tensors(tiny_block(block=8).state_dict(), path)
    with pytest.raises(DSparkError, match=r"'slots' has shape \(8, 16\), expected \(5, 16\)"):
        ck.load_into(tiny_block(), ck.load_tensors(path), str(path))


def test_prompt_shorter_than_the_context():
    """A 1- and a 2-token prompt (context C = 4: entries before position 0 masked out, the
    first entry without a target state): output equals target-only greedy."""
    target = tiny_target()
    eng = Engine(target, BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu"), CFG)
    for p in ([5], [7, 3]):
        g = eng.generate(p, 12, make_controller("fixed", {"k": 4}))
        assert g.tokens == eng.greedy_reference(p, 12) and g.records[0].drafted == 4
