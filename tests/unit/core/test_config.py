"""Config files: layering, validation with file:line and key paths, profiles, running a config."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omniprof import ConfigError, ProfileOptions
from omniprof import config as cfgmod
from omniprof.runner import execute
from omniprof.config import (
    check_config,
    check_plugins_file,
    cli_layer,
    dump_toml,
    env_layer,
    find_config,
    load_config,
)
from omniprof.analysis import calltree
from omniprof.core.schedule import Schedule
from omniprof.core.tomlpos import key_lines, line_of
from tests.tools import config_dir, write

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    config_dir(tmp_path, monkeypatch)
    write(tmp_path / "work.py", """
        import os, sys
        def hot(n):
            return sum(i * i for i in range(n))
        def record(path, n=1, tag="x"):
            with open(path, "a") as fh:
                fh.write(f"{tag}:{n}:{os.environ.get('CFG_TEST_VAR', '-')}\\n")
        if __name__ == "__main__":
            record(sys.argv[1], tag="script:" + ",".join(sys.argv[2:]))
        """)
    return tmp_path


FULL = """
    # a whole run
    script = "work.py"
    args = ["calls.txt", "a"]
    backend = ["cpu"]
    repeats = 2

    [options]
    host_tracer_level = 3
    [options.advanced_configuration]
    gpu_max_activity_api_events = 4000000

    [backends.cpu]
    interval_s = 0.0005
    engine = "thread"

    [reporters.table]
    max_rows = 5
    [reporters.json]
    output = "out/run.json"
    indent = 2

    [env]
    CFG_TEST_VAR = "from-config"

    [profiles.quick]
    repeats = 1
    [profiles.quick.backends.cpu]
    interval_s = 0.002
"""


# -- reading and layering ---------------------------------------------------------------------------
def test_full_file_is_structured_into_a_run_config(workdir):
    """Every section of a config becomes the matching typed setting (options, backend options, reporters, env)."""
    cfg = load_config(write(workdir / "omniprof.toml", FULL), environ={})
    assert cfg.target.kind == "script" and cfg.target.value == str(workdir / "work.py")
    assert cfg.target.args == ("calls.txt", "a")
    assert cfg.backends == ("cpu",) and cfg.repeats == 2 and cfg.repeat_count() == 2
    assert cfg.options == ProfileOptions(host_tracer_level=3,
                                         advanced_configuration={"gpu_max_activity_api_events": 4000000})
    assert cfg.backend_options == {"cpu": {"interval_s": 0.0005, "engine": "thread"}}
    assert [r.name for r in cfg.reporters] == ["table", "json"]
    assert cfg.reporters[1].output == str(workdir / "out" / "run.json")
    assert dict(cfg.reporters[1].options) == {"indent": 2}
    assert cfg.env == {"CFG_TEST_VAR": "from-config"}


def test_profile_overrides_base_and_keeps_the_rest(workdir):
    """A named profile replaces the keys it sets, deep-merges tables, and inherits everything else."""
    cfg = load_config(write(workdir / "omniprof.toml", FULL), "quick", environ={})
    assert cfg.repeats == 1 and cfg.profile == "quick"
    assert cfg.backend_options["cpu"] == {"interval_s": 0.002, "engine": "thread"}
    assert cfg.options.host_tracer_level == 3


def test_unknown_profile_names_the_nearest(workdir):
    """Asking for a profile that does not exist names the closest one and lists them all."""
    with pytest.raises(ConfigError, match="no profile 'quik'; did you mean 'quick'"):
        load_config(write(workdir / "omniprof.toml", FULL), "quik", environ={})


def test_pyproject_tool_table_is_a_config(workdir):
    """[tool.omniprof] in pyproject.toml is read like omniprof.toml, and problems point into the pyproject."""
    write(workdir / "pyproject.toml", """
        [project]
        name = "x"

        [tool.omniprof]
        function = "work:hot"
        args = [1000]
        [tool.omniprof.backends.cpu]
        interval_s = -1
        """)
    assert find_config(workdir) == workdir / "pyproject.toml"
    with pytest.raises(ConfigError) as e:
        load_config(workdir / "pyproject.toml", environ={})
    assert e.value.problems == [
        f"{workdir / 'pyproject.toml'}:8: $.tool.omniprof.backends.cpu.interval_s: backend 'cpu': "
        f"'interval_s' must be > 0.0 (got -1)"]


def test_find_config_prefers_omniprof_toml_and_ignores_plain_pyproject(workdir):
    """omniprof.toml wins; a pyproject.toml without [tool.omniprof] is not a config."""
    write(workdir / "pyproject.toml", "[project]\nname = 'x'\n")
    assert find_config(workdir) is None
    write(workdir / "omniprof.toml", "backend = 'cpu'\n")
    assert find_config(workdir) == workdir / "omniprof.toml"


def test_precedence_file_then_env_then_cli(workdir):
    """defaults < file < OMNIPROF_* environment < command line, key by key."""
    path = write(workdir / "omniprof.toml", """
        script = "work.py"
        label = "file"
        [options]
        host_tracer_level = 1
        device_tracer_level = 0
        [backends.cpu]
        interval_s = 0.004
        """)
    env = {"OMNIPROF_HOST_TRACER_LEVEL": "3", "OMNIPROF_LABEL": "env", "OMNIPROF_REPEATS": "4"}
    cfg = load_config(path, environ=env)
    assert (cfg.options.host_tracer_level, cfg.options.device_tracer_level, cfg.label, cfg.repeats) == (3, 0, "env", 4)
    cli = cli_layer(options=["host_tracer_level=2", "cpu.interval_s=0.003"], label="cli")
    cfg = load_config(path, environ=env, cli=cli)
    assert (cfg.options.host_tracer_level, cfg.options.device_tracer_level, cfg.label, cfg.repeats) == (2, 0, "cli", 4)
    assert cfg.backend_options["cpu"] == {"interval_s": 0.003}
    assert cfg.options.python_tracer_level == 0  # the default, set nowhere


def test_cli_target_replaces_the_files_target_and_its_args(workdir):
    """A script on the command line replaces the file's function and its args/kwargs."""
    path = write(workdir / "omniprof.toml", 'function = "work:record"\nargs = ["x"]\nkwargs = { n = 3 }\n')
    cfg = load_config(path, environ={}, cli=cli_layer(script="work.py", args=["calls.txt"]))
    assert cfg.target.kind == "script" and cfg.target.args == ("calls.txt",) and not cfg.target.kwargs


