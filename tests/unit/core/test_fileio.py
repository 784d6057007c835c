"""Atomic output: no torn files, no silent overwrite of another run's file, one-line errors on
full disks, read-only file systems and missing permissions (tested on real file systems)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import omniprof
from omniprof import cli
from omniprof.core.fileio import AtomicFile, OutputError, atomic_open, atomic_write_bytes, new_dir, output_error
from omniprof.testing.fakes import make_result

ROOT = Path(__file__).resolve().parents[3]


def _no_temp_files(d: Path) -> bool:
    return not [p for p in d.iterdir() if p.name.endswith(".tmp")]


def test_output_error_lives_in_the_one_error_hierarchy():
    """OutputError is defined in omniprof.errors (an OmniprofError and an OSError); the old path
    omniprof.core.fileio and the top level name the same class."""
    import omniprof.errors

    assert OutputError is omniprof.errors.OutputError is omniprof.OutputError
    assert OutputError.__module__ == "omniprof.errors"
    assert issubclass(OutputError, omniprof.errors.OmniprofError) and issubclass(OutputError, OSError)
    assert "OutputError" in omniprof.errors.__all__


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    """An exception mid-write keeps the previous file intact and removes the temporary file."""
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target, "w") as fh:
        fh.write("partial")
        raise RuntimeError("boom")
    assert target.read_text() == "old" and _no_temp_files(tmp_path)


def test_overwrite_modes(tmp_path):
    """overwrite=True replaces; False keeps the file and uses name-1; 'error' refuses."""
    target = tmp_path / "trace.perfetto.json"
    assert atomic_write_bytes(target, b"1") == target
    assert atomic_write_bytes(target, b"2", overwrite=False) == tmp_path / "trace-1.perfetto.json"
    assert atomic_write_bytes(target, b"3", overwrite=True) == target
    with pytest.raises(OutputError, match="already exists"):
        atomic_write_bytes(target, b"4", overwrite="error")
    assert target.read_bytes() == b"3" and (tmp_path / "trace-1.perfetto.json").read_bytes() == b"2"
    assert _no_temp_files(tmp_path)


def test_racing_writers_never_overwrite_each_other(tmp_path):
    """Many writers publishing one name at once each keep their own complete file."""
    n = 16
    barrier = threading.Barrier(n)
    paths: list[Path] = []

    def write(i: int) -> None:
        f = AtomicFile(tmp_path / "r.txt", "w", overwrite=False)
        with f as fh:
            fh.write(f"writer {i}\n" * 1000)
            barrier.wait()
        paths.append(f.path)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == n
    contents = sorted(p.read_text() for p in paths)
    assert contents == sorted(f"writer {i}\n" * 1000 for i in range(n))


def test_without_hard_links_names_are_still_reserved_exclusively(tmp_path, monkeypatch):
    """Where link(2) is refused (some FUSE/SMB mounts; simulated here, as no such file system is
    mounted on this machine), the name is reserved with O_EXCL instead: still no overwrite."""

    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    (tmp_path / "a.txt").write_text("first")
    assert atomic_write_bytes(tmp_path / "a.txt", b"second", overwrite=False) == tmp_path / "a-1.txt"
    with pytest.raises(OutputError, match="already exists"):
        atomic_write_bytes(tmp_path / "a.txt", b"third", overwrite="error")
    assert (tmp_path / "a.txt").read_text() == "first" and (tmp_path / "a-1.txt").read_text() == "second"
    assert _no_temp_files(tmp_path)


def test_files_get_umask_permissions(tmp_path):
    """Reports are created with the usual 0666 & ~umask mode, not a temp file's 0600."""
    old = os.umask(0o022)
    try:
        p = atomic_write_bytes(tmp_path / "a.bin", b"x")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o644


def test_new_dir_never_reuses_a_directory(tmp_path):
    """new_dir creates run, run-1, run-2 for three runs asking for one name."""
    got = [new_dir(tmp_path / "run") for _ in range(3)]
    assert [p.name for p in got] == ["run", "run-1", "run-2"]


def test_report_defaults_to_keeping_existing_files(tmp_path):
    """omniprof.report to an existing name writes beside it instead of replacing it."""
    first = omniprof.report(make_result(), "pprof", tmp_path / "p.pb.gz")
    second = omniprof.report(make_result(), "pprof", tmp_path / "p.pb.gz")
    third = omniprof.report(make_result(), "table", tmp_path / "t.txt")
    fourth = omniprof.report(make_result(), "table", tmp_path / "t.txt")
    assert (first.name, second.name, third.name, fourth.name) == ("p.pb.gz", "p-1.pb.gz", "t.txt", "t-1.txt")
    replaced = omniprof.report(make_result(), "table", tmp_path / "t.txt", overwrite=True)
    assert replaced == third


def test_trailing_slash_names_a_directory(tmp_path):
    """A destination ending in '/' is a directory even before it exists."""
    path = omniprof.report(make_result(), "collapsed", f"{tmp_path}/new/")
    assert path == tmp_path / "new" / "profile.collapsed"


