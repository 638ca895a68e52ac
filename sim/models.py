"""Transformer model presets (Llama family) and custom dimensions: parameter, FLOP and byte counts."""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.errors import ConfigError

# name: (layers, d_model, heads, kv_heads, ffn, vocab)
MODEL_PRESETS: dict[str, tuple[int, int, int, int, int, int]] = {
    "Llama-3.1-8B": (32, 4096, 32, 8, 14336, 128256),
    "Llama-3.1-70B": (80, 8192, 64, 8, 28672, 128256),
    "Llama-3.2-1B": (16, 2048, 32, 8, 8192, 128256),
    "Llama-2-7B": (32, 4096, 32, 32, 11008, 32000),
    "Llama-2-70B": (80, 8192, 64, 8, 28672, 32000),
    # block drafters for a Llama-3.1-8B target (sim.block; sizes are assumptions, not published
    # figures): decoder layers at the target's width, its vocabulary and GQA shape, fed a
    # projection of several target layers' hidden states. DSpark-block-7: 2 layers (~1.5 B
    # parameters with embedding and head); DFlash-block-16: 5 layers (~2.1 B).
    "DSpark-block-7": (2, 4096, 32, 8, 14336, 128256),
    "DFlash-block-16": (5, 4096, 32, 8, 14336, 128256),
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelConfig:
    # a preset name, or "custom" with every dimension given.
    preset: str = param(
        "Llama-3.1-70B", choices=tuple(MODEL_PRESETS) + ("custom",), doc="model preset or 'custom'"
    )
    # None = from the preset.
    layers: int | None = param(None, lo=1, hi=1000, doc="transformer layers")
    # None = from the preset.
    d_model: int | None = param(None, lo=1, hi=1 << 17, doc="hidden size")
    # None = from the preset.
    heads: int | None = param(None, lo=1, hi=4096, doc="attention heads")
    # None = from the preset.
    kv_heads: int | None = param(None, lo=1, hi=4096, doc="key/value heads (GQA)")
    # None = from the preset.
    ffn: int | None = param(None, lo=1, hi=1 << 20, doc="MLP intermediate size (SwiGLU)")
    # None = from the preset.
    vocab: int | None = param(None, lo=1, hi=1 << 22, doc="vocabulary size")
    # serving precision of the standard deployments.
    dtype: str = param("bf16", choices=tuple(DTYPE_BYTES), doc="weight and KV-cache dtype")

    def resolved(self, where: str = "model") -> ModelDims:
        over = (self.layers, self.d_model, self.heads, self.kv_heads, self.ffn, self.vocab)
        if self.preset == "custom":
            names = ("layers", "d_model", "heads", "kv_heads", "ffn", "vocab")
            missing = [n for n, v in zip(names, over) if v is None]
            if missing:
                raise ConfigError(f"{where}.preset = 'custom' needs {where}.{missing[0]}")
            base: tuple[int, ...] = (0,) * len(over)  # every dimension is given
        else:
            base = MODEL_PRESETS[self.preset]
        dims = tuple(o if o is not None else b for o, b in zip(over, base))
        layers, d, h, kv, ffn, vocab = dims
        if d % h:
            raise ConfigError(f"{where}: d_model {d} is not divisible by heads {h}")
        if h % kv:
            raise ConfigError(f"{where}: heads {h} is not divisible by kv_heads {kv}")
        return ModelDims(
            self.preset, layers, d, h, kv, ffn, vocab, DTYPE_BYTES[self.dtype], self.dtype
        )


@dataclass(frozen=True)
class ModelDims:
    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    dtype_bytes: int
    dtype: str

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def layer_params(self) -> int:
        d, hd = self.d_model, self.head_dim
        attn = d * self.heads * hd * 2 + d * self.kv_heads * hd * 2  # q, o + k, v
        return attn + 3 * d * self.ffn  # SwiGLU gate, up, down

    @property
    def head_params(self) -> int:
        return self.vocab * self.d_model  # lm_head (read every forward)

    @property
    def total_params(self) -> int:
        return self.layers * self.layer_params + 2 * self.vocab * self.d_model  # + embedding

    @property
    def weight_bytes(self) -> float:
        return float(self.total_params * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token."""
        return float(2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes)