def test_env_layer_reads_only_known_variables():
    """OMNIPROF_BACKEND is a comma list, levels are parsed as numbers, unknown OMNIPROF_* are ignored."""
    layer = env_layer({"OMNIPROF_BACKEND": "cpu, fake", "OMNIPROF_HOST_TRACER_LEVEL": "1", "OMNIPROF_OTHER": "x"})
    assert layer.data == {"backend": ["cpu", "fake"], "options": {"host_tracer_level": 1}}
    assert layer.origin(("options", "host_tracer_level")) == "environment variable OMNIPROF_HOST_TRACER_LEVEL"


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("yes", True), ("0", False), ("false", False)])
def test_env_verbose_accepts_usual_spellings(raw, value):
    """OMNIPROF_VERBOSE takes 1/0, yes/no, true/false."""
    assert env_layer({"OMNIPROF_VERBOSE": raw}).data == {"verbose": value}


def test_public_names_are_lazy_reexports():
    """omniprof.load_config / RunConfig / diff are the core functions, imported on first use."""
    import omniprof
    from omniprof.analysis.diff import diff

    assert omniprof.load_config is load_config and omniprof.RunConfig is cfgmod.RunConfig and omniprof.diff is diff
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        omniprof.nope  # noqa: B018


def test_bad_env_value_is_reported_with_the_variable(workdir):
    """A bad OMNIPROF_* value names the variable, not a file line."""
    with pytest.raises(ConfigError) as e:
        load_config(text='function = "work:hot"\n', environ={"OMNIPROF_REPEATS": "0"})
    assert e.value.problems == ["environment variable OMNIPROF_REPEATS: $.repeats: 'repeats' must be >= 1 (got 0)"]


# -- validation: every problem at once --------------------------------------------------------------
BAD = """
    script = "missing.py"
    backend = ["cpu", "cpuu"]
    repeat = 3

    [options]
    host_tracer_level = 7
    [options.advanced_configuration]
    gpu_max_activty_api_events = 5

    [backends.cpu]
    interval_s = -1
    engin = "x"

    [schedule]
    actve = 2

    [reporters.table]
    max_rows = "many"

    [env]
    "BAD NAME" = "1"
"""


