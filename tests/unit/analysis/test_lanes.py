"""nest_lanes: the lane of each interval, checked against the lane-by-lane first-fit search it
replaced (kept here as the reference) and against the definition of a properly nested lane."""

from __future__ import annotations

import random

from omniprof.analysis.timeline import Nesting, nest_lanes


def first_fit(intervals, lanes):
    """The reference: try every lane in order with Nesting.place (the search before the tree)."""
    out = [(0, 0, -1)] * len(intervals)
    for i in sorted(range(len(intervals)), key=lambda k: (intervals[k][0], intervals[k][0] - intervals[k][1], k)):
        start, end = intervals[i]
        for k, lane in enumerate(lanes):
            depth = lane.place(start, end, i)
            if depth >= 0:
                out[i] = (k, depth, lane.parent)
                break
        else:
            lanes.append(Nesting())
            out[i] = (len(lanes) - 1, lanes[-1].place(start, end, i), lanes[-1].parent)
    return out


def state(lanes):
    return [(lane.ends, lane.ids, lane.last_start, lane.parent) for lane in lanes]


def random_calls(seed):
    rng = random.Random(seed)
    calls = []
    for _ in range(rng.randint(1, 4)):  # several parts sharing a track: later calls may start earlier
        base = rng.randint(-50, 200)
        calls.append([(s, s + rng.choice([0, 0, 1, -3, rng.randint(0, 10), rng.randint(0, 120)]))
                      for s in (base + rng.randint(0, 100) for _ in range(rng.randint(0, 60)))])
    return calls


def test_same_lanes_and_state_as_the_first_fit_search():
    """Every interval gets the lane, depth and parent the lane-by-lane search gives, and the lanes
    carried to the next call (a track shared by parts) are left in the same state (400 random
    track histories: ties, empty and reversed intervals, later parts starting earlier)."""
    for seed in range(400):
        ours, ref = [], []
        for intervals in random_calls(seed):
            assert nest_lanes(intervals, ours) == first_fit(intervals, ref), seed
            assert state(ours) == state(ref), seed


def test_lanes_are_nested_and_the_first_that_fits():
    """Read as plain intervals: on each lane every pair is disjoint or nested, and no interval could
    have gone to an earlier lane (it overlaps without nesting something placed there before it)."""
    rng = random.Random(7)
    intervals = [(s, s + rng.randint(1, 500)) for s in (rng.randint(0, 2_000) for _ in range(600))]
    placed = nest_lanes(intervals)
    by_lane: dict[int, list[int]] = {}
    for i, (lane, _, _) in enumerate(placed):
        by_lane.setdefault(lane, []).append(i)

    def clash(a, b):  # overlap without nesting (half-open)
        (s1, e1), (s2, e2) = intervals[a], intervals[b]
        return s1 < e2 and s2 < e1 and not (s1 <= s2 and e2 <= e1) and not (s2 <= s1 and e1 <= e2)

    for members in by_lane.values():
        assert not any(clash(a, b) for a in members for b in members if a < b)
    order = sorted(range(len(intervals)), key=lambda k: (intervals[k][0], intervals[k][0] - intervals[k][1], k))
    rank = {i: r for r, i in enumerate(order)}
    for i, (lane, _, _) in enumerate(placed):
        for earlier in range(lane):
            assert any(clash(i, j) for j in by_lane[earlier] if rank[j] < rank[i]), (i, lane, earlier)


def test_every_overlapping_interval_opens_a_lane():
    """20,000 intervals each starting inside the previous and ending after it: 20,000 lanes, in
    order (the shape that made the exporters quadratic)."""
    n = 20_000
    assert nest_lanes([(i, n + i) for i in range(n)]) == [(i, 0, -1) for i in range(n)]
