"""``omniprof doctor``: the report's lines are printed as they are found, the first at once; on a
terminal, stderr names each slow probe while it runs (a backend importing its framework)."""

from __future__ import annotations

import argparse
import sys

from omniprof.cli import _common as c


def doctor(ns: argparse.Namespace) -> int:
    from omniprof.core.doctor import doctor_rows, format_lines, run_doctor

    frameworks = not ns.no_frameworks
    if ns.json:
        import json

        print(json.dumps(run_doctor(c.registry(ns), frameworks=frameworks).to_dict(), indent=2))
        return 0
    status = _Status(sys.stderr)
    rows = doctor_rows(_LazyRegistry(ns), frameworks=frameworks, on_probe=status.show)
    for line in format_lines(rows):
        status.clear()
        print(line, flush=True)
    status.clear()
    return 0


class _LazyRegistry:
    """The command's registry, made when a backend is first asked for (after the first lines are out)."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self._ns = ns
        self._reg = None

    def __getattr__(self, name: str) -> object:
        if self._reg is None:
            self._reg = c.registry(self._ns)
        return getattr(self._reg, name)


class _Status:
    """One line on a terminal's stderr naming the probe that runs now, erased before the next output line."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.shown = 0

    def show(self, what: str) -> None:
        if self.tty:
            self.clear()
            text = f"omniprof doctor: probing {what} ..."
            self.stream.write(text)  # type: ignore[attr-defined]
            self.stream.flush()  # type: ignore[attr-defined]
            self.shown = len(text)

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")  # type: ignore[attr-defined]
            self.stream.flush()  # type: ignore[attr-defined]
            self.shown = 0
