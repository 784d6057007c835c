"""Merging layers (later wins, each key remembering its origin) and validating the result into a
:class:`~omniprof.config.model.RunConfig`, reporting every problem at once."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.config.layers import FUNCTION_TARGET, Layer, _parse_file, env_layer, read_layers, show_path
from omniprof.config.model import TOP_KEYS, _TARGET_KEYS, ReporterSpec, RunConfig, TargetSpec
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
    for key in ("verbose", "distributed"):
        if key in d and _field_ok(v.is_bool, key, d[key], (key,), pr):
            kw[key] = d[key]
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
