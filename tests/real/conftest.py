import copy

import pytest
import torch

from real.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from real.engine import Engine, EngineConfig
from real.models import ConvConfig, ConvDrafter, Transformer, TransformerConfig

V = 48


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def tiny_target(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(
        TransformerConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=256)
    )
    with torch.no_grad():  # strong layers, weak embeddings: a varied, non-repeating target
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 if "embed" in name else 3.0 / p.shape[1] ** 0.5)
    return m.double().eval()


def perturbed(model, scale: float, seed: int = 1):
    """A drafter that agrees with ``model`` often but not always."""
    g = torch.Generator().manual_seed(seed)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(
                torch.randn(p.shape, generator=g, dtype=p.dtype) * scale * p.std().clamp_min(1e-3)
            )
    return m


def tiny_conv(seed: int = 2) -> ConvDrafter:
    torch.manual_seed(seed)
    return (
        ConvDrafter(ConvConfig(vocab_size=V, d_model=16, n_blocks=2, kernel=4, d_hidden=32))
        .double()
        .eval()
    )


CFG = EngineConfig(
    max_len=200, k_max=8, target_dtype="float64", drafter_dtype="float64", stop_at_eot=False
)


def make_engine(
    drafter_kind: str = "tf", target=None, scale: float = 0.05, cfg: EngineConfig = CFG
) -> Engine:
    target = target if target is not None else tiny_target()
    length = cfg.max_len + cfg.k_max + 1
    if drafter_kind == "tf":
        d = ModelDrafter(perturbed(target, scale), length, torch.float64, "cpu")
    elif drafter_kind == "same":
        d = ModelDrafter(copy.deepcopy(target), length, torch.float64, "cpu")
    elif drafter_kind == "conv":
        d = ModelDrafter(tiny_conv(), length, torch.float64, "cpu")
    elif drafter_kind.startswith("ngram+"):
        inner = tiny_conv() if drafter_kind == "ngram+conv" else perturbed(target, scale)
        d = HybridDrafter(
            ModelDrafter(inner, length, torch.float64, "cpu"),
            NgramDrafter(vocab_size=V),
            min_match=1,
        )
    else:
        d = NgramDrafter(vocab_size=V)
    return Engine(target, d, cfg, sentence_end_ids=frozenset({3, 7}))


def prompt(seed: int, n: int = 12) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g).tolist()
