"""What a person sees in a real terminal: `omniprof run` in tmux at 80, 100 and 120 columns, and
the progress of long work (drawn while it runs, gone when it ends, never on a pipe).

The screen is read back with ``tmux capture-pane -p`` (what the terminal shows, after rich and
the terminal have done their work), not from our own renderer's return value.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIME = r"\d+(?:\.\d+)? (?:ns|us|ms|s)"


@pytest.fixture(autouse=True)
def _tmux() -> None:
    from tests.tools import require

    require(shutil.which("tmux") is not None, "tmux (apt-get install tmux, or .ci/system-deps as root)")


def _screen(command: str, width: int, tmp_path: Path, *, height: int = 60, timeout_s: float = 60.0) -> str:
    """Run ``command`` in a fresh tmux server of ``width`` x ``height`` and return the screen."""
    sock = f"omniprof-test-{uuid.uuid4().hex[:8]}"
    done = tmp_path / f"done-{width}"
    env_prefix = f"cd {shlex.quote(str(ROOT))} && export PYTHONPATH={shlex.quote(str(ROOT))} TERM=xterm-256color; " \
                 "unset NO_COLOR COLUMNS LINES; clear; "
    script = f"{env_prefix}{command}; touch {shlex.quote(str(done))}; sleep 30"
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-x", str(width), "-y", str(height),
                    "bash", "--norc", "--noprofile", "-c", script], check=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not done.exists():
            if time.monotonic() > deadline:
                pytest.fail(f"{command!r} did not finish in {timeout_s} s in tmux")
            time.sleep(0.2)
        return subprocess.run(["tmux", "-L", sock, "capture-pane", "-p"],
                              capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def _block(screen: str, title: str) -> list[str]:
    lines = screen.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    out = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        out.append(ln)
    return out


@pytest.mark.parametrize("width", [80, 100, 120])
def test_run_reads_right_in_a_real_terminal(width, tmp_path):
    """`omniprof run examples/hot_loop.py`: every number whole, headers whole, function names
    whole (they fit at these widths), no omniprof frame, no warning, nothing past the edge."""
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof run examples/hot_loop.py 2>&1", width, tmp_path)
    assert "result: " in screen, screen
    if width >= 100:
        assert "…" not in screen, screen  # every name fits whole from 100 columns
    assert "warning" not in screen.lower(), screen
    assert "omniprof/" not in screen and "runpy" not in screen, screen
    tree = _block(screen, "Call tree")
    assert tree[0].split() == ["time", "%", "self", "function"], screen
    flat = _block(screen, "Flat (by self time")
    assert flat[0].split() == ["self", "self", "%", "total", "total", "%", "function"], screen
    rows = {}
    for ln in flat[2:]:
        m = re.match(rf"^\s*({TIME})\s+(\d+\.\d)\s+({TIME})\s+(\d+\.\d)\s+(\S.*)$", ln)
        assert m, f"a flat row with a cut figure: {ln!r}\n{screen}"
        rows[m.group(5).strip()] = (float(m.group(2)), float(m.group(4)))
    # One row per function (not per line), the hot one first; the docstring of the example says
    # about three quarters of the time.
    assert list(rows)[0] == "hot_function  examples/hot_loop.py", screen  # short enough to stay whole
    assert 50.0 <= rows["hot_function  examples/hot_loop.py"][0] <= 95.0
    assert sum(1 for k in rows if k.startswith("main ")) == 1
    assert rows["main  examples/hot_loop.py"][1] >= 95.0
    for ln in tree[2:]:
        assert re.match(rf"^\s*{TIME}\s+\d+\.\d\s+(?:{TIME})?\s+\S", ln), f"a cut tree row: {ln!r}"
    assert all(len(ln) <= width for ln in screen.splitlines())
    # A text line longer than the terminal wraps at words, its continuation indented under it
    # (not at column 0, where it would read as a line of its own).
    lines = screen.splitlines()
    i = next(k for k, ln in enumerate(lines) if "samples from" in ln)
    if "requested" not in lines[i]:
        assert lines[i + 1].startswith(" " * 7) and lines[i + 1].strip().endswith("requested"), screen
    i = next(k for k, ln in enumerate(lines) if ln.startswith("Metadata: "))
    if lines[i + 1].strip():
        assert lines[i + 1].startswith("    ") and "=" in lines[i + 1], screen


def test_long_names_are_elided_in_the_middle_only_when_they_cannot_fit(tmp_path):
    """A 150-character function name at 80 columns: its start and its file:line end stay, the
    middle gives way, and the figures beside it are whole."""
    prog = tmp_path / "long_names.py"
    name = "compute_" + "very_" * 26 + "long_name"
    prog.write_text(f"def {name}():\n    s = 0\n    for i in range(3_000_000):\n        s += i * i\n    return s\n\n"
                    f"{name}()\n")
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof run {shlex.quote(str(prog))} 2>&1", 80, tmp_path)
    flat = _block(screen, "Flat (by self time")
    row = flat[2]
    m = re.match(rf"^\s*({TIME})\s+(\d+\.\d)\s+({TIME})\s+(\d+\.\d)\s+(\S.*)$", row)
    assert m, screen
    label = m.group(5)
    assert label.startswith("compute_very_") and label.endswith("long_names.py") and "…" in label, screen
    assert len(label) >= 30
    assert all(len(ln) <= 80 for ln in screen.splitlines())


# -- every table fitted to the terminal ------------------------------------------------------------
def _is_cut_from(shown: str, full: str) -> bool:
    """Whether ``shown`` is ``full``, or ``full`` with runs of characters replaced by ``…``."""
    if "…" not in shown:
        return shown == full
    return re.fullmatch(".+".join(re.escape(p) for p in shown.split("…")), full, re.S) is not None


def _words(text: str) -> str:
    return " ".join(text.split())


def _rows(block: list[str]) -> list[str]:
    """A table's rows under its header and rule, without the notes under it."""
    rows = []
    for ln in block[2:]:
        if ln.startswith("  ("):
            break
        rows.append(ln)
    return rows


