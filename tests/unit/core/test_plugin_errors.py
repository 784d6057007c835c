"""Broken third-party plugins are reported with their name, distribution and the fix; plugins.toml works."""

from __future__ import annotations

import importlib.metadata as md
import textwrap
from pathlib import Path

import pytest

from omniprof import PluginLoadError, PluginValidationError, Profiler
from omniprof.core.registry import Registry, reset_registry

OWN_EPS = [ep for g in ("omniprof.backends", "omniprof.reporters") for ep in md.entry_points(group=g)
           if ep.dist is not None and ep.dist.metadata["Name"] == "omniprof"]

PLUGIN_MODULE = '''
from omniprof.plugin import Backend
from omniprof.core.results import BackendResult
from omniprof.plugin import Reporter


class OldApiBackend(Backend):
    name = "oldapi"
    api_version = 99

    def start(self):
        pass

    def stop(self):
        return BackendResult(backend=self.name)


class NoStopBackend(Backend):
    name = "nostop"

    def start(self):
        pass


class MisnamedBackend(Backend):
    name = "othername"

    def start(self):
        pass

    def stop(self):
        return BackendResult(backend=self.name)


class NotABackend:
    name = "notabackend"


class BadOutputReporter(Reporter):
    name = "badout"
    output = "socket"

    def report(self, result, dest):
        pass
'''

ENTRY_POINTS = """
[omniprof.backends]
oldapi = fakeplug_mod:OldApiBackend
nostop = fakeplug_mod:NoStopBackend
misnamed = fakeplug_mod:MisnamedBackend
notabackend = fakeplug_mod:NotABackend
broken = fakeplug_broken:Thing

[omniprof.reporters]
badout = fakeplug_mod:BadOutputReporter
"""


