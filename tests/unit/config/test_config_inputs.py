"""Config files and plugins files go through the input bounds (omniprof.core.inputs): a device, a
named pipe, a directory or an oversized file is refused at once with one line and exit 2.

Each case is a real ``python -m omniprof`` with a subprocess timeout (a hang fails the test) and an
address-space limit (so a reader that slurps /dev/zero fails fast instead of taking the machine's
memory); no assertion is made on time.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from omniprof.core.inputs import MAX_TEXT_INPUT_BYTES

TIMEOUT_S = 120


def _cap_memory() -> None:
    limit = 3 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _check(omniprof_cli, args: list[str], cwd: Path, **env: str):
    return omniprof_cli(args, cwd, timeout=TIMEOUT_S, preexec_fn=_cap_memory, **env)


def test_config_check_dev_zero_is_refused(tmp_path: Path, omniprof_cli) -> None:
    """`omniprof config check /dev/zero`: exit 2, one line saying it is a character device (before:
    it read /dev/zero until memory ran out, killed with 137)."""
    p = _check(omniprof_cli, ["config", "check", "/dev/zero"], tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "omniprof: error: '/dev/zero' is a terminal or character device, not a config file; give a regular file"]


@pytest.mark.parametrize("args, env, what", [
    (["config", "check", "fifo.toml"], {}, "config file"),
    (["run", "--config", "fifo.toml", "w.py"], {}, "config file"),
    (["run", "w.py"], {"OMNIPROF_CONFIG": "fifo.toml"}, "config file"),
    (["config", "check", "p/plugins.toml"], {}, "plugins file"),
    (["plugins", "--no-probe", "--plugins", "fifo.toml"], {}, "plugins file"),
    (["run", "w.py"], {"OMNIPROF_PLUGINS": "fifo.toml"}, "plugins file"),
])
def test_named_pipe_config_or_plugins_file_is_refused(tmp_path: Path, args, env, what, omniprof_cli) -> None:
    """A named pipe nobody writes, given as a config or plugins file: exit 2 with one line saying it
    is a named pipe (before: the read waited for a writer forever)."""
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "p").mkdir()
    os.mkfifo(tmp_path / "p" / "plugins.toml")
    (tmp_path / "w.py").write_text("pass\n")
    p = _check(omniprof_cli, args, tmp_path, **env)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"is a named pipe (FIFO), not a {what}; give a regular file" in p.stderr
    assert not (tmp_path / "omniprof.result.json").exists()


def test_named_pipe_in_the_working_directory_is_not_a_found_config(tmp_path: Path, omniprof_cli) -> None:
    """A named pipe called omniprof.toml (or plugins.toml) in the working directory is passed over,
    not waited on: the run goes ahead without it."""
    os.mkfifo(tmp_path / "omniprof.toml")
    os.mkfifo(tmp_path / "plugins.toml")
    (tmp_path / "w.py").write_text("pass\n")
    p = _check(omniprof_cli, ["run", "-r", "json", "-o", "out", "w.py"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "out" / "omniprof.result.json").is_file()


@pytest.mark.parametrize("name, what", [("big.toml", "config file"), ("plugins.toml", "plugins file")])
def test_oversized_config_or_plugins_file_is_refused(tmp_path: Path, name: str, what: str, omniprof_cli) -> None:
    """A file past the bound (a sparse file: it costs no disk) is refused on its size, unread."""
    with open(tmp_path / name, "wb") as fh:
        fh.truncate(8 << 30)
    p = _check(omniprof_cli, ["config", "check", name], tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"is over {MAX_TEXT_INPUT_BYTES >> 20}.0 MiB" in p.stderr and what in p.stderr


def test_directory_given_as_config_is_refused(tmp_path: Path, omniprof_cli) -> None:
    p = _check(omniprof_cli, ["config", "check", str(tmp_path)], tmp_path)
    assert p.returncode == 2 and "is a directory, not a config file" in p.stderr
