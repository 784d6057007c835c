"""Compare two results: sampled functions, op statistics and kernel statistics.

:func:`diff` builds plain rows (one per function / op / kernel, plus each table's total), each with
its time in A and B, the time and share deltas, a status (``changed``, ``same``, ``new``,
``vanished``) and whether it *regressed*; :func:`format_diff` formats them. ``omniprof diff A B
--fail-on-regression`` exits 1 when anything regressed, for CI.

Functions are matched by name and the last two components of their file's path (``pkg/mod.py``),
so results taken in different checkouts or virtual environments compare.

A row regressed when its time grew by more than ``threshold_pct`` percent and it holds at least
``min_share_pct`` of its table in A or B (tiny entries are noise); a new entry regressed when it
holds at least ``min_share_pct`` of B's table. A table's total regressed when it grew by more than
``threshold_pct``. Vanished entries never regress.

>>> from omniprof.testing import make_result
>>> d = diff(make_result(), make_result())
>>> [t.name for t in d.tables], d.regressions
(['functions', 'op_stats'], [])

.. versionadded:: 0.1
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from omniprof.analysis import stacktree
from omniprof.core.results import BackendResult, ProfileResult, Table
from omniprof.core.text import printable
from omniprof.errors import InvalidArgumentError

__all__ = ["DiffRow", "TableDiff", "ResultDiff", "diff", "format_diff", "TOTAL_KEY"]

TOTAL_KEY = "(total)"
_KEY_COLUMNS = ("name", "kernel_name", "op_name", "operation", "hlo_op", "op", "function")
_TIME_COLUMNS = ("total_ns", "total_time_ns", "self_ns", "total_self_ns", "device_total_ns", "time_ns")


@attrs.frozen
class DiffRow:
    """One entry compared.

    Attributes:
        key: the function (``name  file``), op or kernel name; ``(total)`` for the table's total.
        a_ns, b_ns: its time in A and B (self time for sampled functions).
        a_share_pct, b_share_pct: its share of its table's total in A and B.
        status: ``"changed"``, ``"same"``, ``"new"`` (only in B) or ``"vanished"`` (only in A).
        regressed: it grew past the threshold (see the module docs).
    """

    key: str
    a_ns: int
    b_ns: int
    a_share_pct: float
    b_share_pct: float
    status: str
    regressed: bool = False

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


@attrs.frozen
class TableDiff:
    """One table compared: ``name`` (``functions``, ``op_stats``, ``kernel_stats``, ...), the backend,
    the time column used, and the rows (total first, then by regression and size of change)."""

    name: str
    backend: str
    time_column: str
    rows: tuple[DiffRow, ...]

    @property
    def total(self) -> DiffRow:
        return self.rows[0]


@attrs.frozen
class ResultDiff:
    """Every table compared, with the thresholds used. ``skipped`` says which tables were not comparable."""

    tables: tuple[TableDiff, ...]
    threshold_pct: float
    min_share_pct: float
    skipped: tuple[str, ...] = ()

    @property
    def regressions(self) -> list[tuple[TableDiff, DiffRow]]:
        return [(t, r) for t in self.tables for r in t.rows if r.regressed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold_pct": self.threshold_pct, "min_share_pct": self.min_share_pct,
            "skipped": list(self.skipped),
            "regressions": len(self.regressions),
            "tables": [{
                "name": t.name, "backend": t.backend, "time_column": t.time_column,
                "rows": [{**attrs.asdict(r), "delta_ns": r.delta_ns, "delta_pct": r.delta_pct,
                          "share_delta_pct": r.share_delta_pct} for r in t.rows],
            } for t in self.tables],
        }


def _function_times(part: BackendResult) -> dict[str, int]:
    if not part.samples:
        return {}
    rows = stacktree.flat_rows(part, key=lambda f: (f.name, f.file, f.module))
    out: dict[str, int] = {}
    for r in rows:
        where = _short_file(r.frame.file) or r.frame.module or ""
        label = f"{r.frame.name}  {where}" if where else r.frame.name
        out[label] = out.get(label, 0) + r.self_ns
    return out


def _short_file(path: str) -> str:
    """The last two components of a source path, so runs from different checkouts or venvs match."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:])


def _columns(table: Table) -> tuple[str | None, str | None]:
    cols = list(table.columns)
    key = next((c for c in _KEY_COLUMNS if c in cols), None)
    if key is None:
        for i, c in enumerate(cols):
            if table.rows and all(isinstance(r[i], str) for r in table.rows):
                key = c
                break
    time_col = next((c for c in _TIME_COLUMNS if c in cols), None)
    if time_col is None:
        time_col = next((c for c in cols if c.endswith("_ns")), None)
    return key, time_col


def _table_times(table: Table, key: str, time_col: str) -> dict[str, int]:
    ki, ti = table.columns.index(key), table.columns.index(time_col)
    out: dict[str, int] = {}
    for r in table.rows:
        t = r[ti]
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            continue
        name = str(r[ki])
        out[name] = out.get(name, 0) + int(t)
    return out


