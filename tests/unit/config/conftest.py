"""Running ``python -m omniprof`` as a user would, in a directory of the test's making, with its own
config home (the trust store) and none of the caller's ``OMNIPROF_*`` variables."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run_omniprof(args: list[str], cwd: Path, *, home: Path | None = None, timeout: float = 180,
                 preexec_fn: Callable[[], None] | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: val for k, val in os.environ.items() if not k.startswith("OMNIPROF_")}
    full.update({"PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str((home or cwd) / ".config"), **env})
    if home is not None:
        full["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "omniprof", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=preexec_fn)


@pytest.fixture
def omniprof_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_omniprof
