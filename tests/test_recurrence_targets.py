"""benchmarks/scripts/recurrence_targets.py: our recurrences against fla's naive chunked
references (their time) and a long forward (its peak), judged PASS or FAIL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))
import recurrence_targets as script


@pytest.mark.slow
def test_the_script_times_both_sides_and_judges_each_target(capsys):
    pytest.importorskip("fla", reason="fla-core's naive references")
    assert script.main(["--length", "256", "--long", "512", "--repeats", "1"]) in (0, 1)
    out = capsys.readouterr().out
    names = [m.name for m in script.MECHANISMS]
    timed = [line for line in out.splitlines() if line.split("  ")[0].strip() in names]
    assert len(timed) == 2 * len(names)  # a time ratio and a peak each
    assert all(line.endswith(("PASS", "FAIL")) for line in timed)


def test_without_fla_it_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(script, "fla_naive", lambda family: None)
    assert script.main(["--length", "64", "--long", "64"]) == 2
    assert "needs fla-core (pip install fla-core)" in capsys.readouterr().err