def _compare(a: dict[str, int], b: dict[str, int], threshold_pct: float, min_share_pct: float) -> tuple[DiffRow, ...]:
    ta, tb = sum(a.values()), sum(b.values())
    grow = 1.0 + threshold_pct / 100.0
    rows = []
    for key in sorted(set(a) | set(b)):
        an, bn = a.get(key, 0), b.get(key, 0)
        sa = 100.0 * an / ta if ta else 0.0
        sb = 100.0 * bn / tb if tb else 0.0
        if key not in b:
            status, regressed = "vanished", False
        elif key not in a:
            status, regressed = "new", sb >= min_share_pct and bn > 0
        else:
            status = "same" if an == bn else "changed"
            regressed = bn > an * grow and max(sa, sb) >= min_share_pct
        rows.append(DiffRow(key, an, bn, sa, sb, status, regressed))
    rows.sort(key=lambda r: (not r.regressed, -abs(r.delta_ns), r.key))
    total = DiffRow(TOTAL_KEY, ta, tb, 100.0 if ta else 0.0, 100.0 if tb else 0.0,
                    "same" if ta == tb else "changed", tb > ta * grow and ta > 0)
    return (total, *rows)


def _pairs(a: ProfileResult, b: ProfileResult) -> Iterable[tuple[str, BackendResult, BackendResult]]:
    b_parts = {p.backend: p for p in b.parts}
    for pa in a.parts:
        pb = b_parts.get(pa.backend)
        if pb is not None:
            yield pa.backend, pa, pb


def diff(a: ProfileResult, b: ProfileResult, *, threshold_pct: float = 10.0, min_share_pct: float = 1.0) -> ResultDiff:
    """Compare result ``b`` against baseline ``a`` (see the module docs for what regressed means).

    Parts are matched by backend name; within them, the sampled functions (flat profile by self
    time) and every derived table present in both with a name column and a time column.
    """
    for name, val in (("threshold_pct", threshold_pct), ("min_share_pct", min_share_pct)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0 or val != val:
            raise InvalidArgumentError(f"{name!r} must be a number >= 0 (got {val!r})")
    tables: list[TableDiff] = []
    skipped: list[str] = []
    for backend, pa, pb in _pairs(a, b):
        fa, fb = _function_times(pa), _function_times(pb)
        if fa or fb:
            tables.append(TableDiff("functions", backend, "self_ns", _compare(fa, fb, threshold_pct, min_share_pct)))
        b_tables = {t.name: t for t in pb.tables}
        for ta in pa.tables:
            tb = b_tables.get(ta.name)
            if tb is None:
                skipped.append(f"{backend}/{ta.name}: only in A")
                continue
            key, time_col = _columns(ta)
            key_b, time_b = _columns(tb)
            if key is None or time_col is None or (key, time_col) != (key_b, time_b):
                skipped.append(f"{backend}/{ta.name}: no common name and time columns")
                continue
            tables.append(TableDiff(ta.name, backend, time_col,
                                    _compare(_table_times(ta, key, time_col), _table_times(tb, key, time_col),
                                             threshold_pct, min_share_pct)))
        for tb in pb.tables:
            if pa.table(tb.name) is None:
                skipped.append(f"{backend}/{tb.name}: only in B")
    a_names = {p.backend for p in a.parts}
    b_names = {p.backend for p in b.parts}
    skipped += [f"backend {n}: only in A" for n in sorted(a_names - b_names)]
    skipped += [f"backend {n}: only in B" for n in sorted(b_names - a_names)]
    return ResultDiff(tuple(tables), float(threshold_pct), float(min_share_pct), tuple(skipped))


def _ns(ns: float) -> str:
    a = abs(ns)
    sign = "-" if ns < 0 else ""
    if a >= 1e9:
        return f"{sign}{a / 1e9:.3f} s"
    if a >= 1e6:
        return f"{sign}{a / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{sign}{a / 1e3:.2f} us"
    return f"{sign}{a:.0f} ns"


def format_diff(d: ResultDiff, *, max_rows: int = 20) -> str:
    """Plain text: per table, the total then the largest changes, regressions marked ``!``."""
    out: list[str] = [f"== omniprof diff: {len(d.regressions)} regression(s) "
                      f"(threshold {d.threshold_pct:g}%, entries >= {d.min_share_pct:g}% share)"]
    for t in d.tables:
        out.append("")
        shown = t.rows[: max_rows + 1]
        more = len(t.rows) - len(shown)
        out.append(printable(f"{t.name} ({t.backend}, by {t.time_column})")
                   + (f": {more} more rows not shown" if more else ""))
        header = ["", "A", "B", "delta", "delta%", "share A%", "share B%", "status", "name"]
        cells = []
        for r in shown:
            pct = "-" if r.delta_pct is None else f"{r.delta_pct:+.1f}"
            cells.append(["!" if r.regressed else "", _ns(r.a_ns), _ns(r.b_ns), ("+" if r.delta_ns > 0 else "")
                          + _ns(r.delta_ns), pct, f"{r.a_share_pct:.1f}", f"{r.b_share_pct:.1f}", r.status,
                          printable(r.key)])  # names come from the files: never raw escape sequences
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
        for row in [header, *cells]:
            out.append("  ".join(c.ljust(w) if i in (0, 7, 8) else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    for s in d.skipped:
        out.append(f"note: not compared: {printable(s)}")
    return "\n".join(out) + "\n"