def _ends_with_cut(ln: str, name: str, place: str) -> bool:
    """Whether the row ``ln`` ends with ``name  place``, each part whole or cut on its own."""
    if not place:
        return bool(re.search(r"(?:^|\s\s)" + r"\S*".join(map(re.escape, name.split("…"))) + "$", ln)) or \
            any(_is_cut_from(ln[i + 2:], name) for i in range(len(ln)) if ln.startswith("  ", i))
    for i in range(len(ln) - 2, 0, -1):
        if ln.startswith("  ", i) and _is_cut_from(ln[i + 2:], place):
            head = ln[:i].rstrip()
            j = head.rfind("  ")
            return _is_cut_from(head[j + 2:] if j >= 0 else head, name)
    return False


def _label_parts(ln: str) -> tuple[str, str]:
    """A row's last cell, ``name  place``: the two parts (place '' for a pseudo-frame)."""
    if ln.endswith("(total)"):
        return "(total)", ""
    m = re.search(r"\s\s(\S+)\s\s(\S+)$", ln)
    return (m.group(1), m.group(2)) if m else (ln.split()[-1], "")


@pytest.mark.parametrize("width", [80, 100, 120])
def test_run_cuts_name_and_place_apart(width, tmp_path):
    """`omniprof run examples/hot_loop.py`: in the tree and the flat list every function is
    ``name  place``, each a cut of the real one (the piped report, never cut, is the reference):
    never one cut across both (``warm_function.<locals…xamples/hot_loop.py``), the file name whole."""
    exe = shlex.quote(sys.executable)
    piped = _piped(["run", "examples/hot_loop.py", "20"], ROOT)
    assert piped.returncode == 0, piped.stderr
    names = {_label_parts(ln)[0] for ln in _rows(_block(piped.stdout, "Flat (by self time"))}
    assert "hot_function" in names and any(n.startswith("warm_function.") for n in names), piped.stdout
    screen = _screen(f"{exe} -m omniprof run examples/hot_loop.py 20 2>&1", width, tmp_path)
    assert all(len(ln) <= width for ln in screen.splitlines()), screen
    for title in ("Call tree", "Flat (by self time"):
        rows = _rows(_block(screen, title))
        assert rows, screen
        shown = []
        for ln in rows:
            name, place = _label_parts(ln)
            assert place and _is_cut_from(place, "examples/hot_loop.py") and place.endswith("hot_loop.py"), \
                f"{ln!r}\n{screen}"
            assert any(_is_cut_from(name, full) for full in names), f"{name!r} is no function's name\n{screen}"
            shown.append(name)
        if title.startswith("Flat"):
            assert len(set(shown)) == len(shown), screen  # one row per function: all told apart


