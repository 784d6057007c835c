"""The ``omniprof`` command line. ``main(argv) -> int``; the only place that prints or exits."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
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
                         usage="omniprof run [options] (script.py | -m module) [args...]")
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
    run.add_argument("--peek", action="store_true",
                     help="on SIGUSR1, print every thread's stack and a short profile to stderr (Linux)")
    _plugin_args(run)
    run.add_argument("-v", "--verbose", action="store_true", help="let native profiler libraries log")

    plugins = sub.add_parser("plugins", help="list backends and reporters with their status")
    plugins.add_argument("--no-probe", action="store_true", help="do not probe backends")
    _plugin_args(plugins)

    report = sub.add_parser("report", help="re-render a saved result or a trace file")
    report.add_argument("file", help="result JSON, Kineto trace, .xplane.pb or XProf logdir")
    report.add_argument("-r", "--reporter", action="append", default=[])
    report.add_argument("-R", "--reporter-option", action="append", default=[], metavar="REPORTER.KEY=VALUE")
    report.add_argument("-o", "--outdir", default=None)
    _plugin_args(report)
    return p


def _plugin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugins", default=None, help="plugins.toml to use (default: $OMNIPROF_PLUGINS or ./plugins.toml)")
    p.add_argument("--no-plugin", action="append", default=[], metavar="NAME", help="switch a plugin off")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
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
        else:
            top[key] = value
    if adv:
        top["advanced_configuration"] = {**dict(top.get("advanced_configuration") or {}), **adv}
    return ProfileOptions.from_dict(top), per_backend


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
    for name in reporters:
        try:
            rep = make_reporter(name, ropts.get(name), registry)
            if rep.output == "stream":
                report(result, name, sys.stdout if outdir is None else Path(outdir), options=ropts.get(name),
                       registry=registry)
            else:
                path = report(result, name, Path(outdir) if outdir else None, options=ropts.get(name),
                              registry=registry, overwrite=False)
                print(f"omniprof: {name} report written to {path}", file=sys.stderr)
        except OmniprofError as e:
            print(f"omniprof: error: {e}", file=sys.stderr)
            status = 1
    return status


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


def _cmd_report(ns: argparse.Namespace) -> int:
    from omniprof.core.readers import read_any

    reg = _registry(ns)
    reporters = _csv(ns.reporter, ["table"])
    ropts = _reporter_options(ns.reporter_option, reporters)
    for name in reporters:
        reg.reporter(name)  # fail early on unknown names
    result = read_any(ns.file)
    return _emit_reports(result, reporters, ropts, ns.outdir, reg)


def _cmd_run(ns: argparse.Namespace, module: str | None, target: list[str], is_module: bool) -> int:
    from omniprof.core.profiler import Profiler

    if not is_module and not target:
        raise UsageError("omniprof run: give a script to run (omniprof run script.py [args]) or -m module")
    reg = _registry(ns)
    backends = _csv(ns.backend, ["cpu"])
    reporters = _csv(ns.reporter, ["table"])
    options, per_backend = _profile_options(ns.option, backends)
    ropts = _reporter_options(ns.reporter_option, reporters)
    for name in reporters:  # validate reporters and their options before running anything
        from omniprof.core.reporting import make_reporter

        make_reporter(name, ropts.get(name), reg)
    if not is_module:
        script = Path(target[0])
        if not script.is_file():
            raise UsageError(f"omniprof run: cannot open file {target[0]!r}: no such file")
    prof = Profiler(backend=backends, options=options, backend_options=per_backend, logdir=ns.logdir,
                    registry=reg, label=ns.label, verbose=ns.verbose)
    _cut_launcher_frames()
    exit_code = 0
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
        with prof:
            if is_module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target[0], run_name="__main__")
    except SystemExit as e:
        exit_code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        exit_code = 130
    except OmniprofError:
        raise
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
        status = _emit_reports(prof.result, reporters, ropts, ns.outdir, reg)
        if prof.session_dir is not None:
            print(f"omniprof: session saved in {prof.session_dir}", file=sys.stderr)
        if exit_code == 0:
            exit_code = status
    return exit_code


def _cut_launcher_frames() -> None:
    """Make sampled stacks start at the target, not at omniprof's CLI and runpy."""
    from omniprof.backends.cpu import stacks

    stacks.set_root_cut([runpy._run_code.__code__])  # type: ignore[attr-defined]


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
    frames = traceback.extract_tb(tb)
    pkg = str(Path(__file__).resolve().parent)
    keep = [f for f in frames if not f.filename.startswith(pkg) and not f.filename.endswith("runpy.py")]
    print("Traceback (most recent call last):", file=sys.stderr)
    print("".join(traceback.format_list(keep)), end="", file=sys.stderr)
    print("".join(traceback.format_exception_only(etype, value)), end="", file=sys.stderr)
