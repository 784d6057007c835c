"""Where settings come from, as :class:`Layer` objects: the config file (base, then a profile),
the ``OMNIPROF_*`` environment, the command line (the one ``-O``/``-R`` parser)."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.config.model import ENV_KEYS, FUNCTION_TARGET, _LIST_ENV, _PATH_KEYS
from omniprof.core import validators as v
from omniprof.core.options import ADVANCED_KEYS, parse_cli_value
from omniprof.core.inputs import read_small_file
from omniprof.core.tomlpos import key_lines, line_of
from omniprof.errors import ConfigError, InvalidArgumentError, TraceReadError



def _toml() -> Any:
    """The TOML parser, imported when a file is read (``omniprof run`` without a config file reads none)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib


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
        tomllib = _toml()
        try:
            data = tomllib.loads(read_config_text(py))
        except (ConfigError, TraceReadError, tomllib.TOMLDecodeError):
            return None
        if isinstance(data.get("tool"), dict) and "omniprof" in data["tool"]:
            return py
    return None


def read_config_text(path: Path, what: str = "config file") -> str:
    """A config file's text, read through the input bounds (``core.inputs.read_small_file``).

    Raises:
        ConfigError: the file is missing, unreadable or not UTF-8 (a problem of the file).
        TraceReadError: it is no config file at all: ``/dev/zero``, a named pipe, a directory, or
            more than ``MAX_TEXT_INPUT_BYTES`` (the CLI exits 2, as for a usage error).
    """
    name = str(path)
    try:
        return read_small_file(path, what=what).decode("utf-8")
    except FileNotFoundError as e:
        raise ConfigError([f"{name}: no such {what}"], path=name) from e
    except OSError as e:
        raise ConfigError([f"{name}: cannot read: {e.strerror or e}"], path=name) from e
    except UnicodeDecodeError as e:
        raise ConfigError([f"{name}: not UTF-8 text (byte {e.start})"], path=name) from e


def _parse_file(path: Path, text: str | None = None) -> tuple[dict[str, Any], dict[tuple[str, ...], int], tuple[str, ...]]:
    name = str(path)
    if text is None:
        text = read_config_text(path)
    tomllib = _toml()
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
                text: str | None = None, found: bool = False) -> tuple[list[Layer], list[str]]:
    """The file's layers (base, then ``profile``) and early problems (unknown profile...).

    ``found``: the file was found in the working directory, not named by the user (``--config``,
    ``$OMNIPROF_CONFIG``). Unless trusted (``omniprof plugins --trust FILE``), such a file sets no
    ``env``, no ``plugins`` and no path outside its own directory: each is a problem naming the fix.
    """
    if path is None and text is None:
        return [], []
    p = Path(path) if path is not None else Path("<config>")
    if path is not None and text is None:
        text = read_config_text(p)
    data, lines, prefix = _parse_file(p, text)
    base_dir = p.resolve().parent if path is not None else Path.cwd()
    problems: list[str] = []
    name = str(p)
    fix = None
    if found and text is not None:
        from omniprof.core.trust import is_trusted

        if not is_trusted(p, text.encode("utf-8")):  # the bytes parsed above, not a second read
            shown = os.path.relpath(p) if p.resolve().parent == Path.cwd().resolve() else name
            fix = f"trust it as it is with `omniprof plugins --trust {shown}`, or name it with --config {shown}"
    base = {k: val for k, val in data.items() if k != "profiles"}
    layers = [Layer(_resolve_paths(base, base_dir, problems, (name, lines, prefix), fix), name, lines, prefix, base_dir)]
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
                                               (name, lines, (*prefix, "profiles", profile)), fix), name, lines,
                                (*prefix, "profiles", profile), base_dir))
    return layers, problems


_WRITTEN_PATH_KEYS = ("logdir", "outdir")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand(value: str) -> tuple[str, str | None]:
    """``value`` with ``$NAME`` / ``${NAME}`` and a leading ``~`` expanded; (it, the first variable
    that is not set or None)."""
    unset: list[str] = []

    def sub(m: re.Match[str]) -> str:
        var = m.group(1) or m.group(2)
        if var in os.environ:
            return os.environ[var]
        unset.append(var)
        return m.group(0)

    out = os.path.expanduser(_VARIABLE.sub(sub, value))
    return out, (unset[0] if unset else None)


