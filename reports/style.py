"""Look of every report figure: one colour per controller, used in every plot of a report.

Known controller names keep the same colour in every report; other names (``fixed-k4``,
``dspark-tuned``) take the next free colour in sorted order, so a report is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable

# canonical colours of the registry's controllers (Okabe-Ito-like, readable for colour-blind eyes)
KNOWN_COLORS: dict[str, str] = {
    "dspark": "#D55E00",          # vermilion: the seed's scheduler stands out
    "analytic": "#0072B2",        # blue
    "hf-heuristic": "#009E73",    # green
    "ema-hysteresis": "#CC79A7",  # pink
    "confidence-stop": "#E69F00",  # orange
    "fixed": "#56B4E9",           # sky blue
    "clairvoyant": "#000000",     # black: told each round's run lengths, not a contender
    "rate-oracle": "#555555",     # dark grey: told each request's true rate, not a contender
}
#: Reference controllers (told what no engine knows); "oracle" names runs saved before them.
REFERENCE_NAMES = ("clairvoyant", "rate-oracle", "oracle")


def is_reference(name: object) -> bool:
    """True for a reference row (``clairvoyant``, ``rate-oracle:...``, a legacy ``oracle``)."""
    return str(name).startswith(REFERENCE_NAMES)
BASELINE_NAMES = ("ar", "k=0", "k0", "autoregressive", "fixed-k0", "no-spec", "baseline")
BASELINE_COLOR = "#8C8C8C"        # grey: plain autoregressive decoding
EXTRA_COLORS = ("#7B3294", "#1B7837", "#B2182B", "#2166AC", "#8C510A", "#01665E", "#C51B7D",
                "#4D9221", "#762A83", "#E08214", "#35978F", "#5E3C99")

RC = {
    "font.family": "DejaVu Sans",
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#E3E3E3",
    "grid.linewidth": 0.7,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "lines.linewidth": 1.8,
}


def is_baseline(name: str) -> bool:
    """True for the plain autoregressive (k = 0) run's controller name."""
    return str(name).strip().lower() in BASELINE_NAMES


def controller_colors(names: Iterable[str]) -> dict[str, str]:
    """Colour of each controller name, stable across the plots of one report."""
    out: dict[str, str] = {}
    used: set[str] = set()
    unique = sorted({str(n) for n in names})
    for n in unique:  # exact registry names first
        if n in KNOWN_COLORS:
            out[n] = KNOWN_COLORS[n]
            used.add(n)
        elif is_baseline(n):
            out[n] = BASELINE_COLOR
    extra = iter(EXTRA_COLORS)
    for n in unique:
        if n in out:
            continue
        base = next((k for k in KNOWN_COLORS if n.startswith((k + "-", k + "_", k + "#"))), None)
        if base is not None and base not in used:
            out[n] = KNOWN_COLORS[base]
            used.add(base)
            continue
        out[n] = next(extra, None) or EXTRA_COLORS[len(out) % len(EXTRA_COLORS)]
    return out


def color_of(colors: dict[str, str] | None, name: str) -> str:
    """Colour of ``name`` in ``colors``, or a stable one when the map does not know it."""
    if colors and name in colors:
        return colors[name]
    return controller_colors([name])[name]
