"""Speculative sampling emits tokens distributed as the target's (vLLM-style rejection test)."""

import torch

from real.sampling import SamplingParams, probs, speculative_accept

VOCAB, K = 8, 2


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def _emit(p, q, n_samples, seed):
    """Empirical distributions of the tokens emitted at output positions 0 and 1."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(K, VOCAB, dtype=torch.float64)
    for _ in range(n_samples):
        draft = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(K)])
        n, nxt, lossy = speculative_accept(draft, q, p, gen)
        assert lossy == 0 and 0 <= n <= K
        out = draft[:n].tolist() + [nxt]
        for pos in range(min(K, len(out))):
            counts[pos, out[pos]] += 1
    return counts / counts.sum(-1, keepdim=True)


def test_emitted_tokens_converge_to_target_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(K + 1, VOCAB, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(K, VOCAB, generator=g, dtype=torch.float64) * 1.5, -1)
    refs = torch.softmax(torch.randn(5, VOCAB, generator=g, dtype=torch.float64) * 1.5, -1)
    small = _emit(p, q, 500, seed=1)
    large = _emit(p, q, 12000, seed=2)
    for pos in range(K):
        d_small, d_large = _tv(small[pos], p[pos]), _tv(large[pos], p[pos])
        assert d_large < d_small  # converges
        assert d_large < 0.03
        # far below the distance to unrelated distributions, and to the drafter's own
        assert d_large < 0.2 * min(_tv(large[pos], r) for r in refs)
        assert d_large < 0.2 * _tv(large[pos], q[pos])


def test_identical_draft_is_always_accepted():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(K + 1, VOCAB, generator=g, dtype=torch.float64), -1)
    for _ in range(200):
        draft = torch.stack([torch.multinomial(p[i], 1, generator=g)[0] for i in range(K)])
        n, _, _ = speculative_accept(draft, p[:K], p, g)
        assert n == K


def test_top_k_top_p_processing():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    pk = probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (pk[0, 2:] == 0).all() and abs(float(pk.sum()) - 1) < 1e-12
    full = torch.softmax(logits, -1)
    pp = probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    # the smallest prefix of sorted probabilities reaching 0.8 is kept
    keep = int((full[0].cumsum(0) - full[0] < 0.8).sum())
    assert (pp[0, keep:] == 0).all() and (pp[0, :keep] > 0).all()
    hot = probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(hot, torch.softmax(logits / 0.5, -1))
