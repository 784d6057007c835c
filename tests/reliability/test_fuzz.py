"""Bad input, fuzzed: options, config files, CLI arguments and file readers.

Every property states the same promise: the outcome is a valid object or one of omniprof's
documented errors with a clear one-line-ish message, never a traceback from deep inside, a hang,
or a value accepted that the documented rules forbid.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import string
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import omniprof
from omniprof.cli import main
from omniprof import config as cfgmod
from omniprof.core.options import ADVANCED_KEYS, ProfileOptions
from omniprof.core.readers import read_any
from omniprof.core.registry import get_registry, options_for
from omniprof.core.results import ProfileResult
from omniprof.errors import ConfigError, InvalidArgumentError, OmniprofError, PluginError, TraceReadError
from omniprof.testing.fakes import make_result
from tests.reliability.conftest import FUZZ
from tests.tools import find_shared_data

# -- value strategies --------------------------------------------------------------------------------
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-3, max_value=5),
    st.integers(),  # huge ones too
    st.sampled_from([2**31 - 1, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(alphabet=st.characters(min_codepoint=0x80), max_size=8),  # unicode only
    st.binary(max_size=8),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=3), max_leaves=8)
PROFILE_FIELDS = ["host_tracer_level", "device_tracer_level", "python_tracer_level", "advanced_configuration"]


def near(words: list[str]) -> st.SearchStrategy[str]:
    """Valid names, names one typo away, and random text."""
    typo = st.tuples(st.sampled_from(words), st.integers(0, 30)).map(lambda t: t[0][:t[1]] + t[0][t[1] + 1:])
    return st.one_of(st.sampled_from(words), st.sampled_from(words), st.sampled_from(words), typo, st.text(max_size=12))


def _clear(msg: str) -> bool:
    """A clear message: non-empty, no Python traceback, no repr of an internal object."""
    return bool(msg.strip()) and "Traceback" not in msg and " object at 0x" not in msg


def _ok_level(value: object, allowed: range) -> bool:
    return type(value) is int and value in allowed


def _ok_advanced(key: str, value: object) -> bool:
    k = ADVANCED_KEYS.get(key) if isinstance(key, str) else None
    if k is None:
        return False
    if k.kind == "enum":
        return isinstance(value, str) and value in k.allowed
    if k.kind == "int":
        return type(value) is int and k.lo <= value <= k.hi
    if k.kind == "bool":
        return type(value) is bool
    return isinstance(value, str)  # metrics: a string, names checked by the validator


# -- ProfileOptions and advanced_configuration -------------------------------------------------------
@FUZZ
@given(st.dictionaries(near(PROFILE_FIELDS), st.sampled_from([0, 1, 2, 3]) | values, max_size=4))
def test_profile_options_fuzzed(tally, data):
    """ProfileOptions.from_dict accepts exactly the documented values; anything else raises
    InvalidArgumentError naming the key."""
    try:
        opts = ProfileOptions.from_dict(data)
    except InvalidArgumentError as e:
        tally.case("ProfileOptions.from_dict", "rejected")
        assert _clear(str(e))
        assert any(repr(k) in str(e) or k in str(e) for k in data if isinstance(k, str)), str(e)
        return
    tally.case("ProfileOptions.from_dict", "accepted")
    assert set(data) <= set(PROFILE_FIELDS)
    assert _ok_level(opts.host_tracer_level, range(4))
    assert _ok_level(opts.device_tracer_level, range(2))
    assert _ok_level(opts.python_tracer_level, range(2))
    assert ProfileOptions.from_dict(opts.to_dict()) == opts


def _valid_advanced(key: str) -> st.SearchStrategy[object]:
    k = ADVANCED_KEYS[key]
    if k.kind == "enum":
        return st.sampled_from(k.allowed)
    if k.kind == "int":
        return st.integers(k.lo, k.hi) | st.sampled_from([k.lo, k.hi])
    if k.kind == "bool":
        return st.booleans()
    return st.sampled_from(["", "sm__cycles_active.avg", "a__b.c,d__e", "x,,y", "bad name"])


@st.composite
def advanced_mappings(draw: st.DrawFn) -> dict[object, object]:
    out: dict[object, object] = {}
    for key in draw(st.lists(near(list(ADVANCED_KEYS)), max_size=4)):
        if key in ADVANCED_KEYS and draw(st.booleans()):
            out[key] = draw(_valid_advanced(key))
        else:
            out[key] = draw(values | st.sampled_from(["TRACE_COMPUTE", 64, 4096, 4097, True]))
    return out


@FUZZ
@given(advanced_mappings())
def test_advanced_configuration_fuzzed(tally, adv):
    """advanced_configuration accepts a key only with a value of its documented type and range; an
    unknown key is named with the valid ones."""
    try:
        opts = ProfileOptions(advanced_configuration=adv)
    except InvalidArgumentError as e:
        tally.case("advanced_configuration", "rejected")
        assert _clear(str(e)) and "advanced_configuration" in str(e)
        assert not all(_ok_advanced(k, v) for k, v in adv.items()) or any(
            ADVANCED_KEYS[k].kind == "metrics" for k in adv), (adv, str(e))
        return
    tally.case("advanced_configuration", "accepted")
    assert all(_ok_advanced(k, v) for k, v in adv.items()), adv
    for k, v in adv.items():
        assert opts.advanced(k) == v


def _backend_classes() -> list[tuple[str, type]]:
    reg = get_registry()
    out = []
    for info in reg.infos(probe=False):
        if info.kind == "backend" and info.status != "broken":
            try:
                out.append((info.name, reg.backend(info.name)))
            except OmniprofError:
                continue
    return out


def _field_names(cls: type) -> list[str]:
    import attrs

    return [a.name for a in attrs.fields(cls.Options)] or ["x"]


@FUZZ
@given(st.data())
def test_backend_options_fuzzed(tally, data):
    """Every installed backend's Options: a random mapping builds valid options or raises
    InvalidArgumentError naming the backend."""
    import attrs

    name, cls = data.draw(st.sampled_from(_backend_classes()), label="backend")
    defaults = {a.name: a.default for a in attrs.fields(cls.Options)
                if a.default is not attrs.NOTHING and not isinstance(a.default, attrs.Factory)}
    given_opts = {}
    for key in data.draw(st.lists(near(_field_names(cls)), max_size=4), label="keys"):
        if key in defaults and data.draw(st.booleans()):  # a valid value, to reach the accepted side too
            given_opts[key] = defaults[key]
        else:
            given_opts[key] = data.draw(values | st.integers(0, 10) | st.floats(0, 2), label=key)
    try:
        opts = options_for("backend", name, cls, given_opts)
    except (InvalidArgumentError, PluginError) as e:
        tally.case(f"backend options ({name})", "rejected")
        assert _clear(str(e)) and name in str(e), str(e)
        return
    tally.case(f"backend options ({name})", "accepted")
    assert isinstance(opts, cls.Options)
    for k, v in given_opts.items():
        got = getattr(opts, k)
        assert got == v or (isinstance(v, float) and math.isnan(v) and math.isnan(got)), (k, v, got)


# -- config files -------------------------------------------------------------------------------------
toml_scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=15), st.sampled_from(["cpu", "table", "json", "nosuch", "", "../../x", "é☃"]),
)
toml_values = st.recursive(toml_scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=5)
known_keys = list(cfgmod.TOP_KEYS)


def _toml_key(k: str) -> str:
    return k if k and all(c in string.ascii_letters + string.digits + "_-" for c in k) else json.dumps(k)


def _toml_val(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml_val(x) for x in v) + "]"


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    lines = []
    for key, val in draw(st.dictionaries(near(known_keys), toml_values, max_size=5)).items():
        lines.append(f"{_toml_key(key)} = {_toml_val(val)}")
    for table in draw(st.lists(st.sampled_from(["options", "backends.cpu", "backends.nosuch", "reporters.json",
                                                "reporters.table", "schedule", "profiles.fast", "env", "weird"]),
                               max_size=3, unique=True)):
        lines.append(f"[{table}]")
        keys = {"options": PROFILE_FIELDS, "backends.cpu": ["interval_s", "max_samples", "engine"],
                "schedule": ["wait", "warmup", "active", "repeat", "skip_first"]}.get(table, ["output", "x", "logdir"])
        for key, val in draw(st.dictionaries(near(keys), toml_values, max_size=3)).items():
            lines.append(f"{_toml_key(key)} = {_toml_val(val)}")
    text = "\n".join(lines) + "\n"
    cut = draw(st.sampled_from([None, None, None, "truncate", "garbage"]))
    if cut == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    elif cut == "garbage":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.text(max_size=5)) + text[i:]
    return text


@FUZZ
@given(config_texts())
def test_config_files_fuzzed(tally, tmp_path_factory, text):
    """A config file with wrong types, unknown keys, huge values, unicode, truncation or garbage
    loads into a RunConfig or raises one ConfigError listing problems with file and key."""
    d = tmp_path_factory.mktemp("cfg")
    path = d / "omniprof.toml"
    path.write_text(text, encoding="utf-8")
    try:
        cfg = cfgmod.load_config(path, environ={})
    except ConfigError as e:
        tally.case("config file", "rejected")
        assert e.problems and all(_clear(p) for p in e.problems)
        assert all(str(path) in p or "omniprof.toml" in p or "plugins file" in p for p in e.problems), e.problems
        assert cfgmod.check_config(path), "check_config must find the problems load_config found"
        return
    tally.case("config file", "accepted")
    assert isinstance(cfg.options, ProfileOptions)
    known = {i.name for i in get_registry().infos(probe=False)}
    assert set(cfg.backends) <= known and {r.name for r in cfg.reporters} <= known


@FUZZ
@given(st.binary(max_size=200))
def test_config_bytes_fuzzed(tally, tmp_path_factory, raw):
    """A config file of arbitrary bytes (non-UTF-8, NULs, empty) is a ConfigError or a config."""
    path = tmp_path_factory.mktemp("cfgb") / "omniprof.toml"
    path.write_bytes(raw)
    try:
        cfgmod.load_config(path, environ={})
    except ConfigError as e:
        tally.case("config bytes", "rejected")
        assert all(_clear(p) for p in e.problems)
        return
    tally.case("config bytes", "accepted")


# -- CLI arguments ------------------------------------------------------------------------------------
cli_tokens = st.one_of(
    st.sampled_from(["run", "report", "plugins", "config", "check", "show", "diff", "-b", "-r", "-O", "-R", "-o",
                     "--logdir", "--config", "--profile", "--no-plugin", "--plugins", "--no-probe", "-m", "--",
                     "--format", "json", "--threshold-pct", "nan", "-1", "cpu", "table", "nosuch",
                     "host_tracer_level=9", "cpu.interval_s=-1", "table.x=1", "missing.py", "missing.json",
                     "omniprof_fuzz_nosuch_module", "--version", "-v", "--label", "é"]),
    st.text(alphabet=st.characters(blacklist_characters=":\x00", blacklist_categories=("Cs",)), max_size=10),
)


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """Half structured (a real subcommand, real files, option pairs with fuzzed values), half noise."""
    if draw(st.booleans()):
        return draw(st.lists(cli_tokens, max_size=7))
    cmd = draw(st.sampled_from([["run", "ok.py"], ["run", "fail.py"], ["report", "ok.json"], ["report", "bad.json"],
                                ["diff", "ok.json", "ok.json"], ["config", "check", "omniprof.toml"],
                                ["config", "show", "omniprof.toml"], ["plugins", "--no-probe"]]))
    flags = {"run": ["-b", "-O", "-r", "-R", "-o", "--logdir", "--label"], "report": ["-r", "-R", "-o"],
             "diff": ["--threshold-pct", "--min-share-pct", "--max-rows", "--format", "--vs", "--alpha", "--repeats"],
             "config": ["--profile", "--format"], "plugins": ["--no-plugin"]}[cmd[0]]
    extra: list[str] = []
    for flag in draw(st.lists(st.sampled_from(flags), max_size=3)):
        extra += [flag, draw(cli_tokens | st.sampled_from(["table", "json", "out", "cpu.interval_s=0.01", "2",
                                                           "json.indent=2", "-5", "1e309", "text"]))]
    if cmd[0] == "run":
        return ["run", *extra, *cmd[1:], *draw(st.lists(cli_tokens, max_size=2))]
    return [*cmd, *extra]


FILES = {"ok.py": "x = sum(range(1000))\n", "fail.py": "raise ValueError('target failed')\n",
         "bad.json": '{"schema_version": 1, "parts": [',
         "omniprof.toml": 'backend = "cpu"\nrepeats = 2\n[options]\nhost_tracer_level = 7\n'}


@FUZZ
@given(command_lines())
def test_cli_arguments_fuzzed(tally, tmp_path_factory, capsys, monkeypatch, argv):
    """Any command line exits 0, 1 or 2 with a one-line 'omniprof: error:' or usage message (or the
    target's own traceback), never an uncaught exception from omniprof."""
    d = tmp_path_factory.mktemp("cli")
    for name, text in FILES.items():
        (d / name).write_text(text)
    make_result().save(d / "ok.json")
    monkeypatch.chdir(d)
    monkeypatch.delenv("OMNIPROF_CONFIG", raising=False)
    rc = main(argv)
    out, err = capsys.readouterr()
    tally.case("CLI argv", f"exit {rc}")
    assert rc in (0, 1, 2), (argv, rc, err)
    if rc:
        if "Traceback" in err:  # only the target's own, as python prints it
            assert "target failed" in err and "omniprof/" not in err, (argv, err)
        else:
            assert "omniprof" in err or "usage" in err or (rc == 2 and "usage" in out), (argv, err)


# -- file readers -------------------------------------------------------------------------------------
def _valid_result_bytes() -> bytes:
    return make_result().to_json().encode()


def _mutate_json(data: object, path: list, new: object) -> object:
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(data, dict) and data:
        k = list(data)[key % len(data)]
        return {**data, k: _mutate_json(data[k], rest, new)}
    if isinstance(data, list) and data:
        i = key % len(data)
        return [*data[:i], _mutate_json(data[i], rest, new), *data[i + 1:]]
    return new


@st.composite
def damaged_files(draw: st.DrawFn) -> tuple[str, bytes]:
    raw = _valid_result_bytes()
    how = draw(st.sampled_from(["truncate", "flip", "value", "drop", "empty", "random", "gzip-truncate", "deep",
                                "wrong-format", "huge"]))
    if how == "truncate":
        return how, raw[:draw(st.integers(0, len(raw) - 1))]
    if how == "flip":
        i = draw(st.integers(0, len(raw) - 1))
        return how, raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    if how == "value":
        path = draw(st.lists(st.integers(0, 50), min_size=1, max_size=6))
        new = draw(values | st.sampled_from([-1, -(10**20), 10**40, "", [], {}]))
        new = json.loads(json.dumps(new, default=repr)) if not isinstance(new, bytes) else new.hex()
        return how, json.dumps(_mutate_json(json.loads(raw), path, new), allow_nan=True).encode()
    if how == "drop":
        data = json.loads(raw)
        part = data["parts"][draw(st.integers(0, len(data["parts"]) - 1))]
        for k in draw(st.lists(st.sampled_from(sorted(part)), max_size=3)):
            part.pop(k, None)
        key = draw(st.sampled_from(["frames", "stacks", "tracks", "threads"]))
        if isinstance(part.get(key), list) and part[key]:
            part[key] = part[key][:-1]  # dangling references
        return how, json.dumps(data).encode()
    if how == "empty":
        return how, b""
    if how == "random":
        return how, draw(st.binary(max_size=64))
    if how == "gzip-truncate":
        z = gzip.compress(raw)
        return how, z[:draw(st.integers(2, len(z) - 1))]
    if how == "deep":
        depth = draw(st.sampled_from([50, 500, 5000, 100_000]))
        data = json.loads(raw)
        inner = "[" * depth + "]" * depth
        return how, json.dumps(data)[:-1].encode() + b', "x": ' + inner.encode() + b"}" if draw(st.booleans()) else \
            raw.replace(b'"args": {}', b'"args": {"k": ' + inner.encode() + b"}", 1)
    if how == "wrong-format":
        return how, draw(st.sampled_from([b'{"traceEvents": 5}', b"[1, 2, 3]", b'{"schema_version": 99}',
                                          b"\x89PNG\r\n", b'{"parts": "x", "schema_version": 1}', b"null", b"  ",
                                          b'{"schema_version": 1, "parts": [{"backend": 7}]}']))
    return how, b'{"schema_version": 1, "metadata": {"label": "' + b"x" * 5_000_000 + b'"}, "parts": []}'


def _check_loaded(result: ProfileResult) -> None:
    """A result that loads is internally consistent, so reporters can render it."""
    assert ProfileResult.from_dict(result.to_dict()) == result
    for part in result.parts:
        for s in part.samples:
            assert 0 <= s.stack_id < len(part.stacks)
        for stack in part.stacks:
            assert all(0 <= i < len(part.frames) for i in stack)
        for a in part.allocations:
            assert 0 <= a.stack_id < len(part.stacks)
    for name in ("table", "json", "collapsed", "speedscope", "pprof"):
        import io
        import tempfile

        from omniprof.core import reporting  # not imported by `import omniprof` (names load on first use)

        rep = reporting.make_reporter(name)
        if rep.output == "stream":
            omniprof.report(result, name, io.StringIO())
        else:
            with tempfile.TemporaryDirectory() as d:
                omniprof.report(result, name, Path(d))


@FUZZ
@given(damaged_files(), st.sampled_from(["run.json", "run.json.gz", "trace.pt.trace.json", "noext"]))
def test_result_reader_fuzzed(tally, tmp_path_factory, damaged, name):
    """A truncated, corrupted, empty, wrongly typed, deeply nested, huge or wrong-format file read
    with read_any gives a consistent result every reporter renders, or a TraceReadError naming the file."""
    how, raw = damaged
    path = tmp_path_factory.mktemp("rd") / name
    path.write_bytes(raw)
    try:
        with warnings.catch_warnings():
            # what a reader skips (a JSON list read as a Kineto trace of malformed events) is warned
            # about and counted in the result's losses; that is checked below, not turned into errors
            warnings.simplefilter("ignore", omniprof.errors.DataLossWarning)
            result = read_any(path)
    except TraceReadError as e:
        tally.case(f"reader: {how}", "TraceReadError")
        assert _clear(str(e)) and path.name in str(e), str(e)[:300]
        assert len(str(e)) < 2000
        return
    tally.case(f"reader: {how}", "read")
    _check_loaded(result)


def test_reader_unreadable_paths(tmp_path, tally):
    """A missing file, a directory without traces, and an unreadable file give TraceReadError.
    The unreadable file is read in a child without root's power over permissions (as root the
    case read the file and was left out, so it never ran in CI or here)."""
    import subprocess
    import sys

    from tests.tools import ROOT, without_root_powers

    cases = {"missing": tmp_path / "nope.json", "dir": tmp_path}
    for what, p in cases.items():
        with pytest.raises(TraceReadError):
            read_any(p)
        tally.check("reader: unreadable paths", what)
    locked = tmp_path / "locked.json"
    locked.write_bytes(_valid_result_bytes())
    locked.chmod(0)
    code = ("import sys\nfrom omniprof.core.readers import read_any\nfrom omniprof.errors import TraceReadError\n"
            "try:\n    read_any(sys.argv[1])\nexcept TraceReadError as e:\n    print('TraceReadError |', e)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(without_root_powers([sys.executable, "-c", code, str(locked)]), capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("TraceReadError |"), (p.stdout, p.stderr)
    assert "ermission denied" in p.stdout and p.stdout.count("\n") == 1, p.stdout
    tally.check("reader: unreadable paths", "unreadable")


# -- xplane reader and remote capture requests --------------------------------------------------------
@pytest.fixture(scope="module")
def valid_xplane(tmp_path_factory):
    pytest.importorskip("jax")
    from tests.unit.backends.xla_helpers import write_gpu_xplane

    return write_gpu_xplane(tmp_path_factory.mktemp("xp") / "host.xplane.pb").read_bytes()


@FUZZ
@given(data=st.data())
def test_xplane_reader_fuzzed(tally, tmp_path_factory, valid_xplane, data):
    """A truncated, bit-flipped, empty or random .xplane.pb reads into a result every reporter
    renders, or is a TraceReadError naming the file."""
    raw = valid_xplane
    how = data.draw(st.sampled_from(["truncate", "flip", "random", "empty", "append"]))
    if how == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:]
    elif how == "random":
        raw = data.draw(st.binary(max_size=200))
    elif how == "empty":
        raw = b""
    else:
        raw = raw + data.draw(st.binary(min_size=1, max_size=50))
    path = tmp_path_factory.mktemp("xpf") / "host.xplane.pb"
    path.write_bytes(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # losses found in damaged files are warned about; counted below
        try:
            result = read_any(path)
        except TraceReadError as e:
            tally.case(f"xplane reader: {how}", "TraceReadError")
            assert _clear(str(e)) and path.name in str(e)
            return
    tally.case(f"xplane reader: {how}", "read")
    _check_loaded(result)


@FUZZ
@given(st.one_of(st.text(max_size=40), st.lists(st.text(max_size=25), max_size=4),
                 st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "[::1]", "localhost", "host-1", "",
                                                                     "a b", "[::1", "1.2.3.4"]),
                           st.integers(-5, 70000))),
       st.one_of(st.integers(-10, 4_000_000), st.sampled_from([0, 1, 3_600_000, 3_600_001, True, 1.5, "100", None])))
