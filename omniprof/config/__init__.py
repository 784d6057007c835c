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

>>> from omniprof.config import load_config
>>> cfg = load_config(text='backend = "cpu"\\nfunction = "math:factorial"\\nargs = [20]\\nrepeats = 2\\n')
>>> cfg.backends, cfg.target.kind, cfg.repeat_count()
(('cpu',), 'function', 2)

.. versionadded:: 0.1
"""

from __future__ import annotations

from omniprof.config.layers import Layer, cli_layer, env_layer, find_config, is_function_target, read_layers
from omniprof.config.load import check_config, check_plugins_file, load_config, resolve
from omniprof.config.model import CONFIG_ENV, ENV_KEYS, PROFILE_ENV, TOP_KEYS, ReporterSpec, RunConfig, TargetSpec
from omniprof.config.show import dump_toml

__all__ = [
    "RunConfig", "TargetSpec", "ReporterSpec", "Layer", "load_config", "check_config",
    "find_config", "read_layers", "check_plugins_file", "env_layer", "cli_layer", "resolve", "dump_toml",
    "is_function_target", "CONFIG_ENV", "PROFILE_ENV", "ENV_KEYS", "TOP_KEYS",
]
