"""The one table renderer: every table omniprof prints goes through :func:`render_table` (rich).

Layout rules, in this order, so a table reads right at any width:

1. Columns whose every cell is empty (``None``, ``""``, ``"-"``) are dropped first.
2. When the table does not fit, label and text columns holding the same cell in every row are
   left out next (named under the table with their value: ``same in every row: runs_on = Device``),
   before any name is cut.
3. Number columns (``Column(kind="num")``) and short label columns (``kind="label"``) are never
   cut: they take their widest cell.
4. Text columns (``kind="text"``: names, paths) get the remaining room. Only when they truly
   cannot fit are they shortened, the widest first, by eliding inside what the rows share
   (``aten::res…conj``; paths, ``cut="start"``, keep their end), never below ``min_width``
   characters and never so far that two different cells look the same. A :class:`Labeled`
   cell (a name and where it is) has its two parts cut separately.
5. If even that does not fit, optional columns (``drop > 0``, highest first) are left out and
   named under the table; if it still does not fit, the line is allowed to be longer than the
   width (the terminal wraps it) rather than cut a number.
6. With ``width=None`` (piped output) nothing is ever cut.

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
import os
import textwrap
from collections.abc import Sequence
from typing import IO, Any

import attrs

from omniprof.core.text import UNICODE_RULES, can_encode

__all__ = ["Column", "Layout", "layout", "render_table", "print_table", "elide_middle", "elide_start", "Indented",
           "Labeled", "terminal_width", "GAP"]

GAP = 2          # spaces between columns
ELLIPSIS = "…"
ASCII_ELLIPSIS = "~"  # one character, like ELLIPSIS, so a column keeps its width
EMPTY = ("", "-", None)


@attrs.frozen
class Column:
    """One column: ``header``; ``kind`` ``"text"`` (may be elided), ``"num"`` (right-aligned, never
    cut) or ``"label"`` (left-aligned, never cut); ``min_width``: a text column is never elided
    below this; ``drop``: 0 never left out, otherwise left out (highest first) when even elided
    text does not fit; ``cut``: where a text cell is shortened, ``"middle"`` (names) or ``"start"``
    (paths: their end, ``file.py:12``, tells them apart)."""

    header: str
    kind: str = attrs.field(default="text", validator=attrs.validators.in_(("text", "num", "label")))
    min_width: int = 24
    drop: int = 0
    cut: str = attrs.field(default="middle", validator=attrs.validators.in_(("middle", "start")))


@attrs.frozen
class Indented:
    """A text cell whose ``prefix`` (a tree's indentation) is never elided, only its ``text``
    (a string, or a :class:`Labeled` name and place)."""

    prefix: str
    text: Any

    def __str__(self) -> str:
        return self.prefix + str(self.text)

    def __len__(self) -> int:
        return len(self.prefix) + len(self.text)


@attrs.frozen
class Labeled:
    """A text cell naming something and where it is (``name  file.py:12``): when it must be cut,
    ``name`` is cut in its middle and ``where`` at its start, each on its own side of the gap."""

    name: str
    where: str

    def __str__(self) -> str:
        return f"{self.name}  {self.where}" if self.where else self.name

    def __len__(self) -> int:
        return len(self.name) + (2 + len(self.where) if self.where else 0)


@attrs.frozen
class Layout:
    """Which columns are shown (indices), their widths, the columns left out, and the constant
    columns left out (``header = value``). ``heads``: per shown column, how many leading
    characters an elided cell keeps (None: the default middle cut)."""

    keep: tuple[int, ...]
    widths: tuple[int, ...]
    dropped: tuple[str, ...]
    empty: tuple[str, ...]
    constant: tuple[str, ...] = ()
    heads: tuple[Any, ...] = ()


def terminal_width(stream: Any) -> int | None:
    """The width to fit ``stream``'s text to: the terminal's columns on a terminal, None (never
    cut) on a pipe or file."""
    import shutil

    isatty = getattr(stream, "isatty", None)
    try:
        tty = bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        tty = False
    return shutil.get_terminal_size((120, 24)).columns if tty else None


def elide_middle(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """``text`` within ``width`` characters, its middle replaced by ``…`` when too long
    (the start keeps a bit more than the end).

    >>> elide_middle("aten::resolve_conj", 12)
    'aten::r…conj'
    """
    if ellipsis == ELLIPSIS:
        return _elide(text, width, None)
    if len(text) <= width:
        return text
    mark = len(ellipsis)
    if width <= mark:
        return text[:width]
    head = min((width - mark + 1) // 2 + (1 if width > 8 else 0), width - mark)
    tail = width - mark - head
    return text[:head] + ellipsis + (text[len(text) - tail:] if tail else "")


def elide_start(text: str, width: int) -> str:
    """``text`` within ``width`` characters, its start replaced by ``…`` when too long.

    >>> elide_start("/tmp/project/src/app.py:12", 14)
    '…src/app.py:12'
    """
    return _elide(text, width, 0)


def _elide(text: str, width: int, head: Any) -> str:
    """``text`` in ``width`` characters keeping ``head`` leading ones (None: a bit over half), or,
    with ``head = (prefix, suffix)``, keeping what lies between a shared prefix and suffix of that
    many characters and cutting into those (``void cutl…128x64_16x3_nn_align4…Params)``)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    if isinstance(head, tuple):
        return _elide_shared(text, width, *head)
    if head is None:
        head = (width - 1 + 1) // 2 + (1 if width > 8 else 0)
    head = max(0, min(head, width - 1))
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[len(text) - tail:] if tail else "")