def test_all_problems_reported_at_once_with_line_key_path_and_nearest_key(workdir):
    """One ConfigError lists every problem with file:line, $.key.path and 'did you mean' for typos."""
    path = write(workdir / "omniprof.toml", BAD)
    with pytest.raises(ConfigError) as e:
        load_config(path, environ={})
    got = e.value.problems
    f = str(path)
    expected_fragments = [
        (f"{f}:3: $.repeat: unknown key 'repeat'; did you mean 'repeats'?"),
        (f"{f}:1: $.script: no such script"),
        (f"{f}:2: $.backend[1]: unknown backend 'cpuu'; did you mean 'cpu'?"),
        (f"{f}:6: $.options.host_tracer_level: 'host_tracer_level' must be one of 0, 1, 2, 3 (got 7)"),
        (f"{f}:8: $.options.advanced_configuration.gpu_max_activty_api_events: unknown advanced_configuration key "
         f"'gpu_max_activty_api_events'; did you mean 'gpu_max_activity_api_events'?"),
        (f"{f}:11: $.backends.cpu.interval_s: backend 'cpu': 'interval_s' must be > 0.0 (got -1)"),
        (f"{f}:12: $.backends.cpu.engin: backend 'cpu': unknown option 'engin'; did you mean 'engine'?"),
        (f"{f}:15: $.schedule.actve: schedule: unknown option 'actve'; did you mean 'active'?"),
        (f"{f}:18: $.reporters.table.max_rows: reporter 'table': 'max_rows' must be an integer >= 1 (got 'many'"),
        (f'{f}:21: $.env."BAD NAME": \'BAD NAME\' is not a valid environment variable name'),
    ]
    for frag in expected_fragments:
        assert any(p.startswith(frag) for p in got), f"missing: {frag}\ngot:\n" + "\n".join(got)
    assert len(got) == len(expected_fragments)
    assert str(e.value).startswith(f"{len(got)} problem(s) in {f}:")


def test_check_config_covers_base_and_every_profile(workdir):
    """check_config reports problems of the base and of each profile, each once, with the profile's key path."""
    path = write(workdir / "omniprof.toml", """
        function = "work:hot"
        [backends.cpu]
        interval_s = 0
        [profiles.a]
        repeats = 0
        [profiles.b.backends.cpu]
        max_samples = -5
        """)
    problems = check_config(path)
    f = str(path)
    assert problems == [
        f"{f}:3: $.backends.cpu.interval_s: backend 'cpu': 'interval_s' must be > 0.0 (got 0)",
        f"{f}:5: $.profiles.a.repeats: 'repeats' must be >= 1 (got 0)",
        f"{f}:7: $.profiles.b.backends.cpu.max_samples: backend 'cpu': 'max_samples' must be between 1 and "
        f"2147483647 (got -5)",
    ]
    assert check_config(write(workdir / "ok.toml", 'function = "work:hot"\n')) == []


def test_invalid_toml_is_one_problem_with_the_position(workdir):
    """A TOML syntax error is reported with tomllib's line and column."""
    problems = check_config(write(workdir / "omniprof.toml", "a = 1\nb = = 2\n"))
    assert len(problems) == 1 and "invalid TOML" in problems[0] and "line 2" in problems[0]


@pytest.mark.parametrize(("text", "fragment"), [
    ('script = "work.py"\nmodule = "work"\n', "give one of script, module, function"),
    ('function = "work.hot"\n', "is not of the form 'package.module:function'"),
    ('function = "no_such_module_xyz:f"\n', "module 'no_such_module_xyz' of 'no_such_module_xyz:f' cannot be imported"),
    ('module = "work"\nkwargs = { a = 1 }\n', "'kwargs' is for a function target"),
    ('args = ["x"]\n', "'args' needs a target"),
    ('function = "work:hot"\nrepeats = 2\nduration_s = 1.0\n', "give either repeats or duration_s, not both"),
    ('function = "work:hot"\nreporter = []\n', "'reporter' must be a name or a non-empty list of names"),
    ('function = "work:hot"\n[profiles.x.profiles.y]\nlabel = "z"\n', "profiles cannot be nested"),
])
def test_target_and_run_shape_problems(workdir, text, fragment):
    """Targets and run shapes that cannot work are refused with a specific message."""
    problems = check_config(write(workdir / "omniprof.toml", text))
    assert any(fragment in p for p in problems), problems


