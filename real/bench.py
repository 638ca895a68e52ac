"""Speed comparison at batch 1: target-only decoding vs the engine with every controller vs
Hugging Face assisted generation on the same weights. Writes a ``kind = "real"`` run folder.

Methods run interleaved within each repeat (the order rotates per repeat) so that drift of a
shared machine spreads over all of them; tokens/s of a method in a repeat is the total of new
tokens over all prompts divided by the total wall time (prefill included). Medians and
p10/p90 over repeats are reported.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from control.configio import param
from control.errors import DSparkError
from control.metrics import json_safe, range_pct_of_median, round_totals, speculation_metrics
from control.registry import controller_spec, make_config


@dataclass(frozen=True)
class BenchConfig:
    # 8 held-out prompts x 128 new tokens: ~1000 tokens per method per repeat.
    prompts: int = param(8, lo=1, hi=1000, doc="held-out prompts")
    prompt_tokens: int = param(128, lo=4, hi=1024, doc="tokens per prompt")
    new_tokens: int = param(128, lo=1, hi=1024, doc="new tokens per prompt")
    # 3 repeats give a median and a spread without taking all day on 2 cores.
    repeats: int = param(3, lo=1, hi=100, doc="repeats of every method")
    workload: str = param(
        "code",
        choices=("code", "prose", "mixed"),
        doc="held-out workload (mixed: code and prose prompts alternating)",
    )
    # the user's own prompts instead of the workload (real.promptfiles: a prompt per line or
    # JSONL record, or a folder windowed): `prompts` of them, each cut to its last
    # `prompt_tokens` tokens (a folder: windows of 8 to prompt_tokens tokens).
    prompt_file: str = param("", doc="prompt file or folder (empty = the workload)")
    # 1 thread: more threads are faster only on otherwise idle cores; with other processes on
    # the cores threads stall on each other (many times slower), so 1 is the robust default.
    threads: int = param(1, lo=1, hi=256, doc="torch CPU threads")
    k_values: str = param("1 2 3 4 5 6 7 8", doc="fixed-k values, space separated")
    controllers: str = param(
        "hf-heuristic confidence-stop ema-hysteresis analytic dspark",
        doc="adaptive controllers to run, space separated: NAME or NAME:key=value,...",
    )
    hf: bool = param(True, doc="also run Hugging Face assisted generation (bench extra)")
    # empty = strict only; e.g. "0.99 0.85 0.7" measures threshold (β) verification's quality
    # cost against strict greedy on the same prompts (real.quality.threshold_quality, k = 4).
    quality_betas: str = param("", doc="β values whose quality change to measure, space separated")
    # empty = the engine's drafter only; e.g. "ngram ngram+conv tf" benches those drafters in
    # the same interleaved run (methods named drafter/controller), so one last line compares
    # the best of all of them with the HF settings measured beside them.
    drafters: str = param("", doc="drafters to bench side by side, space separated")


def held_out_prompts(tok, workload: str, n: int, length: int) -> list[list[int]]:
    """``n`` evenly spaced windows of ``length`` tokens from the test split (never trained on);
    ``mixed``: code and prose windows alternating (the code half first when ``n`` is odd)."""
    from real import corpus
    from real.train import encode_docs

    if workload == "mixed":
        code = held_out_prompts(tok, "code", (n + 1) // 2, length)
        prose = held_out_prompts(tok, "prose", n // 2, length) if n > 1 else []
        return [p for pair in zip(code, prose + [None]) for p in pair if p is not None]

    ids = encode_docs(tok, corpus.documents(workload, "test"))
    if len(ids) < n * length:
        raise DSparkError(f"test split of {workload} has only {len(ids)} tokens")
    starts = np.linspace(0, len(ids) - length - 1, n).astype(int)
    return [ids[s : s + length].astype(int).tolist() for s in starts]


def copyable_fraction(prompts: list[list[int]], outputs: list[list[int]], n: int = 4) -> float:
    """Fraction of output tokens that follow an earlier occurrence of their preceding ``n``
    tokens (in prompt + output so far) and equal what followed it: how much of the text a
    prompt-lookup drafter could copy. Greedy decoding of a small model repeats itself, and
    lookup drafters profit from exactly that, so the benchmark reports it beside its speeds."""
    hit = total = 0
    for p, out in zip(prompts, outputs):
        seq = list(p) + list(out)
        last: dict[tuple, int] = {}  # n-gram -> index of the token after its latest occurrence
        for i in range(n, len(seq)):
            key = tuple(seq[i - n : i])
            if i >= len(p):
                total += 1
                j = last.get(key)
                hit += j is not None and seq[j] == seq[i]
            last[key] = i
    return hit / total if total else float("nan")


def _summ(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "p10": float(np.percentile(values, 10)),
        "p90": float(np.percentile(values, 90)),
        "min": min(values),
        "max": max(values),
    }


def acceptance_stats(records) -> dict[str, float]:
    """Speculation metrics of a method's rounds (:mod:`control.metrics`) and its mean k."""
    t = round_totals([r.accepted for r in records], [r.drafted for r in records])
    return {
        **speculation_metrics(**t),
        "mean_k": t["drafted"] / t["rounds"] if t["rounds"] else float("nan"),
        "rounds": t["rounds"],
    }


