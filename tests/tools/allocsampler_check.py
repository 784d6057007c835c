"""Checks of the memory backend's C extension alone, runnable by any CPython 3.10-3.13 without
omniprof's dependencies: ``python allocsampler_check.py DIR`` where DIR holds ``_allocsampler``
built for that interpreter (tests/integration/test_memory_native.py builds it with that
interpreter's own headers).

Prints one ``OK name detail`` or ``FAIL name detail`` line per check; exit status 1 on any FAIL.
The truths are independent of the extension: attribute values are the ones the constructor set
(read back with getattr, which builds no dict), a frame's locals the objects the function bound,
"no dict built" is objects counted by type with gc before and after, and the values array's size
is what tracemalloc saw allocated.
"""

from __future__ import annotations

import collections
import gc
import sys

from checklines import check, finish, traced_bytes_each  # this directory is sys.path[0]

A = None  # the extension, imported by main() from the directory given
V = sys.version_info[:2]


class Item:
    def __init__(self, i):
        self.num = i
        self.text = "t" + str(i)
        self.tags = [i]  # a container: a dict built from these attributes would be tracked by gc
        self.none = None


ITEM_ATTRS = ("num", "text", "tags", "none")


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a, self.b = 1, [2]


class Wide:
    """More attributes than a type's shared keys hold (30): CPython moves them to a dict."""

    def __init__(self):
        for k in range(40):
            setattr(self, f"a{k}", [k])


class BigInt(int):
    """A variable-size object with a __dict__ (its slot is at a negative offset, from the end)."""


class Plain:
    def __init__(self):
        self.a = 1
        self.b = "x"
        self.c = None


def state_map(obj):
    """name -> value as the extension reads them: the values array's pairs, then the dict's."""
    attrs, d, _ = A.instance_state(obj)
    out = dict(attrs or ())
    if d is not None:
        out.update(dict.items(d))
    return out


def same(got, names, obj):
    """Every name holds the very object getattr gives, and nothing else is there."""
    return set(got) == set(names) and all(got[k] is getattr(obj, k) for k in names)


