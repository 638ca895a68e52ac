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
        raise DSparkError(
            "Hugging Face export needs transformers: pip install 'dspark-lab[bench]'"
        ) from None
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )


def llama_state_dict(model) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    d, f = cfg.d_model, cfg.d_ff
    sd = {
        "model.embed_tokens.weight": model.embed_tokens.weight,
        "model.norm.weight": model.norm.weight,
        "lm_head.weight": model.embed_tokens.weight,
    }
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv, gu = layer.qkv.weight, layer.gate_up.weight
        sd.update(
            {
                p + "input_layernorm.weight": layer.input_layernorm.weight,
                p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
                p + "self_attn.q_proj.weight": qkv[:d],
                p + "self_attn.k_proj.weight": qkv[d : 2 * d],
                p + "self_attn.v_proj.weight": qkv[2 * d :],
                p + "self_attn.o_proj.weight": layer.o.weight,
                p + "mlp.gate_proj.weight": gu[:f],
                p + "mlp.up_proj.weight": gu[f:],
                p + "mlp.down_proj.weight": layer.down.weight,
            }
        )
    return {k: v.detach().clone() for k, v in sd.items()}


def to_llama(model, eot_id: int | None = None, dtype: torch.dtype | None = None):
    """A ``LlamaForCausalLM`` with ``model``'s weights (same dtype unless given).

    Only parameters take ``dtype``: non-weight buffers (RoPE's ``inv_freq`` and
    ``original_inv_freq``) stay float32, as in HF's own bf16 checkpoints and as
    ``real.models.rope_tables`` computes its tables (float32, cast to the model dtype after
    cos/sin). Casting ``inv_freq`` to bf16 would make HF's rotary angles a different
    computation from the engine's (issue 17: bf16 greedy agreement 0.70-0.88 instead of 1).
    """
    from transformers import LlamaForCausalLM

    dt = dtype or next(model.parameters()).dtype
    hf = LlamaForCausalLM(llama_config(model.cfg, eot_id))
    missing, unexpected = hf.load_state_dict(llama_state_dict(model), strict=False)
    missing = [m for m in missing if "rotary_emb" not in m and m != "lm_head.weight"]
    if missing or unexpected:
        raise DSparkError(
            f"Llama export mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    hf.tie_weights()
    return keep_buffers_fp32(hf, dt).eval()


def keep_buffers_fp32(hf, dtype: torch.dtype):
    """``hf.to(dtype)`` for parameters only: floating buffers keep their float32 values (saved
    before the cast, so nothing passes through ``dtype``)."""
    saved = [
        (mod, name, buf.detach().float().clone())
        for mod in hf.modules()
        for name, buf in mod.named_buffers(recurse=False)
        if buf is not None and buf.is_floating_point()
    ]
    hf.to(dtype)
    for mod, name, buf in saved:
        mod._buffers[name] = buf
    return hf


@torch.inference_mode()
def max_logit_difference(model, hf, ids: torch.Tensor) -> float:
    """Largest |ours - HF| logit over a teacher-forced sequence (0 up to float rounding)."""
    ours = model(ids).float()
    theirs = hf(input_ids=ids).logits.float()
    return float((ours - theirs).abs().max())
