"""Look of every report figure: one colour per controller, used in every plot of a report.

Colours go by *family*: a controller's base name (``dspark``, ``fixed``) owns a hue, and its
variants — the CLI's ``NAME:key=value`` and ``NAME@FILE`` forms, ``NAME#2`` duplicates and
``NAME-suffix`` labels — take lighter or darker shades of that hue, drawn dashed. Baselines
(no speculation: ``ar``, ``fixed:k=0``) are grey, references (``clairvoyant``, ``rate-oracle``)
black or dark grey and dotted. Within one report every controller gets its own colour, at least
:data:`MIN_COLOR_DISTANCE` (CIE76 ΔE in CIELAB) from every other; names outside the known
families take the next free colour of :data:`EXTRA_COLORS` in sorted order, so a report is
reproducible.
"""

from __future__ import annotations

import colorsys
import re
from collections.abc import Iterable

# canonical colours of the registry's controllers (Okabe-Ito-like, readable for colour-blind eyes)
KNOWN_COLORS: dict[str, str] = {
    "dspark": "#D55E00",  # vermilion: the lab's scheduler stands out
    "analytic": "#0072B2",  # blue
    "hf-heuristic": "#009E73",  # green
    "ema-hysteresis": "#CC79A7",  # pink
    "confidence-stop": "#E69F00",  # orange
    "fixed": "#56B4E9",  # sky blue
    "clairvoyant": "#000000",  # black: told each round's run lengths, not a contender
    "rate-oracle": "#555555",  # dark grey: told each request's true rate, not a contender
}
#: Reference controllers (told what no engine knows); "oracle" names runs saved before them.
REFERENCE_NAMES = ("clairvoyant", "rate-oracle", "oracle")
BASELINE_NAMES = (
    "ar",
    "k=0",
    "k0",
    "autoregressive",
    "fixed-k0",
    "no-spec",
    "baseline",
    "target-only",
    "fixed:k=0",
    "fixed-k=0",
)
BASELINE_COLOR = "#8C8C8C"  # grey: plain autoregressive decoding
EXTRA_COLORS = (
    "#7B3294",
    "#1B7837",
    "#B2182B",
    "#2166AC",
    "#8C510A",
    "#01665E",
    "#C51B7D",
    "#4D9221",
    "#762A83",
    "#E08214",
    "#35978F",
    "#5E3C99",
)
#: smallest CIE76 ΔE between two controllers' colours in one report (about the distance at
#: which two thin lines are told apart at a glance; the Okabe-Ito base colours are >= 25 apart)
MIN_COLOR_DISTANCE = 15.0
# lightness offsets (HLS) tried, in order, for a family's variants: darker first, since a pale
# line on a white page is hard to read (shade() keeps lightness <= 0.72)
_SHADES = (-0.16, -0.28, 0.14, -0.08, -0.36, 0.22, -0.22, 0.08, 0.28, -0.42)

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


def is_reference(name: object) -> bool:
    """True for a reference row (``clairvoyant``, ``rate-oracle:...``, a legacy ``oracle``)."""
    return str(name).startswith(REFERENCE_NAMES)


def is_baseline(name: object) -> bool:
    """True for a no-speculation (k = 0) run's controller name: ``ar``, ``fixed:k=0``, ..."""
    n = str(name).strip().lower()
    return n in BASELINE_NAMES or bool(re.fullmatch(r"fixed[:\-_]k\s*=\s*0", n))


def family(name: object) -> str:
    """The base controller a name belongs to: ``dspark@best_config`` -> ``dspark``,
    ``fixed:k=2`` -> ``fixed``, ``rate-oracle:a=1`` -> ``rate-oracle``, ``hf-heuristic`` ->
    ``hf-heuristic``; a name of no known family is its own."""
    n = str(name)
    head = re.split(r"[:@#]", n, maxsplit=1)[0]
    if head in KNOWN_COLORS:
        return head
    for k in sorted(KNOWN_COLORS, key=len, reverse=True):  # "dspark-tuned" -> "dspark"
        if head.startswith((k + "-", k + "_")):
            return k
    return head


