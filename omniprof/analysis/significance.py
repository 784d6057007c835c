"""The statistics behind :mod:`omniprof.analysis.diff`: is a change signal or noise?

Three tests, each for one kind of evidence:

* :func:`share_tests` -- one run a side of a *sampled* profile. A function's samples are draws
  from the run: whether it grew is judged on its share of the samples, with the noise its sample
  counts give. Its change is the ratio of its share in B to its share in A, over the median ratio
  of all functions judged: a function made ``r`` times slower while the rest stays the same stands
  ``r`` times above the others, whatever its share, and machine load that stretches the whole run
  moves none. One-sided test on the log ratio against the smallest change worth reporting
  (``H0: change <= min_ratio``), its sampling variance scaled by the pair's **dispersion**:
  samples taken while the process waited for a CPU come in bursts of one stack, not independent
  draws, so the squared z-scores of all functions are compared with their binomial expectation
  (their median over 0.455, the median of a chi-square with one degree of freedom, robust to the
  few functions that did change). On a loaded machine the dispersion is well above 1, and only
  larger changes are shown.
* :func:`time_p` -- one run a side of a time: a run's time on a shared machine varies by a
  relative amount no single run can show, so it is judged against a **noise model**, a
  log-normal spread of ``noise_pct`` percent per run (``--time-noise-pct``).
* :func:`rank_p` -- repeated runs a side: the exact Wilcoxon-Mann-Whitney rank-sum test
  (:func:`permutation_p` on ranks), which assumes only that runs are exchangeable.

Several entries judged at once are corrected for their number (Bonferroni: each p times the
number of entries judged), so a table of 50 functions is not 50 chances of a false alarm.

>>> round(share_p(100, 1000, 100, 1000), 3)        # the same share: no evidence
0.5
>>> share_p(100, 1000, 300, 1000) < 1e-9           # tripled against the rest: certain
True
>>> round(time_p(1.0, 1.1, noise_pct=20), 2)        # 10% slower, 20% run-to-run noise
0.36

.. versionadded:: 0.2
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence

from omniprof.errors import InvalidArgumentError

__all__ = ["share_p", "odds_ratio", "share_tests", "time_p", "permutation_p", "rank_p", "normal_sf", "t_sf",
           "bonferroni"]

_EXACT_LIMIT = 20_000
_DRAWS = 10_000
#: The median of a chi-square variable with one degree of freedom.
_CHI2_1_MEDIAN = 0.4549364231195724


def normal_sf(z: float) -> float:
    """P(Z >= z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def t_sf(t: float, df: int) -> float:
    """P(T >= t) for Student's T with ``df`` degrees of freedom (the regularized incomplete beta
    function, by its continued fraction).

    >>> round(t_sf(2.015, 5), 3)   # the one-sided 5% point of t with 5 degrees of freedom
    0.05
    """
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return tail if t >= 0 else 1.0 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (modified Lentz continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side only
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0)


def _log_odds(ka: int, na: int, kb: int, nb: int) -> tuple[float, float]:
    """The log odds ratio of the share ``kb / nb`` over ``ka / na`` and its variance (Woolf), with
    0.5 added to each of the four counts (so a count of 0 gives a finite answer)."""
    a, b = ka + 0.5, max(na - ka, 0) + 0.5
    c, d = kb + 0.5, max(nb - kb, 0) + 0.5
    return math.log(c / d) - math.log(a / b), 1 / a + 1 / b + 1 / c + 1 / d


def odds_ratio(ka: int, na: int, kb: int, nb: int) -> float:
    """How many times the function's time grew against the rest of the run, from its samples ``ka``
    of ``na`` in A and ``kb`` of ``nb`` in B (0.5 added to each count).

    >>> round(odds_ratio(250, 1000, 750, 1500), 1)   # a quarter of the run, then made 3x slower
    3.0
    """
    return math.exp(_log_odds(ka, na, kb, nb)[0])


def share_p(ka: int, na: int, kb: int, nb: int, *, min_ratio: float = 1.0, dispersion: float = 1.0) -> float:
    """One-sided p that a function's time grew, against the rest of the run, by more than
    ``min_ratio`` times, from its samples ``ka`` of ``na`` in run A and ``kb`` of ``nb`` in run B:
    the log odds ratio over Woolf's standard error; ``dispersion`` scales the variance (1:
    independent draws).

    >>> share_p(50, 1000, 150, 1000, min_ratio=1.1) < 1e-6
    True
    """
    if na <= 0 or nb <= 0 or not 0 <= ka <= na or not 0 <= kb <= nb:
        raise InvalidArgumentError(f"share_p needs 0 <= k <= n and n > 0 on each side (got {ka}/{na}, {kb}/{nb})")
    lo, var = _log_odds(ka, na, kb, nb)
    return normal_sf((lo - math.log(min_ratio)) / math.sqrt(var * dispersion))


def _median(xs: Sequence[float]) -> float:
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def share_tests(counts: Mapping[str, tuple[int, int]], na: int, nb: int, *, min_ratio: float = 1.0,
                alpha: float = 0.01, dispersion: float | None = None
                ) -> tuple[dict[str, tuple[float, float, float]], float]:
    """Each function's change between two sampled runs, told from the noise of its samples.

    ``counts`` maps each function judged to its samples ``(ka, kb)`` of the runs' ``na`` and
    ``nb``. A function's change is the ratio of its share in B to its share in A over the same
    ratio for the **rest** of the run: the functions that did not change. Which those are is found
    one at a time: the function furthest from the rest (in standard errors) leaves the reference
    while its change is significant in either direction at ``alpha`` (Bonferroni over the
    functions), then the rest is measured again -- so when one function alone got ``r`` times
    slower and every other share fell with it, the rest is the others and the change is ``r``. The
    noise is the sampling variance of the log share ratio, ``(1 - p) / k`` on each side (0.5 added
    to each count), plus the rest's, times the pair's **dispersion**: the median squared z-score of
    the functions in the reference around it (Pearson's, over its degrees of freedom), at least 1
    -- or ``dispersion`` where given. An estimated dispersion is itself uncertain: the test is then
    Student's t with the reference's degrees of freedom, not the normal.

    Returns, per function, ``(change, p_up, p_down)`` -- the one-sided p's (not yet corrected for
    the number of functions) that it grew (fell) by more than ``min_ratio`` times -- and the
    dispersion used.
    """
    keys = list(counts)
    m = len(keys)
    ys, vs = {}, {}
    for k, (ka, kb) in counts.items():
        a, b = ka + 0.5, kb + 0.5
        ys[k] = math.log(b / nb) - math.log(a / na)
        vs[k] = max(1.0 - a / na, 0.0) / a + max(1.0 - b / nb, 0.0) / b
    shift = math.log(min_ratio)

    def center(ref: list[str]) -> tuple[float, float]:
        ra = sum(counts[k][0] for k in ref) + 0.5
        rb = sum(counts[k][1] for k in ref) + 0.5
        return (math.log(rb / nb) - math.log(ra / na),
                max(1.0 - ra / na, 0.0) / ra + max(1.0 - rb / nb, 0.0) / rb)

    def spread(ref: list[str], c: float, cv: float) -> float:
        if dispersion is not None:
            return dispersion
        if len(ref) < 3:
            return 1.0
        return max(1.0, sum((ys[k] - c) ** 2 / (vs[k] + cv) for k in ref) / (len(ref) - 1))

    def robust(ref: list[str], c: float, cv: float) -> float:
        """The median-based spread: what a function picked for standing out cannot pull down."""
        if dispersion is not None or len(ref) < 3:
            return 1.0
        return _median([(ys[k] - c) ** 2 / (vs[k] + cv) for k in ref]) / _CHI2_1_MEDIAN

    def test(k: str, c: float, cv: float, phi: float, df: int) -> tuple[float, float, float]:
        se = math.sqrt((vs[k] + cv) * phi)
        d = ys[k] - c
        if se <= 0.0:  # one function holding every sample on both sides: nothing to compare
            return math.exp(d), float(d <= shift), float(-d <= shift)
        if dispersion is not None or df < 2 or phi <= 1.0:  # the sampling noise alone: a normal z
            return math.exp(d), normal_sf((d - shift) / se), normal_sf((-d - shift) / se)
        return math.exp(d), t_sf((d - shift) / se, df), t_sf((-d - shift) / se, df)  # dispersion estimated

    ref = list(keys)
    while len(ref) > max(1, (m + 1) // 2):  # the rest stays at least half the functions
        def apart(k: str) -> float:  # how far k stands from the rest without it
            c, cv = center([j for j in ref if j != k])
            return (ys[k] - c) ** 2 / (vs[k] + cv)

        far = max(ref, key=apart)
        rest = [j for j in ref if j != far]
        c, cv = center(rest)
        # The rest's spread, but never below the median-based one of all of them with ``far`` (it
        # was picked for standing out: leaving it out alone would understate the noise).
        _, up, down = test(far, c, cv, max(spread(rest, c, cv), robust(ref, c, cv)), len(rest) - 1)
        if min(1.0, m * min(up, down)) > alpha:
            break
        ref = rest
    c, cv = center(ref)
    phi = max(spread(ref, c, cv), robust(ref, c, cv))
    return {k: test(k, c, cv, phi, len(ref) - 1) for k in keys}, phi


def time_p(a: float, b: float, *, noise_pct: float) -> float:
    """One-sided p that time ``b`` is slower than ``a`` beyond the run-to-run noise of one run on
    each side, each run's time log-normal with a spread of ``noise_pct`` percent."""
    if a <= 0 or b <= 0:
        return 1.0 if b <= a else 0.0
    if noise_pct <= 0:
        return 0.0 if b > a else 1.0
    sigma = math.log1p(noise_pct / 100.0)
    return normal_sf(math.log(b / a) / (sigma * math.sqrt(2.0)))


def bonferroni(p: float, m: int) -> float:
    """``p`` corrected for ``m`` entries judged at once."""
    return min(1.0, p * max(1, m))


def permutation_p(a: Sequence[float], b: Sequence[float], *, max_splits: int = _EXACT_LIMIT,
                  draws: int = _DRAWS, seed: int = 0) -> float:
    """One-sided permutation test: p of ``mean(b) - mean(a)`` being this large by chance.

    Every split of the pooled values into groups of ``len(a)`` and ``len(b)`` is enumerated when
    there are at most ``max_splits``, else ``draws`` random splits are drawn (fixed ``seed``; then
    ``p = (hits + 1) / (draws + 1)``).

    >>> permutation_p([1, 2, 3], [4, 5, 6])  # the observed split is the most extreme of 20
    0.05
    >>> permutation_p([1, 2, 3], [1, 2, 3])  # 14 of the 20 splits are at least as far apart: no evidence
    0.7
    """
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        raise InvalidArgumentError("permutation_p needs at least one value on each side")
    pooled = [float(x) for x in (*a, *b)]
    total = sum(pooled)
    n = na + nb
    # mean(b) - mean(a) grows with sum(b) (the pooled total is fixed), so compare sums of the b group.
    observed = sum(pooled[na:])
    eps = 1e-9 * max(1.0, abs(total))
    if math.comb(n, nb) <= max_splits:
        hits = count = 0
        for idx in itertools.combinations(range(n), nb):
            count += 1
            if sum(pooled[i] for i in idx) >= observed - eps:
                hits += 1
        return hits / count
    rng = random.Random(seed)
    hits = 0
    for _ in range(draws):
        if sum(rng.sample(pooled, nb)) >= observed - eps:
            hits += 1
    return (hits + 1) / (draws + 1)


def min_p(na: int, nb: int) -> float:
    """The smallest p the rank test can give with ``na`` and ``nb`` runs."""
    return 1.0 / math.comb(na + nb, na)


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``values`` in their order, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rank_p(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided Wilcoxon-Mann-Whitney test, exact: :func:`permutation_p` on the pooled ranks.

    >>> rank_p([10, 11, 12], [13, 14, 1000])   # as for any complete separation of 3 vs 3
    0.05
    """
    r = _ranks([*a, *b])
    return permutation_p(r[: len(a)], r[len(a):])
