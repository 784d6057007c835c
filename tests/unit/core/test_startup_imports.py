"""`omniprof run empty.py` imports what the run uses and probes nothing else (issue 32: start-up).

Structural checks (which modules a real run loads, in a fresh process), never a time: the figures
are in benchmarks/startup.py, beside pyinstrument's."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from omniprof.core.host import platform_string

#: Not needed to run a script and print its table: the TOML parser (no config file here), the
#: trace readers and the timeline analysis, `uname -p`'s subprocess, any framework.
NOT_ON_THE_RUN_PATH = ("tomllib", "tomli", "subprocess", "omniprof.analysis.timeline", "omniprof.core.doctor",
                       "jax", "torch", "numpy", "pynvml", "xprof")


def _imported(args: list[str], tmp_path) -> list[str]:
    (tmp_path / "empty.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIPROF_")}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "omniprof", *args], capture_output=True,
                          text=True, cwd=tmp_path, env=env, check=True)
    return [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
            if line.startswith("import time:") and "self [us]" not in line]


def test_run_of_an_empty_script_imports_nothing_it_does_not_use(tmp_path):
    """A run with no config file reads no TOML, spawns no `uname -p`, loads no trace reader or framework."""
    names = _imported(["run", "empty.py"], tmp_path)
    assert "omniprof.backends.cpu.backend" in names  # the run did run (the reference that the list is real)
    loaded = [n for n in names if n in NOT_ON_THE_RUN_PATH or n.split(".")[0] in NOT_ON_THE_RUN_PATH]
    assert loaded == []


def test_installed_plugins_are_scanned_once_per_run(tmp_path):
    """`omniprof run` makes two registries (the config's and the runner's); the installed
    distributions are read once: importlib.metadata's entry_points() runs once (counted in the run)."""
    (tmp_path / "empty.py").write_text("")
    code = ("import importlib.metadata as md, sys\n"
            "calls = []\n"
            "real = md.entry_points\n"
            "md.entry_points = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
            "from omniprof.cli import main\n"
            "main(['run', 'empty.py'])\n"
            "print('ENTRY_POINT_SCANS', len(calls))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "ENTRY_POINT_SCANS 1" in proc.stdout, proc.stdout + proc.stderr


def test_platform_string_is_what_platform_platform_says():
    """The platform recorded in results, found without a subprocess, equals the standard library's."""
    assert platform_string() == platform.platform()
