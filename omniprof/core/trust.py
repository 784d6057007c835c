"""Files the user trusts to run code: one store for ``plugins.toml`` and config files.

A ``plugins.toml`` imports its targets, and a config file can set the run's environment
(``PYTHONPATH``, ``LD_PRELOAD``), name a plugins file and choose where output goes. Either one
found in the working directory (where a downloaded trace may have brought it) is used in full only
when the user names it or has trusted it: ``omniprof plugins --trust [FILE]`` records the file's
resolved path and the SHA-256 of its content in ``$XDG_CONFIG_HOME/omniprof/trusted-plugins.json``
(``~/.config/...`` by default); an edit withdraws the trust.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["trust_store_path", "is_trusted", "trust_file"]


def trust_store_path() -> Path:
    """``$XDG_CONFIG_HOME/omniprof/trusted-plugins.json`` (``~/.config/...`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "omniprof" / "trusted-plugins.json"


def _trusted() -> dict[str, str]:
    try:
        data = json.loads(trust_store_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _read(path: Path) -> bytes:
    from omniprof.core.inputs import read_small_file

    return read_small_file(path, what="trusted file")


def is_trusted(path: os.PathLike[str] | str, content: bytes | None = None) -> bool:
    """True when ``path`` was trusted with :func:`trust_file` and its content (``content``, the
    bytes the caller read and will use; read here, bounded, when None) has not changed since."""
    from omniprof.errors import TraceReadError

    p = Path(path).resolve()
    want = _trusted().get(str(p))
    if want is None:
        return False
    try:
        data = _read(p) if content is None else content
    except (OSError, TraceReadError):
        return False
    return want == hashlib.sha256(data).hexdigest()


def trust_file(path: os.PathLike[str] | str) -> Path:
    """Trust ``path`` as it is now (a change needs trusting again); returns the store. The caller
    checks the file's format first: a broken file is not trusted."""
    from omniprof.core.fileio import atomic_write_text

    p = Path(path).resolve()
    data = _trusted()
    data[str(p)] = hashlib.sha256(_read(p)).hexdigest()
    store = trust_store_path()
    atomic_write_text(store, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return store
