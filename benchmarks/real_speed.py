"""Real-engine speed benchmark at batch 1 on two prompt sets, greedy and sampled.

Prompt sets (both alternate code and prose windows, code first):

- ``heldout``: the corpus's own held-out test split (stdlib source and its docstrings; never
  trained on, but the same distribution as the training text);
- ``unseen``: text the corpus has never seen, chosen by a FIXED RULE from the running Python's
  site-packages (third-party packages; the corpus is the stdlib without site-packages):
  code = every ``*.py`` file there of at least ``--min-bytes`` bytes, prose = every dist-info
  ``METADATA`` and every ``README*`` / ``*.md`` / ``*.rst`` file of at least ``--min-bytes``
  (LICENSE files are left out: a few licence texts recur verbatim across packages). Each list
  is sorted by path relative to site-packages; ``n`` files are taken at evenly spaced indices
  (``numpy.linspace(0, len - 1, n)``, rounded down), and from each the ``--prompt-tokens``
  tokens centred on the middle of the file (past licence headers and imports).

For each set, greedy (temperature 0) and sampled (``--temperature``, 0.8), ``real.bench`` runs
target-only decoding, the engine with every drafter x controller, and Hugging Face generation on
the same target (assisted generation with the SAME transformer drafter ``tf`` exported to
LlamaForCausalLM, and HF's prompt lookup, the same idea as the engine's ``ngram``), all
interleaved in one run per set and temperature. Sampled runs sample everywhere (target-only
included, HF at the same temperature).

Printed per run: the table, then speedups over target-only, and every "vs HF" ratio for the same
drafter on both sides (engine ``tf/*`` vs HF assisted with that drafter; engine ``ngram/*`` vs HF
prompt lookup) and for the best setting of any kind. The conv drafters (``feat``: conditioned
on the target's hidden states; ``conv``: token-only) have no HF counterpart (HF assists with
causal LMs only). Last two lines::

    real_unseen_speedup_vs_ar=... real_unseen_speedup_vs_hf=... real_unseen_conv_vs_ar=...
    real_sampled_speedup_vs_ar=...
    real_block_draft_cost_vs_ar_k4=... real_block_speedup_vs_ar=...
    real_block_vs_best_ar_drafter=... block_conf_ece=...

(unseen set; greedy unless named sampled; ``conv`` = the best method of the seed-style conv
drafter, feature-conditioned, model only; ``vs_hf`` = best engine method of any kind over the
best HF setting of any kind). The block drafter's line (``nan`` where ``block`` is not among
``--drafters``): one block propose call at k = 4 over the token-only conv drafter's (4
one-token steps), medians of alternate calls at a 128-token context; the block drafter's best
method over target-only, and over the best autoregressive model drafter (conv, feat, tf) of
the same run; the confidence head's expected calibration error (10 bins) over the block
positions the unseen greedy run verified (position j of a round: accepted or not, given the
ones before it were), the confidences as the controllers got them: recalibrated online by
the engine (``real.block_recalibration``; each method's pass over the prompts starts from the
shipped calibration), or the head's own with ``--block-recalibration off``; the line before the
last two gives that ECE beside what a perfectly calibrated head would score on as many slots
with the same confidences (its noise floor). Machine load
matters on a shared box: it is printed beside the results; compare ratios measured side by
side in one run.

Before the last two lines (unless ``--c-prompt-tokens 0``): c per model drafter, the verify
pass of k + 1 tokens over one target step for each k of ``--k-values``, and the ceiling that
puts on fixed k (every draft accepted, drafting free); then the block drafter's draft cost.
``--sets ""`` measures only these (~1 min).

    .venv/bin/python benchmarks/real_speed.py [--repeats 3] [--prompts 8] [--new-tokens 128]
        [--drafters "feat conv tf block ngram ngram+feat ngram+tf"] [--k-values "2 4 6"]
        [--controllers "dspark hf-heuristic"] [--sets "unseen heldout"] [--no-sampled]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from control.errors import DSparkError

CODE_SUFFIXES = (".py",)
PROSE_SUFFIXES = (".md", ".rst")


def _is_prose(rel: Path) -> bool:
    return (
        rel.name == "METADATA"
        or rel.name.upper().startswith("README")
        or rel.suffix in PROSE_SUFFIXES
    )


def unseen_files(root: Path, kind: str, min_bytes: int) -> list[Path]:
    """Every code (``*.py``) or prose file of ``root`` of at least ``min_bytes``, sorted by
    relative path (the rule in the module docstring)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            p = Path(dirpath) / f
            rel = p.relative_to(root)
            if rel.name.upper().startswith("LICENSE"):
                continue
            ok = p.suffix in CODE_SUFFIXES if kind == "code" else _is_prose(rel)
            if ok and p.is_file() and p.stat().st_size >= min_bytes:
                out.append(rel)
    return sorted(out, key=str)


