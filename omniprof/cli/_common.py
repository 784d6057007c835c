"""What the commands share: the registry from --plugins/--no-plugin, -R parsing, writing reports."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from omniprof.errors import OmniprofError, UsageError

#: Set when a run was ended by SIGTERM; main() then dies of SIGTERM itself (as python would).
terminated_by: int | None = None
#: Set when the reader of standard output went away (``| head``): main() then ends quietly with
#: status 141 once everything else (file reports) is written.
pipe_closed: bool = False

#: ``sys.stdout`` when the command began, before any program ran: text reports go there even when
#: the program replaced ``sys.stdout`` (:func:`omniprof.core.text.report_stdout`).
started_stdout: Any = None

#: The exit status of a command whose reader went away: 128 + SIGPIPE, what a shell reports for
#: git, cat or seq cut short by ``| head``.
PIPE_CLOSED_STATUS = 141


def broken_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to a pipe (or socket) whose reader is gone: Python's
    BrokenPipeError, or our OutputError carrying EPIPE."""
    import errno

    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EPIPE)


def reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe or socket whose reader has gone away (``poll`` says POLLERR
    there), so the next write would fail with EPIPE."""
    import select

    if not hasattr(select, "poll"):
        return False
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def note_terminated(e: Any) -> int:
    """A run ended by SIGTERM (:class:`omniprof.runner.Terminated`): say so; the exit status."""
    global terminated_by
    terminated_by = e.signum
    print(f"omniprof: {e}; the profile so far is kept (marked partial)", file=sys.stderr)
    return 128 + e.signum


def registry(ns: argparse.Namespace) -> Any:
    """The command's registry, from ``--plugins``/``--no-plugin``. Commands pass it down explicitly
    (readers, reporters, the runner): the process-wide default (``get_registry()``) is left alone."""
    from omniprof.core.registry import Registry

    reg = Registry(plugins_file=ns.plugins, disable=ns.no_plugin)
    known = {n for kind in ("backend", "reporter") for n in reg.names(kind, include_disabled=True)}
    for name in ns.no_plugin or ():
        if name not in known:
            from omniprof.core.validators import nearest

            near = nearest(name, known)
            raise UsageError(f"--no-plugin {name!r}: no plugin of that name" + (f"; did you mean {near!r}?" if near else "")
                             + f" (plugins: {', '.join(sorted(known))})")
    return reg


def csv(values: list[str], default: list[str]) -> list[str]:
    out = [x.strip() for v in values for x in v.split(",") if x.strip()]
    return out or default


def chosen_reporters(ns: argparse.Namespace) -> tuple[Any, list[str], dict[str, dict[str, Any]]]:
    """(registry, reporter names, their options) from ``-r``/``-R``/``--plugins``; unknown names fail here."""
    reg = registry(ns)
    reporters = csv(ns.reporter, ["table"])
    ropts = reporter_options(ns.reporter_option, reporters)
    for name in reporters:
        reg.reporter(name)  # fail early on unknown names
    return reg, reporters, ropts


def reporter_options(items: list[str], reporters: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = kv(item, "-R")
        name, dot, rest = key.partition(".")
        if not dot:
            raise UsageError(f"-R expects REPORTER.KEY=VALUE (got {item!r})")
        if name not in reporters:
            raise UsageError(f"-R {key}: reporter {name!r} is not selected (selected: {', '.join(reporters)})")
        out.setdefault(name, {})[rest] = value
    return out


def check_output_dir(path: str, flag: str) -> None:
    """Before anything runs: the directory ``path`` (made when missing, as it would be later) takes
    a new file. Otherwise a :class:`UsageError` naming the path, why, and that nothing was run, so a
    long run is never thrown away for an output it could not have written."""
    import tempfile

    from omniprof.core.fileio import output_error

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".omniprof-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{output_error(path, e, flag=flag)} (nothing was run)") from e


def emit_reports(result: Any, reporters: list[str], ropts: dict[str, dict[str, Any]], outdir: str | None,
                  registry: Any) -> int:
    """Write each report: text ones to standard output, file ones into ``outdir`` (made when
    missing). A report that fails prints one error line and the others are still written; the
    status is 1 when any failed."""
    from omniprof.core.reporting import make_reporter, report

    status = 0
    for name in reporters:
        try:
            rep = make_reporter(name, ropts.get(name), registry)
            if rep.output == "stream":  # text reports go to the terminal; files to the output directory
                from omniprof.core.text import report_stdout

                report(result, name, report_stdout(started_stdout), options=ropts.get(name), registry=registry)
            else:
                make_outdir(outdir)  # -o names a directory: create it, so reports go inside, not over it
                from omniprof.cli.progress import progress

                # A file report can take a while (the tensorboard reporter's XProf conversion of a
                # big trace): a spinner on a terminal once it has run 0.3 s.
                with progress(f"writing the {name} report"):
                    path = report(result, name, Path(outdir) if outdir else None, options=ropts.get(name),
                                  registry=registry, overwrite=False)
                print(f"omniprof: {name} report written to {path}", file=sys.stderr)
                if getattr(rep, "name", "") in ("perfetto", "chrome"):
                    print(f"omniprof: open it with: omniprof view --perfetto {path}", file=sys.stderr)
        except OmniprofError as e:
            if broken_pipe(e):  # `| head` went away: the other reports are still written
                global pipe_closed
                pipe_closed = True
                continue
            print(f"omniprof: error: {e}", file=sys.stderr)
            status = 1
    return status


def emit_to_file(result: Any, name: str, options: dict[str, Any], path: str, registry: Any) -> int:
    """Write one report to the file a config names (a free name beside it if it exists)."""
    from omniprof.core.reporting import report

    from omniprof.cli.progress import progress

    try:
        with progress(f"writing the {name} report"):
            written = report(result, name, path, options=options, registry=registry, overwrite=False)
    except OmniprofError as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return 1
    print(f"omniprof: {name} report written to {written}", file=sys.stderr)
    return 0


def make_outdir(outdir: str | None) -> None:
    """``-o DIR`` names a directory: make it when missing (rather than writing a file called DIR)."""
    if outdir is None:
        return
    from omniprof.core.fileio import output_error

    try:
        Path(outdir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(outdir, e) from e


def print_user_traceback() -> None:
    """Print the target's traceback as python would, without omniprof's and runpy's frames."""
    etype, value, tb = sys.exc_info()
    print_exception(etype, value, tb)