def by_type():
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def main():
    global A
    sys.path.insert(0, sys.argv[1])
    import _allocsampler

    A = _allocsampler
    print(f"python {sys.version.split()[0]}")

    # 1. values read equal the real ones, for every instance
    items = [Item(i) for i in range(10_000)]
    bad = [i for i, it in enumerate(items) if not same(state_map(it), ITEM_ATTRS, it)]
    attrs, d, vb = A.instance_state(items[5])
    layout = "values array" if attrs is not None else "dict" if d is not None else "nothing"
    check("attrs_equal", not bad, f"{len(bad)} of {len(items)} differ; read from the {layout}")
    if V >= (3, 11):
        check("attrs_from_values_array", attrs is not None and d is None, f"attrs {attrs!r} dict {d!r}")
        check("values_bytes_positive", vb > 0 and vb % 8 == 0, str(vb))
    else:
        check("dict_read_in_place", d is not None and attrs is None and vb == 0, f"{type(d).__name__} {vb}")

    # 2. reading them builds no dict and leaves nothing behind (objects counted by type)
    by_type()  # Counter's first use fills caches
    c0 = by_type()
    c1 = by_type()  # what counting itself leaves: the counter c0
    for it in items:
        A.instance_state(it)
    c2 = by_type()
    calib, after = dict(c1 - c0), dict(c2 - c1)
    check("nothing_left_behind", after == calib and not dict(c1 - c2), f"calibration {calib} after {after}")
    if V >= (3, 11):
        holds_dict = sum(any(type(r) is dict for r in gc.get_referents(it)) for it in items)
        check("no_instance_dict", holds_dict == 0, f"{holds_dict} instances refer to a dict")

    # 3. once __dict__ was asked for, that dict is the one returned, and the values still read right
    it = items[7]
    real = it.__dict__  # builds it (3.11+), for good
    attrs, d, _ = A.instance_state(it)
    check("dict_after_materialised", d is real and same(state_map(it), ITEM_ATTRS, it),
          f"attrs {'None' if attrs is None else len(attrs)}")
    real["extra"] = [1]  # a key the type's shared keys never saw
    check("dict_new_key", same(state_map(it), ITEM_ATTRS + ("extra",), it), str(sorted(state_map(it))))
    it2 = items[8]
    del it2.text
    check("deleted_attr", same(state_map(it2), ("num", "tags", "none"), it2), str(sorted(state_map(it2))))
    it3 = items[9]
    it3.num = "changed"
    check("changed_attr", state_map(it3)["num"] == "changed" and same(state_map(it3), ITEM_ATTRS, it3))

    # 4. other layouts
    s = Slotted()
    check("slots", A.instance_state(s) == (None, None, 0), repr(A.instance_state(s)))
    w = Wide()
    check("wide", same(state_map(w), [f"a{k}" for k in range(40)], w), f"{len(state_map(w))} attrs")
    b = BigInt(10**40)
    check("varsize_no_dict_yet", A.instance_state(b)[1] is None, repr(A.instance_state(b)))
    b.tag = [1]
    check("varsize_dict", A.instance_state(b)[1] is b.__dict__ and state_map(b) == {"tag": b.tag})
    check("builtin_objects", A.instance_state(42) == (None, None, 0) and A.instance_state([1]) == (None, None, 0))
    f = lambda: 0  # noqa: E731 -- a function: a dict slot at a positive offset, empty until used
    f.marker = [1]
    check("function_dict", A.instance_state(f)[1] is f.__dict__)

    # 5. a running frame's locals, read in place: the very objects bound, named as in the source
    import threading

    def probe(arg):
        kept = [1]
        text = "probe-text"

        def inner():
            return kept  # kept becomes a cell variable

        return dict(A.frame_locals(sys._getframe())), arg, kept, text, inner

    got, arg, kept, text, inner = probe(Plain())
    cell = got.get("kept")
    check("frame_locals_self", got.get("arg") is arg and got.get("text") is text and got.get("inner") is inner
          and type(cell).__name__ == "cell" and cell.cell_contents is kept
          and set(got) == {"arg", "kept", "text", "inner"}, str(sorted(got)))
    ready, release, marker = threading.Event(), threading.Event(), [object()]

    def waiter(held):
        ready.set()
        release.wait(30)

    t = threading.Thread(target=waiter, args=(marker,))
    t.start()
    ready.wait(30)
    f = sys._current_frames()[t.ident]
    while f is not None and f.f_code.co_name != "waiter":
        f = f.f_back
    other = dict(A.frame_locals(f)) if f is not None else {}
    release.set()
    t.join()
    check("frame_locals_other_thread", other.get("held") is marker, str(sorted(other)))

    def gen(held):
        yield held

    g = gen(marker)
    next(g)
    suspended = A.frame_locals(g.gi_frame)
    check("frame_locals_suspended", suspended is not None and dict(suspended).get("held") is marker,
          repr(suspended)[:80])
    frame = g.gi_frame
    for _ in g:  # runs to its end: the frame object keeps a copy of its data, which the collector visits
        pass
    finished = A.frame_locals(frame)
    check("frame_locals_finished", finished is None if V >= (3, 11) else isinstance(finished, list),
          repr(finished)[:80])
    del g, frame

    # 6. the values array's bytes, against what tracemalloc saw allocated per instance (the type
    #    settled first: the first instances of a class get larger arrays, read as a lower bound)
    warm, made, per = traced_bytes_each(Plain)
    vbs = {A.instance_state(p)[2] for p in made}
    if V >= (3, 11):
        want = sys.getsizeof(made[0]) + next(iter(vbs))
        check("values_bytes_exact", len(vbs) == 1 and per == want,
              f"traced per instance {per} = getsizeof {sys.getsizeof(made[0])} + values_bytes {vbs}")
        early = A.instance_state(warm[0])[2]
        check("values_bytes_first_instances", early >= next(iter(vbs)), f"{early}")
    else:
        check("values_bytes_none", vbs == {0}, str(vbs))
    del warm

    # 7. the sampler itself: every allocation at rate 1, with its stack, type and liveness
    def alloc_site():
        return [bytearray(5_000) for _ in range(50)]  # SITE

    site_line = next(i for i, ln in enumerate(open(__file__).read().splitlines(), 1) if ln.endswith("# SITE"))
    A.start(1.0, 100_000, 64, 7, False)
    kept = alloc_site()
    widgets = [Plain() for _ in range(300)]
    gone = alloc_site()
    del gone
    A.stop()
    recs, stats = A.take({id(Plain): "Plain", id(bytearray): "bytearray"})
    big = [r for r in recs if 5_000 <= r[1] < 5_200]

    def names(r):
        return [code.co_name for code, _ in r[5]]

    # innermost first: the list comprehension's own frame on 3.10/3.11, then alloc_site, then main
    at_site = [r for r in big if r[5] and r[5][0][0].co_filename == __file__ and r[5][0][1] == site_line
               and "alloc_site" in names(r)[:2]]
    check("sampler_sites", len(at_site) == 100, f"{len(at_site)} of 100 buffers at line {site_line} "
          f"(first stack {big[0][5][:2] if big else None})")
    check("sampler_stack_root_last", bool(at_site) and all(
        names(r)[names(r).index("alloc_site") + 1] == "main" for r in at_site), str(names(at_site[0]) if at_site else ""))
    check("sampler_liveness", sorted(r[3] for r in at_site) == [0] * 50 + [1] * 50)
    check("sampler_types", sum(r[6] == "Plain" for r in recs) == 300, f"{sum(r[6] == 'Plain' for r in recs)} Plain")
    # at rate 1 every allocation is recorded: the exact count (kept without a counter of its own on
    # the hot path) equals the records made one by one
    check("sampler_totals", stats["allocations"] == len(recs) == stats["sampled"] >= 400 and stats["dropped"] == 0,
          str({k: stats[k] for k in ("allocations", "sampled", "dropped")}))

    def workload():
        kept = [str(i) * 3 for i in range(20_000)]
        big = [bytearray(100_000) for _ in range(10)]  # above always_bytes: counted apart
        return len(kept) + len(big)

    workload()
    totals = {}
    for rate in (1.0, 0.0, 0.01):
        A.start(rate, 1_000_000, 8, 11, False, 65_536)
        workload()
        A.stop()
        recs, stats = A.take(None)
        totals[rate] = (stats["allocations"], stats["allocated_bytes"], len(recs))
    (n1, b1, r1), (n0, b0, r0), (n2, b2, _) = totals[1.0], totals[0.0], totals[0.01]
    # the same workload allocates the same to within a few blocks (freelists, caches), whatever the rate
    check("sampler_totals_every_rate", r1 == n1 and r0 == 0 and all(abs(n - n1) <= 10 and abs(b - b1) <= 1_000
                                                                    for n, b in ((n0, b0), (n2, b2))), str(totals))
    check("sampler_thread", {r[2] for r in at_site} == {threading.get_ident()})

    # many sampled blocks alive at once (the live counts in front of the map fill up): every free
    # of one is seen, and no block is called freed that was not
    A.start(1.0, 1_000_000, 4, 9, False)
    blocks = [bytearray(3_000 + (k % 7)) for k in range(20_000)]
    for k in range(0, 20_000, 2):
        blocks[k] = None
    A.stop()
    recs, _ = A.take(None)
    state = collections.Counter((r[1] - 3_000, r[3]) for r in recs if 3_000 <= r[1] < 3_007 + 57)
    freed = sum(n for (_, f), n in state.items() if f)
    alive = sum(n for (_, f), n in state.items() if not f)
    check("many_live_blocks", freed == 10_000 and alive == 10_000, f"freed {freed} alive {alive}")
    del blocks

    # an allocation the allocator refuses (MemoryError) is no allocation: not counted, not recorded,
    # whether it was the sampled one (rate 1, no size stratum) or a large one (always recorded)
    def refused():
        n = 0
        for make in (lambda: b"x" * 2**60, lambda: bytes(2**60)):  # 1 EiB from malloc, then calloc: refused
            try:
                make()
            except MemoryError:
                n += 1
        return n

    failed = {}
    for rate, always in ((1.0, 0), (0.01, 65_536)):
        A.start(rate, 100_000, 8, 5, False, always)
        refused_n = refused()
        small = [bytearray(100) for _ in range(20)]
        A.stop()
        recs, stats = A.take(None)
        failed[rate] = (refused_n, stats["allocations"], len(recs), stats["allocated_bytes"], len(small))
    (r1, n1, k1, b1, _), (r2, _, _, b2, _) = failed[1.0], failed[0.01]
    check("refused_allocation_not_counted", r1 == r2 == 2 and n1 == k1 and b1 < 2**40 and b2 < 2**40
          and all(rec[1] < 2**40 for rec in recs), str(failed))
    del kept, widgets

    finish()


if __name__ == "__main__":
    main()
