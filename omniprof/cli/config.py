"""``omniprof config check|show``, and finding and layering the config file for ``omniprof run``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from omniprof.cli import _common as c
from omniprof.errors import UsageError


def config_layers(ns: argparse.Namespace, path: str | None, cli: Any = None) -> Any:
    from omniprof import config as cfgmod

    # the command's registry; a `plugins`/`no_plugin` key in the file or the environment replaces it
    return cfgmod.load_config(path, getattr(ns, "profile", None) or os.environ.get(cfgmod.PROFILE_ENV) or None,
                              cli=cli, registry=c.registry(ns), found=was_found(ns, path))


def _named(explicit: str | None) -> str | None:
    """The config the user named: on the command line, else ``$OMNIPROF_CONFIG``."""
    from omniprof import config as cfgmod

    return explicit or os.environ.get(cfgmod.CONFIG_ENV) or None


def _explicit(ns: argparse.Namespace) -> str | None:
    return getattr(ns, "config", None) or getattr(ns, "file", None)


def was_found(ns: argparse.Namespace, path: str | None) -> bool:
    """Whether ``path`` (from :func:`config_path`) was found in the working directory rather than
    named: such a file sets no env, plugins or outside paths until trusted."""
    return path is not None and _named(_explicit(ns)) is None


def config_path(explicit: str | None, required: bool) -> str | None:
    from omniprof import config as cfgmod

    path = _named(explicit)
    if path:
        return path
    found = cfgmod.find_config()
    if found is None and required:
        raise UsageError("no configuration found: give a script (omniprof run script.py [args]) or -m module, "
                         "or a config file (--config FILE), or create omniprof.toml (or [tool.omniprof] in "
                         "pyproject.toml) in the current directory")
    return str(found) if found is not None else None


def applied_note(ns: argparse.Namespace, path: str | None, cfg: Any) -> str | None:
    """The one line ``omniprof run`` prints on stderr about a config the user did not name on its
    command line (found in the working directory, or ``$OMNIPROF_CONFIG``); None for ``--config``."""
    if path is None or getattr(ns, "config", None):
        return None
    profile = f", profile {cfg.profile!r}" if cfg.profile else ""
    if was_found(ns, path):
        return f"omniprof: config {path}{profile} (found in the working directory; --no-config skips it)"
    return f"omniprof: config {path}{profile} (from $OMNIPROF_CONFIG)"


def config(ns: argparse.Namespace) -> int:
    from omniprof import config as cfgmod

    if ns.config_command is None:
        raise UsageError("omniprof config: give a subcommand: check or show")
    path = config_path(ns.file, required=True)
    if ns.config_command == "check":
        if Path(path).name == "plugins.toml":
            problems = cfgmod.check_plugins_file(path)
        else:
            problems = cfgmod.check_config(path, profile=ns.profile, registry=c.registry(ns), found=was_found(ns, path))
        if problems:
            for p in problems:
                print(p, file=sys.stderr)
            print(f"omniprof: {len(problems)} problem(s) in {path}", file=sys.stderr)
            return 1
        print(f"{path}: ok")
        return 0
    cfg = config_layers(ns, path)
    data = cfg.to_dict(c.registry(argparse.Namespace(plugins=cfg.plugins or ns.plugins,
                                                    no_plugin=[*cfg.no_plugin, *ns.no_plugin])))
    if ns.format == "json":
        import json

        print(json.dumps(data, indent=2))
    else:
        print(f"# effective configuration from {path}" + (f", profile {cfg.profile}" if cfg.profile else ""))
        print(cfgmod.dump_toml(data), end="")
    return 0
