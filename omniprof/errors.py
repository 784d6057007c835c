"""The one error and warning hierarchy of omniprof.

Every error a user can see derives from :class:`OmniprofError`. Messages say what failed, why,
and how to fix it, and name the plugin or file involved.
"""

from __future__ import annotations

__all__ = [
    "OmniprofError",
    "InvalidArgumentError",
    "ConfigError",
    "ProfilerStateError",
    "DistributedError",
    "PluginError",
    "PluginLoadError",
    "PluginValidationError",
    "BackendUnavailableError",
    "BackendError",
    "BackendOptionError",
    "ReporterError",
    "TraceReadError",
    "UsageError",
    "TargetImportError",
    "OutputError",
    "LiveTargetError",
    "OmniprofWarning",
    "DataLossWarning",
    "BackendOptionWarning",
]


class OmniprofError(Exception):
    """Base class of every error raised by omniprof."""


class TargetImportError(OmniprofError):
    """The module of a ``pkg.mod:function`` target raised while being imported: the user's code
    failed, not omniprof. ``__cause__`` is that exception, with the user's traceback."""


class InvalidArgumentError(OmniprofError, ValueError):
    """An option, argument or value is not allowed.

    The message names the key, the bad value, what is allowed, and (for unknown keys) the nearest
    valid key.
    """


class ConfigError(OmniprofError, ValueError):
    """A configuration file has one or more problems.

    Attributes:
        problems: every problem found, each already formatted with file and key path.
        path: the file, when there is one.
    """

    def __init__(self, problems: list[str] | str, path: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        self.path = path
        if len(self.problems) == 1 and not path:  # e.g. one bad flag: one line, as every usage error
            super().__init__(self.problems[0])
            return
        head = f"{len(self.problems)} problem(s) in {path}" if path else f"{len(self.problems)} problem(s)"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


class ProfilerStateError(OmniprofError, RuntimeError):
    """The profiler was asked to do something its current state does not allow."""


class DistributedError(OmniprofError, RuntimeError):
    """A multi-rank run cannot be coordinated: no process group, or ranks that disagree (schedule,
    step number, backends). Raised on every rank alike, so no rank is left waiting."""


class PluginError(OmniprofError):
    """A plugin problem. ``plugin`` is the plugin's name (may be None)."""

    def __init__(self, message: str, plugin: str | None = None) -> None:
        super().__init__(message)
        self.plugin = plugin


class PluginLoadError(PluginError):
    """A plugin could not be imported or found."""


class PluginValidationError(PluginError):
    """A plugin was imported but does not satisfy the plugin API."""


class BackendUnavailableError(PluginError):
    """A backend cannot run on this machine.

    Attributes:
        reason: why not (one sentence).
        hint: how to fix it.
    """

    def __init__(self, reason: str, hint: str = "", plugin: str | None = None) -> None:
        self.reason = reason
        self.hint = hint
        prefix = f"backend {plugin!r} is unavailable: " if plugin else ""
        msg = prefix + reason + (f". {hint}" if hint and not reason.endswith(".") else (f" {hint}" if hint else ""))
        super().__init__(msg, plugin=plugin)


class BackendError(PluginError):
    """A backend failed while starting, stopping or collecting."""


class BackendOptionError(BackendError, InvalidArgumentError):
    """A backend refused its options when it prepared (a contradiction, a device that is not
    there): the user's input, so the CLI exits 2 as for any bad option."""


class ReporterError(PluginError):
    """A reporter failed to write its output."""


class TraceReadError(OmniprofError, ValueError):
    """A trace or result file cannot be read. The message names the file and the position."""


class OutputError(OmniprofError, OSError):
    """An output file or directory could not be written (disk full, read-only, no permission).

    ``errno`` and ``filename`` are set like ``OSError``'s; ``str()`` is the one-line message
    (:func:`omniprof.core.fileio.output_error` makes it).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


class LiveTargetError(OmniprofError):
    """A running process named by pid cannot be read from outside: it is gone, is not CPython 3.10+,
    or this user may not read its memory. ``cause`` is ``"gone"``, ``"not_python"`` or ``"permission"``;
    the message names the cause and the fix in one line."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause


class UsageError(OmniprofError):
    """The command line was used wrongly. The CLI exits with ``exit_code`` (2)."""

    exit_code = 2


class OmniprofWarning(UserWarning):
    """Base class of omniprof's warnings."""


class DataLossWarning(OmniprofWarning):
    """Some data was not recorded (full buffer, event cap, size limit). It is counted in the result."""


class BackendOptionWarning(OmniprofWarning):
    """A backend cannot honour an option it was given; the option's effect is described."""
