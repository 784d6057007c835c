"""``omniprof dump PID`` on real CPython 3.10-3.13 processes that never imported omniprof.

Each target parks its threads in known places (a sleep, a blocking read, a deadlock on two locks,
a busy loop) and then writes what ``sys._current_frames()`` says about them: the reference the
dump is compared with, frame by frame (name, file, line).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from omniprof.cli import main
from tests.tools import cli_as_nobody
from omniprof.live.reader import line_for_offset

PYENV = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


def pythons() -> list[str]:
    """The newest pyenv CPython of each minor version 3.10-3.13 here, and the one running the tests."""
    found = {f"3.{sys.version_info[1]}": sys.executable}
    for minor in (10, 11, 12, 13):
        exes = sorted(glob.glob(os.path.join(PYENV, "versions", f"3.{minor}.*", "bin", f"python3.{minor}")))
        if exes:
            found[f"3.{minor}"] = exes[-1]
    return [found[k] for k in sorted(found)]


TARGET = textwrap.dedent('''
    import json, os, sys, threading, time

    out = sys.argv[1]
    lock_a, lock_b = threading.Lock(), threading.Lock()
    both = threading.Barrier(2)
    r, w = os.pipe()

    def sleeper_leaf():
        time.sleep(1000)  # SLEEP

    def sleeper():
        sleeper_leaf()

    def reader():
        os.read(r, 1)  # READ

    def lock_ab():
        with lock_a:
            both.wait()
            with lock_b:  # DEADLOCK_A
                pass

    def lock_ba():
        with lock_b:
            both.wait()
            with lock_a:  # DEADLOCK_B
                pass

    def spin_leaf():
        x = 0
        while True:
            x += 1

    def spin():
        spin_leaf()

    def describe(frame):
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append([getattr(code, "co_qualname", code.co_name), code.co_filename, frame.f_lineno])
            frame = frame.f_back
        return stack

    def report(main_ident, parked):
        # every parked thread stands on its blocking line: then it is inside the blocking call
        while True:
            frames = sys._current_frames()
            if all(i in frames and frames[i].f_lineno == line for i, line in parked.items()):
                break
            time.sleep(0.01)
        time.sleep(0.2)
        frames = sys._current_frames()
        doc = {str(i): describe(frames[i]) for i in parked}
        doc["spin"] = [str(spinner.ident), describe(frames[spinner.ident])]
        doc["main"] = str(main_ident)
        doc["names"] = {str(t.ident): t.name for t in threading.enumerate()}
        with open(out + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(out + ".tmp", out)

    def main_leaf():
        time.sleep(1000)  # MAIN

    def main_mid():
        main_leaf()

    lines = {tag: n for n, text in enumerate(open(__file__).read().splitlines(), 1)
             for tag in ("SLEEP", "READ", "DEADLOCK_A", "DEADLOCK_B", "MAIN") if text.endswith("# " + tag)}
    threads = {tag: threading.Thread(target=fn, daemon=True, name=f"t-{tag.lower()}")
               for tag, fn in (("SLEEP", sleeper), ("READ", reader), ("DEADLOCK_A", lock_ab), ("DEADLOCK_B", lock_ba))}
    vars(threads["READ"])["extra"] = 1  # this one's attributes in a real __dict__, the others' not
    for t in threads.values():
        t.start()
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    parked = {t.ident: lines[tag] for tag, t in threads.items()}
    parked[threading.get_ident()] = lines["MAIN"]
    threading.Thread(target=report, args=(threading.get_ident(), parked)).start()
    main_mid()
''')


@pytest.fixture
def target(tmp_path):
    procs = []

    def start(python: str) -> tuple[int, dict]:
        script = tmp_path / "parked.py"
        script.write_text(TARGET)
        out = tmp_path / "truth.json"
        p = subprocess.Popen([python, str(script), str(out)], stdin=subprocess.DEVNULL)
        procs.append(p)
        deadline = time.monotonic() + 60
        while not out.exists():
            assert p.poll() is None, f"target exited with {p.returncode}"
            assert time.monotonic() < deadline, "target never reported its stacks"
            time.sleep(0.05)
        return p.pid, json.loads(out.read_text())

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _dump_json(pid: int, capsys) -> dict:
    capsys.readouterr()
    assert main(["dump", str(pid), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("python", pythons(), ids=lambda p: os.path.basename(p))
def test_dump_matches_the_targets_own_stacks(python, target, capsys):
    pid, truth = target(python)
    doc = _dump_json(pid, capsys)
    by_id = {str(t["thread_id"]): t for t in doc["threads"]}
    want_version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    assert doc["python"] == want_version
    spin_id, spin_truth = truth.pop("spin")
    main_id = truth.pop("main")
    names = truth.pop("names")
    for ident, stack in truth.items():  # parked threads: exact, frame by frame
        got = by_id[ident]
        assert not got["torn"]
        assert [[f["name"], f["file"], f["line"]] for f in got["frames"]] == stack
        assert not got["holds_gil"]  # blocked in C: the GIL is released
    assert by_id[main_id]["name"] == "MainThread"
    assert by_id[main_id]["native_id"] == pid  # the kernel's ids (3.10: read from glibc's thread struct)
    tasks = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    assert all(t["native_id"] in tasks for t in doc["threads"])
    assert len({t["native_id"] for t in doc["threads"]}) == len(doc["threads"])
    for ident, name in names.items():  # threading's own names, read from its _active table
        if ident in by_id:
            assert by_id[ident]["name"] == name
    assert {by_id[i]["name"] for i in truth} >= {"t-sleep", "t-read", "t-deadlock_a", "t-deadlock_b"}
    # the busy thread: the same functions (its line moves)
    spin = by_id[spin_id]
    assert [f["name"] for f in spin["frames"]] == [s[0] for s in spin_truth]
    assert sum(t["holds_gil"] for t in doc["threads"]) <= 1
    # the only thread that wants the GIL is the spinner: it holds it at (nearly) every read
    held = [spin["holds_gil"]] + [{str(t["thread_id"]): t for t in _dump_json(pid, capsys)["threads"]}[spin_id]
                                  ["holds_gil"] for _ in range(4)]
    assert any(held)


def test_dump_text_names_every_thread(target, capsys):
    pid, truth = target(pythons()[-1])
    capsys.readouterr()
    assert main(["dump", str(pid)]) == 0
    text = capsys.readouterr().out
    assert "MainThread" in text
    assert text.count("\nThread ") >= len(truth) - 2  # the parked threads (main among them) and the spinner
    assert "sleeper_leaf (" in text and "lock_ab (" in text and "spin_leaf (" in text


def test_gone_and_not_python_exit_2(tmp_path, capsys):
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert main(["dump", str(p.pid)]) == 2
        err = capsys.readouterr().err.strip()
        assert "not CPython" in err and len(err.splitlines()) == 1
    finally:
        p.kill()
        p.wait()
    assert main(["dump", str(p.pid)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"no process {p.pid}" in err and len(err.splitlines()) == 1
    for minor in (9, 6):  # pythons this reader does not know: named, not misread
        exe = sorted(glob.glob(os.path.join(PYENV, "versions", f"3.{minor}.*", "bin", f"python3.{minor}")))[-1]
        old = subprocess.Popen([exe, "-c", "print('ready', flush=True); import time; time.sleep(30)"],
                               stdout=subprocess.PIPE, text=True)
        try:
            assert old.stdout.readline().strip() == "ready"
            assert main(["dump", str(old.pid)]) == 2
            err = capsys.readouterr().err.strip()
            assert f"3.{minor}" in err and "3.10-3.13" in err and len(err.splitlines()) == 1
        finally:
            old.kill()
            old.wait()


def test_permission_denied_names_cause_and_fix(target):
    """The collector as user nobody, the target root's: one line naming both, exit 2."""
    pid, _ = target(pythons()[-1])
    code, err = cli_as_nobody(["dump", str(pid)])
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "permission denied" in lines[0] and "'root'" in lines[0] and "sudo" in lines[0]


