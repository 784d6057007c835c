"""Security: loopback-only servers, validated addresses, result files that never run code, and
output paths from config files that cannot leave the chosen directory."""

from __future__ import annotations

import ast
import pickle
import socket
import urllib.request
from pathlib import Path

import pytest

import omniprof
from omniprof.cli import main
from omniprof import config as cfgmod
from omniprof.core.registry import get_registry
from omniprof.core.results import BackendResult, RunMetadata
from omniprof.core.readers import read_any
from omniprof.viewers.serve import TraceFileServer, check_bind_address
from omniprof.errors import ConfigError, InvalidArgumentError, OmniprofWarning, TraceReadError

PKG = Path(omniprof.__file__).resolve().parent


def _other_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent for a UDP connect
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_trace_server_binds_loopback_by_default(tmp_path, tally):
    """The Perfetto trace server listens on 127.0.0.1 only: reachable there, not on the machine's
    other address, and warns nothing."""
    f = tmp_path / "t.json"
    f.write_text("{}")
    with TraceFileServer(f, port=0) as srv:
        assert srv._httpd.server_address[0] == "127.0.0.1"
        assert urllib.request.urlopen(srv.url, timeout=10).read() == b"{}"
        other = _other_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, srv.port), timeout=2).close()
    tally.check("security: server binds", "loopback")


def test_trace_server_other_address_warns(tmp_path, tally):
    """Naming another address is allowed but said out loud (OmniprofWarning naming it)."""
    f = tmp_path / "t.json"
    f.write_text("{}")
    with pytest.warns(OmniprofWarning, match=r"binds 0\.0\.0\.0, not 127\.0\.0\.1"):
        srv = TraceFileServer(f, host="0.0.0.0", port=0)
    with srv:
        assert srv._httpd.server_address[0] == "0.0.0.0"
    tally.check("security: server binds", "explicit other address warned")


@pytest.mark.parametrize("host", ["", "bad host", "host/path", "a..b", "-x", 7, None, "x" * 300, "127.0.0.1:80"])
def test_bind_address_form_validated(host, tally):
    """A malformed address is refused with InvalidArgumentError before anything binds."""
    with pytest.raises(InvalidArgumentError, match="address"):
        check_bind_address(host)
    tally.check("security: address form", "rejected")


def test_trace_server_serves_only_its_file(tmp_path):
    """Only the one trace file is served: other names and traversal attempts get 404."""
    (tmp_path / "secret.txt").write_text("secret")
    sub = tmp_path / "d"
    sub.mkdir()
    f = sub / "t.json"
    f.write_text("{}")
    with TraceFileServer(f, port=0) as srv:
        for name in ("secret.txt", "../secret.txt", "%2e%2e/secret.txt", "d/t.json"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/{name}", timeout=10)
            assert e.value.code == 404


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch omniprof_pwned",))


def test_loading_never_runs_code(tmp_path, monkeypatch, tally):
    """A pickle (raw or gzipped) handed to the readers is refused as a format error; the payload
    never runs."""
    import gzip

    monkeypatch.chdir(tmp_path)
    payload = pickle.dumps(_Boom())
    for name, data in {"run.json": payload, "run.json.gz": gzip.compress(payload), "x.pt.trace.json": payload,
                       "r.pkl": payload}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TraceReadError):
            read_any(tmp_path / name)
        with pytest.raises(TraceReadError):
            omniprof.load(tmp_path / name)
        tally.check("security: pickle payload", "refused")
    assert not (tmp_path / "omniprof_pwned").exists()


def test_package_has_no_code_executing_deserialisers():
    """No module of omniprof imports pickle/marshal/shelve/dill or calls eval/exec or yaml.load:
    results and traces are data only."""
    bad = []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                banned = ("pickle", "marshal", "shelve", "dill", "cloudpickle")
                bad += [f"{path.name}: import {n}" for n in names if n.split(".")[0] in banned]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
                bad.append(f"{path.name}:{node.lineno}: {node.func.id}()")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "yaml":
                bad.append(f"{path.name}:{node.lineno}: yaml.load()")
    assert not bad, bad


@pytest.mark.parametrize("key, value", [("logdir", "../outside"), ("outdir", "a/../../outside"),
                                        ("reporters.json.output", "../../etc/x.json"),
                                        ("profiles.p.logdir", "../p")])