#: Hugging Face settings benched beside the engine (method name -> (schedule, k, confidence);
#: None = HF's own target-only generate). The "transformers-" prefix is never confused with
#: the lab's "hf-heuristic" controller.
HF_SETTINGS: dict[str, tuple | None] = {
    "transformers-target-only": None,
    "transformers-assisted-heuristic": ("heuristic", 20, 0.4),
    "transformers-assisted-k4": ("constant", 4, 0.0),
    "transformers-assisted-k6": ("constant", 6, 0.0),
    "transformers-assisted-k8": ("constant", 8, 0.0),
    "transformers-assisted-k12": ("constant", 12, 0.0),
    "transformers-prompt-lookup": ("lookup", 10, 0.0),
    "transformers-prompt-lookup-k4": ("lookup", 4, 0.0),
}


def _methods(bc: BenchConfig, drafters: dict) -> dict[str, tuple | None]:
    """Engine methods: name -> (controller, config, drafter); ``target-only`` -> None."""
    methods: dict[str, tuple | None] = {"target-only": None}
    for label, d in drafters.items():
        pre = f"{label}/" if label else ""
        for k in bc.k_values.split():
            methods[f"{pre}fixed-k{int(k)}"] = ("fixed", {"k": int(k)}, d)
        for spec in bc.controllers.split():  # NAME or NAME:key=value,...
            name, cfg, label = controller_spec(spec)
            checked = make_config(name, cfg, source=f"controllers {spec!r}")  # before any run
            methods[f"{pre}{label}"] = (name, checked, d)
    return methods


def _run_method(engine, m: str, method, prompts, n_new: int, hf_pair) -> tuple[float, list, list]:
    """One method over every prompt: (seconds, outputs, round records)."""
    from control import make_controller

    total_s, toks, recs = 0.0, [], []
    for i, p in enumerate(prompts):
        if m == "target-only":
            t0 = time.perf_counter()
            if engine.cfg.sampling.greedy:
                toks_i = engine.greedy_reference(p, n_new)
            else:  # the sampled baseline samples too
                toks_i = engine.sample_reference(p, n_new)
            total_s += time.perf_counter() - t0
        elif m in HF_SETTINGS:
            toks_i, s = hf_generate(hf_pair, p, n_new, HF_SETTINGS[m], engine.cfg.sampling)
            total_s += s
        else:
            name, cfg, engine.drafter = method
            rc = getattr(engine.drafter, "recalibration", None)
            if rc is not None and i == 0:  # each method's pass starts as a fresh server
                rc.reset()
            g = engine.generate(p, n_new, make_controller(name, cfg), request_id=i)
            total_s += g.seconds
            toks_i = g.tokens
            recs.extend(dataclasses.replace(r, controller=m) for r in g.records)
        toks.append(toks_i)
    return total_s, toks, recs


