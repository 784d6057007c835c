"""``omniprof.report``: run any registered reporter on a result, writing atomically."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from omniprof.core.fileio import atomic_open, output_error, unique_path
from omniprof.core.registry import Registry, get_registry, options_for
from omniprof.core.results import ProfileResult
from omniprof.errors import OmniprofError, ReporterError

__all__ = ["report", "make_reporter"]


def make_reporter(name: str, options: Mapping[str, Any] | None = None, registry: Registry | None = None) -> Any:
    """Instantiate reporter ``name`` with validated options (plugins.toml defaults, then ``options``)."""
    reg = registry or get_registry()
    cls = reg.reporter(name)
    return cls(options_for("reporter", name, cls, options, reg))


def report(result: ProfileResult, reporter: str = "table", dest: str | os.PathLike[str] | IO[Any] | None = None,
           *, options: Mapping[str, Any] | None = None, registry: Registry | None = None,
           overwrite: bool = True) -> Path | None:
    """Write ``result`` with the reporter called ``reporter``.

    Args:
        result: a :class:`ProfileResult`.
        reporter: a registered reporter name (``"table"``, ``"json"``, ``"perfetto"``, ...).
        dest: stream reporters: a text stream (default stdout) or a file path. File and directory
            reporters: a path; an existing directory gets the reporter's default file name inside;
            None writes the default file name in the current directory, never overwriting another
            run's file.
        options: the reporter's options.
        overwrite: when False, an existing ``dest`` file is kept and a free name beside it is used.

    Returns:
        The path written, or None when written to a stream.

    >>> import omniprof, io
    >>> buf = io.StringIO()
    >>> omniprof.report(omniprof.ProfileResult(), "table", buf)
    >>> "omniprof" in buf.getvalue()
    True

    .. versionadded:: 0.1
    """
    if not isinstance(result, ProfileResult):
        raise TypeError(f"report() needs a ProfileResult (got {type(result).__name__})")
    rep = make_reporter(reporter, options, registry)
    try:
        return _write(rep, result, dest, overwrite)
    except OmniprofError:
        raise
    except OSError as e:
        raise output_error(getattr(e, "filename", None) or str(dest), e) from e
    except Exception as e:
        raise ReporterError(f"reporter {reporter!r} failed: {type(e).__name__}: {e}", plugin=reporter) from e


def _target(rep: Any, dest: Any, overwrite: bool) -> Path:
    default = rep.default_filename or f"{rep.name}.out"
    if rep.output == "dir":
        # A directory reporter adds uniquely named entries inside (an XProf run), so an existing
        # directory is used as is: it never overwrites another run's files.
        return Path(dest) if dest is not None else Path.cwd() / default
    if dest is None:
        return unique_path(Path.cwd() / default)
    path = Path(dest)
    if path.is_dir() and rep.output != "dir":
        return unique_path(path / default)
    if not overwrite or rep.output == "dir":
        return unique_path(path)
    return path


def _write(rep: Any, result: ProfileResult, dest: Any, overwrite: bool) -> Path | None:
    if rep.output == "stream":
        if dest is None:
            rep.report(result, sys.stdout)
            return None
        if hasattr(dest, "write"):
            rep.report(result, dest)
            return None
        path = Path(dest)
        if path.is_dir():
            path = unique_path(path / (rep.default_filename or f"{rep.name}.txt"))
        buf = io.StringIO()
        rep.report(result, buf)
        with atomic_open(path, "wb") as fh:
            fh.write(buf.getvalue().encode("utf-8"))
        return path
    if hasattr(dest, "write"):
        if rep.output == "dir":
            raise ReporterError(f"reporter {rep.name!r} writes a directory; give a path, not a stream", plugin=rep.name)
        rep.report(result, dest)
        return None
    path = _target(rep, dest, overwrite)
    if rep.output == "file":
        with atomic_open(path, "wb") as fh:
            rep.report(result, fh)
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e) from e
    rep.report(result, path)
    return path
