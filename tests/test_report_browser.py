"""report.html opens in a real browser (headless Chromium): every embedded image decodes, nothing
is fetched from outside, and a screenshot of the page is a non-empty PNG."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.report import build_report
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
    assert not re.search(r"""(src|href)=["'](?!data:)""", text)  # no external resource at all
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
