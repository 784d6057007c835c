"""``omniprof run -O python_tracer_level=1``: one span per call, as ``Profiler(options=ProfileOptions(
python_tracer_level=1))`` records them (docs/backends/cpu.md), for every kind of target."""

from __future__ import annotations

import collections

import omniprof
from tests.integration.test_cli_edges import omniprof as run_cli, script

PROG = """
    CALLS = 0

    def g(i):
        global CALLS
        CALLS += 1
        return i + 1

    def main():
        for i in range(3000):
            g(i)
        print("calls", CALLS)

    if __name__ == "__main__":
        main()
"""


def test_the_python_tracer_records_every_call_of_a_script_and_a_function_target(tmp_path):
    """A script and a ``module:function`` target under ``-O python_tracer_level=1``: the result
    holds one ``g`` span per call the program counted itself, and the target's own entry
    (``<module>`` or ``main``), not omniprof's frames."""
    prog = script(tmp_path, "tracee.py", PROG)
    for target, out in ((str(prog), "s"), ("tracee:main", "f")):
        proc = run_cli("run", "--no-config", "-O", "python_tracer_level=1", "-r", "json", "-o", str(tmp_path / out),
                       target, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        calls = int(proc.stdout.split("calls")[1].split()[0])
        spans = omniprof.load(tmp_path / out / "omniprof.result.json").part("cpu").spans
        names = collections.Counter(s.name for s in spans if s.category == "python")
        assert calls == 3000 and names["g"] == calls, names.most_common(5)
        assert ("<module>" if out == "s" else "main") in names
        assert not [s for s in spans if "runner" in str(s.args.get("file", ""))]
