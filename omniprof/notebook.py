"""IPython / Jupyter magics: ``%load_ext omniprof``, then ``%omniprof`` and ``%%omniprof``.

``%omniprof [options] statement`` profiles one statement, ``%%omniprof [options]`` a whole cell,
in the user's namespace (assignments stay). Options are the ``omniprof run`` ones:
``-b BACKEND`` (repeatable or comma-separated), ``-r REPORTER`` (file reporters write to ``-o``),
``-O KEY=VALUE``, ``-R REPORTER.KEY=VALUE``, ``-o DIR``.

The report is displayed as one object with two forms: rich HTML (the ``html`` reporter's page --
interactive flame graph, call tree, tables -- in a sandboxed iframe) for notebooks, and the
``table`` reporter's text for a terminal IPython, which shows only the text. The last result is
kept in the user's namespace as ``_omniprof`` (a :class:`~omniprof.ProfileResult`).
"""

from __future__ import annotations

import argparse
import html
import io
import re
from typing import Any

__all__ = ["load_ipython_extension", "OmniprofMagics", "display_result"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%omniprof", add_help=False, exit_on_error=False)
    p.add_argument("-b", "--backend", action="append", default=[])
    p.add_argument("-r", "--reporter", action="append", default=[])
    p.add_argument("-O", "--option", action="append", default=[])
    p.add_argument("-R", "--reporter-option", action="append", default=[])
    p.add_argument("-o", "--outdir", default=None)
    return p


def _split(values: list[str]) -> list[str]:
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def _kv(items: list[str], flag: str) -> list[tuple[str, Any]]:
    from omniprof.core.options import parse_cli_value
    from omniprof.errors import InvalidArgumentError

    out = []
    for text in items:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"{flag} expects KEY=VALUE (got {text!r})")
        out.append((key.strip(), parse_cli_value(value)))
    return out


_VALUED = ("-b", "-r", "-O", "-R", "-o", "--backend", "--reporter", "--option", "--reporter-option", "--outdir")


def parse(line: str) -> tuple[argparse.Namespace, str]:
    """Options at the start of a magic line, and the statement after them (as typed).

    >>> ns, code = parse("-b cpu -O cpu.interval_s=0.002 total = work(3)")
    >>> ns.backend, ns.option, code
    (['cpu'], ['cpu.interval_s=0.002'], 'total = work(3)')
    """
    from omniprof.errors import InvalidArgumentError

    opts: list[str] = []
    pos = 0
    while True:
        m = re.match(r"\s*(\S+)", line[pos:])
        if not m or not m.group(1).startswith("-") or m.group(1) == "-":
            break
        flag = m.group(1)
        pos += m.end()
        opts.append(flag)
        if "=" not in flag and flag in _VALUED:
            v = re.match(r"\s*(\"[^\"]*\"|'[^']*'|\S+)", line[pos:])
            if not v:
                raise InvalidArgumentError(f"%omniprof: {flag} needs a value")
            pos += v.end()
            opts.append(v.group(1).strip("'\""))
    try:
        ns, unknown = _parser().parse_known_args(opts)
    except argparse.ArgumentError as e:
        raise InvalidArgumentError(f"%omniprof: {e}") from e
    if unknown:
        raise InvalidArgumentError(f"%omniprof: unknown option {unknown[0]!r} (options: -b -r -O -R -o)")
    return ns, line[pos:].strip()


def run(execute: Any, ns: argparse.Namespace) -> Any:
    """Call ``execute()`` (which runs the cell) under a Profiler built from the magic's options."""
    import omniprof
    from omniprof.core.options import ProfileOptions

    backends = _split(ns.backend) or ["cpu"]
    common: dict[str, Any] = {}
    per_backend: dict[str, dict[str, Any]] = {}
    for key, value in _kv(ns.option, "-O"):
        head, dot, tail = key.partition(".")
        if dot and head in backends:
            per_backend.setdefault(head, {})[tail] = value
        else:
            common[key] = value
    prof = omniprof.Profiler(backend=backends, options=ProfileOptions.from_dict(common) if common else None,
                             backend_options=per_backend or None)
    with prof:
        execute()
    return prof.result


def _reporter_options(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in _kv(ns.reporter_option, "-R"):
        name, dot, opt = key.partition(".")
        if not dot:
            from omniprof.errors import InvalidArgumentError

            raise InvalidArgumentError(f"-R expects REPORTER.KEY=VALUE (got {key!r})")
        out.setdefault(name, {})[opt] = value
    return out


def display_result(result: Any, *, table_options: dict[str, Any] | None = None,
                   html_options: dict[str, Any] | None = None) -> dict[str, str]:
    """The mimebundle shown for a result: ``text/html`` (the html page in an iframe) and
    ``text/plain`` (the table report)."""
    import omniprof
    from omniprof.reporters.html import HtmlOptions, HtmlReporter

    buf = io.StringIO()
    omniprof.report(result, "table", buf, options={"color": "never", **(table_options or {})})
    text = buf.getvalue()
    page = HtmlReporter(HtmlOptions(**(html_options or {}))).page(result)
    frame = (f"<iframe sandbox='allow-scripts' style='width:100%;height:640px;border:1px solid #ddd' "
             f"srcdoc=\"{html.escape(page, quote=True)}\"></iframe>")
    return {"text/plain": text, "text/html": frame}


def _show(result: Any, ns: argparse.Namespace) -> None:
    from IPython.display import display

    import omniprof

    ropts = _reporter_options(ns)
    reporters = _split(ns.reporter)
    for name in reporters:
        if name in ("table", "html"):
            continue
        path = omniprof.report(result, name, ns.outdir or ".", options=ropts.get(name))
        print(f"omniprof: {name} report written to {path}")
    display(display_result(result, table_options=ropts.get("table"), html_options=ropts.get("html")), raw=True)


def _magics_class() -> Any:
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

    @magics_class
    class OmniprofMagics(Magics):
        """``%omniprof`` (one statement) and ``%%omniprof`` (a cell)."""

        @line_magic("omniprof")
        def omniprof_line(self, line: str) -> Any:
            ns, code = parse(line)
            if not code:
                from omniprof.errors import InvalidArgumentError

                raise InvalidArgumentError("%omniprof needs a statement to profile, e.g. %omniprof work()")
            return self._go(ns, code)

        @cell_magic("omniprof")
        def omniprof_cell(self, line: str, cell: str) -> Any:
            ns, rest = parse(line)
            return self._go(ns, (rest + "\n" if rest else "") + cell)

        def _go(self, ns: argparse.Namespace, code: str) -> None:
            # IPython runs the code itself, in the user's namespace, with its own transformations
            # (magics and top-level await inside the cell work); errors show as IPython shows them.
            outcome: list[Any] = []
            result = run(lambda: outcome.append(self.shell.run_cell(code, store_history=False)), ns)
            self.shell.user_ns["_omniprof"] = result
            _show(result, ns)

    return OmniprofMagics


def __getattr__(name: str) -> Any:
    if name == "OmniprofMagics":
        return _magics_class()
    raise AttributeError(name)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext omniprof``."""
    ipython.register_magics(_magics_class())