def test_options_for_a_backend_not_selected_are_still_validated(workdir):
    """[backends.NAME] for a registered but unselected backend is checked; an unregistered name is a typo."""
    problems = check_config(write(workdir / "omniprof.toml", """
        function = "work:hot"
        [backends.cpux]
        interval_s = 1
        """))
    assert len(problems) == 1
    assert problems[0].startswith(f"{workdir / 'omniprof.toml'}:2: $.backends.cpux: unknown backend 'cpux'; "
                                  f"did you mean 'cpu'? Registered backends: cpu")


def test_plugins_toml_defaults_are_validated_with_the_plugin_options(workdir, registry_with):
    """plugins.toml default options that are invalid surface in the config check at the table's path."""
    write(workdir / "plugins.toml", "[backend.cpu]\noptions = { interval_s = -2 }\n")
    reg = registry_with(plugins_file=workdir / "plugins.toml")
    problems = check_config(write(workdir / "omniprof.toml", 'function = "work:hot"\n[backends.cpu]\nengine = "thread"\n'),
                            registry=reg)
    assert len(problems) == 1 and "$.backends.cpu: backend 'cpu': 'interval_s' must be > 0.0 (got -2)" in problems[0]


def test_check_plugins_file_validates_format_imports_and_options(workdir):
    """A plugins.toml check reports bad default options (with nearest key) and unimportable targets, with lines."""
    path = write(workdir / "plugins.toml", """
        [backend.cpu]
        options = { interval_s = -1, engin = "x" }

        [backend.mine]
        target = "no_such_module_xyz:Thing"

        [reporter.table]
        enabled = false
        options = { max_rows = 0 }
        """)
    problems = check_plugins_file(path)
    f = str(path)
    assert problems[0] == f"{f}:2: $.backend.cpu.options.interval_s: backend 'cpu': 'interval_s' must be > 0.0 (got -1)"
    assert problems[1].startswith(f"{f}:2: $.backend.cpu.options.engin: backend 'cpu': unknown option 'engin'; "
                                  f"did you mean 'engine'?")
    assert problems[2].startswith(f"{f}:4: $.backend.mine: backend 'mine' from plugins.toml")
    assert "No module named 'no_such_module_xyz'" in problems[2] and "--no-plugin mine" in problems[2]
    assert len(problems) == 3  # the disabled reporter's options are not checked


# -- key positions ----------------------------------------------------------------------------------
def test_key_lines_handles_headers_dotted_quoted_inline_and_multiline_values():
    """Lines are found for table headers, dotted and quoted keys, inline tables, after multi-line strings/arrays."""
    text = textwrap.dedent('''
        a = 1
        arr = [
          "x = 1",
        ]
        [t."q.k"]
        b.c = 2
        s = """
        fake = 3
        """
        inl = { x = 1, y = { z = 2 } }
        [[list]]
        w = 1
        ''')
    lines = key_lines(text)
    assert lines[("a",)] == 2 and lines[("arr",)] == 3
    assert lines[("t", "q.k")] == 6 and lines[("t", "q.k", "b", "c")] == 7
    assert ("t", "q.k", "fake") not in lines and ("x",) not in lines
    assert lines[("t", "q.k", "inl", "y", "z")] == 11
    assert lines[("list", "w")] == 13
    assert line_of(lines, ("t", "q.k", "inl", "missing")) == 11


# -- effective configuration --------------------------------------------------------------------------
def test_show_dict_fills_defaults_and_round_trips_through_toml(workdir):
    """to_dict() has every option with its default; its TOML dump reads back to the same configuration."""
    path = write(workdir / "omniprof.toml", FULL)
    cfg = load_config(path, environ={})
    data = cfg.to_dict()
    assert data["backends"]["cpu"] == {"interval_s": 0.0005, "max_samples": 1_000_000, "engine": "thread",
                                       "mode": "wall", "native": False, "max_python_events": 2_000_000, "record_offsets": False,
                                       "accumulate": True}
    assert data["reporters"]["json"] == {"indent": 2, "compress": False, "include_cross_rank": True,
                                         "output": str(workdir / "out" / "run.json")}
    text = dump_toml(data)
    back = write(workdir / "shown.toml", text)
    assert tomllib.loads(text)["options"]["advanced_configuration"] == {"gpu_max_activity_api_events": 4000000}
    assert load_config(back, environ={}).to_dict() == data


