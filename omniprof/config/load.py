"""Merging layers (later wins, each key remembering its origin) and validating the result into a
:class:`~omniprof.config.model.RunConfig`, reporting every problem at once."""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.config.layers import Layer, _parse_file, env_layer, read_config_text, read_layers, show_path
from omniprof.config.model import TOP_KEYS, _TARGET_KEYS, ConfigData, ReporterSpec, RunConfig, TargetSpec
from omniprof.core import validators as v
from omniprof.core.options import ADVANCED_KEYS, ProfileOptions
from omniprof.core.schedule import Schedule
from omniprof.core.tomlpos import key_lines
from omniprof.errors import ConfigError, InvalidArgumentError, PluginError


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


# -- validation -------------------------------------------------------------------------------------
def resolve(layers: Sequence[Layer], *, registry: Any = None, source: str | None = None,
            profile: str | None = None, early_problems: Sequence[str] = ()) -> RunConfig:
    """Merge ``layers`` and validate the result; raises :class:`ConfigError` listing every problem."""
    from omniprof.core.registry import Registry, get_registry

    merged, origin = _merge(layers)
    problems = _Problems(origin, source or "configuration")
    problems.items.extend(early_problems)
    # The configuration's own `plugins`/`no_plugin` choose the plugins; else the caller's registry
    # (the CLI's, from --plugins/--no-plugin), else the process-wide one.
    reg = registry
    if "plugins" in merged or "no_plugin" in merged:
        try:
            reg = Registry(plugins_file=merged.get("plugins") if isinstance(merged.get("plugins"), str) else None,
                           disable=[x for x in merged.get("no_plugin", []) if isinstance(x, str)]
                           if isinstance(merged.get("no_plugin"), list) else ())
        except ConfigError as e:
            problems.items.extend(e.problems)
    if reg is None:
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
    if "profiles" in d:
        pr.add(("profiles",), "profiles cannot be nested: put [profiles.NAME] tables at the top level")
        d = {k: val for k, val in d.items() if k != "profiles"}
    cd: ConfigData = _structure(ConfigData, d, (), "", pr, d, unknown=lambda k: v.unknown_key_message(
        k, TOP_KEYS, what="key")) or ConfigData()
    kw: dict[str, Any] = {"source": source, "profile": profile}

    # one target, and arguments that fit it
    given = cd.target()
    target = None
    if len(given) > 1:
        pr.add((given[1],), f"give one of script, module, function (got {', '.join(given)})")
    elif given:
        target = _target(cd, given[0], pr)
    else:
        for k in ("args", "kwargs"):
            if getattr(cd, k) is not None:
                pr.add((k,), f"{k!r} needs a target: set script, module or function")
    kw["target"] = target

    # backends: registered, once each, with options their own Options class accepts
    backends = cd.backend if cd.backend is not None else ["cpu"]
    known_backends = reg.names("backend", include_disabled=True)
    for i, name in enumerate(backends):
        _check_plugin(reg, "backend", name, ("backend", i) if "backend" in d else ("backend",), pr, known_backends)
    if len(set(backends)) != len(backends):
        pr.add(("backend",), f"lists a backend twice: {backends}")
    kw["backends"] = tuple(backends)
    checked: dict[str, dict[str, Any]] = {}
    for name, given_opts in cd.backends.items():
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
            _plugin_options(cls.Options, {**reg.default_options("backend", name), **given_opts}, path, f"backend {name!r}",
                            pr, given_opts)
        checked[name] = dict(given_opts)
    kw["backend_options"] = {n: checked[n] for n in backends if n in checked}

    # profile options, schedule, how often
    kw["options"] = _structure(ProfileOptions, cd.options, ("options",), "", pr, cd.options,
                               unknown=_unknown_profile_option) or ProfileOptions()
    if cd.schedule is not None:
        sched = _structure(Schedule, cd.schedule, ("schedule",), "schedule", pr, cd.schedule)
        if sched is not None:
            kw["schedule"] = sched
    if cd.repeats is not None:
        kw["repeats"] = cd.repeats
    if cd.duration_s is not None:
        kw["duration_s"] = float(cd.duration_s)
    if "repeats" in d and "duration_s" in d:
        pr.add(("duration_s",), "give either repeats or duration_s, not both")

    # reporters: registered, with an output path and options their own Options class accepts
    reporters = cd.reporter if cd.reporter is not None else (list(cd.reporters) or ["table"])
    known_reporters = reg.names("reporter", include_disabled=True)
    for i, name in enumerate(reporters):
        _check_plugin(reg, "reporter", name, ("reporter", i) if "reporter" in d else ("reporter",), pr,
                      known_reporters)
    specs = {}
    for name, spec in cd.reporters.items():
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
            _plugin_options(cls.Options, {**reg.default_options("reporter", name), **spec}, path, f"reporter {name!r}", pr,
                            spec, extra=("output",))
        specs[name] = ReporterSpec(name, spec, output)
    kw["reporters"] = tuple(specs.get(n, ReporterSpec(n)) for n in reporters)

    # environment: names a shell accepts, values as text
    env_out = {}
    for name, val in cd.env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            pr.add(("env", name), f"{name!r} is not a valid environment variable name")
        elif isinstance(val, bool):
            env_out[name] = "1" if val else "0"
        elif isinstance(val, (str, int, float)):
            env_out[name] = str(val)
        else:
            pr.add(("env", name), f"environment values must be strings or numbers (got {val!r})")
    kw["env"] = env_out

    for key in ("logdir", "outdir", "label", "plugins", "verbose", "distributed"):
        if getattr(cd, key) is not None:
            kw[key] = getattr(cd, key)
    if cd.no_plugin is not None:
        kw["no_plugin"] = tuple(cd.no_plugin)
    return RunConfig(**kw)


