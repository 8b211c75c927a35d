"""The rendered report in headless Chromium: a picture of its first screen (first-screen.png, what a
reader sees on opening report.html) and a probe of its layout at a given width."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html import unescape
from pathlib import Path
from typing import Any

from ..errors import UnavailableError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars")
FIRST_SCREEN = "first-screen.png"
SCREEN = (1280, 900)  # a laptop's first screen, in CSS pixels
TIMEOUT_S = 120
# Appended to a copy of the page: after load, writes what the layout tests read into the DOM.
PROBE = """<script>window.addEventListener('load',()=>{
const vw=Math.round(document.documentElement.getBoundingClientRect().width);
const inScroll=e=>{for(let p=e.parentElement;p;p=p.parentElement){
  if(p.classList&&p.classList.contains('scroll'))return true;}return false;};
const outside=[...document.body.querySelectorAll('*')].filter(e=>!inScroll(e)&&
  e.getBoundingClientRect().width>0);
const overflow=outside.filter(e=>e.getBoundingClientRect().right>vw+1)
  .map(e=>e.tagName+(e.className?'.'+e.className:'')).slice(0,20);
const widest=Math.max(0,...outside.map(e=>Math.ceil(e.getBoundingClientRect().right)));
const sections=[...document.querySelectorAll('body > section')].map(s=>({id:s.id,
  blocks:s.querySelectorAll('p,table,figure,ul').length}));
const figures=[...document.querySelectorAll('figure')].map(f=>{
  const c=f.querySelector('figcaption');return c?c.textContent.trim():'';});
const images=[...document.images].map(i=>[i.complete,i.naturalWidth,i.naturalHeight]);
const p=document.createElement('pre');p.id='zoo-probe';
p.textContent=JSON.stringify({width:vw,overflow,widest,sections,figures,images});
document.body.appendChild(p);});</script>"""


def chromium() -> str | None:
    """The path of a Chromium-like browser on PATH, or None."""
    return next((p for n in BROWSERS if (p := shutil.which(n))), None)


def _run(*args: str) -> subprocess.CompletedProcess:
    browser = chromium()
    if browser is None:
        raise UnavailableError(
            "a screenshot needs Chromium on PATH (Debian: apt-get install chromium)"
        )
    return subprocess.run(
        [browser, *FLAGS, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def screenshot(html: Path, png: Path, size: tuple[int, int] = SCREEN) -> Path:
    """A PNG of the first `size` CSS pixels of the page, as a browser shows it on opening."""
    png = Path(png).resolve()
    png.unlink(missing_ok=True)
    done = _run(f"--screenshot={png}", f"--window-size={size[0]},{size[1]}",
                Path(html).resolve().as_uri())  # fmt: skip
    if not png.is_file() or png.stat().st_size == 0:
        raise UnavailableError(f"Chromium wrote no screenshot of {html}: {done.stderr[-300:]}")
    return png


def probe(html: Path, width: int = SCREEN[0]) -> dict[str, Any]:
    """The page's layout at `width` px: its sections in order (id, how many blocks), figure
    captions, decoded image sizes, the elements reaching past `width` outside a scroll box
    (`overflow`) and the right edge of the widest of them (`widest`)."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "probe.html"
        # headless Chromium keeps its window at least 500 px wide: the root is set to `width`
        # instead, which is what the page's layout sees as the viewport's width
        narrow = f"<style>html{{width:{width}px}}</style>"
        text = Path(html).read_text().replace("</head>", narrow + "</head>", 1)
        page.write_text(text.replace("</body>", PROBE + "</body>"))
        dom = _run(
            f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom",
            page.as_uri(),
        ).stdout  # fmt: skip
    found = re.search(r'<pre id="zoo-probe">(.*?)</pre>', dom, re.S)
    if not found:
        raise UnavailableError(f"the page did not finish loading in Chromium: {dom[-300:]}")
    return json.loads(unescape(found.group(1)))
