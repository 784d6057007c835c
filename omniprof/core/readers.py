"""Read any saved result or native trace into a :class:`ProfileResult`.

Formats are recognised by name and first bytes; each reader lives beside its backend and is
imported only when a file of its format is read.
"""

from __future__ import annotations

import gzip
import importlib
import os
from collections.abc import Callable
from pathlib import Path

from omniprof.core.results import ProfileResult
from omniprof.errors import TraceReadError

__all__ = ["read_any", "detect_format", "READERS"]

#: format name -> "module:function" taking a Path and returning a ProfileResult.
READERS: dict[str, str] = {
    "result": "omniprof.core.results:load",
    "xplane": "omniprof.backends.xla.reader:read_xplane",
    "kineto": "omniprof.backends.torch.kineto:read_trace",
}


def _head(path: Path, n: int = 4096) -> bytes:
    with open(path, "rb") as fh:
        raw = fh.read(n)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as gz:
                return gz.read(n)
        except (OSError, EOFError) as e:
            raise TraceReadError(f"{path}: corrupt or truncated gzip data: {e}") from e
    return raw


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"result"``, ``"kineto"``, ``"xplane"`` (a ``.xplane.pb`` or an XProf logdir)."""
    p = Path(path)
    if not p.exists():
        raise TraceReadError(f"no such file or directory: {str(p)!r}")
    if p.is_dir():
        return "xplane"
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
        return "result"
    if text.startswith(b"["):
        return "kineto"
    raise TraceReadError(
        f"{p}: unrecognised file format (expected an omniprof result JSON, a Kineto trace JSON, "
        f"an .xplane.pb or an XProf logdir)")


def read_any(path: str | os.PathLike[str], fmt: str | None = None) -> ProfileResult:
    """Read ``path`` with the reader for its format (detected unless ``fmt`` is given)."""
    fmt = fmt or detect_format(path)
    target = READERS.get(fmt)
    if target is None:
        raise TraceReadError(
            f"{path}: reading {fmt} files needs a reader that this installation lacks "
            f"(known: {', '.join(sorted(READERS))})")
    module, _, func = target.partition(":")
    reader: Callable[[Path], ProfileResult] = getattr(importlib.import_module(module), func)
    return reader(Path(path))