def test_remote_capture_request_validated(tally, addresses, duration_ms):
    """omniprof collect's addresses and duration are validated before anything is contacted: a
    good request passes with HOST:PORT items and 1 <= duration <= 1 h, anything else is an
    InvalidArgumentError saying what is expected."""
    from omniprof.backends.xla.remote import collect, parse_addresses

    try:
        addrs = parse_addresses(addresses)
    except InvalidArgumentError as e:
        tally.case("collect request", "bad address")
        assert _clear(str(e)) and ("HOST:PORT" in str(e) or "port" in str(e) or "twice" in str(e))
        return
    for a in addrs:
        host, _, port = a.rpartition(":")
        assert host and 1 <= int(port) <= 65535 and " " not in host, a
    good_duration = type(duration_ms) is int and 1 <= duration_ms <= 3_600_000
    if good_duration:
        tally.case("collect request", "valid")
        return
    with pytest.raises(InvalidArgumentError, match="duration_ms"):
        collect(addrs, duration_ms)
    tally.case("collect request", "bad duration")


# -- Kineto reader (torch) ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kineto_trace(tmp_path_factory):
    """The shared folder's real GPU trace when it sits beside the repository; else (a fresh clone
    anywhere else) a real Kineto trace written here by torch's own profiler on the CPU, so the
    test runs, not skips, on every checkout."""
    path = find_shared_data("kineto", "triton_cuda_trace.json.gz")
    if path is not None:
        return json.loads(gzip.decompress(path.read_bytes()))
    import torch

    out = tmp_path_factory.mktemp("kineto") / "cpu.pt.trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        x = torch.randn(64, 64)
        for _ in range(5):
            x = torch.relu(x @ x.T).softmax(dim=-1)
    prof.export_chrome_trace(str(out))
    return json.loads(out.read_text(encoding="utf-8"))


