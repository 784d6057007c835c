"""Serve a trace file to ui.perfetto.dev from 127.0.0.1 (``create_perfetto_link``, ``omniprof view --perfetto``).

ui.perfetto.dev opens ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/NAME`` and fetches
the file from the browser, which needs CORS headers naming its origin. The server binds
127.0.0.1 unless the caller names another address, serves only the one file, and can block until
the file was fetched once (with a timeout).
"""

from __future__ import annotations

import http.server
import ipaddress
import os
import re
import threading
import urllib.parse
import warnings
from pathlib import Path

from omniprof.errors import InvalidArgumentError, OmniprofError, OmniprofWarning

__all__ = ["TraceFileServer", "perfetto_link", "PERFETTO_ORIGIN", "LOOPBACK", "check_bind_address", "is_loopback"]

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
                # DNS rebinding: a web page on evil.example resolving its name to 127.0.0.1 still sends
                # "Host: evil.example". Served on loopback, only loopback names are answered.
                host = self.headers.get("Host")
                if host is None or not is_loopback(server.host):
                    return True
                name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
                if is_loopback(name.strip("[]")):
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
            raise OmniprofError(f"cannot serve the trace on {self.host}:{self._want_port}: {e.strerror or e}. "
                                f"Choose another port (port=0 picks a free one)") from e
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
