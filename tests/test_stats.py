"""rlkit.stats against known values: Wilson (checked against scipy's binomtest), exact McNemar, Chen et al.'s
pass@k, majority vote, and the seeded bootstrap."""

from __future__ import annotations

import math

import pytest

from rlkit import stats


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 10, 0.0, 0.277533),
    (5, 10, 0.236593, 0.763407),
    (41, 100, 0.318673, 0.507986),
    (52, 100, 0.423166, 0.615354),
    (100, 100, 0.963007, 1.0),
])
def test_wilson_matches_the_textbook(k, n, low, high):
    assert stats.wilson(k, n) == pytest.approx((low, high), abs=1e-6)


@pytest.mark.parametrize(("gained", "lost", "p"), [
    (11, 3, 0.057373046875),   # 2 * P(X <= 3), X ~ Bin(14, 1/2)
    (10, 2, 0.03857421875),
    (5, 5, 1.0),
    (0, 0, 1.0),
    (6, 0, 0.03125),
])
def test_exact_mcnemar(gained, lost, p):
    before = [0] * gained + [1] * lost + [1] * 7 + [0] * 4  # concordant pairs do not change p
    after = [1] * gained + [0] * lost + [1] * 7 + [0] * 4
    assert stats.mcnemar(before, after) == pytest.approx(p)


@pytest.mark.parametrize(("n", "c", "k", "value"), [
    (10, 3, 1, 0.3), (10, 3, 5, 1 - 21 / 252), (4, 2, 2, 1 - 1 / 6), (5, 0, 3, 0.0), (8, 8, 8, 1.0), (8, 1, 8, 1.0),
])
def test_pass_at_k_is_chens_estimator(n, c, k, value):
    assert stats.pass_at_k(n, c, k) == pytest.approx(value)
    assert stats.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


@pytest.mark.parametrize(("answers", "correct", "expected"), [
    (["4", "4", "5"], [True, True, False], True),
    (["5", "4", "5"], [False, True, False], False),
    ([None, None, "4"], [False, False, True], True),   # no answer never wins the vote
    (["5", "4"], [False, True], False),                 # a tie goes to the answer seen first
    ([None, None], [False, False], False),
])
def test_majority_vote(answers, correct, expected):
    assert stats.maj_at_k(answers, correct) is expected


def test_paired_on_binary_scores_uses_mcnemar_and_marks_significance():
    before = [0] * 10 + [1] * 2 + [1] * 40 + [0] * 48
    after = [1] * 10 + [0] * 2 + [1] * 40 + [0] * 48
    result = stats.paired(before, after)
    assert result["test"] == "mcnemar" and result["diff"] == pytest.approx(0.08)
    assert result["p"] == pytest.approx(0.03857421875) and result["significant"]
    assert result["low"] < 0.08 < result["high"] and result["low"] > 0
    assert stats.paired(before, after) == result  # seeded
    noise = stats.paired([0, 1] * 50, [1, 0] * 50)
    assert noise["p"] == 1.0 and not noise["significant"] and noise["low"] < 0 < noise["high"]


def test_paired_on_graded_scores_uses_a_bootstrap_test():
    before = [0.5] * 50
    shifted = stats.paired(before, [0.7] * 25 + [0.6] * 25)
    assert shifted["test"] == "paired bootstrap" and shifted["diff"] == pytest.approx(0.15)
    assert shifted["p"] == pytest.approx(1 / (stats.BOOTSTRAP_SAMPLES + 1)) and shifted["significant"]  # never 0
    flat = stats.paired(before, [0.6, 0.4] * 25)
    assert flat["diff"] == pytest.approx(0.0) and flat["p"] > 0.5 and not flat["significant"]
    with pytest.raises(ValueError, match="same problems"):
        stats.paired([1, 0], [1])


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    small = stats.bootstrap([0.2, 0.9, 0.5, 0.4] * 5)
    large = stats.bootstrap([0.2, 0.9, 0.5, 0.4] * 100)
    assert small[0] < 0.5 < small[1] and large[0] < 0.5 < large[1]
    assert large[1] - large[0] < (small[1] - small[0]) / 3
    assert stats.bootstrap([0.2, 0.9, 0.5, 0.4] * 5) == small  # seeded


def test_sampled_metrics_and_their_display():
    answers = [["4", "4", "5", "4"], ["1", "2", "3", "2"], [None, "7", None, None]]
    correct = [[True, True, False, True], [False, False, True, False], [False, True, False, False]]
    out = stats.sampled(answers, correct)
    assert list(out) == ["pass@1", "pass@4", "avg@4", "maj@4"]
    assert out["pass@1"]["mean"] == pytest.approx((0.75 + 0.25 + 0.25) / 3)
    assert out["pass@4"]["mean"] == 1.0 and out["avg@4"]["mean"] == out["pass@1"]["mean"]
    assert out["maj@4"]["mean"] == pytest.approx(2 / 3)
    assert stats.show({"mean": 0.41, "low": 0.3187, "high": 0.508}) == "0.410 [0.319, 0.508]"
    assert stats.show_diff(stats.paired([0] * 6, [1] * 6)).endswith("p=0.031 *")


def test_bootstrap_ratio_resamples_clusters():
    """One instruction per prompt: the ratio's interval is the plain bootstrap's, draw for draw. Prompts of unequal
    size weigh by their size: 2 of 2 and 0 of 8 is 0.2, not the mean of the per-prompt shares (0.5)."""
    values = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    assert stats.bootstrap_ratio(values, [1] * 10) == stats.bootstrap(values)
    low, high = stats.bootstrap_ratio([2, 0] * 10, [2, 8] * 10)
    assert low < 0.2 < high and high < 0.5
    assert stats.bootstrap_ratio([], []) == (0.0, 1.0)
    with pytest.raises(ValueError, match="one denominator per numerator"):
        stats.bootstrap_ratio([1, 2], [3])
