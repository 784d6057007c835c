"""CLI commands build their own registry from --plugins/--no-plugin and pass it down (reader,
reporters, config validation, the runner): the process-wide registry is never replaced."""

from __future__ import annotations

import textwrap

import pytest

import omniprof
from omniprof.cli import main
from omniprof.core.registry import get_registry
from omniprof.errors import PluginLoadError

PLUGINS = '''
import json, time
from omniprof.plugin import Backend, BackendResult, Reader, Reporter
from omniprof.core.results import ProfileResult, Span, Track

class Clock(Backend):
    name, summary = "clock_{tag}", "one span per session"
    def start(self):
        self.t0 = self.clock.now_ns()
    def stop(self):
        t1 = self.clock.now_ns()
        return BackendResult(backend=self.name, tracks=[Track("s", "session")],
                             spans=[Span("session", "s", self.t0, t1 - self.t0)], start_ns=self.t0, end_ns=t1)

class Spans(Reporter):
    name, output = "spans_{tag}", "stream"
    def report(self, result, dest):
        for part in result.parts:
            for s in part.spans:
                dest.write(f"SPAN {{part.backend}} {{s.name}}\\n")

class Saved(Reader):
    name = "saved_{tag}"
    @classmethod
    def sniff(cls, path, head):
        return head.startswith(b"SAVED_{tag}\\n")
    def read(self, path):
        return ProfileResult.from_dict(json.loads(path.read_text().split("\\n", 1)[1]))
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A plugins.toml naming a backend, a reporter and a reader of a module in tmp_path (names
    unique to the test: sys.modules keeps a module once imported)."""
    tag = tmp_path.name.replace("-", "_")
    (tmp_path / f"cliplug_{tag}.py").write_text(PLUGINS.format(tag=tag), encoding="utf-8")
    toml = tmp_path / "plugins.toml"
    toml.write_text(textwrap.dedent(f'''
        [backend.clock_{tag}]
        target = "cliplug_{tag}:Clock"
        [reporter.spans_{tag}]
        target = "cliplug_{tag}:Spans"
        [reader.saved_{tag}]
        target = "cliplug_{tag}:Saved"
        '''), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return toml, tag


def _untouched(before, tag):
    reg = get_registry()
    assert reg is before
    for kind in ("backend", "reporter", "reader"):
        assert not any(n.endswith(tag) for n in reg.names(kind, include_disabled=True)), kind
    assert "json" in reg.names("reporter")  # --no-plugin json did not disable it here


def test_cli_commands_leave_the_process_registry_alone(plugins, tmp_path, capsys):
    """run, report, diff, plugins, config check and doctor with --plugins/--no-plugin use their own
    registry: the plugins.toml's backend, reporter and reader work in the command, and
    get_registry() afterwards is the same object, without them, with json still enabled."""
    toml, tag = plugins
    before = get_registry()
    (tmp_path / "work.py").write_text("x = sum(range(1000))\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["run", "--plugins", str(toml), "--no-plugin", "json", "-b", f"clock_{tag}", "-r", f"spans_{tag}",
               "--no-config", "-o", str(out), "work.py"])
    assert rc == 0, capsys.readouterr().err
    assert f"SPAN clock_{tag} session" in capsys.readouterr().out
    _untouched(before, tag)

    # a result in the plugin reader's format: only the command's registry can read it
    with omniprof.Profiler(backend="cpu") as prof:
        sum(range(1000))
    saved = tmp_path / "run.saved"
    saved.write_text(f"SAVED_{tag}\n" + prof.result.to_json(), encoding="utf-8")
    assert main(["report", "--plugins", str(toml), "--no-plugin", "json", "-r", f"spans_{tag}", str(saved)]) == 0
    capsys.readouterr()
    assert main(["diff", "--plugins", str(toml), str(saved), str(saved)]) == 0
    capsys.readouterr()
    assert main(["plugins", "--no-probe", "--plugins", str(toml), "--no-plugin", "json"]) == 0
    listed = capsys.readouterr().out
    assert f"spans_{tag}" in listed and "disabled by --no-plugin" in listed
    (tmp_path / "omniprof.toml").write_text(f'script = "work.py"\nbackend = "clock_{tag}"\n', encoding="utf-8")
    assert main(["config", "check", "--plugins", str(toml), "omniprof.toml"]) == 0
    assert main(["doctor", "--no-frameworks", "--plugins", str(toml), "--no-plugin", "json"]) == 0
    capsys.readouterr()
    _untouched(before, tag)
    # the library's default still knows none of them
    with pytest.raises(PluginLoadError, match=f"unknown reporter 'spans_{tag}'"):
        omniprof.report(prof.result, f"spans_{tag}")
    from omniprof.core.readers import read_any
    from omniprof.errors import TraceReadError

    with pytest.raises(TraceReadError, match="unrecognised file format"):
        read_any(saved)
