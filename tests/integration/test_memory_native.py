"""The memory backend's C extension (_allocsampler) on every CPython this machine has (3.10-3.13).

Its instance reader (``instance_state``, which the heap snapshot uses instead of ``__dict__``)
follows each version's private object layout: 3.10 a dict slot, 3.11 a values pointer and a dict
pointer before the object, 3.12 one tagged pointer for either, 3.13 values inline after the object.
Its frame reader (``frame_locals``) reads a running function's locals in place (3.11+ keeps them
in the interpreter's frame, which the collector does not list). Each is built here with that
interpreter's own headers and checked under it by tests/tools/allocsampler_check.py against
independent truths; a heap snapshot taken under each (tests/tools/heapsnapshot_version_check.py)
is read back with DevTools' own loader.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tools import NODE_MODULES, build_extension, cpython_interpreters, node_package

ROOT = Path(__file__).resolve().parents[2]
CHECKS = 30  # every check allocsampler_check.py makes on 3.11+ (27 on 3.10: no values array there)


@pytest.mark.slow
@pytest.mark.parametrize("version,exe", cpython_interpreters(), ids=[v for v, _ in cpython_interpreters()])
def test_allocsampler_on_every_cpython(version, exe, tmp_path):
    """Built without a warning, then: attribute values read for 10,000 instances are the very
    objects getattr gives; reading them builds no dict and leaves nothing (objects counted by type
    with gc before and after; on 3.11+ no instance refers to a dict); after ``__dict__`` was asked
    for, that dict is returned, with a new key, a deleted and a changed attribute read right;
    __slots__, 40 attributes (beyond the shared keys), a variable-size int subclass and a function's
    dict; a frame's locals (its own, another thread's, a suspended generator's) are the objects the
    function bound, a cell variable as its cell, and a finished generator's frame is left to the
    collector on 3.11+; the values array's bytes plus sys.getsizeof equal what tracemalloc saw
    allocated per instance; the sampler at rate 1 records 100 buffers at their line, innermost frame
    first, freed or alive as they are, with their type and thread; 20,000 sampled blocks alive at
    once, half freed, are each seen as they are; and 1 EiB asked of malloc and of calloc (refused)
    is neither counted nor recorded."""
    build_extension(exe, ROOT / "omniprof/backends/memory/_allocsampler.c", tmp_path)
    run = subprocess.run([exe, str(ROOT / "tests/tools/allocsampler_check.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{version}:\n{run.stdout}\n{run.stderr[-3000:]}"
    assert "FAIL" not in run.stdout
    assert run.stdout.count("OK ") == (CHECKS - 3 if version == "3.10" else CHECKS), run.stdout


HEAP_CHECKS = 4  # OK lines heapsnapshot_version_check.py prints on 3.11+ (3 on 3.10: no instance-dict probe)


def _names(node):
    """attribute name -> (target name, target type) as DevTools shows them from the object itself:
    property edges (attributes kept in the object) and shortcuts (past a dict that keeps them)."""
    return {e["name"]: (e["to"], e["toType"]) for e in node["edges"] if e["type"] in ("property", "shortcut")}


def _dict_names(node):
    """the same, read through the object's "__dict__" edge (None when it has none)."""
    d = next((e for e in node["edges"] if e["name"] == "__dict__"), None)
    return None if d is None else {e["name"]: (e["to"], e["toType"]) for e in d["edges"] if e["type"] == "property"}


