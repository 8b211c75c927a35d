"""Regenerate the README's counts and times by running the commands it shows, and write each result
into its marked span: `<!--readme-numbers: SECTION / WORDS-->47 s<!--/readme-numbers-->`.

    python benchmarks/scripts/readme_numbers.py --fresh    # a Start-here install of HEAD (a clone,
                                                           # a venv, the section's pip commands)
    python benchmarks/scripts/readme_numbers.py --check    # which command each span measures

A span names a command of the README, never a command of its own: the one command (a line of a
```bash block, or a part of it between `&&`) under the heading SECTION that contains every word of
WORDS. A pytest command gives "N passed in T" (any failure or error: nothing is written), any other
its wall time "T". The machine must be idle (other processes' load under SLACK cores, sampled before
and after), as the README says its times were measured; --allow-busy runs anyway, for trying this.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from attention_zoo.measure.load import SLACK, cpu_count, machine_load

ROOT = Path(__file__).resolve().parents[2]
SPAN = re.compile(
    r"<!--readme-numbers: *(?P<selector>[^>]*?) *-->(?P<text>.*?)<!--/readme-numbers-->"
)
HEADING = re.compile(r"^(#{1,6}) +(.+?) *$")
FENCE = re.compile(r"^```(\w*)")  # its language; attributes may follow (title="my_attention.py")
COMMENT = re.compile(r"\s{2,}#.*$")  # a bash block's trailing comment, as the README writes them


class NumbersError(Exception):
    """A span that names no command or several, a command that failed, a busy machine."""


@dataclass(frozen=True)
class Span:
    selector: str  # "SECTION / WORDS"
    command: str  # the README command it measures

    @property
    def pytest(self) -> bool:
        return "pytest" in self.command.split()


def commands(readme: str) -> dict[str, list[str]]:
    """Each section's commands (heading -> the parts, split at `&&`, of its bash blocks' lines)."""
    out: dict[str, list[str]] = {}
    section, fence, shell = "", False, False  # inside a fence; a shell one
    for line in readme.splitlines():
        if opened := FENCE.match(line):
            fence, shell = not fence, not fence and opened.group(1) in ("bash", "sh")
            continue
        if not fence and (heading := HEADING.match(line)):
            section = heading.group(2)
            continue
        if shell and line.strip():
            for part in COMMENT.sub("", line).split("&&"):
                if part.strip():
                    out.setdefault(section, []).append(part.strip())
    return out


def spans(readme: str) -> list[Span]:
    """The README's spans, each with the one command it selects (NumbersError otherwise)."""
    found, by_section = [], commands(readme)
    for match in SPAN.finditer(readme):
        selector = match.group("selector")
        section, _, words = (x.strip() for x in selector.partition("/"))
        chosen = [c for c in by_section.get(section, []) if all(w in c for w in words.split())]
        if len(chosen) != 1:
            what = "no command" if not chosen else f"{len(chosen)} commands ({'; '.join(chosen)})"
            raise NumbersError(
                f"span '{selector}' selects {what} in the README's section {section!r}: name its "
                "heading and words only its command contains"
            )
        found.append(Span(selector, chosen[0]))
    return found


def duration(seconds: float) -> str:
    """47 s, 14 min 37 s, 1 h 02 min: as the README writes times."""
    s = round(seconds)
    if s < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def measure(span: Span, cwd: Path, env: dict[str, str]) -> str:
    """Run the span's command in `cwd`; the text its span gets."""
    print(f"running: {span.command}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(
        ["bash", "-c", span.command], cwd=cwd, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    if span.pytest:
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?)", output)}
        if proc.returncode or counts.get("failed") or counts.get("error") or counts.get("errors"):
            raise NumbersError(f"{span.command} did not pass ({output.strip().splitlines()[-1:]})")
        return f"{counts.get('passed', 0)} passed in {duration(wall)}"
    if proc.returncode:
        raise NumbersError(f"{span.command} exited {proc.returncode}: {output.strip()[-300:]}")
    return duration(wall)


def others_load(what: str) -> float:
    """Cores other processes keep busy now (a 1 s sample; this process sleeps through it)."""
    load = machine_load(1.0).cores_busy or 0.0
    print(f"load {what}: {load:.2f} of {cpu_count()} cores", file=sys.stderr)
    return load


def fresh_install(readme: str, where: Path) -> tuple[Path, dict[str, str]]:
    """A Start-here install of HEAD in `where`: a clone, a venv, the section's `pip install`
    commands; returns the clone and the environment that has the venv first."""
    clone, venv = where / "checkout", where / "venv"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    installs = [c for c in commands(readme).get("Start here", []) if c.startswith("pip install")]
    if not installs:
        raise NumbersError("the README's Start here section shows no `pip install` command")
    for command in installs:
        print(f"installing: {command}", file=sys.stderr, flush=True)
        subprocess.run(["bash", "-c", command], cwd=clone, env=env, check=True)
    return clone, env


def regenerate(readme_path: Path, *, cwd: Path, env: dict[str, str], allow_busy: bool) -> str:
    """The README text with every span's text measured now."""
    readme = readme_path.read_text()
    found = spans(readme)
    if others_load("before") > SLACK and not allow_busy:
        raise NumbersError(
            "the machine is busy: its times would not be the README's (--allow-busy)"
        )
    results: dict[str, str] = {}
    for span in found:
        if span.selector not in results:
            results[span.selector] = measure(span, cwd, env)
    if others_load("after") > SLACK and not allow_busy:
        raise NumbersError("the machine got busy while measuring; nothing was written")

    def filled(m: re.Match[str]) -> str:
        start, end = m.start("text") - m.start(), m.end("text") - m.start()
        return m.group(0)[:start] + results[m.group("selector")] + m.group(0)[end:]

    return SPAN.sub(filled, readme)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the file to update")
    p.add_argument("--cwd", type=Path, default=ROOT, help="where the commands run (not --fresh)")
    p.add_argument("--fresh", action="store_true", help="on a Start-here install of HEAD")
    p.add_argument("--check", action="store_true", help="list each span's command; run nothing")
    p.add_argument("--allow-busy", action="store_true", help="measure on a busy machine (trying)")
    args = p.parse_args(argv)
    try:
        if args.check:
            for span in spans(args.readme.read_text()):
                print(f"{span.selector}: {span.command}")
            return 0
        with tempfile.TemporaryDirectory(prefix="readme-numbers-") as tmp:
            cwd, env = args.cwd, dict(os.environ)
            if args.fresh:
                cwd, env = fresh_install(args.readme.read_text(), Path(tmp))
            text = regenerate(args.readme, cwd=cwd, env=env, allow_busy=args.allow_busy)
        args.readme.write_text(text)
    except (NumbersError, OSError, subprocess.CalledProcessError) as err:
        print(f"readme_numbers: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