def _two_runs(tmp_path: Path) -> tuple[str, str]:
    out = []
    for side in ("a", "b"):
        p = _piped(["run", "-r", "json", "-o", str(tmp_path / side), "examples/hot_loop.py", "20"], ROOT)
        assert p.returncode == 0, p.stderr
        out.append(str(next((tmp_path / side).glob("*.json"))))
    return out[0], out[1]


@pytest.mark.parametrize("width", [80, 100, 120])
def test_diff_fits_the_terminal(width, tmp_path):
    """`omniprof diff a.json b.json`: every row on one line with its figures whole (the piped
    diff, never cut, is the reference), names cut apart from their file, notes wrapped at words."""
    a, b = _two_runs(tmp_path)
    piped = _piped(["diff", a, b], tmp_path)
    assert piped.returncode == 0, piped.stderr
    ref = piped.stdout.splitlines()
    ref_rows = _rows(ref[ref.index(next(ln for ln in ref if ln.startswith("functions"))) + 1:])
    ref_rows = ref_rows[:next((k for k, ln in enumerate(ref_rows) if ln.startswith("note:")), len(ref_rows))]
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof diff {shlex.quote(a)} {shlex.quote(b)}", width, tmp_path, height=80)
    assert all(len(ln) <= width for ln in screen.splitlines()), screen
    rows = _rows(_block(screen, "functions"))
    rows = rows[:next((k for k, ln in enumerate(rows) if ln.startswith(("note:", "omniprof:"))), len(rows))]
    assert len(rows) == len(ref_rows), screen
    for ln, full in zip(rows, ref_rows):
        figures = re.findall(rf"[+-]?{TIME}", full)[:3]  # A, B, delta
        whole = r"\s+".join(map(re.escape, figures))
        assert len(figures) == 3 and re.match(rf"^!?\s*{whole}\s", ln), (ln, full)
        label = re.split(r"\s(?:changed|same|new|vanished)\s{2,}", full)[-1]  # the name cell, after the status
        full_name, _, full_place = label.partition("  ")
        assert _ends_with_cut(ln, full_name, full_place), (ln, full)
    for note in (ln for ln in ref if ln.startswith("note: ")):
        assert _words(note) in _words(screen), f"a note broken inside a word: {note!r}\n{screen}"


@pytest.mark.parametrize("width", [80, 100, 120])
def test_plugins_fits_the_terminal(width, tmp_path):
    """`omniprof plugins`: one line per plugin, no line past the edge, and every reason the
    registry gives shown whole, wrapped at words (never ``libnvidia-ml.so`` / ``.1``)."""
    from omniprof.core.registry import Registry

    infos = Registry().infos(probe=True)
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof plugins 2>&1", width, tmp_path, height=80)
    lines = screen.splitlines()
    assert all(len(ln) <= width for ln in lines), screen
    for i in infos:
        row = [ln for ln in lines if ln.split()[:2] == [i.name, i.kind]]
        assert len(row) == 1 and i.status in row[0], (i.name, screen)
        if i.reason:
            assert _words(i.reason) in _words(screen), f"{i.name}: reason cut or broken\n{screen}"


_ALLOC_SITES = """
def build_blocks_for_the_cache(n):
    return [bytearray(4096) for _ in range(n)]


def build_blocks_for_the_index(n):
    return [bytearray(2048) for _ in range(n)]


kept = [build_blocks_for_the_cache(3000), build_blocks_for_the_index(3000)]
"""


