"""eval.stats on data with known answers: Wilson, McNemar's exact test, the paired t-test and bootstrap."""

import math

import numpy as np
import pytest

from recmas_ray.eval import stats


def test_wilson_matches_the_closed_form():
    lo, hi = stats.wilson_interval(8, 64)
    z, n, p = 1.959963984540054, 64, 8 / 64
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (lo, hi) == pytest.approx((centre - half, centre + half), abs=1e-9)
    assert stats.wilson_interval(0, 16)[0] == 0.0 and stats.wilson_interval(16, 16)[1] == 1.0
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_is_the_exact_binomial_on_discordant_pairs():
    # 9 questions only A gets right, 2 only B, 20 both, 5 neither: p = 2 * P(X <= 2 | n = 11, 1/2)
    a = [1] * 9 + [0] * 2 + [1] * 20 + [0] * 5
    b = [0] * 9 + [1] * 2 + [1] * 20 + [0] * 5
    res = stats.mcnemar_exact(a, b)
    expect = 2 * sum(math.comb(11, k) for k in range(3)) / 2 ** 11
    assert (res["a_only"], res["b_only"], res["n"]) == (9, 2, 36)
    assert res["p"] == pytest.approx(expect, rel=1e-12) and res["diff"] == pytest.approx(7 / 36)
    assert stats.mcnemar_exact(b, a)["p"] == pytest.approx(expect)  # symmetric
    assert stats.mcnemar_exact([1, 0, 1], [1, 0, 1])["p"] == 1.0  # no discordant pair: no evidence
    with pytest.raises(ValueError, match="paired"):
        stats.mcnemar_exact([1, 0], [1])
    by_key = stats.mcnemar_by_key({"q1": True, "q2": False, "q3": True}, {"q3": False, "q1": True, "q2": False})
    assert (by_key["a_only"], by_key["b_only"]) == (1, 0)


def test_paired_difference_matches_a_hand_computed_t_test():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [0.5, 1.0, 2.5, 2.0, 4.5]
    d = np.array(x) - np.array(y)  # 0.5, 1, 0.5, 2, 0.5
    res = stats.paired_difference(x, y)
    se = d.std(ddof=1) / math.sqrt(5)
    assert res["mean"] == pytest.approx(0.9) and res["se"] == pytest.approx(se)
    assert res["t"] == pytest.approx(0.9 / se)
    # with 2 degrees of freedom the t distribution has a closed form: two-sided p = 1 - t / sqrt(2 + t^2)
    three = stats.paired_difference([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])  # d = 1, 2, 3: t = 2 sqrt(3)
    t = 2 * math.sqrt(3)
    assert three["t"] == pytest.approx(t) and three["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert res["ci_low"] <= res["mean"] <= res["ci_high"]
    # pairs with a missing value are dropped, not shifted
    res2 = stats.paired_difference(x + [None], y + [1.0])
    assert res2["n"] == 5 and res2["mean"] == pytest.approx(0.9)
    assert math.isnan(stats.paired_difference([1.0], [0.0])["se"])
    assert stats.paired_difference([1.0, 2.0], [1.0, 2.0])["p"] == 1.0


def test_paired_difference_detects_a_shift_and_not_noise():
    rng = np.random.default_rng(0)
    base = rng.normal(size=200)
    shifted = stats.paired_difference(base + 0.3 + rng.normal(scale=0.5, size=200), base)
    assert shifted["p"] < 1e-6 and shifted["ci_low"] > 0.1
    noise = [stats.paired_difference(base + rng.normal(scale=0.5, size=200), base)["p"] for _ in range(200)]
    assert 0.02 < np.mean(np.array(noise) < 0.05) < 0.10  # about alpha under the null
    by_key = stats.paired_by_key({"a": 2.0, "b": 3.0, "c": 9.0}, {"b": 1.0, "a": 1.0})
    assert by_key["n"] == 2 and by_key["mean"] == pytest.approx(1.5)


def test_holm_adjusts_a_family_step_down_in_input_order():
    from recmas_ray.eval.stats import holm

    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; max(2 x 0.03, 0.04)
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    got = holm([0.021, float("nan"), 0.2])
    assert got[0] == pytest.approx(0.042) and math.isnan(got[1]) and got[2] == pytest.approx(0.2)
    # the case: 0.021 among 7 tests does not survive
    assert holm([0.021, 0.42, 0.97, 0.3, 0.5, 0.6, 0.8])[0] == pytest.approx(0.147)
