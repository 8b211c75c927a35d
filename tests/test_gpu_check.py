"""The GPU check's CPU side: its time budget (benchmarks/scripts/budget.sh) shares BUDGET seconds
by weight among the steps still to run, and the script refuses a machine without CUDA in one
line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SH = ROOT / "benchmarks" / "scripts" / "budget.sh"


def _limits(script: str, **env: str) -> list[int]:
    """budget_now after each budget_limit call of `script` (bash, budget.sh sourced)."""
    run = subprocess.run(
        ["bash", "-c", f"source {BUDGET_SH}\n{script}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BUDGET": "100", **env},
    )
    return [int(x) for x in run.stdout.split()]


def test_the_budget_is_shared_by_weight_and_what_is_left_moves_on():
    limits = _limits(
        """BUDGET_START=0; budget_plan a:1 b:2 c:1
        SECONDS=0; budget_limit a; echo $budget_now
        SECONDS=5; budget_limit b; echo $budget_now  # a took 5 s of its 25
        SECONDS=65; budget_limit c; echo $budget_now  # b took 60 s of its 63"""
    )
    assert limits == [25, 95 * 2 // 3, 35]


def test_a_step_gets_its_floor_and_step_limit_caps_it():
    late = """BUDGET_START=0; budget_plan a:1 b:1
        SECONDS=500; budget_limit a; echo $budget_now"""
    assert _limits(late) == [10]
    assert _limits("budget_plan a:1\nbudget_limit a; echo $budget_now", STEP_LIMIT="7") == [7]


def test_no_cuda_is_refused_in_one_line():
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
        cwd=ROOT,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "gpu_check.sh: no CUDA device is visible; run it on a machine with a GPU (the CPU "
        "checks: python -m pytest)"
    ]


def test_budgets_that_are_not_whole_seconds_are_refused():
    run = subprocess.run(
        ["bash", "-c", f"source {BUDGET_SH}"],
        capture_output=True,
        text=True,
        env={**os.environ, "BUDGET": "8m"},
    )
    assert run.returncode == 2
    assert run.stderr.strip() == "budget.sh: BUDGET must be whole seconds, not '8m'"
