"""``omniprof assemble`` and the progress callback of ``assemble_snapshot`` it draws."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from omniprof.backends.memory.heapsnapshot import assemble_snapshot

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import sys
sys.path.insert(0, {root!r})
from omniprof.memory import take_heap_snapshot
keep = [{{"k": [str(i), i]}} for i in range({n})]
take_heap_snapshot({prefix!r}, streaming=True)
"""


def parts(tmp_path: Path, n: int = 40_000) -> Path:
    """The parts of a real streaming snapshot taken in a child process holding ``n`` small dicts."""
    prefix = tmp_path / "app.heapsnapshot"
    subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), n=n, prefix=str(prefix))], check=True,
                   timeout=300)
    return prefix


def omniprof(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "omniprof", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_progress_callback_counts_every_byte_read(tmp_path):
    """progress(done, total): total is the parts' sizes (the edges part twice: it is read twice),
    done never goes back, several calls on parts of a few MiB, and it ends at done == total. The
    file is the same with and without the callback."""
    prefix = parts(tmp_path)
    size = {ext: os.path.getsize(f"{prefix}{ext}") for ext in (".nodes", ".edges", ".strings")}
    want_total = size[".nodes"] + 2 * size[".edges"] + size[".strings"]
    assert want_total > 3 << 20  # big enough for several MiB steps
    calls: list[tuple[int, int]] = []
    counts = assemble_snapshot(prefix, tmp_path / "with.heapsnapshot", progress=lambda d, t: calls.append((d, t)))
    assemble_snapshot(prefix, tmp_path / "without.heapsnapshot")
    assert (tmp_path / "with.heapsnapshot").read_bytes() == (tmp_path / "without.heapsnapshot").read_bytes()
    assert {t for _, t in calls} == {want_total}
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == want_total and len(done) >= 4
    assert counts["complete"] == 1


def test_cli_assembles_and_says_what_it_wrote(tmp_path):
    """`omniprof assemble PREFIX.nodes -o OUT`: a part's name works as the prefix; the one line on
    stderr names the file and its counts, which are those of the file read back and of the parts'
    own lines; nothing is drawn on a pipe."""
    prefix = parts(tmp_path, n=2_000)
    out = tmp_path / "out.heapsnapshot"
    proc = omniprof("assemble", f"{prefix}.nodes", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    node_lines = len(Path(f"{prefix}.nodes").read_text().splitlines())
    assert doc["snapshot"]["node_count"] == node_lines
    assert proc.stderr == (f"omniprof: heap snapshot written to {out} ({node_lines:,} nodes, "
                           f"{doc['snapshot']['edge_count']:,} edges)\n")
    assert proc.stdout == ""


def test_cli_default_output_is_the_prefix_and_existing_files_are_kept(tmp_path):
    prefix = parts(tmp_path, n=2_000)
    first = omniprof("assemble", str(prefix), cwd=tmp_path)
    assert first.returncode == 0 and prefix.is_file(), first.stderr
    before = prefix.read_bytes()
    again = omniprof("assemble", str(prefix), cwd=tmp_path)
    assert again.returncode == 2 and prefix.read_bytes() == before
    assert again.stderr.count("\n") == 1 and "exists and is never replaced" in again.stderr and "-o FILE" in again.stderr


def test_cli_user_mistakes_are_one_line(tmp_path):
    proc = omniprof("assemble", str(tmp_path / "nothing"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "not the prefix of a streaming heap snapshot" in proc.stderr and "streaming=True" in proc.stderr


def test_cli_warns_about_an_unfinished_walk(tmp_path):
    """Parts without their metadata file (the process ended mid-walk) assemble with one warning line."""
    prefix = parts(tmp_path, n=2_000)
    Path(f"{prefix}.metadata.json").unlink()
    proc = omniprof("assemble", str(prefix), "-o", str(tmp_path / "o.heapsnapshot"), cwd=tmp_path)
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[1] == ("omniprof: warning: the snapshot's walk did not finish (the process "
                                            "ended during it)")
