"""The command line starts without PyTorch: building the parser (every subcommand's options,
the engine's choices and ``--tp`` defaults among them) imports no torch, so a command that
never runs the engine (``dspark tune``, ``dspark simulate``) pays no torch start-up."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = (
    "import sys; from dspark.cli import build_parser; "
    "p = build_parser(); "
    "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
)


def test_building_the_parser_imports_no_torch():
    r = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_the_tp_flags_default_to_the_engines_tp_config():
    from dspark.cli import build_parser
    from real.tp import TPConfig

    for argv in (["generate", "--prompt", "x"], ["bench"], ["profile"]):
        args = build_parser().parse_args(["real", *argv])
        assert (args.tp, args.tp_timeout) == (TPConfig().size, TPConfig().timeout_s) == (1, 60.0)