def print_exception(etype: Any, value: Any, tb: Any) -> None:
    frames = traceback.extract_tb(tb)
    pkg = str(Path(__file__).resolve().parent.parent)

    def own(f: Any) -> bool:
        return f.filename.startswith(pkg)

    def plumbing(f: Any) -> bool:  # the context-manager machinery omniprof's annotations run through
        return f.filename.endswith(os.sep + "contextlib.py")

    # Where the program's last frame called into omniprof (an annotation's exit, say) and the error
    # arose below it, what lies below is omniprof's doing: the traceback ends at the program's line,
    # not in contextlib's frames between omniprof's own (a Ctrl-C landing in an annotation's exit).
    last = max((i for i, f in enumerate(frames) if not own(f) and not plumbing(f)), default=-1)
    if any(own(f) for f in frames[last + 1:]):
        frames = frames[:last + 1]
    keep = [f for f in frames if not own(f) and "runpy" not in f.filename
            and not f.filename.startswith("<frozen importlib") and os.sep + "importlib" + os.sep not in f.filename]
    print("Traceback (most recent call last):", file=sys.stderr)
    print("".join(traceback.format_list(keep)), end="", file=sys.stderr)
    print("".join(traceback.format_exception_only(etype, value)), end="", file=sys.stderr)


def kv(text: str, flag: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of a ``-R`` flag, the value parsed as on every command line (JSON where it parses)."""
    from omniprof.core.options import parse_cli_value

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{flag} expects KEY=VALUE (got {text!r})")
    return key.strip(), parse_cli_value(value)
