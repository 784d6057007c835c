"""Real viewers for the formats we write, found on this machine or in .ci/cache (filled by
.ci/system-deps). A test needing one skips with the reason and the fix when it is missing, unless
OMNIPROF_REQUIRE_VIEWERS=1 or CI is set: there a missing viewer is a failure, not a skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / ".ci" / "cache"


def _missing(what: str, fix: str) -> None:
    msg = f"{what} not found: {fix}"
    if os.environ.get("OMNIPROF_REQUIRE_VIEWERS") == "1" or os.environ.get("CI"):
        pytest.fail(msg + " (viewers are required when CI or OMNIPROF_REQUIRE_VIEWERS=1 is set)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def speedscope_schema() -> dict:
    """speedscope's published file-format JSON Schema (from the speedscope npm package)."""
    path = Path(os.environ.get("OMNIPROF_SPEEDSCOPE_SCHEMA", CACHE / "speedscope" / "release" / "file-format-schema.json"))
    if not path.is_file():
        _missing(f"speedscope's file-format-schema.json ({path})", "run .ci/readers (npm pack speedscope)")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def flamegraph_pl() -> list[str]:
    """The command running Brendan Gregg's flamegraph.pl."""
    perl = shutil.which("perl")
    cand = os.environ.get("OMNIPROF_FLAMEGRAPH_PL") or shutil.which("flamegraph.pl") or str(
        CACHE / "flamegraph" / "flamegraph.pl")
    if not perl or not Path(cand).is_file():
        _missing("flamegraph.pl (and perl)", "run .ci/readers, or set OMNIPROF_FLAMEGRAPH_PL")
    return [perl, cand]


@pytest.fixture(scope="session")
def go_pprof(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command running ``go tool pprof`` (Debian's golang-go)."""
    go = shutil.which("go")
    if not go:
        _missing("go (for go tool pprof)", "apt-get install golang-go, or run .ci/system-deps")
    home = tmp_path_factory.mktemp("gohome")
    env = {**os.environ, "HOME": str(home), "PPROF_TMPDIR": str(home), "GOFLAGS": ""}
    probe = subprocess.run([go, "tool", "-n", "pprof"], capture_output=True, text=True, env=env, timeout=60)
    if probe.returncode != 0:
        _missing("go tool pprof", f"go is there but has no pprof tool: {probe.stderr.strip()}")
    return [go, "tool", "pprof"]


def _run_tool(cmd: list[str], *args: str, stdin: bytes | None = None, timeout: float = 120
              ) -> subprocess.CompletedProcess:
    proc = subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stderr.decode(errors='replace')}")
    return proc


@pytest.fixture(scope="session")
def run_tool():
    """``run_tool(cmd, *args, stdin=None)``: run a viewer, failing the test with its stderr if it fails."""
    return _run_tool


def _workload_leaf_a(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def _workload_leaf_b(n: int) -> int:
    return sum(str(i).count("7") for i in range(n))


def _workload_root() -> int:
    out = 0
    for _ in range(6):
        out += _workload_leaf_a(40_000) + _workload_leaf_b(20_000)
    return out


@pytest.fixture(scope="session")
def cpu_result():
    """A real result of the cpu backend (1 kHz) on a small two-function workload."""
    import omniprof

    with omniprof.Profiler(backend="cpu") as prof:
        _workload_root()
    result = prof.result
    if not result.part("cpu").samples:
        pytest.skip("the cpu sampler recorded no samples on this (very loaded?) machine")
    return result


class SpeedscopeApp:
    """The speedscope web app (from its npm package) served on 127.0.0.1 and driven by headless
    Chromium: ``load(path)`` imports a file the way a person would open it, and returns what the
    page shows."""

    def __init__(self, chromium: str, release: Path, workdir: Path) -> None:
        self.chromium = chromium
        self.release = release
        self.workdir = workdir

    def load(self, profile: Path) -> dict:
        import functools
        import http.server
        import shutil as _sh
        import threading

        site = self.workdir / f"site-{profile.stem}"
        if not site.exists():
            _sh.copytree(self.release, site)
        _sh.copy(profile, site / "profile.json")
        handler = functools.partial(_QuietHandler, directory=str(site))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}"
            proc = subprocess.run(
                [self.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", f"--user-data-dir={self.workdir / 'chrome-profile'}", "--enable-logging=stderr",
                 "--virtual-time-budget=10000", "--dump-dom", f"{base}/index.html#profileURL={base}/profile.json"],
                capture_output=True, text=True, timeout=120)
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
        dom = proc.stdout
        import re

        title = re.search(r"<title>(.*?)</title>", dom, re.S)
        console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]
        return {"title": title.group(1) if title else None, "dom": dom, "console": console,
                "failed": "Something went wrong" in dom or any("Failed to load" in ln for ln in console)}


class _QuietHandler(__import__("http.server").server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def speedscope_app(tmp_path_factory: pytest.TempPathFactory) -> SpeedscopeApp:
    """The real speedscope app in headless Chromium."""
    release = Path(os.environ.get("OMNIPROF_SPEEDSCOPE_RELEASE", CACHE / "speedscope" / "release"))
    if not (release / "index.html").is_file():
        _missing(f"the speedscope app ({release}/index.html)", "run .ci/readers (npm pack speedscope)")
    chromium = next((c for c in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if c), None)
    if not chromium:
        _missing("chromium (to run the speedscope app headless)", "apt-get install chromium, or run .ci/system-deps")
    return SpeedscopeApp(chromium, release, tmp_path_factory.mktemp("speedscope-app"))


@pytest.fixture(scope="module")
def engine():
    """Perfetto's trace processor (the real reader of our .perfetto-trace and Chrome JSON files)."""
    from omniprof.testing.trace_processor import TraceProcessorUnavailable, find_engine

    try:
        return find_engine()
    except TraceProcessorUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run Perfetto's trace processor: {e}")
        pytest.skip(str(e))