def _window(tok, text: str, length: int) -> list[int] | None:
    ids = tok.encode(text).ids
    if len(ids) < length:
        return None
    s = (len(ids) - length) // 2
    return ids[s : s + length]


def unseen_prompts(tok, n: int, length: int, min_bytes: int, root: Path) -> list[dict]:
    """``n`` prompts alternating code and prose (code first): the rule of the module docstring.
    A file whose text is not UTF-8 or too short in tokens is replaced by the next one."""
    picks: dict[str, list[dict]] = {}
    for kind, want in (("code", (n + 1) // 2), ("prose", n // 2)):
        files = unseen_files(root, kind, min_bytes)
        if len(files) < want:
            raise DSparkError(f"{root}: only {len(files)} {kind} files of >= {min_bytes} bytes")
        got: list[dict] = []
        for i in np.linspace(0, len(files) - 1, max(want, 1)).astype(int)[:want]:
            for j in range(int(i), len(files)):
                try:
                    text = (root / files[j]).read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                ids = _window(tok, text, length)
                if ids is not None and str(files[j]) not in {g["file"] for g in got}:
                    got.append({"file": str(files[j]), "kind": kind, "ids": ids})
                    break
        picks[kind] = got
    code, prose = picks["code"], picks["prose"]
    return [p for pair in zip(code, prose + [None]) for p in pair if p is not None][:n]


def write_prompt_file(tok, prompts: list[dict], path: Path) -> None:
    """A JSONL prompt file for ``real.bench`` (``bench.prompt_file``): the windows' texts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": tok.decode(p["ids"]), "file": p["file"]}) + "\n")


def _best(rows: list[dict], prefix: str) -> dict | None:
    cand = [r for r in rows if r["controller"].startswith(prefix)]
    return max(cand, key=lambda r: r["tokens_per_s"]) if cand else None


def ratios(summary: dict) -> dict[str, float | None]:
    """Speedups over target-only per drafter family, and the vs-HF ratios with the same drafter
    on both sides and for the best settings of any kind."""
    rows = [r for r in summary["rows"] if "tokens_per_s" in r]
    hf = [r for r in rows if r["controller"].startswith("transformers-")]
    hf_spec = [r for r in hf if r["controller"] != "transformers-target-only"]
    eng = [r for r in rows if r not in hf and r["controller"] != "target-only"]
    ar = _best(rows, "target-only")
    out: dict[str, float | None] = {}

    def tps(r):
        return r["tokens_per_s"] if r else None

    def div(a, b):
        return a / b if a is not None and b else None

    for fam in sorted({r["controller"].split("/")[0] for r in eng}):
        out[f"{fam}_vs_ar"] = div(tps(_best(eng, fam + "/")), tps(ar))
    best = max(eng, key=lambda r: r["tokens_per_s"])
    best_hf = max(hf_spec, key=lambda r: r["tokens_per_s"]) if hf_spec else None
    out["best_vs_ar"] = div(tps(best), tps(ar))
    out["best_vs_hf_best"] = div(tps(best), tps(best_hf))
    out["tf_vs_hf_assisted_same_drafter"] = div(
        tps(_best(eng, "tf/")), tps(_best(hf, "transformers-assisted"))
    )
    out["ngram_vs_hf_prompt_lookup"] = div(
        tps(_best(eng, "ngram/")), tps(_best(hf, "transformers-prompt-lookup"))
    )
    out["hf_best_vs_ar"] = div(tps(best_hf), tps(ar))
    out["hf_target_only_vs_ar"] = div(tps(_best(hf, "transformers-target-only")), tps(ar))
    out["best"] = best["controller"]  # type: ignore[assignment]
    out["best_hf"] = best_hf["controller"] if best_hf else None  # type: ignore[assignment]
    return out


def held_prompt(tok, n: int) -> list[int]:
    from real.bench import held_out_prompts

    return held_out_prompts(tok, "code", 1, n)[0]


def _load() -> str:
    la = os.getloadavg()
    return f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} CPUs"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="real_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="unseen heldout", help="prompt sets, space separated")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--drafters", default="feat conv tf block ngram ngram+feat ngram+tf")
    p.add_argument("--k-values", default="2 4 6 8")
    p.add_argument("--controllers", default="dspark hf-heuristic confidence-stop")
    p.add_argument("--temperature", type=float, default=0.8, help="the sampled runs' temperature")
    p.add_argument("--no-sampled", action="store_true", help="greedy runs only")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--min-bytes", type=int, default=4096, help="unseen rule: smallest file")
    p.add_argument("--site-packages", default=sysconfig.get_paths()["purelib"])
    p.add_argument("--target-dtype", default=None, help="default: the engine's default")
    p.add_argument(
        "--block-recalibration",
        choices=("on", "off"),
        default="on",
        help="the block drafter's online recalibration (engine.block_recalibration)",
    )
    p.add_argument("--checkpoints", default=None)
    p.add_argument("--out", default="runs/real-speed")
    p.add_argument(
        "--c-prompt-tokens", type=int, default=128, help="context of the c measurement (0: skip)"
    )
    return p.parse_args(argv)


def run_one(args, name: str, temperature: float, prompt_file: Path | None) -> dict:
    """One interleaved ``real.bench`` run of a prompt set at one temperature."""
    from real.bench import bench_main, summary_lines

    overrides = {
        "prompts": args.prompts,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "drafters": args.drafters,
        "k_values": args.k_values,
        "controllers": args.controllers,
        "hf": not args.no_hf,
    }
    if prompt_file is None:
        overrides["workload"] = "mixed"
    else:
        overrides["prompt_file"] = str(prompt_file)
    flags = {
        "temperature": temperature,
        "target_dtype": args.target_dtype,
        "block_recalibration": args.block_recalibration == "on",
    }
    out = Path(args.out) / f"{name}-t{temperature:g}"
    print(f"== {name} prompts, temperature {temperature:g} ({_load()})", file=sys.stderr)
    t0 = time.perf_counter()
    summary = bench_main(None, args.checkpoints, out, flags, overrides)
    r = ratios(summary)
    print(
        f"\n== {name} prompt set, temperature {temperature:g}: {_load()} at the end, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    print("\n".join(summary_lines(summary, out)[:-1]))
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    return r


def step_costs(
    args, prompt: list[int], reps: int = 60
) -> tuple[dict[str, float], dict[int, float]]:
    """c per model drafter: the median time of one single-token drafter step over the median
    time of one single-token target step (no drafting), both at ``prompt``'s length, measured
    alternately in one loop (the engine's dtypes, 1 thread); and per k of ``--k-values`` the
    median time of a target pass over k + 1 new tokens (a verify pass) over the single-token
    step's, measured alternately with it."""
    import statistics

    import torch

    from real.bench import BenchConfig, bench_engine
    from real.models import Segments
    from real.runtime import load_engine_config

    models = [d for d in args.drafters.split() if d in ("feat", "conv", "tf")]
    cfg = load_engine_config(None, {"target_dtype": args.target_dtype}, stop_at_eot=False)
    engine, drafters = bench_engine(cfg, BenchConfig(drafters=" ".join(models)), args.checkpoints)
    L = len(prompt)
    ids = torch.tensor(prompt)
    out: dict[str, float] = {}
    with torch.inference_mode():
        engine.target.step_packed(ids, Segments.one(0, 0, L), engine.state)
        for name, d in (drafters or {}).items():
            m = d.model
            st = m.new_state(L + 2, d.dtype, "cpu")
            if "known" in st:  # features of the prompt: the target's hidden states
                st["feat"][0, :L] = engine.state["hidden"].to(d.dtype)
                st["known"][0] = L - 1
            m.step_packed(ids[:-1], Segments.one(0, 0, L - 1), st)
            one, seg_d, seg_t = ids[-1:], Segments.one(0, L - 1, 1), Segments.one(0, L, 1)
            td, tt = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                m.step_packed(one, seg_d, st)
                t1 = time.perf_counter()
                engine.target.step_packed(one, seg_t, engine.state)
                tt.append(time.perf_counter() - t1)
                td.append(t1 - t0)
            out[name] = statistics.median(td) / statistics.median(tt)
        verify: dict[int, float] = {}
        for k in sorted({int(k) for k in args.k_values.split()}):
            new, seg_v, seg_t = ids[: k + 1], Segments.one(0, L, k + 1), Segments.one(0, L, 1)
            tv, tt = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                engine.target.step_packed(new, seg_v, engine.state)
                t1 = time.perf_counter()
                engine.target.step_packed(ids[:1], seg_t, engine.state)
                tt.append(time.perf_counter() - t1)
                tv.append(t1 - t0)
            verify[k] = statistics.median(tv) / statistics.median(tt)
    return out, verify


def block_draft_cost(args, prompt: list[int], k: int = 4, reps: int = 300) -> dict[str, float]:
    """The block drafter's propose call at ``k`` over the token-only conv drafter's (k
    one-token steps, its cache valid up to the round's last committed token, as in a round),
    both greedy on one row after the target prefilled ``prompt``: ``"block"``, median over
    median of alternate calls after 10 untimed calls of each (the first calls of a fresh drafter
    run up to 2x slower). Timed in the same loop, over the same median of the conv drafter's:

    - ``"no_chain"``: the same call with the adjacent-token chain off (the same weights and
      shapes; its tokens are not the drafter's): the encoder, the k slots' head in one product,
      the confidence head and the bookkeeping;
    - ``"chain_floor"``: that call with its k-row head product and argmax replaced by k one-row
      products and argmaxes (medians of each, timed in the loop): what any greedy chain
      conditioned on the token drafted before it must add, slot j's product waiting on slot
      j - 1's argmax, nothing else of the chain counted. A chained block drafter of this size
      and vocabulary costs no less on this machine."""
    import statistics

    import torch
    import torch.nn.functional as F

    from real.bench import BenchConfig, bench_engine
    from real.runtime import load_engine_config

    cfg = load_engine_config(None, {"target_dtype": args.target_dtype}, stop_at_eot=False)
    cfg = dataclasses.replace(cfg, drafter="block")
    engine, drafters = bench_engine(cfg, BenchConfig(drafters="block conv"), args.checkpoints)
    assert drafters is not None
    block, conv = drafters["block"], drafters["conv"]
    model = block.model
    chained, plain = model.cfg, dataclasses.replace(model.cfg, adjacent=0)
    head = model.embed_tokens.weight
    h1 = torch.zeros(1, head.shape[1], dtype=head.dtype)
    hk = torch.zeros(1, k, head.shape[1], dtype=head.dtype)
    L, sp = len(prompt), engine.cfg.sampling
    t: dict[str, list[float]] = {}

    def timed(name, fn) -> None:
        t0 = time.perf_counter()
        fn()
        t.setdefault(name, []).append(time.perf_counter() - t0)

    def unchained() -> None:
        model.cfg = plain
        try:
            block.propose_batch(engine.seq, [0], [L], [k], [0.0], sp, [None])
        finally:
            model.cfg = chained

    with torch.inference_mode():
        engine.seq[0, :L] = torch.tensor(prompt)
        engine.prefill_rows([0], [0], [L - 1])  # hands the target's states to the block drafter
        conv.propose_batch(engine.seq, [0], [L], [k], [0.0], sp, [None])  # its cache: prompt
        for i in range(reps + 10):  # the first 10 of each warm up, untimed
            if i == 10:
                t.clear()
            conv.set_valid(0, L - 1)
            timed("conv", lambda: conv.propose_batch(engine.seq, [0], [L], [k], [0.0], sp, [None]))
            timed(
                "block", lambda: block.propose_batch(engine.seq, [0], [L], [k], [0.0], sp, [None])
            )
            timed("no_chain", unchained)
            timed("head_1", lambda: F.linear(h1, head).argmax(-1))
            timed("head_k", lambda: F.linear(hk, head).argmax(-1))
    m = {name: statistics.median(v) for name, v in t.items()}
    floor = m["no_chain"] - m["head_k"] + k * m["head_1"]
    return {
        "block": m["block"] / m["conv"],
        "no_chain": m["no_chain"] / m["conv"],
        "chain_floor": floor / m["conv"],
    }


def block_slots(rounds_csv: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The block drafter's verified slots in a run's ``rounds.csv`` (methods ``block/*``):
    their confidences and outcomes (per round, position j < drafted counts when j <= accepted,
    hit when j < accepted); None without a file or a slot."""
    import pandas as pd

    from real.block_recalibration import verified_slots

    if not rounds_csv.is_file():
        return None
    df = pd.read_csv(rounds_csv)
    df = df[df["controller"].astype(str).str.startswith("block/")]
    conf: list[float] = []
    hit: list[float] = []
    for c, d, n in zip(df["confidences"], df["drafted"], df["accepted"]):
        cs = [float(x) for x in str(c).split()] if isinstance(c, str) else []
        zs, ys = verified_slots(cs, int(d), int(n))
        conf += zs
        hit += ys
    return (np.array(conf), np.array(hit)) if conf else None


def floor_line(slots: tuple[np.ndarray, np.ndarray] | None, draws: int = 200) -> str | None:
    """The block ECE of ``slots`` (:func:`block_slots`) beside its noise floor: what a
    perfectly calibrated head would score on as many slots with the same confidences
    (``real.block_train.ece_floor``, seeded); None without slots."""
    from real.block_train import ece, ece_floor

    if slots is None:
        return None
    mean, p95 = ece_floor(slots[0], draws, np.random.default_rng(0))
    return (
        f"block confidence ECE {ece(*slots):.3f} over {len(slots[0])} verified slots; a "
        f"calibrated head would score {mean:.3f} on them (95%: {p95:.3f})"
    )


def block_line(g: dict, cost: float | None, conf_ece: float | None) -> str:
    """The block drafter's last line from the unseen greedy run's ratios ``g``."""
    block = g.get("block_vs_ar")
    ar = [g[f] for f in ("conv_vs_ar", "feat_vs_ar", "tf_vs_ar") if g.get(f) is not None]
    vs_best = block / max(ar) if block is not None and ar else None

    def f(v):
        return "nan" if v is None else f"{v:.3f}"

    return (
        f"real_block_draft_cost_vs_ar_k4={f(cost)} real_block_speedup_vs_ar={f(block)} "
        f"real_block_vs_best_ar_drafter={f(vs_best)} block_conf_ece={f(conf_ece)}"
    )


def ceiling_line(verify: dict[int, float]) -> str:
    """What fixed k could reach at most on these costs: every draft accepted (k + 1 tokens a
    round) and drafting free, over target-only's one token per single-token step."""
    return "ceiling at fixed k (every draft accepted, drafting free: (k+1) / verify ratio): " + (
        ", ".join(f"k = {k} {(k + 1) / v:.2f}x" for k, v in verify.items())
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        from real.block_train import ece
        from real.store import load_bundle

        tok = load_bundle(args.checkpoints, names=()).tokenizer
        results: dict[tuple[str, float], dict] = {}
        temps = [0.0] + ([] if args.no_sampled else [args.temperature])
        for name in args.sets.split():
            if name not in ("unseen", "heldout"):
                raise DSparkError(f"--sets: unknown set {name!r}; allowed unseen, heldout")
            pf = None
            if name == "unseen":
                root = Path(args.site_packages)
                ps = unseen_prompts(tok, args.prompts, args.prompt_tokens, args.min_bytes, root)
                pf = Path(args.out) / "unseen_prompts.jsonl"
                write_prompt_file(tok, ps, pf)
                print("unseen prompts: " + ", ".join(p["file"] for p in ps))
            for t in temps:
                results[(name, t)] = run_one(args, name, t, pf)
        if args.c_prompt_tokens:
            c, verify = step_costs(args, held_prompt(tok, args.c_prompt_tokens))
            print(
                f"c (one drafter step / one target step, {args.c_prompt_tokens} tokens of "
                f"context, {_load()}): " + ", ".join(f"{k} {v:.3f}" for k, v in c.items())
            )
            print(
                "verify pass of k + 1 tokens / one target step: "
                + ", ".join(f"k = {k} {v:.2f}" for k, v in verify.items())
            )
            print(ceiling_line(verify))
        cost = None
        if "block" in args.drafters.split():
            costs = block_draft_cost(args, held_prompt(tok, 128))
            cost = costs["block"]
            print(
                f"block drafter propose call at k = 4 / conv drafter's ({_load()}): {cost:.3f}; "
                f"without the adjacent-token chain {costs['no_chain']:.3f}; a greedy chain's "
                f"floor (that call with 4 one-row head products) {costs['chain_floor']:.3f}"
            )
    except DSparkError as e:
        print(f"real_speed: error: {e}", file=sys.stderr)
        return 2
    g = results.get(("unseen", 0.0), {})
    s = results.get(("unseen", args.temperature), {})

    def f(v):
        return "nan" if v is None else f"{v:.3f}"

    use_block = "block" in args.drafters.split()
    slots = block_slots(Path(args.out) / "unseen-t0" / "rounds.csv") if use_block else None
    floor = floor_line(slots)
    if floor is not None:
        print(floor)
    print(
        f"real_unseen_speedup_vs_ar={f(g.get('best_vs_ar'))} "
        f"real_unseen_speedup_vs_hf={f(g.get('best_vs_hf_best'))} "
        f"real_unseen_conv_vs_ar={f(g.get('feat_vs_ar'))} "
        f"real_sampled_speedup_vs_ar={f(s.get('best_vs_ar'))}"
    )
    print(block_line(g, cost, None if slots is None else ece(*slots)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
