"""Locating the real viewers and validators the tests run (installed by .ci/system-deps), and the
project's shared data folder (the real GPU traces).

A missing tool skips the test on a developer's machine and fails it under CI (``CI=true``), where
.ci/system-deps installs everything: a format check can never silently not run in CI.
A missing shared data file (shared_data) fails the test everywhere: the folder is part of the project.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE_MODULES = ROOT / ".ci" / "cache" / "npm" / "node_modules"


def require(condition: bool, what: str) -> None:
    if condition:
        return
    message = f"{what} is not installed (run .ci/readers; system tools: .ci/system-deps as root)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


SHARED_DATA_ENV = "OMNIPROF_SHARED_DATA"


def shared_data_dirs() -> list[Path]:
    """Where the project's shared data folder is looked for, in order: ``$OMNIPROF_SHARED_DATA`` if
    set, then ``shared/data`` beside the repository, then one level further up (a worktree)."""
    env = os.environ.get(SHARED_DATA_ENV)
    return [*([Path(env)] if env else []), ROOT.parent / "shared" / "data", ROOT.parent.parent / "shared" / "data"]


def find_shared_data(*parts: str) -> Path | None:
    """The file ``parts`` of the first shared data folder that holds it, or None."""
    return next((d.joinpath(*parts) for d in shared_data_dirs() if d.joinpath(*parts).is_file()), None)


def shared_data(*parts: str) -> Path:
    """The file ``parts`` of the shared data folder, e.g. ``shared_data("kineto", "alexnet_cuda_trace.json.gz")``
    (the real GPU traces, see shared/data/kineto/SOURCE.md). Not found, the test fails (never skips),
    naming where it looked and the fix."""
    path = find_shared_data(*parts)
    if path is None:
        looked = ", ".join(str(d) for d in shared_data_dirs())
        pytest.fail(f"{'/'.join(parts)} not found in the shared data folder (looked in {looked}): put the "
                    f"project's shared/ folder beside the repository, or set {SHARED_DATA_ENV}=/path/to/shared/data",
                    pytrace=False)
    return path


def without_root_powers(cmd: list[str]) -> list[str]:
    """``cmd`` made to run as an ordinary user would for file permissions. As root (a container,
    CI), it runs under ``setpriv`` without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER,
    so a directory's mode bits apply to it; as anyone else, unchanged.

    Not another uid: the interpreter itself may live where only root can read (``/root/.pyenv``).
    """
    if os.name != "posix" or os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    require(setpriv is not None, "setpriv (util-linux)")
    return [str(setpriv), "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner", *cmd]


def node_package(name: str) -> Path:
    """Path of an npm package installed by .ci/system-deps, with node on PATH."""
    require(shutil.which("node") is not None, "node")
    pkg = NODE_MODULES / name
    require(pkg.is_dir(), f"npm package {name}")
    return pkg


def write(path: Path, text: str) -> Path:
    """``text`` dedented into ``path`` (UTF-8); returns ``path``."""
    import textwrap

    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the working directory, with no ``OMNIPROF_*`` config variable set."""
    from omniprof import config as cfgmod

    monkeypatch.chdir(tmp_path)
    for var in [*cfgmod.ENV_KEYS, cfgmod.CONFIG_ENV, cfgmod.PROFILE_ENV]:
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def cpython_interpreters() -> list[tuple[str, str]]:
    """(version, executable) of every CPython 3.10-3.13 this machine has (pyenv's), and this one."""
    import glob
    import sys

    found: dict[str, str] = {}
    for exe in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-3].*/bin/python"))):
        found.setdefault(Path(exe).parts[-3].rsplit(".", 1)[0], exe)
    found.setdefault(f"{sys.version_info[0]}.{sys.version_info[1]}", sys.executable)
    return sorted(found.items())


def build_extension(exe: str, source: Path, out_dir: Path) -> Path:
    """Compile one C extension source for the interpreter ``exe``, with that interpreter's own
    headers (as its setuptools would), into ``out_dir``; fails the test with the compiler's errors."""
    import subprocess
    import sysconfig

    info = subprocess.run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['include']); "
                                      "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                          capture_output=True, text=True, check=True).stdout.split()
    inc, suffix = info[0], info[1]
    cc = sysconfig.get_config_var("CC") or "cc"
    out = out_dir / f"{source.stem}{suffix}"
    build = subprocess.run([*cc.split()[:1], "-shared", "-fPIC", "-O2", "-Wall", f"-I{inc}", str(source), "-o", str(out)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "warning" not in build.stderr, build.stderr[-2000:]
    return out


def peek_from_outside(code: str, *, wait_s: float, timeout_s: float = 120, env: dict[str, str] | None = None
                      ) -> tuple[int, str, str]:
    """Run ``python -c code``, which prints ``READY`` once its peek is armed; send it SIGUSR1
    ``wait_s`` later, as ``kill -USR1 <pid>`` would from a shell; return (status, stdout, stderr)."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        time.sleep(wait_s)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def check_clock_alignment(run: Path, world: int, skewed: int, skew_ns: int, collective: str) -> list[int]:
    """A distributed run whose rank ``skewed`` profiled with a clock ``skew_ns`` ahead: each rank's
    estimated offset is the truth within its stated uncertainty (the ranks share this machine's
    clock, so the true offsets are known exactly), and on the merged timeline every rank leaves the
    k-th ``collective`` together (it completes on all ranks at once; unaligned, one rank would be
    ``skew_ns`` off). Returns the spread of each collective's end across ranks."""
    import omniprof
    from omniprof.analysis.timeline import merge

    for r in range(world):
        d = omniprof.load(run / f"rank{r}" / "omniprof.result.json").metadata.distributed
        true_offset = -skew_ns if r == skewed else 0
        assert abs(d["clock_offset_ns"] - true_offset) <= d["clock_uncertainty_ns"] + 1, d
        if r:
            assert d["clock_rounds"] == 8 and 0 < d["clock_uncertainty_ns"] < 500_000_000
    ends: dict[int, list[int]] = {}
    for s in merge(omniprof.load(run / "omniprof.result.json")).spans:
        if s.name == collective:
            ends.setdefault(int(s.track.split("/")[0][4:]), []).append(s.end_ns)
    assert sorted(ends) == list(range(world))
    spreads = []
    for k in range(min(len(v) for v in ends.values())):
        at = [sorted(ends[r])[k] for r in range(world)]
        spreads.append(max(at) - min(at))
    # A loaded machine can delay one rank's end mark now and then: the typical spread is small, and
    # none comes near the skew.
    assert sorted(spreads)[len(spreads) // 2] < 50_000_000 and max(spreads) < 1_000_000_000, spreads
    return spreads


def stop_process(proc) -> None:
    """End a server started by a test: SIGTERM, then SIGKILL if it has not gone in 20 s."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous or a server under test)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nvml_loads() -> bool:
    """The independent reference for GPU checks: whether the NVIDIA driver's NVML library loads here."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def cli_as_nobody(argv: list[str]) -> tuple[int, str]:
    """``omniprof.cli.main(argv)`` in a forked child that dropped to user nobody (65534): its exit
    code and what it wrote to stderr (a collector without the right to read a root-owned target)."""
    import sys

    from omniprof.cli import main

    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(r)
            sys.stderr = open(w, "w", closefd=False)  # noqa: SIM115 - the child's stderr, flushed below
            os.setgid(65534)
            os.setuid(65534)
            code = main(argv)
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            code = 99
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status), err
