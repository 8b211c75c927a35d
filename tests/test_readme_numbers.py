"""The README's counts and times come from commands: benchmarks/scripts/readme_numbers.py runs the
commands the README shows (found by the span's section and words, never typed into the script)
and writes each result into its span, nothing else; a failure or a busy machine writes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attention_zoo.measure.load import Load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))
import readme_numbers  # noqa: E402  (a script beside the gate's)

TINY_TESTS = "def test_one():\n    pass\n\n\ndef test_two():\n    assert 1 + 1 == 2\n"


def _readme(folder: Path, test_command: str) -> Path:
    text = f"""# A project

## Start here

```bash
pip install nothing && {sys.executable} -c "import time; time.sleep(0.3)"
{test_command}
```

Sleeping takes <!--readme-numbers: Start here / sleep-->an hour<!--/readme-numbers--> here.
The tests: <!--readme-numbers: Start here / pytest-->1 passed in 9 s<!--/readme-numbers--> (say).

```python
print("not a command")
```
"""
    (folder / "README.md").write_text(text)
    return folder / "README.md"


@pytest.fixture
def idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readme_numbers, "machine_load", lambda s=None: Load(0.0, "sampled"))


def test_every_span_of_the_readme_names_one_of_its_commands() -> None:
    """Whoever edits the README's commands keeps its spans pointing at them (or this fails)."""
    text = (ROOT / "README.md").read_text()
    spans = readme_numbers.spans(text)
    assert {s.selector.split(" / ")[0] for s in spans} >= {"Start here"}
    assert any(s.pytest for s in spans) and all(s.command in text for s in spans)


@pytest.mark.slow
def test_the_spans_get_what_the_commands_measure_and_nothing_else_changes(
    tmp_path: Path, idle: None
) -> None:
    (tmp_path / "test_tiny.py").write_text(TINY_TESTS)
    readme = _readme(tmp_path, f"{sys.executable} -m pytest -q -p no:cacheprovider test_tiny.py")
    before = readme.read_text()
    assert readme_numbers.main(["--readme", str(readme), "--cwd", str(tmp_path)]) == 0
    after = readme.read_text()
    sleep = after.split("Sleeping takes ", 1)[1].split("<!--/", 1)[0].split("-->")[1]
    tests = after.split("The tests: ", 1)[1].split("<!--/", 1)[0].split("-->")[1]
    assert sleep in ("0.3 s", "0.4 s", "0.5 s") and tests.startswith("2 passed in ")
    assert after == before.replace("an hour", sleep).replace("1 passed in 9 s", tests)


@pytest.mark.slow
def test_a_failing_test_command_writes_nothing(tmp_path: Path, idle: None) -> None:
    (tmp_path / "test_tiny.py").write_text(TINY_TESTS + "\n\ndef test_bad():\n    assert False\n")
    readme = _readme(tmp_path, f"{sys.executable} -m pytest -q -p no:cacheprovider test_tiny.py")
    before = readme.read_text()
    assert readme_numbers.main(["--readme", str(readme), "--cwd", str(tmp_path)]) == 2
    assert readme.read_text() == before


def test_a_busy_machine_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readme_numbers, "machine_load", lambda s=None: Load(1.5, "sampled"))
    readme = _readme(tmp_path, "true")
    before = readme.read_text()
    assert readme_numbers.main(["--readme", str(readme), "--cwd", str(tmp_path)]) == 2
    assert readme.read_text() == before


def test_a_span_must_select_exactly_one_command(tmp_path: Path) -> None:
    readme = _readme(tmp_path, f"{sys.executable} -c 'import time; time.sleep(0)'")
    with pytest.raises(
        readme_numbers.NumbersError, match="span 'Start here / sleep' selects 2 commands"
    ):
        readme_numbers.spans(readme.read_text())
    text = _readme(tmp_path, "true").read_text().replace("here / pytest", "here / nosuch")
    with pytest.raises(readme_numbers.NumbersError, match="'Start here / nosuch' selects no"):
        readme_numbers.spans(text)


def test_a_fence_with_attributes_opens_and_closes_like_any_other() -> None:
    """```python title="my_attention.py" (a file to save) is a fence too: the section after it
    still has its commands, and the file's lines are none of them."""
    text = '## A\n\n```python title="x.py"\nprint(1)\n```\n\n## B\n\n```bash\necho b\n```\n'
    assert readme_numbers.commands(text) == {"B": ["echo b"]}
