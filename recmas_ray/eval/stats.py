"""Statistics of paired method comparisons on the same questions (scipy): Wilson intervals, McNemar's exact
test for accuracy, paired differences (t-test, bootstrap) for per-question quantities such as NLL.

Every comparison in the demo's verdicts is paired: two methods answered the same held-out questions, so the
test looks at the per-question differences (discordant pairs for accuracy), never at overlapping intervals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as _st


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials ((0, 1) for n = 0)."""
    if n <= 0:
        return (0.0, 1.0)
    ci = _st.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(max(0.0, ci.low)), float(min(1.0, ci.high)))


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """McNemar's exact test of paired accuracy: two-sided exact binomial test on the discordant pairs.

    `a[i]`, `b[i]`: was question i answered correctly by method A / B. Returns the counts (a_only: A right
    and B wrong; b_only: the reverse), the accuracy difference A - B and the p-value (1.0 with no
    discordant pair: no evidence either way).
    """
    if len(a) != len(b):
        raise ValueError(f"mcnemar_exact: {len(a)} and {len(b)} outcomes; the questions must be paired")
    a_only = sum(bool(x) and not bool(y) for x, y in zip(a, b))
    b_only = sum(bool(y) and not bool(x) for x, y in zip(a, b))
    n = len(a)
    p = float(_st.binomtest(a_only, a_only + b_only, 0.5).pvalue) if a_only + b_only else 1.0
    return {"n": n, "a_only": a_only, "b_only": b_only, "diff": (a_only - b_only) / n if n else float("nan"),
            "p": p}


def paired_difference(a: Sequence[float | None], b: Sequence[float | None], *, num_bootstrap: int = 2000,
                      seed: int = 0, confidence: float = 0.95) -> dict:
    """Mean of a[i] - b[i] over the pairs where both are finite: standard error, paired t-test p-value and
    a percentile bootstrap interval of the mean (seeded, so reruns agree). NaN fields when n < 2."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} and {len(b)} values; the questions must be paired")
    pairs = [(float(x), float(y)) for x, y in zip(a, b)
             if x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y))]
    n = len(pairs)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "mean": nan, "se": nan, "t": nan, "p": nan, "ci_low": nan, "ci_high": nan}
    d = np.array([x - y for x, y in pairs])
    mean = float(d.mean())
    if n < 2:
        return {"n": n, "mean": mean, "se": nan, "t": nan, "p": nan, "ci_low": nan, "ci_high": nan}
    se = float(d.std(ddof=1) / math.sqrt(n))
    if se == 0.0:  # identical differences: t undefined; no spread means no doubt about the sign
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    else:
        res = _st.ttest_1samp(d, 0.0)
        t, p = float(res.statistic), float(res.pvalue)
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, n, size=(num_bootstrap, n))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return {"n": n, "mean": mean, "se": se, "t": t, "p": p, "ci_low": float(np.quantile(boot, alpha)),
            "ci_high": float(np.quantile(boot, 1 - alpha))}


def paired_by_key(a: Mapping[str, float | None], b: Mapping[str, float | None], **kw) -> dict:
    """`paired_difference` of two per-question maps (question id -> value) over their common ids."""
    keys = [k for k in a if k in b]
    return paired_difference([a[k] for k in keys], [b[k] for k in keys], **kw)


def mcnemar_by_key(a: Mapping[str, bool], b: Mapping[str, bool]) -> dict:
    """`mcnemar_exact` of two per-question correctness maps over their common ids."""
    keys = [k for k in a if k in b]
    return mcnemar_exact([a[k] for k in keys], [b[k] for k in keys])


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests, in the input's order (NaN stays NaN and does
    not count as a test): p_(i) sorted ascending becomes max_{j <= i} min(1, (m - j + 1) p_(j)); rejecting
    where the adjusted p < alpha keeps the family-wise error rate at alpha."""
    finite = sorted((float(p), i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(float(p)))
    m, out, running = len(finite), [float("nan")] * len(pvalues), 0.0
    for k, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


__all__ = ["wilson_interval", "mcnemar_exact", "paired_difference", "paired_by_key", "mcnemar_by_key", "holm"]
