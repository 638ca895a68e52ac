"""The Llama export (benchmark only) reproduces our logits."""

import pytest
import torch

pytest.importorskip("transformers")

from real.hf_export import max_logit_difference, to_llama
from real.models import Transformer, TransformerConfig


def test_llama_export_has_zero_logit_difference_in_float32():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4,
                                      d_ff=128, max_seq_len=128)).eval()
    ids = torch.randint(0, 512, (1, 40))
    assert max_logit_difference(m, to_llama(m), ids) <= 1e-5
