"""XProf's web UI over a logdir, bound to 127.0.0.1 (``omniprof view LOGDIR``).

Started only by the CLI or an explicit call (:class:`XProfServer`, :func:`serve_logdir`); the
logdir comes from the ``tensorboard`` reporter, ``--logdir`` or ``jax.profiler``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omniprof.errors import InvalidArgumentError, OmniprofError

__all__ = ["XProfServer", "serve_logdir"]


# -- the server -------------------------------------------------------------------------------------
class _DropRequestLog:
    """A stream for XProf's per-request JSON log lines: dropped unless verbose."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def write(self, text: str) -> int:
        if self.verbose:
            sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        if self.verbose:
            sys.stderr.flush()


@contextlib.contextmanager
def _quiet_xprof(verbose: bool) -> Iterator[None]:
    """Keep absl/XProf logging quiet unless verbose (TF_CPP_MIN_LOG_LEVEL must precede the import)."""
    import logging

    names = ("tensorboard.plugins.profile", "tensorboard-plugin-profile", "tensorboard")
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        for name in names:
            # A handler present before import stops XProf adding its own stderr handler.
            log = logging.getLogger(name)
            if not log.handlers:
                log.addHandler(logging.NullHandler())
            log.propagate = False
    yield
    if not verbose:
        for name in names:
            logging.getLogger(name).setLevel(logging.CRITICAL)


# -- what a request may ask of the viewer -------------------------------------------------------------
#: XProf's routes that only read the viewed logdir (or serve the UI's own files). Every other route it
#: has is refused: ``/capture_profile`` dials the ``service_addr`` a request names (any host:port; a
#: plain ``<img src>`` on any web page sends it) and writes the capture into the logdir;
#: ``/generate_cache`` writes tool caches under a ``session_path`` the request names. A route a later
#: XProf adds is refused until it is known to only read.
_READ_ONLY_ROUTES = frozenset({
    "/", "/index.js", "/index.html", "/bundle.js", "/styles.css", "/materialicons.woff2",
    "/material_symbols_outlined.woff2", "/trace_viewer_index.html", "/trace_viewer_index.js", "/trace_viewer_v2.js",
    "/trace_viewer_v2.wasm", "/zone.js", "/runtime.js", "/data", "/data_csv", "/version", "/runs", "/run_tools",
    "/hosts", "/module_list", "/local", "/config",
})
#: Query arguments that point XProf at a directory or URL of the request's choosing instead of the logdir.
_PATH_ARGS = ("session_path", "run_path")
_PREFIX = "/data/plugin/profile"


def _route(path: str) -> str:
    """The key XProf's dispatcher (``xprof.server.make_wsgi_app``) looks ``path`` up with."""
    if path == _PREFIX or path.startswith(_PREFIX + "/"):
        path = path[len(_PREFIX):]
    if path != "/" and path.endswith("/"):
        path = path[:-1]
    return path


def _refusal(environ: dict[str, Any], routes: set[str]) -> tuple[str, str] | None:
    """(HTTP status, reason) when the request must not reach XProf, else None."""
    from urllib.parse import parse_qsl

    if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
        return "405 Method Not Allowed", "this viewer only reads: GET and HEAD"
    route = _route(environ.get("PATH_INFO", ""))
    if route in routes and route not in _READ_ONLY_ROUTES:
        return "403 Forbidden", (f"{route} is switched off in omniprof's viewer: it would make the server contact "
                                 f"other machines or write files. Capture with omniprof collect")
    for key, value in parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True):
        if key in _PATH_ARGS:
            return "403 Forbidden", f"'{key}' is refused: this viewer serves only its logdir"
        if key == "run" and (value.startswith(("/", "\\")) or "://" in value
                             or ".." in value.replace("\\", "/").split("/")):
            return "403 Forbidden", f"run {value!r} leads outside the logdir"
    return None


def _guarded(app: Any, bound_host: str, routes: set[str]) -> Any:
    """XProf's WSGI ``app`` behind omniprof's checks: the loopback ``Host`` check every omniprof
    server makes (421, DNS rebinding), and only the routes and arguments that read the logdir."""
    from omniprof.viewers.serve import host_allowed

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if not host_allowed(environ.get("HTTP_HOST"), bound_host):
            refused: tuple[str, str] | None = ("421 Misdirected Request", "")
        else:
            refused = _refusal(environ, routes)
        if refused is None:
            return app(environ, start_response)
        status, reason = refused
        body = reason.encode("utf-8")
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return guarded


