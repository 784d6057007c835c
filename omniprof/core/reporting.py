"""``omniprof.report``: run any registered reporter on a result, writing atomically."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from omniprof.core.fileio import AtomicFile, output_error
from omniprof.core.registry import Registry, get_registry, options_for
from omniprof.core.results import ProfileResult
from omniprof.core.text import UNICODE_RULES, EncodedText, can_encode, report_stdout, utf8_safe_result
from omniprof.errors import OmniprofError, ReporterError

__all__ = ["report", "make_reporter"]


def make_reporter(name: str, options: Mapping[str, Any] | None = None, registry: Registry | None = None) -> Any:
    """Instantiate reporter ``name`` with validated options (plugins.toml defaults, then ``options``)."""
    reg = registry or get_registry()
    cls = reg.reporter(name)
    return cls(options_for("reporter", name, cls, options, reg))


def report(result: ProfileResult, reporter: str = "table", dest: str | os.PathLike[str] | IO[Any] | None = None,
           *, options: Mapping[str, Any] | None = None, registry: Registry | None = None,
           overwrite: bool = False) -> Path | None:
    """Write ``result`` with the reporter called ``reporter``.

    Files are written atomically (a temporary file renamed into place), and an existing file is
    never replaced unless ``overwrite=True``: the report goes to the first free name beside it
    (``profile-1.pb.gz``, ...) and that path is returned.

    Args:
        result: a :class:`ProfileResult`.
        reporter: a registered reporter name (``"table"``, ``"json"``, ``"pprof"``, ...).
        dest: stream reporters: a text stream (default stdout) or a file path. File and directory
            reporters: a path; an existing directory gets the reporter's default file name inside;
            None writes the default file name in the current directory.
        options: the reporter's options.
        overwrite: True replaces an existing ``dest`` file (atomically). False (the default) keeps
            it and writes to a free name beside it. A directory reporter gets a new directory
            (``dest-1`` when ``dest`` exists) unless ``overwrite=True``, which writes inside ``dest``.

    Returns:
        The path written, or None when written to a stream.

    Raises:
        OutputError: the output could not be written (disk full, read-only, permission denied);
            the message is one line naming the path, the reason and the fix.
        ReporterError: the reporter itself failed.

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
        if rep.output == "stream" and not getattr(rep, "exact_text", False):
            result = utf8_safe_result(result)  # a terminal or text file cannot hold lone surrogates
        try:
            return _write(rep, result, dest, overwrite)
        except UnicodeEncodeError:
            # A name that is not valid Unicode (an undecodable file name): nothing was published
            # (atomic write); write again with such characters spelled out. Rare, so not checked first.
            safe = utf8_safe_result(result)
            if safe is result:
                raise
            return _write(rep, safe, dest, overwrite)
    except OmniprofError:
        raise
    except OSError as e:
        raise output_error(getattr(e, "filename", None) or _dest_name(dest), e) from e
    except Exception as e:
        raise ReporterError(f"reporter {reporter!r} failed: {type(e).__name__}: {e}", plugin=reporter) from e


def _dest_name(dest: Any) -> str:
    if dest is None:
        return "<stdout>"
    if hasattr(dest, "write"):
        return str(getattr(dest, "name", None) or f"<{type(dest).__name__}>")
    return os.fspath(dest)


def _target(rep: Any, dest: Any) -> Path:
    default = rep.default_filename or (f"{rep.name}.txt" if rep.output == "stream" else f"{rep.name}.out")
    if dest is None:
        return Path.cwd() / default
    path = Path(dest)
    # "out/" names a directory even before it exists.
    as_dir = path.is_dir() or (isinstance(dest, str) and dest.endswith(("/", os.sep)))
    if as_dir and rep.output != "dir":
        return path / default
    return path


def _to_stream(rep: Any, result: ProfileResult, stream: IO[Any]) -> None:
    if not getattr(rep, "exact_text", False) and not can_encode(stream, UNICODE_RULES):
        # A terminal that cannot take UTF-8 (PYTHONIOENCODING=ascii, LC_ALL=C): the renderer draws
        # ASCII rules for it, and any other character is spelled out rather than failing the report.
        stream = EncodedText(stream)  # type: ignore[assignment]
    rep.report(result, stream)
    # Surface a full disk or closed pipe here, as our one-line error, not at interpreter exit.
    flush = getattr(stream, "flush", None)
    if flush is not None:
        try:
            flush()
        except OSError as e:
            raise output_error(_dest_name(stream), e) from e


def _write(rep: Any, result: ProfileResult, dest: Any, overwrite: bool) -> Path | None:
    if hasattr(dest, "write"):
        if rep.output == "dir":
            raise ReporterError(f"reporter {rep.name!r} writes a directory; give a path, not a stream", plugin=rep.name)
        _to_stream(rep, result, dest)
        return None
    if rep.output == "stream" and dest is None:
        _to_stream(rep, result, report_stdout(sys.stdout))  # sys.stdout, unless the program set it to None or closed it
        return None
    path = _target(rep, dest)
    if rep.output == "dir":
        # A directory reporter adds uniquely named entries inside (an XProf run), so an existing
        # directory is used as is: it never overwrites another run's files.
        out = _existing_or_new_dir(path)
        rep.report(result, out)
        return out
    f = AtomicFile(path, "wb", overwrite=bool(overwrite))
    with f as fh:
        if rep.output == "stream":
            text = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
            rep.report(result, text)
            text.flush()
            text.detach()  # leave fh to AtomicFile
        else:
            rep.report(result, fh)
    return f.path


def _existing_or_new_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e) from e
    return path
