"""``omniprof diff A B --fail-on-regression`` on real runs, as a CI job has them: one run a side."""

from __future__ import annotations

import json

from tests.integration.test_cli_edges import omniprof, script

# Twelve functions of similar size, one of them (``f3``) made ``sys.argv[1]`` times slower.
WORKLOAD = """
    import sys
    SLOW = int(sys.argv[1])
    # twelve functions, each its own loop, so each is the leaf of its own samples
    exec(compile("".join(f"def f{k}(n):\\n    s = 0\\n    for i in range(n * (SLOW if {k} == 3 else 1)):\\n"
                         f"        s += i % 7\\n    return s\\n" for k in range(12)), __file__, "exec"))
    fs = [globals()[f"f{k}"] for k in range(12)]
    for _ in range(40):
        for f in fs:
            f(4000)
"""


def test_identical_runs_pass_and_a_function_made_3x_slower_is_the_only_one_flagged(tmp_path):
    """Two runs of the same script pass the gate (exit 0). Against a run with one function made 3x
    slower, the gate flags that function or nothing -- never another -- and its share is the one
    that grew most. (Whether it is flagged depends on how many samples the machine's load left
    the runs: tests/unit/analysis/test_significance.py shows it always is with enough of them;
    benchmarks/diff_gate.py measures the rate here.)"""
    prog = script(tmp_path, "work.py", WORKLOAD)
    paths = {}
    for name, slow in (("a", "1"), ("b", "1"), ("c", "3")):
        proc = omniprof("run", "--no-config", "-r", "json", "-o", str(tmp_path / name), str(prog), slow)
        assert proc.returncode == 0, proc.stderr
        paths[name] = tmp_path / name / "omniprof.result.json"
    same = omniprof("diff", str(paths["a"]), str(paths["b"]), "--fail-on-regression")
    assert same.returncode == 0, same.stdout
    slower = omniprof("diff", str(paths["a"]), str(paths["c"]), "--fail-on-regression", "--format", "json")
    assert slower.returncode in (0, 1), slower.stderr
    rows = json.loads(slower.stdout)["tables"][0]["rows"]
    flagged = {r["key"].split()[0] for r in rows if r["regressed"]} - {"(total)"}
    assert flagged <= {"f3"} and (slower.returncode == 1) == bool(flagged), flagged
    grew = max(rows[1:], key=lambda r: r["b_share_pct"] - r["a_share_pct"])
    assert grew["key"].split()[0] == "f3", grew
