"""The one table renderer: every table omniprof prints goes through :func:`render_table` (rich).

Layout rules, in this order, so a table reads right at any width:

1. Columns whose every cell is empty (``None``, ``""``, ``"-"``) are dropped first.
2. Number columns (``Column(kind="num")``) and short label columns (``kind="label"``) are never
   cut: they take their widest cell.
3. Text columns (``kind="text"``: names, paths) get the remaining room. Only when they truly
   cannot fit are they shortened, the widest first, by eliding the middle (``aten::res…conj``),
   and never below ``min_width`` characters.
4. If even that does not fit, optional columns (``drop > 0``, highest first) are left out and
   named under the table; if it still does not fit, the line is allowed to be longer than the
   width (the terminal wraps it) rather than cut a number.
5. With ``width=None`` (piped output) nothing is ever cut.

Column widths depend only on the cells, so the same data always gives the same layout.

>>> cols = [Column("time", kind="num"), Column("function")]
>>> print(render_table(cols, [["1.50 ms", "hot  app.py:3"], ["0 ns", None]]))
   time  function
──────────────────────
1.50 ms  hot  app.py:3
   0 ns  -
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import IO, Any

import attrs

from omniprof.core.text import UNICODE_RULES, can_encode

__all__ = ["Column", "Layout", "layout", "render_table", "print_table", "elide_middle", "Indented", "GAP"]

GAP = 2          # spaces between columns
ELLIPSIS = "…"
ASCII_ELLIPSIS = "~"  # one character, like ELLIPSIS, so a column keeps its width
EMPTY = ("", "-", None)


@attrs.frozen
class Column:
    """One column: ``header``; ``kind`` ``"text"`` (may be elided), ``"num"`` (right-aligned, never
    cut) or ``"label"`` (left-aligned, never cut); ``min_width``: a text column is never elided
    below this; ``drop``: 0 never left out, otherwise left out (highest first) when even elided
    text does not fit."""

    header: str
    kind: str = attrs.field(default="text", validator=attrs.validators.in_(("text", "num", "label")))
    min_width: int = 24
    drop: int = 0


@attrs.frozen
class Indented:
    """A text cell whose ``prefix`` (a tree's indentation) is never elided, only its ``text``."""

    prefix: str
    text: str

    def __str__(self) -> str:
        return self.prefix + self.text

    def __len__(self) -> int:
        return len(self.prefix) + len(self.text)


@attrs.frozen
class Layout:
    """Which columns are shown (indices), their widths, and the columns left out."""

    keep: tuple[int, ...]
    widths: tuple[int, ...]
    dropped: tuple[str, ...]
    empty: tuple[str, ...]


def elide_middle(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """``text`` within ``width`` characters, its middle replaced by ``…`` when too long
    (the start keeps a bit more than the end).

    >>> elide_middle("aten::resolve_conj", 12)
    'aten::r…conj'
    """
    if len(text) <= width:
        return text
    mark = len(ellipsis)
    if width <= mark:
        return text[:width]
    head = (width - mark + 1) // 2 + (1 if width > 8 else 0)
    head = min(head, width - mark)
    tail = width - mark - head
    return text[:head] + ellipsis + (text[len(text) - tail:] if tail else "")


def _cell(value: Any) -> Any:
    if value is None:
        return "-"
    return value if isinstance(value, Indented) else str(value)


def layout(columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int | None) -> Layout:
    """The column widths for ``rows`` in ``width`` characters (None: unbounded)."""
    n = len(columns)
    empty = tuple(i for i in range(n) if rows and all(r[i] in EMPTY or str(r[i]) == "" for r in rows))
    keep = [i for i in range(n) if i not in empty]
    natural = {i: max([len(columns[i].header)] + [len(_cell(r[i])) for r in rows]) for i in range(n)}
    dropped: list[int] = []
    while True:
        widths = _fit(columns, natural, keep, width)
        total = sum(widths.values()) + GAP * (len(keep) - 1)
        if width is None or total <= width:
            break
        optional = [i for i in keep if columns[i].drop > 0]
        if not optional:
            break
        i = max(optional, key=lambda k: (columns[k].drop, k))
        keep.remove(i)
        dropped.append(i)
    return Layout(tuple(keep), tuple(widths[i] for i in keep), tuple(columns[i].header for i in dropped),
                  tuple(columns[i].header for i in empty))


def _fit(columns: Sequence[Column], natural: dict[int, int], keep: list[int], width: int | None) -> dict[int, int]:
    widths = {i: natural[i] for i in keep}
    if width is None:
        return widths
    text = [i for i in keep if columns[i].kind == "text"]
    fixed = sum(widths[i] for i in keep if i not in text) + GAP * (len(keep) - 1)
    room = width - fixed
    if sum(widths[i] for i in text) <= room:
        return widths
    floors = {i: min(natural[i], max(columns[i].min_width, len(columns[i].header))) for i in text}
    # Water-filling: the widest text columns give way first, none below its floor.
    lo, hi = 0, max((natural[i] for i in text), default=0)
    while lo < hi:
        cap = (lo + hi + 1) // 2
        if sum(min(natural[i], max(cap, floors[i])) for i in text) <= room:
            lo = cap
        else:
            hi = cap - 1
    for i in text:
        widths[i] = min(natural[i], max(lo, floors[i]))
    return widths


def _fit_cell(value: Any, width: int, ellipsis: str = ELLIPSIS) -> str:
    if isinstance(value, Indented):
        if len(value) <= width:
            return str(value)
        return value.prefix + elide_middle(value.text, max(width - len(value.prefix), 1), ellipsis)
    return elide_middle(value, width, ellipsis)


def _spelled(value: Any, encoding: str) -> Any:
    """A cell with the characters ``encoding`` cannot hold spelled out (``\\xe9``) before the
    layout, so the columns line up as written."""
    def spell(text: str) -> str:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    return Indented(spell(value.prefix), spell(value.text)) if isinstance(value, Indented) else spell(value)


def _ascii_rules() -> Any:
    """rich's ``SIMPLE_HEAD`` box (one rule under the header) drawn with ``-``."""
    from rich.box import Box

    return Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], *, width: int | None = None,
                 color: bool = False, title: str | None = None) -> str:
    """The table as text (``color``: with rich's styles, for a terminal)."""
    buf = io.StringIO()
    print_table(buf, columns, rows, width=width, color=color, title=title)
    return buf.getvalue().rstrip("\n")


