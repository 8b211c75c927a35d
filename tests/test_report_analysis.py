"""The report's arithmetic on inputs with known answers: power laws, crossovers, Pareto fronts, the
join of task rows with cost rows."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("pandas")

import pandas as pd

from attention_zoo.report.analysis import (
    crossover,
    fit_exponent,
    join_tasks_costs,
    linear_slope,
    pareto_front,
)
from attention_zoo.report.context import Context
from attention_zoo.report.cost import crossover_text
from attention_zoo.report.ledger import fmt, numbers_in, significant


@pytest.mark.parametrize("exponent", [1.0, 1.8, 2.0, 0.5])
def test_fit_exponent_recovers_an_exact_power_law(exponent):
    lengths = [256, 1024, 4096, 16384]
    fit = fit_exponent(lengths, [3e-7 * n**exponent for n in lengths])
    assert fit.exponent == pytest.approx(exponent, abs=1e-12)
    assert fit.prefactor == pytest.approx(3e-7, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.points == 4


def test_fit_exponent_needs_two_distinct_positive_lengths():
    assert fit_exponent([1024, 1024], [1.0, 2.0]) is None
    assert fit_exponent([256, 1024], [0.0, 2.0]) is None  # a zero cannot be on a log scale
    noisy = fit_exponent([1, 2, 4, 8], [1, 4.4, 15, 70])
    assert 1.9 < noisy.exponent < 2.1 and noisy.r2 < 1.0


def test_crossover_is_interpolated_log_log_between_measured_lengths():
    lengths = [256, 1024, 4096]
    a = [1e-6 * n for n in lengths]  # linear
    b = [2e-9 * n**1.8 for n in lengths]  # steeper: a beats b from 500**1.25 on
    found = crossover(lengths, a, b)
    assert found.kind == "from" and found.between == (1024, 4096)
    assert found.length == pytest.approx(500**1.25, rel=1e-9)


def test_crossover_always_never_and_touching():
    lengths = [1, 2, 4]
    assert crossover(lengths, [1, 1, 1], [2, 2, 2]).kind == "always"
    assert crossover(lengths, [2, 2, 2], [1, 1, 1]).kind == "never"
    # below in the middle, not at the largest length: not "from" any length in the range
    assert crossover(lengths, [2, 0.5, 2], [1, 1, 1]).kind == "never"
    # equal at a measured length, below after it: from exactly that length
    touching = crossover(lengths, [3, 1, 0.5], [1, 1, 1])
    assert touching.kind == "from" and touching.length == pytest.approx(2.0)
    assert crossover([], [], []) is None


def test_a_crossover_counts_a_pair_within_its_margin_as_tied():
    """The ranking's tie rule: below by less than the larger spread is no win."""
    lengths = [1, 2, 4]
    # below at the longest length, but within the margin: tied (without margins: "always")
    assert crossover(lengths, [1, 1, 0.95], [2, 2, 1]).kind == "always"
    assert crossover(lengths, [1, 1, 0.95], [2, 2, 1], margins=[0, 0, 0.1]).kind == "tied"
    assert crossover(lengths, [1, 1, 1], [1, 1, 1]).kind == "tied"  # equal: tied, not "never"
    # tied at the first length, below after it: from that length, not "always"
    found = crossover(lengths, [0.95, 0.5, 0.5], [1, 1, 1], margins=[0.1, 0, 0])
    assert found.kind == "from" and found.length == pytest.approx(1.0)
    # a tie in the middle moves the crossing to it
    found = crossover(lengths, [0.5, 0.95, 0.5], [1, 1, 1], margins=[0, 0.1, 0])
    assert found.kind == "from" and found.between == (2, 4) and found.length == pytest.approx(2)


def test_the_report_says_tied_where_the_spreads_overlap_at_the_longest_length(tmp_path):
    rows = {
        name: {
            n: {
                "run_id": "r",
                "case_key": f"{name}{n}",
                "config": {"seq_len": n},
                "metrics": {"time_median": t, "time_iqr": iqr},
            }
            for n, t, iqr in points
        }
        for name, points in {
            "a": [(256, 2.0, 0.1), (512, 1.0, 0.1), (1024, 0.95, 0.1)],
            "b": [(256, 1.0, 0.1), (512, 1.0, 0.1), (1024, 1.0, 0.02)],
        }.items()
    }
    ctx = Context(cases=None, bench=None, tasks=None, runs=[], out_dir=tmp_path)
    assert crossover_text(ctx, rows["a"], rows["b"], "time_median") == "tied at the longest length"
    rows["a"][1024]["metrics"]["time_median"] = 0.5  # now below beyond both spreads
    text = crossover_text(ctx, rows["a"], rows["b"], "time_median")
    assert text == "from L ≈ 512"  # equal at 512, below beyond both spreads from there
    (entry,) = ctx.ledger.entries
    assert entry.params == {"n_a": 3, "spread": True} and len(entry.refs) == 12


def test_pareto_front_keeps_only_undominated_points():
    cost = [1.0, 2.0, 3.0, 2.0, 4.0]
    accuracy = [0.5, 0.9, 0.8, 0.6, 0.95]
    assert pareto_front(cost, accuracy) == [True, True, False, False, True]
    # steps to target: fewer is better
    assert pareto_front([1, 2, 3], [300, 100, 200], maximize=False) == [True, True, False]
    # a duplicate point does not dominate its twin
    assert pareto_front([1, 1], [0.5, 0.5]) == [True, True]


def test_linear_slope_is_bytes_per_layer():
    assert linear_slope([2, 4, 8], [14, 26, 50]) == pytest.approx(6.0)
    assert linear_slope([4, 4], [1, 2]) is None


def test_join_matches_tasks_to_costs_of_the_same_model_length_and_batch():
    tasks = pd.DataFrame(
        {
            "backend": ["lsh-2", "lsh-2", "shared-qk", "local"],
            "model_key": ["A", "A", "B", "C"],
            "length": [64, 64, 64, 64],
            "batch": [8, 8, 8, 8],
        }
    )
    costs = pd.DataFrame(
        {
            "model_key": ["A", "B", "B", "C"],
            "length": [64, 64, 128, 64],
            "batch": [8, 8, 8, 4],  # C was measured at another batch: no match
            "time": [0.01, 0.02, 0.08, 0.5],
        }
    )
    joined = join_tasks_costs(tasks, costs, on=("model_key", "length", "batch"))
    assert list(joined["backend"]) == ["lsh-2", "lsh-2", "shared-qk"]
    assert list(joined["time"]) == [0.01, 0.01, 0.02]
    empty = join_tasks_costs(tasks, costs.iloc[0:0])
    assert empty.empty and "time" in empty.columns


def test_number_formats_and_tokens():
    assert significant(0.012345) == "0.0123" and significant(999.7) == "1,000"
    assert significant(12.34) == "12.3" and significant(123456) == "123,456"
    assert fmt("time_median", 0.25) == "250" and fmt("peak_bytes", 3 * 2**20) == "3.00"
    assert fmt("ratio", 0.5) == "0.500x" and fmt("fraction", 0.948) == "94.8%"
    assert numbers_in("L ≈ 1,024 at 0.23x; x86_64 lsh-4 (94.8%)") == ["1,024", "0.23", "94.8"]
    assert not math.isnan(float(numbers_in("-1.5")[0]))