@FUZZ
@given(data=st.data())
def test_kineto_reader_fuzzed(tally, tmp_path_factory, kineto_trace, data):
    """A real Kineto trace truncated, with events' values replaced, events dropped, or bytes
    flipped, reads into a consistent result every reporter renders, or is a TraceReadError naming
    the file."""
    how = data.draw(st.sampled_from(["truncate", "flip", "value", "drop-events", "empty-events", "not-a-list"]))
    trace = json.loads(json.dumps(kineto_trace))
    events = trace.get("traceEvents", [])
    if how == "value" and events:
        i = data.draw(st.integers(0, len(events) - 1))
        ev = events[i]
        key = data.draw(st.sampled_from(sorted(ev) + ["ts", "dur", "args", "ph", "pid", "tid", "name"]))
        new = data.draw(values | st.sampled_from([-1, -(10**20), 10**30, "", [], {}, None, "nan"]))
        ev[key] = json.loads(json.dumps(new, default=repr)) if not isinstance(new, bytes) else new.hex()
    elif how == "drop-events" and events:
        keep = data.draw(st.lists(st.booleans(), min_size=len(events), max_size=len(events)))
        trace["traceEvents"] = [e for e, k in zip(events, keep) if k]
    elif how == "empty-events":
        trace["traceEvents"] = []
    elif how == "not-a-list":
        trace["traceEvents"] = data.draw(st.sampled_from([{}, 5, "x", None]))
    raw = json.dumps(trace, allow_nan=True).encode()
    if how == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:]
    path = tmp_path_factory.mktemp("kin") / "worker.pt.trace.json"
    path.write_bytes(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = read_any(path)
        except TraceReadError as e:
            tally.case(f"kineto reader: {how}", "TraceReadError")
            assert _clear(str(e)) and path.name in str(e), str(e)[:300]
            return
    tally.case(f"kineto reader: {how}", "read")
    _check_loaded(result)


def test_xplane_stat_without_metadata_is_counted(tmp_path, tally):
    """An event stat whose metadata the xplane lacks (found by the fuzzer: it crashed the reader)
    is left out and counted as an undecodable stat, and the event is still read."""
    pytest.importorskip("jax")
    from omniprof.formats.xprof_runtime import import_profiler_bindings

    _, pd = import_profiler_bindings()
    text = '''
    planes { id: 1 name: "/host:CPU"
      lines { id: 1 name: "python" timestamp_ns: 1000
        events { metadata_id: 1 offset_ps: 1000 duration_ps: 5000 stats { metadata_id: 7 uint64_value: 3 } } }
      event_metadata { key: 1 value { id: 1 name: "work" } } }
    '''
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(pd.ProfileData.text_proto_to_serialized_xspace(text))
    with pytest.warns(omniprof.errors.DataLossWarning, match="undecodable"):
        result = read_any(path)
    assert [s.name for s in result.parts[0].spans] == ["work"]
    assert [(x.kind, x.count) for x in result.losses] == [("undecodable_stats", 1)]
    tally.check("xplane reader: stat without metadata", "counted")


def test_kineto_event_with_non_object_args_is_counted(tmp_path, tally):
    """A Kineto event whose "args" is not an object (found by the fuzzer: it crashed the reader)
    is skipped and counted as a malformed event; the rest of the trace is read."""
    trace = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": 5},
                             {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]}
    path = tmp_path / "w.pt.trace.json"
    path.write_text(json.dumps(trace))
    with pytest.warns(omniprof.errors.DataLossWarning, match="malformed"):
        result = read_any(path)
    assert [s.name for p in result.parts for s in p.spans] == ["aten::mm"]
    assert [(x.kind, x.count) for x in result.losses] == [("malformed_events", 1)]
    tally.check("kineto reader: non-object args", "counted")