@pytest.mark.slow
@pytest.mark.parametrize("version,exe", cpython_interpreters(), ids=[v for v, _ in cpython_interpreters()])
def test_heap_snapshot_on_every_cpython(version, exe, tmp_path):
    """take_heap_snapshot under each CPython, with the reader built for it, read back with DevTools'
    own loader (tests/tools/heapsnapshot_nodes.mjs). The truths come from how the objects were made:
    each of 2,000 instances is reached by exactly the attributes its constructor set, each edge
    ending at the value it was given (its unique label string, its number, a list), whether the
    attributes live in a values array, a dict slot or a dict built on purpose (two, one with a key
    the class never shared); 40-attribute instances likewise; a running function's locals hold
    what only they hold (distance 3 from the root: root, frame, list), so 50 owners of a 10 KiB
    buffer retain it and are dominated by their list (with __slots__ too); an instance's shallow
    size in DevTools is the bytes tracemalloc saw allocated for it (object and values array, or
    object and dict on 3.10). In the process: objects counted by type with gc before and after
    (nothing left behind, no dict built) and, on 3.11+, no instance refers to a dict. Attributes a
    dict keeps are named from the object too (shortcut edges), as on every version they are to a user."""
    node_package("heap-snapshot-toolkit")
    build_extension(exe, ROOT / "omniprof/backends/memory/_allocsampler.c", tmp_path)
    run = subprocess.run([exe, str(ROOT / "tests/tools/heapsnapshot_version_check.py"), str(ROOT), str(tmp_path),
                          str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{version}:\n{run.stdout}\n{run.stderr[-3000:]}"
    assert "FAIL" not in run.stdout
    assert run.stdout.count("OK ") == (HEAP_CHECKS - 1 if version == "3.10" else HEAP_CHECKS), run.stdout
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["version"] == version
    proc = subprocess.run(["node", str(ROOT / "tests/tools/heapsnapshot_nodes.mjs"), str(tmp_path / "h.heapsnapshot"),
                           "--edges", "Item", "Wide", "Plain", "Owner", "SlottedOwner", "frame"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMNIPROF_NODE_MODULES": str(NODE_MODULES)})
    assert proc.returncode == 0, proc.stderr
    by: dict[str, list[dict]] = {}
    for n in json.loads(proc.stdout)["nodes"]:
        by.setdefault(n["name"], []).append(n)
    assert {k: len(v) for k, v in by.items() if k != "frame"} == {
        "Item": 2_000, "Wide": 3, "Plain": truth["plains"], "Owner": truth["owners"], "SlottedOwner": truth["slotted"]}

    # Every instance: exactly its attributes, each to the value the constructor gave it.
    seen = set()
    for n in by["Item"]:
        names = _names(n)
        label = names["label"][0]
        want = truth["items"][label]
        expected = {"label": (label, "string"), "num": (str(want["num"]), "number"), "tags": ("list", "object")}
        if label == truth["extra"]:
            expected["extra"] = ("list", "object")
        assert names == expected, (label, names)
        in_dict = _dict_names(n)
        # a dict is there only where one exists: built on purpose, or 3.10's, kept by every instance;
        # and it holds the same attributes
        assert (in_dict is not None) == (label in truth["built"] or version == "3.10"), (label, n["edges"])
        assert in_dict is None or in_dict == expected, (label, in_dict)
        seen.add(label)
    assert seen == set(truth["items"])
    for n in by["Wide"]:
        names = _names(n)
        assert set(names) == {"label", *truth["wides"][names["label"][0]]}
        assert all(names[f"a{k}"] == ("list", "object") for k in range(40))
        assert _dict_names(n) == names  # past the class's shared keys: a dict keeps them, on every version

    # What only a running function holds is reachable, owned and dominated as it is.
    for cls in ("Owner", "SlottedOwner"):
        for n in by[cls]:
            assert n["distance"] == 3 and n["dominator"] == "list", n  # root -> frame -> list -> instance
            assert n["retained"] >= n["self"] + 10_240, n
    frame_locals = {e["name"] for f in by["frame"] for e in f["edges"] if e["type"] == "property"}
    assert {"items", "owners", "slotted", "plains"} <= frame_locals, frame_locals

    # Shallow size against tracemalloc (the class settled before it was measured).
    for n in by["Plain"]:
        size = n["self"] + sum(e["toSelf"] for e in n["edges"] if e["name"] == "__dict__")
        assert size == truth["plain_bytes"], (size, truth["plain_bytes"])
