"""A config found in the working directory sets no environment, loads no plugins file and points
nowhere outside its directory until the user trusts it (``omniprof plugins --trust FILE``, the
store plugins.toml uses) or names it (``--config``); ``omniprof run`` says which config it applied.

Each case is a real ``python -m omniprof`` in a directory laid out as a downloaded checkout would
be, with a payload that leaves a file behind if it ever runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import omniprof

PAYLOAD = 'open({marker!r}, "w").write("code from the checkout ran")\n'
SPAWNS = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)\nopen('RAN', 'w').write('')\n"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """omniprof.toml whose [env] puts evil/ on PYTHONPATH (evil/sitecustomize.py runs in every
    Python subprocess of the program), and a program that starts one."""
    proj = tmp_path / "proj"
    (proj / "evil").mkdir(parents=True)
    (proj / "evil" / "sitecustomize.py").write_text(PAYLOAD.format(marker=str(proj / "PWNED")))
    (proj / "w.py").write_text(SPAWNS)
    (proj / "omniprof.toml").write_text('script = "w.py"\nreporter = "json"\noutdir = "out"\n\n[env]\n'
                                        'PYTHONPATH = "evil"\nLD_PRELOAD = ""\n')
    return proj


def _refusals(stderr: str) -> list[str]:
    return [ln.strip() for ln in stderr.splitlines() if "refused:" in ln]


def test_found_config_env_is_refused_until_trusted(checkout: Path, omniprof_cli) -> None:
    """`omniprof run` beside that omniprof.toml: exit 2 before anything runs, one line naming $.env,
    the variables and the fix; nothing from evil/ runs (before: PWNED, the env applied). Once trusted
    with `omniprof plugins --trust omniprof.toml` the same run applies it; an edit withdraws it."""
    p = omniprof_cli(["run"], checkout)
    assert p.returncode == 2, p.stderr
    [line] = _refusals(p.stderr)
    assert "omniprof.toml:5: $.env: refused: sets PYTHONPATH, LD_PRELOAD" in line
    assert "`omniprof plugins --trust omniprof.toml`" in line and "--config omniprof.toml" in line
    assert not (checkout / "PWNED").exists() and not (checkout / "RAN").exists()

    p = omniprof_cli(["plugins", "--trust", "omniprof.toml"], checkout)
    assert p.returncode == 0 and "is trusted as it is now" in p.stderr, p.stderr
    store = json.loads((checkout / ".config" / "omniprof" / "trusted-plugins.json").read_text())
    assert list(store) == [str(checkout / "omniprof.toml")]
    p = omniprof_cli(["run"], checkout)
    assert p.returncode == 0, p.stderr
    assert (checkout / "RAN").exists() and (checkout / "PWNED").exists()  # trusted: its env applies
    (checkout / "PWNED").unlink()

    with open(checkout / "omniprof.toml", "a") as fh:
        fh.write("# edited\n")
    p = omniprof_cli(["run"], checkout)
    assert p.returncode == 2 and len(_refusals(p.stderr)) == 1 and not (checkout / "PWNED").exists()


def test_named_config_applies_in_full_and_run_names_the_config(checkout: Path, omniprof_cli) -> None:
    """Named with --config, the same file applies whole and no line is added (the user just named
    it); found, a clean config is applied with one line saying which file (and profile)."""
    p = omniprof_cli(["run", "--config", "omniprof.toml"], checkout)
    assert p.returncode == 0, p.stderr
    assert (checkout / "PWNED").exists() and "omniprof: config " not in p.stderr
    (checkout / "PWNED").unlink()
    p = omniprof_cli(["run"], checkout, OMNIPROF_CONFIG="omniprof.toml")  # named by the environment
    assert p.returncode == 0, p.stderr
    assert (checkout / "PWNED").exists() and "omniprof: config omniprof.toml (from $OMNIPROF_CONFIG)" in p.stderr
    (checkout / "PWNED").unlink()

    (checkout / "omniprof.toml").write_text('script = "w.py"\nreporter = "json"\noutdir = "out"\n'
                                            '[profiles.fast]\nrepeats = 2\n')
    p = omniprof_cli(["run", "--profile", "fast"], checkout)
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stderr.splitlines() if ln.startswith("omniprof: config ")]
    assert notes == [f"omniprof: config {checkout / 'omniprof.toml'}, profile 'fast' (found in the working "
                     f"directory; --no-config skips it)"]
    assert not (checkout / "PWNED").exists()
    assert omniprof.load(checkout / "out" / "omniprof.result.json").parts


def test_found_config_cannot_load_a_plugins_file(checkout: Path, omniprof_cli) -> None:
    """`plugins = "plugins.toml"` in a found config no longer counts as naming the file: neither
    `omniprof run` nor `omniprof config check` imports its targets (before: evilmod ran at import);
    named, the same config loads it."""
    (checkout / "evilmod.py").write_text(PAYLOAD.format(marker=str(checkout / "PWNED"))
                                         + "from omniprof.testing.fakes import FakeBackend\n"
                                           "class TickBackend(FakeBackend):\n    name = 'tick'\n")
    (checkout / "plugins.toml").write_text('[backend.tick]\ntarget = "evilmod:TickBackend"\n')
    (checkout / "omniprof.toml").write_text('script = "w.py"\nbackend = "tick"\nplugins = "plugins.toml"\n'
                                            'reporter = "json"\noutdir = "out"\n')
    for args in (["run"], ["config", "check"], ["config", "show"]):
        p = omniprof_cli(args, checkout)
        assert p.returncode in (1, 2), (args, p.stderr)
        [line] = _refusals(p.stderr)
        assert "omniprof.toml:3: $.plugins: refused:" in line and "--trust omniprof.toml" in line, line
        assert not (checkout / "PWNED").exists(), args
    p = omniprof_cli(["run", "--config", "omniprof.toml"], checkout)
    assert p.returncode == 0, p.stderr
    assert (checkout / "PWNED").exists()
    assert [x.backend for x in omniprof.load(checkout / "out" / "omniprof.result.json").parts] == ["tick"]


def test_found_config_paths_stay_in_its_directory(checkout: Path, tmp_path: Path, omniprof_cli) -> None:
    """A found config's absolute output path, `~` path, and relative path through a symlink that
    leads out are each refused on their own line; nothing is written outside (named, the absolute
    path is the user's choice and is used)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (checkout / "link").symlink_to(outside)
    (checkout / "omniprof.toml").write_text(f'script = "w.py"\nlogdir = "{outside / "logs"}"\noutdir = "~/reports"\n'
                                            f'[reporters.json]\noutput = "link/r.json"\n')
    p = omniprof_cli(["run"], checkout)
    assert p.returncode == 2, p.stderr
    lines = _refusals(p.stderr)
    assert [ln.split(": refused:")[0].rsplit(": ", 1)[1] for ln in lines] == ["$.logdir", "$.outdir",
                                                                              "$.reporters.json.output"]
    assert all("may not point outside its directory" in ln for ln in lines)
    assert list(outside.iterdir()) == [] and not (checkout / "RAN").exists()
