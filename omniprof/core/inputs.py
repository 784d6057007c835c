"""Opening input files safely: every reader goes through here.

A trace handed to ``omniprof report`` may be anything: a symlink loop, a device, a named pipe
nobody writes to, a gzip bomb. This module turns each into either bytes within known bounds or a
one-line :class:`TraceReadError` that names the cause and the bound:

* **what the path is**: a regular file is read; a pipe (``/dev/stdin`` fed by a pipe,
  ``<(zcat trace.json.gz)``, a named pipe that is being written) is read to its end, waiting at
  most :data:`STREAM_WAIT_S` for its first byte; a device (``/dev/zero``, a terminal), a socket,
  a symlink loop, a dangling link are each refused with their own message.
* **size**: at most ``OMNIPROF_MAX_INPUT_BYTES`` (default :data:`MAX_INPUT_BYTES`) are read or
  decompressed from one input.
* **small text inputs** (config files, ``plugins.toml``): :func:`read_small_file` reads only a
  regular file of at most :data:`MAX_TEXT_INPUT_BYTES`; anything else is refused before it is
  read, and a named pipe cannot make it wait.
* **decompression ratio**: gzip data may expand at most ``OMNIPROF_MAX_GZIP_RATIO`` times
  (default :data:`MAX_GZIP_RATIO`) once past :data:`RATIO_GRACE_BYTES`; a gzip bomb (1 MB that
  expands to GBs of one repeated byte) stops there, in constant memory. The ratio is measured on
  the compressed bytes the decompressor has consumed, not on those read ahead. Real results and
  Kineto traces compress 10-37 times (measured here); a reader holds several times the text it
  parses (the audit's 1.25 MB gzip of 2 M events expanded 160 times and took 1.19 GB under the old
  bound of 200), so the bound is what keeps memory proportional to the file.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import select
import stat
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from omniprof.core.clock import monotonic
from omniprof.errors import TraceReadError

__all__ = ["MAX_INPUT_BYTES", "MAX_GZIP_RATIO", "MAX_TEXT_INPUT_BYTES", "STREAM_WAIT_S", "check_input", "read_input",
           "open_input", "open_stream", "local_copy", "max_input_bytes", "read_small_file"]

MAX_INPUT_BYTES = 16 << 30
MAX_GZIP_RATIO = 100
RATIO_GRACE_BYTES = 64 << 20
STREAM_WAIT_S = 10.0
#: The most a config file or a plugins.toml may hold (a large pyproject.toml is ~100 KiB).
MAX_TEXT_INPUT_BYTES = 4 << 20
MAX_INPUT_ENV = "OMNIPROF_MAX_INPUT_BYTES"
MAX_RATIO_ENV = "OMNIPROF_MAX_GZIP_RATIO"
_CHUNK = 1 << 20


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise TraceReadError(f"{name} must be a number (got {raw!r})") from None
    if not value > 0 or value != value:
        raise TraceReadError(f"{name} must be > 0 (got {raw!r})")
    return value


def max_input_bytes() -> int:
    return int(_env_number(MAX_INPUT_ENV, MAX_INPUT_BYTES))


def _max_ratio() -> float:
    return _env_number(MAX_RATIO_ENV, MAX_GZIP_RATIO)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def check_input(path: os.PathLike[str] | str) -> os.stat_result:
    """``os.stat(path)`` for something a reader can read: a regular file, a directory or a pipe.

    Raises TraceReadError naming what the path is instead (missing, dangling link, symlink loop,
    device, socket, no permission).
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TraceReadError(f"{p!r} is a symbolic link loop (links that point at each other); give the file "
                                 f"itself") from None
        if e.errno == errno.ENOENT and os.path.islink(p):
            raise TraceReadError(f"{p!r} is a symbolic link to {os.readlink(p)!r}, which does not exist") from None
        if e.errno == errno.ENOENT:
            raise TraceReadError(f"no such file or directory: {p!r}") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise TraceReadError(f"cannot read {p!r}: permission denied") from None
        if e.errno == errno.ENAMETOOLONG:
            raise TraceReadError(f"cannot read {p[:80]!r}...: the file name is too long") from None
        raise TraceReadError(f"cannot read {p!r}: {e.strerror or e}") from None
    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISFIFO(mode):
        return st
    raise TraceReadError(f"{p!r} is {_kind(mode)}, not a trace file; give a file (or a pipe: `omniprof report <(zcat "
                         f"trace.json.gz)`)")


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a terminal or character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def read_small_file(path: os.PathLike[str] | str, *, what: str, limit: int = MAX_TEXT_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes: a config file, a ``plugins.toml``.

    ``what`` names the input in messages ("config file"). ``/dev/zero``, a terminal, a named pipe
    (which would wait for a writer forever), a directory or a socket is refused without being read;
    so is a file longer than ``limit`` (checked on its size, then while reading: a file that grows
    is cut off at ``limit + 1`` bytes, never read whole).

    Raises:
        TraceReadError: the input is not a regular file, or is over ``limit`` (the message names
            what it is, or the bound).
        OSError: the file cannot be opened (missing, no permission): the caller words it.
    """
    name = os.fspath(path)

    def refuse(mode: int) -> TraceReadError:
        return TraceReadError(f"{name!r} is {_kind(mode)}, not a {what}; give a regular file")

    def too_big() -> TraceReadError:
        return TraceReadError(f"{name!r} is over {_mib(limit)}, the bound on a {what}; give the {what} itself")

    st = os.stat(name)
    if not stat.S_ISREG(st.st_mode):
        raise refuse(st.st_mode)
    if st.st_size > limit:
        raise too_big()
    # O_NONBLOCK: a path swapped for a named pipe after the stat opens at once instead of waiting
    # for a writer; fstat then refuses it.
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(st.st_mode)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise too_big()
    return b"".join(chunks)


def _wait_first_byte(fd: int, name: str) -> None:
    deadline = monotonic() + STREAM_WAIT_S
    while True:
        left = deadline - monotonic()
        if left <= 0:
            raise TraceReadError(f"{name!r} is a pipe and nothing was written to it within {STREAM_WAIT_S:g} s; "
                                 f"start the program that writes it first, or give a file")
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            return


class _Bounded(io.RawIOBase):
    """A readable byte stream over ``raw`` that stops with TraceReadError past ``limit`` bytes, and
    (``gzip=True``) decompresses, bounded in size and expansion ratio."""

    def __init__(self, raw: IO[bytes], name: str, limit: int, gzip: bool) -> None:
        self.raw = raw
        self.name = name
        self.limit = limit
        self.ratio = _max_ratio() if gzip else 0.0
        self.zobj = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        self.n_in = 0
        self.n_out = 0
        self.pending = b""
        self.done = False

    def readable(self) -> bool:
        return True

    def _raw(self) -> bytes:
        try:
            data = self.raw.read(_CHUNK)
        except OSError as e:
            raise TraceReadError(f"cannot read {self.name!r}: {e.strerror or e}") from None
        self.n_in += len(data)
        return data

    def _feed(self) -> bytes:
        """The next piece of output (b"" at the end)."""
        if self.zobj is None:
            return self._raw()
        while True:
            if self.zobj.eof:  # a member ended: another may follow (concatenated .gz), or zero padding
                data = self.zobj.unused_data or self._raw()
                while data and not data.strip(b"\x00"):
                    data = self._raw()
                if not data:
                    return b""
                self.zobj = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif self.zobj.unconsumed_tail:
                data = self.zobj.unconsumed_tail
            else:
                data = self._raw()
                if not data:
                    raise TraceReadError(f"{self.name}: corrupt or truncated gzip data: the compressed data ends "
                                         f"early")
            try:
                out = self.zobj.decompress(data, _CHUNK)
            except zlib.error as e:
                raise TraceReadError(f"{self.name}: corrupt or truncated gzip data: {e}") from None
            if out:
                return out

    def _consumed(self) -> int:
        """Compressed bytes the decompressor has used (those read ahead are not counted)."""
        z = self.zobj
        return self.n_in - (len(z.unconsumed_tail) + len(z.unused_data) if z is not None else 0)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if not self.pending and not self.done:
            self.pending = self._feed()
            if not self.pending:
                self.done = True
            self.n_out += len(self.pending)
            if self.n_out > self.limit:
                raise TraceReadError(
                    f"{self.name}: more than {_mib(self.limit)} to read (the input size bound; "
                    f"set {MAX_INPUT_ENV}=BYTES to read more)")
            if self.ratio and self.n_out > RATIO_GRACE_BYTES and self.n_out > self.ratio * max(self._consumed(), 1):
                raise TraceReadError(
                    f"{self.name}: the gzip data expands more than {self.ratio:g} times ({_mib(self._consumed())} to over "
                    f"{_mib(self.n_out)}): a gzip bomb? (the decompression ratio bound; set {MAX_RATIO_ENV}=N "
                    f"to allow more)")
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.raw.close()
        super().close()


def open_stream(path: os.PathLike[str] | str, *, limit: int | None = None, decompress: bool = True) -> IO[bytes]:
    """A buffered binary stream of ``path``'s content (gunzipped when it starts with the gzip
    magic and ``decompress``), bounded as the module says; the caller closes it. Reads raise
    TraceReadError (never a bare OSError)."""
    name = os.fspath(path)
    st = check_input(name)
    if stat.S_ISDIR(st.st_mode):
        raise TraceReadError(f"{name!r} is a directory, not a trace file")
    bound = max_input_bytes() if limit is None else limit
    if stat.S_ISREG(st.st_mode) and st.st_size > bound and not decompress:
        raise TraceReadError(f"{name}: the file is {_mib(st.st_size)}, more than the {_mib(bound)} this reader "
                             f"accepts (the input size bound; set {MAX_INPUT_ENV}=BYTES to read more)")
    try:
        if stat.S_ISFIFO(st.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
            try:
                _wait_first_byte(fd, name)
                os.set_blocking(fd, True)
            except BaseException:
                os.close(fd)
                raise
            raw: IO[bytes] = os.fdopen(fd, "rb", buffering=0)
        else:
            raw = open(name, "rb", buffering=0)
    except OSError as e:
        raise TraceReadError(f"cannot read {name!r}: {e.strerror or e}") from None
    buffered = io.BufferedReader(raw)  # type: ignore[arg-type]
    try:
        gz = decompress and buffered.peek(2)[:2] == b"\x1f\x8b"
    except OSError as e:
        buffered.close()
        raise TraceReadError(f"cannot read {name!r}: {e.strerror or e}") from None
    return io.BufferedReader(_Bounded(buffered, name, bound, gz), buffer_size=_CHUNK)


@contextlib.contextmanager
def open_input(path: os.PathLike[str] | str, *, limit: int | None = None, decompress: bool = True
               ) -> Iterator[IO[bytes]]:
    """:func:`open_stream` as a context manager."""
    stream = open_stream(path, limit=limit, decompress=decompress)
    try:
        yield stream
    finally:
        stream.close()


def read_input(path: os.PathLike[str] | str, *, limit: int | None = None, decompress: bool = True) -> bytes:
    """All of ``path``'s content (see :func:`open_input`)."""
    with open_input(path, limit=limit, decompress=decompress) as fh:
        try:
            return fh.read()
        except OSError as e:
            if isinstance(e, TraceReadError):
                raise
            raise TraceReadError(f"cannot read {os.fspath(path)!r}: {e.strerror or e}") from None


@contextlib.contextmanager
def local_copy(path: os.PathLike[str] | str) -> Iterator[Path]:
    """``path`` itself when it is a file or directory; for a pipe, a temporary file holding what
    was read from it (readers read a file more than once: to detect its format, then to parse)."""
    p = Path(path)
    st = check_input(p)
    if not stat.S_ISFIFO(st.st_mode):
        yield p
        return
    with tempfile.TemporaryDirectory(prefix="omniprof-input-") as tmp:
        copy = Path(tmp) / (p.name if p.name not in ("", ".", "..") else "input")
        with open_input(p, decompress=False) as src, open(copy, "wb") as dst:
            while True:
                chunk = src.read(_CHUNK)
                if not chunk:
                    break
                dst.write(chunk)
        yield copy
