"""Error bars for the numbers rlkit prints: intervals, paired before/after tests and sampled metrics.

- :func:`wilson`: the 95% Wilson score interval of a proportion (accuracy on n problems). Unlike the
  normal approximation it stays inside [0, 1] and is honest at 0/n and n/n.
- :func:`bootstrap`: a seeded percentile bootstrap interval of a mean (F1, EM, a graded reward).
- :func:`bootstrap_ratio`: the same for a ratio of sums over clusters (IFEval's instruction-level accuracy:
  a prompt's instructions are not independent, so the prompts are resampled, not the instructions).
- :func:`paired`: before/after on the same problems: the mean difference, its paired-bootstrap interval
  and a p-value: exact McNemar (a two-sided binomial test on the discordant pairs) for 0/1 scores, a
  paired bootstrap test (resampling the centred differences) for graded ones.
- :func:`pass_at_k` (Chen et al. 2021's unbiased estimator), :func:`maj_at_k` (majority vote over the
  samples' extracted answers); avg@k is the mean correctness of the samples.

Pure Python and numpy, seeded: the same inputs give the same interval on every machine.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
ALPHA = 0.05
BOOTSTRAP_SAMPLES = 2000


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes / n`` (``(0.0, 1.0)`` for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0/n and n/n the bound is exactly 0 or 1 (the float arithmetic would leave 5e-17 above the mean).
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


def bootstrap(values: Sequence[float], *, seed: int = 0, samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of ``values`` (seeded, so reproducible)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, (samples, data.size))].mean(axis=1)
    low, high = np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2])
    return float(low), float(high)


def bootstrap_ratio(numerators: Sequence[float], denominators: Sequence[float], *, seed: int = 0,
                    samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of ``sum(numerators) / sum(denominators)``, resampling the pairs
    (clusters) together; seeded. ``(0.0, 1.0)`` when there is nothing to resample."""
    import numpy as np

    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if num.shape != den.shape:
        raise ValueError(f"a ratio needs one denominator per numerator: {num.size} and {den.size}")
    if num.size == 0 or den.sum() <= 0:
        return 0.0, 1.0
    index = np.random.default_rng(seed).integers(0, num.size, (samples, num.size))
    ratios = num[index].sum(axis=1) / np.maximum(den[index].sum(axis=1), 1e-12)
    low, high = np.quantile(ratios, [ALPHA / 2, 1 - ALPHA / 2])
    return float(low), float(high)


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0, 1) for v in values)


def interval(values: Sequence[float], *, seed: int = 0) -> tuple[float, float]:
    """Wilson for 0/1 scores, bootstrap for graded ones."""
    if is_binary(values):
        return wilson(int(sum(values)), len(values))
    return bootstrap(values, seed=seed)


def summary(values: Sequence[float], *, seed: int = 0) -> dict[str, Any]:
    """``{"mean", "low", "high", "n"}`` of per-problem scores (the 95% interval by :func:`interval`)."""
    values = [float(v) for v in values]
    low, high = interval(values, seed=seed)
    mean = sum(values) / len(values) if values else 0.0
    return {"mean": mean, "low": low, "high": high, "n": len(values)}


