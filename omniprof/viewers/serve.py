"""Serve a trace file to ui.perfetto.dev from 127.0.0.1 (``create_perfetto_link``, ``omniprof view --perfetto``).

ui.perfetto.dev opens ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/NAME`` and fetches
the file from the browser, which needs CORS headers naming its origin. The server binds
127.0.0.1 unless the caller names another address, serves only the one file, and can block until
the file was fetched once (with a timeout).
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import os
import re
import sys
import threading
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from omniprof.core.clock import monotonic
from omniprof.errors import InvalidArgumentError, OmniprofError, OmniprofWarning

__all__ = ["TraceFileServer", "perfetto_link", "PERFETTO_ORIGIN", "PERFETTO_PORT", "LOOPBACK", "check_bind_address",
           "is_loopback", "host_allowed", "serve_perfetto_link", "PerfettoLinkWarning"]

#: The address every omniprof server binds unless the user names another one.
LOOPBACK = "127.0.0.1"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str | None, bound_host: str) -> bool:
    """Whether a server bound to ``bound_host`` may answer a request carrying ``Host: host_header``.

    DNS rebinding: a web page on evil.example that resolves its name to 127.0.0.1 makes the browser
    send requests to a loopback server with ``Host: evil.example`` (and read the answers, same
    origin). A server on a loopback address answers only loopback names (``localhost``,
    ``127.x.y.z``, ``[::1]``, with any port); one the user bound elsewhere answers every name.
    Every omniprof server calls this one check and answers 421 when it is False.
    """
    if host_header is None or not is_loopback(bound_host):
        return True
    name = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    return is_loopback(name.strip("[]"))


def check_bind_address(host: object, what: str = "server") -> str:
    """Validate an address to bind; warn when it is not loopback. Returns it.

    Raises:
        InvalidArgumentError: ``host`` is not an IP address or host name.
    """
    if not isinstance(host, str) or not host:
        raise InvalidArgumentError(f"the {what} address must be an IP address or host name (got {host!r})")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.match(host):
            raise InvalidArgumentError(f"the {what} address {host!r} is neither an IP address nor a host name; "
                                       f"leave it out to bind {LOOPBACK}") from None
    if not is_loopback(host):
        warnings.warn(f"omniprof {what} binds {host}, not {LOOPBACK}: other machines on the network can reach "
                      f"it. Leave the address out to keep it on this machine", OmniprofWarning, stacklevel=3)
    return host

PERFETTO_ORIGIN = "https://ui.perfetto.dev"
#: The only port ui.perfetto.dev fetches ``?url=`` traces from (its content security policy allows
#: 127.0.0.1:9001 and localhost:9001): a link on any other port does not open there.
PERFETTO_PORT = 9001


class PerfettoLinkWarning(OmniprofWarning):
    """A Perfetto link could not be served, or was not opened; the files it names are saved."""


def _quiet_handle_error(request: object, client_address: object) -> None:
    """socketserver prints a traceback for every failed request; a client that disconnects (or
    sends garbage) is not the user's problem, so nothing is printed."""


def perfetto_link(port: int, name: str, host: str = "127.0.0.1") -> str:
    return f"{PERFETTO_ORIGIN}/#!/?url=http://{host}:{port}/{urllib.parse.quote(name)}"


