"""Export a ``real.models.Transformer`` to Hugging Face ``LlamaForCausalLM`` (benchmark only).

Needs the ``bench`` extra (``transformers``). The mapping splits the fused ``qkv`` and
``gate_up`` projections into Llama's q/k/v and gate/up projections; RoPE (rotate-half),
RMSNorm (float32 statistics) and tied embeddings follow Llama, so logits agree to rounding.
"""

from __future__ import annotations

import torch

from control.errors import DSparkError


def llama_config(cfg, eot_id: int | None = None):
    try:
        from transformers import LlamaConfig
    except ImportError:
        raise DSparkError("Hugging Face export needs transformers: pip install "
                          "'dspark-lab[bench]'") from None
    return LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                       intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                       num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                       max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                       rope_theta=cfg.rope_theta, tie_word_embeddings=True, hidden_act="silu",
                       attention_bias=False, mlp_bias=False, bos_token_id=eot_id,
                       eos_token_id=eot_id, pad_token_id=eot_id)


def llama_state_dict(model) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    d, f = cfg.d_model, cfg.d_ff
    sd = {"model.embed_tokens.weight": model.embed_tokens.weight,
          "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.embed_tokens.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv, gu = layer.qkv.weight, layer.gate_up.weight
        sd.update({p + "input_layernorm.weight": layer.input_layernorm.weight,
                   p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
                   p + "self_attn.q_proj.weight": qkv[:d], p + "self_attn.k_proj.weight": qkv[d:2 * d],
                   p + "self_attn.v_proj.weight": qkv[2 * d:], p + "self_attn.o_proj.weight": layer.o.weight,
                   p + "mlp.gate_proj.weight": gu[:f], p + "mlp.up_proj.weight": gu[f:],
                   p + "mlp.down_proj.weight": layer.down.weight})
    return {k: v.detach().clone() for k, v in sd.items()}


def to_llama(model, eot_id: int | None = None, dtype: torch.dtype | None = None):
    """A ``LlamaForCausalLM`` with ``model``'s weights (same dtype unless given)."""
    from transformers import LlamaForCausalLM

    dt = dtype or next(model.parameters()).dtype
    hf = LlamaForCausalLM(llama_config(model.cfg, eot_id))
    missing, unexpected = hf.load_state_dict(llama_state_dict(model), strict=False)
    missing = [m for m in missing if "rotary_emb" not in m and m != "lm_head.weight"]
    if missing or unexpected:
        raise DSparkError(f"Llama export mismatch: missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]}")
    hf.tie_weights()
    return hf.to(dt).eval()


@torch.inference_mode()
def max_logit_difference(model, hf, ids: torch.Tensor) -> float:
    """Largest |ours - HF| logit over a teacher-forced sequence (0 up to float rounding)."""
    ours = model(ids).float()
    theirs = hf(input_ids=ids).logits.float()
    return float((ours - theirs).abs().max())
