"""Output paths of a config file are contained for real (symbolic links resolved, not only the
text's ``..``), and ``~`` / ``$HOME`` / ``${NAME}`` in its paths are expanded rather than made into
directories named ``~``. Run as a user runs it: ``python -m omniprof run --config FILE``."""

from __future__ import annotations

from pathlib import Path

import pytest

import omniprof


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "w.py").write_text("sum(range(1000))\n")
    return proj


@pytest.mark.parametrize("key", ["outdir", "logdir", "reporters.json.output"])
def test_symlink_out_of_the_config_directory_is_refused(proj: Path, tmp_path: Path, key: str, omniprof_cli) -> None:
    """`out` is a symlink in the config's directory to a directory outside it: a relative output
    path through it is refused (exit 2, one line naming file:line, key and why) and nothing is
    written there (before: the text "out/..." passed the `..` check and the files went outside)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (proj / "out").symlink_to(outside)
    head, _, last = key.rpartition(".")
    value = "out/r.json" if last == "output" else "out/x"
    (proj / "omniprof.toml").write_text('script = "w.py"\nreporter = "json"\n' + (f"[{head}]\n" if head else "")
                                        + f'{last} = "{value}"\n')
    p = omniprof_cli(["run", "--config", "omniprof.toml"], proj)
    assert p.returncode == 2, p.stderr
    line = next(ln for ln in p.stderr.splitlines() if "leads outside" in ln)
    assert f"omniprof.toml:{4 if head else 3}: $.{key}: 'out/" in line and "symbolic links included" in line, line
    assert list(outside.iterdir()) == []


def test_symlink_inside_the_config_directory_is_fine(proj: Path, omniprof_cli) -> None:
    """A symlink that stays inside the directory is followed as before."""
    (proj / "real").mkdir()
    (proj / "out").symlink_to(proj / "real")
    (proj / "omniprof.toml").write_text('script = "w.py"\nreporter = "json"\noutdir = "out"\n')
    p = omniprof_cli(["run", "--config", "omniprof.toml"], proj)
    assert p.returncode == 0, p.stderr
    assert omniprof.load(proj / "real" / "omniprof.result.json").parts


@pytest.mark.parametrize("spelling", ["~/profiles", "$HOME/profiles", "${HOME}/profiles"])
def test_home_in_config_paths_is_expanded(proj: Path, tmp_path: Path, spelling: str, omniprof_cli) -> None:
    """`outdir = "~/profiles"` (or $HOME, ${HOME}) in a named config writes under the user's home
    (before: a directory literally named `~` or `$HOME` beside the config)."""
    home = tmp_path / "home"
    home.mkdir()
    (proj / "omniprof.toml").write_text(f'script = "w.py"\nreporter = "json"\noutdir = "{spelling}"\n')
    p = omniprof_cli(["run", "--config", "omniprof.toml"], proj, home=home)
    assert p.returncode == 0, p.stderr
    assert omniprof.load(home / "profiles" / "omniprof.result.json").parts
    assert sorted(x.name for x in proj.iterdir()) == ["omniprof.toml", "w.py"]


def test_unset_variable_in_a_config_path_is_a_problem(proj: Path, omniprof_cli) -> None:
    """A path naming a variable that is not set is one problem naming it, not a directory `$X`."""
    (proj / "omniprof.toml").write_text('script = "w.py"\nlogdir = "${NO_SUCH_VAR_OMNIPROF}/logs"\n')
    p = omniprof_cli(["run", "--config", "omniprof.toml"], proj)
    assert p.returncode == 2
    assert "omniprof.toml:2: $.logdir: '${NO_SUCH_VAR_OMNIPROF}/logs' names $NO_SUCH_VAR_OMNIPROF, which is not set" \
        in p.stderr, p.stderr
    assert sorted(x.name for x in proj.iterdir()) == ["omniprof.toml", "w.py"]
