"""Who holds a TCP port: checked before a server starts, named when it cannot.

:func:`port_in_use` binds a probe socket the way a second server would without port sharing: it
fails while any socket of any process is bound to the port (gRPC servers set ``SO_REUSEPORT``, so
a second one would otherwise share the port silently). :func:`port_holder` names the process that
listens there, read from ``/proc`` (Linux; only processes this user may inspect), or None.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

__all__ = ["port_in_use", "port_holder", "listening_pids", "describe_holder"]

_LISTEN = "0A"


def port_in_use(port: int) -> bool:
    """True when a socket is already bound to TCP ``port`` on any interface (IPv4 or IPv6)."""
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine
            continue
        try:
            # SO_REUSEADDR: sockets lingering in TIME_WAIT do not count; a listener still does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
        finally:
            s.close()
    return False


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            try:
                if int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
            except (IndexError, ValueError):
                continue
    return inodes


def listening_pids(port: int) -> list[int]:
    """Pids of the processes with a socket listening on TCP ``port`` (those /proc lets us see)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in wanted:
                        pids.append(int(entry.name))
                        break
                except OSError:
                    continue
    return sorted(pids)


def port_holder(port: int) -> str | None:
    """``"pid 1234 (python train.py)"`` for the process(es) listening on ``port``, or None."""
    pids = listening_pids(port)
    return ", ".join(describe_holder(p) for p in pids) if pids else None


def describe_holder(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmd = " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    except OSError:
        cmd = ""
    if len(cmd) > 80:
        cmd = cmd[:77] + "..."
    me = " - this process" if pid == os.getpid() else ""
    return f"pid {pid}" + (f" ({cmd})" if cmd else "") + me
