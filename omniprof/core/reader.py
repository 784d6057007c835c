"""The base class of reader plugins (public as ``omniprof.plugin.Reader``).

Beside :mod:`omniprof.core.backend` and :mod:`omniprof.core.reporter`: the registry validates
reader plugins against it, and :mod:`omniprof.core.readers` (``read_any``) uses them.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar

import attrs

from omniprof.core.results import ProfileResult

__all__ = ["Reader"]


class Reader(abc.ABC):
    """Reads one file format into a :class:`ProfileResult` (``omniprof report``, ``omniprof diff``).

    Class attributes:
        name: entry-point name == the format name (``omniprof report --format`` is not needed:
            files are recognised by :meth:`sniff`).
        api_version: plugin API version (checked at load).
        summary: one line for ``omniprof plugins``.
        Options: an attrs class of this reader's options (none by default).

    .. versionadded:: 0.1
    """

    name: ClassVar[str]
    api_version: ClassVar[int] = 1
    summary: ClassVar[str] = ""

    @attrs.frozen(kw_only=True)
    class Options:
        """No options."""

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def sniff(cls, path: Path, head: bytes) -> bool:
        """Whether ``path`` (a file whose first bytes, un-gzipped, are ``head``; or a directory,
        with ``head`` empty) is in this reader's format. Must be cheap and must not raise."""
        return False

    @abc.abstractmethod
    def read(self, path: Path) -> ProfileResult:
        """Read ``path``; raise :class:`~omniprof.errors.TraceReadError` naming what is wrong."""
