"""The ``omniprof`` command line. ``main(argv) -> int``; the only place that prints or exits.

One module per command (:mod:`omniprof.cli.run`, ``report``, ``collect``, ``view``, ``plugins``,
``doctor``, ``config``, ``diff``, ``assemble``), each a function of the parsed arguments returning the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from omniprof.errors import (
    ConfigError,
    InvalidArgumentError,
    OmniprofError,
    PluginLoadError,
    TargetImportError,
    TraceReadError,
    UsageError,
)

__all__ = ["main"]

PROG = "omniprof"

#: Commands other than ``run``: each is ``omniprof.cli.<name>.<name>(ns) -> int``.
COMMANDS = ("plugins", "report", "doctor", "config", "diff", "collect", "view", "assemble", "dump", "attach")
#: Commands whose module owns its parser too (``add_parser(sub)``).
OWN_PARSER = ("dump", "attach")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


# Options of `run` that take a value; everything after them and the target belongs to the target.
_RUN_VALUE_OPTS = {"-b", "--backend", "-O", "--option", "-r", "--reporter", "-R", "--reporter-option", "-o",
                   "--outdir", "--logdir", "--plugins", "--no-plugin", "--label", "--config", "--profile"}


def _split_run(argv: list[str]) -> tuple[list[str], str | None, list[str], bool]:
    """(omniprof options, module or None, target argv, is_module)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            if i + 1 >= len(argv):
                raise UsageError("omniprof run: -m needs a module name")
            return argv[:i], argv[i + 1], argv[i + 2:], True
        if a == "--":
            return argv[:i], None, argv[i + 1:], False
        if a in _RUN_VALUE_OPTS:
            i += 2
            continue
        if a.startswith("-") and a != "-":
            i += 1
            continue
        return argv[:i], None, argv[i:], False
    return argv, None, [], False


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="One profiling API over many profilers.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="run a script or module under the profiler",
                         usage="omniprof run [options] (script.py | -m module | pkg.mod:function) [args...]")
    run.add_argument("-b", "--backend", action="append", default=[],
                     help="backend(s) to use, comma-separated or repeated (default: cpu)")
    run.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                     help="profile option (host_tracer_level=3, advanced_configuration.KEY=V, or BACKEND.KEY=V)")
    run.add_argument("-r", "--reporter", action="append", default=[],
                     help="reporter(s), comma-separated or repeated (default: table)")
    run.add_argument("-R", "--reporter-option", action="append", default=[], metavar="REPORTER.KEY=VALUE")
    run.add_argument("-o", "--outdir", default=None, help="directory for file reports (default: current directory)")
    run.add_argument("--logdir", default=None, help="save each session in the XProf layout under this directory")
    run.add_argument("--label", default="", help="free text stored in the result")
    run.add_argument("--config", default=None, metavar="FILE",
                     help="omniprof.toml or pyproject.toml describing the run; flags given here override it")
    run.add_argument("--profile", default=None, metavar="NAME", help="a [profiles.NAME] of the config file")
    run.add_argument("--no-config", action="store_true",
                     help="ignore ./omniprof.toml and [tool.omniprof] in ./pyproject.toml")
    run.add_argument("--peek", action="store_true",
                     help="on SIGUSR1, print every thread's stack and a short profile to stderr (Linux)")
    _plugin_args(run)
    run.add_argument("-v", "--verbose", action="store_true", help="let native profiler libraries log")

    plugins = sub.add_parser("plugins", help="list backends and reporters with their status")
    plugins.add_argument("--no-probe", action="store_true", help="do not probe backends")
    plugins.add_argument("--trust", nargs="?", const="plugins.toml", default=None, metavar="FILE",
                         help="trust FILE (default ./plugins.toml) as it is now: a plugins.toml loads from the working "
                              "directory without --plugins; an omniprof.toml or pyproject.toml found there may set "
                              "env, plugins and paths outside its directory")
    _plugin_args(plugins)

    doctor = sub.add_parser("doctor", help="what this machine can profile, and how to fix what it cannot")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--no-frameworks", action="store_true", help="do not import jax and torch (faster)")
    _plugin_args(doctor)

    report = sub.add_parser("report", help="re-render a saved result or a trace file")
    report.add_argument("file", help="result JSON, Kineto trace, .xplane.pb or XProf logdir; a distributed run "
                                     "directory or a directory of per-rank Kineto traces")
    report.add_argument("-j", "--workers", type=int, default=None, metavar="N",
                        help="a rank directory with -r table -R table.include_rank_parts=false: read ranks in N "
                             "processes (default: one per core), bounded memory")
    report.add_argument("--executor", default=None, metavar="dask://HOST:PORT",
                        help="a rank directory: read and reduce each rank on the Dask cluster at this scheduler "
                             "address, on a worker that sees its file (FILE as the workers see it); only the "
                             "cross-rank section is printed")
    report.add_argument("-r", "--reporter", action="append", default=[])
    report.add_argument("-R", "--reporter-option", action="append", default=[], metavar="REPORTER.KEY=VALUE")
    report.add_argument("-o", "--outdir", default=None)
    _plugin_args(report)

    config = sub.add_parser("config", help="check or show a configuration file")
    csub = config.add_subparsers(dest="config_command", parser_class=_Parser)
    check = csub.add_parser("check", help="validate a config file without running it (exit 1 on problems)")
    check.add_argument("file", nargs="?", default=None, help="omniprof.toml or pyproject.toml (default: found in cwd)")
    check.add_argument("--profile", default=None, help="check only this profile (default: base and every profile)")
    _plugin_args(check)
    show = csub.add_parser("show", help="print the effective configuration (file < OMNIPROF_* env < flags)")
    show.add_argument("file", nargs="?", default=None, help="omniprof.toml or pyproject.toml (default: found in cwd)")
    show.add_argument("--profile", default=None)
    show.add_argument("--format", choices=("toml", "json"), default="toml")
    _plugin_args(show)

    diff = sub.add_parser("diff", help="compare two results: function, op and kernel tables",
                          usage="omniprof diff A B | omniprof diff A1 A2 ... --vs B1 B2 ... [options]")
    diff.add_argument("files", nargs="+", metavar="FILE",
                      help="baseline result then new result (or any readable traces); with --vs, the baseline's "
                           "repeated runs")
    diff.add_argument("--vs", nargs="+", default=None, metavar="FILE",
                      help="the new setup's repeated runs (the files before --vs are the baseline's)")
    diff.add_argument("--repeats", choices=("runs", "steps"), default="runs",
                      help="runs: each file is one run (default); steps: each recorded step of each file is one "
                           "run for op and kernel tables")
    diff.add_argument("--alpha", type=float, default=0.01,
                      help="with repeated runs, a change counts only when the permutation test's p <= this "
                           "(default 0.01: 99%% confidence)")
    diff.add_argument("--threshold-pct", type=_nonneg_float, default=10.0,
                      help="an entry regressed when its time grew by more than this percent (default 10)")
    diff.add_argument("--min-share-pct", type=_nonneg_float, default=1.0,
                      help="judge only entries with at least this share of their table in A or B (default 1)")
    diff.add_argument("--clip-calls", type=_nonneg_float, default=1.1, metavar="FACTOR",
                      help="with repeated runs of torch profiles, each op call's self time counts at most FACTOR "
                           "times the median of the same call over all runs (time lost to other processes does "
                           "not move a run; default 1.1; 0: plain sums)")
    diff.add_argument("--fail-on-regression", action="store_true", help="exit 1 when something regressed")
    diff.add_argument("--max-rows", type=_nonneg_int, default=20, help="rows shown per table (default 20)")
    diff.add_argument("--format", choices=("text", "json"), default="text")
    _plugin_args(diff)
    collect = sub.add_parser("collect", help="capture running processes through their profiler servers "
                             "(omniprof.jax.start_server) into one run directory")
    collect.add_argument("addresses", help="HOST:PORT[,HOST:PORT...] of the profiler servers")
    collect.add_argument("--duration-ms", type=int, required=True, help="capture window in milliseconds")
    collect.add_argument("--logdir", default=None, help="XProf logdir (default: a new temporary directory)")
    collect.add_argument("--no-perfetto-link", action="store_true", help="do not serve a ui.perfetto.dev link")
    collect.add_argument("--perfetto-port", type=int, default=9001, help="port of the link's server on 127.0.0.1")
    collect.add_argument("--perfetto-timeout-s", type=float, default=300.0,
                         help="stop serving the link after this many seconds")
    collect.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                         help="profile option sent to every process (host_tracer_level=3, ...)")
    collect.add_argument("-r", "--reporter", action="append", default=[], help="reporter(s) for the capture (default: none)")
    collect.add_argument("-o", "--outdir", default=None)
    collect.add_argument("--attempts", type=int, default=3, help="tracing attempts before giving up")
    collect.add_argument("-v", "--verbose", action="store_true", help="let the profiler libraries log")
    _plugin_args(collect)
    view = sub.add_parser("view", help="open a trace file in ui.perfetto.dev (--perfetto FILE) or an XProf logdir "
                          "in XProf's web UI; binds 127.0.0.1",
                          usage="omniprof view [--perfetto] PATH [--host HOST] [--port PORT] [--once] [--timeout-s S]")
    view.add_argument("path", help="a trace file (with --perfetto) or an XProf logdir")
    view.add_argument("--perfetto", action="store_true",
                      help="serve the file for ui.perfetto.dev (a .perfetto-trace, Chrome JSON or any Perfetto trace)")
    view.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    view.add_argument("--port", type=int, default=None,
                      help="port (default 9001 for --perfetto, the port ui.perfetto.dev fetches from; 6006 for XProf; "
                           "0 picks a free one)")
    view.add_argument("--once", action="store_true", help="--perfetto: stop after the trace was fetched once")
    view.add_argument("--timeout-s", type=float, default=None, help="--perfetto: stop after this many seconds")
    view.add_argument("-v", "--verbose", action="store_true", help="let XProf log every request")
    assemble = sub.add_parser("assemble", help="join the parts of a streaming heap snapshot into one .heapsnapshot",
                              usage="omniprof assemble PREFIX [-o FILE]")
    assemble.add_argument("prefix", metavar="PREFIX",
                          help="the path given to take_heap_snapshot(..., streaming=True); its parts are "
                               "PREFIX.nodes, .edges, .strings")
    assemble.add_argument("-o", "--output", default=None, metavar="FILE",
                          help="the .heapsnapshot to write (default: PREFIX); an existing file is never replaced")
    import importlib

    for name in OWN_PARSER:
        importlib.import_module(f"omniprof.cli.{name}").add_parser(sub)
    return p


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {text!r})")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text!r})")
    return value