@pytest.mark.parametrize("width", [80, 100, 120])
def test_memory_report_keeps_sites_readable(width, tmp_path):
    """`omniprof run -b memory` of a script deep in a directory tree: every site keeps its file
    name and line (``…alloc_sites.py:3``, never ``/tmp/ne…py:5``), the two functions stay apart,
    nothing runs past the edge."""
    prog = tmp_path / "newproject" / "deeply" / "nested" / "package" / "alloc_sites.py"
    prog.parent.mkdir(parents=True)
    prog.write_text(_ALLOC_SITES)
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof run -b memory {shlex.quote(str(prog))} 2>&1", width, tmp_path, height=150)
    assert all(len(ln) <= width for ln in screen.splitlines()), screen
    rows = _rows(_block(screen, "Allocations by site"))
    assert len(rows) >= 2, screen
    names = ("build_blocks_for_the_cache.<locals>.<listcomp>", "build_blocks_for_the_cache",
             "build_blocks_for_the_index.<locals>.<listcomp>", "build_blocks_for_the_index")
    shown = []
    for ln in rows:
        if not ln.startswith("build_b"):  # the interpreter's own sites, elsewhere
            continue
        m = re.match(r"^(\S+)\s+(…?\S*alloc_sites\.py:(\d+))\s", ln)
        assert m and _is_cut_from(m.group(2), f"{prog}:{m.group(3)}"), f"{ln!r}\n{screen}"
        assert any(_is_cut_from(m.group(1), n) for n in names), ln
        shown.append((m.group(1), m.group(2)))
    assert len(shown) >= 2 and len(set(shown)) == len(shown), screen
    alloc = _rows(_block(screen, "Allocations: "))
    sites = [_label_parts(ln) for ln in alloc if "alloc_sites.py" in ln]
    assert sites and all(p.endswith(".py:" + p.rsplit(":", 1)[1]) and "alloc_sites.py:" in p for _, p in sites), screen
    assert len(set(sites)) == len(sites), screen


# -- progress on long work ---------------------------------------------------------------------------
#: `python -m omniprof` with progress drawn at once (no 0.3 s delay), for work that is short on a quiet machine.
NO_DELAY = ("import sys, omniprof.cli.progress as p; p.DELAY_S = 0; from omniprof.cli import main; "
            "sys.exit(main())")


