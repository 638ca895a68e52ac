"""Assemble a report from loaded runs: one builder per section; a section whose data no run
saved is skipped, and the report says why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from control.errors import DSparkError
from reports import build_slo, plots
from reports.analysis import (
    NO_SPEC,
    acceptance_by_position,
    comparison_table,
    fmt_num,
    format_comparison,
    full_table,
    reference_slice,
)
from reports.answer import answer, answer_sentence
from reports.build_slo import ANSWER_TITLE, CAPACITY_TITLE, HELDOUT_TABLES, SLO_TITLE
from reports.claims import audit, real_provenance
from reports.loader import Run, load_runs
from reports.plots import MIN_POSITION_ROUNDS
from reports.render import FigureBlock, Report, Section, TableBlock, slug, write_report
from reports.slo import slo_of
from reports.style import controller_colors, family

Result = Section | str  # a section, or why it was skipped


def _slug(text: str) -> str:
    return slug(text)


def _fig(name: str, caption: str, fig) -> FigureBlock:
    return FigureBlock(name, caption, plots.figure_png(fig))


def _label(run: Run) -> str:
    sc = run.summary.get("scenario") or run.summary.get("study_name")
    return f"run `{run.name}`" + (f" — {sc}" if sc else "")


def _with(runs: list[Run], kind: str, table: str) -> list[Run]:
    return [r for r in runs if r.kind == kind and table in r.tables]


class Builder:
    def __init__(self, runs: list[Run]):
        self.runs = runs
        names: set[str] = set()
        for r in runs:
            for t in r.tables.values():
                if "controller" in t.columns:
                    names.update(t["controller"].dropna().astype(str))
        self.colors = controller_colors(names)

    def _per_run(self, sec: Section, runs: list[Run], body: Callable[[Section, Run, str], None]):
        for r in runs:
            if len(runs) > 1:
                sec.h3(_label(r))
            body(sec, r, _slug(r.name))

    # -- the user's question (reports/build_slo.py) ---------------------------------------
    def answer(self) -> Result:
        return build_slo.answer_section(self)

    def slo(self) -> Result:
        return build_slo.slo_section(self)

    def capacity(self) -> Result:
        return build_slo.capacity_section(self)

    # -- simulator -------------------------------------------------------------------------
    def comparison(self) -> Result:
        runs = _with(self.runs, "simulate", "results")
        if not runs:
            return "no simulate run given (run `dspark simulate`)."
        sec = Section("comparison", "Controller comparison (simulator)")
        sec.p(
            "Per controller at the nominal operating point; role says which rows compete "
            "(contender), which do not speculate (no speculation) and which are references "
            "told what no engine knows. Two baselines, two ratios: *throughput ÷ k = 0 with "
            "drafter* divides by the visible no-speculation row (`fixed:k=0`: k = 0 with the "
            "drafter resident, its memory taken); *TPOT speedup vs k = 0 without drafter* is "
            "the simulator's `speedup`, the ratio of token-weighted mean TPOT to a hidden "
            "k = 0 run without any drafter, same seed and arrivals — a per-token latency "
            "ratio, not a throughput ratio. ± over seeds is half the range of throughput over "
            "seeds. â = Σn / (Σn + rounds ending in a rejection); VPR = accepted / drafted; DU "
            "= drafted tokens kept / drafted; lossy accepts are the quality cost of threshold "
            "verification (0 in strict mode)."
        )

        self._per_run(sec, runs, self._comparison_run)
        return sec

    def _comparison_run(self, s: Section, r: Run, slug: str) -> None:
        res = r.tables["results"]
        ref, where = reference_slice(res)
        table = comparison_table(ref)
        a = answer(ref, slo=slo_of(r))
        if a is not None:
            s.p(f"At {where}: {answer_sentence(a)}")
        k0 = table[(table["role"] == NO_SPEC) & (table["controller"].map(family) == "fixed")]
        if len(k0) and "speedup" in table.columns:
            row = k0.iloc[0]
            s.p(
                f"`{row['controller']}` is k = 0 with the drafter resident (loaded, never "
                f"used): its throughput is the 1.00× of the throughput ratio, and its TPOT "
                f"speedup reads {fmt_num(row['speedup'], '{:.2f}')}× because that column's "
                "baseline is k = 0 without a drafter, a run not shown as a row."
            )
        s.blocks.append(
            TableBlock(
                f"comparison_{slug}",
                f"throughput and latency — {_label(r)}: {where}",
                format_comparison(table, "speed"),
                table,
            )
        )
        s.blocks.append(
            TableBlock(
                f"comparison_speculation_{slug}",
                f"speculation, utilization and quality — {where}",
                format_comparison(table, "speculation"),
                table,
                show=True,
            )
        )
        s.blocks.append(
            TableBlock(
                f"simulate_all_points_{slug}",
                "Every saved operating point (mean over seeds)",
                full_table(res),
                show=False,
            )
        )

    def load(self) -> Result:
        runs = [
            r
            for r in _with(self.runs, "simulate", "results")
            if r.tables["results"]["load_scale"].nunique() > 1
        ]
        if not runs:
            return "no simulate run saved more than one load level (sweep `load_scale`)."
        sec = Section("load", "Throughput against offered load")
        sec.p("Mean over seeds; the band spans the seeds' minimum to maximum.")
        self._per_run(
            sec,
            runs,
            lambda s, r, slug: s.blocks.append(
                _fig(
                    f"throughput_vs_load_{slug}",
                    f"Throughput against offered load ({_label(r)})",
                    plots.plot_throughput_vs_load(r.tables["results"], self.colors),
                )
            ),
        )
        return sec

    def latency(self) -> Result:
        runs = _with(self.runs, "simulate", "requests")
        if not runs:
            return "no simulate run saved requests.csv."
        sec = Section("latency", "Latency distributions")
        sec.p(
            "Empirical CDFs over finished requests: time per output token after the first, and "
            "end-to-end latency including queueing and prefill."
        )
        self._per_run(
            sec,
            runs,
            lambda s, r, slug: s.blocks.append(
                _fig(
                    f"latency_cdfs_{slug}",
                    f"TPOT and end-to-end latency CDFs ({_label(r)})",
                    plots.plot_latency_cdfs(r.tables["requests"], self.colors),
                )
            ),
        )
        return sec

    def traces(self) -> Result:
        runs = _with(self.runs, "simulate", "trace")
        if not runs:
            return "no simulate run saved controller_trace.csv (run `dspark simulate --trace`)."
        sec = Section("traces", "Controller traces")
        sec.p(
            "How each controller moved its draft length k, aggressiveness α, verify threshold β "
            "and acceptance estimate â during one request (the one with the longest trace); "
            "parameters change only at block ends."
        )
        self._per_run(
            sec,
            runs,
            lambda s, r, slug: s.blocks.append(
                _fig(
                    f"controller_traces_{slug}",
                    f"Controller state over time ({_label(r)})",
                    plots.plot_controller_traces(r.tables["trace"], self.colors),
                )
            ),
        )
        return sec

    def acceptance(self) -> Result:
        runs = [r for r in self.runs if r.kind in ("simulate", "real") and "rounds" in r.tables]
        if not runs:
            return "no run saved rounds.csv (run `dspark simulate --trace` or `dspark real trace`)."
        sec = Section("acceptance", "Acceptance by draft position")
        sec.p(
            "Left: the chance that drafted token i survives verification. Right: the per-token "
            "rate once tokens 1..i−1 were accepted — flat for an i.i.d. drafter, falling when "
            "the drafter drifts. Acceptance is a prefix, so the left curve never rises. A "
            f"position is joined into its curve only when at least {MIN_POSITION_ROUNDS} "
            "rounds drafted (left) or reached (right) it; rarer positions are hollow points, "
            "and the table gives every count."
        )

        def body(s: Section, r: Run, slug: str):
            t = acceptance_by_position(r.tables["rounds"])
            s.blocks.append(
                _fig(
                    f"acceptance_by_position_{slug}",
                    f"Acceptance by draft position ({_label(r)}, {r.kind})",
                    plots.plot_acceptance_by_position(r.tables["rounds"], self.colors),
                )
            )
            shown = t.assign(
                p_accepted=t["p_accepted"].map(lambda v: fmt_num(v, "{:.3f}")),
                p_accepted_given_prefix=t["p_accepted_given_prefix"].map(
                    lambda v: fmt_num(v, "{:.3f}")
                ),
            )
            s.blocks.append(
                TableBlock(
                    f"acceptance_by_position_{slug}",
                    "Counts and probabilities per draft position",
                    shown,
                    t,
                    show=len(t) <= 12,
                )
            )

        self._per_run(sec, runs, body)
        return sec

    def scaling(self) -> Result:
        runs = [
            r
            for r in _with(self.runs, "simulate", "results")
            if "num_gpus" in r.tables["results"].columns
            and r.tables["results"]["num_gpus"].nunique() > 1
        ]
        if not runs:
            return (
                "no simulate run saved results across several GPU counts (a `num_gpus` "
                "sweep, e.g. 1 to 1024)."
            )
        sec = Section("scaling", "Scaling with cluster size")
        sec.p(
            "Best throughput over the tested loads at each GPU count (mean over seeds); the dashed "
            "line is perfect linear scaling from the smallest cluster."
        )
        self._per_run(
            sec,
            runs,
            lambda s, r, slug: s.blocks.append(
                _fig(
                    f"scaling_{slug}",
                    f"Throughput and speedup against GPU count ({_label(r)})",
                    plots.plot_scaling(r.tables["results"], self.colors),
                )
            ),
        )
        return sec

    # -- real engine -----------------------------------------------------------------------
    def real(self) -> Result:
        runs = _with(self.runs, "real", "real")
        if not runs:
            return "no real-engine run given (run `dspark real bench`)."
        sec = Section("real", "Real engine")
        sec.p(
            "Measured on the lab's own models; tokens/s as median with the 10th–90th "
            "percentile over repeats (none with one repeat). Quality change is the change of "
            "the target's NLL per token against strict decoding (threshold mode only; strict "
            "is lossless)."
        )

        self._per_run(sec, runs, self._real_run)
        return sec

    def _real_run(self, s: Section, r: Run, slug: str) -> None:
        t = r.tables["real"]
        what, warn = real_provenance(r)
        s.p(f"Measured: {what}." + (f" {warn}." if warn else ""))
        repeats = (r.summary.get("bench_config") or {}).get("repeats")
        shown = pd.DataFrame({"controller": t["controller"].astype(str)})
        if "mode" in t.columns:
            shown["mode"] = t["mode"].fillna("").astype(str)
        shown["tokens/s"] = [fmt_num(v, "{:,.1f}") for v in t["tokens_per_s"]]
        if {"tokens_per_s_p10", "tokens_per_s_p90"} <= set(t.columns):
            head = (
                f"p10–p90 over {repeats} repeats (tok/s)"
                if repeats
                else "p10–p90 over repeats (tok/s)"
            )
            shown[head] = [
                "— (one repeat: no spread)"
                if repeats == 1 or (pd.notna(a) and pd.notna(b) and a == b and repeats is None)
                else f"{fmt_num(a, '{:,.1f}')}–{fmt_num(b, '{:,.1f}')}"
                for a, b in zip(t["tokens_per_s_p10"], t["tokens_per_s_p90"])
            ]
        for col, head, f in (
            ("speedup_vs_ar", "speedup vs AR (×)", "{:.2f}"),
            ("mean_accepted_length", "mean accepted length", "{:.2f}"),
            ("acceptance_rate", "â", "{:.3f}"),
            ("nll_change_pct", "quality change (NLL %)", "{:+.2f}"),
            ("token_agreement", "token agreement", "{:.3f}"),
        ):
            if col in t.columns:
                shown[head] = [fmt_num(v, f) for v in t[col]]
        s.blocks.append(TableBlock(f"real_{slug}", f"{_label(r)}", shown, t))

    # -- tuning ----------------------------------------------------------------------------
    def tuning(self) -> Result:
        runs = _with(self.runs, "tune", "trials")
        if not runs:
            return "no tune run with trials.csv or an Optuna journal given (run `dspark tune`)."
        sec = Section("tuning", "Tuning history")
        sec.p(
            "Every finished trial's objective; the best-so-far line runs over the feasible "
            "trials only (those within the quality constraint, lossy accepted fraction ≤ the "
            "study's limit), so it ends at the exported `best_config.toml`. Infeasible trials "
            "are red crosses."
        )

        def body(s: Section, r: Run, slug: str):
            sm = r.summary
            info = pd.DataFrame(
                [
                    {
                        "study": str(sm.get("study_name", "")),
                        "objective": str(sm.get("objective", "")),
                        "directions": ", ".join(map(str, sm.get("directions") or [])),
                        "trials": str(sm.get("n_trials", len(r.tables["trials"]))),
                        "infeasible": str(sm.get("n_infeasible", "—")),
                        "best value": fmt_num(sm.get("best_value"), "{:,.4g}"),
                        "best params": ", ".join(
                            f"{k} = {fmt_num(v, '{:.4g}')}"
                            for k, v in (sm.get("best_params") or {}).items()
                        )
                        or "—",
                    }
                ]
            )
            s.blocks.append(TableBlock(f"tuning_summary_{slug}", f"study of {_label(r)}", info))
            s.blocks.append(
                _fig(
                    f"tuning_history_{slug}",
                    f"Tuning history ({_label(r)})",
                    plots.plot_tuning_history(r.tables["trials"], **_objectives(r)),
                )
            )

        self._per_run(sec, runs, body)
        return sec

    def importances(self) -> Result:
        runs = _with(self.runs, "tune", "importances")
        if not runs:
            return "no tune run saved importances.csv."
        sec = Section("importances", "Parameter importances")
        sec.p(
            "Share of the objective's variance explained by each tuned parameter over the "
            "completed trials (Optuna's importance evaluator)."
        )

        def body(s: Section, r: Run, slug: str):
            t = r.tables["importances"].sort_values("importance", ascending=False)
            s.blocks.append(
                _fig(
                    f"importances_{slug}",
                    f"Parameter importances ({_label(r)})",
                    plots.plot_importances(t),
                )
            )
            s.blocks.append(
                TableBlock(
                    f"importances_{slug}",
                    "importances",
                    t.assign(importance=t["importance"].map(lambda v: fmt_num(v, "{:.3f}"))),
                    t,
                )
            )

        self._per_run(sec, runs, body)
        return sec

    def pareto(self) -> Result:
        runs = _with(self.runs, "tune", "pareto")
        if not runs:
            return "no tune run saved pareto.csv (a multi-objective study writes it)."
        sec = Section("pareto", "Pareto front")
        sec.p(
            "Trials no other trial beats on both objectives; grey points are all completed trials."
        )
        self._per_run(
            sec,
            runs,
            lambda s, r, slug: s.blocks.append(
                _fig(
                    f"pareto_{slug}",
                    f"Pareto front ({_label(r)})",
                    plots.plot_pareto(r.tables["pareto"], r.tables.get("trials"), **_objectives(r)),
                )
            ),
        )
        return sec

    def evaluation(self) -> Result:
        runs = _with(self.runs, "tune", "evaluation")
        if not runs:
            return "no tune run saved evaluation.csv (held-out evaluation)."
        sec = Section("evaluation", "Held-out evaluation")
        sec.p("Tuned and baseline controllers on workloads not used for tuning; mean over seeds.")

        def body(s: Section, r: Run, slug: str):
            for table, metric, head, f in HELDOUT_TABLES:
                ev = r.tables.get(table)
                if ev is None or metric not in ev.columns:
                    continue
                pv = ev.pivot_table(
                    index="controller", columns="workload", values=metric, aggfunc="mean"
                )
                shown = pv.map(lambda v, f=f: fmt_num(v, f)).reset_index()
                shown.columns = [str(c) for c in shown.columns]
                s.blocks.append(
                    TableBlock(
                        f"evaluation_{metric}_{slug}",
                        f"{head} per controller and held-out workload",
                        shown,
                        pv.reset_index(),
                    )
                )

        self._per_run(sec, runs, body)
        return sec

    # -- validation ------------------------------------------------------------------------
    def parity(self) -> Result:
        runs = _with(self.runs, "validate", "errors")
        if not runs:
            return "no validate run given (run `dspark validate`)."
        sec = Section("parity", "Simulator vs real engine")
        sec.p(
            "Each point is one controller on one held-out workload: the simulator's prediction "
            "against the real engine's measurement. Error bars are the real run-to-run spread; "
            "an error inside the spread is within the measurement noise."
        )

        self._per_run(sec, runs, self._parity_run)
        return sec

    def _parity_run(self, s: Section, r: Run, slug: str) -> None:
        e = r.tables["errors"]
        sm = r.summary
        ra = sm.get("rank_agreement") or {}
        s.p(
            f"Largest |error|: {fmt_num(sm.get('max_abs_error_pct'), '{:.1f}')}%. "
            + (
                "Controllers rank the same in sim and real on: "
                + ", ".join(f"{w} ({'yes' if v else 'no'})" for w, v in ra.items())
                + "."
                if ra
                else ""
            )
        )
        s.blocks.append(
            _fig(
                f"parity_{slug}",
                f"Simulator vs real engine ({_label(r)})",
                plots.plot_parity(e, self.colors),
            )
        )
        cell = e.assign(
            _c=[
                f"{fmt_num(a, '{:+.1f}')} (±{fmt_num(b / 2, '{:.1f}')})"
                for a, b in zip(e["error_pct"], e["real_spread"])
            ]
        )
        shown = cell.pivot_table(
            index=["controller", "workload"],
            columns="metric",
            values="_c",
            aggfunc="first",
            sort=False,
        ).reset_index()
        shown.columns = [str(c) for c in shown.columns]
        s.blocks.append(
            TableBlock(
                f"validation_errors_{slug}",
                "prediction error in % per metric (± half the real run-to-run spread, %)",
                shown.fillna("—"),
                e,
            )
        )

    def claims(self) -> Result:
        sec = Section("claims", "Seed-claims audit")
        sec.p(
            "Each claim of the seed document against what the runs in this report show. "
            "Verdicts: holds · holds under assumptions · does not hold · cannot be checked "
            "here (the row says which run would) · impossible."
        )
        t = audit(self.runs)
        sec.blocks.append(TableBlock("claims_audit", "one row per claim of the seed", t))
        return sec


def _objectives(run: Run) -> dict:
    sm = run.summary
    dirs = sm.get("directions") or ["maximize"]
    names = sm.get("metric_names")
    if not isinstance(names, list):
        obj = sm.get("objective")
        names = [obj] if isinstance(obj, str) and len(dirs) == 1 else []
    return {"directions": [str(d) for d in dirs], "names": [str(n) for n in names]}


SECTION_ORDER = (
    ("answer", ANSWER_TITLE),
    ("capacity", CAPACITY_TITLE),
    ("comparison", "Controller comparison (simulator)"),
    ("slo", SLO_TITLE),
    ("load", "Throughput against offered load"),
    ("latency", "Latency distributions"),
    ("traces", "Controller traces"),
    ("acceptance", "Acceptance by draft position"),
    ("scaling", "Scaling with cluster size"),
    ("real", "Real engine"),
    ("tuning", "Tuning history"),
    ("importances", "Parameter importances"),
    ("pareto", "Pareto front"),
    ("evaluation", "Held-out evaluation"),
    ("parity", "Simulator vs real engine"),
    ("claims", "Seed-claims audit"),
)
SECTION_TITLES = tuple(t for _, t in SECTION_ORDER) + ("Skipped sections",)


def build(runs: list[Run], title: str = "DSpark Lab report") -> Report:
    """Every section the runs have data for, then the list of skipped ones with reasons."""
    b = Builder(runs)
    sections, skipped = [], []
    for key, name in SECTION_ORDER:
        try:
            res = getattr(b, key)()
        except DSparkError:
            raise
        except (KeyError, ValueError, TypeError) as e:  # a table that breaks the contract
            raise DSparkError(
                f"section '{name}': saved data does not fit the results format: "
                f"{type(e).__name__}: {' '.join(str(e).split())}"
            ) from None
        if isinstance(res, Section):
            sections.append(res)
        else:
            skipped.append((name, res))
    sk = Section("skipped", "Skipped sections")
    if skipped:
        sk.p("These sections need data that none of the given runs saved:")
        sk.blocks.append(
            TableBlock(
                "skipped_sections",
                "sections left out and why",
                pd.DataFrame(skipped, columns=["section", "why skipped"]),
            )
        )
    else:
        sk.p("None: every section had data.")
    sections.append(sk)
    sources = [(r.name, r.kind, str(r.path)) for r in runs]
    return Report(title=title, sources=sources, sections=sections)


def make_report(paths: list[str | Path], out: str | Path, title: str = "DSpark Lab report") -> Path:
    """Load the runs under ``paths``, build the report, write it to ``out``; returns index.html."""
    runs = load_runs(paths)
    return write_report(build(runs, title), Path(out))
