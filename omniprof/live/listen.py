"""On-demand capture: a process that called :func:`listen` runs a backend for a window when asked.

The request channel is a Unix socket, ``<runtime dir>/<pid>.sock``, in a directory of this user's
only (``/run/user/<uid>/omniprof`` or ``/tmp/omniprof-<uid>``, mode 0700, checked), the socket mode
0600; a peer of another uid (root excepted) is refused by its kernel credentials (``SO_PEERCRED``).
One capture at a time: a second request while one runs is refused, naming the first's collector.

Protocol (one exchange per connection): the collector sends one JSON line ``{"backend": "cpu",
"duration_ms": 500}``; the target answers one JSON line ``{"ok": true, "bytes": N}`` and N bytes of
the result's JSON, or ``{"ok": false, "error": "..."}``. A collector that goes away mid-capture
changes nothing: the window ends by itself and the profiler stops as after any session.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
import time
from typing import Any

from omniprof.errors import InvalidArgumentError, LiveTargetError, ProfilerStateError

__all__ = ["listen", "request_capture", "socket_path", "Listener", "BACKENDS"]

BACKENDS = ("cpu", "memory", "torch", "xla")
_MAX_REQUEST_BYTES = 4096


def runtime_dir(uid: int | None = None) -> str:
    """User ``uid``'s directory for listener sockets: ``/run/user/<uid>/omniprof`` where the system
    keeps per-user runtime directories, else ``/tmp/omniprof-<uid>``. Both sides compute it from the
    target's uid alone, so a collector finds a target's socket without reading its environment."""
    uid = os.geteuid() if uid is None else uid
    run = f"/run/user/{uid}"
    return os.path.join(run, "omniprof") if os.path.isdir(run) else f"/tmp/omniprof-{uid}"


def _private_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ProfilerStateError(f"{path} is not a directory of this user's only (mode 0700): remove it, and "
                                 f"omniprof.live.listen() makes it anew")
    return path


def socket_path(pid: int) -> str:
    """Where process ``pid`` listens (in its owner's runtime directory)."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = os.geteuid()
    return os.path.join(runtime_dir(uid), f"{pid}.sock")


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the connected peer, from the kernel."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


class Listener:
    """The serving thread (``omniprof-listener``); :meth:`close` stops it and removes the socket."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.busy_with: int | None = None  # the collector's pid while a capture runs
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)  # a previous process of this pid (pids are reused): ours now
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._sock.listen(4)
        self._thread = threading.Thread(target=self._serve, name="omniprof-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._handle, args=(conn,), name="omniprof-listener-request", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                peer_pid, peer_uid = _peer(conn)
                if peer_uid not in (os.geteuid(), 0):
                    return self._reply(conn, {"ok": False, "error": f"uid {peer_uid} may not capture this process"})
                req = json.loads(conn.makefile("rb").readline(_MAX_REQUEST_BYTES) or b"{}")
                backend, duration_ms = req.get("backend"), req.get("duration_ms")
                if backend not in BACKENDS or not isinstance(duration_ms, (int, float)) or duration_ms <= 0:
                    return self._reply(conn, {"ok": False, "error": f"bad request {req!r}: needs backend (one of "
                                                                    f"{', '.join(BACKENDS)}) and duration_ms > 0"})
                if not self._lock.acquire(blocking=False):
                    return self._reply(conn, {"ok": False, "error": f"a capture is already running in process "
                                                                    f"{os.getpid()}, for collector pid {self.busy_with}"})
                try:
                    self.busy_with = peer_pid
                    body = self._capture(backend, float(duration_ms)).encode()
                finally:
                    self.busy_with = None
                    self._lock.release()
                self._reply(conn, {"ok": True, "bytes": len(body)}, body)
            except (OSError, ValueError) as e:  # the collector went away, or sent garbage: nothing to undo
                try:
                    self._reply(conn, {"ok": False, "error": f"{type(e).__name__}: {e}"})
                except OSError:
                    pass
            except Exception as e:  # noqa: BLE001 - a backend that failed: say so, keep serving
                try:
                    self._reply(conn, {"ok": False, "error": f"backend {req.get('backend')!r} failed: {e}"})
                except OSError:
                    pass
            return None

    @staticmethod
    def _reply(conn: socket.socket, head: dict[str, Any], body: bytes = b"") -> None:
        conn.sendall(json.dumps(head).encode() + b"\n" + body)

    @staticmethod
    def _capture(backend: str, duration_ms: float) -> str:
        from omniprof.core.profiler import Profiler

        with Profiler(backend=backend) as p:
            time.sleep(duration_ms / 1000.0)
        return p.result.to_json()


_listener: Listener | None = None


def listen() -> str:
    """Serve capture requests from this user's collectors (``omniprof attach PID -b cpu``) in a daemon
    thread; returns the socket's path. Calling it again returns the same listener's path."""
    global _listener
    if _listener is None:
        _listener = Listener(os.path.join(_private_dir(runtime_dir()), f"{os.getpid()}.sock"))
    return _listener.path


def request_capture(pid: int, backend: str, duration_ms: float, timeout_s: float = 60.0) -> Any:
    """Ask process ``pid``'s listener for a ``backend`` capture of ``duration_ms``; its ProfileResult."""
    from omniprof.core.results import ProfileResult

    if backend not in BACKENDS:
        raise InvalidArgumentError(f"'backend' must be one of {', '.join(BACKENDS)} (got {backend!r})")
    path = socket_path(pid)
    if not os.path.exists(f"/proc/{pid}"):
        raise LiveTargetError(f"no process {pid} (it has exited, or the pid is wrong)", cause="gone")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(duration_ms / 1000.0 + timeout_s)
    try:
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise LiveTargetError(f"process {pid} is not listening (no {path}): start it with omniprof.live.listen() "
                                  f"in its code, or sample it from outside without -b", cause="not_listening") from None
        except PermissionError:
            raise LiveTargetError(f"permission denied connecting to {path}: it belongs to another user; run as that "
                                  f"user", cause="permission") from None
        s.sendall(json.dumps({"backend": backend, "duration_ms": duration_ms}).encode() + b"\n")
        f = s.makefile("rb")
        head = json.loads(f.readline() or b'{"ok": false, "error": "the process closed the connection"}')
        if not head.get("ok"):
            raise LiveTargetError(f"process {pid} refused the capture: {head.get('error')}", cause="refused")
        body = f.read(int(head["bytes"]))
    except socket.timeout:
        raise LiveTargetError(f"process {pid} did not answer within {duration_ms / 1000.0 + timeout_s:.0f} s (blocked "
                              f"in C, or holding the GIL?)", cause="timeout") from None
    finally:
        s.close()
    return ProfileResult.from_dict(json.loads(body))