def _watch(command: str, tmp_path: Path, *, width: int = 100, height: int = 30, timeout_s: float = 180.0,
           interrupt_on: str | None = None) -> tuple[list[str], str]:
    """Run ``command`` in tmux and read the screen every 50 ms while it runs: (every distinct
    screen seen, the last one). ``interrupt_on``: press Ctrl-C once that text is on the screen."""
    sock = f"omniprof-test-{uuid.uuid4().hex[:8]}"
    done = tmp_path / f"done-{uuid.uuid4().hex[:6]}"
    script = (f"cd {shlex.quote(str(tmp_path))} && export PYTHONPATH={shlex.quote(str(ROOT))} TERM=xterm-256color; "
              f"unset NO_COLOR COLUMNS LINES CI OMNIPROF_NO_PROGRESS; clear; {command}; echo \"rc=$?\"; "
              f"touch {shlex.quote(str(done))}; sleep 60")
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-x", str(width), "-y", str(height),
                    "bash", "--norc", "--noprofile", "-c", script], check=True)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        interrupted = False
        while True:
            finished = done.exists()
            screen = subprocess.run(["tmux", "-L", sock, "capture-pane", "-p"], capture_output=True, text=True,
                                    check=True).stdout
            if not seen or screen != seen[-1]:
                seen.append(screen)
            if finished:
                return seen, screen
            if interrupt_on is not None and not interrupted and interrupt_on in screen:
                subprocess.run(["tmux", "-L", sock, "send-keys", "C-c"], check=True)
                interrupted = True
            if time.monotonic() > deadline:
                pytest.fail(f"{command!r} did not finish in {timeout_s} s in tmux:\n{screen}")
            time.sleep(0.05)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def _piped(args: list[str], cwd: Path, *, ci: bool = False) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OMNIPROF_NO_PROGRESS")}
    env.update(PYTHONPATH=str(ROOT), **({"CI": "true"} if ci else {}))
    return subprocess.run([sys.executable, "-c", NO_DELAY, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


_SNAPSHOT_CHILD = """
import sys
sys.path.insert(0, {root!r})
from omniprof.memory import take_heap_snapshot
keep = [{{"k": [str(i), i]}} for i in range({n})]
take_heap_snapshot({prefix!r}, streaming=True)
"""


def test_heap_snapshot_assembly_draws_a_bar_on_a_terminal_only(tmp_path):
    """`omniprof assemble` of a 150,000-dict heap (seconds of work): a bar with a percentage that
    grows, gone when it ends; under CI=true in the same terminal, and on a pipe, nothing."""
    prefix = tmp_path / "big.heapsnapshot"
    subprocess.run([sys.executable, "-c", _SNAPSHOT_CHILD.format(root=str(ROOT), n=150_000, prefix=str(prefix))],
                   check=True, timeout=300)
    exe = shlex.quote(sys.executable)
    seen, final = _watch(f"{exe} -m omniprof assemble big.heapsnapshot -o a.heapsnapshot 2>&1", tmp_path)
    bars = [ln for s in seen for ln in s.splitlines() if "assembling a.heapsnapshot" in ln]
    percents = [int(m.group(1)) for ln in bars for m in [re.search(r"\s(\d+)%\s", ln)] if m]
    assert len(set(percents)) >= 2 and percents == sorted(percents), "\n".join(bars) or seen
    assert "assembling" not in final and "rc=0" in final, final
    assert "omniprof: heap snapshot written to a.heapsnapshot (" in final.replace("\n", ""), final
    assert all(len(ln) <= 100 for s in seen for ln in s.splitlines())

    seen, final = _watch(f"CI=true {exe} -m omniprof assemble big.heapsnapshot -o b.heapsnapshot 2>&1", tmp_path)
    assert not any("assembling" in s for s in seen) and "rc=0" in final, seen

    proc = _piped(["assemble", "big.heapsnapshot", "-o", "c.heapsnapshot"], tmp_path)
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.startswith("omniprof: heap snapshot written to c.heapsnapshot (") and \
        proc.stderr.count("\n") == 1 and "\x1b" not in proc.stderr, proc.stderr
    assert (tmp_path / "a.heapsnapshot").read_bytes() == (tmp_path / "c.heapsnapshot").read_bytes()


def test_trace_read_and_xprof_conversion_show_a_spinner_on_a_terminal_only(tmp_path):
    """`omniprof report big.json -r tensorboard`: a spinner while the 200,000-span result is read,
    another while the XProf conversion writes; gone at the end; nothing on a pipe."""
    from omniprof.core.results import BackendResult, ProfileResult, RunMetadata, Span, Track

    spans = tuple(Span(f"op{i % 50}", "t0", i * 1000, 900) for i in range(200_000))
    ProfileResult(metadata=RunMetadata(host="h"),
                  parts=(BackendResult("torch", tracks=(Track("t0", "main", "thread"),), spans=spans),)
                  ).save(tmp_path / "big.json")
    exe = shlex.quote(sys.executable)
    seen, final = _watch(f"{exe} -c {shlex.quote(NO_DELAY)} report big.json -r tensorboard -o logs 2>&1", tmp_path)
    lines = [ln for s in seen for ln in s.splitlines()]
    assert any(re.match(r"^\S reading big\.json\b", ln) for ln in lines), seen
    assert any(re.match(r"^\S writing the tensorboard report\b", ln) for ln in lines), seen
    assert "reading" not in final and "writing the" not in final and "rc=0" in final, final
    assert "omniprof: tensorboard report written to logs" in final
    proc = _piped(["report", "big.json", "-r", "tensorboard", "-o", "logs2"], tmp_path)
    assert proc.returncode == 0 and proc.stderr == "omniprof: tensorboard report written to logs2\n", proc.stderr


def test_diff_shows_a_bar_over_its_inputs_on_a_terminal_only(tmp_path):
    """`omniprof diff big.json big2.json` (two 100,000-span results): a bar over the two inputs
    while they are read, gone before the diff is printed; nothing of it on a pipe, where the
    output is the same diff."""
    from omniprof.core.results import BackendResult, ProfileResult, RunMetadata, Span, Track

    for name, scale in (("big.json", 900), ("big2.json", 950)):
        spans = tuple(Span(f"op{i % 50}", "t0", i * 1000, scale) for i in range(100_000))
        ProfileResult(metadata=RunMetadata(host="h"),
                      parts=(BackendResult("torch", tracks=(Track("t0", "main", "thread"),), spans=spans),)
                      ).save(tmp_path / name)
    exe = shlex.quote(sys.executable)
    seen, final = _watch(f"{exe} -c {shlex.quote(NO_DELAY)} diff big.json big2.json --min-share-pct 0 2>&1",
                         tmp_path, height=80)
    bars = [ln for s in seen for ln in s.splitlines() if re.match(r"^\S reading 2 inputs\b", ln)]
    assert bars, seen
    assert any(re.search(r"\s(0|50)%\s", ln) for ln in bars), bars
    assert "reading 2 inputs" not in final and "rc=0" in final, final
    proc = _piped(["diff", "big.json", "big2.json", "--min-share-pct", "0"], tmp_path)
    assert proc.returncode == 0 and "reading" not in proc.stderr and "\x1b" not in proc.stdout + proc.stderr
    assert proc.stdout.startswith("== omniprof diff: 0 regression(s)"), proc.stdout


def test_xprof_start_shows_a_spinner_until_it_serves(tmp_path):
    """`omniprof view LOGDIR`: a spinner while XProf is imported and started, replaced by the line
    that says where it serves."""
    from omniprof.reporters.tensorboard import write_logdir
    from omniprof.testing.fakes import make_result

    write_logdir(make_result(), tmp_path / "logs")
    exe = shlex.quote(sys.executable)
    seen, final = _watch(f"{exe} -c {shlex.quote(NO_DELAY)} view logs --port 0 2>&1", tmp_path,
                         interrupt_on="XProf serving")
    lines = [ln for s in seen for ln in s.splitlines()]
    assert any(re.match(r"^\S starting XProf on logs\b", ln) for ln in lines), seen
    assert "starting XProf" not in final and re.search(r"omniprof: XProf serving logs at http://127\.0\.0\.1:\d+/",
                                                       final), final
    assert "omniprof: XProf stopped" in final and "rc=0" in final, final


_XLA_SERVER = """
import sys, time
import omniprof
import jax, jax.numpy as jnp
omniprof.jax.start_server(int(sys.argv[1]), all_interfaces_ok=True)
f = jax.jit(lambda x: jnp.sin(x) @ x)
x = jnp.ones((64, 64))
f(x).block_until_ready()
print("READY", flush=True)
deadline = time.time() + 120
while time.time() < deadline:
    f(x).block_until_ready()
    time.sleep(0.002)
"""


def test_collect_shows_a_spinner_while_it_waits_on_a_terminal_only(tmp_path):
    """`omniprof collect` from a real XLA profiler server (a jax process on 127.0.0.1): the line
    that says it is waiting at once, a spinner with the elapsed time while the capture and the
    server's conversion run, gone when the capture is saved; on a pipe, the lines alone."""
    import os

    pytest.importorskip("jax")
    pytest.importorskip("xprof")
    from tests.tools import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    server = subprocess.Popen([sys.executable, "-c", _XLA_SERVER, str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        assert server.stdout.readline().strip() == "READY"
        exe = shlex.quote(sys.executable)
        args = f"collect 127.0.0.1:{port} --duration-ms 1500 --logdir L --no-perfetto-link"
        seen, final = _watch(f"{exe} -m omniprof {args} 2>&1", tmp_path)
        lines = [ln for s in seen for ln in s.splitlines()]
        spin = [ln for ln in lines if re.match(rf"^\S capturing from 127\.0\.0\.1:{port}\b.*\d:\d\d:\d\d", ln)]
        assert spin, seen
        assert "capturing from" not in final and "rc=0" in final, final
        assert re.search(r"omniprof: captured 1 host\(s\) into ", final.replace("\n", "")), final
        waiting = [s for s in seen if "omniprof: capturing 1.5 s from" in s]
        assert waiting and any(re.search(r"^\S capturing from", s, re.M) for s in waiting), seen
        proc = _piped(args.split(), tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stderr and "capturing from" not in proc.stderr.replace(
            f"capturing 1.5 s from 127.0.0.1:{port}", ""), proc.stderr
        assert proc.stderr.startswith("omniprof: capturing 1.5 s from")
        assert "omniprof: captured 1 host(s)" in proc.stderr
    finally:
        server.kill()
        server.wait(10)
