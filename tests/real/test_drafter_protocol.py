"""Every drafter the engine runs satisfies real.drafter_protocol.Drafter (a model drafter and
the hybrid also CachedDrafter); the n-gram drafter holds no cache."""

from real.drafter_protocol import CachedDrafter, Drafter
from real.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from tests.real.conftest import V, make_engine


def test_drafters_satisfy_the_protocol():
    eng = make_engine("tf")
    model = eng.drafter
    assert isinstance(model, ModelDrafter)
    ngram = NgramDrafter(vocab_size=V)
    hybrid = HybridDrafter(model, NgramDrafter(vocab_size=V), 2)
    for d in (model, ngram, hybrid):
        assert isinstance(d, Drafter), type(d).__name__
    assert isinstance(model, CachedDrafter) and isinstance(hybrid, CachedDrafter)
    assert not isinstance(ngram, CachedDrafter)
