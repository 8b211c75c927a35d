"""benchmarks/scripts/recurrence_targets.py: our recurrences against fla's naive chunked
references (their time) and a long forward (its peak), judged PASS or FAIL."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scripts" / "recurrence_targets.py"


def _script():
    spec = importlib.util.spec_from_file_location("recurrence_targets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_script_times_both_sides_and_judges_each_target(capsys):
    pytest.importorskip("fla", reason="fla-core's naive references")
    script = _script()
    assert script.main(["--length", "256", "--long", "512", "--repeats", "1"]) in (0, 1)
    out = capsys.readouterr().out
    names = [m.name for m in script.MECHANISMS]
    timed = [line for line in out.splitlines() if line.split("  ")[0].strip() in names]
    assert len(timed) == 2 * len(names)  # a time ratio and a peak each
    assert all(line.endswith(("PASS", "FAIL")) for line in timed)


def test_without_fla_it_says_what_to_install(monkeypatch, capsys):
    script = _script()
    monkeypatch.setattr(script, "fla_naive", lambda family: None)
    assert script.main(["--length", "64", "--long", "64"]) == 2
    assert "needs fla-core (pip install fla-core)" in capsys.readouterr().err
