"""Prompt sets from the user's own files (real.promptfiles; workload = 'file'), and their use by
`dspark validate` configs and `dspark real trace --prompt-file`."""

import contextlib
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from control.errors import ConfigError, DSparkError
from dspark.cli import main
from real.promptfiles import file_prompts, read_prompt_texts
from real.tokenizer import load_tokenizer
from real.tracing import PromptSetConfig, make_prompts
from validate.config import load_validate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ROOT / "real" / "checkpoints" / "tokenizer.json")


def test_lines_jsonl_and_escapes(tmp_path, tok):
    lines = tmp_path / "p.txt"
    lines.write_text("def f(x):\\n    return x + 1\n\n   \nclass A:\\n\\tpass\n")
    assert read_prompt_texts(lines) == (
        "prompts",
        ["def f(x):\n    return x + 1", "class A:\n\tpass"],
    )
    js = tmp_path / "p.jsonl"
    js.write_text(
        json.dumps({"prompt": "a b c"})
        + "\n\n"
        + json.dumps("d e f")
        + "\n"
        + json.dumps({"text": "g h"})
        + "\n"
    )
    assert read_prompt_texts(js) == ("prompts", ["a b c", "d e f", "g h"])
    got = file_prompts(lines, tok, 2, 2, 6, 0)
    full = [tok.encode(t).ids for t in read_prompt_texts(lines)[1]]
    assert got == [x[-6:] for x in full]  # each cut to its LAST prompt_tokens_max tokens


def test_folder_windows(tmp_path, tok):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 20)
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "b.py").write_text("def g(y):\n    return y * 2\n" * 20)
    (tmp_path / "d" / ".hidden").write_text("never read " * 50)
    (tmp_path / "d" / "bin.dat").write_bytes(b"\xff\xfe\x00\x01" * 40)
    kind, docs = read_prompt_texts(tmp_path / "d")
    assert kind == "documents" and len(docs) == 2
    cfg = PromptSetConfig(
        workload="file",
        path=str(tmp_path / "d"),
        n_prompts=5,
        prompt_tokens_min=8,
        prompt_tokens_max=24,
        seed=3,
    )
    a, b = make_prompts(cfg, tok), make_prompts(cfg, tok)
    assert a == b and len(a) == 5 and all(8 <= len(p) <= 24 for p in a)
    ids = [tok.encode(d).ids for d in docs]
    for p in a:  # every prompt is a window of one of the documents
        assert any(any(d[s : s + len(p)] == p for s in range(len(d) - len(p) + 1)) for d in ids)


@pytest.mark.parametrize(
    "content,name,msg",
    [
        ("x\n", "short.txt", "0 prompts of >= 50 tokens (1 shorter), 1 asked"),
        ("{not json\n", "bad.jsonl", "line 1 is not JSON"),
        ("[1, 2]\n", "list.jsonl", "expected a JSON string or an object"),
        ("\n\n", "empty.txt", "holds no prompt"),
    ],
)
def test_bad_prompt_files(tmp_path, tok, content, name, msg):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(
        DSparkError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        file_prompts(p, tok, 1, 50, 60, 0)


def test_missing_and_tokenizerless(tmp_path, tok):
    with pytest.raises(DSparkError, match="prompt file not found"):
        file_prompts(tmp_path / "nope.txt", tok, 1, 2, 8, 0)
    with pytest.raises(DSparkError, match="needs the tokenizer"):
        make_prompts(PromptSetConfig(workload="file", path=str(tmp_path)), None)
    with pytest.raises(DSparkError, match="needs path"):
        make_prompts(PromptSetConfig(workload="file"), tok)


def test_validate_config_resolves_paths(tmp_path):
    (tmp_path / "mine.txt").write_text("print('hello world')\n")
    cfg_text = (ROOT / "configs" / "validate_tiny.toml").read_text()
    cfg_text += (
        '\n[workloads.mine]\nworkload = "file"\npath = "mine.txt"\n'
        "prompt_tokens_max = 24\nmax_new_tokens = 24\n"
    )
    (tmp_path / "v.toml").write_text(cfg_text)
    cfg = load_validate(tmp_path / "v.toml")
    assert cfg.workloads["mine"].path == str((tmp_path / "mine.txt").resolve())
    (tmp_path / "v2.toml").write_text(cfg_text.replace('"mine.txt"', '"gone.txt"'))
    with pytest.raises(ConfigError, match=r"workloads\.mine\.path: .*gone\.txt not found"):
        load_validate(tmp_path / "v2.toml")


def test_trace_with_prompt_file(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text(
        "\n".join(
            json.dumps({"prompt": t})
            for t in (
                "import os\nimport sys\n\ndef main(argv):\n    ",
                "The licence grants you the right to",
            )
        )
    )
    out = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(
            [
                "real",
                "trace",
                "--prompt-file",
                str(p),
                "--n-prompts",
                "2",
                "--prompt-tokens-min",
                "4",
                "--prompt-tokens-max",
                "64",
                "--max-new-tokens",
                "6",
                "--no-positions",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    rq = pd.read_csv(out / "requests.csv")
    assert len(rq) == 2 and (rq.output_tokens == 6).all()