def _inside(base_dir: Path, value: str) -> bool:
    """Whether ``value`` (relative to ``base_dir``, or absolute) lies inside ``base_dir`` once every
    symbolic link on the way is resolved (a link inside that points elsewhere leads elsewhere)."""
    real = os.path.realpath(base_dir)
    target = os.path.realpath(os.path.join(real, value))
    return os.path.commonpath([target, real]) == real


def _resolve_paths(data: dict[str, Any], base_dir: Path, problems: list[str] | None = None,
                   where: tuple[str, dict[tuple[str, ...], int], tuple[str, ...]] | None = None,
                   untrusted_fix: str | None = None) -> dict[str, Any]:
    """Paths made absolute: ``~`` and ``$NAME`` expanded, relative ones taken from the config
    file's directory.

    An output path (``logdir``, ``outdir``, a reporter's ``output``) written relatively may not
    lead out of that directory, with ``..`` or through a symbolic link: a config file from a
    checkout cannot make omniprof write elsewhere unless it spells the place out as an absolute
    path. A config found in the working directory and not trusted (``untrusted_fix`` is the fix to
    name) sets no ``env``, no ``plugins``, and no path outside its directory, absolute or not.
    """
    out = copy.deepcopy(data)

    def problem(path: tuple[str, ...], message: str) -> None:
        if problems is not None and where is not None:
            name, lines, prefix = where
            problems.append(f"{name}:{line_of(lines, (*prefix, *path))}: {show_path((*prefix, *path))}: {message}")

    def resolved(path: tuple[str, ...], value: str, written: bool) -> str | None:
        if "\x00" in value:
            problem(path, f"{value!r} is not a path: it holds a NUL character")
            return None
        expanded, unset = _expand(value)
        if unset is not None:
            problem(path, f"{value!r} names ${unset}, which is not set in the environment")
            return None
        if expanded.startswith("~"):
            problem(path, f"{value!r}: no user {expanded[1:].split('/', 1)[0]!r} on this machine to take '~' from")
            return None
        if not _inside(base_dir, expanded):
            if untrusted_fix is not None:
                problem(path, f"refused: {value!r} is outside {base_dir}, and a config file found in the working "
                              f"directory (not named) may not point outside its directory; {untrusted_fix}")
                return None
            if written and not os.path.isabs(expanded):
                problem(path, f"{value!r} leads outside the config file's directory ({base_dir}); relative "
                              f"output paths must stay inside it (symbolic links included). Write an absolute "
                              f"path to put output elsewhere")
                return None
        return str(base_dir / expanded)

    if untrusted_fix is not None:
        env = out.get("env")
        if env:
            names = ", ".join(str(k) for k in env) if isinstance(env, dict) else repr(env)
            problem(("env",), f"refused: sets {names}; a config file found in the working directory (not named) may "
                              f"set no environment variables, which can run code (PYTHONPATH, LD_PRELOAD); "
                              f"{untrusted_fix}")
            out.pop("env")
        if "plugins" in out:
            problem(("plugins",), f"refused: a config file found in the working directory (not named) may not load "
                                  f"a plugins file ({out['plugins']!r} runs code); {untrusted_fix}")
            out.pop("plugins")
    for key in _PATH_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            value = resolved((key,), out[key], key in _WRITTEN_PATH_KEYS)
            if value is None:
                out.pop(key)
            else:
                out[key] = value
    reps = out.get("reporters")
    if isinstance(reps, dict):
        for rname, spec in reps.items():
            if isinstance(spec, dict) and isinstance(spec.get("output"), str) and spec["output"]:
                value = resolved(("reporters", str(rname), "output"), spec["output"], True)
                if value is None:
                    spec.pop("output")
                else:
                    spec["output"] = value
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
        elif path[-1] in ("verbose", "distributed"):
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


def show_path(path: Sequence[str | int]) -> str:
    """``$.backends.cpu.interval_s``, ``$.backend[1]``, ``$.env."A B"``."""
    out = "$"
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += "." + (p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p))
    return out
