"""Compare results: sampled functions, op statistics and kernel statistics, signal told from noise.

:func:`diff` builds plain rows (one per function / op / kernel, plus each table's total), each with
its time in A and B, the time and share deltas, a status (``changed``, ``same``, ``new``,
``vanished``) and whether it *regressed*; :func:`format_diff` formats them. ``omniprof diff A B
--fail-on-regression`` exits 1 when anything regressed, for CI.

What is compared: the flat profile of sampled functions (self time), and every table both sides
hold whose columns say what to compare, nothing guessed: op tables (``op_stats`` and its grouped
forms, in the vocabulary of :mod:`omniprof.core.opstats`, torch's and XLA's alike) by their key
columns (``name``, and ``input_shapes`` / ``stack`` / ``hlo_module`` where present) and self time
``self_ns``: an op's inclusive time also holds its children's, so summing it counts nested time
several times and one change shows in every parent row. ``kernel_stats`` by ``kernel_name`` and
``total_ns`` (kernels do not nest). Any other table with a ``name`` column by ``self_ns``, else
``total_ns``; a table without them is listed as not compared. Each table's ``(total)`` is the sum
of its rows, i.e. with self time the time recorded in its entries; shares are of that total.
``ProfilerStep#N`` rows compare as one ``ProfilerStep#*`` row.

Repeated runs: each side may be several results (runs of the same setup), or each recorded step
of a result may count as one run (``repeats="steps"``, op and kernel tables). A row's A and B are
then the medians over runs (a run disturbed by the machine moves a median little), with the
standard deviations, and shares are of the mean total. A change is tested against the run-to-run
spread with a one-sided **permutation test on ranks** (the exact Wilcoxon-Mann-Whitney rank-sum
test): the runs of both sides are pooled and ranked (ties share their mean rank), every way of
splitting the ranks into groups of the original sizes is enumerated (exactly up to 20,000 splits,
else 10,000 random splits with a fixed seed), and the p-value is the fraction of splits whose rank
sum for B is at least the observed one. Ranks make one outlying run count as one rank, not as its
size. ``confidence`` is ``1 - p``. It assumes only that, without a real change, runs are
exchangeable.

Calls capped (``clip_calls``, default 1.1): where the op spans are at hand (torch profiles) and
every run of both sides makes the same number of calls of an op, the verdict on that op (and on
the table's total) is taken on the runs with each call's self time capped at ``clip_calls`` times
the median of the same call (same op, same place among its calls) over all runs of both sides. A
call stretched by the scheduler giving the CPU to another process (milliseconds on a loaded
machine, for a call of 0.4 ms) then no longer lifts its whole run above the other side's runs.
The caps come from the pooled runs, whichever side each is on, so the rank test stays exact; the
times shown (A, B, shares, spreads) stay the plain medians of the runs as recorded. With ``na`` and
``nb`` runs the smallest possible p is ``1 / C(na + nb, na)``: 0.1 for 3 vs 3, 0.0143 for 4 vs 4,
0.0040 for 5 vs 5; the result says when ``alpha`` cannot be reached.

A row **regressed** when its time grew by more than ``threshold_pct`` percent, it holds at least
``min_share_pct`` of its table in A or B (tiny entries are noise), and, with at least two runs per
side, the permutation test gives ``p <= alpha``. A new entry regresses on the same terms against a
baseline of 0; vanished entries never regress. With one run per side there is no spread to test
against: the threshold alone decides, and the result says so. With repeats, ``status`` is
``same`` for a difference the test does not find significant.

>>> from omniprof.testing import make_result
>>> d = diff(make_result(), make_result())
>>> [t.name for t in d.tables], d.regressions
(['functions', 'op_stats'], [])

.. versionadded:: 0.1
"""

from __future__ import annotations

import bisect
import math
import re
import textwrap
from collections.abc import Sequence
from typing import Any

import attrs

from omniprof.analysis import calltree, significance
from omniprof.analysis.nesting import TORCH, nest
from omniprof.analysis.significance import permutation_p, rank_p
from omniprof.analysis.render import Column, Labeled, render_table
from omniprof.core import opstats
from omniprof.core.results import BackendResult, ProfileResult, Table
from omniprof.core.text import printable
from omniprof.core.units import format_ns
from omniprof.errors import InvalidArgumentError

__all__ = ["DiffRow", "TableDiff", "ResultDiff", "diff", "format_diff", "permutation_p", "rank_p", "TOTAL_KEY"]