def print_table(dest: IO[str], columns: Sequence[Column], rows: Sequence[Sequence[Any]], *, width: int | None = None,
                color: bool = False, title: str | None = None, style: dict[int, str] | None = None) -> Layout:
    """Write the table to ``dest``; returns its :class:`Layout`. ``style``: rich styles per row index."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    rows = [[_cell(c) for c in r] for r in rows]
    plain = not can_encode(dest, UNICODE_RULES)  # PYTHONIOENCODING=ascii, LC_ALL=C: ASCII rules
    ellipsis = ASCII_ELLIPSIS if plain else ELLIPSIS
    if plain:
        encoding = dest.encoding
        rows = [[_spelled(c, encoding) for c in r] for r in rows]
        columns = [attrs.evolve(c, header=_spelled(c.header, encoding)) for c in columns]
    lay = layout(columns, rows, width)
    t = RichTable(box=_ascii_rules() if plain else box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  header_style="bold" if color else "", show_header=True, title=None)
    for i, w in zip(lay.keep, lay.widths):
        c = columns[i]
        t.add_column(c.header, justify="right" if c.kind == "num" else "left", width=w, no_wrap=True)
    for ri, r in enumerate(rows):
        t.add_row(*(Text(_fit_cell(r[i], w, ellipsis)) for i, w in zip(lay.keep, lay.widths)),
                  style=(style or {}).get(ri))
    total = sum(lay.widths) + GAP * (len(lay.widths) - 1)
    out = io.StringIO() if not color else dest
    console = Console(file=out, width=max(total, 1), color_system="auto" if color else None,
                      force_terminal=color or None, highlight=False, emoji=False, markup=False,
                      legacy_windows=False, no_color=not color, force_jupyter=False)
    if title:
        console.print(Text(title), soft_wrap=True)
    console.print(t)
    if not color:
        dest.write("\n".join(ln.rstrip() for ln in out.getvalue().splitlines()) + "\n")
    if lay.dropped:
        note = f"  (not shown at this width: {', '.join(lay.dropped)}; a wider terminal or piped output shows them)"
        lines = textwrap.wrap(note, width, subsequent_indent="   ", break_long_words=False) if width else [note]
        dest.write("\n".join(lines) + "\n")
    return lay