def _measure(
    engine, bc: BenchConfig, prompts, methods: dict, names: list[str], hf_pair, progress: bool
) -> tuple[dict, dict, list]:
    """Every method in every repeat, interleaved (the order rotates per repeat): tokens/s per
    repeat, the last outputs, and the last repeat's round records."""
    results: dict[str, list[float]] = {m: [] for m in names}
    outputs: dict[str, list[list[int]]] = {}
    records_all: list = []
    own = engine.drafter
    for rep in range(bc.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for m in order:
            total_s, toks, recs = _run_method(
                engine, m, methods.get(m), prompts, bc.new_tokens, hf_pair
            )
            results[m].append(sum(len(t) for t in toks) / total_s)
            outputs[m] = toks
            if rep == bc.repeats - 1:
                records_all.extend(recs)
            if progress:
                print(
                    f"  repeat {rep + 1}/{bc.repeats} {m:24s} {results[m][-1]:8.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    engine.drafter = own
    return results, outputs, records_all


def _rows(names: list[str], results: dict, outputs: dict, records_all: list) -> list[dict]:
    ref = outputs["target-only"]
    ar_med = statistics.median(results["target-only"])
    rows = []
    for m in names:
        s = _summ(results[m])
        match = sum(a == b for x, y in zip(outputs[m], ref) for a, b in zip(x, y)) / sum(
            len(y) for y in ref
        )
        row = {
            "controller": m,
            "tokens_per_s": s["median"],
            "tokens_per_s_p10": s["p10"],
            "tokens_per_s_p90": s["p90"],
            "tokens_per_s_min": s["min"],
            "tokens_per_s_max": s["max"],
            "spread_pct": range_pct_of_median(results[m]),
            "speedup_vs_ar": s["median"] / ar_med,
            "greedy_match_rate": match,
        }
        recs = [r for r in records_all if r.controller == m]
        if recs:
            row.update(acceptance_stats(recs))
        rows.append(row)
    return rows


def _fastest(rows: list[dict], prefix: str = "") -> dict | None:
    cand = [r for r in rows if r["controller"].startswith(prefix)]
    return max(cand, key=lambda r: r["tokens_per_s"]) if cand else None


def _hf_speedups(rows: list[dict], best: dict) -> dict:
    """The peer baseline: the best Hugging Face speculative setting of any kind (assisted
    generation with the same transformer drafter, or prompt lookup), and the assisted-only and
    prompt-lookup ratios beside it."""
    hf_rows = [
        r
        for r in rows
        if r["controller"] in HF_SETTINGS and r["controller"] != "transformers-target-only"
    ]
    best_hf = _fastest(hf_rows)
    assisted = _fastest(hf_rows, "transformers-assisted")
    lookup = _fastest(hf_rows, "transformers-prompt-lookup")
    tps = best["tokens_per_s"]
    return {
        "best_hf": best_hf["controller"] if best_hf else None,
        "speedup_vs_hf": tps / best_hf["tokens_per_s"] if best_hf else None,
        "speedup_vs_hf_assisted": tps / assisted["tokens_per_s"] if assisted else None,
        "speedup_vs_hf_prompt_lookup": tps / lookup["tokens_per_s"] if lookup else None,
    }


def _quality_rows(engine, bc: BenchConfig, prompts, progress: bool) -> list[dict]:
    """Threshold (β) verification's quality change per ``bc.quality_betas`` value."""
    from real.quality import threshold_quality

    rows = []
    for beta in (float(b) for b in bc.quality_betas.split()):
        q = threshold_quality(engine, prompts, bc.new_tokens, beta)
        rows.append(
            {
                "controller": f"threshold-beta{beta:g}",
                "beta": beta,
                "nll_change_pct": q["nll_change_pct"],
                "token_agreement": q["agreement"],
                "lossy_accept_fraction": q["lossy_fraction"],
                "mean_accepted_length": q["mean_accepted_length_threshold"],
            }
        )
        if progress:
            print(
                f"  threshold beta={beta:g}: NLL change {q['nll_change_pct']:+.2f}%, "
                f"agreement {q['agreement']:.3f}",
                file=sys.stderr,
                flush=True,
            )
    return rows


def _write_run(out: Path, engine, bc: BenchConfig, summary: dict, records_all: list) -> None:
    import pandas as pd

    from control.configio import to_toml
    from control.types import records_to_columns

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records_to_columns(records_all)).to_csv(out / "rounds.csv", index=False)
    pd.DataFrame(summary["rows"]).to_csv(out / "results.csv", index=False)
    (out / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")
    (out / "config.toml").write_text(
        "[engine]\n" + to_toml(engine.cfg) + "\n[bench]\n" + to_toml(bc)
    )


def _module_params(obj: Any) -> int:
    """Parameters of the torch module a drafter (or a model) wraps; 0 for none (n-gram)."""
    while obj is not None and not isinstance(obj, torch.nn.Module):
        obj = getattr(obj, "model", None)
    return sum(p.numel() for p in obj.parameters()) if obj is not None else 0


def provenance(engine, drafter) -> dict:
    """What the run's ``summary.json`` records about where it ran (reports read it)."""
    import platform

    cuda = engine.cfg.device == "cuda"
    return {
        "hardware": torch.cuda.get_device_name()
        if cuda
        else f"CPU ({platform.machine() or platform.processor() or 'unknown'})",
        "device": engine.cfg.device,
        "num_gpus": 1 if cuda else 0,
        "tensor_parallel": 1,
        "target_params": _module_params(engine.target),
        "drafter_params": _module_params(drafter),
    }


def run_bench(
    engine,
    bc: BenchConfig,
    out: Path | None,
    progress: bool = True,
    hf_pair=None,
    drafters: dict | None = None,
) -> dict:
    """Run every method; return the summary (and write the run folder when ``out`` is set).

    ``drafters`` (label -> drafter object) benches each controller with each drafter in the
    same run, methods named ``label/controller``; by default the engine's own drafter, with
    plain controller names."""
    torch.set_num_threads(bc.threads)
    if bc.prompt_file:
        from real.promptfiles import file_prompts

        prompts = file_prompts(
            bc.prompt_file,
            engine.tokenizer,
            bc.prompts,
            min(8, bc.prompt_tokens),
            bc.prompt_tokens,
            0,
        )
    else:
        prompts = held_out_prompts(engine.tokenizer, bc.workload, bc.prompts, bc.prompt_tokens)
    drafters = drafters or {"": engine.drafter}
    methods = _methods(bc, drafters)
    hf = bc.hf and hf_pair is not None
    names = list(methods) + (list(HF_SETTINGS) if hf else [])
    results, outputs, records_all = _measure(engine, bc, prompts, methods, names, hf_pair, progress)
    rows = _rows(names, results, outputs, records_all)
    best = max(
        (r for r in rows if r["controller"] in methods and r["controller"] != "target-only"),
        key=lambda r: r["tokens_per_s"],
    )
    summary = {
        "kind": "real",
        "rows": rows,
        "best": best["controller"],
        "best_greedy_match_rate": best["greedy_match_rate"],
        "target_dtype": engine.cfg.precision,
        "speedup_vs_ar": best["speedup_vs_ar"],
        **_hf_speedups(rows, best),
        "bench_config": dataclasses.asdict(bc),
        "engine_config": engine.cfg.record(),
        "drafter": methods[best["controller"]][2].name,
        **provenance(engine, methods[best["controller"]][2]),
        "drafters": [d.name for d in drafters.values()],
        "prompts": len(prompts),
        "copyable_fraction": copyable_fraction(prompts, outputs["target-only"]),
    }
    if hf_pair is not None:
        summary["hf_max_logit_difference"] = hf_pair.get("logit_diff")
    rows += _quality_rows(engine, bc, prompts, progress)
    if out is not None:
        _write_run(out, engine, bc, summary, records_all)
    return summary


def hf_pair_for(engine, drafter_model) -> dict:
    """HF copies of the engine's target and a transformer drafter, and their export error."""
    from real.hf_export import max_logit_difference, to_llama

    eot = engine.eot_id
    target = to_llama(engine.target, eot)
    draft = to_llama(drafter_model, eot)
    ids = torch.tensor([list(range(1, 200))])
    diff = max(
        max_logit_difference(engine.target.float(), to_llama(engine.target.float(), eot), ids),
        max_logit_difference(drafter_model, draft, ids),
    )
    engine.target.to(next(target.parameters()).dtype)
    for m in (target, draft):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = eot
    return {"target": target, "draft": draft, "logit_diff": diff}


@torch.inference_mode()
def hf_generate(pair: dict, prompt: list[int], n: int, setting, sp=None) -> tuple[list[int], float]:
    """HF generation of ``n`` tokens; ``sp`` (``real.sampling.SamplingParams``, None = greedy):
    the engine's sampling parameters, so that a sampled engine run is compared with HF
    sampling at the same temperature / top-k / top-p."""
    ids = torch.tensor([prompt])
    # an explicit all-ones mask: pad_token_id is the end-of-text id, and without a mask HF
    # treats every end-of-text token inside a prompt (held-out windows cross document
    # boundaries) as padding and masks it out: a different computation from the engine's.
    kw = dict(
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        use_cache=True,
        attention_mask=torch.ones_like(ids),
    )
    if sp is not None and not sp.greedy:
        kw.update(do_sample=True, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p)
    if setting is not None and setting[0] == "lookup":
        kw["prompt_lookup_num_tokens"] = setting[1]  # HF's n-gram drafter (no model)
    elif setting is not None:
        schedule, k, conf = setting
        d = pair["draft"]
        d.generation_config.num_assistant_tokens = k
        d.generation_config.num_assistant_tokens_schedule = schedule
        d.generation_config.assistant_confidence_threshold = conf
        kw["assistant_model"] = d
    t0 = time.perf_counter()
    out = pair["target"].generate(ids, **kw)
    s = time.perf_counter() - t0
    return out[0, len(prompt) :].tolist(), s


def format_table(summary: dict) -> str:
    nan = float("nan")
    lines = [
        (
            f"{'method':24s} {'tok/s':>8s} {'p10':>8s} {'p90':>8s} {'x AR':>6s} "
            f"{'match':>6s} {'acc.len':>7s} {'a':>5s}"
        )
    ]
    quality = []
    for r in summary["rows"]:
        if "nll_change_pct" in r:
            quality.append(
                f"{r['controller']:24s} NLL change {r['nll_change_pct']:+.2f}%, "
                f"agreement with strict {r['token_agreement']:.3f}, lossy accepts "
                f"{100 * r['lossy_accept_fraction']:.2f}%"
            )
            continue
        lines.append(
            f"{r['controller']:24s} {r['tokens_per_s']:8.1f} "
            f"{r['tokens_per_s_p10']:8.1f} {r['tokens_per_s_p90']:8.1f} "
            f"{r['speedup_vs_ar']:6.2f} {r['greedy_match_rate']:6.3f} "
            f"{r.get('mean_accepted_length', nan):7.2f} "
            f"{r.get('acceptance_rate', nan):5.2f}"
        )
    return "\n".join(lines + quality)


def reference_note(target_dtype: str) -> str:
    """What the ``match`` column compares against, in words (printed with every table)."""
    head = (
        f"match = share of tokens equal to target-only greedy decoding of the same "
        f"{target_dtype} target"
    )
    if target_dtype in ("float32", "float64"):
        return head + f" (strict speculative output is token-identical in {target_dtype})"
    return (
        head + f" (a {target_dtype} reference, not a float32 one); below 1.000 where a "
        "near-tie is broken differently by batched verification and one-token decoding. "
        "Token-identical in float32: --target-dtype float32"
    )


def load_bench_config(config_path: str | None, overrides: dict) -> BenchConfig:
    """BenchConfig from ``config_path``'s [bench] table, then ``overrides``."""
    from control.configio import from_mapping, read_toml

    data = dict(read_toml(config_path).get("bench", {})) if config_path else {}
    data.update(overrides)
    return from_mapping(BenchConfig, data, source=config_path or "<command line>", prefix="bench")


def bench_engine(cfg, bc: BenchConfig, checkpoints: str | None) -> tuple[Any, dict | None]:
    """The engine, and with ``bench.drafters`` every named drafter (label -> drafter object,
    the engine's own among them) built from one loaded bundle; else (engine, None)."""
    from real import DRAFTERS
    from real.checkpoint import DTYPES
    from real.runtime import build_drafter, build_engine, drafter_models
    from real.store import load_bundle

    names = bc.drafters.split()
    if not names:
        return build_engine(cfg, checkpoints), None
    bad = [n for n in names if n not in DRAFTERS]
    if bad:
        raise DSparkError(
            f"bench.drafters: unknown drafter {bad[0]!r}; allowed {', '.join(DRAFTERS)}"
        )
    models = sorted({m for n in names for m in drafter_models(n)})
    bundle = load_bundle(
        checkpoints,
        names=("target", *models),
        target_dtype=DTYPES[cfg.precision],
        drafter_dtype=DTYPES[cfg.drafter_dtype],
        device=cfg.device,
    )
    if cfg.drafter not in names:
        cfg = dataclasses.replace(cfg, drafter=names[0])
    engine = build_engine(cfg, bundle=bundle)
    return engine, {
        n: engine.drafter if n == cfg.drafter else build_drafter(cfg, bundle, n) for n in names
    }


def load_hf_pair(engine, checkpoints: str | None) -> dict | None:
    """HF copies of the target and the transformer drafter, or None (a line on stderr) when
    transformers is not installed."""
    from real.store import load_model

    try:
        import transformers  # noqa: F401
    except ImportError:
        print(
            "transformers not installed (pip install 'dspark-lab[bench]'): skipping HF",
            file=sys.stderr,
        )
        return None
    tf = load_model("drafter_tf", checkpoints, dtype=torch.float32)
    pair = hf_pair_for(engine, tf)
    print(
        f"HF export: max |logit difference| = {pair['logit_diff']:.3g} (float32)", file=sys.stderr
    )
    return pair


def bench_main(
    config_path: str | None, checkpoints: str | None, out: Path, engine_flags: dict, overrides: dict
) -> dict:
    """Shared by ``dspark real bench`` and ``benchmarks/real_speed.py``: build the engine
    (``config_path``'s [engine] table, then ``engine_flags``) and the bench config, run, write
    the run folder ``out``; returns the summary (the caller prints it)."""
    from real.runtime import load_engine_config

    bc = load_bench_config(config_path, overrides)
    torch.set_num_threads(bc.threads)
    cfg = load_engine_config(
        config_path,
        engine_flags,
        stop_at_eot=False,
        max_len=max(1024, bc.prompt_tokens + bc.new_tokens),
    )
    engine, drafters = bench_engine(cfg, bc, checkpoints)
    pair = load_hf_pair(engine, checkpoints) if bc.hf else None
    return run_bench(engine, bc, out, hf_pair=pair, drafters=drafters)


def summary_lines(summary: dict, out: Path) -> list[str]:
    """What ``dspark real bench`` prints after a run: the table, the run folder, how much of the
    output prompt lookup could copy, the comparison with HF, and the headline numbers."""
    t = summary["engine_config"]["temperature"]
    how = "greedy" if t == 0 else f"temperature {t:g}"
    lines = [
        format_table(summary),
        f"run folder: {out}",
        (
            f"target-only output ({how}): {summary['copyable_fraction']:.3f} of its tokens "
            "repeat what followed an earlier occurrence of their preceding 4 tokens (prompt "
            "lookup's share)"
        ),
    ]
    hf = summary["speedup_vs_hf"]
    if hf is not None:
        lines.append(
            f"best engine method {summary['best']} ({summary['drafter']} drafter, match "
            f"{summary['best_greedy_match_rate']:.3f}) vs HF: "
            f"{hf:.3f}x the best HF setting ({summary['best_hf']}), "
            f"{summary['speedup_vs_hf_assisted']:.3f}x the best HF assisted generation, "
            f"{summary['speedup_vs_hf_prompt_lookup']:.3f}x the best HF prompt lookup"
        )
    lines.append(reference_note(summary["target_dtype"]))
    lines.append(
        f"real_speedup_vs_ar={summary['speedup_vs_ar']:.3f} "
        f"real_speedup_vs_hf={'nan' if hf is None else f'{hf:.3f}'}"
    )
    return lines