TOTAL_KEY = "(total)"
_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")
#: Default cap of a call's self time, in medians of the same call over all runs (see diff()).
CLIP_CALLS = 1.1
#: Default run-to-run spread (percent) of a run's time, for one sampled run a side (see diff()).
TIME_NOISE_PCT = 25.0
_LAUNCH = ("runtime",)


@attrs.frozen
class DiffRow:
    """One entry compared.

    Attributes:
        key: the function (``name  file``), op or kernel name; ``(total)`` for the table's total.
        a_ns, b_ns: its time in A and B (self time for functions and ops; the median over runs).
        a_share_pct, b_share_pct: its share of its table's total in A and B.
        status: ``"changed"``, ``"same"``, ``"new"`` (only in B) or ``"vanished"`` (only in A).
        regressed: it grew past the threshold, significantly when tested (see the module docs).
        a_sd_ns, b_sd_ns: the run-to-run standard deviation on each side (None with one run).
        p_value: the one-sided p for a change in the observed direction: the permutation test's
            with repeated runs (None with fewer than two runs on a side, or no change); with one
            sampled run a side, the share test's (functions, corrected for the number judged) or
            the noise model's (the total); None where not tested.
        a_samples, b_samples: with one sampled run a side, the samples (as the leaf) in A and B.
    """

    key: str
    a_ns: int
    b_ns: int
    a_share_pct: float
    b_share_pct: float
    status: str
    regressed: bool = False
    a_sd_ns: float | None = None
    b_sd_ns: float | None = None
    p_value: float | None = None
    a_samples: int | None = None
    b_samples: int | None = None

    @property
    def delta_ns(self) -> int:
        return self.b_ns - self.a_ns

    @property
    def delta_pct(self) -> float | None:
        """Relative change of the time in percent (None when A's time is 0)."""
        return 100.0 * (self.b_ns - self.a_ns) / self.a_ns if self.a_ns else None

    @property
    def share_delta_pct(self) -> float:
        return self.b_share_pct - self.a_share_pct

    @property
    def confidence_pct(self) -> float | None:
        """100 * (1 - p): how sure the change is not run-to-run noise (None when not tested)."""
        return None if self.p_value is None else 100.0 * (1.0 - self.p_value)


@attrs.frozen
class TableDiff:
    """One table compared: ``name`` (``functions``, ``op_stats``, ``kernel_stats``, ...), the backend,
    the time column used, the rows (total first, then by regression and size of change), the
    number of runs (samples) on each side, and how many entries had their calls capped."""

    name: str
    backend: str
    time_column: str
    rows: tuple[DiffRow, ...]
    runs_a: int = 1
    runs_b: int = 1
    #: entries whose calls were capped at ``clip_calls`` medians (see :func:`diff`); 0: plain sums
    clipped: int = 0
    #: one sampled run a side: the pair's dispersion and the number of functions judged by share
    dispersion: float | None = None
    judged: int = 0

    @property
    def total(self) -> DiffRow:
        return self.rows[0]


@attrs.frozen
class ResultDiff:
    """Every table compared, with the thresholds used. ``skipped`` says which tables were not
    comparable; ``notes`` what limits the verdict (one run per side, alpha out of reach)."""

    tables: tuple[TableDiff, ...]
    threshold_pct: float
    min_share_pct: float
    skipped: tuple[str, ...] = ()
    alpha: float = 0.01
    repeats: str = "runs"
    notes: tuple[str, ...] = ()
    clip_calls: float | None = None
    time_noise_pct: float = 25.0

    @property
    def regressions(self) -> list[tuple[TableDiff, DiffRow]]:
        return [(t, r) for t in self.tables for r in t.rows if r.regressed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold_pct": self.threshold_pct, "min_share_pct": self.min_share_pct, "alpha": self.alpha,
            "repeats": self.repeats, "clip_calls": self.clip_calls, "time_noise_pct": self.time_noise_pct,
            "test": "repeated runs: one-sided exact permutation test on ranks (Wilcoxon-Mann-Whitney) of the runs; "
                    "one sampled run a side: functions by the odds ratio of their share of the samples "
                    "(dispersion-scaled, Bonferroni), the total against a log-normal noise of time_noise_pct",
            "skipped": list(self.skipped), "notes": list(self.notes),
            "regressions": len(self.regressions),
            "tables": [{
                "name": t.name, "backend": t.backend, "time_column": t.time_column, "runs_a": t.runs_a,
                "runs_b": t.runs_b, "clipped": t.clipped, "dispersion": t.dispersion, "judged": t.judged,
                "rows": [{**attrs.asdict(r), "delta_ns": r.delta_ns, "delta_pct": r.delta_pct,
                          "share_delta_pct": r.share_delta_pct, "confidence_pct": r.confidence_pct} for r in t.rows],
            } for t in self.tables],
        }


