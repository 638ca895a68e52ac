"""Real-engine speed benchmark (batch 1, held-out code prompts, same weights for everyone).

Measures tokens/s of target-only decoding, of the engine with every controller (fixed k 1..8,
hf-heuristic, confidence-stop, ema-hysteresis, analytic, dspark) with every drafter (transformer,
conv, n-gram lookup and the two lookup+model hybrids), and of Hugging Face generation on the same
target (assisted generation with the same transformer drafter exported to LlamaForCausalLM at
k 4/6/8/12 and its heuristic schedule; prompt lookup at 4 and 10 tokens), all interleaved in one
run. Prints the table and, as its last line, ``real_speedup_vs_ar=<x> real_speedup_vs_hf=<y>``
(the best engine method over target-only, and over the best HF setting).

    .venv/bin/python benchmarks/real_speed.py [--repeats 3] [--prompts 8] [--new-tokens 128]
        [--drafters "tf conv ngram ngram+tf ngram+conv"]
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a.startswith("--drafter") for a in argv):  # --drafter X or --drafters "X Y"
        from real import DRAFTERS

        argv += ["--drafters", " ".join(DRAFTERS)]
    args = parser.parse_args(["bench", *argv])
    from dspark.real_bench import run

    try:
        return run(args)
    except DSparkError as e:
        print(f"real_speed: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
