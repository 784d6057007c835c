"""`omniprof view LOGDIR`: argument errors, tested in-process (serving is tested in
tests/integration/test_xprof_viewer.py against the real XProf server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omniprof.cli import main


def test_view_rejects_a_path_that_is_not_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing logdir is a usage error (exit 2) that says how to make one."""
    assert main(["view", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "is not a directory" in err and "-r tensorboard" in err


def test_view_rejects_a_bad_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port outside 0-65535 is rejected before anything starts."""
    assert main(["view", str(tmp_path), "--port", "70000"]) == 2
    assert "'port' must be an integer between 0 and 65535 (got 70000)" in capsys.readouterr().err


def test_view_help_names_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    """`omniprof view --help` documents the 127.0.0.1 default."""
    with pytest.raises(SystemExit) as exit_:
        main(["view", "--help"])
    assert exit_.value.code == 0
    assert "127.0.0.1" in capsys.readouterr().out
