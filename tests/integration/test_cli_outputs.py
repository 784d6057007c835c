"""Nothing lost to an output path: ``omniprof run`` checks where its files go before the target
runs, and a path that fails only later still leaves the text report and a saved result."""

from __future__ import annotations

import json

from tests.integration.test_cli_edges import omniprof, script

# The target leaves a mark, so a test can tell whether it ran.
MARKED = """
    import pathlib, sys
    pathlib.Path(sys.argv[1]).write_text("ran")
    print(sum(i * i for i in range(200_000)))
"""


def test_an_outdir_that_cannot_be_made_stops_before_the_target_runs(tmp_path):
    """`-o /proc/x -r table,json`: exit 2, one line naming the path and why, and the target never
    ran (its mark is absent, its output too)."""
    prog = script(tmp_path, "prog.py", MARKED)
    mark = tmp_path / "mark"
    proc = omniprof("run", "-o", "/proc/x", "-r", "table,json", str(prog), str(mark))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "omniprof: error: cannot write '/proc/x': the directory does not exist; create it or choose another "
        "output path (-o DIR) (nothing was run)"], proc.stderr
    assert not mark.exists() and proc.stdout == ""


def test_an_outdir_that_is_a_file_and_a_bad_logdir_stop_before_the_target_runs(tmp_path):
    """`-o FILE` (an existing file, not a directory) and `--logdir` under a file: exit 2 naming the
    path and the option, nothing run."""
    prog = script(tmp_path, "prog.py", MARKED)
    mark = tmp_path / "mark"
    (tmp_path / "taken").write_text("x")
    proc = omniprof("run", "-o", str(tmp_path / "taken"), "-r", "json", str(prog), str(mark))
    assert proc.returncode == 2 and not mark.exists(), proc.stderr
    assert proc.stderr.startswith(f"omniprof: error: cannot write '{tmp_path / 'taken'}': a file of that name")
    proc = omniprof("run", "--logdir", str(tmp_path / "taken" / "logs"), str(prog), str(mark))
    assert proc.returncode == 2 and not mark.exists(), proc.stderr
    assert f"cannot write '{tmp_path / 'taken' / 'logs'}'" in proc.stderr and "(nothing was run)" in proc.stderr


def test_an_outdir_that_fails_only_later_still_prints_the_table_and_saves_the_result(tmp_path):
    """The target itself replaces the output directory with a file: the json report cannot be
    written there; the table is still printed, the result is saved in the working directory (the
    next place that takes it), one line says where, and it loads back with the run's samples."""
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    prog = script(tmp_path, "prog.py", f"""
        import pathlib, shutil
        print(sum(i * i for i in range(300_000)))
        shutil.rmtree({str(out)!r}, ignore_errors=True)  # made before the run, or not
        pathlib.Path({str(out)!r}).write_text("not a directory any more")
    """)
    proc = omniprof("run", "-o", str(out), "-r", "table,json", str(prog), cwd=work)
    assert proc.returncode == 1, proc.stderr
    assert "Flat (by self time" in proc.stdout
    saved = work / "omniprof.result.json"
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"omniprof: error: cannot write '{out}'"), lines
    assert lines[1:] == [f"omniprof: a report could not be written; the result is saved in {saved} "
                         f"(omniprof report {saved} -r NAME writes any report from it)"], lines
    data = json.loads(saved.read_text())
    assert sum(len(p["samples"]) for p in data["parts"]) > 0


def test_every_reporter_flag_has_help():
    """`run --help` and `report --help` explain -r, -R and -o (each line of the option has text)."""
    for command, flags in (("run", ("-R REPORTER.KEY=VALUE",)), ("report", ("-r REPORTER", "-R REPORTER.KEY=VALUE",
                                                                           "-o OUTDIR"))):
        proc = omniprof(command, "--help")
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        for flag in flags:
            after = text.split(flag, 1)[1].split("\n  -", 1)[0]
            assert len(after.split()) > 3, (command, flag, after)
