"""DurationSketch against numpy over the raw durations: exact while few distinct values, within the
stated relative error past that; exact count/total/min/max; merges; a size that does not grow."""

from __future__ import annotations

import math
import pickle
import random

import numpy as np
import pytest

from omniprof.analysis import sketch as sk
from omniprof.analysis.crossrank import duration_stats

QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


def _check(s: sk.DurationSketch, xs: list[int]) -> float:
    """Every quantile within the sketch's bound of numpy's (linear, its default); the exact fields
    exact. Returns the worst relative error seen."""
    a = np.array(xs, dtype=np.float64)
    assert (s.count, s.total_ns, s.min_ns, s.max_ns) == (len(xs), sum(xs), min(xs), max(xs))
    worst = 0.0
    for q in QS:
        ref = float(np.quantile(a, q))
        got = s.quantile(q)
        assert abs(got - ref) <= s.relative_error * abs(ref) + 0.5 + 1e-9 * abs(ref), (q, got, ref, s.exact)
        if ref:
            worst = max(worst, abs(got - ref) / ref)
    return worst


def _samples(rng: random.Random, kind: str, n: int) -> list[int]:
    if kind == "lognormal":  # kernel-like: a long right tail over 4 decades
        return [max(1, round(rng.lognormvariate(11, 1.5))) for _ in range(n)]
    if kind == "bimodal":  # two kernels' worth of durations under one name
        return [round(rng.gauss(2_000, 50)) if rng.random() < 0.7 else round(rng.gauss(9_000_000, 1e5)) for _ in range(n)]
    if kind == "wide":  # 1 ns .. 10^12 ns, uniform in log
        return [round(10 ** rng.uniform(0, 12)) for _ in range(n)]
    if kind == "zeros":  # zero-length spans among short ones
        return [0 if rng.random() < 0.3 else rng.randrange(1, 5_000) for _ in range(n)]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["lognormal", "bimodal", "wide", "zeros"])
def test_bucketed_quantiles_within_the_stated_error_of_numpy(kind: str) -> None:
    rng = random.Random(kind)
    xs = _samples(rng, kind, 50_000)
    s = sk.DurationSketch.of(xs)
    assert not s.exact and s.relative_error == sk.RELATIVE_ERROR == 0.01
    _check(s, xs)


def test_few_distinct_values_are_exact_as_duration_stats() -> None:
    """Up to EXACT_VALUES distinct durations the sketch is exact: its stats are duration_stats' (the
    exact reference already checked against numpy), for any number of runs."""
    rng = random.Random(1)
    for n_distinct in (1, 2, 7, sk.EXACT_VALUES):
        values = rng.sample(range(1, 10**9), n_distinct)
        xs = [rng.choice(values) for _ in range(5_000)] + values
        s = sk.DurationSketch.of(xs)
        assert s.exact and s.relative_error == 0.0
        assert s.stats() == duration_stats(xs)
        _check(s, xs)  # relative_error 0: within the 0.5 ns of rounding of numpy's
    assert not sk.DurationSketch.of(range(1, sk.EXACT_VALUES + 2)).exact
    assert sk.DurationSketch.of([]).stats() == (0, 0, 0, 0, 0)


def test_every_bucket_holds_what_it_says() -> None:
    """bucket_of(d) = j with GAMMA**(j-1) < d <= GAMMA**j, and j's stand-in is within the error of d."""
    rng = random.Random(2)
    for d in [1, 2, 3, 10, 1000, 2**62] + [rng.randrange(1, 10**15) for _ in range(2000)]:
        j = sk.bucket_of(d)
        assert sk.GAMMA ** (j - 1) < d * (1 + 1e-12) and d <= sk.GAMMA ** j * (1 + 1e-12)
        rep = 2 * sk.GAMMA ** j / (sk.GAMMA + 1)
        assert abs(rep - d) <= sk.RELATIVE_ERROR * d * (1 + 1e-9)


def test_merge_is_the_sketch_of_the_union() -> None:
    """Merging (exact with exact, exact with bucketed, bucketed with bucketed) gives the sketch of
    all the durations: the same buckets as one built over them, quantiles within the bound."""
    rng = random.Random(3)
    a = _samples(rng, "lognormal", 20_000)
    b = _samples(rng, "bimodal", 30_000)
    c = [rng.choice([5, 10, 15]) for _ in range(100)]  # exact
    whole = sk.DurationSketch.of(a + b + c)
    merged = sk.DurationSketch.of(a).merge(sk.DurationSketch.of(b)).merge(sk.DurationSketch.of(c))
    assert merged == whole
    _check(merged, a + b + c)
    # Two exact halves whose union is still few values stay exact; past EXACT_VALUES they bucket.
    x, y = list(range(1, 500)), list(range(400, 900))
    assert sk.DurationSketch.of(x).merge(sk.DurationSketch.of(y)) == sk.DurationSketch.of(x + y)
    assert sk.DurationSketch.of(x).merge(sk.DurationSketch.of(y)).exact
    big = list(range(1, 2 * sk.EXACT_VALUES))
    m = sk.DurationSketch.of(big[::2]).merge(sk.DurationSketch.of(big[1::2]))
    assert not m.exact and m == sk.DurationSketch.of(big)
    _check(m, big)
    assert sk.DurationSketch.of([]).merge(m) == m == m.merge(sk.DurationSketch.of([]))


def test_size_is_bounded_whatever_the_number_of_durations() -> None:
    """The entries held do not grow with the number of durations: 10x more runs of the same
    distribution hold no more buckets than the span of their values needs, and no positive int64
    needs more than ~2,200."""
    rng = random.Random(4)
    sizes = {}
    for n in (10_000, 100_000):
        xs = [round(10 ** rng.uniform(3, 6)) for _ in range(n)]  # every bucket of the span hit at both sizes
        s = sk.DurationSketch.of(xs)
        sizes[n] = (s.entries, len(pickle.dumps(s)))
        # values in [10^3, 10^6]: buckets from bucket_of(1000) to bucket_of(10^6)
        assert s.entries == sk.bucket_of(1_000_000) - sk.bucket_of(1_000) + 1
    assert sizes[100_000][0] == sizes[10_000][0]
    assert abs(sizes[100_000][1] - sizes[10_000][1]) <= 64  # pickled: only the ints' widths differ
    full = sk.bucket_of(2**63 - 1) - sk.bucket_of(1) + 2  # and the bucket of durations <= 0
    assert full == math.ceil(math.log(2**63 - 1) / math.log(sk.GAMMA)) + 2 <= 2_200
    wide = sk.DurationSketch.of([round(2 ** rng.uniform(0, 62.9)) for _ in range(200_000)] + [0])
    assert wide.entries <= full