LINES_REF = textwrap.dedent('''
    import json, sys, dis
    def walk(code):
        yield code
        for c in code.co_consts:
            if hasattr(c, "co_code"):
                yield from walk(c)
    import threading, json.decoder
    out = []
    for mod in (threading, json.decoder, dis):
        src = open(mod.__file__).read()
        for code in walk(compile(src, mod.__file__, "exec")):
            lines = {}
            for start, end, line in code.co_lines():
                for off in range(start, end, 2):
                    lines[off] = line or 0
            out.append([code.co_linetable.hex(), code.co_firstlineno, lines])
    print(json.dumps(out))
''')


@pytest.mark.parametrize("python", pythons(), ids=lambda p: os.path.basename(p))
def test_line_tables_decode_as_the_interpreter_does(python):
    """Every instruction offset of three stdlib modules' code objects: the line that the interpreter's
    own co_lines() gives (its reference), decoded from the raw co_linetable bytes."""
    res = subprocess.run([python, "-c", LINES_REF], capture_output=True, text=True, check=True)
    ver = tuple(int(x) for x in subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                                               capture_output=True, text=True, check=True).stdout.split())
    checked = 0
    for table_hex, first, lines in json.loads(res.stdout):
        table = bytes.fromhex(table_hex)
        for off, line in lines.items():
            assert line_for_offset(ver, table, first, int(off)) == line, (off, first)
            checked += 1
    assert checked > 5_000