def _plugin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugins", default=None, help="plugins.toml to use (default: $OMNIPROF_PLUGINS, or ./plugins.toml once trusted "
                        "with `omniprof plugins --trust`)")
    p.add_argument("--no-plugin", action="append", default=[], metavar="NAME", help="switch a plugin off")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code.

    Called without ``argv`` (the console script, ``python -m omniprof``), a run ended by SIGTERM
    saves its partial profile and then dies of SIGTERM, so the caller sees the usual status.
    """
    from omniprof.cli import _common
    from omniprof.core.views import set_default_viewer
    from omniprof.viewers import open_views

    set_default_viewer(open_views)  # what a backend asks to show (create_perfetto_link), once saved
    real_process = argv is None
    _common.terminated_by = None
    _common.pipe_closed = False
    _common.started_stdout = sys.stdout
    saved_showwarning = warnings.showwarning
    if real_process:  # as a program; a caller of main() (tests, embedding) keeps its own warning handling
        warnings.showwarning = _show_warning
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        _flush_stdout()
    except BrokenPipeError:
        _common.pipe_closed = True
    finally:
        warnings.showwarning = saved_showwarning
    if _common.pipe_closed:
        # The reader went away (`omniprof plugins | head`): stop quietly with 141, the status a
        # shell reports for git or cat cut short (docs/cli.md). Python's own flush at exit must
        # not raise again, so the closed streams point at /dev/null from here on.
        for stream in (sys.stdout, sys.stderr):
            if stream is sys.stdout or _common.reader_gone(stream):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, stream.fileno())
                    os.close(devnull)
        return _common.PIPE_CLOSED_STATUS
    if real_process and _common.terminated_by is not None:
        _flush_stdout()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        signal.signal(_common.terminated_by, signal.SIG_DFL)
        os.kill(os.getpid(), _common.terminated_by)
    return code


def _flush_stdout() -> None:
    """Flush the stdout the command began with (the program may have set ``sys.stdout`` to None,
    or closed it); a closed pipe still raises BrokenPipeError."""
    from omniprof.cli import _common
    from omniprof.core.text import report_stdout

    with contextlib.suppress(ValueError, AttributeError):
        report_stdout(_common.started_stdout).flush()


_PKG_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """omniprof's warnings (and any warning attributed to omniprof's code) as one line,
    ``omniprof: warning: ...``, without our source lines; the profiled program's own warnings
    look as Python prints them."""
    from omniprof.errors import OmniprofWarning

    ours = (issubclass(category, OmniprofWarning) or str(filename).startswith(_PKG_DIR)
            or os.path.basename(str(filename)) in ("omniprof", "runpy.py", "<frozen runpy>"))
    if not ours:
        _ORIGINAL_SHOWWARNING(message, category, filename, lineno, file, line)
        return
    text = " ".join(str(message).split())
    with contextlib.suppress(OSError, ValueError):
        print(f"omniprof: warning: {text}", file=file if file is not None else sys.stderr)


_ORIGINAL_SHOWWARNING = warnings.showwarning


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] == "run":
            opts, module, target, is_module = _split_run(argv[1:])
            ns = _parser().parse_args(["run", *opts])
            from omniprof.cli.run import run

            return run(ns, module, target, is_module)
        ns = _parser().parse_args(argv)
        if ns.version:
            from omniprof import __version__

            print(f"omniprof {__version__}")
            return 0
        if ns.command in COMMANDS:
            import importlib

            command = importlib.import_module(f"omniprof.cli.{ns.command}")
            return int(getattr(command, ns.command)(ns))
        _parser().print_help()
        return 2
    except (UsageError, InvalidArgumentError, ConfigError, PluginLoadError, TraceReadError) as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return 2
    except TargetImportError as e:  # the user's module failed on import: their traceback, not ours
        from omniprof.cli._common import print_exception

        cause = e.__cause__ or e
        print_exception(type(cause), cause, cause.__traceback__)
        return 1
    except OmniprofError as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("omniprof: interrupted", file=sys.stderr)
        return 130
