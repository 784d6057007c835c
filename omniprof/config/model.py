"""The validated configuration of a run: :class:`RunConfig` and its parts, and the keys a
config may hold (file, ``OMNIPROF_*`` environment, command line)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from omniprof.core import validators as v
from omniprof.core.options import ProfileOptions
from omniprof.core.schedule import Schedule
from omniprof.errors import InvalidArgumentError


CONFIG_ENV = "OMNIPROF_CONFIG"
PROFILE_ENV = "OMNIPROF_PROFILE"

#: Top-level keys of a config (and of each ``[profiles.NAME]``), with one line on each.
TOP_KEYS: dict[str, str] = {
    "script": "path of a Python script to run (relative to the config file)",
    "module": "module to run as `python -m MODULE`",
    "function": "'package.module:function' to call",
    "args": "argv of the script/module, or positional arguments of the function",
    "kwargs": "keyword arguments of the function",
    "backend": "backend name or list of names run together on one timeline (default: cpu)",
    "options": "ProfileOptions: host/device/python tracer levels, advanced_configuration",
    "backends": "per-backend options: [backends.NAME] key = value",
    "schedule": "wait / warmup / active / repeat / skip_first steps",
    "repeats": "run the target this many times, Profiler.step() between runs",
    "duration_s": "run the target again and again until this many seconds have passed",
    "reporter": "reporter name or list of names (default: the [reporters] tables, else table)",
    "reporters": "per-reporter options: [reporters.NAME] key = value; `output` is its output path",
    "env": "environment variables set for the run",
    "logdir": "save each session in the XProf layout under this directory",
    "outdir": "directory for file reports",
    "label": "free text stored in the result",
    "verbose": "let native profiler libraries log",
    "distributed": "every rank of a torch.distributed or jax.distributed job profiles the same steps into one run (docs/distributed.md)",
    "plugins": "a plugins.toml to use",
    "no_plugin": "plugin names to switch off",
    "profiles": "named profiles: [profiles.NAME] with any of the keys above",
}
_TARGET_KEYS = ("script", "module", "function")
FUNCTION_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_MODULE_NAME = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_PATH_KEYS = ("script", "logdir", "outdir", "plugins")

#: ``OMNIPROF_*`` variables read as a layer above the file: variable -> key path.
ENV_KEYS: dict[str, tuple[str, ...]] = {
    "OMNIPROF_BACKEND": ("backend",),
    "OMNIPROF_REPORTER": ("reporter",),
    "OMNIPROF_LOGDIR": ("logdir",),
    "OMNIPROF_OUTDIR": ("outdir",),
    "OMNIPROF_LABEL": ("label",),
    "OMNIPROF_REPEATS": ("repeats",),
    "OMNIPROF_DURATION_S": ("duration_s",),
    "OMNIPROF_VERBOSE": ("verbose",),
    "OMNIPROF_DISTRIBUTED": ("distributed",),
    "OMNIPROF_HOST_TRACER_LEVEL": ("options", "host_tracer_level"),
    "OMNIPROF_DEVICE_TRACER_LEVEL": ("options", "device_tracer_level"),
    "OMNIPROF_PYTHON_TRACER_LEVEL": ("options", "python_tracer_level"),
}
_LIST_ENV = {"OMNIPROF_BACKEND", "OMNIPROF_REPORTER"}


# -- the shape of a config: structured with cattrs (config.load), one validator per key ---------------
def _non_empty(attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{attribute.name!r} must be a non-empty string (got {value!r})")


def _script(inst: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        _non_empty(attribute, value)
        if not Path(value).is_file():
            raise InvalidArgumentError(f"no such script {value!r}")


def _module(inst: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        _non_empty(attribute, value)
        if not _MODULE_NAME.fullmatch(value):
            raise InvalidArgumentError(f"{value!r} is not a module name like 'package.module'")


def _function(inst: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        _non_empty(attribute, value)
        if not FUNCTION_TARGET.fullmatch(value):
            raise InvalidArgumentError(f"{value!r} is not of the form 'package.module:function'")


def _of_type(kind: type, text: str) -> Any:
    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value is not None and not isinstance(value, kind):
            raise InvalidArgumentError(text.format(name=attribute.name, value=value))
    return check


def _names(value: Any) -> Any:
    """``"cpu, xla"`` -> ``["cpu", "xla"]``; anything else as it is (the validator judges it)."""
    return [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else value


def _name_list(inst: Any, attribute: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value)):
        raise InvalidArgumentError(f"{attribute.name!r} must be a name or a non-empty list of names (got {value!r})")


def _plugin_names(inst: Any, attribute: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, list) or not all(isinstance(x, str) for x in value)):
        raise InvalidArgumentError(f"must be a list of plugin names (got {value!r})")


_TABLE = "must be a table {what} (got {{value!r}})"


@attrs.frozen(kw_only=True)
class ConfigData:
    """A config as written (one layer, or the merged layers), each key checked on its own; what
    needs a plugin (backend and reporter options) or several keys (one target, repeats or
    duration_s) is checked by :func:`omniprof.config.load.resolve` afterwards.

    ``omniprof.config.load`` structures a mapping into it with cattrs: every key's problem is
    collected, unknown keys get the nearest valid key. Attributes are the :data:`TOP_KEYS` but
    ``profiles``; None (or empty) means "not given".
    """

    script: str | None = attrs.field(default=None, validator=_script)
    module: str | None = attrs.field(default=None, validator=_module)
    function: str | None = attrs.field(default=None, validator=_function)
    args: list[Any] | None = attrs.field(default=None, validator=_of_type(list, "'{name}' must be a list (got {value!r})"))
    kwargs: dict[str, Any] | None = attrs.field(default=None,
                                                validator=_of_type(dict, "'{name}' must be a table (got {value!r})"))
    backend: list[str] | None = attrs.field(default=None, converter=_names, validator=_name_list)
    options: dict[str, Any] = attrs.field(factory=dict, validator=_of_type(dict, _TABLE.format(what="of profile options")))
    backends: dict[str, Any] = attrs.field(factory=dict, validator=_of_type(
        dict, _TABLE.format(what="of backend names to options")))
    schedule: dict[str, Any] | None = attrs.field(default=None, validator=_of_type(
        dict, _TABLE.format(what="with wait/warmup/active/repeat/skip_first")))
    repeats: int | None = attrs.field(default=None, validator=v.int_in_range(1, optional=True))
    duration_s: float | None = attrs.field(default=None, validator=v.number_in_range(0.0, lo_open=True, optional=True))
    reporter: list[str] | None = attrs.field(default=None, converter=_names, validator=_name_list)
    reporters: dict[str, Any] = attrs.field(factory=dict, validator=_of_type(
        dict, _TABLE.format(what="of reporter names to options")))
    env: dict[str, Any] = attrs.field(factory=dict, validator=_of_type(dict, 'must be a table of NAME = "value" (got {value!r})'))
    logdir: str | None = attrs.field(default=None, validator=attrs.validators.optional(v.is_str))
    outdir: str | None = attrs.field(default=None, validator=attrs.validators.optional(v.is_str))
    label: str | None = attrs.field(default=None, validator=attrs.validators.optional(v.is_str))
    plugins: str | None = attrs.field(default=None, validator=attrs.validators.optional(v.is_str))
    verbose: bool | None = attrs.field(default=None, validator=attrs.validators.optional(v.is_bool))
    distributed: bool | None = attrs.field(default=None, validator=attrs.validators.optional(v.is_bool))
    no_plugin: list[str] | None = attrs.field(default=None, validator=_plugin_names)

    def target(self) -> list[str]:
        """The target keys given (script, module, function), in that order."""
        return [k for k in _TARGET_KEYS if getattr(self, k) is not None]


# -- the validated configuration ------------------------------------------------------------------
@attrs.frozen
class TargetSpec:
    """What to run.

    Attributes:
        kind: ``"script"``, ``"module"`` or ``"function"``.
        value: the script path, module name, or ``"pkg.mod:function"``.
        args: argv (script/module) or positional arguments (function).
        kwargs: keyword arguments (function only).
        base_dir: directory put first on ``sys.path`` while importing a function's module.
    """

    kind: str
    value: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    base_dir: str = ""


@attrs.frozen
class ReporterSpec:
    """A reporter to run after profiling: its name, validated options (plain mapping) and output path."""

    name: str
    options: Mapping[str, Any] = attrs.field(factory=dict)
    output: str | None = None


@attrs.frozen
class RunConfig:
    """A whole, validated run.

    Attributes:
        target: what to run, or None (``config check`` of a file that only sets options).
        backends: backend names, run together.
        options: the :class:`ProfileOptions`.
        backend_options: ``{backend: {key: value}}`` as given (validated by each backend's Options);
            plugins.toml defaults are added under these when the Profiler is built.
        schedule: a :class:`Schedule` or None.
        repeats, duration_s: how often to run the target (at most one is set).
        reporters: reporters in order.
        env: environment variables set for the run.
        logdir, outdir, label, verbose, plugins, no_plugin: as the CLI flags of the same names.
        distributed: ``Profiler(distributed=...)``: coordinate the ranks of a torch.distributed or jax.distributed job.
        source: the config file, profile: the selected profile name.
    """

    target: TargetSpec | None = None
    backends: tuple[str, ...] = ("cpu",)
    options: ProfileOptions = attrs.field(factory=ProfileOptions)
    backend_options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    schedule: Schedule | None = None
    repeats: int | None = None
    duration_s: float | None = None
    reporters: tuple[ReporterSpec, ...] = (ReporterSpec("table"),)
    env: Mapping[str, str] = attrs.field(factory=dict)
    logdir: str | None = None
    outdir: str | None = None
    label: str = ""
    verbose: bool = False
    distributed: bool = False
    plugins: str | None = None
    no_plugin: tuple[str, ...] = ()
    source: str | None = None
    profile: str | None = None

    def repeat_count(self) -> int | None:
        """Runs of the target: ``repeats``; else one schedule's worth of steps; None with ``duration_s``."""
        if self.duration_s is not None:
            return None
        if self.repeats is not None:
            return self.repeats
        if self.schedule is not None:
            s = self.schedule
            return s.skip_first + (s.wait + s.warmup + s.active) * max(s.repeat, 1)
        return 1

    def to_dict(self, registry: Any = None) -> dict[str, Any]:
        """The effective configuration as plain data, defaults filled in (``omniprof config show``)."""
        from omniprof.core.registry import get_registry

        reg = registry or get_registry()
        out: dict[str, Any] = {}
        if self.target is not None:
            out[self.target.kind] = self.target.value
            out["args"] = list(self.target.args)
            if self.target.kind == "function":
                out["kwargs"] = dict(self.target.kwargs)
        out["backend"] = list(self.backends)
        out["options"] = self.options.to_dict()
        out["backends"] = {n: _full_options(reg, "backend", n, self.backend_options.get(n)) for n in self.backends}
        if self.schedule is not None:
            out["schedule"] = self.schedule.to_dict()
        if self.repeats is not None:
            out["repeats"] = self.repeats
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        out["reporter"] = [r.name for r in self.reporters]
        out["reporters"] = {}
        for r in self.reporters:
            entry = _full_options(reg, "reporter", r.name, r.options)
            if r.output is not None:
                entry["output"] = r.output
            out["reporters"][r.name] = entry
        out["env"] = dict(self.env)
        for key in ("logdir", "outdir", "plugins"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["label"] = self.label
        out["verbose"] = self.verbose
        out["distributed"] = self.distributed
        if self.no_plugin:
            out["no_plugin"] = list(self.no_plugin)
        return out


def _full_options(reg: Any, kind: str, name: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    from omniprof.core.registry import options_for

    cls = reg.backend(name) if kind == "backend" else reg.reporter(name)
    return attrs.asdict(options_for(kind, name, cls, dict(given or {}), reg))
