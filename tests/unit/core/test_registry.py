"""Plugin registry: entry points, validation on load, broken plugins isolated, plugins.toml."""

from __future__ import annotations

import pytest

from omniprof.core.registry import Registry, load_plugins_file
from omniprof.errors import ConfigError, PluginLoadError, PluginValidationError

T = "tests.unit.core.plugins_for_tests"


def _status(reg, name):
    return {i.name: i for i in reg.infos()}[name]


def test_builtins_registered_through_entry_points():
    """The built-in backends and reporters come from omniprof's own entry points."""
    reg = Registry()
    infos = {(i.kind, i.name): i for i in reg.infos()}
    assert ("backend", "cpu") in infos and ("reporter", "table") in infos and ("reporter", "json") in infos
    assert infos[("backend", "cpu")].source.startswith("omniprof ")
    assert infos[("backend", "cpu")].status == "ok"



def test_installed_entry_points_are_read_once_for_all_groups(monkeypatch):
    """A process reads the installed distributions' entry points once for all registries and their three
    groups (each read opens every distribution's entry_points.txt), and finds what a direct read finds."""
    import importlib.metadata as md

    real = md.entry_points
    calls = []

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    from omniprof.core import registry as registry_mod

    monkeypatch.setattr(md, "entry_points", counting)
    monkeypatch.setattr(registry_mod, "_INSTALLED", None)  # as in a fresh process
    reg = Registry(autoload=True)
    Registry(autoload=True)  # a second registry (omniprof run makes two) reads nothing again
    assert len(calls) == 1
    installed = real()
    for kind, group in (("backend", "omniprof.backends"), ("reporter", "omniprof.reporters"),
                        ("reader", "omniprof.readers")):
        assert set(reg.names(kind, include_disabled=True)) >= {ep.name for ep in installed.select(group=group)}


@pytest.mark.parametrize("name,target,status,fragment", [
    ("widget", f"{T.rsplit('.', 1)[0]}.broken_plugin_module:Anything", "broken", "libwidget.so.3"),
    ("nomod", "no_such_module_xyz:Thing", "broken", "No module named 'no_such_module_xyz'"),
    ("notabackend", f"{T}:NotABackend", "broken", "not a subclass of omniprof.plugin.Backend"),
    ("wrongapi", f"{T}:WrongApiBackend", "broken", "api_version=99"),
    ("nostop", f"{T}:MissingStopBackend", "broken", "does not implement stop"),
    ("misnamed", f"{T}:MisnamedBackend", "broken", "must equal the entry-point name"),
    ("probecrash", f"{T}:ProbeCrashBackend", "broken", "probe() raised KeyError"),
    ("unavail", f"{T}:UnavailableBackend", "unavailable", "no widget attached (plug in a widget)"),
])
def test_bad_plugins_are_listed_not_fatal(registry_with, name, target, status, fragment):
    """A broken/unavailable plugin shows its status and reason; the others still load and run."""
    reg = registry_with(("backend", name, target))
    info = _status(reg, name)
    assert info.status == status
    assert fragment in info.reason
    assert _status(reg, "cpu").status == "ok"
    import omniprof

    with omniprof.Profiler(backend="cpu", registry=reg):
        pass


def test_selecting_a_broken_plugin_is_fatal_with_name_and_fix(registry_with):
    """Selecting a broken plugin raises PluginLoadError naming it, its source and the fix."""
    reg = registry_with(("backend", "widget", f"{T.rsplit('.', 1)[0]}.broken_plugin_module:W"))
    with pytest.raises(PluginLoadError) as e:
        reg.backend("widget")
    msg = str(e.value)
    assert "backend 'widget'" in msg and "failed to import" in msg and "--no-plugin widget" in msg
    assert e.value.plugin == "widget"
    assert isinstance(e.value.__cause__, ImportError)


def test_wrong_api_version_raises_validation_error(registry_with):
    """A plugin with an unsupported api_version fails validation, saying which versions are supported."""
    reg = registry_with(("backend", "wrongapi", f"{T}:WrongApiBackend"))
    with pytest.raises(PluginValidationError, match="api_version"):
        reg.backend("wrongapi")


def test_reporter_output_kind_validated(registry_with):
    """A reporter declaring an unknown output kind is rejected on load."""
    reg = registry_with(("reporter", "badoutput", f"{T}:BadOutputReporter"))
    with pytest.raises(PluginValidationError, match="'stream', 'file' or 'dir'"):
        reg.reporter("badoutput")


def test_disable_and_autoload(monkeypatch, registry_with):
    """--no-plugin disables; OMNIPROF_DISABLE_PLUGIN_AUTOLOAD keeps only omniprof's own plugins."""
    reg = registry_with(("backend", "fake", "omniprof.testing.fakes:FakeBackend"), disable=["fake"])
    assert _status(reg, "fake").status == "disabled"
    with pytest.raises(PluginLoadError, match="disabled by --no-plugin"):
        reg.backend("fake")
    monkeypatch.setenv("OMNIPROF_DISABLE_PLUGIN_AUTOLOAD", "1")
    reg2 = registry_with(("backend", "fake", "omniprof.testing.fakes:FakeBackend"))
    assert "fake" not in reg2.names("backend") and "cpu" in reg2.names("backend")


def test_plugins_toml_local_plugin_disable_and_defaults(tmp_path):
    """plugins.toml registers a local plugin by import path, disables another, sets default options."""
    f = tmp_path / "plugins.toml"
    f.write_text(
        '[backend.fake]\ntarget = "omniprof.testing.fakes:FakeBackend"\noptions = { span_name = "from-toml" }\n'
        '[reporter.json]\nenabled = false\n'
        '[backend.cpu]\noptions = { interval_s = 0.002 }\n')
    reg = Registry(plugins_file=f)
    assert _status(reg, "fake").source == f"plugins.toml ({f})"
    assert _status(reg, "json").status == "disabled"
    import omniprof

    with omniprof.Profiler(backend="fake", registry=reg) as prof:
        pass
    assert prof.result.parts[0].spans[0].name == "from-toml"
    assert omniprof.Profiler(backend="cpu", registry=reg)._backend_opts["cpu"].interval_s == 0.002


def test_plugins_toml_reports_every_problem(tmp_path):
    """A bad plugins.toml reports all of its problems at once with key paths."""
    f = tmp_path / "plugins.toml"
    f.write_text('[backnd.x]\ntarget="a:b"\n[backend.y]\ntarget = "nocolon"\nenabled = "yes"\ncolour = 1\n')
    with pytest.raises(ConfigError) as e:
        load_plugins_file(f)
    msg = str(e.value)
    assert "4 problem(s)" in msg and str(f) in msg
    assert "did you mean 'backend'?" in msg and "$.backnd" in msg
    assert "$.backend.y.target" in msg and "$.backend.y.enabled" in msg and "$.backend.y.colour" in msg


def test_plugins_toml_invalid_toml(tmp_path):
    """Unparseable TOML is a ConfigError naming the file."""
    f = tmp_path / "plugins.toml"
    f.write_text("[backend.x\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_plugins_file(f)


def test_default_options_validated_when_selected(tmp_path):
    """Bad default options in plugins.toml fail with the plugin's name when it is selected."""
    f = tmp_path / "plugins.toml"
    f.write_text("[backend.cpu]\noptions = { interval_s = -1 }\n")
    import omniprof

    reg = Registry(plugins_file=f)
    with pytest.raises(omniprof.InvalidArgumentError, match=r"backend 'cpu'.*'interval_s' must be > 0"):
        omniprof.Profiler(backend="cpu", registry=reg)
