"""Checkpoint files: safetensors only, hash- and shape-checked; every failure is one line."""

import json

import pytest
import torch

from control.errors import DSparkError
from real import checkpoint as ck
from real.models import ConvConfig, TransformerConfig
from real.store import build_model, load_bundle, load_model
from real.train import TrainConfig


class _Tok:
    def save(self, path):
        from real.tokenizer import train_tokenizer

        train_tokenizer(["def f(x):\n    return x + 1\n"] * 20, vocab_size=300).save(path)


@pytest.fixture()
def ckdir(tmp_path, monkeypatch):
    from real import corpus, store

    monkeypatch.setattr(corpus, "corpus_hash", lambda root=None: "test")
    tcfg = TransformerConfig(
        vocab_size=300, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64
    )
    ccfg = ConvConfig(vocab_size=300, d_model=8, n_blocks=1, kernel=3, d_hidden=8)
    torch.manual_seed(0)
    specs = {
        "target": ("transformer", tcfg, build_model("transformer", tcfg)),
        "drafter_conv": ("conv", ccfg, build_model("conv", ccfg)),
        "drafter_tf": ("transformer", tcfg, build_model("transformer", tcfg)),
    }
    res = {n: {"step": 1, "seconds": 0.0, "losses": [1.0], "eval": {}} for n in specs}
    store.export_checkpoints(tmp_path, _Tok(), specs, res, TrainConfig(), "test")
    return tmp_path, specs


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_roundtrip_loads_exported_weights(ckdir):
    d, specs = ckdir
    b = load_bundle(d)
    for name, (_, _, model) in specs.items():
        want = {
            k: v.to(torch.bfloat16 if name == "target" else torch.float16).float()
            for k, v in model.state_dict().items()
        }
        got = b.models[name].state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
    m = json.loads((d / "manifest.json").read_text())
    assert m["models"]["target"]["sha256"] == ck.sha256_file(d / "target.safetensors")


def test_flipped_byte_is_a_one_line_error(ckdir):
    d, _ = ckdir
    p = d / "drafter_conv.safetensors"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(DSparkError) as e:
        load_model("drafter_conv", d)
    assert "corrupt" in _one_line(e) and "drafter_conv.safetensors" in str(e.value)


def test_truncated_file_without_hash_is_a_one_line_error(ckdir):
    d, _ = ckdir
    p = d / "target.safetensors"
    p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(DSparkError) as e:
        ck.load_tensors(p)  # no hash: the safetensors parser itself must refuse
    assert "unreadable" in _one_line(e)
    with pytest.raises(DSparkError) as e:
        load_model("target", d)
    _one_line(e)


def test_missing_file_and_wrong_shapes(ckdir):
    d, _ = ckdir
    m = json.loads((d / "manifest.json").read_text())
    m["models"]["drafter_tf"]["config"]["d_ff"] = 48
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DSparkError) as e:
        load_model("drafter_tf", d)
    assert "shape" in _one_line(e)
    (d / "target.safetensors").unlink()
    with pytest.raises(DSparkError) as e:
        load_model("target", d)
    assert "missing" in _one_line(e)
    with pytest.raises(DSparkError) as e:
        load_model("nope", d)
    _one_line(e)


def test_bad_manifest_and_bad_tokenizer(ckdir, tmp_path):
    d, _ = ckdir
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(DSparkError) as e:
        load_bundle(d)
    _one_line(e)
    (d / "manifest.json").write_text("[1, 2]")
    with pytest.raises(DSparkError) as e:
        load_bundle(d)
    _one_line(e)
    with pytest.raises(DSparkError) as e:
        load_bundle(tmp_path / "nowhere")
    _one_line(e)


def test_cli_reports_corrupt_checkpoint_in_one_line(ckdir, capsys):
    from dspark.cli import main

    d, _ = ckdir
    p = d / "target.safetensors"
    p.write_bytes(p.read_bytes()[:-10])
    rc = main(
        ["real", "generate", "--prompt", "def f", "--checkpoints", str(d), "--max-new-tokens", "2"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("dspark: error: checkpoint")


def test_loading_never_uses_pickle():
    import pathlib

    src = "\n".join(p.read_text() for p in pathlib.Path("real").glob("*.py"))
    assert "torch.load" not in src and "import pickle" not in src
