"""Atomic, never-silently-overwriting file output.

Every file omniprof writes goes through here: data lands in a temporary file in the destination
directory and is renamed into place, so a crash leaves either the old file or the new one, never a
torn one. With ``overwrite=False`` the new file is published with ``link(2)``, which fails when the
name is taken, so two runs racing for one name each keep their own file (``name-1.ext``, ...).
OS errors (disk full, read-only, permission) become one-line :class:`OutputError` messages that
say what failed, why, and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from omniprof.core.clock import localtime, strftime, wall_time
from omniprof.errors import OmniprofError, OutputError

__all__ = ["OutputError", "AtomicFile", "atomic_write_bytes", "atomic_write_text", "atomic_open", "unique_path", "process_temp_dir",
           "unique_run_dir", "new_dir", "output_error"]


# errno -> (why, what to do); {flag} is the option that chooses where this output goes.
_REASONS = {
    errno.ENOSPC: ("the disk is full", "free some space or write to another directory ({flag})"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space or write to another directory ({flag})"),
    errno.EFBIG: ("the file is larger than this file system or the process's file-size limit allows",
                  "write to another file system or raise 'ulimit -f'"),
    errno.EROFS: ("the file system is read-only", "write to another directory ({flag})"),
    errno.EACCES: ("permission denied", "write to a directory you can write to ({flag}) or fix its permissions"),
    errno.EPERM: ("operation not permitted", "write to a directory you can write to ({flag})"),
    errno.ENOENT: ("the directory does not exist", "create it or choose another output path ({flag})"),
    errno.ENOTDIR: ("a parent of the path is not a directory", "choose another output path"),
    errno.EISDIR: ("the path is a directory", "give a file name, or the directory to write a default name into"),
    errno.ENAMETOOLONG: ("the file name is too long", "choose a shorter output path"),
    errno.EEXIST: ("a file of that name already exists", "choose another name (omniprof never replaces a file)"),
}


def output_error(path: os.PathLike[str] | str, exc: OSError, *, flag: str = "-o DIR") -> OutputError:
    """A one-line :class:`OutputError` for ``exc`` raised while writing ``path``; the hint names
    ``flag``, the option that chooses where this output goes (``-o DIR``, ``--logdir DIR``)."""
    why, fix = _REASONS.get(exc.errno or -1, (exc.strerror or str(exc) or type(exc).__name__, ""))
    fix = fix.format(flag=flag)
    why = " ".join(str(why).split())  # one line, whatever the OS said
    msg = f"cannot write {os.fspath(path)!r}: {why}" + (f"; {fix}" if fix else "")
    err = OutputError(msg)
    err.errno = exc.errno
    err.filename = os.fspath(path)
    return err


def _umask() -> int:
    # The process umask without the racy os.umask(0) dance: Linux reports it in /proc.
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _make_temp(directory: Path, name: str) -> tuple[int, str]:
    # Like mkstemp, but with the permissions open() would give (0666 & ~umask), not 0600:
    # the report must be readable by the tools and users that read any other file of ours.
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(directory))


def _candidates(path: Path) -> Iterator[Path]:
    """``path``, then ``stem-1.rest``, ``stem-2.rest``... where ``stem`` ends at the first dot
    (``trace-1.json.gz``, ``omniprof-1.result.json``, ``host-1.xplane.pb``)."""
    yield path
    stem, dot, ext = path.name.partition(".")
    for i in range(1, 100_000):
        yield path.with_name(f"{stem}-{i}{dot}{ext}")


_NO_LINK = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def _publish_new(tmp: str, path: Path, rename: bool) -> Path:
    """Move ``tmp`` to ``path`` (or, with ``rename``, the first free ``path-N``) without ever
    replacing an existing file; returns the name used."""
    for cand in _candidates(path) if rename else (path,):
        try:
            os.link(tmp, cand)  # atomic, and fails with EEXIST instead of replacing
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno not in _NO_LINK:
                raise
            # No hard links here (some FUSE/SMB mounts): reserve the name exclusively, then
            # rename over our own reservation. Readers may see an empty file for an instant.
            try:
                os.close(os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            except FileExistsError:
                continue
            os.replace(tmp, cand)
            return cand
        os.unlink(tmp)
        return cand
    raise FileExistsError(errno.EEXIST, "file exists", str(path))


def _fsync_dir(directory: Path) -> None:
    # Make the rename durable; best effort (not every platform can open a directory).
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class AtomicFile:
    """A context manager writing one file atomically; ``path`` is the name finally used.

    ``overwrite``: ``True`` replaces an existing file (atomically); ``False`` never touches an
    existing file and publishes under the first free name ``name-1.ext``, ``name-2.ext``, ...;
    ``"error"`` raises :class:`OutputError` when the name is taken. On an exception inside the
    block, the temporary file is removed and nothing is published.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     d = pathlib.Path(tmp)
    ...     with AtomicFile(d / "a.txt", "w") as fh:
    ...         _ = fh.write("one")
    ...     with AtomicFile(d / "a.txt", "w", overwrite=False) as fh:
    ...         _ = fh.write("two")
    ...     sorted(p.name for p in d.iterdir())
    ['a-1.txt', 'a.txt']
    """

    def __init__(self, path: os.PathLike[str] | str, mode: str = "wb", *, encoding: str | None = None,
                 overwrite: bool | str = True) -> None:
        if mode not in ("wb", "w"):
            raise ValueError("AtomicFile supports modes 'wb' and 'w'")
        if overwrite not in (True, False, "error"):
            raise ValueError("overwrite must be True, False or 'error'")
        self.path = Path(path)
        self.mode = mode
        self.encoding = encoding or ("utf-8" if mode == "w" else None)
        self.overwrite = overwrite
        self._tmp: str | None = None
        self._fh: IO[Any] | None = None

    def __enter__(self) -> IO[Any]:
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
            fd, self._tmp = _make_temp(path.parent, path.name)
        except OSError as e:
            raise output_error(path, e) from e
        self._fh = os.fdopen(fd, self.mode, encoding=self.encoding)
        return self._fh

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._fh is not None and self._tmp is not None
        tmp, fh = self._tmp, self._fh
        if exc_type is not None:
            with contextlib.suppress(OSError):
                fh.close()
            _silent_unlink(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, OmniprofError):
                raise output_error(self.path, exc) from exc
            return
        try:
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            if self.overwrite is True:
                os.replace(tmp, self.path)
            else:
                self.path = _publish_new(tmp, self.path, rename=self.overwrite is False)
            _fsync_dir(self.path.parent)
        except OSError as e:
            with contextlib.suppress(OSError):
                fh.close()
            _silent_unlink(tmp)
            raise output_error(self.path, e) from e


@contextlib.contextmanager
def atomic_open(path: os.PathLike[str] | str, mode: str = "wb", *, encoding: str | None = None,
                overwrite: bool | str = True) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for streaming writes; rename it over ``path`` on success.

    On an exception the temporary file is removed and ``path`` is untouched. ``overwrite`` is as
    for :class:`AtomicFile` (use the class to learn the name used when ``overwrite=False``).
    """
    with AtomicFile(path, mode, encoding=encoding, overwrite=overwrite) as fh:
        yield fh


