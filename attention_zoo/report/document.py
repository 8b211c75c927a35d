"""The report as a list of blocks, rendered twice: Markdown (PNG files beside it) and one
self-contained HTML file (PNG embedded as base64, inline CSS, no external URL). Same blocks, same
text, so the two files say the same thing.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    """A paragraph; inline `code` and **bold** are the only markup."""

    text: str


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass(frozen=True)
class Image:
    path: Path
    alt: str


@dataclass
class Document:
    title: str
    blocks: list[Heading | Para | Table | Image] = field(default_factory=list)

    def add(self, *blocks: Heading | Para | Table | Image) -> None:
        self.blocks.extend(blocks)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    for b in doc.blocks:
        if isinstance(b, Heading):
            out += [f"{'#' * (b.level + 1)} {b.text}", ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Table):
            if b.caption:
                out += [b.caption, ""]
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "|".join("---" for _ in b.headers) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.alt}]({b.path.name})", ""]
    return "\n".join(out).rstrip() + "\n"


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    """Escape, then turn `code` and **bold** into tags."""
    parts = _CODE.split(str(text))
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            out.append(_BOLD.sub(r"<b>\1</b>", html.escape(part)))
    return "".join(out)


def _td(cell: str) -> str:
    numeric = bool(_NUMERIC.match(str(cell)))
    return f'<td class="num">{_inline(cell)}</td>' if numeric else f"<td>{_inline(cell)}</td>"


_NUMERIC = re.compile(r"^[-\d.,]+(x|%|†)?$")
_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left}
th{background:#f2f2f2} td.num{text-align:right}
code{background:#f4f4f4;padding:0 .2em} img{max-width:100%;display:block;margin:.5em 0}
h2{border-bottom:1px solid #ddd;margin-top:2em} p.caption{font-size:.9em;color:#444}
"""


def to_html(doc: Document) -> str:
    body = []
    for b in doc.blocks:
        if isinstance(b, Heading):
            level = min(b.level + 1, 6)
            body.append(f"<h{level}>{_inline(b.text)}</h{level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Table):
            if b.caption:
                body.append(f'<p class="caption">{_inline(b.caption)}</p>')
            head = "".join(f"<th>{_inline(h)}</th>" for h in b.headers)
            rows = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.path.read_bytes()).decode("ascii")
            body.append(f'<img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}">')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(doc.title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h1>{html.escape(doc.title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
    )
