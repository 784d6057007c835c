"""One sampled run a side: ``diff()`` tells sampling noise from a real change.

The sample counts are drawn here with a known truth (a fixed seed, so each test decides the same
way every time): pairs drawn from the very same shares must never regress, pairs in which one
function was made 3x slower must always flag that function and nothing else. Draws come both as
independent samples (binomial) and in bursts (several samples in a row of one stack, as a sampler
gives while the process waits for a CPU), which independent-draw statistics would call changes.
"""

from __future__ import annotations

import numpy as np
import pytest

from omniprof.analysis import significance
from omniprof.analysis.diff import TOTAL_KEY, diff
from omniprof.core.results import BackendResult, Frame, ProfileResult, StackSample

SHARES = {"hot": 0.40, "parse": 0.20, "f": 0.10, "g": 0.10, "h": 0.08, "io": 0.06, "log": 0.04, "misc": 0.02}
INTERVAL_NS = 1_000_000


def slower(shares: dict[str, float], name: str, factor: float) -> dict[str, float]:
    """The shares after ``name`` alone takes ``factor`` times as long."""
    w = {k: v * (factor if k == name else 1.0) for k, v in shares.items()}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def draw(shares: dict[str, float], n: int, rng: np.random.Generator, burst: int = 1) -> dict[str, int]:
    """About ``n`` samples of a run with these true shares: draws of one function, each repeated 1
    to ``burst`` times (bursts of samples of one stack)."""
    names = list(shares)
    picks = rng.multinomial(round(n / ((1 + burst) / 2)), [shares[k] for k in names])
    return {k: int(rng.integers(1, burst + 1, size=c).sum()) if c else 0 for k, c in zip(names, picks)}


def decide(a: dict[str, int], b: dict[str, int]) -> set[str]:
    """What diff() flags in a pair, from the counts alone: the functions at >= 1% judged, each
    p corrected for their number, alpha 0.01, threshold 10%."""
    na, nb = sum(a.values()), sum(b.values())
    judged = {k: (a[k], b[k]) for k in a if max(a[k] / na, b[k] / nb) >= 0.01}
    tests, _ = significance.share_tests(judged, na, nb, min_ratio=1.1)
    return {k for k, (_, up, _) in tests.items() if significance.bonferroni(up, len(judged)) <= 0.01}


def run(counts: dict[str, int], scale: float = 1.0) -> ProfileResult:
    """A cpu result whose samples end in the named functions, ``counts`` samples each, each sample
    weighing one interval (times ``scale``: a machine that ran the whole run slower)."""
    frames = [Frame("main", "app.py", 1)] + [Frame(n, "app.py", 10 + i) for i, n in enumerate(counts)]
    stacks = [(0, i + 1) for i in range(len(counts))]
    w = int(INTERVAL_NS * scale)
    samples = [StackSample(t, 1, i, w) for i, k in enumerate(counts.values()) for t in range(k)]
    return ProfileResult(parts=(BackendResult(backend="cpu", frames=frames, stacks=stacks, samples=samples),))


def regressed(a: dict[str, int], b: dict[str, int], scale_b: float = 1.0, **kw) -> set[str]:
    d = diff(run(a), run(b, scale_b), **kw)
    return {r.key.split()[0] for _, r in d.regressions}


