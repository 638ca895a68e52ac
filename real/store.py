"""The shipped checkpoints: export after training, and checked loading at run time.

``real/checkpoints/manifest.json`` names every file with its sha256, the model configs, the
command that made them, the validation losses and the hash of the corpus trained on. Loading
checks hashes and shapes and reads safetensors only; any mismatch is a one-line DSparkError.
"""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from control.configio import from_mapping
from control.errors import DSparkError
from real import checkpoint as ck
from real.models import ConvConfig, ConvDrafter, Transformer, TransformerConfig, count_params

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
MANIFEST = "manifest.json"
#: model name -> dtype it is shipped in (the target in bf16; drafters fp16, run in fp32).
SHIP_DTYPES = {
    "target": "bfloat16",
    "drafter_conv": "float16",
    "drafter_tf": "float16",
    "drafter_feat": "float16",
    "drafter_block": "float16",
}
CONFIG_CLASSES = {"transformer": TransformerConfig, "conv": ConvConfig}


def _config_class(kind: str):
    if kind == "featconv":  # real.feature_drafter imports real.drafters: loaded on demand
        from real.feature_drafter import FeatureConvConfig

        return FeatureConvConfig
    if kind == "block":
        from real.block_drafter import BlockConfig

        return BlockConfig
    return CONFIG_CLASSES[kind]


def build_model(kind: str, cfg) -> torch.nn.Module:
    """A fresh model of a checkpoint ``kind`` (``transformer``, ``conv``, ``featconv``,
    ``block``) with config ``cfg``; the drafters that build on ``real.models`` are imported on
    demand."""
    if kind == "transformer":
        return Transformer(cfg)
    if kind == "conv":
        return ConvDrafter(cfg)
    if kind == "featconv":
        from real.feature_drafter import FeatureConvDrafter

        return FeatureConvDrafter(cfg)
    if kind == "block":
        from real.block_drafter import BlockDrafterModel

        return BlockDrafterModel(cfg)
    raise ValueError(f"unknown model kind {kind!r}")


def _model_entry(path: Path, name: str, kind: str, cfg, model, res: dict) -> dict:
    return {
        "file": path.name,
        "sha256": ck.sha256_file(path),
        "kind": kind,
        "config": dataclasses.asdict(cfg),
        "dtype": SHIP_DTYPES[name],
        "params": count_params(model),
        "steps": res["step"],
        "train_seconds": round(res["seconds"], 1),
        "final_train_loss": res["losses"][-1],
        "validation": res["eval"],
    }


def add_model(
    out: Path,
    name: str,
    kind: str,
    cfg,
    model,
    res: dict,
    command: str,
    metadata: dict[str, str] | None = None,
) -> dict:
    """Save one more model into ``out`` (shipped dtype) and add its entry to the manifest there,
    with the command that made it (the other entries stay as they are); ``metadata`` goes into
    the file's header and the entry."""
    m = read_manifest(out)
    path = out / f"{name}.safetensors"
    dtype = ck.DTYPES[SHIP_DTYPES[name]]
    ck.save_tensors({k: v.to(dtype) for k, v in model.state_dict().items()}, path, metadata)
    m["models"][name] = {
        **_model_entry(path, name, kind, cfg, model, res),
        **(metadata or {}),
        "command": command,
    }
    ck.write_json(m, out / MANIFEST)
    return m


def export_checkpoints(out: Path, tok, specs: dict, results: dict, train_cfg, command: str) -> dict:
    from real import corpus

    out.mkdir(parents=True, exist_ok=True)
    tok_path = out / "tokenizer.json"
    tok.save(str(tok_path))
    manifest: dict[str, Any] = {
        "format": 1,
        "command": command,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "corpus_hash": corpus.corpus_hash(),
        "train_config": dataclasses.asdict(train_cfg),
        "tokenizer": {"file": tok_path.name, "sha256": ck.sha256_file(tok_path)},
        "models": {},
    }
    for name, (kind, cfg, model) in specs.items():
        dtype = ck.DTYPES[SHIP_DTYPES[name]]
        path = out / f"{name}.safetensors"
        ck.save_tensors({k: v.to(dtype) for k, v in model.state_dict().items()}, path)
        manifest["models"][name] = _model_entry(path, name, kind, cfg, model, results[name])
    ck.write_json(manifest, out / MANIFEST)
    return manifest


@dataclass
class Bundle:
    tokenizer: Any
    models: dict[str, torch.nn.Module]
    manifest: dict
    directory: Path


def read_manifest(directory: Path | str | None = None) -> dict:
    d = Path(directory) if directory else CHECKPOINT_DIR
    m = ck.read_json(d / MANIFEST)
    for key in ("tokenizer", "models"):
        if key not in m:
            raise DSparkError(f"{d / MANIFEST}: missing key '{key}'")
    return m


def load_model(
    name: str,
    directory: Path | str | None = None,
    manifest: dict | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> torch.nn.Module:
    d = Path(directory) if directory else CHECKPOINT_DIR
    m = manifest or read_manifest(d)
    if name not in m["models"]:
        raise DSparkError(f"{d / MANIFEST}: no model '{name}'; has {', '.join(m['models'])}")
    entry = m["models"][name]
    try:
        cls = _config_class(entry["kind"])
        cfg = from_mapping(
            cls, entry["config"], source=str(d / MANIFEST), prefix=f"models.{name}.config"
        )
        file, sha = entry["file"], entry["sha256"]
    except KeyError as e:
        raise DSparkError(f"{d / MANIFEST}: model '{name}' lacks {e}") from None
    model = build_model(entry["kind"], cfg)
    ck.load_into(model, ck.load_tensors(d / file, sha), str(d / file))
    return model.to(device=device, dtype=dtype).eval()


def load_bundle(
    directory: Path | str | None = None,
    names=("target", "drafter_conv", "drafter_tf"),
    target_dtype: torch.dtype = torch.float32,
    drafter_dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Bundle:
    from real.tokenizer import load_tokenizer

    d = Path(directory) if directory else CHECKPOINT_DIR
    m = read_manifest(d)
    tok_entry = m["tokenizer"]
    tok_path = d / tok_entry.get("file", "tokenizer.json")
    if tok_path.is_file() and ck.sha256_file(tok_path) != tok_entry.get("sha256"):
        raise DSparkError(f"tokenizer {tok_path} is corrupt: sha256 does not match the manifest")
    tok = load_tokenizer(tok_path)
    models = {
        n: load_model(n, d, m, target_dtype if n == "target" else drafter_dtype, device)
        for n in names
    }
    return Bundle(tok, models, m, d)