# -- running ----------------------------------------------------------------------------------------
def test_function_target_runs_repeats_times_with_steps_and_env(workdir):
    """A pkg.mod:function target is called `repeats` times with its args/kwargs, env set, one step per gap."""
    calls = workdir / "calls.txt"
    path = write(workdir / "omniprof.toml", f"""
        function = "work:record"
        args = [{json.dumps(str(calls))}]
        kwargs = {{ n = 7, tag = "fn" }}
        repeats = 3
        [env]
        CFG_TEST_VAR = "set"
        """)
    cfg = load_config(path, environ={})
    assert "CFG_TEST_VAR" not in os.environ
    out = execute(cfg)
    assert "CFG_TEST_VAR" not in os.environ  # restored after the run
    assert calls.read_text().splitlines() == ["fn:7:set"] * 3
    assert out.runs == 3 and len(out.results) == 1 and out.error is None
    steps = [s.args["step_num"] for s in out.results[0].part("cpu").spans if s.category == "step"]
    assert steps == [1, 2]


def test_schedule_in_config_drives_recording(workdir):
    """With wait=1 active=1 repeat=2 and no repeats, the target runs 4 times and 2 results come out."""
    calls = workdir / "calls.txt"
    path = write(workdir / "omniprof.toml", f"""
        function = "work:record"
        args = [{json.dumps(str(calls))}]
        schedule = {{ wait = 1, active = 1, repeat = 2 }}
        """)
    cfg = load_config(path, environ={})
    assert cfg.schedule == Schedule(wait=1, active=1, repeat=2) and cfg.repeat_count() == 4
    out = execute(cfg)
    assert out.runs == 4 and len(out.results) == 2


@pytest.mark.timing
def test_duration_runs_until_time_is_up(workdir):
    """duration_s keeps calling the target until the time has passed (at least once, more than once here)."""
    cfg = load_config(text='function = "work:hot"\nargs = [20000]\nduration_s = 0.2\n', environ={})
    out = execute(cfg)
    assert out.runs > 1 and len(out.results) == 1


def test_script_target_gets_argv_and_failure_keeps_partial_result(workdir):
    """A script runs with its argv; a script that raises leaves a partial result recording the error."""
    calls = workdir / "calls.txt"
    cfg = load_config(text=f'script = "work.py"\nargs = [{json.dumps(str(calls))}, "p", "q"]\n', environ={})
    out = execute(cfg)
    assert calls.read_text() == "script:p,q:1:-\n" and out.exit_code == 0
    write(workdir / "boom.py", "raise KeyError('boom')\n")
    out = execute(load_config(text='script = "boom.py"\n', environ={}))
    assert isinstance(out.error, KeyError)
    assert out.results[0].partial and out.results[0].errors[0].type == "KeyError"


def test_script_exit_code_is_kept(workdir):
    """sys.exit(3) in the target gives exit_code 3 and still a result."""
    write(workdir / "exit3.py", "import sys\nsys.exit(3)\n")
    out = execute(load_config(text='script = "exit3.py"\n', environ={}))
    assert out.exit_code == 3 and len(out.results) == 1


