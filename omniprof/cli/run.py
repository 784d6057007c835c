"""``omniprof run``: one pipeline for every run.

The config file (``--config``, ``$OMNIPROF_CONFIG`` or one found in the working directory, unless
``--no-config``), the ``OMNIPROF_*`` environment and the flags become one
:class:`~omniprof.config.RunConfig` (later layers win); :func:`omniprof.runner.run` runs its
target under a Profiler; the reporters write the results.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from omniprof.cli import _common as c
from omniprof.cli.config import applied_note, config_layers, config_path
from omniprof.errors import UsageError


def run(ns: argparse.Namespace, module: str | None, target: list[str], is_module: bool) -> int:
    from omniprof import runner
    from omniprof import config as cfgmod
    from omniprof.core.profiler import RESULT_FILENAME

    # Relative to where omniprof was started, not to wherever the program chdirs before it ends.
    ns.outdir = os.path.abspath(ns.outdir) if ns.outdir else ns.outdir
    ns.logdir = os.path.abspath(ns.logdir) if ns.logdir else ns.logdir
    path = None if ns.no_config else config_path(ns.config, required=not (target or is_module))
    function = target[0] if target and not is_module and cfgmod.is_function_target(target[0]) else None
    script = None if is_module or not target or function else target[0]
    cli = cfgmod.cli_layer(backends=ns.backend, options=ns.option, reporters=ns.reporter,
                           reporter_options=ns.reporter_option, outdir=ns.outdir, logdir=ns.logdir,
                           label=ns.label or None, verbose=True if ns.verbose else None,
                           script=script, module=module if is_module else None, function=function,
                           args=target if is_module else target[1:], plugins=ns.plugins, no_plugin=ns.no_plugin)
    cfg = config_layers(ns, path, cli)
    if (note := applied_note(ns, path, cfg)) is not None:  # a config the command line did not name: say which
        print(note, file=sys.stderr)
    if cfg.target is None:
        raise UsageError(f"omniprof run: {path or 'the configuration'} names nothing to run: set script, module or "
                         f"function there, or give a script on the command line")
    reg = c.registry(argparse.Namespace(plugins=cfg.plugins, no_plugin=list(cfg.no_plugin)))
    _check_outputs(ns, cfg, reg)
    outcome = runner.run(cfg, registry=reg, peek=ns.peek)
    exit_code = outcome.exit_code
    if outcome.forked_child:  # a child the program forked came back here: the profile is the parent's
        return exit_code or (1 if outcome.error is not None else 0)
    if outcome.exit_message is not None:
        print(outcome.exit_message, file=sys.stderr)  # sys.exit("message") prints it, as python does
    if outcome.error is not None:
        e = outcome.error
        if isinstance(e, runner.Terminated):
            exit_code = c.note_terminated(e)
        elif c.broken_pipe(e) and c.reader_gone(sys.stdout):
            # The target's output went to `| head`, which has gone: no traceback, as for our own
            # output; the file reports are still written, then the run ends with status 141.
            c.pipe_closed = True
        else:
            c.print_exception(type(e), e, e.__traceback__)
            exit_code = 130 if isinstance(e, KeyboardInterrupt) else 1
    status = 0
    if outcome.problem is not None:
        print(f"omniprof: error: {outcome.problem}", file=sys.stderr)
        status = 1
    unsaved = []  # results with a file report that could not be written, and no json report of them
    try:
        # SIGTERM while the reports are written unwinds too: no temporary file is left behind.
        with runner.sigterm_unwinds():
            for result in outcome.results:
                failed = saved = False
                for spec in cfg.reporters:
                    if spec.output and not ns.outdir:  # an explicit output file from the config
                        rc = c.emit_to_file(result, spec.name, dict(spec.options), spec.output, reg)
                    else:  # -o on the command line wins over the file; a failed report leaves the others
                        rc = c.emit_reports(result, [spec.name], {spec.name: dict(spec.options)},
                                            ns.outdir or cfg.outdir, reg)
                    status |= rc
                    failed |= rc != 0
                    saved |= rc == 0 and spec.name == "json"
                if failed and not saved:
                    unsaved.append(result)
    except (runner.Terminated, KeyboardInterrupt) as e:
        # Ctrl-C (often the second of two: the first stopped the program) or SIGTERM while the
        # reports are written: the report under way is dropped whole (atomic writes), the others
        # are skipped, and the result is never lost with them.
        _keep_result(outcome, outcome.results, ns.outdir or cfg.outdir, "interrupted while writing the reports")
        if isinstance(e, KeyboardInterrupt):
            return 130
        return c.note_terminated(e)
    if unsaved:  # a report failed only now (the disk filled, the directory went): keep the result
        _keep_result(outcome, unsaved, ns.outdir or cfg.outdir, "a report could not be written")
    # Announced only when the result is there (a full --logdir leaves none).
    if outcome.session_dir is not None and (Path(outcome.session_dir) / RESULT_FILENAME).is_file():
        print(f"omniprof: session saved in {outcome.session_dir}", file=sys.stderr)
    if not outcome.results:
        print("omniprof: the schedule recorded nothing (more repeats needed?)", file=sys.stderr)
    return exit_code or status


def _check_outputs(ns: argparse.Namespace, cfg: Any, reg: Any) -> None:
    """Before the target runs: every reporter and its options are valid, and every place a file
    will go takes one (``-o DIR``, a config's ``output`` file, ``--logdir DIR``): a
    :class:`UsageError` (exit 2) naming the path and why otherwise, and nothing is run."""
    from omniprof.core.reporting import make_reporter

    for spec in cfg.reporters:
        rep = make_reporter(spec.name, spec.options, reg)
        if rep.output == "stream":
            continue
        if spec.output and not ns.outdir:
            c.check_output_dir(os.path.dirname(os.path.abspath(spec.output)),
                               f"the output of reporter {spec.name!r} in the config")
        else:
            c.check_output_dir(ns.outdir or cfg.outdir or ".", "-o DIR")
    if cfg.logdir:
        c.check_output_dir(str(cfg.logdir), "--logdir DIR")


def _keep_result(outcome: Any, results: list[Any], outdir: str | None, why: str) -> None:
    """Say where ``results`` are, when their reports were interrupted or failed: the session
    directory (``--logdir``), or else ``omniprof.result.json`` saved now under a free name in the
    first place that takes it: the output directory, the working directory, the temporary
    directory. A further Ctrl-C waits for those writes. One line says where."""
    import tempfile

    from omniprof.core.fileio import atomic_write_bytes
    from omniprof.core.forks import deferred_signals
    from omniprof.core.profiler import RESULT_FILENAME

    session = outcome.session_dir
    if session is not None and (Path(session) / RESULT_FILENAME).is_file():
        print(f"omniprof: {why}; the result is saved in {session}", file=sys.stderr)
        return
    kept = []
    places = list(dict.fromkeys(os.path.abspath(p) for p in (outdir or ".", ".", tempfile.gettempdir())))
    with deferred_signals():
        for result in results:
            data = result.to_json().encode("utf-8")
            errors = []
            for where in places:
                try:
                    Path(where).mkdir(parents=True, exist_ok=True)
                    kept.append(atomic_write_bytes(Path(where) / RESULT_FILENAME, data, overwrite=False))
                    break
                except OSError as e:
                    errors.append(f"{where}: {e.strerror or e}")
            else:
                print(f"omniprof: error: {why}, and the result could not be saved anywhere ({'; '.join(errors)})",
                      file=sys.stderr)
    if kept:
        names = ", ".join(str(p) for p in kept)
        print(f"omniprof: {why}; the result is saved in {names} (omniprof report {kept[0]} -r NAME writes "
              f"any report from it)", file=sys.stderr)
