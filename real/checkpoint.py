"""Safe weight files: safetensors only (never pickle), sha256-checked, shape-checked.

Every failure to load (missing file, bad hash, truncated or corrupt file, wrong tensor names or
shapes, bad manifest) raises a one-line :class:`DSparkError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from control.errors import DSparkError

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
#: ``auto`` (the engine's default target precision) names one of DTYPES per device: see
#: :func:`resolve_dtype`.
AUTO_DTYPE = "auto"


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles). Without it
    PyTorch emulates bf16 matmuls through float32 at a fraction of float32's speed."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_dtype(name: str, device: str, slots: int = 1) -> str:
    """A precision name of DTYPES; ``auto`` is bfloat16 on CUDA and on a CPU with native bf16;
    on another CPU bfloat16 for the batch-1 engine (``slots`` = 1) and float32 for a batched
    one. Without native bf16 a bf16 matmul is emulated and compute-bound already at a few rows,
    so float32 serves a batch faster; at batch 1 bf16 decodes faster and a short verify pass
    costs less over one token than in float32, so speculation gains more there
    (``benchmarks/real_batch.py`` measures the batched engine, ``benchmarks/real_speed.py``
    batch 1)."""
    if name != AUTO_DTYPE:
        return name
    return "bfloat16" if device == "cuda" or native_cpu_bf16() or slots == 1 else "float32"


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_tensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Write atomically (temp file + rename) so a killed run never leaves half a file."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata
    )
    os.replace(tmp, path)


def load_tensors(path: str | Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise DSparkError(f"checkpoint file missing: {path}")
    if sha256 is not None:
        got = sha256_file(path)
        if got != sha256:
            raise DSparkError(
                f"checkpoint {path} is corrupt: sha256 {got[:12]}... != manifest {sha256[:12]}..."
            )
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises SafetensorError / OSError on bad bytes
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DSparkError(f"checkpoint {path} is unreadable: {msg}") from None


def load_into(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str, prefix: str = ""
) -> None:
    """Copy ``tensors`` (names prefixed by ``prefix``) into ``model``, checking names and shapes."""
    own = model.state_dict()
    got = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    missing = sorted(set(own) - set(got))
    extra = sorted(set(got) - set(own))
    if missing or extra:
        what = f"missing tensor '{missing[0]}'" if missing else f"unexpected tensor '{extra[0]}'"
        raise DSparkError(f"checkpoint {where} does not fit the model: {what}")
    for k, v in own.items():
        if tuple(got[k].shape) != tuple(v.shape):
            raise DSparkError(
                f"checkpoint {where} does not fit the model: '{k}' has shape "
                f"{tuple(got[k].shape)}, expected {tuple(v.shape)}"
            )
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(got[k].to(v.dtype))


def read_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DSparkError(f"file missing: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DSparkError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise DSparkError(f"{path} must hold a JSON object")
    return data


def write_json(data: dict, path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
