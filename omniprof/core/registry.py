"""Plugin registry: backends and reporters from entry points and ``plugins.toml``.

Plugins are found through the ``omniprof.backends`` / ``omniprof.reporters`` entry-point groups
(built-ins register the same way a third party does) and through a ``plugins.toml`` (local plugins
by import path, disabling, default options). Nothing is imported until asked for. A plugin is
validated when loaded; a broken one is listed as broken with its error and breaks nothing else; it
is fatal only when selected.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from omniprof.core import validators as v
from omniprof.core.trust import is_trusted, trust_file, trust_store_path
from omniprof.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidArgumentError,
    PluginLoadError,
    PluginValidationError,
)

if TYPE_CHECKING:
    import importlib.metadata as md

__all__ = ["PluginInfo", "Registry", "get_registry", "reset_registry", "KINDS", "load_plugins_file", "is_trusted",
           "trust_plugins_file", "trust_store_path", "IMPORT_TIMEOUT_S"]



_INSTALLED: list[Any] | None = None
_DISTS: dict[int, tuple[Any, str, str]] = {}


def _installed_entry_points() -> list[Any]:
    """The installed plugins' entry points, read once per process (a command that makes two
    registries, ``omniprof run`` among them, scans the installed distributions once)."""
    global _INSTALLED
    if _INSTALLED is None:
        import importlib.metadata as md

        # one scan of every installed distribution for all three groups (not one per group:
        # entry_points() reads every distribution's entry_points.txt each time it is called)
        installed = md.entry_points()
        _INSTALLED = [ep for group in KINDS.values() for ep in installed.select(group=group)]
    return _INSTALLED


def _log() -> Any:
    import logging  # on first use: `import omniprof` stays light

    return logging.getLogger("omniprof.registry")

KINDS = {"backend": "omniprof.backends", "reporter": "omniprof.reporters", "reader": "omniprof.readers"}
PLUGINS_ENV = "OMNIPROF_PLUGINS"
AUTOLOAD_ENV = "OMNIPROF_DISABLE_PLUGIN_AUTOLOAD"
SELF_DIST = "omniprof"
#: Seconds a third-party plugin's import may take (``OMNIPROF_PLUGIN_IMPORT_TIMEOUT_S``).
IMPORT_TIMEOUT_S = 60.0
IMPORT_TIMEOUT_ENV = "OMNIPROF_PLUGIN_IMPORT_TIMEOUT_S"


@attrs.frozen
class PluginInfo:
    """One plugin as ``omniprof plugins`` shows it.

    Attributes:
        name, kind ("backend"/"reporter"), target ("module:attr").
        source: "omniprof 0.1.0" (distribution and version) or "plugins.toml (<path>)".
        status: "ok", "unavailable", "broken", "disabled" or "not loaded".
        reason: why unavailable/broken/disabled.
        summary: the plugin's one-line description.
    """

    name: str
    kind: str
    target: str
    source: str
    status: str = "not loaded"
    reason: str = ""
    summary: str = ""


@attrs.define
class _Entry:
    name: str
    kind: str
    target: str
    source: str
    dist: str | None
    enabled: bool = True
    disabled_by: str = ""
    options: dict[str, Any] = attrs.field(factory=dict)
    loaded: Any = None
    error: Exception | None = None


@attrs.frozen
class PluginsFile:
    """A parsed ``plugins.toml``: local plugins, disabled names, default options."""

    path: Path
    plugins: tuple[tuple[str, str, str, bool, dict[str, Any]], ...]  # (kind, name, target, enabled, options)
    overrides: frozenset[tuple[str, str]] = frozenset()  # (kind, name) marked 'override = true'

    def entries(self) -> Iterable[tuple[str, str, str, bool, dict[str, Any], bool]]:
        """Each plugin as (kind, name, target, enabled, options, override)."""
        for kind, name, target, enabled, options in self.plugins:
            yield kind, name, target, enabled, options, (kind, name) in self.overrides


def load_plugins_file(path: os.PathLike[str] | str) -> PluginsFile:
    """Parse and check a plugins.toml, reporting every problem at once.

    Format::

        [backend.NAME]            # or [reporter.NAME]
        target = "package.module:ClassName"   # optional for an installed plugin
        enabled = true                        # false disables it
        options = { key = value }             # default options, validated by the plugin's Options
        override = true                       # needed to point an installed plugin's name elsewhere
        extra = "gpu"                         # catalogue only: the pip extra that installs its deps
        summary = "..."                       # catalogue only
    """
    from omniprof.core.tomlpos import key_lines, line_of

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    from omniprof.core.inputs import read_small_file

    path = Path(path)
    try:
        text = read_small_file(path, what="plugins file").decode("utf-8")
        data = tomllib.loads(text)
    except OSError as e:
        raise ConfigError([f"cannot read plugins file {str(path)!r}: {e.strerror or e}"], path=str(path)) from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: invalid TOML: {e}"], path=str(path)) from e
    problems: list[str] = []
    plugins = []
    overrides: set[tuple[str, str]] = set()
    for top, table in data.items():
        if top not in KINDS:
            problems.append(v.unknown_key_message(top, KINDS, what="table").replace("Valid keys", "Valid tables")
                            + f" @ $.{top}")
            continue
        if not isinstance(table, dict):
            problems.append(f"expected a table of plugins @ $.{top}")
            continue
        for name, spec in table.items():
            where = f"$.{top}.{name}"
            if not isinstance(spec, dict):
                problems.append(f"expected a table @ {where}")
                continue
            allowed = ("target", "enabled", "options", "override", "extra", "summary")
            for k in spec:
                if k not in allowed:
                    problems.append(v.unknown_key_message(k, allowed, what="key") + f" @ {where}.{k}")
            target = spec.get("target", "")
            if not isinstance(target, str) or (target and ":" not in target):
                problems.append(f"'target' must be 'package.module:Name' (got {target!r}) @ {where}.target")
            enabled = spec.get("enabled", True)
            if not isinstance(enabled, bool):
                problems.append(f"'enabled' must be true or false (got {enabled!r}) @ {where}.enabled")
            options = spec.get("options", {})
            if not isinstance(options, dict):
                problems.append(f"'options' must be a table (got {options!r}) @ {where}.options")
                options = {}
            override = spec.get("override", False)
            if not isinstance(override, bool):
                problems.append(f"'override' must be true or false (got {override!r}) @ {where}.override")
            elif override:
                overrides.add((top, name))
            plugins.append((top, name, target if isinstance(target, str) else "", enabled is not False, options))
    if problems:
        lines = key_lines(text)

        def located(problem: str) -> str:
            keys = problem.rpartition(" @ $.")[2].split(".") if " @ $." in problem else []
            line = line_of(lines, keys) if keys else None
            return f"{path}:{line}: {problem}" if line else f"{path}: {problem}"

        raise ConfigError([located(p) for p in problems], path=str(path))
    return PluginsFile(path=path, plugins=tuple(plugins), overrides=frozenset(overrides))


def _find_plugins_file(explicit: os.PathLike[str] | str | None) -> tuple[Path | None, Path | None]:
    """(the plugins.toml to load, a ./plugins.toml left alone because it is not trusted).

    A plugins.toml runs code (its targets are imported), so it is loaded only when the user names
    it (``--plugins FILE``, ``OMNIPROF_PLUGINS``) or has trusted it (``omniprof plugins --trust``),
    never just because it lies in the working directory, where a downloaded trace may have brought it.
    """
    if explicit:
        return Path(explicit), None
    env = os.environ.get(PLUGINS_ENV)
    if env:
        return Path(env), None
    local = Path.cwd() / "plugins.toml"
    if not local.is_file():
        return None, None
    return (local, None) if is_trusted(local) else (None, local)


# -- trusted plugins files (the store is omniprof.core.trust's, shared with config files) -------------
def trust_plugins_file(path: os.PathLike[str] | str) -> Path:
    """Trust ``path`` (its current content: a change needs trusting again), so that it is loaded
    from the working directory without ``--plugins``. Checks its format first; returns the store."""
    p = Path(path).resolve()
    load_plugins_file(p)  # a broken file is not trusted
    return trust_file(p)


def _has_effect(path: Path, entries: Mapping[tuple[str, str], Any]) -> bool:
    """Whether loading plugins.toml ``path`` would change anything (a catalogue of the installed
    plugins, like omniprof's own, changes nothing)."""
    try:
        pf = load_plugins_file(path)
    except ConfigError:
        return True
    for kind, name, target, enabled, options in pf.plugins:
        entry = entries.get((kind, name))
        if entry is None or (target and target != entry.target) or not enabled or options:
            return True
    return False


class Registry:
    """Knows every plugin, loads lazily, validates on load.

    Args:
        plugins_file: a plugins.toml (default: ``$OMNIPROF_PLUGINS`` or ``./plugins.toml``).
        disable: plugin names to switch off (``--no-plugin NAME``).
        autoload: load third-party entry points (False: only omniprof's own;
            ``OMNIPROF_DISABLE_PLUGIN_AUTOLOAD=1`` sets it).
        entry_points: for tests, an iterable of ``importlib.metadata.EntryPoint`` to use instead of
            the installed ones.
    """

    def __init__(self, *, plugins_file: os.PathLike[str] | str | None = None, disable: Iterable[str] = (),
                 autoload: bool | None = None, entry_points: Iterable[md.EntryPoint] | None = None) -> None:
        if autoload is None:
            autoload = os.environ.get(AUTOLOAD_ENV, "") in ("", "0", "false", "False")
        if entry_points is None:
            entry_points = _installed_entry_points()
        self._entries: dict[tuple[str, str], _Entry] = {}
        self.problems: list[str] = []
        dists = _DISTS  # id(dist) -> (dist, name, version): METADATA parsed once per process
        for kind, group in KINDS.items():
            eps = [ep for ep in entry_points if ep.group == group]
            for ep in eps:
                dist = getattr(ep, "dist", None)
                if dist is not None and id(dist) not in dists:
                    meta = dist.metadata
                    dists[id(dist)] = (dist, meta["Name"], meta["Version"])
                dist_name = dists[id(dist)][1] if dist is not None else None
                source = f"{dist_name} {dists[id(dist)][2]}" if dist is not None else "entry point"
                if not autoload and (dist_name or "").lower() != SELF_DIST:
                    continue
                key = (kind, ep.name)
                if key in self._entries and self._entries[key].target != ep.value:
                    prev = self._entries[key]
                    self.problems.append(
                        f"{kind} {ep.name!r} is registered twice: {prev.target} ({prev.source}) and {ep.value} ({source}); using the first"
                    )
                    continue
                self._entries.setdefault(key, _Entry(ep.name, kind, ep.value, source, dist_name))
        path, ignored = _find_plugins_file(plugins_file)
        self.plugins_file = path
        #: a ./plugins.toml not loaded because it is not trusted (and would change something)
        self.ignored_plugins_file = ignored if ignored is not None and _has_effect(ignored, self._entries) else None
        if self.ignored_plugins_file is not None:
            self.problems.append(
                f"{ignored} is not loaded: a plugins.toml found in the working directory runs code, so it is used "
                f"only when named (--plugins {ignored.name} or {PLUGINS_ENV}) or trusted (omniprof plugins --trust)")
        if path is not None:
            pf = load_plugins_file(path)
            refused = []
            for kind, name, target, enabled, options, override in pf.entries():
                key = (kind, name)
                entry = self._entries.get(key)
                if target and entry is not None and entry.target != target and entry.dist is not None:
                    if not override:
                        refused.append(
                            f"{path}: {kind} {name!r} is {entry.source}'s ({entry.target}); plugins.toml may point "
                            f"it at {target} only with 'override = true' in [{kind}.{name}] (or give the plugin "
                            f"another name)")
                        continue
                    _log().warning("%s %r from %s is overridden by %s: %s", kind, name, entry.source, path, target)
                    self.problems.append(f"{kind} {name!r} ({entry.source}: {entry.target}) is overridden by {path}: "
                                         f"{target}")
                if target and (entry is None or entry.target != target):
                    entry = _Entry(name, kind, target, f"plugins.toml ({path})", None)
                    self._entries[key] = entry
                elif entry is None:
                    self.problems.append(
                        f"{kind} {name!r} in {path} has no 'target' and no installed plugin has that name")
                    continue
                if not enabled:
                    entry.enabled = False
                    entry.disabled_by = f"disabled in {path}"
                entry.options.update(options)
            if refused:
                raise ConfigError(refused, path=str(path))
        for name in disable:
            for kind in KINDS:
                if (kind, name) in self._entries:
                    self._entries[(kind, name)].enabled = False
                    self._entries[(kind, name)].disabled_by = "disabled by --no-plugin"

    def add(self, kind: str, cls: type, *, source: str = "added in code") -> None:
        """Register the class ``cls`` as the ``kind`` plugin called ``cls.name`` in this registry
        only, in place of any plugin of that name (validated as a loaded plugin is). For plugins
        made in code (tests, notebooks: ``omniprof.testing.gpu_fakes.fake_gpu_registry``); other
        registries and the process-wide one are left as they are."""
        if kind not in KINDS:
            raise InvalidArgumentError(f"'kind' must be one of {', '.join(KINDS)} (got {kind!r})")
        name = getattr(cls, "name", None)
        target = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', '?')}"
        entry = _Entry(name if isinstance(name, str) else "?", kind, target, source, None)
        _validate(entry, cls)
        entry.loaded = cls
        old = self._entries.get((kind, entry.name))
        if old is not None:
            entry.options.update(old.options)
        self._entries[(kind, entry.name)] = entry

    # -- queries -----------------------------------------------------------------------------
    def names(self, kind: str, *, include_disabled: bool = False) -> list[str]:
        return sorted(e.name for (k, _), e in self._entries.items() if k == kind and (include_disabled or e.enabled))

    def default_options(self, kind: str, name: str) -> dict[str, Any]:
        entry = self._entries.get((kind, name))
        return dict(entry.options) if entry else {}

    def infos(self, kind: str | None = None, *, load: bool = True, probe: bool = True) -> list[PluginInfo]:
        """Every plugin with its status. Loading and probing errors become statuses, never raise."""
        out = []
        for (k, name), e in sorted(self._entries.items()):
            if kind is not None and k != kind:
                continue
            status, reason, summary = "not loaded", "", ""
            if not e.enabled:
                status, reason = "disabled", e.disabled_by
            elif load:
                try:
                    cls = self._load(e)
                    summary = getattr(cls, "summary", "") or ""
                    status = "ok"
                    if probe and k == "backend":
                        try:
                            cls.probe()
                        except BackendUnavailableError as u:
                            status, reason = "unavailable", u.reason + (f" ({u.hint})" if u.hint else "")
                        except Exception as ex:  # a probe that crashes marks the plugin broken, not the host
                            status, reason = "broken", f"probe() raised {type(ex).__name__}: {ex}"
                except (PluginLoadError, PluginValidationError) as ex:
                    status, reason = "broken", str(ex)
            out.append(PluginInfo(name, k, e.target, e.source, status, reason, summary))
        return out

    def backend(self, name: str) -> type:
        """The backend class called ``name``; raises PluginLoadError/PluginValidationError."""
        return self._get("backend", name)

    def reporter(self, name: str) -> type:
        """The reporter class called ``name``."""
        return self._get("reporter", name)

    def reader(self, name: str) -> type:
        """The reader class for format ``name``."""
        return self._get("reader", name)

    # -- loading -----------------------------------------------------------------------------
    def _get(self, kind: str, name: str) -> type:
        if not isinstance(name, str):
            raise PluginLoadError(f"{kind} name must be a string (got {name!r})")
        entry = self._entries.get((kind, name))
        if entry is None:
            available = self.names(kind)
            near = v.nearest(name, available)
            hint = f" Did you mean {near!r}?" if near else ""
            if self.ignored_plugins_file is not None:
                hint += (f" ({self.ignored_plugins_file} was not loaded: name it with --plugins or {PLUGINS_ENV}, "
                         f"or trust it with `omniprof plugins --trust`)")
            raise PluginLoadError(
                f"unknown {kind} {name!r}.{hint} Available {kind}s: {', '.join(available) or 'none'}", plugin=name)
        if not entry.enabled:
            raise PluginLoadError(f"{kind} {name!r} is {entry.disabled_by}; enable it to use it", plugin=name)
        return self._load(entry)

    def _load(self, e: _Entry) -> type:
        if e.loaded is not None:
            return e.loaded
        if e.error is not None:
            raise e.error
        try:
            cls = _import_target(e.target) if (e.dist or "").lower() == SELF_DIST else _import_guarded(e)
        except Exception as ex:  # any import-time failure of a plugin is the plugin's, not ours
            err = PluginLoadError(
                f"{e.kind} {e.name!r} from {e.source} failed to import ({e.target}): {type(ex).__name__}: {ex}. "
                f"Fix or reinstall the plugin, or disable it with --no-plugin {e.name}", plugin=e.name)
            err.__cause__ = ex
            e.error = err
            raise err from ex
        try:
            _validate(e, cls)
        except PluginValidationError as ex:
            e.error = ex
            raise
        e.loaded = cls
        return cls


class ImportTimedOut(Exception):
    pass


class ExitAtImport(Exception):
    pass


def _import_timeout_s() -> float:
    raw = os.environ.get(IMPORT_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else IMPORT_TIMEOUT_S
    except ValueError:
        value = IMPORT_TIMEOUT_S
    return value if value > 0 and value == value else IMPORT_TIMEOUT_S


def _import_guarded(e: _Entry) -> Any:
    """Import a third party's target in a helper thread, waiting at most the import time limit.

    ``sys.exit()`` (``SystemExit``) in the plugin's module becomes an import failure instead of
    ending omniprof; an import that does not finish in time is reported as hung (the thread is
    left to itself: Python cannot stop it, but nothing waits for it and it ends with the process).
    """
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = _import_target(e.target)
        except SystemExit as ex:
            box["error"] = ExitAtImport(f"the module called sys.exit({ex.code!r}) while being imported")
        except BaseException as ex:  # noqa: BLE001 - handed to the caller as the plugin's failure
            box["error"] = ex

    limit = _import_timeout_s()
    t = threading.Thread(target=run, name=f"omniprof-import-{e.name}", daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise ImportTimedOut(f"importing it took more than {limit:g} s (it hangs?); raise {IMPORT_TIMEOUT_ENV} "
                             f"if it is only slow")
    if "error" in box:
        err = box["error"]
        if isinstance(err, KeyboardInterrupt):
            raise err
        raise err
    return box["value"]


def _import_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ImportError(f"target {target!r} is not of the form 'package.module:Name'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _validate(e: _Entry, cls: Any) -> None:
    from omniprof.core.backend import SUPPORTED_API_VERSIONS, Backend
    from omniprof.core.reader import Reader
    from omniprof.core.reporter import Reporter

    base = {"backend": Backend, "reporter": Reporter, "reader": Reader}[e.kind]
    where = f"{e.kind} {e.name!r} from {e.source} ({e.target})"
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise PluginValidationError(
            f"{where} is not a subclass of omniprof.plugin.{base.__name__}; "
            f"make the entry point name such a class", plugin=e.name)
    if getattr(cls, "name", None) != e.name:
        raise PluginValidationError(
            f"{where} has name={getattr(cls, 'name', None)!r} but is registered as {e.name!r}; the class's `name` "
            f"must equal the entry-point name", plugin=e.name)
    api = getattr(cls, "api_version", None)
    if api not in SUPPORTED_API_VERSIONS:
        raise PluginValidationError(
            f"{where} has api_version={api!r}; this omniprof supports api_version "
            f"{', '.join(map(str, sorted(SUPPORTED_API_VERSIONS)))}. Upgrade the plugin or omniprof", plugin=e.name)
    missing = sorted(getattr(cls, "__abstractmethods__", ()) or ())
    if missing:
        raise PluginValidationError(
            f"{where} does not implement {', '.join(missing)}; implement every abstract method of {base.__name__}",
            plugin=e.name)
    if e.kind == "reporter" and getattr(cls, "output", None) not in ("stream", "file", "dir"):
        raise PluginValidationError(f"{where} has output={getattr(cls, 'output', None)!r}; must be 'stream', 'file' or 'dir'",
                                    plugin=e.name)
    if not attrs.has(getattr(cls, "Options", None)):
        raise PluginValidationError(f"{where}: {cls.__name__}.Options must be an attrs class", plugin=e.name)


_default: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _default
    if _default is None:
        _default = Registry()
    return _default


def reset_registry(registry: Registry | None = None) -> None:
    """Replace (or forget) the process-wide registry; for tests and the CLI's ``--plugins``."""
    global _default
    _default = registry


def options_for(kind: str, name: str, cls: type, given: Mapping[str, Any] | Any | None,
                registry: Registry | None = None) -> Any:
    """Options instance for plugin ``name``: plugins.toml defaults updated by ``given``."""
    from omniprof.core.options import build_options

    if given is not None and not isinstance(given, Mapping):
        if not isinstance(given, cls.Options):
            raise PluginValidationError(
                f"options for {kind} {name!r} must be a mapping or {cls.__name__}.Options (got {type(given).__name__})",
                plugin=name)
        return given
    reg = registry or get_registry()
    data = reg.default_options(kind, name)
    data.update(given or {})
    return build_options(cls.Options, data, owner=f"{kind} {name!r}")