def _elide_shared(text: str, width: int, prefix: int, suffix: int) -> str:
    """``text`` cut inside its first ``prefix`` and last ``suffix`` characters (those every row
    shares), the part that differs kept whole while it fits."""
    prefix, suffix = min(prefix, len(text)), min(suffix, max(len(text) - prefix, 0))
    left, core, right = text[:prefix], text[prefix:len(text) - suffix], text[len(text) - suffix:]
    room = width - len(core)
    if room < (1 if left else 0) + (1 if right else 0) + 2:
        # The differing part alone is too long: a little of the shared start, then the start of what differs.
        lw = min(len(left), max(width // 3, 2))
        if not left or width - lw < 4:
            return _elide(text, width, None)
        rest = width - lw
        return left[:lw - 1] + ELLIPSIS + (core + right)[:rest - 1] + ELLIPSIS
    lw = min(len(left), max(room // 2, room - len(right)))
    rw = room - lw
    if len(right) > rw:
        right = ELLIPSIS + right[len(right) - rw + 1:] if rw > 1 else ELLIPSIS
    else:
        lw = room - len(right)
    if len(left) > lw:
        left = left[:lw - 1] + ELLIPSIS if lw > 1 else ELLIPSIS
    return left + core + right


def _shared(values: Sequence[Any]) -> tuple[int, int]:
    """How many leading and trailing characters every name in ``values`` shares."""
    texts = []
    for v in values:
        v = v.text if isinstance(v, Indented) else v
        texts.append(v.name if isinstance(v, Labeled) else str(v))
    if len(texts) < 2:
        return 0, 0
    shortest = min(len(t) for t in texts)
    prefix = len(os.path.commonprefix(texts))
    suffix = len(os.path.commonprefix([t[::-1] for t in texts]))
    return min(prefix, shortest), min(suffix, shortest - min(prefix, shortest))


def _cell(value: Any) -> Any:
    if value is None:
        return "-"
    return value if isinstance(value, (Indented, Labeled)) else str(value)


def layout(columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int | None) -> Layout:
    """The column widths for ``rows`` in ``width`` characters (None: unbounded)."""
    n = len(columns)
    empty = tuple(i for i in range(n) if rows and all(r[i] in EMPTY or str(r[i]) == "" for r in rows))
    keep = [i for i in range(n) if i not in empty]
    natural = {i: max([len(columns[i].header)] + [len(_cell(r[i])) for r in rows]) for i in range(n)}
    constant: list[int] = []
    if width is not None and sum(natural[i] for i in keep) + GAP * (len(keep) - 1) > width and len(rows) >= 2:
        for i in keep:
            if columns[i].kind != "num" and len({str(r[i]) for r in rows}) == 1 and len(keep) - len(constant) > 1:
                constant.append(i)
        keep = [i for i in keep if i not in constant]
    floors = {i: _distinct_floor(columns[i], [_cell(r[i]) for r in rows], natural[i], width)
              for i in keep if columns[i].kind == "text"} if width is not None else {}
    dropped: list[int] = []
    while True:
        widths = _fit(columns, natural, keep, width, floors)
        total = sum(widths.values()) + GAP * (len(keep) - 1)
        if width is None or total <= width:
            break
        optional = [i for i in keep if columns[i].drop > 0]
        if not optional:
            break
        i = max(optional, key=lambda k: (columns[k].drop, k))
        keep.remove(i)
        dropped.append(i)
    heads = tuple(_distinct_head(columns[i], [_cell(r[i]) for r in rows], widths[i]) if widths[i] < natural[i] else None
                  for i in keep)
    return Layout(tuple(keep), tuple(widths[i] for i in keep), tuple(columns[i].header for i in dropped),
                  tuple(columns[i].header for i in empty),
                  tuple(f"{columns[i].header} = {_cell(rows[0][i])}" for i in constant), heads)


def _heads(width: int, shared: tuple[int, int] = (0, 0)) -> list[Any]:
    """Where an elided cell may keep its cut: the default middle first, then around what the rows
    do not share, then from the start to the end."""
    cuts: list[Any] = [None]
    if any(shared):
        cuts += [shared] + ([(shared[0], 0)] if shared[1] and shared[0] else [])
    return cuts + [width * k // 8 for k in (7, 6, 5, 3, 2, 1)] + [width - 1, 2]


def _distinct(column: Column, values: Sequence[Any], width: int, head: Any) -> bool:
    """Whether cells that differ still differ once cut to ``width`` keeping ``head`` leading characters."""
    seen: dict[str, str] = {}
    names: dict[str, str] = {}
    for v in values:
        full = str(v)
        cut = _fit_cell(v, width, head, column.cut)
        if seen.setdefault(cut, full) != full:
            return False
        label = v.text if isinstance(v, Indented) else v
        if isinstance(label, Labeled) and len(v) > width:
            # Names that differ stay apart by their own letters, not only by where they are.
            shown = cut.rsplit("  ", 1)[0].lstrip() if label.where else cut.lstrip()
            if names.setdefault(shown, label.name) != label.name:
                return False
    return True


def _distinct_head(column: Column, values: Sequence[Any], width: int) -> Any:
    """The first cut (see :func:`_heads`) that keeps different cells apart at ``width``."""
    distinct = list({str(v): v for v in values}.values())
    if column.cut == "start":
        return 0
    for head in _heads(width, _shared(distinct)):
        if _distinct(column, distinct, width, head):
            return head
    return None


def _distinct_floor(column: Column, values: Sequence[Any], natural: int, width: int | None) -> int:
    """The narrowest width (at least the column's own floor) at which some cut keeps different
    cells apart: names are never cut until two rows look the same."""
    floor = min(natural, max(column.min_width, len(column.header)))
    if column.cut == "start":  # a path keeps its whole file name (``…alloc_sites.py:5``)
        floor = min(natural, max([floor] + [len(_basename(str(v))) + 1 for v in values]))
    distinct = list({str(v): v for v in values}.values())
    if len(distinct) < 2 or width is None:
        return floor

    shared = _shared(distinct)

    def ok(w: int) -> bool:
        heads = [0] if column.cut == "start" else _heads(w, shared)
        return any(_distinct(column, distinct, w, h) for h in heads)

    lo, hi = floor, natural
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _fit(columns: Sequence[Column], natural: dict[int, int], keep: list[int], width: int | None,
         floors: dict[int, int]) -> dict[int, int]:
    widths = {i: natural[i] for i in keep}
    if width is None:
        return widths
    text = [i for i in keep if columns[i].kind == "text"]
    fixed = sum(widths[i] for i in keep if i not in text) + GAP * (len(keep) - 1)
    room = width - fixed
    if sum(widths[i] for i in text) <= room:
        return widths
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


def _basename(path: str) -> str:
    """The last component of a path (``app.py:12`` of ``/src/app.py:12``)."""
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _fit_cell(value: Any, width: int, head: Any = None, cut: str = "middle") -> str:
    """``value`` in ``width`` characters: a tree's indent kept, a name and its place cut apart."""
    if len(value) <= width:
        return str(value)
    if isinstance(value, Indented):
        return value.prefix + _fit_cell(value.text, max(width - len(value.prefix), 1), head, cut)
    if isinstance(value, Labeled):
        # The place keeps its file name (``…hot_loop.py:12``) where it can; the name gets the rest.
        base = len(_basename(value.where)) + (1 if "/" in value.where.replace("\\", "/") else 0)
        where_w = min(len(value.where), max(width - 2 - len(value.name), min(base, width // 2)))
        name_w = width - 2 - where_w
        if name_w >= 1:
            return _elide(value.name, name_w, head) + "  " + _elide(value.where, where_w, 0)
        return _elide(str(value), width, head)
    return _elide(value, width, 0 if cut == "start" else head)


def _note(text: str, width: int | None) -> list[str]:
    """A note under a table wrapped at spaces within ``width``; a word longer than a line (a path)
    keeps its end (``…/pkg/app.py:3``) rather than break."""
    if width is None:
        return [text]
    words = [w if len(w) <= width - 4 else elide_start(w, width - 4) for w in text.split(" ")]
    return textwrap.wrap(" ".join(words), width, initial_indent="", subsequent_indent="   ", break_long_words=False,
                         break_on_hyphens=False, drop_whitespace=True) or [text]


def _spelled(value: Any, encoding: str) -> Any:
    """A cell with the characters ``encoding`` cannot hold spelled out (``\\xe9``) before the
    layout, so the columns line up as written."""
    def spell(text: str) -> str:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    if isinstance(value, Indented):
        return Indented(spell(value.prefix), _spelled(value.text, encoding))
    if isinstance(value, Labeled):
        return Labeled(spell(value.name), spell(value.where))
    return spell(value)


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
    if plain:
        encoding = dest.encoding
        rows = [[_spelled(c, encoding) for c in r] for r in rows]
        columns = [attrs.evolve(c, header=_spelled(c.header, encoding)) for c in columns]
    lay = layout(columns, rows, width)
    t = RichTable(box=_ascii_rules() if plain else box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0),
                  header_style="bold" if color else "", show_header=True, title=None)
    for i, w in zip(lay.keep, lay.widths):
        c = columns[i]
        t.add_column(c.header, justify="right" if c.kind == "num" else "left", width=w, no_wrap=True)
    for ri, r in enumerate(rows):
        # Spelled cells hold no "…" of their own: every one left is a cut, drawn as "~" in ASCII.
        cells = (_fit_cell(r[i], w, h, columns[i].cut) for i, w, h in zip(lay.keep, lay.widths, lay.heads))
        t.add_row(*(Text(c.replace(ELLIPSIS, ASCII_ELLIPSIS) if plain else c) for c in cells),
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
    if lay.constant:
        dest.write("\n".join(_note(f"  (same in every row: {', '.join(lay.constant)})", width)) + "\n")
    if lay.dropped:
        dest.write("\n".join(_note(f"  (not shown at this width: {', '.join(lay.dropped)}; a wider terminal or "
                                    "piped output shows them)", width)) + "\n")
    return lay