def test_documented_complete_file_is_valid(tmp_path, monkeypatch):
    """The complete example of docs/config.md is valid, apart from its script and the GPU/XLA backends missing here."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "config.md").read_text(encoding="utf-8")
    text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", "pass\n")
    problems = check_config(write(tmp_path / "omniprof.toml", text))
    from omniprof.core.registry import get_registry

    missing = {"xla", "cupti"} - set(get_registry().names("backend"))
    assert len(problems) == len(missing), problems
    for p in problems:
        assert any(f"unknown backend {m!r}" in p for m in missing), p


def test_bundled_example_config_is_valid_and_runs(tmp_path, monkeypatch):
    """examples/omniprof.toml checks clean, and its 'steps' profile calls hot_loop:main 6 times for 2 results."""
    example = Path(__file__).resolve().parents[3] / "examples" / "omniprof.toml"
    monkeypatch.chdir(tmp_path)
    assert check_config(example) == []
    cfg = load_config(example, "steps", environ={})
    assert cfg.target.kind == "function" and cfg.target.base_dir == str(example.parent)
    out = execute(cfg)
    assert out.runs == 6 and len(out.results) == 2 and out.error is None
    flat = {r.frame.name for res in out.results for r in calltree.flat_profile(res.parts[0])}
    assert "hot_function" in flat


# -- property: every injected problem is reported once, at its line ------------------------------------

SECTIONS = {
    "": ([("repeats = 0", "$.repeats"), ("repaets = 2", "$.repaets"), ("label = 5", "$.label"),
          ("verbose = \"yes\"", "$.verbose"), ("backend = [1]", "$.backend"),
          ("distributed = 1", "$.distributed")],
         ['function = "math:factorial"', "args = [5]", "outdir = \"o\""]),
    "options": ([("host_tracer_level = 9", "$.options.host_tracer_level"),
                 ("device_tracer_lvl = 1", "$.options.device_tracer_lvl"),
                 ("python_tracer_level = true", "$.options.python_tracer_level")],
                ["device_tracer_level = 0"]),
    "options.advanced_configuration": ([("tpu_trace_mode = \"X\"", "$.options.advanced_configuration.tpu_trace_mode"),
                                        ("gpu_pm_sample_interval_us = 0",
                                         "$.options.advanced_configuration.gpu_pm_sample_interval_us")],
                                       ["gpu_enable_nvtx_tracking = true"]),
    "backends.cpu": ([("interval_s = -1", "$.backends.cpu.interval_s"), ("engine = \"x\"", "$.backends.cpu.engine"),
                      ("max_sample = 3", "$.backends.cpu.max_sample")],
                     ["max_samples = 1000"]),
    "schedule": ([("wait = -1", "$.schedule.wait"), ("active = 0", "$.schedule.active")], ["warmup = 1"]),
    "reporters.table": ([("max_rows = 0", "$.reporters.table.max_rows"), ("colour = \"x\"", "$.reporters.table.colour")],
                        ["format = \"flat\""]),
}


@st.composite
def faulty_files(draw):
    lines: list[str] = []
    expected: set[tuple[int, str]] = set()
    for section, (faults, good) in SECTIONS.items():
        chosen = draw(st.lists(st.sampled_from(faults), unique=True, max_size=len(faults)))
        body = draw(st.permutations([*chosen, *[(g, None) for g in good]]))
        if section:
            lines.append(f"[{section}]")
        for text, path in body:
            if draw(st.booleans()):
                lines.append("# a comment = with an equals sign")
            if draw(st.booleans()):
                lines.append("")
            lines.append(text)
            if path is not None:
                expected.add((len(lines), path))
    return "\n".join(lines) + "\n", expected


@settings(max_examples=40, deadline=None)
@given(faulty_files())
def test_every_injected_problem_is_reported_at_its_line(case):
    """Whatever mix of faults a file has, each is reported once with its own line and key path, nothing else."""
    text, expected = case
    try:
        load_config(text=text, environ={})
        got: set[tuple[int, str]] = set()
    except ConfigError as e:
        got = set()
        for p in e.problems:
            where, path, _ = p.split(": ", 2)
            got.add((int(where.rpartition(":")[2]), path))
        assert len(got) == len(e.problems), e.problems
    assert got == expected, text


def test_distributed_key_reaches_the_profiler(workdir):
    """`distributed = true` (or OMNIPROF_DISTRIBUTED=1) makes the run's Profiler coordinate ranks:
    with no torch.distributed process group here, the run stops with the error that says so."""
    pytest.importorskip("torch")
    from omniprof.errors import DistributedError

    path = write(workdir / "omniprof.toml", 'function = "math:factorial"\nargs = [5]\ndistributed = true\n')
    cfg = load_config(path, environ={})
    assert cfg.distributed is True and cfg.to_dict()["distributed"] is True
    assert load_config(write(workdir / "omniprof.toml", 'function = "math:factorial"\n'),
                       environ={"OMNIPROF_DISTRIBUTED": "1"}).distributed is True
    with pytest.raises(DistributedError, match="init_process_group"):
        execute(cfg)


# -- structuring (cattrs): every key checked on its own, every problem at once ------------------------
def test_every_problem_of_one_options_table_is_reported(workdir):
    """Three bad keys of one [backends.cpu] table give three problems, each at its own line and key."""
    path = write(workdir / "omniprof.toml", """
        function = "work:hot"
        [backends.cpu]
        interval_s = -1
        max_samples = 0
        engin = "thread"
        """)
    f = str(path)
    problems = check_config(path)
    assert problems[0] == f"{f}:3: $.backends.cpu.interval_s: backend 'cpu': 'interval_s' must be > 0.0 (got -1)"
    assert problems[1] == (f"{f}:4: $.backends.cpu.max_samples: backend 'cpu': 'max_samples' must be between 1 and "
                           f"2147483647 (got 0)")
    assert problems[2].startswith(f"{f}:5: $.backends.cpu.engin: backend 'cpu': unknown option 'engin'; "
                                  f"did you mean 'engine'?")
    assert len(problems) == 3


def test_wrong_types_and_non_tables_are_named_in_house_style(workdir):
    """A value of the wrong type says what the key must be and what it got; a table given as a scalar too."""
    path = write(workdir / "omniprof.toml", """
        function = "work:hot"
        repeats = "x"
        options = 5
        label = 3
        verbose = "yes"
        no_plugin = "rusage"
        """)
    f = str(path)
    assert sorted(check_config(path)) == [
        f"{f}:2: $.repeats: 'repeats' must be an integer >= 1 (got 'x' of type str)",
        f"{f}:3: $.options: must be a table of profile options (got 5)",
        f"{f}:4: $.label: 'label' must be a string (got 3 of type int)",
        f"{f}:5: $.verbose: 'verbose' must be a bool (true or false) (got 'yes' of type str)",
        f"{f}:6: $.no_plugin: must be a list of plugin names (got 'rusage')",
    ]


def test_each_bad_advanced_key_is_reported_at_its_key(workdir):
    """Two bad advanced_configuration keys give two problems, an unknown one with the nearest key; an
    advanced key put directly under [options] says where it goes."""
    path = write(workdir / "omniprof.toml", """
        function = "work:hot"
        [options]
        gpu_max_activity_api_events = 5
        [options.advanced_configuration]
        gpu_max_activty_api_events = 5
        tpu_trace_mode = "NOPE"
        """)
    f = str(path)
    problems = sorted(check_config(path))
    assert len(problems) == 3, problems
    assert problems[0].startswith(f"{f}:3: $.options.gpu_max_activity_api_events: unknown profile option "
                                  f"'gpu_max_activity_api_events'") and problems[0].endswith(
        "(advanced keys go under [options.advanced_configuration])")
    assert problems[1].startswith(f"{f}:5: $.options.advanced_configuration.gpu_max_activty_api_events: unknown "
                                  f"advanced_configuration key 'gpu_max_activty_api_events'; did you mean "
                                  f"'gpu_max_activity_api_events'?")
    assert problems[2].startswith(f"{f}:6: $.options.advanced_configuration.tpu_trace_mode: ")
    assert "NOPE" in problems[2]


def test_a_check_across_keys_of_a_plugins_options_is_reported_at_its_table(workdir, registry_with):
    """Keys each valid but wrong together (the Options class's own __attrs_post_init__) give one problem at
    the table, after the keys' own problems of other tables."""
    reg = registry_with(("backend", "window", "tests.unit.core.plugins_for_tests:WindowBackend"))
    path = write(workdir / "omniprof.toml", """
        function = "work:hot"
        backend = "window, cpu"
        [backends.window]
        lo = 5
        hi = 5
        """)
    f = str(path)
    assert check_config(path, registry=reg) == [
        f"{f}:3: $.backends.window: backend 'window': 'lo' must be below 'hi' (got lo=5, hi=5)"]
    cfg = load_config(write(workdir / "ok.toml", 'function = "work:hot"\nbackend = "window, cpu"\n'
                                                  '[backends.window]\nlo = 1\n'), environ={}, registry=reg)
    assert cfg.backends == ("window", "cpu") and cfg.backend_options == {"window": {"lo": 1}}
