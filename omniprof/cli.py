"""The ``omniprof`` command line. ``main(argv) -> int``; the only place that prints or exits."""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from omniprof.errors import (
    ConfigError,
    InvalidArgumentError,
    OmniprofError,
    PluginLoadError,
    UsageError,
)

__all__ = ["main"]

PROG = "omniprof"


class Terminated(BaseException):
    """SIGTERM arrived while the target ran: unwinds it like KeyboardInterrupt, so the profile is
    stopped and saved (marked partial) before omniprof dies of the same signal."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


# Set when a run was ended by SIGTERM; main() then dies of SIGTERM itself (as python would).
_terminated_by: int | None = None


@contextlib.contextmanager
def _sigterm_unwinds() -> Any:
    """While the target runs, SIGTERM raises :class:`Terminated` in the main thread (once; a second
    SIGTERM kills at once). Left alone when the handler is not the default one."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _note_terminated(e: Terminated) -> int:
    global _terminated_by
    _terminated_by = e.signum
    print(f"omniprof: {e}; the profile so far is kept (marked partial)", file=sys.stderr)
    return 128 + e.signum


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
    _plugin_args(plugins)

    doctor = sub.add_parser("doctor", help="what this machine can profile, and how to fix what it cannot")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--no-frameworks", action="store_true", help="do not import jax and torch (faster)")
    _plugin_args(doctor)

    report = sub.add_parser("report", help="re-render a saved result or a trace file")
    report.add_argument("file", help="result JSON, Kineto trace, .xplane.pb or XProf logdir")
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

    diff = sub.add_parser("diff", help="compare two results: function, op and kernel tables")
    diff.add_argument("a", help="baseline result (or any readable trace)")
    diff.add_argument("b", help="new result")
    diff.add_argument("--threshold-pct", type=_nonneg_float, default=10.0,
                      help="an entry regressed when its time grew by more than this percent (default 10)")
    diff.add_argument("--min-share-pct", type=_nonneg_float, default=1.0,
                      help="judge only entries with at least this share of their table in A or B (default 1)")
    diff.add_argument("--fail-on-regression", action="store_true", help="exit 1 when something regressed")
    diff.add_argument("--max-rows", type=_nonneg_int, default=20, help="rows shown per table (default 20)")
    diff.add_argument("--format", choices=("text", "json"), default="text")
    _plugin_args(diff)
    collect = sub.add_parser("collect", help="capture running processes through their profiler servers "
                             "(omniprof.start_server) into one run directory")
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
    p.add_argument("--plugins", default=None, help="plugins.toml to use (default: $OMNIPROF_PLUGINS or ./plugins.toml)")
    p.add_argument("--no-plugin", action="append", default=[], metavar="NAME", help="switch a plugin off")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code.

    Called without ``argv`` (the console script, ``python -m omniprof``), a run ended by SIGTERM
    saves its partial profile and then dies of SIGTERM, so the caller sees the usual status.
    """
    global _terminated_by
    real_process = argv is None
    _terminated_by = None
    code = _main(list(sys.argv[1:] if argv is None else argv))
    if real_process and _terminated_by is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(_terminated_by, signal.SIG_DFL)
        os.kill(os.getpid(), _terminated_by)
    return code


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] == "run":
            opts, module, target, is_module = _split_run(argv[1:])
            ns = _parser().parse_args(["run", *opts])
            return _cmd_run(ns, module, target, is_module)
        ns = _parser().parse_args(argv)
        if ns.version:
            from omniprof import __version__

            print(f"omniprof {__version__}")
            return 0
        if ns.command == "plugins":
            return _cmd_plugins(ns)
        if ns.command == "report":
            return _cmd_report(ns)
        if ns.command == "doctor":
            return _cmd_doctor(ns)
        if ns.command == "config":
            return _cmd_config(ns)
        if ns.command == "diff":
            return _cmd_diff(ns)
        if ns.command == "collect":
            return _cmd_collect(ns)
        if ns.command == "view":
            return _cmd_view(ns)
        _parser().print_help()
        return 2
    except (UsageError, InvalidArgumentError, ConfigError, PluginLoadError) as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return 2
    except OmniprofError as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("omniprof: interrupted", file=sys.stderr)
        return 130


def _registry(ns: argparse.Namespace) -> Any:
    from omniprof.core.registry import Registry, reset_registry

    reg = Registry(plugins_file=ns.plugins, disable=ns.no_plugin)
    reset_registry(reg)
    return reg


def _csv(values: list[str], default: list[str]) -> list[str]:
    out = [x.strip() for v in values for x in v.split(",") if x.strip()]
    return out or default


def _kv(text: str, flag: str) -> tuple[str, Any]:
    from omniprof.core.options import parse_cli_value

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{flag} expects KEY=VALUE (got {text!r})")
    return key.strip(), parse_cli_value(value)


def _profile_options(items: list[str], backends: list[str]) -> tuple[Any, dict[str, dict[str, Any]]]:
    from omniprof.core.options import ADVANCED_KEYS, ProfileOptions

    top: dict[str, Any] = {}
    adv: dict[str, Any] = {}
    per_backend: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = _kv(item, "-O")
        head, dot, rest = key.partition(".")
        if dot and head == "advanced_configuration":
            adv[rest] = value
        elif dot:
            if head not in backends:
                raise UsageError(f"-O {key}: backend {head!r} is not selected (selected: {', '.join(backends)})")
            per_backend.setdefault(head, {})[rest] = value
        elif key in ADVANCED_KEYS:
            adv[key] = value
        elif key in _TOP_LEVEL_OPTIONS:
            top[key] = value
        else:
            from omniprof.core.validators import unknown_key_message

            raise InvalidArgumentError(unknown_key_message(key, [*_TOP_LEVEL_OPTIONS, *ADVANCED_KEYS],
                                                           what="profile option"))
    if adv:
        top["advanced_configuration"] = {**dict(top.get("advanced_configuration") or {}), **adv}
    return ProfileOptions.from_dict(top), per_backend


_TOP_LEVEL_OPTIONS = ("host_tracer_level", "device_tracer_level", "python_tracer_level", "advanced_configuration")


def _reporter_options(items: list[str], reporters: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = _kv(item, "-R")
        name, dot, rest = key.partition(".")
        if not dot:
            raise UsageError(f"-R expects REPORTER.KEY=VALUE (got {item!r})")
        if name not in reporters:
            raise UsageError(f"-R {key}: reporter {name!r} is not selected (selected: {', '.join(reporters)})")
        out.setdefault(name, {})[rest] = value
    return out


def _emit_reports(result: Any, reporters: list[str], ropts: dict[str, dict[str, Any]], outdir: str | None,
                  registry: Any) -> int:
    from omniprof.core.reporting import make_reporter, report

    status = 0
    if outdir is not None:  # -o names a directory: create it, so reports go inside, not over it
        from omniprof.core.fileio import output_error

        try:
            Path(outdir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"omniprof: error: {output_error(outdir, e)}", file=sys.stderr)
            return 1
    for name in reporters:
        try:
            rep = make_reporter(name, ropts.get(name), registry)
            if rep.output == "stream":  # text reports go to the terminal; files to the output directory
                report(result, name, sys.stdout, options=ropts.get(name), registry=registry)
            else:
                path = report(result, name, Path(outdir) if outdir else None, options=ropts.get(name),
                              registry=registry, overwrite=False)
                print(f"omniprof: {name} report written to {path}", file=sys.stderr)
                if getattr(rep, "name", "") in ("perfetto", "chrome"):
                    print(f"omniprof: open it with: omniprof view --perfetto {path}", file=sys.stderr)
        except OmniprofError as e:
            print(f"omniprof: error: {e}", file=sys.stderr)
            status = 1
    return status


def _emit_to_file(result: Any, name: str, options: dict[str, Any], path: str, registry: Any) -> int:
    """Write one report to the file a config names (a free name beside it if it exists)."""
    from omniprof.core.reporting import report

    try:
        written = report(result, name, path, options=options, registry=registry, overwrite=False)
    except OmniprofError as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return 1
    print(f"omniprof: {name} report written to {written}", file=sys.stderr)
    return 0


def _cmd_plugins(ns: argparse.Namespace) -> int:
    reg = _registry(ns)
    infos = reg.infos(probe=not ns.no_probe)
    rows = [("name", "kind", "source", "status")]
    for i in infos:
        rows.append((i.name, i.kind, i.source, i.status + (f": {i.reason}" if i.reason else "")))
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    for problem in reg.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def _cmd_doctor(ns: argparse.Namespace) -> int:
    import json

    from omniprof.core.doctor import format_doctor, run_doctor

    report = run_doctor(_registry(ns), frameworks=not ns.no_frameworks)
    print(json.dumps(report.to_dict(), indent=2) if ns.json else format_doctor(report))
    return 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from omniprof.core.readers import read_any

    reg = _registry(ns)
    reporters = _csv(ns.reporter, ["table"])
    ropts = _reporter_options(ns.reporter_option, reporters)
    for name in reporters:
        reg.reporter(name)  # fail early on unknown names
    result = read_any(ns.file)
    _make_outdir(ns.outdir)
    return _emit_reports(result, reporters, ropts, ns.outdir, reg)


def _cmd_collect(ns: argparse.Namespace) -> int:
    from omniprof.backends.xla.remote import collect

    reg = _registry(ns)
    options, per_backend = _profile_options(ns.option, ["xla"])
    if per_backend:
        raise UsageError("omniprof collect: -O takes profile options only (host_tracer_level=..., advanced keys)")
    reporters = _csv(ns.reporter, [])
    for name in reporters:
        reg.reporter(name)
    got = collect(ns.addresses, ns.duration_ms, ns.logdir, options=options, perfetto_trace=True,
                  perfetto_link=not ns.no_perfetto_link, perfetto_port=ns.perfetto_port,
                  perfetto_timeout_s=ns.perfetto_timeout_s, num_tracing_attempts=ns.attempts, verbose=ns.verbose,
                  announce=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"omniprof: captured {len(got.files)} host(s) into {got.run_dir}", file=sys.stderr)
    for f in got.files:
        print(f"  {f.name}", file=sys.stderr)
    status = _emit_reports(got.result, reporters, {}, ns.outdir, reg) if reporters else 0
    return status
def _cmd_view(ns: argparse.Namespace) -> int:
    if ns.timeout_s is not None and ns.timeout_s <= 0:
        raise UsageError(f"omniprof view: --timeout-s must be > 0 (got {ns.timeout_s})")
    if ns.perfetto:
        return _view_perfetto(ns)
    return _view_logdir(ns)


def _view_logdir(ns: argparse.Namespace) -> int:
    from omniprof.reporters.tensorboard import serve_logdir, xplane_files

    path = Path(ns.path)
    if not path.is_dir():
        raise UsageError(f"omniprof view: {ns.path!r} is not a directory; give an XProf logdir "
                         f"(write one with: omniprof run -r tensorboard -o LOGDIR script.py)")
    if not xplane_files(path):
        print(f"omniprof: no runs under {path} yet (expected plugins/profile/<run>/<host>.xplane.pb); "
              f"XProf lists runs written later", file=sys.stderr)

    def ready(server: Any) -> None:
        print(f"omniprof: XProf serving {path} at {server.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)

    try:
        serve_logdir(path, ns.host, 6006 if ns.port is None else ns.port, verbose=ns.verbose, on_ready=ready)
    except KeyboardInterrupt:
        print("omniprof: XProf stopped", file=sys.stderr)
    return 0


def _view_perfetto(ns: argparse.Namespace) -> int:
    """Serve one trace file on 127.0.0.1 for ui.perfetto.dev and print the link that opens it."""
    import time

    from omniprof.core.serve import TraceFileServer

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
        deadline = None if ns.timeout_s is None else time.monotonic() + ns.timeout_s
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
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


def _cmd_run(ns: argparse.Namespace, module: str | None, target: list[str], is_module: bool) -> int:
    from omniprof.core.profiler import Profiler

    if _wants_config(ns, target, is_module):
        return _cmd_run_config(ns, module, target, is_module)
    reg = _registry(ns)
    backends = _csv(ns.backend, ["cpu"])
    reporters = _csv(ns.reporter, ["table"])
    options, per_backend = _profile_options(ns.option, backends)
    ropts = _reporter_options(ns.reporter_option, reporters)
    for name in reporters:  # validate reporters and their options before running anything
        from omniprof.core.reporting import make_reporter

        make_reporter(name, ropts.get(name), reg)
    prof = Profiler(backend=backends, options=options, backend_options=per_backend, logdir=ns.logdir,
                    registry=reg, label=ns.label, verbose=ns.verbose)
    if not is_module and not Path(target[0]).is_file():
        raise UsageError(f"omniprof run: cannot open file {target[0]!r}: no such file")
    _cut_launcher_frames()
    exit_code = 0
    omniprof_status = 0
    saved_argv, saved_path0 = list(sys.argv), sys.path[0] if sys.path else None
    if is_module:
        sys.argv = [module or "", *target]
        sys.path.insert(0, os.getcwd())
    else:
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
    if ns.peek:
        from omniprof.backends.cpu import api as sampler_api

        sampler_api.enable_peek()
    try:
        with _sigterm_unwinds(), prof:
            if is_module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target[0], run_name="__main__")
    except SystemExit as e:
        exit_code = _exit_code(e.code)
    except Terminated as e:
        exit_code = _note_terminated(e)
    except KeyboardInterrupt:
        _print_user_traceback()
        exit_code = 130
    except OmniprofError as e:
        if not prof.results:
            raise
        print(f"omniprof: error: {e}", file=sys.stderr)  # e.g. the session could not be saved
        omniprof_status = 1
    except BaseException:
        _print_user_traceback()
        exit_code = 1
    finally:
        if ns.peek:
            sampler_api.disable_peek()
        sys.argv = saved_argv
        if sys.path and saved_path0 is not None and sys.path[0] != saved_path0:
            sys.path.pop(0)
    if prof.results:
        _make_outdir(ns.outdir)
        status = _emit_reports(prof.result, reporters, ropts, ns.outdir, reg)
        if prof.session_dir is not None:
            print(f"omniprof: session saved in {prof.session_dir}", file=sys.stderr)
        if exit_code == 0:
            exit_code = status or omniprof_status
    return exit_code


def _make_outdir(outdir: str | None) -> None:
    """``-o DIR`` names a directory: make it when missing (rather than writing a file called DIR)."""
    if outdir is None:
        return
    from omniprof.core.fileio import output_error

    try:
        Path(outdir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(outdir, e) from e


def _config_layers(ns: argparse.Namespace, path: str | None, cli: Any = None) -> Any:
    from omniprof.core import config as cfgmod

    _registry(ns)  # the process-wide registry; a `plugins` key in the file or on the command line replaces it
    return cfgmod.load_config(path, getattr(ns, "profile", None) or os.environ.get(cfgmod.PROFILE_ENV) or None,
                              cli=cli)


def _config_path(explicit: str | None, required: bool) -> str | None:
    from omniprof.core import config as cfgmod

    path = explicit or os.environ.get(cfgmod.CONFIG_ENV)
    if path:
        return path
    found = cfgmod.find_config()
    if found is None and required:
        raise UsageError("no configuration found: give a script (omniprof run script.py [args]) or -m module, "
                         "or a config file (--config FILE), or create omniprof.toml (or [tool.omniprof] in "
                         "pyproject.toml) in the current directory")
    return str(found) if found is not None else None


def _wants_config(ns: argparse.Namespace, target: list[str], is_module: bool) -> bool:
    """--config/--profile/$OMNIPROF_CONFIG, nothing else to run, or a config in the current directory."""
    from omniprof.core.config import find_config, is_function_target

    if ns.config or ns.profile or os.environ.get("OMNIPROF_CONFIG") or (not is_module and not target):
        return True
    if not is_module and is_function_target(target[0]):
        return True
    return not ns.no_config and find_config() is not None


def _cmd_run_config(ns: argparse.Namespace, module: str | None, target: list[str], is_module: bool) -> int:
    """``omniprof run`` driven by a config file; flags given on the command line override it."""
    from omniprof.core import config as cfgmod

    path = None if ns.no_config else _config_path(ns.config, required=not (target or is_module))
    function = target[0] if target and not is_module and cfgmod.is_function_target(target[0]) else None
    cli = cfgmod.cli_layer(backends=ns.backend, options=ns.option, reporters=ns.reporter,
                           reporter_options=ns.reporter_option, outdir=ns.outdir, logdir=ns.logdir,
                           label=ns.label or None, verbose=True if ns.verbose else None,
                           script=None if is_module or not target or function else target[0],
                           module=module if is_module else None, function=function,
                           args=target if is_module else target[1:], plugins=ns.plugins, no_plugin=ns.no_plugin)
    cfg = _config_layers(ns, path, cli)
    if cfg.target is None:
        raise UsageError(f"omniprof run: {path or 'the configuration'} names nothing to run: set script, module or "
                         f"function there, or give a script on the command line")
    reg = _registry(argparse.Namespace(plugins=cfg.plugins, no_plugin=list(cfg.no_plugin)))
    from omniprof.core.reporting import make_reporter

    for spec in cfg.reporters:  # validate reporters and their options before running anything
        make_reporter(spec.name, spec.options, reg)
    _cut_launcher_frames()
    if ns.peek:
        from omniprof.backends.cpu import api as sampler_api

        sampler_api.enable_peek()
    try:
        with _sigterm_unwinds():
            outcome = cfgmod.execute(cfg, registry=reg)
    finally:
        if ns.peek:
            sampler_api.disable_peek()
    exit_code = outcome.exit_code
    if outcome.error is not None:
        if isinstance(outcome.error, Terminated):
            exit_code = _note_terminated(outcome.error)
        elif isinstance(outcome.error, KeyboardInterrupt):
            exit_code = 130
        else:
            e = outcome.error
            _print_exception(type(e), e, e.__traceback__)
            exit_code = 1
    status = 0
    if outcome.problem is not None:
        print(f"omniprof: error: {outcome.problem}", file=sys.stderr)
        status = 1
    for result in outcome.results:
        for spec in cfg.reporters:
            if spec.output and not ns.outdir:  # an explicit output file from the config
                status |= _emit_to_file(result, spec.name, dict(spec.options), spec.output, reg)
                continue
            dest = ns.outdir or cfg.outdir  # -o on the command line wins over the file
            if dest:
                _make_outdir(dest)
            status |= _emit_reports(result, [spec.name], {spec.name: dict(spec.options)}, dest, reg)
    if outcome.session_dir is not None:
        print(f"omniprof: session saved in {outcome.session_dir}", file=sys.stderr)
    if not outcome.results:
        print("omniprof: the schedule recorded nothing (more repeats needed?)", file=sys.stderr)
    return exit_code or status


def _cmd_config(ns: argparse.Namespace) -> int:
    from omniprof.core import config as cfgmod

    if ns.config_command is None:
        raise UsageError("omniprof config: give a subcommand: check or show")
    path = _config_path(ns.file, required=True)
    if ns.config_command == "check":
        if Path(path).name == "plugins.toml":
            problems = cfgmod.check_plugins_file(path)
        else:
            _registry(ns)
            problems = cfgmod.check_config(path, profile=ns.profile)
        if problems:
            for p in problems:
                print(p, file=sys.stderr)
            print(f"omniprof: {len(problems)} problem(s) in {path}", file=sys.stderr)
            return 1
        print(f"{path}: ok")
        return 0
    cfg = _config_layers(ns, path)
    data = cfg.to_dict(_registry(argparse.Namespace(plugins=cfg.plugins or ns.plugins,
                                                    no_plugin=[*cfg.no_plugin, *ns.no_plugin])))
    if ns.format == "json":
        import json

        print(json.dumps(data, indent=2))
    else:
        print(f"# effective configuration from {path}" + (f", profile {cfg.profile}" if cfg.profile else ""))
        print(cfgmod.dump_toml(data), end="")
    return 0


def _cmd_diff(ns: argparse.Namespace) -> int:
    from omniprof.core import diff as diffmod
    from omniprof.core.readers import read_any

    _registry(ns)
    a, b = read_any(ns.a), read_any(ns.b)
    d = diffmod.diff(a, b, threshold_pct=ns.threshold_pct, min_share_pct=ns.min_share_pct)
    if ns.format == "json":
        import json

        print(json.dumps(d.to_dict(), indent=2))
    else:
        sys.stdout.write(diffmod.format_diff(d, max_rows=ns.max_rows))
    if d.regressions:
        print(f"omniprof: {len(d.regressions)} regression(s) past {ns.threshold_pct}%", file=sys.stderr)
        if ns.fail_on_regression:
            return 1
    return 0


def _cut_launcher_frames() -> None:
    """Make sampled stacks start at the target, not at omniprof's CLI and runpy."""
    from omniprof.backends.cpu import stacks

    from omniprof.core.config import call_function

    stacks.set_root_cut([runpy._run_code.__code__, call_function.__code__])  # type: ignore[attr-defined]


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback() -> None:
    """Print the target's traceback as python would, without omniprof's and runpy's frames."""
    etype, value, tb = sys.exc_info()
    _print_exception(etype, value, tb)


def _print_exception(etype: Any, value: Any, tb: Any) -> None:
    frames = traceback.extract_tb(tb)
    pkg = str(Path(__file__).resolve().parent)
    keep = [f for f in frames if not f.filename.startswith(pkg) and "runpy" not in f.filename]
    print("Traceback (most recent call last):", file=sys.stderr)
    print("".join(traceback.format_list(keep)), end="", file=sys.stderr)
    print("".join(traceback.format_exception_only(etype, value)), end="", file=sys.stderr)