def _target(cd: ConfigData, kind: str, pr: _Problems) -> TargetSpec | None:
    """The target ``kind`` with its arguments: a script's or module's ``args`` are its argv (strings
    or numbers); ``kwargs`` only go with a function."""
    args = cd.args if cd.args is not None else []
    ok = True
    if kind in ("script", "module") and not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                                for a in args):
        pr.add(("args",), f"'args' of a {kind} is its argv: strings or numbers (got {args!r})")
        ok = False
    if cd.kwargs is not None and kind != "function":
        pr.add(("kwargs",), f"'kwargs' is for a function target; a {kind} takes 'args' (its argv)")
    if not ok:
        return None
    if kind != "function":
        args = [str(a) for a in args]
    return TargetSpec(kind, getattr(cd, kind), tuple(args), dict(cd.kwargs or {}), "")


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


def _unknown_profile_option(key: str) -> str:
    fields = [a.name for a in attrs.fields(ProfileOptions) if a.init]
    hint = " (advanced keys go under [options.advanced_configuration])" if key in ADVANCED_KEYS else ""
    return v.unknown_key_message(key, fields, what="profile option") + hint


def _plugin_options(cls: type, data: Mapping[str, Any], path: tuple[str, ...], owner: str, pr: _Problems,
                    given: Mapping[str, Any], extra: Sequence[str] = ()) -> bool:
    """Structure ``data`` into a plugin's ``Options`` class; every problem is added to ``pr``."""
    fields = [(a.alias if getattr(a, "alias", None) else a.name) for a in attrs.fields(cls) if a.init]
    before = len(pr.items)
    _structure(cls, data, path, owner, pr, given,
               unknown=lambda k: v.unknown_key_message(k, [*fields, *extra], what="option"))
    return len(pr.items) == before


# -- structuring with cattrs --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _converter() -> Any:
    """The cattrs converter of configs: every attrs class (ConfigData, ProfileOptions, Schedule, a
    plugin's Options) is structured key by key, each key's value checked by its field's own
    converter and validator, unknown keys refused, and every problem collected
    (``detailed_validation``). Values are kept as given: the class's ``__init__`` converts them."""
    import cattrs
    from cattrs.gen import make_dict_structure_fn, override

    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)

    def checked(a: Any) -> Any:
        def hook(value: Any, _: Any) -> Any:
            val = a.converter(value) if callable(a.converter) else value
            if a.validator is not None:
                a.validator(None, a, val)
            return value
        return hook

    def factory(cls: type) -> Any:
        hooks = {a.name: override(struct_hook=_advanced_hook if cls is ProfileOptions and
                                  a.name == "advanced_configuration" else checked(a)) for a in attrs.fields(cls)}
        return make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **hooks)

    conv.register_structure_hook_factory(attrs.has, factory)
    return conv


def _advanced_hook(value: Any, _: Any) -> Any:
    """``[options.advanced_configuration]``: each key known and its value valid, every problem at its key."""
    from cattrs.errors import IterableValidationError, IterableValidationNote

    if not isinstance(value, dict):
        raise InvalidArgumentError(f"must be a table of advanced keys (got {value!r})")
    errors: list[Exception] = []
    for key, val in value.items():
        try:
            if key not in ADVANCED_KEYS:
                raise InvalidArgumentError(v.unknown_key_message(key, ADVANCED_KEYS, what="advanced_configuration key"))
            ADVANCED_KEYS[key].validate(val)
        except InvalidArgumentError as e:
            e.__notes__ = [IterableValidationNote(f"key {key!r}", key, Any)]
            errors.append(e)
    if errors:
        raise IterableValidationError("invalid advanced_configuration", errors, dict)
    return value


