"""``omniprof view``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from omniprof.errors import UsageError


def view(ns: argparse.Namespace) -> int:
    if ns.timeout_s is not None and not 0 < ns.timeout_s < float("inf"):  # nan too: it would serve forever
        raise UsageError(f"omniprof view: --timeout-s must be a number of seconds > 0 (got {ns.timeout_s}); leave it "
                         f"out to serve until Ctrl-C")
    if ns.perfetto:
        return _view_perfetto(ns)
    return _view_logdir(ns)


def _view_logdir(ns: argparse.Namespace) -> int:
    from omniprof.reporters.tensorboard import xplane_files
    from omniprof.viewers.xprof import serve_logdir

    path = Path(ns.path)
    if not path.is_dir():
        raise UsageError(f"omniprof view: {ns.path!r} is not a directory; give an XProf logdir "
                         f"(write one with: omniprof run -r tensorboard -o LOGDIR script.py)")
    if not xplane_files(path):
        print(f"omniprof: no runs under {path} yet (expected plugins/profile/<run>/<host>.xplane.pb); "
              f"XProf lists runs written later", file=sys.stderr)

    import contextlib

    from omniprof.cli.progress import progress

    # Importing XProf and building its app takes seconds: a spinner on a terminal until it listens.
    starting = contextlib.ExitStack()
    starting.enter_context(progress(f"starting XProf on {path}"))

    def ready(server: Any) -> None:
        starting.close()
        print(f"omniprof: XProf serving {path} at {server.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)

    try:
        with starting:
            serve_logdir(path, ns.host, 6006 if ns.port is None else ns.port, verbose=ns.verbose, on_ready=ready)
    except KeyboardInterrupt:
        print("omniprof: XProf stopped", file=sys.stderr)
    return 0


def _view_perfetto(ns: argparse.Namespace) -> int:
    """Serve one trace file on 127.0.0.1 for ui.perfetto.dev and print the link that opens it."""
    import time

    from omniprof.core.clock import monotonic
    from omniprof.viewers.serve import TraceFileServer

    path = Path(ns.path)
    if not path.is_file():
        what = "a directory" if path.is_dir() else "not found"
        raise UsageError(f"omniprof view --perfetto: {str(path)!r} is {what}; give a trace file "
                         f"(e.g. trace.perfetto-trace written by -r perfetto)")
    server = TraceFileServer(path, host=ns.host, port=9001 if ns.port is None else ns.port)
    with server:
        print(f"omniprof: serving {path} at {server.url} (only this file)", file=sys.stderr)
        print(f"Open in Perfetto: {server.link}", flush=True)
        if ns.host != "127.0.0.1" or server.port != 9001:
            print("omniprof: note: ui.perfetto.dev fetches traces only from 127.0.0.1:9001; another address or "
                  "port works for other viewers, or open the file with Perfetto's 'Open trace file'", file=sys.stderr)
        print("omniprof: press Ctrl-C to stop" + (" (stops after the first fetch)" if ns.once else ""), file=sys.stderr)
        deadline = None if ns.timeout_s is None else monotonic() + ns.timeout_s
        try:
            while True:
                left = None if deadline is None else deadline - monotonic()
                if left is not None and left <= 0:
                    break
                step = 0.25 if left is None else min(0.25, left)
                if not ns.once:
                    time.sleep(step)
                elif server.wait_fetched(step):
                    print("omniprof: the trace was fetched; stopping", file=sys.stderr)
                    return 0
        except KeyboardInterrupt:
            print("omniprof: stopped", file=sys.stderr)
            return 0
    if ns.once:
        print(f"omniprof: error: nobody fetched the trace within {ns.timeout_s:g} s", file=sys.stderr)
        return 1
    return 0