@pytest.fixture
def fake_dist(tmp_path, monkeypatch):
    """An installed-looking distribution 'fake-plugins 1.2.3' whose entry points name broken plugins."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "fakeplug_mod.py").write_text(PLUGIN_MODULE, encoding="utf-8")
    (site / "fakeplug_broken.py").write_text("raise ImportError('libfoo.so.1 not found')\n", encoding="utf-8")
    info = site / "fake_plugins-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugins\nVersion: 1.2.3\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(ENTRY_POINTS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    empty = tmp_path / "plugins.toml"
    empty.write_text("", encoding="utf-8")
    reg = Registry(entry_points=[*OWN_EPS, *md.PathDistribution(info).entry_points], plugins_file=empty)
    reset_registry(reg)
    return reg


@pytest.mark.parametrize(("name", "error", "fragments"), [
    ("oldapi", PluginValidationError,
     ["backend 'oldapi' from fake-plugins 1.2.3", "api_version=99", "supports api_version 1",
      "Upgrade the plugin or omniprof"]),
    ("nostop", PluginValidationError,
     ["backend 'nostop' from fake-plugins 1.2.3", "does not implement stop", "implement every abstract method"]),
    ("misnamed", PluginValidationError,
     ["backend 'misnamed' from fake-plugins 1.2.3", "name='othername'", "must equal the entry-point name"]),
    ("notabackend", PluginValidationError,
     ["backend 'notabackend' from fake-plugins 1.2.3", "is not a subclass of omniprof.plugin.Backend"]),
    ("broken", PluginLoadError,
     ["backend 'broken' from fake-plugins 1.2.3 failed to import", "ImportError: libfoo.so.1 not found",
      "Fix or reinstall the plugin, or disable it with --no-plugin broken"]),
])
def test_broken_backend_names_plugin_distribution_and_fix(fake_dist, name, error, fragments):
    """Selecting a broken backend raises the right error naming the plugin, its distribution and the fix."""
    with pytest.raises(error) as e:
        fake_dist.backend(name)
    for frag in fragments:
        assert frag in str(e.value)
    assert e.value.plugin == name
    with pytest.raises(error):  # the same answer again, from the cache
        Profiler(backend=["cpu", name], registry=fake_dist)


def test_broken_reporter_output_kind(fake_dist):
    """A reporter with an unknown `output` kind is invalid, with what is allowed."""
    with pytest.raises(PluginValidationError, match="reporter 'badout' from fake-plugins 1.2.3 .*must be 'stream', "
                                                    "'file' or 'dir'"):
        fake_dist.reporter("badout")


def test_broken_plugins_are_listed_not_fatal(fake_dist):
    """`omniprof plugins` data: broken ones are 'broken' with the reason; built-ins stay usable."""
    infos = {i.name: i for i in fake_dist.infos()}
    for name in ("oldapi", "nostop", "misnamed", "notabackend", "broken", "badout"):
        assert infos[name].status == "broken" and infos[name].source == "fake-plugins 1.2.3"
        assert infos[name].reason
    assert infos["cpu"].status == "ok"
    with Profiler(backend="cpu", registry=fake_dist) as prof:
        sum(range(1000))
    assert prof.result.parts[0].backend == "cpu"


def test_no_plugin_disables_a_broken_plugin(tmp_path, fake_dist):
    """--no-plugin NAME (disable=) shows it as disabled and selecting it says how to enable it."""
    reg = Registry(entry_points=[*OWN_EPS, *md.PathDistribution(tmp_path / "site" / "fake_plugins-1.2.3.dist-info")
                                 .entry_points], plugins_file=tmp_path / "plugins.toml", disable=["broken"])
    info = next(i for i in reg.infos() if i.name == "broken")
    assert (info.status, info.reason) == ("disabled", "disabled by --no-plugin")
    with pytest.raises(PluginLoadError, match="backend 'broken' is disabled by --no-plugin; enable it to use it"):
        reg.backend("broken")


def test_unknown_plugin_name_suggests_nearest(fake_dist):
    """An unknown backend name lists what exists and the nearest name."""
    with pytest.raises(PluginLoadError, match="unknown backend 'cpuu'. Did you mean 'cpu'?"):
        fake_dist.backend("cpuu")


# -- plugins.toml ---------------------------------------------------------------------------------------
LOCAL_MODULE = '''
import attrs
from omniprof.plugin import Backend
from omniprof.core.results import BackendResult, Span, Track


class TickBackend(Backend):
    """A project-local backend: one span per session, named by its option."""

    name = "tick"
    single_session = False

    @attrs.frozen(kw_only=True)
    class Options:
        label: str = "tick"
        repeat: int = attrs.field(default=1, validator=attrs.validators.ge(1))

    def start(self):
        self.t0 = self.clock.now_ns()

    def stop(self):
        t1 = self.clock.now_ns()
        return BackendResult(backend=self.name, start_ns=self.t0, end_ns=t1, tracks=[Track("t", "t")],
                             spans=[Span(self.options.label, "t", self.t0, t1 - self.t0)] * self.options.repeat)
'''


def test_plugins_toml_registers_a_local_backend_with_default_options(tmp_path, monkeypatch):
    """A local backend registered by import path runs by name with plugins.toml's default options, overridable."""
    (tmp_path / "local_tick.py").write_text(LOCAL_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    pf = tmp_path / "plugins.toml"
    pf.write_text(textwrap.dedent("""
        [backend.tick]
        target = "local_tick:TickBackend"
        options = { label = "from-plugins-toml", repeat = 2 }

        [reporter.json]
        enabled = false
        """), encoding="utf-8")
    reg = Registry(entry_points=OWN_EPS, plugins_file=pf)
    info = {i.name: i for i in reg.infos()}
    assert info["tick"].source == f"plugins.toml ({pf})" and info["tick"].status == "ok"
    assert info["json"].status == "disabled" and "disabled in" in info["json"].reason
    with Profiler(backend="tick", registry=reg) as prof:
        pass
    assert [s.name for s in prof.result.part("tick").spans] == ["from-plugins-toml"] * 2
    with Profiler(backend="tick", registry=reg, backend_options={"tick": {"repeat": 1}}) as prof:
        pass
    assert [s.name for s in prof.result.part("tick").spans] == ["from-plugins-toml"]
    with pytest.raises(PluginLoadError, match="reporter 'json' is disabled in"):
        reg.reporter("json")


def test_plugins_toml_found_through_environment(tmp_path, monkeypatch):
    """OMNIPROF_PLUGINS names the plugins.toml the registry reads."""
    pf = tmp_path / "elsewhere.toml"
    pf.write_text('[backend.cpu]\noptions = { interval_s = 0.004 }\n', encoding="utf-8")
    monkeypatch.setenv("OMNIPROF_PLUGINS", str(pf))
    reg = Registry(entry_points=OWN_EPS)
    assert reg.plugins_file == pf and reg.default_options("backend", "cpu") == {"interval_s": 0.004}


def test_plugins_toml_without_target_for_unknown_name_is_a_problem(tmp_path):
    """An entry with no target for a name nothing installs is reported in registry.problems, not ignored."""
    pf = tmp_path / "plugins.toml"
    pf.write_text("[backend.ghost]\nenabled = false\n", encoding="utf-8")
    reg = Registry(entry_points=OWN_EPS, plugins_file=pf)
    assert reg.problems == [f"backend 'ghost' in {pf} has no 'target' and no installed plugin has that name"]


def test_repo_plugins_toml_matches_entry_points():
    """The repository's plugins.toml catalogue has the same names and targets as omniprof's entry points."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    root = Path(__file__).resolve().parents[3]
    data = tomllib.loads((root / "plugins.toml").read_text(encoding="utf-8"))
    catalogue = {(k, n, spec["target"]) for k, table in data.items() for n, spec in table.items()}
    eps = {("backend" if ep.group == "omniprof.backends" else "reporter", ep.name, ep.value) for ep in OWN_EPS}
    assert catalogue == eps
