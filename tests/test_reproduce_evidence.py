"""The rules every task claim's verdict follows: Student's t intervals (against a textbook case),
gap classes, the reference's floor and the seed count."""

from __future__ import annotations

import pytest

from attention_zoo.report.claims import verdict_class
from attention_zoo.reproduce.evidence import (
    ABOVE,
    BELOW,
    FEW_SEEDS,
    GROUPED,
    LEVEL,
    NOT_ABOVE,
    NOT_LEARNED,
    OURS_ONLY,
    STRADDLES,
    exact_siblings,
    extra_backends,
    gap_class,
    judge_gap,
)
from attention_zoo.reproduce.intervals import Interval, mean_interval, paired_gap, t_quantile

# Student's sleep data (Cushny & Peebles 1905; R's `sleep`): extra hours of sleep of 10 patients
# under two drugs. R: t.test(extra ~ group, data = sleep, paired = TRUE) gives t = -4.0621,
# df = 9 and the 95% interval of group 1 - group 2: [-2.4598858, -0.7001142], mean -1.58.
DRUG_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_interval_matches_the_textbook_case() -> None:
    gap = paired_gap(dict(enumerate(DRUG_1)), dict(enumerate(DRUG_2)))
    assert gap.n == 10
    assert gap.mean == pytest.approx(-1.58)
    assert gap.low == pytest.approx(-2.4598858, abs=1e-6)
    assert gap.high == pytest.approx(-0.7001142, abs=1e-6)


@pytest.mark.parametrize(
    "p, df, expected",  # printed tables of Student's t
    [
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 9, 2.262),
        (0.95, 30, 1.697),
        (0.025, 4, -2.776),
    ],
)
def test_t_quantiles_match_the_printed_table(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=5e-4)


def test_mean_interval_needs_two_values_and_is_a_point_when_they_agree() -> None:
    with pytest.raises(ValueError):
        mean_interval([0.5])
    same = mean_interval([0.9, 0.9, 0.9])
    assert (same.low, same.mean, same.high) == pytest.approx((0.9, 0.9, 0.9))


@pytest.mark.parametrize(
    "low, high, cls",
    [(-2.0, 2.5, LEVEL), (-9.0, -4.0, BELOW), (3.5, 8.0, ABOVE), (-4.0, 1.0, None), (1, 4, None)],
)
def test_a_gap_is_classed_only_when_its_interval_is_inside_or_outside_the_band(
    low: float, high: float, cls: str | None
) -> None:
    assert gap_class(Interval((low + high) / 2, low, high, 3), band=3.0) == cls


def test_judge_gap_asks_for_seeds_a_learned_reference_and_a_decisive_interval() -> None:
    learned = {0: 80.0, 1: 82.0, 2: 81.0}
    far_below = {0: 20.0, 1: 22.0, 2: 19.0}
    assert judge_gap(learned, far_below, floor=50, band=3).cls == BELOW
    assert judge_gap(learned, {0: 80.5, 1: 81.5, 2: 81.0}, floor=50, band=3).cls == LEVEL
    assert judge_gap(learned, {0: 20.0, 1: 22.0}, floor=50, band=3).reason == FEW_SEEDS
    assert judge_gap(learned, far_below, floor=90, band=3).reason == NOT_LEARNED
    noisy = {0: 70.0, 1: 85.0, 2: 78.0}  # gap interval about [-21, +10]: crosses both edges
    assert judge_gap(learned, noisy, floor=50, band=3).reason == STRADDLES
    assert all(verdict_class(r) == "undecided" for r in (FEW_SEEDS, NOT_LEARNED, STRADDLES))


def test_not_above_is_one_sided() -> None:
    learned = {0: 98.0, 1: 99.5, 2: 98.5}
    close_below = {0: 96.5, 1: 99.0, 2: 98.0}  # gap about [-3, +1]: level or below, never above
    assert judge_gap(learned, close_below, floor=95, band=2, side=ABOVE).cls == NOT_ABOVE
    assert judge_gap(learned, close_below, floor=95, band=2).reason == STRADDLES  # two-sided
    assert judge_gap({0: 95.0, 1: 96.0, 2: 95.5}, {0: 99.9, 1: 100.0, 2: 99.8},
                           floor=90, band=2, side=ABOVE).cls == ABOVE  # fmt: skip
    assert judge_gap(learned, close_below, floor=99, band=2, side=ABOVE).reason == NOT_LEARNED


def test_exact_siblings_are_the_backends_that_compute_full_attention() -> None:
    assert exact_siblings("full", ["sdpa", "shared-qk", "local", "lsh-1", "full"]) == [
        "sdpa",
        "shared-qk",
    ]


def test_extra_backends_group_exact_siblings_and_show_the_others_gap() -> None:
    accs = {b: {0: 50.0, 1: 52.0, 2: 54.0} for b in ("full", "sdpa", "linear", "performer")}
    accs["linear"] = {0: 40.0, 1: 41.0}  # two seeds: no interval
    extras = extra_backends(accs, "full", ["performer"], "LRA", missing=FEW_SEEDS)
    assert [(e.backend, e.verdict, e.interval) for e in extras] == [
        ("linear", OURS_ONLY, FEW_SEEDS),
        ("sdpa", GROUPED, "+0.0 [+0.0, +0.0]"),
    ]
    assert extras[0].claim.endswith("no LRA row")