class XProfServer:
    """XProf's web UI over ``logdir``, bound to ``host`` (127.0.0.1 unless you name another address).

    Unlike the stock ``xprof`` command, which binds every interface and also opens a gRPC port, this
    serves only the UI, on the address given. ``port=0`` picks a free port (read :attr:`port`).

    Use as a context manager, or :meth:`start` / :meth:`stop`; :func:`serve_logdir` blocks.

    Raises:
        OmniprofError: xprof is not installed, or the address cannot be bound.
    """

    def __init__(self, logdir: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 6006,
                 *, verbose: bool = False) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise InvalidArgumentError(f"'port' must be an integer between 0 and 65535 (got {port!r})")
        from omniprof.viewers.serve import check_bind_address

        check_bind_address(host, "XProf viewer")  # a malformed address is refused; a non-loopback one warned
        self.logdir = Path(logdir).expanduser().resolve()
        if not self.logdir.is_dir():
            raise InvalidArgumentError(f"no logdir at {str(logdir)!r}: give a directory written by the tensorboard "
                                       f"reporter or jax.profiler (it holds plugins/profile/<run>/)")
        self.host = host
        self._want_port = port
        self.verbose = verbose
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            return self._want_port
        return int(self._server.bind_addr[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def _app(self) -> Any:
        with _quiet_xprof(self.verbose):
            try:
                from xprof import profile_plugin, profile_plugin_loader
                from xprof import server as xprof_server
                from xprof.standalone import base_plugin, plugin_event_multiplexer
            except ImportError as e:
                raise OmniprofError(f"cannot start XProf: {e}. Install it with: pip install 'omniprof[tensorboard]'") from e
        logdir = str(self.logdir)
        context = base_plugin.TBContext(logdir, plugin_event_multiplexer.DataProvider(logdir),
                                        base_plugin.TBContext.Flags(False))
        context.hide_capture_profile_button = True
        context.enable_tab_name_label = False
        context.src_prefix = None
        plugin = profile_plugin_loader.ProfilePluginLoader().load(context)
        # XProf writes one JSON line per request to the stderr it saw at import; route those lines
        # through a stream that drops them unless verbose. Its default arguments are read when the
        # routes are built, so the swap is undone right after.
        wrapper = getattr(profile_plugin, "_logging_wrapper", None)
        defaults = getattr(wrapper, "__defaults__", None)
        if defaults is not None and len(defaults) == 2:
            wrapper.__defaults__ = (defaults[0], _DropRequestLog(self.verbose))  # type: ignore[union-attr]
        try:
            return _guarded(xprof_server.make_wsgi_app(plugin), self.host, set(plugin.get_plugin_apps()))
        finally:
            if defaults is not None and len(defaults) == 2:
                wrapper.__defaults__ = defaults  # type: ignore[union-attr]

    def start(self) -> XProfServer:
        """Bind and serve in a background thread; returns self (already serving: nothing more)."""
        if self._server is not None:
            return self
        from cheroot import wsgi

        app = self._app()
        server = wsgi.Server((self.host, self._want_port), app)
        try:
            server.prepare()
        except OSError as e:
            raise OmniprofError(f"cannot serve XProf on {self.host}:{self._want_port}: {e.strerror or e}. "
                                f"Choose another port (--port 0 picks a free one)") from e
        self._server = server
        self._thread = threading.Thread(target=server.serve, name="omniprof-xprof-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and wait for the server's threads."""
        if self._server is not None:
            self._server.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> XProfServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_logdir(logdir: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 6006, *,
                 verbose: bool = False, on_ready: Any = None) -> None:
    """Serve XProf over ``logdir`` until interrupted (Ctrl-C). Binds 127.0.0.1 unless told otherwise.

    Args:
        logdir: a directory holding ``plugins/profile/<run>/<host>.xplane.pb``.
        host: address to bind.
        port: port (0: a free one).
        verbose: let XProf log every request and absl messages.
        on_ready: called with the :class:`XProfServer` once it listens (e.g. to print its URL).
    """
    server = XProfServer(logdir, host, port, verbose=verbose).start()
    try:
        if on_ready is not None:
            on_ready(server)
        while server._thread is not None and server._thread.is_alive():
            server._thread.join(timeout=0.5)
    finally:
        server.stop()