def test_config_output_paths_cannot_escape(tmp_path, key, value, tally):
    """A relative output path in a config file that climbs out of the file's directory is a
    ConfigError naming file, line and key; nothing is written."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "t.py").write_text("x = 1\n")
    head, _, last = key.rpartition(".")
    text = 'script = "t.py"\n' + (f"[{head}]\n" if head else "") + f"{last} = {value!r}\n".replace("'", '"')
    (proj / "omniprof.toml").write_text(text)
    with pytest.raises(ConfigError, match="leads outside the config file's directory") as e:
        cfgmod.load_config(proj / "omniprof.toml", profile="p" if head.startswith("profiles") else None, environ={})
    assert "omniprof.toml:" in str(e.value) and last in str(e.value)
    assert main(["config", "check", str(proj / "omniprof.toml")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]
    tally.check("security: config output path", "escape rejected")


def test_config_output_paths_inside_or_absolute_accepted(tmp_path):
    """Relative paths that stay inside (even through '..') and absolute paths are accepted."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "t.py").write_text("x = 1\n")
    (proj / "omniprof.toml").write_text(f'script = "t.py"\nlogdir = "a/../logs"\noutdir = "{tmp_path / "abs"}"\n'
                                        '[reporters.json]\noutput = "r/run.json"\n')
    cfg = cfgmod.load_config(proj / "omniprof.toml", environ={})
    assert Path(cfg.logdir).resolve() == proj / "logs"
    assert cfg.outdir == str(tmp_path / "abs")
    assert cfg.reporters[0].output == str(proj / "r" / "run.json")


def test_cli_output_names_from_results_stay_in_outdir(tmp_path, capsys):
    """Reports of a result whose metadata carries path-like text (label, argv, backend names with
    '../') are written inside -o DIR only."""
    r = omniprof.ProfileResult(metadata=RunMetadata(label="../../escape", argv=("../../x",),
                                                                          backends=("../evil",)),
                               parts=(BackendResult(backend="../evil"),))
    src = tmp_path / "in" / "r.json"
    r.save(src)
    out = tmp_path / "deep" / "out"
    names = [i.name for i in get_registry().infos(probe=False) if i.kind == "reporter"
             and i.status != "broken"]
    assert main(["report", str(src), "-r", ",".join(names), "-o", str(out)]) == 0
    written = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert all(out in p.parents or p == src for p in written), written


def test_xprof_viewer_binds_loopback_by_default(tmp_path, tally):
    """`omniprof view`'s XProf server listens on 127.0.0.1 unless told otherwise, answers there,
    refuses malformed addresses and warns when another address is named."""
    pytest.importorskip("xprof")
    from omniprof.viewers.xprof import XProfServer

    with XProfServer(tmp_path, port=0) as srv:
        assert srv._server.bind_addr[0] == "127.0.0.1"
        assert urllib.request.urlopen(srv.url, timeout=30).status == 200
        other = _other_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, srv.port), timeout=2).close()
    with pytest.raises(InvalidArgumentError, match="address"):
        XProfServer(tmp_path, host="not an address", port=0)
    with pytest.warns(OmniprofWarning, match="binds 0.0.0.0"):
        XProfServer(tmp_path, host="0.0.0.0", port=0)
    tally.check("security: server binds", "XProf viewer loopback")


def _view(trace, *extra: str):
    import subprocess as sp
    import sys as _sys

    return sp.Popen([_sys.executable, "-m", "omniprof", "view", "--perfetto", str(trace), "--port", "0", *extra],
                    stdout=sp.PIPE, stderr=sp.PIPE, text=True)


def test_view_perfetto_host_check_and_quiet_disconnects(tmp_path, tally):
    """``omniprof view --perfetto``: a request whose Host is not a loopback name (DNS rebinding) gets
    421 and no data; clients that hang up mid-transfer print nothing; a proper fetch still works."""
    import http.client
    import socket
    import urllib.parse

    from omniprof.testing.fakes import make_result

    big = omniprof.report(make_result(), "chrome", tmp_path / "trace.json", options={"compress": False})
    big.write_bytes(big.read_bytes() + b" " * (8 << 20))  # large enough that a hang-up cuts the transfer
    proc = _view(big, "--timeout-s", "60")
    try:
        line = proc.stdout.readline()
        url = urllib.parse.urlparse(line.split("url=", 1)[1].strip())
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("GET", url.path, headers={"Host": f"evil.example:{url.port}"})
        resp = conn.getresponse()
        assert resp.status == 421 and resp.read() == b""
        conn.close()
        tally.check("view: foreign Host header", "refused")
        for _ in range(5):  # ask for the file, read a little, hang up
            s = socket.create_connection((url.hostname, url.port), timeout=30)
            s.sendall(f"GET {url.path} HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\n\r\n".encode())
            s.recv(1024)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
            s.close()
        tally.check("view: client disconnects", "quiet")
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("GET", url.path, headers={"Host": f"localhost:{url.port}"})
        assert conn.getresponse().read() == big.read_bytes()
        conn.close()
    finally:
        proc.send_signal(2)
        out, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "Exception" not in err and "Error" not in err, err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_view_timeout_must_be_a_finite_positive_number(tmp_path, capsys, value):
    """``--timeout-s nan`` (or inf, 0, -1): a usage error, before anything is served."""
    import subprocess as sp

    from omniprof.testing.fakes import make_result

    trace = omniprof.report(make_result(), "perfetto", tmp_path)
    proc = _view(trace, "--timeout-s", value)
    try:
        out, err = proc.communicate(timeout=30)  # before: nan served forever
    except sp.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"--timeout-s {value} served on")
    assert proc.returncode == 2 and "--timeout-s must be a number of seconds > 0" in err
