"""report.html opens in a real browser (headless Chromium): every embedded image decodes, nothing
is fetched from outside, the summary is the first section, every figure has a caption, no section
is empty, nothing overflows a 400 px screen outside a scroll box, and `zoo report --screenshot`
writes the first screen as a PNG."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.cli import main as zoo_main
from attention_zoo.report import build_report
from attention_zoo.report.browser import probe
from attention_zoo.store import ResultStore

from .report_fixtures import make_store

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)",
    ),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
# Appended to a copy of the page: after load, writes each image's decoded size into the DOM.
PROBE = (
    "<script>window.addEventListener('load',()=>{const p=document.createElement('pre');"
    "p.id='zoo-probe';p.textContent=JSON.stringify([...document.images].map("
    "i=>[i.complete,i.naturalWidth,i.naturalHeight]));document.body.appendChild(p);});</script>"
)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    path = make_store(tmp / "s.sqlite")
    with ResultStore(path) as store:
        files = build_report(store.to_dataframe(), tmp / "rep", runs=store.runs())
    return files


def test_report_html_is_self_contained(page):
    text = page.html.read_text()
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", text)  # nothing outside the page
    assert "http://" not in text and "https://" not in text
    assert text.count("<img") == len(page.plots) >= 4


def test_every_image_decodes_in_chromium(page, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(page.html.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'<pre id="zoo-probe">(.*?)</pre>', dom)
    assert found, f"the page did not finish loading in Chromium: {dom[-500:]}"
    images = json.loads(found.group(1))
    assert len(images) == len(page.plots)
    assert all(done and width > 100 and height > 100 for done, width, height in images), images


def test_screenshot_is_a_non_empty_png(page, tmp_path):
    shot = tmp_path / "shot.png"
    _chromium(f"--screenshot={shot}", "--window-size=1200,2400", page.html.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_summary_first_every_figure_captioned_no_section_empty(page):
    dom = probe(page.html)
    assert [s["id"] for s in dom["sections"]][:2] == ["summary", "headline"]
    assert all(s["blocks"] > 0 for s in dom["sections"]), dom["sections"]
    assert len(dom["figures"]) == len(page.plots) and all(dom["figures"])


def test_nothing_overflows_a_400_px_screen_outside_a_scroll_box(page):
    dom = probe(page.html, width=400)
    assert dom["width"] == 400
    assert dom["overflow"] == [] and dom["widest"] <= 400


def test_the_overflow_probe_sees_a_table_outside_a_scroll_box(tmp_path):
    bare = tmp_path / "bare.html"
    cells = "".join(f"<td>column{i}</td>" for i in range(30))
    bare.write_text(f"<html><head></head><body><table><tr>{cells}</tr></table></body></html>")
    dom = probe(bare, width=400)
    assert "TABLE" in dom["overflow"] and dom["widest"] > 400


def test_zoo_report_screenshot_writes_the_first_screen(page, tmp_path):
    out = tmp_path / "rebuilt"
    assert (
        zoo_main(["report", "--from", str(page.html.parent), "--out", str(out), "--screenshot"])
        == 0
    )
    data = (out / "first-screen.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
