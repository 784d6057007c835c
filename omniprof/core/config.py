"""Config-file-driven runs: ``omniprof.toml`` or ``[tool.omniprof]`` in ``pyproject.toml``.

A config describes a whole run: the target (a script, a ``-m`` module, or ``pkg.mod:function``
with arguments), backends and their options, :class:`ProfileOptions`, a schedule, repeats or a
duration, reporters with their options and output paths, and environment variables. Named
profiles (``[profiles.NAME]``) override the base settings.

Layers, lowest first: defaults < file (base, then the selected profile) < ``OMNIPROF_*``
environment variables < command line. Validation collects every problem at once, each with its
origin (``file:line``, the environment variable, or the command line), its key path and, for
unknown keys, the nearest valid key. Backend and reporter options are checked with each plugin's
own ``Options`` class through the registry, so this module knows no backend's fields.

>>> cfg = load_config(text='backend = "cpu"\\nfunction = "math:factorial"\\nargs = [20]\\nrepeats = 2\\n')
>>> cfg.backends, cfg.target.kind, cfg.repeat_count()
(('cpu',), 'function', 2)

.. versionadded:: 0.1
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.core import validators as v
from omniprof.core.options import ADVANCED_KEYS, ProfileOptions, parse_cli_value
from omniprof.core.schedule import Schedule
from omniprof.core.tomlpos import key_lines, line_of
from omniprof.errors import ConfigError, InvalidArgumentError, PluginError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "RunConfig", "TargetSpec", "ReporterSpec", "Layer", "load_config", "check_config",
    "find_config", "read_layers", "check_plugins_file", "env_layer", "cli_layer", "resolve", "dump_toml",
    "CONFIG_ENV", "PROFILE_ENV", "ENV_KEYS", "TOP_KEYS",
]

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
    "plugins": "a plugins.toml to use",
    "no_plugin": "plugin names to switch off",
    "profiles": "named profiles: [profiles.NAME] with any of the keys above",
}
_TARGET_KEYS = ("script", "module", "function")
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
    "OMNIPROF_HOST_TRACER_LEVEL": ("options", "host_tracer_level"),
    "OMNIPROF_DEVICE_TRACER_LEVEL": ("options", "device_tracer_level"),
    "OMNIPROF_PYTHON_TRACER_LEVEL": ("options", "python_tracer_level"),
}
_LIST_ENV = {"OMNIPROF_BACKEND", "OMNIPROF_REPORTER"}


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
        if self.no_plugin:
            out["no_plugin"] = list(self.no_plugin)
        return out


def _full_options(reg: Any, kind: str, name: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    from omniprof.core.registry import options_for

    cls = reg.backend(name) if kind == "backend" else reg.reporter(name)
    return attrs.asdict(options_for(kind, name, cls, dict(given or {}), reg))


# -- layers -----------------------------------------------------------------------------------------
@attrs.define
class Layer:
    """One source of settings: plain data plus where each key path came from.

    ``origin(path)`` gives ``"file:line"``, ``"environment variable X"`` or ``"command line"``.
    """

    data: dict[str, Any]
    name: str
    lines: dict[tuple[str, ...], int] = attrs.field(factory=dict)
    line_prefix: tuple[str, ...] = ()
    base_dir: Path = attrs.field(factory=Path.cwd)
    env_names: dict[tuple[str, ...], str] = attrs.field(factory=dict)

    def key_path(self, path: Sequence[str | int]) -> tuple[str | int, ...]:
        """``path`` as it is spelled in this layer's file (under its profile or ``tool.omniprof``)."""
        return (*self.line_prefix, *path) if self.lines else tuple(path)

    def origin(self, path: Sequence[str]) -> str:
        if self.lines:
            line = line_of(self.lines, (*self.line_prefix, *path))
            return f"{self.name}:{line}" if line else self.name
        for p, var in self.env_names.items():
            if tuple(path[: len(p)]) == p:
                return f"environment variable {var}"
        return self.name