def _silent_unlink(p: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(p)


def atomic_write_bytes(path: os.PathLike[str] | str, data: bytes, *, overwrite: bool | str = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path used (see :class:`AtomicFile`)."""
    f = AtomicFile(path, "wb", overwrite=overwrite)
    with f as fh:
        fh.write(data)
    return f.path


def atomic_write_text(path: os.PathLike[str] | str, text: str, *, overwrite: bool | str = True) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite)


def unique_path(path: os.PathLike[str] | str) -> Path:
    """``path`` if free, else ``name-1.ext``, ``name-2.ext``, ...

    Only a hint: another process may take the name before it is used. Writers publish with
    ``AtomicFile(overwrite=False)`` and directories with :func:`new_dir`, which re-check atomically.
    """
    path = Path(path)
    for cand in _candidates(path):
        if not cand.exists():
            return cand
    raise OutputError(f"cannot find a free file name beside {str(path)!r}")


def new_dir(path: os.PathLike[str] | str, *, flag: str = "-o DIR") -> Path:
    """Create a new directory at ``path``, or ``path-1``, ``path-2``, ... when taken; return it.

    Creation is atomic (``mkdir`` fails on an existing name), so two runs never share a directory.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for cand in _candidates(path):
            try:
                cand.mkdir()
                return cand
            except FileExistsError:
                continue
    except OSError as e:
        raise output_error(path, e, flag=flag) from e
    raise OutputError(f"cannot create a new directory beside {str(path)!r}")


def unique_run_dir(base: os.PathLike[str] | str, prefix: str | None = None, *, flag: str = "-o DIR") -> Path:
    """Create and return a new run directory under ``base``: ``YYYY_MM_DD_HH_MM_SS_<ms>[-n]``.

    Unlike jax (named to the second), two runs in the same second never share a directory.
    """
    stamp = strftime("%Y_%m_%d_%H_%M_%S", localtime())
    ms = int(wall_time() * 1000) % 1000
    return new_dir(Path(base) / f"{prefix + '_' if prefix else ''}{stamp}_{ms:03d}", flag=flag)


def hostname() -> str:
    import socket  # on first use: `import omniprof` stays light

    return socket.gethostname() or "localhost"


_PROCESS_TEMP_DIRS: list[str] = []


def process_temp_dir(prefix: str) -> Path:
    """A new temporary directory that lives until this process exits, then is removed.

    For native artifacts a backend writes when the user gave no logdir: reporters run after the
    session (``omniprof run -r tensorboard`` copies jax's own xplane), so the files must outlive
    it, but not the process. Give a logdir to keep them.
    """
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    if not _PROCESS_TEMP_DIRS:
        atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _PROCESS_TEMP_DIRS])
    _PROCESS_TEMP_DIRS.append(path)
    return Path(path)
