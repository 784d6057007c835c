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

__all__ = ["Reporter"]


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