def _problems(exc: BaseException, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], BaseException]]:
    """(key path, error) for every error in a cattrs exception group."""
    from cattrs.errors import AttributeValidationNote, BaseValidationError, IterableValidationNote

    if not isinstance(exc, BaseValidationError):
        yield path, exc
        return
    for sub in exc.exceptions:
        notes = getattr(sub, "__notes__", None) or []
        note = next((n for n in notes if isinstance(n, (AttributeValidationNote, IterableValidationNote))), None)
        here = path
        if isinstance(note, AttributeValidationNote):
            here = (*path, note.name)
        elif isinstance(note, IterableValidationNote):
            here = (*path, note.index)
        yield from _problems(sub, here)


def _structure(cls: type, data: Mapping[str, Any], path: tuple[str, ...], owner: str, pr: _Problems,
               given: Mapping[str, Any], *, unknown: Callable[[str], str] | None = None) -> Any:
    """``data`` structured into ``cls`` with cattrs, every problem added to ``pr`` at its key (or at
    ``path`` for a key that came from plugins.toml defaults, not in ``given``), prefixed with
    ``owner``. With problems, the instance built from the keys that had none (None if even that
    fails)."""
    from cattrs.errors import BaseValidationError, ForbiddenExtraKeysError

    prefix = f"{owner}: " if owner else ""

    def add(key: Any, rest: tuple[Any, ...], msg: str) -> None:
        where = (*path, key, *rest) if key in given else path
        pr.add(where, msg if owner and msg.startswith(owner) else prefix + msg)

    conv = _converter()
    try:
        return conv.structure(dict(data), cls)
    except (BaseValidationError, ForbiddenExtraKeysError, InvalidArgumentError, TypeError, ValueError) as e:
        # cattrs' exception group of every key's problem, or a check across keys in cls.__init__
        bad: set[Any] = set()
        for where, exc in _problems(e):
            if isinstance(exc, ForbiddenExtraKeysError):
                for key in [k for k in data if k in exc.extra_fields]:
                    add(key, (), unknown(key) if unknown else v.unknown_key_message(
                        key, [a.name for a in attrs.fields(cls) if a.init], what="option"))
                    bad.add(key)
            elif where:
                add(where[0], where[1:], str(exc))
                bad.add(where[0])
            else:
                pr.add(path, prefix + str(exc))
        if not bad:
            return None
    try:
        return conv.structure({k: val for k, val in data.items() if k not in bad}, cls)
    except (BaseValidationError, InvalidArgumentError, TypeError, ValueError):
        return None


# -- entry points -----------------------------------------------------------------------------------
def load_config(path: str | os.PathLike[str] | None = None, profile: str | None = None, *,
                text: str | None = None, environ: Mapping[str, str] | None = None,
                cli: Layer | None = None, registry: Any = None, found: bool = False) -> RunConfig:
    """Read, layer and validate a configuration.

    Args:
        path: an ``omniprof.toml`` or ``pyproject.toml`` (None: no file, unless ``text``).
        profile: a ``[profiles.NAME]`` to apply over the base settings.
        text: TOML text instead of a file (tests, docs).
        environ: environment to read ``OMNIPROF_*`` from (default ``os.environ``; ``{}`` for none).
        cli: a :func:`cli_layer` on top.
        registry: plugin registry, unless the configuration names its own ``plugins`` or
            ``no_plugin`` (default: the process-wide one).
        found: ``path`` was found in the working directory, not named by the user: unless it is
            trusted (``omniprof plugins --trust FILE``) its ``env``, ``plugins`` and paths outside
            its directory are refused, each a problem naming the fix.

    Raises:
        ConfigError: with every problem found, each naming file:line (or env var / command line),
            key path and, for unknown keys, the nearest valid key.
    """
    layers, early = read_layers(path, profile, text=text, found=found)
    layers.append(env_layer(environ))
    if cli is not None:
        layers.append(cli)
    source = str(path) if path is not None else ("<config>" if text is not None else None)
    return resolve(layers, registry=registry, source=source, profile=profile, early_problems=early)


def check_config(path: str | os.PathLike[str], *, profile: str | None = None, registry: Any = None,
                 environ: Mapping[str, str] | None = None, found: bool = False) -> list[str]:
    """Every problem of a config file: its base settings and each profile (or only ``profile``).

    Returns the problems (empty when the file is valid); unreadable files and invalid TOML are
    problems too. Never runs the target. ``found`` as for :func:`load_config`.

    Raises:
        TraceReadError: ``path`` is no config file at all (a device, a named pipe, over the size
            bound of ``omniprof.core.inputs.read_small_file``).
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
            load_config(path, name, environ=env, registry=registry, found=found)
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
    text = read_config_text(p, "plugins file")
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
        _plugin_options(cls.Options, options, (kind, name, "options"), f"{kind} {name!r}", pr, options)
    return pr.items
