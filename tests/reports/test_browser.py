"""The HTML report in headless Chromium: it loads with no console or resource errors, and a
screenshot shows the plots (coloured image regions that vanish when the images are removed)."""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="/usr/bin/chromium is absent "
        "(Debian: apt-get install chromium); the HTML check needs it",
    ),
]


def chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def page_errors(stderr: str) -> list[str]:
    # the report has no script, so any console message at all (Chromium logs console.error as
    # INFO:CONSOLE) means something went wrong
    bad = (":CONSOLE", "Failed to load resource", "net::ERR_", "Uncaught")
    return [ln for ln in stderr.splitlines() if any(b in ln for b in bad)]


MEASURE_JS = """<script>
window.addEventListener('load', () => {
  const r = [...document.images].map(i => { const b = i.getBoundingClientRect();
    return [b.left + scrollX, b.top + scrollY, b.width, b.height, i.naturalWidth]; });
  document.body.setAttribute('data-imgs', JSON.stringify(r));
  const ext = performance.getEntriesByType('resource').map(e => e.name)
    .filter(n => !n.startsWith('data:'));
  document.body.setAttribute('data-external', JSON.stringify(ext));
  const a = document.getElementById('answer');
  const ab = a ? a.getBoundingClientRect() : null;
  document.body.setAttribute('data-answer', JSON.stringify(ab ? [ab.top + scrollY, ab.height,
    [...a.querySelectorAll('strong')].map(s => s.textContent)] : null));
});
</script>"""


def image_boxes(html: Path, tmp: Path, answer: list | None = None) -> list[list[float]]:
    """Page boxes (x, y, w, h, natural width) of every <img>, measured by Chromium's layout on a
    copy of the page with a measuring script (the report itself has no script); ``answer``
    receives the answer section's (top, height, bold texts)."""
    tmp.mkdir(parents=True, exist_ok=True)
    probe = tmp / "probe.html"
    probe.write_text(
        html.read_text(encoding="utf-8").replace("</body>", MEASURE_JS + "</body>"),
        encoding="utf-8",
    )
    res = chromium(
        ["--window-size=1280,8000", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        tmp / "profile-probe",
    )
    m = re.search(r'data-imgs="([^"]*)"', res.stdout)
    assert m, res.stderr[-2000:]
    ext = re.search(r'data-external="([^"]*)"', res.stdout)
    assert json.loads(html_lib.unescape(ext.group(1))) == [], "page loaded outside resources"
    if answer is not None:
        a = re.search(r'data-answer="([^"]*)"', res.stdout)
        answer.append(json.loads(html_lib.unescape(a.group(1))) if a else None)
    return json.loads(html_lib.unescape(m.group(1)))


def region_stats(img: np.ndarray, box) -> tuple[float, int]:
    """Fraction of non-white pixels and count of saturated (coloured) pixels in a box."""
    x, y, w, h = (round(v) for v in box[:4])
    reg = img[y : y + h, x : x + w]
    nonwhite = (reg.min(axis=2) < 0.9).mean()
    coloured = int(((reg.max(axis=2) - reg.min(axis=2)) > 0.25).sum())
    return float(nonwhite), coloured


def screenshot(html: Path, tmp: Path, name: str) -> tuple[np.ndarray, str]:
    import matplotlib.image as mpimg

    shot = tmp / f"{name}.png"
    res = chromium(
        [f"--screenshot={shot}", "--window-size=1280,8000", html.as_uri()], tmp / f"profile-{name}"
    )
    assert shot.exists(), res.stderr[-2000:]
    return mpimg.imread(shot)[..., :3], res.stderr


def test_report_loads_without_errors_and_shows_plots(built_report, tmp_path):
    dom = chromium(["--dump-dom", built_report.as_uri()], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not page_errors(dom.stderr), page_errors(dom.stderr)
    assert "Seed-claims audit" in dom.stdout
    n_figs = len(list((built_report.parent / "figures").glob("*.png")))
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', dom.stdout)) == n_figs

    answer: list = []
    boxes = image_boxes(built_report, tmp_path, answer)
    assert len(boxes) == n_figs
    # the answer comes first: its block starts on the first screen (1280 x 800) and names a
    # winner in bold for every scenario and load
    top, height, bold = answer[0]
    assert top < 400 and height > 50, answer
    assert "dspark" in bold, bold
    assert all(b[4] > 0 for b in boxes), "an embedded PNG failed to decode"
    img, err = screenshot(built_report, tmp_path, "report")
    assert not page_errors(err), page_errors(err)
    in_view = [b for b in boxes if b[1] + b[3] <= img.shape[0] and b[2] > 100 and b[3] > 100]
    assert len(in_view) >= 3, (
        boxes
    )  # several plots within the first 8000 px (the answer, capacity and tables come first)
    for b in in_view:
        nonwhite, coloured = region_stats(img, b)
        assert nonwhite > 0.02 and coloured > 200, (b, nonwhite, coloured)
    # control: the same boxes of a page whose images are emptied are blank
    blank = tmp_path / "blank.html"
    blank.write_text(
        re.sub(
            r'src="data:image/png;base64,[^"]+"',
            'src="data:,"',
            built_report.read_text(encoding="utf-8"),
        ).replace("<style>", "<style>img{width:900px;height:400px}"),
        encoding="utf-8",
    )
    img2, _ = screenshot(blank, tmp_path, "blank")
    boxes2 = image_boxes(blank, tmp_path / "b")
    assert all(region_stats(img2, b)[1] < 50 for b in boxes2 if b[1] + b[3] <= img2.shape[0])