def test_pairs_drawn_from_the_same_shares_never_regress_through_diff():
    """diff() on 40 pairs of results of 5,000 samples drawn from the same shares, one run a side:
    no function and no total regresses."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        d = diff(run(draw(SHARES, 5000, rng)), run(draw(SHARES, 5000, rng)))
        assert d.regressions == [], format_rows(d)


@pytest.mark.parametrize("burst", [1, 4])
def test_pairs_drawn_from_the_same_shares_never_regress(burst):
    """200 pairs of 20,000 samples from the same shares, as independent draws and in bursts of up
    to 4 samples of one stack: nothing is flagged."""
    rng = np.random.default_rng(100 + burst)
    flagged = [decide(draw(SHARES, 20_000, rng, burst), draw(SHARES, 20_000, rng, burst)) for _ in range(200)]
    assert [f for f in flagged if f] == []


def test_bursts_fool_a_test_without_the_dispersion():
    """Bursty pairs from the same shares, with no minimum effect (any change counts): judged as if
    each sample were an independent draw (dispersion 1) noise is called a growth in many of them;
    with the dispersion estimated from the pair, in a few (the dispersion of 8 functions is itself
    uncertain; the default minimum change of 10% keeps them all quiet, as the test above shows)."""
    rng = np.random.default_rng(7)
    fooled = kept = 0
    for _ in range(50):
        a, b = draw(SHARES, 20_000, rng, 4), draw(SHARES, 20_000, rng, 4)
        na, nb = sum(a.values()), sum(b.values())
        counts = {k: (a[k], b[k]) for k in SHARES}
        for phi in (1.0, None):
            tests, _ = significance.share_tests(counts, na, nb, dispersion=phi)
            flagged = any(significance.bonferroni(up, len(SHARES)) <= 0.01 for _, up, _ in tests.values())
            fooled += flagged and phi == 1.0
            kept += flagged and phi is None
    assert fooled >= 10 and kept <= 3, (fooled, kept)


@pytest.mark.parametrize("name", ["hot", "f", "log"])
def test_a_function_made_3x_slower_is_flagged_and_alone_through_diff(name):
    """diff() on 20 pairs of 5,000 samples, one function (40%, 10% or 4% of the run) made 3x slower
    in B: it regresses in every pair, and no other function does (the others' shares fell)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    new = slower(SHARES, name, 3.0)
    for _ in range(20):
        d = diff(run(draw(SHARES, 5000, rng)), run(draw(new, 5000, rng)))
        got = {r.key.split()[0] for _, r in d.regressions} - {TOTAL_KEY}
        assert got == {name}, format_rows(d)


@pytest.mark.parametrize("name", ["hot", "f", "log"])
@pytest.mark.parametrize("burst", [1, 4])
def test_a_function_made_3x_slower_is_always_flagged_and_alone(name, burst):
    """100 pairs of 20,000 samples (independent or in bursts), one function made 3x slower: it is
    flagged in every pair, and nothing else is."""
    rng = np.random.default_rng(sum(map(ord, name)) * 10 + burst)
    new = slower(SHARES, name, 3.0)
    flagged = [decide(draw(SHARES, 20_000, rng, burst), draw(new, 20_000, rng, burst)) for _ in range(100)]
    assert [f for f in flagged if f != {name}] == []


def format_rows(d) -> str:
    return "; ".join(f"{r.key.split()[0]} {r.a_samples}->{r.b_samples} p={r.p_value}" for r in d.tables[0].rows)


def test_a_whole_run_slower_than_the_noise_model_regresses_the_total_only():
    """The same shares, B's samples each weighing 3x (the whole run took three times as long): the
    total regresses against the default 25% noise model, no function does; at 1.3x the total stays
    within the noise, and regresses against a 5% one."""
    rng = np.random.default_rng(3)
    a, b = draw(SHARES, 2000, rng), draw(SHARES, 2000, rng)
    assert regressed(a, b, scale_b=3.0) == {TOTAL_KEY}
    assert regressed(a, b, scale_b=1.3) == set()
    assert regressed(a, b, scale_b=1.3, time_noise_pct=5) == {TOTAL_KEY}


def test_too_few_samples_decide_nothing():
    """12 samples against 36 (a 13 ms test, then the same at 3x): a tripled function with 4 of 12
    samples is not enough evidence; the p-values say so."""
    a = {"hot": 4, "rest": 8}
    b = {"hot": 24, "rest": 12}
    d = diff(run(a), run(b))
    hot = next(r for r in d.tables[0].rows if r.key.startswith("hot"))
    assert not hot.regressed and hot.p_value > 0.01 and (hot.a_samples, hot.b_samples) == (4, 24)


def test_share_p_matches_a_hand_computed_woolf_test():
    """share_p: the log odds ratio over Woolf's standard error (0.5 added to each count), against
    the minimum ratio, one-sided -- computed by hand for 100/1000 vs 150/1000."""
    import math

    lor = math.log(150.5 / 850.5) - math.log(100.5 / 900.5)
    se = math.sqrt(1 / 100.5 + 1 / 900.5 + 1 / 150.5 + 1 / 850.5)
    z = (lor - math.log(1.1)) / se
    expect = 0.5 * math.erfc(z / math.sqrt(2))
    assert significance.share_p(100, 1000, 150, 1000, min_ratio=1.1) == pytest.approx(expect, rel=1e-12)
    assert significance.share_p(100, 1000, 150, 1000, min_ratio=1.1, dispersion=4.0) == pytest.approx(
        0.5 * math.erfc(z / 2 / math.sqrt(2)), rel=1e-12)
