"""``omniprof attach PID``: sample a running CPython process from outside into a normal result."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from omniprof.errors import LiveTargetError

#: exit status when the target cannot be read (gone, not Python, no permission)
CANNOT_READ = 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser("attach", help="sample a running CPython 3.10-3.13 process from outside (until "
                                      "--duration-ms or Ctrl-C) and report it like a run",
                       usage="omniprof attach PID [-b BACKEND] [--duration-ms N] [--rate-hz HZ] [-r table,json,...] "
                             "[-o DIR]")
    p.add_argument("pid", type=int, metavar="PID", help="the process to sample (it needs no omniprof)")
    p.add_argument("--duration-ms", type=float, default=None, metavar="N",
                   help="stop after N milliseconds (default: until Ctrl-C or the process ends)")
    p.add_argument("--rate-hz", type=float, default=200.0, metavar="HZ", help="samples per second (default 200)")
    from omniprof.live.listen import BACKENDS

    p.add_argument("-b", "--backend", default=None, choices=BACKENDS,
                   help="run this backend inside the target for --duration-ms (default 1000) instead: the "
                        "target must listen (omniprof.live.listen())")
    p.add_argument("-r", "--reporter", action="append", default=[],
                   help="reporter(s), comma-separated or repeated (default: table)")
    p.add_argument("-R", "--reporter-option", action="append", default=[], metavar="REPORTER.KEY=VALUE",
                   help="option of one reporter")
    p.add_argument("-o", "--outdir", default=None, help="directory for file reports (default: the current one)")
    p.add_argument("--plugins", default=None, help="plugins.toml to use")
    p.add_argument("--no-plugin", action="append", default=[], metavar="NAME", help="switch a plugin off")


def attach(ns: argparse.Namespace) -> int:
    from omniprof.cli import _common as c
    from omniprof.live.attach import AttachOptions
    from omniprof.live.attach import attach as sample

    reg, reporters, ropts = c.chosen_reporters(ns)
    if ns.backend is not None:  # inside the target, through its listener
        from omniprof.live.listen import request_capture

        try:
            result = request_capture(ns.pid, ns.backend, ns.duration_ms or 1000.0)
        except LiveTargetError as e:
            print(f"omniprof: error: {e}", file=sys.stderr)
            return CANNOT_READ
        c.make_outdir(ns.outdir)
        return c.emit_reports(result, reporters, ropts, ns.outdir, reg)
    if not ns.rate_hz > 0:
        from omniprof.errors import UsageError

        raise UsageError(f"--rate-hz must be > 0 (got {ns.rate_hz})")
    opts = AttachOptions(interval_s=1.0 / ns.rate_hz,
                         duration_s=ns.duration_ms / 1000.0 if ns.duration_ms else None)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())  # Ctrl-C ends the capture, keeps the result
    def started(tick: int) -> None:
        if tick == 1 and opts.duration_s is None:  # the one line: how to end it
            print(f"omniprof: sampling process {ns.pid}; Ctrl-C to stop and report", file=sys.stderr, flush=True)

    try:
        result = sample(ns.pid, opts, stop, on_tick=started)
    except LiveTargetError as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return CANNOT_READ
    finally:
        signal.signal(signal.SIGINT, previous)
    summary = result.parts[0].summaries["overhead"]
    if summary.get("target_exited"):
        print(f"omniprof: process {ns.pid} exited during the capture; reporting what was sampled", file=sys.stderr)
    c.make_outdir(ns.outdir)
    return c.emit_reports(result, reporters, ropts, ns.outdir, reg)