def mcnemar(before: Sequence[float], after: Sequence[float]) -> float:
    """The exact two-sided McNemar p-value of paired 0/1 outcomes (a binomial test on the discordant pairs)."""
    gained = sum(1 for b, a in zip(before, after, strict=True) if not b and a)
    lost = sum(1 for b, a in zip(before, after, strict=True) if b and not a)
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(before: Sequence[float], after: Sequence[float], *, seed: int = 0,
           samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Before/after on the same problems: ``{"diff", "low", "high", "p", "test", "significant", "n"}``.

    ``diff`` is mean(after) - mean(before); [low, high] its 95% paired-bootstrap interval; ``p`` exact
    McNemar for 0/1 scores, otherwise a paired bootstrap test of "no difference" (at least 1 / (samples + 1),
    never 0); ``significant`` is p < 0.05.
    """
    import numpy as np

    if len(before) != len(after):
        raise ValueError(f"paired scores need the same problems: {len(before)} before, {len(after)} after")
    d = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    if d.size == 0:
        return {"diff": 0.0, "low": 0.0, "high": 0.0, "p": 1.0, "test": "none", "significant": False, "n": 0}
    rng = np.random.default_rng(seed)
    index = rng.integers(0, d.size, (samples, d.size))
    means = d[index].mean(axis=1)
    low, high = np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2])
    observed = float(d.mean())
    if is_binary(before) and is_binary(after):
        p, test = mcnemar(before, after), "mcnemar"
    else:
        centred = (d - observed)[index].mean(axis=1)  # the bootstrap world where the true difference is 0
        # (hits + 1) / (samples + 1): a Monte Carlo p-value is never 0 (Davison & Hinkley 1997, eq. 4.11)
        hits = int((np.abs(centred) >= abs(observed) - 1e-12).sum())
        p, test = (hits + 1) / (samples + 1), "paired bootstrap"
    return {"diff": observed, "low": float(low), "high": float(high), "p": p, "test": test,
            "significant": p < ALPHA, "n": int(d.size)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the most common extracted answer is right (ties: the one seen first; no answer never wins)."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)
    return bool(next(c for a, c in zip(answers, correct, strict=True) if a == winner))


def sampled(answers: list[list[str | None]], correct: list[list[bool]]) -> dict[str, Any]:
    """pass@1, pass@k, avg@k and maj@k over problems with k samples each, each with its 95% interval."""
    k = min(len(c) for c in correct)
    per_problem = {
        "pass@1": [pass_at_k(len(c), sum(c), 1) for c in correct],
        f"pass@{k}": [pass_at_k(len(c), sum(c), k) for c in correct],
        f"avg@{k}": [sum(c) / len(c) for c in correct],
        f"maj@{k}": [float(maj_at_k(a, c)) for a, c in zip(answers, correct, strict=True)],
    }
    return {name: summary(values) for name, values in per_problem.items()}


def show(s: dict[str, Any], digits: int = 3) -> str:
    """``0.410 [0.315, 0.512]`` from a :func:`summary`."""
    return f"{s['mean']:.{digits}f} [{s['low']:.{digits}f}, {s['high']:.{digits}f}]"


def show_diff(p: dict[str, Any], digits: int = 3) -> str:
    """``+0.110 [+0.020, +0.200] p=0.02 *`` from a :func:`paired` (``*``: significant at 5%)."""
    mark = " *" if p["significant"] else ""
    return (f"{p['diff']:+.{digits}f} [{p['low']:+.{digits}f}, {p['high']:+.{digits}f}] "
            f"p={p['p']:.2g}{mark}")


def show_accuracy(accuracy: float | None, n: Any = None, bounds: Sequence[float] | None = None,
                  digits: int = 3) -> str:
    """An accuracy with its 95% interval: ``bounds`` if given, else Wilson's from ``n`` (a bare number without n)."""
    if accuracy is None:
        return "-"
    if bounds is None and isinstance(n, int) and not isinstance(n, bool) and n > 0:
        bounds = wilson(round(accuracy * n), n)
    if bounds is None:
        return f"{accuracy:.{digits}f}"
    return show({"mean": accuracy, "low": bounds[0], "high": bounds[1]}, digits)


def show_cut(results: dict[str, Any]) -> str:
    """``0.23``: the share of replies the token limit cut; ``-`` where the results do not say (an agent eval, a
    results file written before rlkit counted them)."""
    return "-" if results.get("cut") is None else f"{results['cut']:.2f}"


def show_degenerate(results: dict[str, Any]) -> str:
    """``0.12 (no answer 10, loop 2)``: the share of degenerate replies and how many of each kind; ``-`` where the
    results do not say (an agent eval, a results file written before rlkit counted them)."""
    if results.get("degenerate") is None:
        return "-"
    kinds = ", ".join(f"{kind} {count}" for kind, count in (results.get("degenerate_kinds") or {}).items())
    return f"{results['degenerate']:.2f}" + (f" ({kinds})" if kinds else "")
