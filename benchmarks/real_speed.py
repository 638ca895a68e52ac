"""Real-engine speed benchmark (batch 1, held-out code prompts, same weights for everyone).

Measures tokens/s of target-only decoding, of the engine with every controller (fixed k 1..8,
hf-heuristic, confidence-stop, ema-hysteresis, analytic, dspark) and of Hugging Face
assisted generation on the same target and transformer drafter exported to LlamaForCausalLM.
Prints the table and, as its last line, ``real_speedup_vs_ar=<x> real_speedup_vs_hf=<y>``.

    .venv/bin/python benchmarks/real_speed.py [--repeats 3] [--prompts 8] [--new-tokens 128]
"""

from __future__ import annotations

import sys

from control.errors import DSparkError


def main(argv: list[str] | None = None) -> int:
    import argparse

    from dspark.real_bench import add_parser

    parser = argparse.ArgumentParser(prog="real_speed")
    sub = parser.add_subparsers(dest="cmd")
    add_parser(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    from dspark.real_bench import run

    try:
        return run(args)
    except DSparkError as e:
        print(f"real_speed: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
