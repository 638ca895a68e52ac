"""The Llama export (benchmark only) reproduces our logits."""

import pytest
import torch

pytest.importorskip("transformers", reason="the HF export needs transformers (the bench extra)")

from real.hf_export import max_logit_difference, to_llama
from real.models import Transformer, TransformerConfig


def test_llama_export_has_zero_logit_difference_in_float32():
    torch.manual_seed(0)
    m = Transformer(
        TransformerConfig(
            vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=128
        )
    ).eval()
    ids = torch.randint(0, 512, (1, 40))
    assert max_logit_difference(m, to_llama(m), ids) <= 1e-5


def _strong_bf16_target() -> Transformer:
    """Random weights strong enough for peaked logits (few near-ties), in bfloat16."""
    torch.manual_seed(0)
    m = Transformer(
        TransformerConfig(
            vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=300
        )
    )
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 if "embed" in name else 3.0 / p.shape[1] ** 0.5)
    return m.eval().to(torch.bfloat16)


def test_bf16_export_keeps_rotary_buffers_float32_and_logits_bit_equal():
    m = _strong_bf16_target()
    hf = to_llama(m)
    assert hf.model.embed_tokens.weight.dtype == torch.bfloat16
    bufs = dict(hf.named_buffers())
    assert bufs and all(b.dtype == torch.float32 for b in bufs.values() if b.is_floating_point())
    ids = torch.randint(0, 256, (1, 180), generator=torch.Generator().manual_seed(1))
    # the same computation: bit-equal logits over 180 positions (RoPE tables from float32
    # inv_freq, cos/sin cast to bf16, as real.models.rope_tables does)
    assert max_logit_difference(m, hf, ids) == 0.0
    # what the fix is for: a bf16 inv_freq (the old export) changes the logits by O(1)
    old = to_llama(m).to(torch.bfloat16)
    assert max_logit_difference(m, old, ids) > 0.1


def test_hf_bf16_greedy_equals_engine_bf16_greedy():
    """HF ``generate`` (greedy, KV cache, through the bench's ``hf_generate``) on the bf16 export
    produces the engine's bf16 greedy output (target-only and speculative) token for token on
    three 100-token prompts + 60 new. With the old export (bf16 inv_freq) agreement was
    0.02-0.13 on the same prompts; without an explicit attention mask HF masked the
    end-of-text token inside the first prompt as padding (pad id = end-of-text id)."""
    import copy

    from control import make_controller
    from real.bench import hf_generate
    from real.drafters import ModelDrafter
    from real.engine import Engine, EngineConfig

    m = _strong_bf16_target()
    cfg = EngineConfig(
        max_len=200, k_max=8, target_dtype="bfloat16", drafter_dtype="float32", stop_at_eot=False
    )
    d = ModelDrafter(copy.deepcopy(m).float(), cfg.max_len + cfg.k_max + 1, torch.float32, "cpu")
    eng = Engine(m, d, cfg)
    hf = to_llama(m, eot_id=0)
    hf.generation_config.eos_token_id = None  # as real.bench.hf_pair_for sets them
    hf.generation_config.pad_token_id = 0
    g = torch.Generator().manual_seed(1)
    for i in range(3):
        p = torch.randint(0, 256, (100,), generator=g).tolist()
        if i == 0:
            p[40] = 0  # an end-of-text token inside the prompt (= pad id): must not be masked
        out, _ = hf_generate({"target": hf}, p, 60, None)
        assert out == eng.greedy_reference(p, 60)
        assert out == eng.generate(p, 60, make_controller("fixed", {"k": 4})).tokens