def test_error_messages_are_one_line_with_reason_and_fix():
    """Each errno maps to one line naming the path, why, and what to do."""
    for code, why in [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only"), (errno.EACCES, "permission"),
                      (errno.EDQUOT, "quota")]:
        e = output_error("/x/y.json", OSError(code, os.strerror(code)))
        assert "\n" not in str(e) and "'/x/y.json'" in str(e) and why in str(e) and "-o DIR" in str(e)
        assert e.errno == code and isinstance(e, OSError)


def test_full_stream_is_a_one_line_error():
    """Writing a stream report to /dev/full raises OutputError 'the disk is full' at once."""
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full does not exist on this system")
    fh = open("/dev/full", "w")  # noqa: SIM115 - closed below, where it fails again
    try:
        with pytest.raises(OutputError, match="the disk is full") as ei:
            omniprof.report(make_result(), "table", fh)
        assert "\n" not in str(ei.value) and "/dev/full" in str(ei.value)
    finally:
        try:
            fh.close()
        except OSError:
            pass  # the unwritten buffer fails again on close


# -- real full / read-only file systems, in a private mount namespace ----------------------------------
def _namespace_cmd() -> list[str]:
    unshare = shutil.which("unshare")
    if not unshare:
        pytest.skip("unshare (util-linux) not found: cannot mount a private tmpfs")
    cmd = [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-r", "-m"]
    probe = subprocess.run([*cmd, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here ({probe.stderr.strip()}): needs root or user namespaces")
    return cmd


_CHILD = r"""
import json, os, subprocess, sys
mnt, mode, reporter = sys.argv[1], sys.argv[2], sys.argv[3]
opts = "size=64k" + (",ro" if mode == "ro" else "")
subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "omniprof-test", mnt], check=True)
import omniprof
from omniprof.testing.fakes import make_result
from omniprof.core.results import BackendResult
r = make_result()
if mode == "full":  # far more than 64 KiB of output in every format
    from omniprof.core.results import Span
    spans = [Span(f"op_{i}_" + "x" * 100, "t", i, 1) for i in range(3000)]
    r = r.evolve(parts=r.parts + (BackendResult(backend="big", spans=spans),))
r.save(sys.argv[4])
out = {}
try:
    omniprof.report(r, reporter, mnt + "/out.file")
    out["error"] = None
except omniprof.OmniprofError as e:
    out["error"] = str(e); out["type"] = type(e).__name__; out["errno"] = getattr(e, "errno", None)
out["left"] = sorted(os.listdir(mnt))
from omniprof import cli
out["cli_rc"] = cli.main(["report", sys.argv[4], "-r", reporter, "-o", mnt + "/cli"])
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode, reporter, why", [("full", "json", "the disk is full"),
                                                 ("full", "speedscope", "the disk is full"),
                                                 ("ro", "pprof", "the file system is read-only")])
def test_full_and_read_only_file_systems(mode, reporter, why, tmp_path):
    """On a real full or read-only tmpfs, report() raises one clear line and leaves no file behind,
    and the CLI exits 1 with that line."""
    cmd = _namespace_cmd()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    saved = tmp_path / "in.json"  # written by the child, outside the small file system
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*cmd, sys.executable, "-c", _CHILD, str(mnt), mode, reporter, str(saved)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["type"] == "OutputError" and why in out["error"] and "\n" not in out["error"]
    assert out["left"] == [], "a partial or temporary file was left on the full/read-only disk"
    assert out["cli_rc"] == 1
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("omniprof: error:")]
    assert len(err_lines) == 1 and why in err_lines[0]


def test_permission_denied_is_one_line(tmp_path):
    """A directory the user cannot write gives 'permission denied' in one line. Root ignores
    permission bits, so as root the writer runs without CAP_DAC_OVERRIDE (setpriv)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    code = ("import omniprof,sys\nfrom omniprof.testing.fakes import make_result\n"
            "try:\n    omniprof.report(make_result(), 'collapsed', sys.argv[1])\n"
            "except omniprof.OmniprofError as e:\n    print(type(e).__name__, '|', e)\n")
    from tests.tools import without_root_powers

    cmd = without_root_powers([sys.executable, "-c", code, str(locked / "x.collapsed")])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    line = proc.stdout.strip()
    assert line.startswith("OutputError |") and "permission denied" in line and "\n" not in line, proc.stderr
    assert os.listdir(locked) == []
    locked.chmod(0o755)


def test_cli_reports_unwritable_outdir_in_one_line(tmp_path, capsys):
    """`omniprof report -o DIR` where DIR cannot be created exits 1 with one error line."""
    saved = omniprof.report(make_result(), "json", tmp_path / "r.json")
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc = cli.main(["report", str(saved), "-r", "collapsed", "-o", str(blocker / "sub")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "not a directory" in err[0]


def test_cli_outdir_is_created_and_reports_go_inside(tmp_path, capsys):
    """`-o DIR` creates DIR and every file report lands inside it under its default name; text goes
    to the terminal."""
    saved = omniprof.report(make_result(), "json", tmp_path / "r.json")
    rc = cli.main(["report", str(saved), "-r", "pprof,speedscope,collapsed,table", "-o", str(tmp_path / "out")])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "profile.collapsed", "profile.pb.gz", "profile.speedscope.json"]
    assert "== omniprof" in capsys.readouterr().out
