"""The report as a list of blocks, rendered twice: Markdown (PNG files beside it) and one
self-contained HTML file (PNG embedded as base64, inline CSS, no external URL). Same blocks, same
text, so the two files say the same thing. The HTML reads on a 400 px screen: tables scroll
inside their own box, images shrink. No table is wider than MAX_COLUMNS: a reader reads it whole.
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    """A paragraph; inline `code`, **bold** and [links](#anchor) to a heading are the markup."""

    text: str


MAX_COLUMNS = 7  # the widest table a reader takes in at a glance


@dataclass(frozen=True)
class Table:
    """At most MAX_COLUMNS columns: merge cells that belong together, or split the table where
    its parts answer different questions (a matrix of any width: narrow_tables)."""

    headers: list[str]
    rows: list[list[str]]
    caption: str = ""

    def __post_init__(self) -> None:
        if len(self.headers) > MAX_COLUMNS:
            raise ValueError(
                f"a report table has at most {MAX_COLUMNS} columns, not {len(self.headers)}: "
                f"{self.headers}"
            )


def narrow_tables(
    headers: list[str], rows: list[list[str]], *, key: int = 1, caption: str = ""
) -> list[Table]:
    """A matrix (one column per variant, width, size...) as tables of at most MAX_COLUMNS
    columns, each repeating the first `key` columns that name a row; the caption above the first.
    The other columns are shared out evenly, in order."""
    rest = len(headers) - key
    if rest <= MAX_COLUMNS - key:
        return [Table(headers, rows, caption)]
    parts = math.ceil(rest / (MAX_COLUMNS - key))  # as few as fit, as even as they can be
    size = math.ceil(rest / parts)
    tables: list[Table] = []
    for start in range(key, len(headers), size):
        columns = [*range(key), *range(start, min(start + size, len(headers)))]
        tables.append(
            Table(
                [headers[c] for c in columns],
                [[row[c] for c in columns] for row in rows],
                caption if not tables else "",
            )
        )
    return tables


@dataclass(frozen=True)
class Image:
    path: Path
    alt: str
    caption: str = ""  # one line: what to look for in it


@dataclass
class Document:
    title: str
    blocks: list[Heading | Para | Table | Image] = field(default_factory=list)

    def add(self, *blocks: Heading | Para | Table | Image) -> None:
        self.blocks.extend(blocks)


def anchor(text: str) -> str:
    """The link target of a heading, as GitHub names it in Markdown (and the HTML id)."""
    text = _CODE.sub(r"\1", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Document, *, links_to: str = "") -> str:
    """The Markdown text; links_to: the file the [text](#anchor) links point into ('' = this)."""
    out = [f"# {doc.title}", ""]

    def linked(text: str) -> str:  # every [text](#anchor), wherever it stands, into links_to
        return _LINK.sub(rf"[\1]({links_to}#\2)", str(text))

    for b in doc.blocks:
        if isinstance(b, Heading):
            out += [f"{'#' * (b.level + 1)} {b.text}", ""]
        elif isinstance(b, Para):
            out += [linked(b.text), ""]
        elif isinstance(b, Table):
            if b.caption:
                out += [linked(b.caption), ""]
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "|".join("---" for _ in b.headers) + "|")
            out += ["| " + " | ".join(_md_cell(linked(c)) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.alt}]({b.path.name})", ""]
            if b.caption:
                out += [f"*{linked(b.caption)}*", ""]
    return "\n".join(out).rstrip() + "\n"


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_LINK = re.compile(r"\[([^\]]+)\]\(#([\w-]+)\)")


def _inline(text: str) -> str:
    """Escape, then turn `code`, **bold** and [text](#anchor) into tags."""
    parts = _CODE.split(str(text))
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            part = _BOLD.sub(r"<b>\1</b>", html.escape(part))
            out.append(_LINK.sub(r'<a href="#\2">\1</a>', part))
    return "".join(out)


def _td(cell: str) -> str:
    numeric = bool(_NUMERIC.match(str(cell)))
    return f'<td class="num">{_inline(cell)}</td>' if numeric else f"<td>{_inline(cell)}</td>"


# a number with its unit or marks, or a median with its spread ("median† ± IQR")
_NUMERIC = re.compile(r"^[-\d.,]+(x|%)?[†‡]*( ± [-\d.,]+)?$")
_STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 .8em;color:#222;
 line-height:1.45;overflow-wrap:break-word}
.scroll{overflow-x:auto;max-width:100%;margin:.6em 0 1.2em}
table{border-collapse:collapse;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2} td.num{text-align:right;white-space:nowrap}
code{background:#f4f4f4;padding:0 .2em;overflow-wrap:anywhere}
figure{margin:.8em 0 1.4em} img{max-width:100%;height:auto;display:block}
figcaption,p.caption{font-size:.9em;color:#444}
h2{border-bottom:1px solid #ddd;margin-top:2em} h3{overflow-wrap:anywhere}
section#summary{background:#f7f9fc;border:1px solid #dde3ee;padding:0 .8em .4em;border-radius:6px}
section#summary h2{margin-top:.6em}
"""


def _block_html(b: Heading | Para | Table | Image) -> str:
    if isinstance(b, Heading):
        level = min(b.level + 1, 6)  # the id of a top-level heading is its <section>'s
        return f"<h{level}>{_inline(b.text)}</h{level}>"
    if isinstance(b, Para):
        return f"<p>{_inline(b.text)}</p>"
    if isinstance(b, Table):
        caption = f'<p class="caption">{_inline(b.caption)}</p>' if b.caption else ""
        head = "".join(f"<th>{_inline(h)}</th>" for h in b.headers)
        rows = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in b.rows)
        return (
            f'{caption}<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>"
        )
    data = base64.b64encode(b.path.read_bytes()).decode("ascii")
    caption = f"<figcaption>{_inline(b.caption)}</figcaption>" if b.caption else ""
    return (
        f'<figure><img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}">'
        f"{caption}</figure>"
    )


def sections(doc: Document) -> list[list[Heading | Para | Table | Image]]:
    """The blocks grouped by top-level heading (a leading group without one, if any)."""
    groups: list[list[Heading | Para | Table | Image]] = []
    for b in doc.blocks:
        if not groups or (isinstance(b, Heading) and b.level == 1):
            groups.append([])
        groups[-1].append(b)
    return groups


def to_html(doc: Document) -> str:
    body = []
    for group in sections(doc):
        first = group[0]
        ident = anchor(first.text) if isinstance(first, Heading) and first.level == 1 else ""
        inner = "\n".join(_block_html(b) for b in group)
        body.append(f'<section id="{ident}">\n{inner}\n</section>' if ident else inner)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(doc.title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h1>{html.escape(doc.title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
    )