def is_variant(name: object) -> bool:
    """A configured or labelled variant of a known base controller (not the base itself)."""
    return str(name) != family(name) and family(name) in KNOWN_COLORS


def _rgb(hex_color: str) -> tuple[float, float, float]:
    h = hex_color.lstrip("#")
    return tuple(int(h[i : i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def _hex(rgb: Iterable[float]) -> str:
    return "#" + "".join(f"{round(min(1.0, max(0.0, c)) * 255):02X}" for c in rgb)


def to_lab(color: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB hex colour."""

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in _rgb(color))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def color_distance(a: str, b: str) -> float:
    """CIE76 ΔE between two hex colours (0: identical; ~2.3: just noticeable)."""
    la, lb = to_lab(a), to_lab(b)
    return sum((x - y) ** 2 for x, y in zip(la, lb)) ** 0.5


def shade(color: str, offset: float, hue: float = 0.0) -> str:
    """``color`` with its HLS lightness moved by ``offset`` (clipped to 0.12..0.72) and its hue
    turned by ``hue`` (a fraction of the circle)."""
    h, light, s = colorsys.rgb_to_hls(*_rgb(color))
    return _hex(colorsys.hls_to_rgb((h + hue) % 1.0, min(0.72, max(0.12, light + offset)), s))


def family_shades(color: str) -> list[str]:
    """Candidate colours for a family's variants: lightness steps of the base, then the same
    steps with the hue turned a little either way (still read as the family's colour)."""
    return [shade(color, o, dh) for dh in (0.0, -0.025, 0.025) for o in _SHADES]


def _far(c: str, used: list[str]) -> bool:
    return all(color_distance(c, u) >= MIN_COLOR_DISTANCE for u in used)


def controller_colors(names: Iterable[str]) -> dict[str, str]:
    """Colour of each controller name, stable across the plots of one report, every pair at
    least :data:`MIN_COLOR_DISTANCE` apart."""
    out: dict[str, str] = {}
    unique = sorted({str(n) for n in names})
    # 1. exact registry names keep their canonical colours
    for n in unique:
        if n in KNOWN_COLORS:
            out[n] = KNOWN_COLORS[n]
    # 2. baselines: grey, further ones lighter or darker greys
    for n in unique:
        if n not in out and is_baseline(n):
            out[n] = next(
                (
                    c
                    for c in (BASELINE_COLOR, *(shade(BASELINE_COLOR, o) for o in _SHADES))
                    if _far(c, list(out.values()))
                ),
                BASELINE_COLOR,
            )
    # 3. variants: shades of their family's colour
    extra = list(EXTRA_COLORS)
    for n in unique:
        if n in out:
            continue
        fam = family(n)
        cands = family_shades(KNOWN_COLORS[fam]) if fam in KNOWN_COLORS else []
        if fam in KNOWN_COLORS and fam not in out:
            cands.insert(0, KNOWN_COLORS[fam])  # the family's own colour when its base is absent
        used = list(out.values())
        pick = next((c for c in cands if _far(c, used)), None)
        if pick is None:
            pick = next((c for c in extra if _far(c, used)), None)
        if pick is None:  # more controllers than distinguishable colours: cycle
            pick = EXTRA_COLORS[len(out) % len(EXTRA_COLORS)]
        if pick in extra:
            extra.remove(pick)
        out[n] = pick
    return out


def line_style(name: object) -> str:
    """Matplotlib line style: references dotted, variants of a base controller dashed."""
    if is_reference(name):
        return ":"
    if is_variant(name) and not is_baseline(name):
        return "--"
    return "-"


def color_of(colors: dict[str, str] | None, name: str) -> str:
    """Colour of ``name`` in ``colors``, or a stable one when the map does not know it."""
    if colors and name in colors:
        return colors[name]
    return controller_colors([name])[name]