def find_config(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """``omniprof.toml`` in ``directory`` (default: cwd), else a ``pyproject.toml`` there with ``[tool.omniprof]``."""
    d = Path(directory) if directory is not None else Path.cwd()
    own = d / "omniprof.toml"
    if own.is_file():
        return own
    py = d / "pyproject.toml"
    if py.is_file():
        try:
            data = tomllib.loads(py.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
        if isinstance(data.get("tool"), dict) and "omniprof" in data["tool"]:
            return py
    return None


def _parse_file(path: Path, text: str | None = None) -> tuple[dict[str, Any], dict[tuple[str, ...], int], tuple[str, ...]]:
    name = str(path)
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as e:
            raise ConfigError([f"{name}: no such config file"], path=name) from e
        except OSError as e:
            raise ConfigError([f"{name}: cannot read: {e.strerror or e}"], path=name) from e
        except UnicodeDecodeError as e:
            raise ConfigError([f"{name}: not UTF-8 text (byte {e.start})"], path=name) from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{name}: invalid TOML: {e}"], path=name) from e
    lines = key_lines(text)
    prefix: tuple[str, ...] = ()
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        if not isinstance(tool, dict) or "omniprof" not in tool:
            raise ConfigError([f"{name}: has no [tool.omniprof] table; add one, or use an omniprof.toml"], path=name)
        data = tool["omniprof"]
        prefix = ("tool", "omniprof")
        if not isinstance(data, dict):
            raise ConfigError([f"{name}:{line_of(lines, prefix)}: $.tool.omniprof: must be a table"], path=name)
    return data, lines, prefix


def read_layers(path: str | os.PathLike[str] | None, profile: str | None = None, *,
                text: str | None = None) -> tuple[list[Layer], list[str]]:
    """The file's layers (base, then ``profile``) and early problems (unknown profile...)."""
    if path is None and text is None:
        return [], []
    p = Path(path) if path is not None else Path("<config>")
    data, lines, prefix = _parse_file(p, text)
    base_dir = p.resolve().parent if path is not None else Path.cwd()
    problems: list[str] = []
    name = str(p)
    base = {k: val for k, val in data.items() if k != "profiles"}
    layers = [Layer(_resolve_paths(base, base_dir, problems, (name, lines, prefix)), name, lines, prefix, base_dir)]
    profiles = data.get("profiles", {})
    if profile is not None:
        if not isinstance(profiles, dict) or profile not in profiles:
            known = sorted(profiles) if isinstance(profiles, dict) else []
            near = v.nearest(profile, known)
            problems.append(f"{name}: no profile {profile!r}" + (f"; did you mean {near!r}?" if near else "")
                            + f" Profiles: {', '.join(known) or 'none'}")
        elif not isinstance(profiles[profile], dict):
            problems.append(f"{name}:{line_of(lines, (*prefix, 'profiles', profile))}: $.profiles.{profile}: "
                            f"must be a table")
        else:
            layers.append(Layer(_resolve_paths(profiles[profile], base_dir, problems,
                                               (name, lines, (*prefix, "profiles", profile))), name, lines,
                                (*prefix, "profiles", profile), base_dir))
    return layers, problems


_WRITTEN_PATH_KEYS = ("logdir", "outdir")


def _resolve_paths(data: dict[str, Any], base_dir: Path, problems: list[str] | None = None,
                   where: tuple[str, dict[tuple[str, ...], int], tuple[str, ...]] | None = None) -> dict[str, Any]:
    """Relative paths are taken from the config file's directory. An output path (``logdir``,
    ``outdir``, a reporter's ``output``) written relatively may not climb out of that directory
    with ``..``: a config file from a checkout cannot make omniprof write elsewhere unless it
    spells the place out as an absolute path."""
    out = copy.deepcopy(data)

    def escape_check(path: tuple[str, ...], value: str) -> None:
        if problems is None or where is None or os.path.isabs(value):
            return
        target = os.path.normpath(os.path.join(base_dir, value))
        if os.path.commonpath([target, str(base_dir)]) != str(base_dir):
            name, lines, prefix = where
            line = line_of(lines, (*prefix, *path))
            problems.append(f"{name}:{line}: {show_path(path)}: {value!r} leads outside the config file's directory "
                            f"({base_dir}); relative output paths must stay inside it. Write an absolute path to "
                            f"put output elsewhere")

    for key in _PATH_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            if key in _WRITTEN_PATH_KEYS:
                escape_check((key,), out[key])
            out[key] = str(base_dir / out[key])
    reps = out.get("reporters")
    if isinstance(reps, dict):
        for rname, spec in reps.items():
            if isinstance(spec, dict) and isinstance(spec.get("output"), str) and spec["output"]:
                escape_check(("reporters", str(rname), "output"), spec["output"])
                spec["output"] = str(base_dir / spec["output"])
    return out


def env_layer(environ: Mapping[str, str] | None = None) -> Layer:
    """The ``OMNIPROF_*`` variables of :data:`ENV_KEYS` as a layer (values parsed like ``-O``)."""
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    names: dict[tuple[str, ...], str] = {}
    for var, path in ENV_KEYS.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        if var in _LIST_ENV:
            value: Any = [x.strip() for x in raw.split(",") if x.strip()]
        elif path[-1] in ("logdir", "outdir", "label"):
            value = raw
        elif path[-1] == "verbose":
            low = raw.strip().lower()
            value = True if low in ("1", "true", "yes", "on") else False if low in ("0", "false", "no", "off") else raw
        else:
            value = parse_cli_value(raw)
        _set(data, path, value)
        names[path] = var
    return Layer(data, "environment", env_names=names)


def cli_layer(*, backends: Sequence[str] = (), options: Sequence[str] = (), reporters: Sequence[str] = (),
              reporter_options: Sequence[str] = (), outdir: str | None = None, logdir: str | None = None,
              label: str | None = None, verbose: bool | None = None, script: str | None = None,
              module: str | None = None, function: str | None = None, args: Sequence[str] = (),
              plugins: str | None = None, no_plugin: Sequence[str] = ()) -> Layer:
    """Command-line flags as a layer. ``options`` are ``-O`` items (``key=value``,
    ``advanced_configuration.KEY=V``, a bare advanced key, or ``BACKEND.KEY=V``); ``reporter_options``
    are ``-R REPORTER.KEY=VALUE`` items."""
    data: dict[str, Any] = {}
    if backends:
        data["backend"] = [x.strip() for b in backends for x in b.split(",") if x.strip()]
    if reporters:
        data["reporter"] = [x.strip() for r in reporters for x in r.split(",") if x.strip()]
    for item in options:
        key, value = _kv(item, "-O")
        head, dot, rest = key.partition(".")
        if dot and head == "advanced_configuration":
            _set(data, ("options", "advanced_configuration", rest), value)
        elif dot:
            _set(data, ("backends", head, *rest.split(".")), value)
        elif key in ADVANCED_KEYS:
            _set(data, ("options", "advanced_configuration", key), value)
        elif key in _PROFILE_OPTION_KEYS:
            _set(data, ("options", key), value)
        else:  # a misspelt option or advanced key: name the nearest of both
            raise InvalidArgumentError(v.unknown_key_message(key, [*_PROFILE_OPTION_KEYS, *ADVANCED_KEYS],
                                                             what="profile option"))
    for item in reporter_options:
        key, value = _kv(item, "-R")
        name, dot, rest = key.partition(".")
        if not dot:
            raise InvalidArgumentError(f"-R expects REPORTER.KEY=VALUE (got {item!r})")
        _set(data, ("reporters", name, rest), value)
    for key, val in (("outdir", outdir), ("logdir", logdir), ("label", label), ("verbose", verbose),
                     ("plugins", plugins)):
        if val is not None and val != "":
            data[key] = str(Path(val).resolve()) if key in ("outdir", "logdir", "plugins") else val
    if no_plugin:
        data["no_plugin"] = list(no_plugin)
    if script is not None:
        data["script"] = str(Path(script).resolve())
        data["args"] = list(args)
    elif module is not None:
        data["module"] = module
        data["args"] = list(args)
    elif function is not None:
        data["function"] = function
        data["args"] = [parse_cli_value(a) for a in args]  # JSON where it parses: `20` is an int
    return Layer(data, "command line")


_PROFILE_OPTION_KEYS = ("host_tracer_level", "device_tracer_level", "python_tracer_level", "advanced_configuration")

FUNCTION_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_function_target(text: str) -> bool:
    """``package.module:function`` (and not an existing file)."""
    return bool(FUNCTION_TARGET.fullmatch(text)) and not Path(text).exists()


def _kv(text: str, flag: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise InvalidArgumentError(f"{flag} expects KEY=VALUE (got {text!r})")
    return key.strip(), parse_cli_value(value)


def _set(data: dict[str, Any], path: Sequence[str], value: Any) -> None:
    d = data
    for p in path[:-1]:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = d[p] = {}
        d = nxt
    d[path[-1]] = value


# -- merging with origins ---------------------------------------------------------------------------
def _merge(layers: Sequence[Layer]) -> tuple[dict[str, Any], dict[tuple[str, ...], Layer]]:
    """Deep-merge layers (tables merge, other values replace); remember which layer set each path."""
    merged: dict[str, Any] = {}
    origin: dict[tuple[str, ...], Layer] = {}
    for layer in layers:
        data = layer.data
        if any(k in data for k in _TARGET_KEYS):
            # a target given here replaces the lower layers' target and its arguments
            for k in (*_TARGET_KEYS, "args", "kwargs"):
                merged.pop(k, None)
        _merge_into(merged, data, (), layer, origin)
    return merged, origin


def _merge_into(dst: dict[str, Any], src: Mapping[str, Any], prefix: tuple[str, ...], layer: Layer,
                origin: dict[tuple[str, ...], Layer]) -> None:
    for k, val in src.items():
        path = (*prefix, k)
        if isinstance(val, dict) and isinstance(dst.get(k), dict):
            origin.setdefault(path, layer)
            _merge_into(dst[k], val, path, layer, origin)
        else:
            dst[k] = copy.deepcopy(val)
            origin[path] = layer
            _set_origins(val, path, layer, origin)


def _set_origins(val: Any, path: tuple[str, ...], layer: Layer, origin: dict[tuple[str, ...], Layer]) -> None:
    if isinstance(val, dict):
        for k, sub in val.items():
            origin[(*path, k)] = layer
            _set_origins(sub, (*path, k), layer, origin)


class _Problems:
    def __init__(self, origin: Mapping[tuple[str, ...], Layer], default: str) -> None:
        self.items: list[str] = []
        self.origin = origin
        self.default = default

    def add(self, path: Sequence[str | int], message: str) -> None:
        keys = tuple(str(p) for p in path if not isinstance(p, int))
        layer = None
        for k in range(len(keys), 0, -1):
            layer = self.origin.get(keys[:k])
            if layer is not None:
                break
        where = layer.origin(keys) if layer is not None else self.default
        full = layer.key_path(path) if layer is not None else tuple(path)
        self.items.append(f"{where}: {show_path(full)}: {message}")


def _from_command_line(pr: _Problems, path: tuple[str, ...]) -> bool:
    """Whether any key under ``path`` was set on the command line (``-O``)."""
    return any(k[:len(path)] == path and layer.name == "command line" for k, layer in pr.origin.items())


def show_path(path: Sequence[str | int]) -> str:
    """``$.backends.cpu.interval_s``, ``$.backend[1]``, ``$.env."A B"``."""
    out = "$"
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += "." + (p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p))
    return out


# -- validation -------------------------------------------------------------------------------------
def resolve(layers: Sequence[Layer], *, registry: Any = None, source: str | None = None,
            profile: str | None = None, early_problems: Sequence[str] = ()) -> RunConfig:
    """Merge ``layers`` and validate the result; raises :class:`ConfigError` listing every problem."""
    from omniprof.core.registry import Registry, get_registry

    merged, origin = _merge(layers)
    problems = _Problems(origin, source or "configuration")
    problems.items.extend(early_problems)
    reg = registry
    if reg is None:
        if "plugins" in merged or "no_plugin" in merged:
            try:
                reg = Registry(plugins_file=merged.get("plugins") if isinstance(merged.get("plugins"), str) else None,
                               disable=[x for x in merged.get("no_plugin", []) if isinstance(x, str)]
                               if isinstance(merged.get("no_plugin"), list) else ())
            except ConfigError as e:
                problems.items.extend(e.problems)
                reg = get_registry()
        else:
            reg = get_registry()
    cfg = _validate(merged, problems, reg, source, profile)
    if cfg.target is not None and cfg.target.kind == "function":
        layer = origin.get(("function",))
        base = str(layer.base_dir) if layer is not None else os.getcwd()
        cfg = attrs.evolve(cfg, target=attrs.evolve(cfg.target, base_dir=base))
        _check_importable(cfg.target, problems)
    if problems.items:
        raise ConfigError(problems.items, path=source)
    return cfg


def _validate(d: Mapping[str, Any], pr: _Problems, reg: Any, source: str | None, profile: str | None) -> RunConfig:
    for k in d:
        if k == "profiles":
            pr.add((k,), "profiles cannot be nested: put [profiles.NAME] tables at the top level")
        elif k not in TOP_KEYS:
            pr.add((k,), v.unknown_key_message(k, TOP_KEYS, what="key"))
    kw: dict[str, Any] = {"source": source, "profile": profile}

    # target
    given = [k for k in _TARGET_KEYS if k in d]
    target = None
    if len(given) > 1:
        pr.add((given[1],), f"give one of script, module, function (got {', '.join(given)})")
    elif given:
        target = _target(d, given[0], pr)
    else:
        for k in ("args", "kwargs"):
            if k in d:
                pr.add((k,), f"{k!r} needs a target: set script, module or function")
    kw["target"] = target

    # backends
    backends = _names(d, "backend", pr, default=None)
    bopts = d.get("backends", {})
    if not isinstance(bopts, dict):
        pr.add(("backends",), f"must be a table of backend names to options (got {bopts!r})")
        bopts = {}
    if backends is None:
        backends = ["cpu"]
    known_backends = reg.names("backend", include_disabled=True)
    for i, name in enumerate(backends):
        _check_plugin(reg, "backend", name, ("backend", i) if "backend" in d else ("backend",), pr,
                      known_backends)
    if len(set(backends)) != len(backends):
        pr.add(("backend",), f"lists a backend twice: {backends}")
    kw["backends"] = tuple(backends)
    checked: dict[str, dict[str, Any]] = {}
    for name, given_opts in bopts.items():
        path = ("backends", name)
        if not isinstance(given_opts, dict):
            pr.add(path, f"must be a table of options (got {given_opts!r})")
            continue
        if name not in backends and _from_command_line(pr, path):
            pr.add(path, f"-O {name}.KEY: backend {name!r} is not selected (selected: {', '.join(backends)}); "
                         f"add -b {name}")
            continue
        cls = _check_plugin(reg, "backend", name, path, pr, known_backends)
        if cls is not None:
            _option_problems(cls.Options, {**reg.default_options("backend", name), **given_opts}, path,
                             f"backend {name!r}", pr, given_opts)
        checked[name] = dict(given_opts)
    kw["backend_options"] = {n: checked[n] for n in backends if n in checked}

    # profile options
    kw["options"] = _profile_options(d.get("options", {}), pr)

    # schedule / repeats / duration
    sched = d.get("schedule")
    if sched is not None:
        if not isinstance(sched, dict):
            pr.add(("schedule",), f"must be a table with wait/warmup/active/repeat/skip_first (got {sched!r})")
        elif _option_problems(Schedule, sched, ("schedule",), "schedule", pr, sched):
            kw["schedule"] = Schedule(**sched)
    if "repeats" in d:
        if _field_ok(v.int_in_range(1), "repeats", d["repeats"], ("repeats",), pr):
            kw["repeats"] = d["repeats"]
    if "duration_s" in d:
        if _field_ok(v.number_in_range(0.0, lo_open=True), "duration_s", d["duration_s"], ("duration_s",), pr):
            kw["duration_s"] = float(d["duration_s"])
    if "repeats" in d and "duration_s" in d:
        pr.add(("duration_s",), "give either repeats or duration_s, not both")

    # reporters
    ropts = d.get("reporters", {})
    if not isinstance(ropts, dict):
        pr.add(("reporters",), f"must be a table of reporter names to options (got {ropts!r})")
        ropts = {}
    reporters = _names(d, "reporter", pr, default=None)
    if reporters is None:
        reporters = list(ropts) or ["table"]
    known_reporters = reg.names("reporter", include_disabled=True)
    for i, name in enumerate(reporters):
        _check_plugin(reg, "reporter", name, ("reporter", i) if "reporter" in d else ("reporter",), pr,
                      known_reporters)
    specs = {}
    for name, spec in ropts.items():
        path = ("reporters", name)
        if not isinstance(spec, dict):
            pr.add(path, f"must be a table of options (got {spec!r})")
            continue
        spec = dict(spec)
        output = spec.pop("output", None)
        if output is not None and not isinstance(output, str):
            pr.add((*path, "output"), f"'output' must be a path string (got {output!r})")
            output = None
        cls = _check_plugin(reg, "reporter", name, path, pr, known_reporters)
        if cls is not None:
            _option_problems(cls.Options, {**reg.default_options("reporter", name), **spec}, path,
                             f"reporter {name!r}", pr, spec, extra=("output",))
        specs[name] = ReporterSpec(name, spec, output)
    kw["reporters"] = tuple(specs.get(n, ReporterSpec(n)) for n in reporters)

    # env
    env = d.get("env", {})
    if not isinstance(env, dict):
        pr.add(("env",), f"must be a table of NAME = \"value\" (got {env!r})")
        env = {}
    env_out = {}
    for name, val in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            pr.add(("env", name), f"{name!r} is not a valid environment variable name")
        elif isinstance(val, bool):
            env_out[name] = "1" if val else "0"
        elif isinstance(val, (str, int, float)):
            env_out[name] = str(val)
        else:
            pr.add(("env", name), f"environment values must be strings or numbers (got {val!r})")
    kw["env"] = env_out

    # plain scalars
    for key in ("logdir", "outdir", "label", "plugins"):
        if key in d:
            if _field_ok(v.is_str, key, d[key], (key,), pr):
                kw[key] = d[key]
    if "verbose" in d and _field_ok(v.is_bool, "verbose", d["verbose"], ("verbose",), pr):
        kw["verbose"] = d["verbose"]
    if "no_plugin" in d:
        np_ = d["no_plugin"]
        if not isinstance(np_, list) or not all(isinstance(x, str) for x in np_):
            pr.add(("no_plugin",), f"must be a list of plugin names (got {np_!r})")
        else:
            kw["no_plugin"] = tuple(np_)
    return RunConfig(**kw)


def _target(d: Mapping[str, Any], kind: str, pr: _Problems) -> TargetSpec | None:
    value = d[kind]
    ok = True
    if not isinstance(value, str) or not value:
        pr.add((kind,), f"{kind!r} must be a non-empty string (got {value!r})")
        return None
    args = d.get("args", [])
    kwargs = d.get("kwargs", {})
    if not isinstance(args, list):
        pr.add(("args",), f"'args' must be a list (got {args!r})")
        args, ok = [], False
    if kind in ("script", "module") and not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                                for a in args):
        pr.add(("args",), f"'args' of a {kind} is its argv: strings or numbers (got {args!r})")
        ok = False
    if "kwargs" in d and kind != "function":
        pr.add(("kwargs",), f"'kwargs' is for a function target; a {kind} takes 'args' (its argv)")
    if not isinstance(kwargs, dict):
        pr.add(("kwargs",), f"'kwargs' must be a table (got {kwargs!r})")
        kwargs, ok = {}, False
    base_dir = ""
    if kind == "script":
        if not Path(value).is_file():
            pr.add((kind,), f"no such script {value!r}")
            ok = False
        args = [str(a) for a in args]
    elif kind == "module":
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", value):
            pr.add((kind,), f"{value!r} is not a module name like 'package.module'")
            ok = False
        args = [str(a) for a in args]
    else:
        if not FUNCTION_TARGET.fullmatch(value):
            pr.add((kind,), f"{value!r} is not of the form 'package.module:function'")
            ok = False
    if not ok:
        return None
    return TargetSpec(kind, value, tuple(args), dict(kwargs), base_dir)


def _check_importable(target: TargetSpec, pr: _Problems) -> None:
    """The function's module can be found (its parent packages are imported; the module is not run)."""
    mod_name = target.value.partition(":")[0]
    added = target.base_dir not in sys.path
    if added:
        sys.path.insert(0, target.base_dir)
    try:
        found = importlib.util.find_spec(mod_name) is not None
        reason = "not found"
    except (ImportError, ValueError) as e:
        found, reason = False, f"{type(e).__name__}: {e}"
    finally:
        if added:
            sys.path.remove(target.base_dir)
    if not found:
        pr.add(("function",), f"module {mod_name!r} of {target.value!r} cannot be imported ({reason}) from "
                              f"{target.base_dir} or sys.path")


def _names(d: Mapping[str, Any], key: str, pr: _Problems, default: list[str] | None) -> list[str] | None:
    if key not in d:
        return default
    val = d[key]
    if isinstance(val, str):
        val = [x.strip() for x in val.split(",") if x.strip()]
    if not isinstance(val, list) or not val or not all(isinstance(x, str) for x in val):
        pr.add((key,), f"{key!r} must be a name or a non-empty list of names (got {d[key]!r})")
        return default
    return list(val)


def _check_plugin(reg: Any, kind: str, name: str, path: tuple[Any, ...], pr: _Problems,
                  known: list[str]) -> type | None:
    if name not in known:
        msg = v.unknown_key_message(name, known, what=kind).replace("Valid keys", f"Registered {kind}s")
        ignored = getattr(reg, "ignored_plugins_file", None)
        if ignored is not None:
            msg += (f" ({ignored} was not loaded: name it with --plugins or OMNIPROF_PLUGINS, or trust it with "
                    f"`omniprof plugins --trust`)")
        pr.add(path, msg)
        return None
    try:
        return reg.backend(name) if kind == "backend" else reg.reporter(name)
    except PluginError as e:
        pr.add(path, str(e))
        return None


def _field_ok(validator: Callable[..., None], name: str, value: Any, path: tuple[str, ...], pr: _Problems) -> bool:
    try:
        validator(None, name, value)
    except InvalidArgumentError as e:
        pr.add(path, str(e))
        return False
    return True


def _option_problems(cls: type, data: Mapping[str, Any], path: tuple[str, ...], owner: str, pr: _Problems,
                     given: Mapping[str, Any], extra: Sequence[str] = ()) -> bool:
    """Check every key of ``data`` against attrs class ``cls``, each on its own, so all problems show.

    Keys that came from plugins.toml defaults (not in ``given``) are reported at the table's path.
    """
    fields = {(a.alias if getattr(a, "alias", None) else a.name): a for a in attrs.fields(cls)}
    ok = True
    for key, val in data.items():
        where = (*path, key) if key in given else path
        if key not in fields:
            pr.add(where, f"{owner}: " + v.unknown_key_message(key, [*fields, *extra], what="option"))
            ok = False
            continue
        try:
            cls(**{key: val})
        except (InvalidArgumentError, TypeError, ValueError) as e:
            msg = str(e)
            pr.add(where, msg if msg.startswith(owner) else f"{owner}: {msg}")
            ok = False
    if ok:
        try:
            cls(**dict(data))
        except (InvalidArgumentError, TypeError, ValueError) as e:
            pr.add(path, f"{owner}: {e}")
            ok = False
    return ok


def _profile_options(data: Any, pr: _Problems) -> ProfileOptions:
    path = ("options",)
    if not isinstance(data, dict):
        pr.add(path, f"must be a table of profile options (got {data!r})")
        return ProfileOptions()
    fields = [a.name for a in attrs.fields(ProfileOptions)]
    good: dict[str, Any] = {}
    for key, val in data.items():
        if key not in fields:
            hint = " (advanced keys go under [options.advanced_configuration])" if key in ADVANCED_KEYS else ""
            pr.add((*path, key), v.unknown_key_message(key, fields, what="profile option") + hint)
            continue
        if key == "advanced_configuration":
            if not isinstance(val, dict):
                pr.add((*path, key), f"must be a table of advanced keys (got {val!r})")
                continue
            adv = {}
            for ak, av in val.items():
                if ak not in ADVANCED_KEYS:
                    pr.add((*path, key, ak), v.unknown_key_message(ak, ADVANCED_KEYS, what="advanced_configuration key"))
                    continue
                try:
                    ADVANCED_KEYS[ak].validate(av)
                    adv[ak] = av
                except InvalidArgumentError as e:
                    pr.add((*path, key, ak), str(e))
            good[key] = adv
            continue
        try:
            ProfileOptions(**{key: val})
            good[key] = val
        except InvalidArgumentError as e:
            pr.add((*path, key), str(e))
    return ProfileOptions(**good)


# -- entry points -----------------------------------------------------------------------------------
def load_config(path: str | os.PathLike[str] | None = None, profile: str | None = None, *,
                text: str | None = None, environ: Mapping[str, str] | None = None,
                cli: Layer | None = None, registry: Any = None) -> RunConfig:
    """Read, layer and validate a configuration.

    Args:
        path: an ``omniprof.toml`` or ``pyproject.toml`` (None: no file, unless ``text``).
        profile: a ``[profiles.NAME]`` to apply over the base settings.
        text: TOML text instead of a file (tests, docs).
        environ: environment to read ``OMNIPROF_*`` from (default ``os.environ``; ``{}`` for none).
        cli: a :func:`cli_layer` on top.
        registry: plugin registry (default: the process-wide one).

    Raises:
        ConfigError: with every problem found, each naming file:line (or env var / command line),
            key path and, for unknown keys, the nearest valid key.
    """
    layers, early = read_layers(path, profile, text=text)
    layers.append(env_layer(environ))
    if cli is not None:
        layers.append(cli)
    source = str(path) if path is not None else ("<config>" if text is not None else None)
    return resolve(layers, registry=registry, source=source, profile=profile, early_problems=early)


def check_config(path: str | os.PathLike[str], *, profile: str | None = None, registry: Any = None,
                 environ: Mapping[str, str] | None = None) -> list[str]:
    """Every problem of a config file: its base settings and each profile (or only ``profile``).

    Returns the problems (empty when the file is valid); unreadable files and invalid TOML are
    problems too. Never runs the target.
    """
    env = {} if environ is None else environ
    try:
        data, _, _ = _parse_file(Path(path))
    except ConfigError as e:
        return list(e.problems)
    profiles = data.get("profiles", {})
    names: list[str | None] = [profile] if profile is not None else [None]
    if profile is None and isinstance(profiles, dict):
        names += sorted(profiles)
    problems: list[str] = []
    if "profiles" in data and not isinstance(profiles, dict):
        problems.append(f"{path}: $.profiles: must be a table of [profiles.NAME] tables")
    seen: set[str] = set()
    for name in names:
        try:
            load_config(path, name, environ=env, registry=registry)
        except ConfigError as e:
            for p in e.problems:
                if p not in seen:
                    seen.add(p)
                    problems.append(p)
    return problems


def check_plugins_file(path: str | os.PathLike[str], *, entry_points: Any = None) -> list[str]:
    """Every problem of a ``plugins.toml``: its format, then each enabled plugin's import, plugin API
    and default ``options`` (checked with the plugin's own Options class). Never raises for problems."""
    from omniprof.core.registry import Registry, load_plugins_file

    p = Path(path)
    try:
        pf = load_plugins_file(p)
    except ConfigError as e:
        return list(e.problems)
    text = p.read_text(encoding="utf-8")
    layer = Layer({}, str(p), key_lines(text), (), p.resolve().parent)
    origin: dict[tuple[str, ...], Layer] = {(): layer}
    for kind, name, _, _, _ in pf.plugins:
        origin[(kind,)] = layer
    pr = _Problems(origin, str(p))
    try:
        reg = Registry(plugins_file=p, entry_points=entry_points)
    except ConfigError as e:
        return list(e.problems)
    for problem in reg.problems:
        pr.items.append(f"{p}: {problem}")
    for kind, name, _, enabled, options in pf.plugins:
        if not enabled:
            continue
        try:
            cls = reg.backend(name) if kind == "backend" else reg.reporter(name)
        except PluginError as e:
            pr.add((kind, name), str(e))
            continue
        _option_problems(cls.Options, options, (kind, name, "options"), f"{kind} {name!r}", pr, options)
    return pr.items


# -- show -------------------------------------------------------------------------------------------
def dump_toml(data: Mapping[str, Any]) -> str:
    """Plain data as TOML (tables after scalars; None values left out with a comment)."""
    lines: list[str] = []
    _dump_table(data, (), lines)
    return "\n".join(lines).strip() + "\n"


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_str(k)


_TOML_ESC = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_str(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for c in text:
        if c in _TOML_ESC:
            out.append(_TOML_ESC[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_value(val: Any) -> str:
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, (int, float)):
        return repr(val) if isinstance(val, float) else str(val)
    if isinstance(val, str):
        return _toml_str(val)
    if isinstance(val, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in val) + "]"
    if isinstance(val, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in val.items() if x is not None) + " }"
    return _toml_str(str(val))


def _dump_table(data: Mapping[str, Any], prefix: tuple[str, ...], lines: list[str]) -> None:
    scalars = [(k, x) for k, x in data.items() if not isinstance(x, Mapping)]
    tables = [(k, x) for k, x in data.items() if isinstance(x, Mapping)]
    if prefix and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_toml_key(p) for p in prefix) + "]")
    for k, x in scalars:
        if x is None:
            lines.append(f"# {_toml_key(k)} is not set")
        else:
            lines.append(f"{_toml_key(k)} = {_toml_value(x)}")
    for k, x in tables:
        _dump_table(x, (*prefix, k), lines)
