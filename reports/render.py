"""Write a built report as Markdown, a self-contained HTML page, CSV tables and PNG figures."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class FigureBlock:
    name: str  # file stem under figures/
    caption: str
    png: bytes


@dataclass
class TableBlock:
    name: str  # file stem under tables/
    caption: str
    shown: pd.DataFrame  # text cells, as displayed
    data: pd.DataFrame | None = None  # numbers written to the CSV (default: shown)
    show: bool = True  # False: written as CSV only; the page links to it


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)  # str paragraphs, ("h3", text), Table/FigureBlock

    def p(self, text: str) -> None:
        self.blocks.append(text)

    def h3(self, text: str) -> None:
        self.blocks.append(("h3", text))


@dataclass
class Report:
    title: str
    sources: list[tuple[str, str, str]]  # (run name, kind, path)
    sections: list[Section]


VERDICT_CLASS = {
    "holds": "ok",
    "holds under assumptions": "cond",
    "does not hold": "bad",
    "cannot be checked here": "na",
    "impossible": "imp",
}
NUMERIC = re.compile(r"^[−+-]?[\d,]*\.?\d+(?:e[+-]?\d+)?\s*(?:%|×)?$")


def _md_cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = [
        "| " + " | ".join(_md_cell(c) for c in cols) + " |",
        "|" + "|".join("---:" if _numeric_col(df[c]) else "---" for c in df.columns) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
    return "\n".join(lines)


def _numeric_col(s: pd.Series) -> bool:
    vals = [str(v) for v in s if str(v) not in ("—", "", "nan")]
    return bool(vals) and all(NUMERIC.match(v) for v in vals)


def to_markdown(report: Report) -> str:
    out = [
        f"# {report.title}",
        "",
        "Built by `dspark report` from saved result files only. Runs:",
        "",
    ]
    out += [f"- `{name}` ({kind}): `{path}`" for name, kind, path in report.sources]
    out += ["", "Contents: " + " · ".join(f"[{s.title}](#{s.id})" for s in report.sections), ""]
    for s in report.sections:
        out += [f'<a id="{s.id}"></a>', "", f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, str):
                out += [b, ""]
            elif isinstance(b, tuple) and b[0] == "h3":
                out += [f"### {b[1]}", ""]
            elif isinstance(b, TableBlock) and not b.show:
                out += [f"{b.caption}: `tables/{b.name}.csv`", ""]
            elif isinstance(b, TableBlock):
                out += [f"*{b.caption}* (`tables/{b.name}.csv`)", "", md_table(b.shown), ""]
            elif isinstance(b, FigureBlock):
                out += [f"![{b.caption}](figures/{b.name}.png)", "", f"*{b.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


CSS = """
:root { --ink:#1d2330; --muted:#5b6475; --line:#e2e6ee; --bg:#ffffff; --band:#f6f8fb;
        --accent:#c4501a; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font: 15px/1.55 "DejaVu Sans", "Segoe UI", Helvetica, Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 32px 60px; }
header { border-bottom: 3px solid var(--accent); margin-bottom: 18px; padding-bottom: 10px; }
h1 { font-size: 26px; margin: 0 0 4px; letter-spacing: -0.3px; }
.sub { color: var(--muted); font-size: 13.5px; }
h2 { font-size: 20px; margin: 34px 0 10px; padding-top: 8px; border-top: 1px solid var(--line); }
h3 { font-size: 15.5px; margin: 22px 0 8px; color: #333b4d; }
p { margin: 6px 0 10px; max-width: 900px; }
nav { background: var(--band); border: 1px solid var(--line); border-radius: 8px;
      padding: 10px 14px; font-size: 13.5px; display: flex; flex-wrap: wrap; gap: 4px 16px; }
nav a { color: #1f4e8c; text-decoration: none; white-space: nowrap; }
code { background: var(--band); padding: 1px 4px; border-radius: 4px; font-size: 90%; }
.table-wrap { overflow-x: auto; margin: 6px 0 16px; border: 1px solid var(--line);
              border-radius: 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
caption { caption-side: top; text-align: left; color: var(--muted); padding: 8px 10px;
          font-size: 12.5px; }
th { background: #eef2f8; text-align: left; font-weight: 600; padding: 6px 10px;
     border-bottom: 1px solid #d5dbe6; vertical-align: bottom; }
td:first-child { white-space: nowrap; font-weight: 500; }
td { padding: 5px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
tbody tr:nth-child(even) td { background: #fafbfd; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.num { text-align: right; }
figure { margin: 10px 0 22px; }
figure img { max-width: 100%; height: auto; display: block; border: 1px solid var(--line);
             border-radius: 8px; }
figcaption { color: var(--muted); font-size: 12.5px; margin-top: 5px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; white-space: nowrap; }
.badge.ok { background: #dff3e4; color: #17692f; }
.badge.cond { background: #fff1d6; color: #8a5a00; }
.badge.bad { background: #fde2df; color: #a0271b; }
.badge.na { background: #eceef2; color: #4b5363; }
.badge.imp { background: #efe3f7; color: #6a2c91; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
"""


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    esc = html.escape(text)
    esc = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", esc)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", esc)


def html_table(b: TableBlock) -> str:
    df = b.shown
    num = {c: _numeric_col(df[c]) for c in df.columns}
    head = "".join(
        f'<th class="{"num" if num[c] else ""}">{html.escape(str(c))}</th>' for c in df.columns
    )
    rows = []
    for row in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, row):
            text = str(v)
            if c == "verdict" and text in VERDICT_CLASS:
                inner = f'<span class="badge {VERDICT_CLASS[text]}">{html.escape(text)}</span>'
            else:
                inner = _inline(text)
            cells.append(f'<td class="{"num" if num[c] else ""}">{inner}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="table-wrap"><table><caption>{_inline(b.caption)} '
        f"(<code>tables/{html.escape(b.name)}.csv</code>)</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def to_html(report: Report) -> str:
    parts = [
        f'<header><h1>{html.escape(report.title)}</h1><div class="sub">Built by '
        f"<code>dspark report</code> from saved result files: "
        + ", ".join(
            f"<code>{html.escape(n)}</code> ({html.escape(k)})" for n, k, _ in report.sources
        )
        + "</div></header>",
        "<nav>"
        + "".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in report.sections)
        + "</nav>",
    ]
    for s in report.sections:
        parts.append(f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>')
        for b in s.blocks:
            if isinstance(b, str):
                parts.append(f"<p>{_inline(b)}</p>")
            elif isinstance(b, tuple) and b[0] == "h3":
                parts.append(f"<h3>{_inline(b[1])}</h3>")
            elif isinstance(b, TableBlock) and not b.show:
                parts.append(
                    f"<p>{_inline(b.caption)}: <code>tables/{html.escape(b.name)}.csv</code></p>"
                )
            elif isinstance(b, TableBlock):
                parts.append(html_table(b))
            elif isinstance(b, FigureBlock):
                data = base64.b64encode(b.png).decode("ascii")
                parts.append(
                    f'<figure><img alt="{html.escape(b.caption)}" '
                    f'src="data:image/png;base64,{data}">'
                    f"<figcaption>{_inline(b.caption)}</figcaption></figure>"
                )
        parts.append("</section>")
    parts.append(
        "<footer>Every number on this page comes from the run folders listed above; "
        "the CSV files under <code>tables/</code> hold them.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{html.escape(report.title)}</title><link rel="icon" href="data:,">'
        f"<style>{CSS}</style></head><body><main>" + "\n".join(parts) + "</main></body></html>\n"
    )


def write_report(report: Report, out: Path) -> Path:
    """Write report.md, index.html, tables/*.csv and figures/*.png under ``out``; returns the
    path of index.html."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables").mkdir(exist_ok=True)
    (out / "figures").mkdir(exist_ok=True)
    for s in report.sections:
        for b in s.blocks:
            if isinstance(b, TableBlock):
                (b.data if b.data is not None else b.shown).to_csv(
                    out / "tables" / f"{b.name}.csv", index=False
                )
            elif isinstance(b, FigureBlock):
                (out / "figures" / f"{b.name}.png").write_bytes(b.png)
    (out / "report.md").write_text(to_markdown(report), encoding="utf-8")
    index = out / "index.html"
    index.write_text(to_html(report), encoding="utf-8")
    return index


def slug(text: str) -> str:
    """A file or anchor name from free text: runs of other characters become one dash."""
    import re

    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "run"
