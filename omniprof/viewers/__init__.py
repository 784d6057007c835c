"""Viewers: servers that show a saved profile in a browser. Started only by the CLI (``omniprof
view``) or by an explicit :func:`view` call; no backend or reporter starts one.

- :class:`~omniprof.viewers.serve.TraceFileServer`: one trace file, for ui.perfetto.dev;
- :class:`~omniprof.viewers.xprof.XProfServer`: XProf's UI over a logdir.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["view", "open_views"]


def view(target: Any, *, host: str = "127.0.0.1", port: int | None = None, verbose: bool = False) -> Any:
    """Serve a profile for its viewer in a background thread and return the running server.

    - a directory (a ``--logdir``, or what ``-r tensorboard`` wrote): XProf's UI on it; open
      ``server.url``;
    - a trace file (``.perfetto-trace``, Chrome JSON): served for ui.perfetto.dev; open
      ``server.link``;
    - a :class:`~omniprof.ProfileResult`: written as a Perfetto trace to a temporary file (removed
      when the process exits) and served the same way.

    The server binds ``host`` (127.0.0.1 unless you name another address) on ``port`` (default
    9001 for Perfetto, which ui.perfetto.dev fetches from, 6006 for XProf; 0 picks a free one).
    Stop it with ``server.stop()``, or use it as a context manager::

        with omniprof.view(result) as server:
            print(server.link)
            input("press Enter when done")

    Raises:
        InvalidArgumentError: the target is neither a directory, a file nor a result; a bad port.
        OmniprofError: the port cannot be bound, or XProf is not installed (for a directory).
    """
    from omniprof.core.results import ProfileResult
    from omniprof.errors import InvalidArgumentError

    if isinstance(target, ProfileResult):
        from omniprof.core.fileio import process_temp_dir
        from omniprof.core.reporting import report

        target = report(target, "perfetto", process_temp_dir("omniprof-view-") / "profile.perfetto-trace")
    if not isinstance(target, (str, os.PathLike)):
        raise InvalidArgumentError(f"omniprof.view() takes a ProfileResult, a trace file or a logdir "
                                   f"(got {type(target).__name__})")
    path = Path(target)
    if path.is_dir():
        from omniprof.viewers.xprof import XProfServer

        return XProfServer(path, host=host, port=6006 if port is None else port, verbose=verbose).start()
    if path.is_file():
        from omniprof.viewers.serve import TraceFileServer

        return TraceFileServer(path, host=host, port=9001 if port is None else port).start()
    raise InvalidArgumentError(f"omniprof.view(): nothing at {str(path)!r}; give a trace file, a logdir "
                               f"or a ProfileResult")


def open_views(requests: Sequence[Mapping[str, Any]], saved: Sequence[str]) -> None:
    """Open what backends asked to show once a Profiler saved the result (the xla backend's
    ``create_perfetto_link``: a Perfetto link to its trace). The Profiler's viewer (``viewer=``, or
    the default the front ends install with ``omniprof.core.views.set_default_viewer``).

    Never raises: a port that cannot be bound, a timeout or Ctrl-C are said and lose nothing.
    """
    for req in requests:
        if req.get("viewer") != "perfetto_link":
            continue
        from omniprof.viewers.serve import serve_perfetto_link

        serve_perfetto_link(req["path"], port=req["port"], wait=req["wait"], timeout_s=req["timeout_s"],
                            saved=[*req.get("saved", ()), *saved])
