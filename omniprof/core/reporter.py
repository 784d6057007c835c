"""The reporter plugin API.

A reporter turns a :class:`~omniprof.core.results.ProfileResult` (plain data, never a live
profiler) into one output. Build plain data first (rows, events), format second, so tests can
assert on data.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import IO, Any, ClassVar, Literal

import attrs

from omniprof.core.results import ProfileResult

__all__ = ["Reporter", "check_times"]


class Reporter(abc.ABC):
    """Writes a ProfileResult in one format.

    Class attributes:
        name: entry-point name == ``-r`` value.
        api_version: plugin API version (checked at load).
        output: ``"stream"`` (text to a stream, e.g. the terminal), ``"file"`` (one file: ``report``
            gets a binary handle that the core opened atomically) or ``"dir"`` (``report`` gets a
            directory Path, which may already hold earlier reports, and adds uniquely named
            entries to it, written atomically through ``omniprof.core.fileio``).
        default_filename: file or directory name used when the user gives only an output directory.
        summary: one line for ``omniprof plugins``.
        Options: an attrs class of this reporter's options.

    .. versionadded:: 0.1
    """

    name: ClassVar[str]
    api_version: ClassVar[int] = 1
    output: ClassVar[Literal["stream", "file", "dir"]] = "stream"
    default_filename: ClassVar[str | None] = None
    summary: ClassVar[str] = ""

    @attrs.frozen(kw_only=True)
    class Options:
        """No options."""

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    @abc.abstractmethod
    def report(self, result: ProfileResult, dest: IO[str] | IO[bytes] | Path) -> None:
        """Write ``result`` to ``dest`` (a text stream, a binary file handle, or a directory)."""

    def render(self, result: ProfileResult) -> str:
        """Convenience for stream reporters: the report as a string."""
        import io

        if self.output != "stream":
            raise TypeError(f"reporter {self.name!r} writes a {self.output}, not text")
        buf = io.StringIO()
        self.report(result, buf)
        return buf.getvalue()


_I64 = 1 << 63


def check_times(result: ProfileResult, reporter: str) -> None:
    """Raise ``ReporterError`` when a time, duration or weight of ``result`` (clock offset
    included) does not fit a signed 64-bit integer, the widest the trace formats hold.

    Such a value (2^63 ns is 292 years) can only come from a damaged or hand-made result; a writer
    would otherwise wrap it silently or write a field its readers reject. No copies: a min and a max
    per kind of time, at C speed.
    """
    from itertools import chain
    from operator import add, attrgetter

    from omniprof.errors import ReporterError

    lo, hi = -_I64, _I64 - 1
    start, dur, t, weight, size = (attrgetter(n) for n in ("start_ns", "dur_ns", "t_ns", "weight_ns", "size_bytes"))
    for part in result.parts:
        off = part.clock.offset_ns
        sp = part.spans
        # (what, a maker of the raw values, the offset they take): min and max at C speed over a
        # fresh iterator each, so a result of millions of events costs no list of its times
        checks: list[tuple[str, Any, int]] = [
            ("start_ns/end_ns", lambda p=part: (p.start_ns, p.end_ns), off),
            ("spans' start_ns", lambda sp=sp: map(start, sp), off),
            ("spans' end (start_ns + dur_ns)", lambda sp=sp: map(add, map(start, sp), map(dur, sp)), off),
            ("instants' t_ns", lambda p=part: map(t, p.instants), off),
            ("samples' t_ns", lambda p=part: map(t, p.samples), off),
            ("samples' weight_ns", lambda p=part: map(weight, p.samples), 0),
            ("allocations' t_ns", lambda p=part: map(t, p.allocations), off),
            ("allocations' size_bytes", lambda p=part: map(size, p.allocations), 0),
            ("counters' t_ns", lambda p=part: chain.from_iterable(c.t_ns for c in p.counters), off),
        ]
        for what, values, shift in checks:
            least = min(values(), default=None)
            if least is not None and (least + shift < lo or max(values()) + shift > hi):
                bad = next(v + shift for v in values() if not lo <= v + shift <= hi)
                raise ReporterError(
                    f"reporter {reporter!r}: part {part.backend!r} has {what} = {bad}, outside the signed 64-bit "
                    f"range that trace files hold (2^63 ns is 292 years); the result is damaged. Nothing was written",
                    plugin=reporter)
