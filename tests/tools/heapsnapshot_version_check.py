"""A heap snapshot taken under any CPython 3.10-3.13, with the instance reader (``instance_state``)
built for that interpreter, without omniprof's dependencies:
``python heapsnapshot_version_check.py ROOT EXTDIR OUT`` where ROOT is the repository, EXTDIR holds
``_allocsampler`` built with that interpreter's headers (tests/integration/test_memory_native.py
builds it) and OUT is a directory for the snapshot and the truths to check it against.

Here, in the process: ``OK name detail`` / ``FAIL name detail`` lines for what only the process
can see (exit status 1 on any FAIL): objects counted by type with gc before and after the snapshot
(nothing left behind, no instance dict built) and, on 3.11+, no instance referring to a dict.
Written for the test to check in DevTools' own loader: ``OUT/h.heapsnapshot`` and
``OUT/truth.json``, the attributes each object was given (by its unique label), the bytes
tracemalloc saw allocated per ``Plain`` instance, and which objects had their ``__dict__`` built
on purpose.
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import json
import sys
from pathlib import Path

from checklines import check, finish, traced_bytes_each  # this directory is sys.path[0]

V = sys.version_info[:2]


class Item:
    """Unique, recognisable values: the snapshot's string and number nodes are named by them."""

    def __init__(self, i):
        self.label = f"item-label-{i}"
        self.num = 1_000_000 + i
        self.tags = [i]  # a container: a dict built from these attributes would be tracked by gc


class Wide:
    """More attributes than a type's shared keys hold (30): CPython keeps them in a dict."""

    def __init__(self, i):
        self.label = f"wide-label-{i}"
        for k in range(40):
            setattr(self, f"a{k}", [k])


class Plain:
    """Three attributes, no container: its bytes are measured with tracemalloc."""

    def __init__(self):
        self.a = 1
        self.b = "x"
        self.c = 2.5


class Owner:
    """Owns one 10 KiB buffer: DevTools must give it a retained size of at least that."""

    def __init__(self):
        self.buf = bytearray(10_240)


class SlottedOwner:
    __slots__ = ("buf",)

    def __init__(self):
        self.buf = bytearray(10_240)


def by_type():
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def main():
    root, extdir, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    print(f"python {sys.version.split()[0]}")
    # The reader built for this interpreter, where heapsnapshot.py imports it from; heapsnapshot.py
    # loaded by path (omniprof's package __init__s import its dependencies, not installed here).
    sys.path.insert(0, extdir)
    import _allocsampler

    sys.modules["omniprof.backends.memory._allocsampler"] = _allocsampler
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("heapsnapshot_under_test",
                                                  root / "omniprof/backends/memory/heapsnapshot.py")
    hs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hs)
    check("reader_found", hs._c_helper("instance_state") is _allocsampler.instance_state
          and hs._c_helper("frame_locals") is _allocsampler.frame_locals)

    items = [Item(i) for i in range(2_000)]
    wides = [Wide(i) for i in range(3)]
    owners = [Owner() for _ in range(50)]
    slotted = [SlottedOwner() for _ in range(50)]
    # two instances whose dict is built on purpose, one given a key the class's shared keys never saw
    built = [items[0], items[1]]
    built[0].__dict__  # noqa: B018 -- builds it (3.11+), for good
    built[1].__dict__["extra"] = [7]
    # Plain's bytes as tracemalloc sees them allocated (the class settled first: its first
    # instances get larger values arrays)
    warm, plains, plain_bytes = traced_bytes_each(Plain)
    del warm

    path = out / "h.heapsnapshot"
    hs.take_heap_snapshot(path)  # the first one: whatever a first call caches is made here
    by_type()  # Counter's first use fills caches
    c0 = by_type()
    c1 = by_type()  # what counting itself leaves: the counter c0
    hs.take_heap_snapshot(path)
    c2 = by_type()
    calib, after = dict(c1 - c0), dict(c2 - c1)
    check("nothing_left_behind", after == calib and not dict(c1 - c2),
          f"calibration {calib} after {after} gone {dict(c1 - c2)}")
    check("no_dict_built", c2["dict"] - c1["dict"] == calib.get("dict", 0), f"dicts {c1['dict']} -> {c2['dict']}")
    if V >= (3, 11):
        holders = [it for it in items[2:] if any(type(r) is dict for r in gc.get_referents(it))]
        check("no_instance_dict", not holders, f"{len(holders)} of {len(items) - 2} instances refer to a dict")

    truth = {
        "version": f"{V[0]}.{V[1]}",
        "items": {it.label: {"num": it.num, "tags": "list"} for it in items},
        "built": [it.label for it in built],
        "extra": built[1].label,
        "wides": {w.label: [f"a{k}" for k in range(40)] for w in wides},
        "plain_bytes": plain_bytes,
        "plains": len(plains),
        "owners": len(owners),
        "slotted": len(slotted),
    }
    (out / "truth.json").write_text(json.dumps(truth))
    finish()


if __name__ == "__main__":
    main()
