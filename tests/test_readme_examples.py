"""The README's examples run as printed: each block named here is extracted from README.md and
executed, its own asserts included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_block(heading: str) -> str:
    """The first ```python block after the README's line `heading`."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found is not None, f"no python block after {heading!r}"
    return found.group(1)


@pytest.mark.slow  # a few seconds: 32 tokens generated three ways, one without the cache
def test_the_generation_example_is_true_as_printed():
    """With the cache, greedy tokens equal the uncached forward's (the example asserts it)."""
    code = python_block("### Generation (decoding)")
    assert "assert torch.equal(out, same)" in code and "use_cache=False" in code
    names: dict[str, object] = {}
    exec(compile(code, f"{README}:Generation", "exec"), names)
    assert names["out"].shape == (2, 132)