def test_attach_gives_a_result_every_reporter_takes(target, tmp_path, capsys):
    pid, _ = target(pythons()[0])
    out = tmp_path / "reports"
    assert main(["attach", str(pid), "--duration-ms", "400", "-r", "json,speedscope,collapsed", "-o", str(out)]) == 0
    from omniprof.core.readers import read_any

    result = read_any(str(next(p for p in out.iterdir() if p.name.endswith(".json") and "speedscope" not in p.name)))
    part = result.parts[0]
    names = {part.frames[i].name for s in part.stacks for i in s}
    assert {"sleeper_leaf", "lock_ab", "lock_ba", "spin_leaf", "main_leaf"} <= names
    assert part.samples and all(s.weight_ns > 0 for s in part.samples)
    os.kill(pid, signal.SIGKILL)


def test_attach_weights_cover_the_capture_and_survive_the_target_exiting(tmp_path):
    """A target that exits mid-capture: the capture ends there and keeps what it sampled; each thread's
    samples together weigh the time the thread was watched (measured here, around the capture)."""
    from omniprof.live.attach import AttachOptions, attach

    code = "import time\ndef park():\n    time.sleep(1.0)\nprint('ready', flush=True)\npark()\n"
    p = subprocess.Popen([pythons()[-1], "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter_ns()
    result = attach(p.pid, AttachOptions(interval_s=0.01, duration_s=30))  # the target ends it, not the 30 s
    watched_ns = time.perf_counter_ns() - t0
    p.wait()
    part = result.part("cpu")
    assert part.summaries["overhead"]["target_exited"]
    assert watched_ns < 20e9
    weights = sum(s.weight_ns for s in part.samples)
    assert 0.5 * watched_ns < weights <= watched_ns  # one thread: its samples span the capture
    # (a thread with no Python frame, the interpreter starting or ending, is a sample with an empty stack)
    parked = [s for s in part.samples if part.stacks[s.stack_id] and part.frames[part.stacks[s.stack_id][-1]].name
              == "park"]
    assert sum(s.weight_ns for s in parked) > 0.5 * weights


def test_attach_ctrl_c_reports_what_was_sampled(target, tmp_path):
    pid, _ = target(pythons()[-1])
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    c = subprocess.Popen([sys.executable, "-m", "omniprof", "attach", str(pid), "-r", "json", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert "Ctrl-C to stop" in c.stderr.readline()  # sampling has begun
    time.sleep(0.5)
    c.send_signal(signal.SIGINT)
    _, err = c.communicate(timeout=60)
    assert c.returncode == 0, err
    from omniprof.core.readers import read_any

    result = read_any(str(next(out.iterdir())))
    part = result.parts[0]
    assert {"lock_ab", "sleeper_leaf", "spin_leaf"} <= {f.name for f in part.frames}

    def leaf(s):
        return part.frames[part.stacks[s.stack_id][-1]].name if part.stacks[s.stack_id] else ""

    # the kernel's word on each thread: the sleeper is never running, the spinner mostly is
    sleeping = [s.idle for s in part.samples if leaf(s) == "sleeper_leaf"]
    spinning = [s.idle for s in part.samples if leaf(s) == "spin_leaf"]
    assert sleeping and all(sleeping)
    assert spinning and sum(spinning) < len(spinning) / 2


CHURN = textwrap.dedent(r'''
    for k in range(12):  # f<k> calls f<k+1> while n > k: each its own code object
        exec("def f%d(n):\n    if n > %d:\n        return f%d(n)\n    return sum(range(50))\n" % (k, k, k + 1))
    print("ready", flush=True)
    i = 0
    while True:  # a stack that grows and shrinks all the time: f0 -> f1 -> ... -> f<depth>
        f0(i % 12)
        i += 7
''')


@pytest.mark.parametrize("python", [pythons()[0], pythons()[-1]], ids=lambda p: os.path.basename(p))
def test_attach_on_a_churning_stack_never_records_an_impossible_stack(python):
    """Every stack the program can have is f0, f1, ..., fk in order under <module>: a read torn by the
    running thread must be dropped (counted), never recorded as some other stack."""
    from omniprof.live.attach import AttachOptions, attach

    p = subprocess.Popen([python, "-c", CHURN], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        result = attach(p.pid, AttachOptions(interval_s=0.001, duration_s=1.5))
    finally:
        p.kill()
        p.wait()
    part = result.part("cpu")
    seen = 0
    for s in part.samples:
        names = [part.frames[i].name for i in part.stacks[s.stack_id]]
        assert names[0] == "<module>", names
        fs = names[1:]
        assert fs == [f"f{k}" for k in range(len(fs))], names
        seen += len(fs) > 0
    assert seen > 20
