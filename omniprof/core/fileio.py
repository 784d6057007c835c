"""Atomic, never-silently-overwriting file output.

Every file omniprof writes goes through here: data lands in a temporary file in the destination
directory and is renamed into place, so a crash leaves either the old file or the new one, never a
torn one. OS errors (disk full, read-only, permission) become one-line :class:`OutputError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from omniprof.errors import OmniprofError

__all__ = ["OutputError", "atomic_write_bytes", "atomic_write_text", "atomic_open", "unique_path", "unique_run_dir"]


class OutputError(OmniprofError, OSError):
    """An output file or directory could not be written (disk full, read-only, no permission)."""


_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "the directory does not exist",
    errno.ENOTDIR: "a parent of the path is not a directory",
    errno.EISDIR: "the path is a directory",
}


def output_error(path: os.PathLike[str] | str, exc: OSError) -> OutputError:
    reason = _REASONS.get(exc.errno or -1, exc.strerror or str(exc))
    err = OutputError(f"cannot write {os.fspath(path)!r}: {reason}")
    err.errno = exc.errno
    return err


@contextlib.contextmanager
def atomic_open(path: os.PathLike[str] | str, mode: str = "wb", *, encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for streaming writes; rename it over ``path`` on success.

    On an exception the temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("wb", "w"):
        raise ValueError("atomic_open supports 'wb' and 'w'")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise output_error(path, e) from e
    try:
        with os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _silent_unlink(tmp)
        raise output_error(path, e) from e
    except BaseException:
        _silent_unlink(tmp)
        raise


def _silent_unlink(p: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(p)


def atomic_write_bytes(path: os.PathLike[str] | str, data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: os.PathLike[str] | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def unique_path(path: os.PathLike[str] | str) -> Path:
    """``path`` if free, else ``name-1.ext``, ``name-2.ext``, ...: never overwrite another run's file."""
    path = Path(path)
    if not path.exists():
        return path
    suffixes = path.suffixes[-2:] if path.suffix in (".gz", ".bz2", ".xz", ".zst") else path.suffixes[-1:]
    ext = "".join(suffixes)
    stem = path.name[: len(path.name) - len(ext)] if ext else path.name
    for i in range(1, 100_000):
        cand = path.with_name(f"{stem}-{i}{ext}")
        if not cand.exists():
            return cand
    raise OutputError(f"cannot find a free file name beside {str(path)!r}")


def unique_run_dir(base: os.PathLike[str] | str, prefix: str | None = None) -> Path:
    """Create and return a new run directory under ``base``: ``YYYY_MM_DD_HH_MM_SS_<ms>[-n]``.

    Unlike jax (named to the second), two runs in the same second never share a directory.
    """
    base = Path(base)
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime())
    ms = int(time.time() * 1000) % 1000
    name = f"{prefix + '_' if prefix else ''}{stamp}_{ms:03d}"
    try:
        base.mkdir(parents=True, exist_ok=True)
        for i in range(100_000):
            cand = base / (name if i == 0 else f"{name}-{i}")
            try:
                cand.mkdir()
                return cand
            except FileExistsError:
                continue
    except OSError as e:
        raise output_error(base, e) from e
    raise OutputError(f"cannot create a unique run directory under {str(base)!r}")


def hostname() -> str:
    return socket.gethostname() or "localhost"