# -- statistics (omniprof.analysis.significance) --------------------------------------------------
_min_p = significance.min_p
def _median(xs: Sequence[int]) -> float:
    v = sorted(xs)
    n = len(v)
    return float(v[n // 2]) if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _mean(xs: Sequence[int]) -> float:
    return sum(xs) / len(xs)


def _sd(xs: Sequence[int]) -> float | None:
    if len(xs) < 2:
        return None
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# -- what is compared --------------------------------------------------------------------------------
def _function_times(part: BackendResult) -> tuple[dict[str, int], dict[str, int]]:
    """Each function's self time and its number of samples as the leaf (they add up to the samples)."""
    if not part.samples:
        return {}, {}
    rows = calltree.flat_profile(part, key=lambda f: (f.name, f.file, f.module))
    out: dict[str, int] = {}
    counts: dict[str, int] = {}
    for r in rows:
        where = _short_file(r.frame.file) or r.frame.module or ""
        label = f"{r.frame.name}  {where}" if where else r.frame.name
        out[label] = out.get(label, 0) + r.self_ns
        counts[label] = counts.get(label, 0) + r.self_count
    return out, counts


def _short_file(path: str) -> str:
    """The last two components of a source path, so runs from different checkouts or venvs match."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:])


def _columns(table: Table) -> tuple[tuple[str, ...] | None, str | None]:
    """The key columns and the time column a table is compared by, from its declared columns."""
    cols = table.columns
    if table.name == "kernel_stats":
        return (("kernel_name",), "total_ns") if {"kernel_name", "total_ns"} <= set(cols) else (None, None)
    if opstats.is_op_table(table.name, cols):
        return tuple(c for c in opstats.KEY_COLUMNS if c in cols), opstats.TIME_COLUMN
    if "name" not in cols:
        return None, None
    time_col = opstats.TIME_COLUMN if opstats.TIME_COLUMN in cols else "total_ns" if "total_ns" in cols else None
    return ("name",), time_col


def _norm_key(name: str) -> str:
    return "ProfilerStep#*" if _STEP_NAME.match(name) else name


def _table_times(table: Table, key: tuple[str, ...], time_col: str) -> dict[str, int]:
    kis, ti = [table.columns.index(k) for k in key], table.columns.index(time_col)
    out: dict[str, int] = {}
    for r in table.rows:
        t = r[ti]
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            continue
        name = "  ".join([_norm_key(str(r[kis[0]]))] + [str(r[i]) for i in kis[1:] if r[i] not in (None, "")])
        out[name] = out.get(name, 0) + int(t)
    return out


def _op_self_by_step(part: BackendResult) -> list[dict[str, int]]:
    """Self time per op/annotation name in each recorded step (``step`` spans), from the spans.

    Self time and calls are the op table's: :func:`omniprof.analysis.nesting.nest` by the torch
    rule (runtime calls are children of their op and names of their own; a same-name only child is
    folded into its parent). A span belongs to the step its start falls in. Steps in which nothing
    but the step range itself was recorded (the one a last ``step()`` opens just before ``stop()``)
    are left out.
    """
    return [{k: sum(v) for k, v in calls.items()} for calls in _op_self_calls(part, by_step=True)]


def _op_self_calls(part: BackendResult, *, by_step: bool) -> list[dict[str, list[int]]]:
    """The self time of each call per op/annotation name, calls in order of their start (ties by
    track), from the spans: one dict for the whole part, or (``by_step``) one per recorded step as
    :func:`_op_self_by_step` says."""
    steps = sorted((s for s in part.spans if s.category == "step"), key=lambda s: s.start_ns)
    if by_step and len(steps) < 2:
        return []
    starts = [s.start_ns for s in steps]
    calls: list[tuple[int, int, int, str, int]] = []  # (step, start, track order, key, self ns)
    nested = nest(part.spans, TORCH)  # the op table's nesting and self time (analysis.nesting)
    track_order: dict[str, int] = {}
    for i in nested.counted():
        span = part.spans[i]
        order = track_order.setdefault(span.track, len(track_order))
        if by_step:
            k = bisect.bisect_right(starts, span.start_ns) - 1
            if k >= 0 and span.start_ns < steps[k].end_ns:
                calls.append((k, span.start_ns, order, _norm_key(span.name), nested.self_ns(i)))
        else:
            calls.append((0, span.start_ns, order, _norm_key(span.name), nested.self_ns(i)))
    calls.sort(key=lambda c: c[:3])
    out: list[dict[str, list[int]]] = [{} for _ in (steps if by_step else [None])]
    for i, _, _, key, self_ns in calls:
        out[i].setdefault(key, []).append(self_ns)
    # A step holding nothing but itself (the one a last step() opens just before stop()) is no run.
    return [o for o in out if len(o) > 1] if by_step else out


def _kernels_by_step(part: BackendResult) -> list[dict[str, int]]:
    """Kernel time per kernel name in each recorded step; a kernel belongs to the step its launch
    (the runtime call sharing its flow id) started in, or its own start without one."""
    steps = sorted((s for s in part.spans if s.category == "step"), key=lambda s: s.start_ns)
    if len(steps) < 2:
        return []
    starts = [s.start_ns for s in steps]
    launch_at = {f: s.start_ns for s in part.spans if s.category in _LAUNCH for f in s.flow_ids}
    out: list[dict[str, int]] = [{} for _ in steps]
    for s in part.spans:
        if s.category != "kernel":
            continue
        t = next((launch_at[f] for f in s.flow_ids if f in launch_at), s.start_ns)
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t < steps[i].end_ns:
            out[i][s.name] = out[i].get(s.name, 0) + s.dur_ns
    return out


class _Side:
    """One side's samples: per (backend, table) the time column and one {key: ns} per run."""

    def __init__(self) -> None:
        self.tables: dict[tuple[str, str], tuple[tuple[str, ...], str, list[dict[str, int]]]] = {}
        #: per table, each run's self time of every call per key (None for a run without them)
        self.calls: dict[tuple[str, str], list[dict[str, list[int]] | None]] = {}
        #: per table, each run's number of samples per key (sampled tables; None for others)
        self.counts: dict[tuple[str, str], list[dict[str, int] | None]] = {}
        self.backends: set[str] = set()
        self.incomparable: set[tuple[str, str]] = set()

    def add(self, backend: str, name: str, key: tuple[str, ...], time_col: str, samples: list[dict[str, int]],
            calls: list[dict[str, list[int]]] | None = None, counts: list[dict[str, int]] | None = None) -> None:
        have = self.tables.get((backend, name))
        per_call = list(calls) if calls is not None and len(calls) == len(samples) else [None] * len(samples)
        per_count = list(counts) if counts is not None and len(counts) == len(samples) else [None] * len(samples)
        if have is None:
            self.tables[(backend, name)] = (key, time_col, list(samples))
            self.calls[(backend, name)] = per_call
            self.counts[(backend, name)] = per_count
        elif (have[0], have[1]) == (key, time_col):
            have[2].extend(samples)
            self.calls[(backend, name)].extend(per_call)
            self.counts[(backend, name)].extend(per_count)
        else:
            self.incomparable.add((backend, name))


def _collect(results: Sequence[ProfileResult], repeats: str, want_calls: bool = True) -> _Side:
    side = _Side()
    for result in results:
        for part in result.parts:
            side.backends.add(part.backend)
            f, counts = _function_times(part)
            if f:
                side.add(part.backend, "functions", ("function",), "self_ns", [f], counts=[counts])
            for table in part.tables:
                key, time_col = _columns(table)
                if key is None or time_col is None:
                    side.incomparable.add((part.backend, table.name))
                    continue
                samples: list[dict[str, int]] = []
                calls: list[dict[str, list[int]]] | None = None
                ops = table.name == "op_stats" and any(s.category == "cpu_op" for s in part.spans)
                if repeats == "steps":
                    if ops:
                        calls = _op_self_calls(part, by_step=True)
                        samples = [{k: sum(v) for k, v in c.items()} for c in calls]
                    elif table.name == "kernel_stats":
                        samples = _kernels_by_step(part)
                if not samples:
                    samples = [_table_times(table, key, time_col)]
                    if ops and want_calls and len(results) >= 2:  # one run a side: nothing to cap
                        calls = _op_self_calls(part, by_step=False)
                        # the calls stand for the table only where they add up to its rows
                        if {k: sum(v) for k, v in calls[0].items()} != samples[0]:
                            calls = None
                side.add(part.backend, table.name, key, time_col, samples, calls)
    return side


def _compare(a: list[dict[str, int]], b: list[dict[str, int]], threshold_pct: float, min_share_pct: float,
             alpha: float, judged: tuple[list[dict[str, int]], list[dict[str, int]]] | None = None
             ) -> tuple[DiffRow, ...]:
    """The rows: times, spreads and shares from the runs ``a`` and ``b``; whether a row changed and
    regressed from ``judged`` (the same runs with capped calls, see :func:`_clip_calls`) when given."""
    ja, jb = judged if judged is not None else (a, b)
    grow = 1.0 + threshold_pct / 100.0
    na, nb = len(a), len(b)
    tested = na >= 2 and nb >= 2
    keys = sorted(set().union(*a, *b))
    ta_runs = [sum(s.values()) for s in a]
    tb_runs = [sum(s.values()) for s in b]
    ta, tb = _mean(ta_runs), _mean(tb_runs)
    in_a = set().union(*a)
    in_b = set().union(*b)

    def judge(xa: list[int], xb: list[int], share: float, status: str) -> DiffRow | tuple[bool, str, float | None]:
        ma, mb = _median(xa), _median(xb)
        p = None
        if tested and xa != xb:
            p = rank_p(xa, xb) if mb > ma or (mb == ma and _mean(xb) >= _mean(xa)) else rank_p(xb, xa)
        if status == "vanished":
            return False, status, p
        grew = mb > ma * grow
        regressed = grew and share >= min_share_pct and mb > 0
        if tested:
            regressed = regressed and p is not None and mb > ma and p <= alpha
            if status == "changed" and (p is None or p > alpha):
                status = "same"
        elif status == "changed" and ma == mb:
            status = "same"
        return regressed, status, p

    rows = []
    for key in keys:
        xa = [s.get(key, 0) for s in a]
        xb = [s.get(key, 0) for s in b]
        sa = 100.0 * _mean(xa) / ta if ta else 0.0
        sb = 100.0 * _mean(xb) / tb if tb else 0.0
        ma, mb = _median(xa), _median(xb)
        status = "vanished" if key not in in_b else "new" if key not in in_a else "changed"
        share = sb if status == "new" else max(sa, sb)
        regressed, status, p = judge([s.get(key, 0) for s in ja], [s.get(key, 0) for s in jb],  # type: ignore[misc]
                                     share, status)
        rows.append(DiffRow(key, round(ma), round(mb), sa, sb, status, regressed, _sd(xa), _sd(xb), p))
    rows.sort(key=lambda r: (not r.regressed, -abs(r.delta_ns), r.key))
    regressed, status, p = judge([sum(s.values()) for s in ja], [sum(s.values()) for s in jb],  # type: ignore[misc]
                                 100.0, "changed")
    total = DiffRow(TOTAL_KEY, round(_median(ta_runs)), round(_median(tb_runs)), 100.0 if ta else 0.0,
                    100.0 if tb else 0.0, status,
                    regressed and ta > 0, _sd(ta_runs), _sd(tb_runs), p)
    return (total, *rows)


def _compare_sampled(a: dict[str, int], b: dict[str, int], ca: dict[str, int], cb: dict[str, int],
                     threshold_pct: float, min_share_pct: float, alpha: float, noise_pct: float
                     ) -> tuple[tuple[DiffRow, ...], float, int]:
    """One sampled run a side (see :mod:`omniprof.analysis.significance`): each function judged by
    its share of the samples (:func:`~omniprof.analysis.significance.share_tests`: a change past
    ``1 + threshold_pct / 100`` against the typical function, one-sided, the pair's dispersion,
    Bonferroni over the functions judged); the total time against the noise model, widened by the
    square root of the dispersion (a pair whose samples show a loaded machine has stretched times
    too). Returns the rows, the dispersion and the number of functions judged."""
    na, nb = sum(ca.values()), sum(cb.values())
    ta, tb = sum(a.values()), sum(b.values())
    ratio = 1.0 + threshold_pct / 100.0
    rows, judged = [], {}
    for key in sorted(a.keys() | b.keys()):
        sa = 100.0 * a.get(key, 0) / ta if ta else 0.0
        sb = 100.0 * b.get(key, 0) / tb if tb else 0.0
        status = "vanished" if key not in b else "new" if key not in a else "changed"
        rows.append((key, sa, sb, status))
        if na and nb and (sb if status == "new" else max(sa, sb)) >= min_share_pct:
            judged[key] = (ca.get(key, 0), cb.get(key, 0))
    m = len(judged)
    tests, phi = significance.share_tests(judged, na, nb, min_ratio=ratio) if m else ({}, 1.0)
    out = []
    for key, sa, sb, status in rows:
        p, regressed = None, False
        if key in tests:
            change, up, down = tests[key]
            up, down = significance.bonferroni(up, m), significance.bonferroni(down, m)
            p = up if change >= 1 else down
            regressed = status != "vanished" and up <= alpha
            if status == "changed" and min(up, down) > alpha:
                status = "same"
        elif status == "changed" and a.get(key) == b.get(key):
            status = "same"
        out.append(DiffRow(key, a.get(key, 0), b.get(key, 0), sa, sb, status, regressed, None, None, p,
                           ca.get(key, 0), cb.get(key, 0)))
    out.sort(key=lambda r: (not r.regressed, -abs(r.delta_ns), r.key))
    noise = 100.0 * math.expm1(math.log1p(noise_pct / 100.0) * math.sqrt(phi))
    up, down = significance.time_p(ta, tb, noise_pct=noise), significance.time_p(tb, ta, noise_pct=noise)
    total = DiffRow(TOTAL_KEY, ta, tb, 100.0 if ta else 0.0, 100.0 if tb else 0.0,
                    "changed" if min(up, down) <= alpha else "same", tb > ta * ratio and up <= alpha, None, None,
                    up if tb >= ta else down, na, nb)
    return (total, *out), phi, m


def _clip_calls(sa: list[dict[str, int]], sb: list[dict[str, int]], ca: list[dict[str, list[int]] | None],
                cb: list[dict[str, list[int]] | None], factor: float) -> tuple[list[dict[str, int]],
                                                                          list[dict[str, int]], int]:
    """Each run's time per key with every call's self time capped at ``factor`` times the median of
    the same call (same key, same place among its calls) over the runs of both sides; keys whose
    runs do not all make the same number of calls keep their plain sums. The caps depend on the
    pooled runs only, not on which side a run is on, so the rank test stays exact. Returns the
    two sides and the number of keys capped."""
    runs = [c for c in (*ca, *cb) if c is not None]
    if len(runs) < len(ca) + len(cb):
        return sa, sb, 0
    out = [dict(x) for x in (*sa, *sb)]
    capped = 0
    for key in set().union(*runs):
        lists = [c.get(key) for c in runs]
        n = len(lists[0]) if lists[0] is not None else -1
        if n < 1 or any(v is None or len(v) != n for v in lists):
            continue
        capped += 1
        caps = [factor * _median([v[k] for v in lists]) for k in range(n)]  # type: ignore[index]
        for o, v in zip(out, lists):
            o[key] = round(sum(min(x, cap) for x, cap in zip(v, caps)))  # type: ignore[arg-type]
    return out[: len(sa)], out[len(sa):], capped


def _as_list(x: ProfileResult | Sequence[ProfileResult], side: str) -> list[ProfileResult]:
    if isinstance(x, ProfileResult):
        return [x]
    items = list(x)
    if not items or not all(isinstance(r, ProfileResult) for r in items):
        raise InvalidArgumentError(f"{side!r} must be a ProfileResult or a non-empty sequence of them "
                                   f"(the runs of one setup)")
    return items


def diff(a: ProfileResult | Sequence[ProfileResult], b: ProfileResult | Sequence[ProfileResult], *,
         threshold_pct: float = 10.0, min_share_pct: float = 1.0, alpha: float = 0.01,
         repeats: str = "runs", clip_calls: float | None = CLIP_CALLS,
         time_noise_pct: float = TIME_NOISE_PCT) -> ResultDiff:
    """Compare ``b`` against the baseline ``a`` (see the module docs for what regressed means).

    Args:
        a, b: a result, or several results of repeated runs of one setup.
        threshold_pct: growth (percent) below which nothing regresses.
        min_share_pct: entries holding less of their table in A and B never regress.
        alpha: with two or more runs per side, a change counts only when the permutation test gives
            ``p <= alpha`` (confidence ``>= 1 - alpha``).
        repeats: ``"runs"``: each result is one run; ``"steps"``: each recorded step of each result is
            one run for the op and kernel tables (a profile of N steps gives N runs).
        clip_calls: with repeated runs and the op spans at hand (torch), each call's self time counts
            at most this many times the median of the same call over the runs of both sides (time
            a call lost to another process on its CPU does not move its run); None: plain sums.
        time_noise_pct: with one sampled run a side, the run-to-run spread (percent, log-normal)
            a table's total time is judged against.

    Parts are matched by backend name; within them, the sampled functions (flat profile by self
    time) and every derived table present in both with a name column and a time column.
    """
    for name, val in (("threshold_pct", threshold_pct), ("min_share_pct", min_share_pct),
                      ("time_noise_pct", time_noise_pct)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0 or val != val:
            raise InvalidArgumentError(f"{name!r} must be a number >= 0 (got {val!r})")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise InvalidArgumentError(f"'alpha' must be a number between 0 and 1, e.g. 0.01 (got {alpha!r})")
    if repeats not in ("runs", "steps"):
        raise InvalidArgumentError(f"'repeats' must be 'runs' or 'steps' (got {repeats!r})")
    if clip_calls is not None and (isinstance(clip_calls, bool) or not isinstance(clip_calls, (int, float))
                                   or not clip_calls >= 1 or clip_calls == math.inf):
        raise InvalidArgumentError(f"'clip_calls' must be a number >= 1, e.g. 1.1, or None for plain sums "
                                   f"(got {clip_calls!r})")
    want = clip_calls is not None
    side_a, side_b = _collect(_as_list(a, "a"), repeats, want), _collect(_as_list(b, "b"), repeats, want)
    tables: list[TableDiff] = []
    skipped: list[str] = []
    notes: list[str] = []
    for (backend, name), (key, time_col, sa) in side_a.tables.items():
        if backend not in side_b.backends:
            continue
        got = side_b.tables.get((backend, name))
        if got is None and (backend, name) in side_b.incomparable:
            skipped.append(f"{backend}/{name}: no common key and time columns (name, self_ns / total_ns)")
            continue
        if got is None:
            skipped.append(f"{backend}/{name}: only in A")
            continue
        if (key, time_col) != got[:2] or (backend, name) in side_a.incomparable | side_b.incomparable:
            skipped.append(f"{backend}/{name}: no common key and time columns (name, self_ns / total_ns)")
            continue
        sb = got[2]
        capped, judged = 0, None
        if clip_calls is not None and len(sa) >= 2 and len(sb) >= 2:
            ja, jb, capped = _clip_calls(sa, sb, side_a.calls[(backend, name)], side_b.calls[(backend, name)],
                                         float(clip_calls))
            judged = (ja, jb) if capped else None
        ca, cb = side_a.counts[(backend, name)], side_b.counts[(backend, name)]
        if len(sa) == 1 and len(sb) == 1 and ca[0] is not None and cb[0] is not None:
            rows, phi, m = _compare_sampled(sa[0], sb[0], ca[0], cb[0], threshold_pct, min_share_pct, alpha,
                                            time_noise_pct)
            tables.append(TableDiff(name, backend, time_col, rows, 1, 1, 0, phi, m))
            notes.append(f"{backend}/{name}: one sampled run a side: each function judged by its share of the "
                         f"samples against the rest of the run ({m} judged, p corrected for their number, "
                         f"dispersion {phi:.2g}), the total time against a run-to-run noise of {time_noise_pct:g}%")
            continue
        tables.append(TableDiff(name, backend, time_col,
                                _compare(sa, sb, threshold_pct, min_share_pct, alpha, judged), len(sa), len(sb),
                                capped))
        if len(sa) < 2 or len(sb) < 2:
            notes.append(f"{backend}/{name}: {len(sa)} vs {len(sb)} run(s): no run-to-run spread to test against, "
                         f"the threshold alone decides; give each side repeated runs (several results, or "
                         f"repeats='steps' / --repeats steps) to separate signal from noise")
        elif _min_p(len(sa), len(sb)) > alpha:
            notes.append(f"{backend}/{name}: with {len(sa)} vs {len(sb)} runs the smallest possible p is "
                         f"{_min_p(len(sa), len(sb)):.3g} > alpha {alpha:g}: no change can be shown; record "
                         f"more runs (5 vs 5 reach p = 0.004)")
    for (backend, name) in side_a.incomparable - set(side_a.tables):
        if backend in side_b.backends:
            skipped.append(f"{backend}/{name}: no common key and time columns (name, self_ns / total_ns)")
    for (backend, name) in side_b.tables.keys() | side_b.incomparable:
        if backend in side_a.backends and (backend, name) not in side_a.tables and \
                (backend, name) not in side_a.incomparable:
            skipped.append(f"{backend}/{name}: only in B")
    skipped += [f"backend {n}: only in A" for n in sorted(side_a.backends - side_b.backends)]
    skipped += [f"backend {n}: only in B" for n in sorted(side_b.backends - side_a.backends)]
    return ResultDiff(tuple(tables), float(threshold_pct), float(min_share_pct), tuple(skipped), float(alpha),
                      repeats, tuple(notes), None if clip_calls is None else float(clip_calls),
                      float(time_noise_pct))


_ns = format_ns  # deltas keep their sign


def format_diff(d: ResultDiff, *, max_rows: int = 20, width: int | None = None) -> str:
    """Plain text: per table, the total then the largest changes, regressions marked ``!``; tables
    drawn by the one renderer and lines wrapped at words within ``width`` (None: never cut)."""
    tested = any((t.runs_a >= 2 and t.runs_b >= 2) or t.dispersion is not None for t in d.tables)
    rule = (f"; a change counts when its one-sided test gives p <= {d.alpha:g} "
            f"(confidence >= {100 * (1 - d.alpha):g}%)" if tested else "")
    out: list[str] = _wrap(f"== omniprof diff: {len(d.regressions)} regression(s) "
                           f"(threshold {d.threshold_pct:g}%, entries >= {d.min_share_pct:g}% share{rule})", width)
    for t in d.tables:
        out.append("")
        shown = t.rows[: max_rows + 1]
        more = len(t.rows) - len(shown)
        runs = f", {t.runs_a} vs {t.runs_b} {'steps' if d.repeats == 'steps' else 'runs'}" if \
            t.runs_a > 1 or t.runs_b > 1 else ""
        if t.clipped:
            runs += f"; judged with each call at most {d.clip_calls:g}x its median over all runs"
        out += _wrap(printable(f"{t.name} ({t.backend}, by {t.time_column}{runs})")
                     + (f": {more} more rows not shown" if more else ""), width)
        columns, cells = _diff_cells(t, shown)
        out.append(render_table(columns, cells, width=width))
    for n in d.notes:
        out += _wrap(f"note: {n}", width)
    for s in d.skipped:
        out += _wrap(f"note: not compared: {printable(s)}", width)
    return "\n".join(out) + "\n"


def _diff_cells(t: TableDiff, shown: Sequence[DiffRow]) -> tuple[list[Column], list[list[Any]]]:
    """One table's rows as the renderer's columns and cells (names escaped: they come from the files)."""
    with_sd = t.runs_a > 1 or t.runs_b > 1
    columns = [Column("", kind="label"), Column("A", kind="num"), Column("B", kind="num"),
               Column("delta", kind="num"), Column("delta%", kind="num")]
    sampled = t.dispersion is not None
    if with_sd:
        columns += [Column("sd A", kind="num", drop=2), Column("sd B", kind="num", drop=2),
                    Column("conf%", kind="num")]
    if sampled:
        columns += [Column("samples A", kind="num", drop=2), Column("samples B", kind="num", drop=2),
                    Column("conf%", kind="num")]
    columns += [Column("share A%", kind="num", drop=1), Column("share B%", kind="num", drop=1),
                Column("status", kind="label"), Column("name", min_width=18)]
    cells = []
    for r in shown:
        pct = "-" if r.delta_pct is None else f"{r.delta_pct:+.1f}"
        row = ["!" if r.regressed else "", _ns(r.a_ns), _ns(r.b_ns), ("+" if r.delta_ns > 0 else "")
               + _ns(r.delta_ns), pct]
        if with_sd:
            row += ["-" if r.a_sd_ns is None else _ns(r.a_sd_ns), "-" if r.b_sd_ns is None else _ns(r.b_sd_ns),
                    "-" if r.confidence_pct is None else f"{r.confidence_pct:.1f}"]
        if sampled:
            row += [str(r.a_samples), str(r.b_samples),
                    "-" if r.confidence_pct is None else f"{r.confidence_pct:.1f}"]
        name, _, where = printable(r.key).partition("  ")  # a function's key is ``name  file``
        row += [f"{r.a_share_pct:.1f}", f"{r.b_share_pct:.1f}", r.status, Labeled(name, where.strip())]
        cells.append(row)
    return columns, cells


def _wrap(line: str, width: int | None) -> list[str]:
    """``line`` wrapped at words within ``width`` (continuations indented), never inside a word."""
    if width is None or len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
