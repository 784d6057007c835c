"""Read any saved result or native trace into a :class:`ProfileResult`.

Readers are plugins (entry-point group ``omniprof.readers``; omniprof's own are declared in its
``pyproject.toml``): a :class:`Reader` subclass named like the format it reads. Formats are
recognised by name and first bytes: omniprof's own formats first, then each other reader's
:meth:`Reader.sniff`. A reader's module is imported only when a file of its format is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from omniprof.core.reader import Reader
from omniprof.core.results import ProfileResult, load
from omniprof.errors import TraceReadError

__all__ = ["Reader", "ResultReader", "read_any", "detect_format", "BUILTIN_FORMATS"]

#: The formats :func:`detect_format` recognises itself (their readers are omniprof's own plugins).
BUILTIN_FORMATS = ("result", "xplane", "kineto")


class ResultReader(Reader):
    """omniprof's own result JSON (``omniprof.result.json``), or a distributed run directory
    (``rank<N>/omniprof.result.json`` parts), read as the merged result of its ranks."""

    name = "result"
    summary = "omniprof result JSON (omniprof.result.json), or a distributed run directory of rank parts"

    def read(self, path: Path) -> ProfileResult:
        if Path(path).is_dir():
            from omniprof.core.distributed import load_run

            return load_run(path)
        return load(path)


def _head(path: Path, n: int = 4096) -> bytes:
    from omniprof.core.inputs import open_input

    with open_input(path) as fh:
        return fh.read(n)


def detect_format(path: str | os.PathLike[str], registry: Any = None) -> str:
    """``"result"`` (also a distributed run directory: ``rank<N>/`` parts), ``"kineto"`` (also a
    directory of per-rank Kineto traces), ``"xplane"`` (a ``.xplane.pb`` or an XProf logdir), or the
    name of another installed reader whose :meth:`Reader.sniff` recognises the file."""
    fmt = _builtin_format(path)
    if fmt is not None:
        return fmt
    p = Path(path)
    head = b"" if p.is_dir() else _head(p)
    reg = registry or _registry()
    for name in reg.names("reader"):
        if name in BUILTIN_FORMATS:
            continue
        try:
            if reg.reader(name).sniff(p, head):
                return name
        except Exception:  # noqa: S112 -- a broken third-party sniffer does not stop the others
            continue
    raise TraceReadError(
        f"{p}: unrecognised file format (expected an omniprof result JSON, a Kineto trace JSON, "
        f"an .xplane.pb or an XProf logdir{', or a file one of the readers ' + ', '.join(_others(reg)) + ' reads' if _others(reg) else ''})")


def _others(reg: Any) -> list[str]:
    return [n for n in reg.names("reader") if n not in BUILTIN_FORMATS]


def _registry() -> Any:
    from omniprof.core.registry import get_registry

    return get_registry()


def _builtin_format(path: str | os.PathLike[str]) -> str | None:
    from omniprof.core.inputs import check_input

    p = Path(path)
    if stat.S_ISDIR(check_input(p).st_mode):  # missing, link loops, devices: each its own message
        return _dir_format(p)
    name = p.name
    if name.endswith(".xplane.pb"):
        return "xplane"
    try:
        head = _head(p)
    except OSError as e:
        raise TraceReadError(f"cannot read {str(p)!r}: {e.strerror or e}") from e
    text = head.lstrip()
    if text.startswith(b"{"):
        if b'"schema_version"' in head or b'"parts"' in head or b'"metadata"' in head and b'"traceEvents"' not in head:
            return "result"
        if b'"traceEvents"' in head or ".pt.trace.json" in name or b'"deviceProperties"' in head or b'"schemaVersion"' in head:
            return "kineto"
        if len(head) < 4096:  # the whole file, and it has none of the keys either format starts with
            raise TraceReadError(
                f"{p}: a JSON object that is neither an omniprof result (no \"schema_version\"; write one with "
                f"-r json) nor a Kineto/Chrome trace (no \"traceEvents\")")
        return "result"
    if text.startswith(b"["):
        first = text[1:].lstrip()[:1]
        if first not in (b"{", b"]") or (first == b"{" and b'"ph"' not in head and len(head) < 4096):
            raise TraceReadError(
                f"{p}: a JSON array that is not a Chrome/Kineto trace (a trace is a list of events, "
                f"objects with a \"ph\" field)")
        return "kineto"
    return None


def _dir_format(p: Path) -> str:
    """A distributed run (``rank<N>/`` parts): result; a directory holding only Kineto traces (one
    per rank, HTA's input): kineto; else an XProf logdir."""
    from omniprof.core.distributed import find_rank_results

    try:
        if find_rank_results(p):
            return "result"
        names = [c.name for c in p.iterdir() if c.is_file()]
    except OSError as e:
        raise TraceReadError(f"cannot read directory {str(p)!r}: {e.strerror or e}") from e
    if not any(n.endswith(".xplane.pb") for n in names) and not (p / "plugins").is_dir():
        traces = [n for n in names if n.endswith((".json", ".json.gz")) and not n.startswith("omniprof.")]
        if traces and all(_builtin_format(p / n) == "kineto" for n in traces):
            return "kineto"
    return "xplane"


def read_any(path: str | os.PathLike[str], fmt: str | None = None, *, registry: Any = None) -> ProfileResult:
    """Read ``path`` with the reader for its format (detected unless ``fmt`` is given).

    ``path`` may also be a pipe (``/dev/stdin``, ``<(zcat trace.json.gz)``): it is read once into a
    temporary file. Every failure is a one-line :class:`TraceReadError`.
    """
    from omniprof.core.inputs import local_copy

    with local_copy(path) as local:
        try:
            return _read(local, fmt, registry)
        except TraceReadError as e:
            if Path(local) == Path(path):
                raise
            raise TraceReadError(str(e).replace(str(local), os.fspath(path))) from e


def _read(path: Path, fmt: str | None, registry: Any) -> ProfileResult:
    from omniprof.errors import PluginError

    reg = registry or _registry()
    fmt = fmt or detect_format(path, reg)
    if fmt not in reg.names("reader"):
        raise TraceReadError(
            f"{path}: reading {fmt} files needs a reader that this installation lacks "
            f"(known: {', '.join(reg.names('reader')) or 'none'}); install or enable the reader plugin for {fmt}")
    try:
        cls = reg.reader(fmt)
    except PluginError as e:
        raise TraceReadError(f"{path}: the {fmt} reader cannot be used: {e}") from e
    try:
        return cls().read(Path(path))
    except (TraceReadError, KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as e:
        # A reader's own bug on a hostile file: still one line naming the file, never a traceback.
        text = str(e).strip().splitlines()
        why = f"{type(e).__name__}: {text[0][:300] if text else 'no detail'}"
        if isinstance(e, ValueError) and "4300" in why:
            why = "a number of more than 4,300 digits (the bound Python puts on reading integers)"
        elif isinstance(e, RecursionError):
            why = "values nested too deeply"
        raise TraceReadError(f"{path}: cannot read this {fmt} file: {why}") from e