class TraceFileServer:
    """Serves one file over HTTP with the headers ui.perfetto.dev needs.

    Args:
        path: the trace file.
        host: address to bind (default 127.0.0.1; anything else is the caller's explicit choice).
        port: port (0 picks a free one; read :attr:`port` after start).

    Use as a context manager or call start()/stop(). :meth:`wait_fetched` blocks until the file was
    served once or the timeout passes.
    """

    def __init__(self, path: str | os.PathLike[str], host: str = LOOPBACK, port: int = 9001) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise InvalidArgumentError(f"'port' must be an integer between 0 and 65535 (got {port!r})")
        check_bind_address(host, "trace server")
        self.path = Path(path)
        if not self.path.is_file():
            raise InvalidArgumentError(f"no trace file to serve at {str(self.path)!r}")
        self.host = host
        self._want_port = port
        self.fetched = threading.Event()
        self.fetch_count = 0
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            return self._want_port
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/{urllib.parse.quote(self.path.name)}"

    @property
    def link(self) -> str:
        return perfetto_link(self.port, self.path.name, self.host)

    def start(self) -> TraceFileServer:
        """Bind and serve in a background thread; returns self (already serving: nothing more)."""
        if self._httpd is not None:
            return self
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _cors(self) -> None:
                origin = self.headers.get("Origin")
                self.send_header("Access-Control-Allow-Origin", origin if origin == PERFETTO_ORIGIN else PERFETTO_ORIGIN)
                self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
                self.send_header("Access-Control-Allow-Headers", "*")
                self.send_header("Access-Control-Allow-Private-Network", "true")
                self.send_header("Cache-Control", "no-cache")

            def _host_ok(self) -> bool:
                if host_allowed(self.headers.get("Host"), server.host):
                    return True
                self.send_response(421)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False

            def do_OPTIONS(self) -> None:  # noqa: N802 - http.server API
                if not self._host_ok():
                    return
                self.send_response(204)
                self._cors()
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                if not self._host_ok():
                    return
                name = urllib.parse.unquote(urllib.parse.urlparse(self.path).path.lstrip("/"))
                if name != server.path.name:
                    self.send_response(404)
                    self._cors()
                    self.end_headers()
                    return
                data = server.path.read_bytes()
                self.send_response(200)
                self._cors()
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client went away: its business
                    return
                server.fetch_count += 1
                server.fetched.set()

            def log_message(self, format: str, *args: object) -> None:  # quiet by default
                pass

        try:
            self._httpd = http.server.ThreadingHTTPServer((self.host, self._want_port), Handler)
        except OSError as e:
            from omniprof.core.ports import port_holder

            holder = port_holder(self._want_port) if self._want_port else None
            held = f" (held by {holder})" if holder else ""
            fix = (f"stop that process, or open {self.path} in ui.perfetto.dev with 'Open trace file'"
                   if self._want_port == PERFETTO_PORT else "choose a free port")
            raise OmniprofError(f"cannot serve the trace on {self.host}:{self._want_port}: {e.strerror or e}{held}; "
                                f"{fix}") from e
        self._httpd.daemon_threads = True
        self._httpd.handle_error = _quiet_handle_error  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="omniprof-trace-server", daemon=True)
        self._thread.start()
        return self

    def wait_fetched(self, timeout_s: float | None) -> bool:
        """True once the file was served; False when ``timeout_s`` passed first."""
        return self.fetched.wait(timeout_s)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> TraceFileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_perfetto_link(path: str | os.PathLike[str], *, port: int = PERFETTO_PORT, wait: bool = True,
                        timeout_s: float = 300.0, saved: Sequence[str | os.PathLike[str]] = (),
                        stream: TextIO | None = None,
                        announce: Callable[[str], None] | None = None) -> TraceFileServer | None:
    """Serve a saved trace for ui.perfetto.dev and print ``Open URL in browser: LINK`` (as jax does).

    Call it only once everything is saved: it never raises for a busy port, a timeout or Ctrl-C.

    * The link goes to ``stream`` (default ``sys.stderr``) as one plain line, whatever the logging
      configuration, or to ``announce`` when given.
    * A port that cannot be bound is a :class:`PerfettoLinkWarning` naming the holder, the saved
      files (``path`` and ``saved``) and how to open them; returns None.
    * ``wait``: blocks until the trace was fetched once or ``timeout_s`` passed (a warning then).
      Ctrl-C ends the wait (the server stops; nothing is lost) and returns instead of raising.
      Without ``wait`` a daemon thread stops the server after the first fetch or the timeout.

    Returns the server (stopped when ``wait``), or None when it could not start.
    """
    path = Path(path)
    files = [str(path), *(str(p) for p in saved if str(p) != str(path))]
    kept = "; ".join(files)
    try:
        server = TraceFileServer(path, port=port).start()
    except OmniprofError as e:
        warnings.warn(f"the Perfetto link was not served: {e}. Nothing is lost, saved: {kept}. Later: "
                      f"omniprof view --perfetto {path}", PerfettoLinkWarning, stacklevel=_caller_level())
        return None
    out = stream if stream is not None else sys.stderr
    try:  # from here on Ctrl-C ends the wait, whatever line it arrives on
        line = f"Open URL in browser: {server.link}"
        if announce is not None:
            announce(line)
        else:
            out.write(line + "\n")
            if server.port != PERFETTO_PORT:
                out.write(f"omniprof: note: ui.perfetto.dev fetches traces only from 127.0.0.1:{PERFETTO_PORT}; "
                          f"this link on port {server.port} opens with a viewer that allows it, or load {path} "
                          f"with 'Open trace file'\n")
            out.flush()
        if not wait:
            def watch() -> None:
                try:
                    server.wait_fetched(timeout_s)
                finally:
                    server.stop()

            server.watcher = threading.Thread(target=watch, name="omniprof-perfetto-watch", daemon=True)
            server.watcher.start()
            return server
        deadline = monotonic() + timeout_s
        try:
            while not server.wait_fetched(min(0.25, max(0.0, deadline - monotonic()))):
                if monotonic() >= deadline:
                    warnings.warn(f"the Perfetto link was not opened within {timeout_s:g} s; saved: {kept}",
                                  PerfettoLinkWarning, stacklevel=_caller_level())
                    break
        finally:
            server.stop()
    except KeyboardInterrupt:
        server.stop()
        with contextlib.suppress(Exception):
            out.write(f"omniprof: stopped waiting for the Perfetto link (Ctrl-C); nothing is lost, saved: {kept}\n")
            out.flush()
    return server


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside omniprof (the user's ``with`` line or call)."""
    package = str(Path(__file__).resolve().parents[1])
    frame = sys._getframe(2)  # the caller of warnings.warn's caller
    level = 2
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame = frame.f_back
        level += 1
    return level
