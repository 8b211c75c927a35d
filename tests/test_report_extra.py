"""`zoo report` without the report extra: one line that says how to install it, exit 2."""

from __future__ import annotations

import sys

import pytest

from attention_zoo.cli import main as zoo_main
from attention_zoo.store import ResultStore


@pytest.mark.parametrize("missing", ["pandas", "seaborn"])
def test_report_without_its_extra_says_how_to_install_it(tmp_path, monkeypatch, capsys, missing):
    path = tmp_path / "s.sqlite"
    ResultStore(path).close()
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    assert zoo_main(["report", "--store", str(path), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"zoo report needs the report extra ({missing} is missing): pip install -e '.[report]'"
    )
    assert "\n" not in err
