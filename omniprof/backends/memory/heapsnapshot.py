"""Heap snapshots of the live Python object graph in Chrome DevTools' ``.heapsnapshot`` format.

The format (V8's): one JSON object with ``snapshot.meta`` describing flat integer arrays
``nodes`` (7 fields per node: type, name, id, self_size, edge_count, trace_node_id, detachedness)
and ``edges`` (3 fields: type, name_or_index, to_node, where to_node is the target's offset in
``nodes``), and a ``strings`` table that names refer to. Node 0 is a synthetic root.

Python objects map to node types: ``str`` -> string, numbers -> number, functions -> closure,
code -> code, bytes-like -> native, everything else (lists, tuples, sets and dicts too) -> object
named after its class (so DevTools' "Constructor" view groups instances by class). Not V8's
"array" type, which is an object's internal backing store: DevTools adds the size of an "array"
node with one owner to its owner's shallow size, so a list would have vanished into whoever held
it. Edges: dict items and instance attributes are ``property`` edges named by key, sequence items
``element`` edges by index, a frame's locals ``property`` edges by name, other references
``hidden`` edges; attributes kept in the object's dict are also ``shortcut`` edges from the
object (DevTools leaves those out of dominators). ``self_size`` is ``sys.getsizeof`` (or 1 for
every node with ``all_one=True``, to count objects instead of bytes, as Julia's ``all_one``).

``streaming=True`` writes ``<prefix>.nodes``, ``<prefix>.edges``, ``<prefix>.strings`` as it walks
(edges name their target by object id, so no id->index map is held), then assembles them; a
process that dies mid-walk leaves parts that :func:`assemble_snapshot` still joins.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from omniprof.core.fileio import atomic_open, atomic_write_text
from omniprof.errors import InvalidArgumentError, TraceReadError

__all__ = ["take_heap_snapshot", "assemble_snapshot", "NODE_FIELDS", "EDGE_FIELDS", "NODE_TYPES", "EDGE_TYPES"]

NODE_FIELDS = ["type", "name", "id", "self_size", "edge_count", "trace_node_id", "detachedness"]
NODE_TYPES = ["hidden", "array", "string", "object", "code", "closure", "regexp", "number", "native", "synthetic",
              "concatenated string", "sliced string", "symbol", "bigint", "object shape"]
EDGE_FIELDS = ["type", "name_or_index", "to_node"]
EDGE_TYPES = ["context", "element", "property", "internal", "hidden", "shortcut", "weak"]
T_ARRAY, T_STRING, T_OBJECT, T_CODE, T_CLOSURE, T_NUMBER, T_NATIVE, T_SYNTHETIC = 1, 2, 3, 4, 5, 7, 8, 9
E_ELEMENT, E_PROPERTY, E_INTERNAL, E_HIDDEN, E_SHORTCUT = 1, 2, 3, 4, 5
NF = len(NODE_FIELDS)
MAX_NAME = 200
_SKIP = (type(None), type(NotImplemented), type(Ellipsis))
_FUNCS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType)
ROOT_ID = 0


def _meta() -> dict[str, Any]:
    return {
        "node_fields": NODE_FIELDS,
        "node_types": [NODE_TYPES, "string", "number", "number", "number", "number", "number"],
        "edge_fields": EDGE_FIELDS,
        "edge_types": [EDGE_TYPES, "string_or_number", "node"],
        "trace_function_info_fields": ["function_id", "name", "script_name", "script_id", "line", "column"],
        "trace_node_fields": ["id", "function_info_index", "count", "size", "children"],
        "sample_fields": ["timestamp_us", "last_assigned_id"],
        "location_fields": ["object_index", "script_id", "line", "column"],
    }


def _isa(obj: Any, cls: Any) -> bool:
    """isinstance by the real type: never runs an object's own ``__class__`` (a proxy's, or a
    deprecated module attribute's that warns), so walking the heap runs no user code there."""
    return issubclass(type(obj), cls)


def _describe(obj: Any) -> tuple[int, str]:
    try:
        ntype, name = _describe_unchecked(obj)
    except Exception:  # a hostile __getattr__/__class__ must not stop the snapshot
        return T_OBJECT, type(obj).__name__
    return ntype, name if _isa(name, str) else str(name)


def _describe_unchecked(obj: Any) -> tuple[int, Any]:
    if _isa(obj, str):
        return T_STRING, obj[:MAX_NAME]
    if _isa(obj, (bool, int, float, complex)):
        return T_NUMBER, repr(obj)[:MAX_NAME]
    if _isa(obj, types.CodeType):
        return T_CODE, getattr(obj, "co_qualname", obj.co_name)
    if _isa(obj, _FUNCS):
        return T_CLOSURE, getattr(obj, "__qualname__", getattr(obj, "__name__", "function"))
    if _isa(obj, (bytes, bytearray, memoryview)):
        return T_NATIVE, type(obj).__name__
    if _isa(obj, types.ModuleType):
        return T_OBJECT, f"module {obj.__name__}"
    if _isa(obj, type):
        return T_OBJECT, f"class {obj.__qualname__}"
    return T_OBJECT, type(obj).__qualname__


def _size(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:  # objects whose __sizeof__ is broken still get a node
        return 0


def _c_helper(name: str) -> Any:
    """A C helper of the ``_allocsampler`` extension, or None where it was not built:
    ``instance_state`` reads an instance's attributes without building its ``__dict__``;
    ``frame_locals`` reads a running frame's locals in place (no ``f_locals`` built)."""
    import importlib

    try:
        ext = importlib.import_module("omniprof.backends.memory._allocsampler")
    except ImportError:
        return None
    return getattr(ext, name, None)


def _edges(obj: Any, state: Any, frame_locals: Any = None) -> tuple[list[tuple[int, Any, Any]], int]:
    """(edge type, name or index, target) for every reference held by ``obj``, and the bytes of
    its attribute values array (part of the instance on CPython 3.11+, missed by getsizeof).

    A frame running on a thread (or a generator's) names its locals through ``frame_locals`` (the
    C helper): on 3.11+ the collector does not list them, and what only a running function holds
    would be unreachable.

    Never reads ``__dict__``: on CPython 3.11+ that builds a dict an instance did not have, for
    good. Containers are read through their own iteration (no user code runs for the built-in
    types); everything else through ``gc.get_referents``, with attribute names from ``state`` (the
    C helper) when it was built, else the references are unnamed ("hidden") edges.
    """
    out: list[tuple[int, Any, Any]] = []
    if _isa(obj, dict):
        for i, (k, val) in enumerate(list(dict.items(obj))):
            if _isa(k, str):
                out.append((E_PROPERTY, k, val))
            else:
                out.append((E_INTERNAL, f"key {i}", k))
                out.append((E_INTERNAL, f"[{repr(k)[:60]}]" if _isa(k, (int, float, bytes)) else f"value {i}", val))
        return out, 0
    if _isa(obj, (list, tuple)):
        for i, item in enumerate(obj):  # list iteration tolerates concurrent changes
            out.append((E_ELEMENT, i, item))
        return out, 0
    if _isa(obj, (set, frozenset)):
        for i, item in enumerate(list(obj)):
            out.append((E_ELEMENT, i, item))
        return out, 0
    try:
        refs = gc.get_referents(obj)
    except Exception:
        return out, 0
    attrs, d, values_bytes = state(obj) if state is not None else (None, None, 0)
    if frame_locals is not None and _isa(obj, types.FrameType):
        attrs = frame_locals(obj)
    held = d if attrs is None and type(d) is dict else None  # attributes kept in a dict of the object's
    named: dict[int, int] = {}
    for k, val in attrs or ():
        out.append((E_PROPERTY, k, val))
        named[id(val)] = named.get(id(val), 0) + 1
    cls = type(obj)
    for i, r in enumerate(refs):
        rid = id(r)
        if named.get(rid):
            named[rid] -= 1  # the same reference, already named
        elif d is not None and r is d:
            out.append((E_INTERNAL, "__dict__", r))
            d = None
        elif r is cls:
            out.append((E_INTERNAL, "__class__", r))
        else:
            out.append((E_HIDDEN, i, r))
    if d is not None:
        # CPython 3.13 visits the attributes, not the dict built from them while they still live in
        # the object: the object owns that dict all the same
        out.append((E_INTERNAL, "__dict__", d))
    if held is not None:
        # Attributes that live in the object's dict (3.10's every instance, a dict built or grown
        # past the class's shared keys on 3.11+): named from the object too, as shortcut edges --
        # DevTools walks them for distances and shows them, but leaves them out of dominators and
        # retained sizes, which follow the real path through "__dict__"
        for k, val in list(dict.items(held)):
            if _isa(k, str):
                out.append((E_SHORTCUT, k, val))
    return out, values_bytes


class _Strings:
    """String table with de-duplication bounded so a huge heap cannot grow it without limit."""

    def __init__(self, sink: IO[str] | None, limit: int = 50_000) -> None:
        self.index: dict[str, int] = {}
        self.items: list[str] = []
        self.count = 0
        self.sink = sink
        self.limit = limit

    def get(self, s: str) -> int:
        i = self.index.get(s)
        if i is not None:
            return i
        i = self.count
        self.count += 1
        if len(s) <= 64 and len(self.index) < self.limit:  # names repeat; long values rarely do
            self.index[s] = i
        if self.sink is not None:
            self.sink.write(json.dumps(s) + "\n")
        else:
            self.items.append(s)
        return i


class _IdSet:
    """A set of object ids in about one bit per 16 bytes of address space actually used.

    Two live objects are at least 16 bytes apart (every object has a 16-byte header), so
    ``id >> 4`` is unique; bits live in 8 KiB chunks, one per MiB of address space touched. A
    million ids cost ~1-2 MiB here against ~60 MiB in a ``set`` of ints.
    """

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: dict[int, bytearray] = {}

    def has(self, oid: int) -> bool:
        chunk = self.chunks.get(oid >> 20)
        if chunk is None:
            return False
        bit = (oid >> 4) & 0xFFFF
        return bool(chunk[bit >> 3] & (1 << (bit & 7)))

    def add_new(self, oid: int) -> bool:
        """Add ``oid``; True if it was not there."""
        chunk = self.chunks.get(oid >> 20)
        if chunk is None:
            chunk = self.chunks[oid >> 20] = bytearray(8192)
        bit = (oid >> 4) & 0xFFFF
        mask = 1 << (bit & 7)
        byte = chunk[bit >> 3]
        if byte & mask:
            return False
        chunk[bit >> 3] = byte | mask
        return True


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the omniprof package


def _user_frame() -> types.FrameType | None:
    """The innermost frame of the current thread outside omniprof (the snapshot's caller)."""
    f: types.FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_OWN_DIR + os.sep):
        f = f.f_back
    return f


def _walk(objs: list[Any], emit_node: Any, emit_edge: Any, all_one: bool) -> tuple[int, int]:
    """Visit every live object once; emit nodes (with their edges right after). Returns counts.

    ``objs`` is ``gc.get_objects()`` taken before the snapshot made any object of its own. What
    the graph holds: those objects, the objects they reach that the collector does not track
    (strings, numbers, atomic containers), and the frames of every thread's stack (roots). Any
    other tracked object was made after ``objs`` was taken -- by the snapshot itself (its tables,
    queue, closures, frames) -- and is left out, with the edges to it: so the file describes the
    program's heap, and DevTools' retained sizes and dominators are the program's.

    Warnings raised by objects as they are looked at are the heap's business, not the user's:
    they are not shown.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _walk_quiet(objs, emit_node, emit_edge, all_one)


def _walk_quiet(objs: list[Any], emit_node: Any, emit_edge: Any, all_one: bool) -> tuple[int, int]:
    state, frame_locals = _c_helper("instance_state"), _c_helper("frame_locals")
    initial = _IdSet()  # the program's tracked objects: visited by the loop over objs below
    for o in objs:
        if not (_isa(o, types.FrameType) and o.f_code.co_filename.startswith(_OWN_DIR + os.sep)):
            initial.add_new(id(o))  # omniprof's own frames (a snapshot's callers) are left out
    queued = _IdSet()  # untracked objects (and root frames) found on the way, queued once
    in_initial, in_queued, add_queued, is_tracked = initial.has, queued.has, queued.add_new, gc.is_tracked
    pending: list[Any] = []
    nodes = edges = 0

    def wanted(r: Any) -> bool:
        if _isa(r, _SKIP):
            return False
        rid = id(r)
        return in_initial(rid) or in_queued(rid) or not is_tracked(r)

    roots: list[tuple[int, Any, Any]] = []
    for name, mod in list(sys.modules.items()):
        if mod is not None:
            roots.append((E_PROPERTY, name, mod))
    me = __import__("threading").get_ident()
    for tid, frame in sys._current_frames().items():
        if tid == me:
            frame = _user_frame()
        depth = 0
        while frame is not None:  # every frame of the stack: their locals are live
            roots.append((E_ELEMENT, tid if depth == 0 else f"{tid}/{depth}", frame))
            add_queued(id(frame))
            frame = frame.f_back
            depth += 1
    emit_node(T_SYNTHETIC, "(Python roots)", ROOT_ID, 0, len(roots))
    nodes += 1
    for etype, name, target in roots:
        if not in_initial(id(target)):
            pending.append(target)
        emit_edge(ROOT_ID, etype, name, target)
        edges += 1
    del roots

    def visit(obj: Any) -> None:
        nonlocal nodes, edges
        out, extra = _edges(obj, state, frame_locals)
        out = [e for e in out if wanted(e[2])]
        ntype, name = _describe(obj)
        emit_node(ntype, name, id(obj), 1 if all_one else _size(obj) + extra, len(out))
        nodes += 1
        for t, n, r in out:
            rid = id(r)
            if not in_initial(rid) and add_queued(rid):
                pending.append(r)
            emit_edge(id(obj), t, n, r)
            edges += 1
        out.clear()

    for obj in objs:
        if _isa(obj, _SKIP) or not in_initial(id(obj)):
            continue
        visit(obj)
        while pending:
            visit(pending.pop())
    while pending:
        visit(pending.pop())
    return nodes, edges


def _snapshot_objects() -> list[Any]:
    """The program's tracked objects, taken before the snapshot makes any of its own; a full
    collection first, so garbage waiting in a cycle is not shown as live."""
    gc.collect()
    return gc.get_objects()


def _default_path(dir: str | os.PathLike[str] | None) -> Path:
    import tempfile

    from omniprof.core.clock import strftime

    name = f"{os.getpid()}_{strftime('%Y%m%d_%H%M%S')}.heapsnapshot"
    if dir is not None:
        return Path(dir) / name
    cwd = Path.cwd()
    # As Julia's: the working directory, or the temp dir when that is not writable.
    return (cwd if _writable(cwd) else Path(tempfile.gettempdir())) / name


def _writable(d: Path) -> bool:
    """Can a file be made in ``d``? Tried, not asked (os.access says yes to root on a read-only mount)."""
    probe = d / f".omniprof-probe-{os.getpid()}-{id(d)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def take_heap_snapshot(path: str | os.PathLike[str] | IO[str] | bool | None = None, all_one: bool = False, *,
                       dir: str | os.PathLike[str] | None = None, streaming: bool = False) -> Path | IO[str]:
    """Write a snapshot of the live Python heap in Chrome DevTools' ``.heapsnapshot`` format
    (Julia's ``Profile.take_heap_snapshot``); returns where it went.

    Args:
        path: output file, or a text stream to write to (``streaming`` needs a file). Default:
            ``<pid>_<time>.heapsnapshot`` in ``dir``, else in the working directory, else (not
            writable) in the temp dir. ``take_heap_snapshot(True)`` is ``all_one=True``, as Julia's.
        all_one: every node's size is 1 (counts objects instead of bytes).
        dir: directory of the default file name.
        streaming: write the parts ``<path>.nodes``, ``<path>.edges``, ``<path>.strings`` and
            ``<path>.metadata.json`` while walking, holding neither the graph nor the output in
            memory; join them later, offline, with ``assemble_snapshot(path, out)``. Returns the
            parts' prefix.

    The snapshot leaves the heap as it was: nothing it makes is in the file or left behind, and no
    instance ``__dict__`` is built (CPython 3.11+ builds them lazily). Frames of the threads'
    stacks are read as frame objects, which CPython keeps until each function returns.

    .. versionadded:: 0.1
    """
    if isinstance(path, bool):  # take_heap_snapshot(all_one) as Julia's positional form
        path, all_one = None, path
    if not isinstance(all_one, bool):
        raise InvalidArgumentError(f"'all_one' must be True or False (got {all_one!r})")
    if path is not None and dir is not None:
        raise InvalidArgumentError("give take_heap_snapshot() a path or dir=, not both")
    stream = path if path is not None and hasattr(path, "write") else None
    if stream is not None and streaming:
        raise InvalidArgumentError("streaming=True writes four part files beside a path prefix; give a path, "
                                   "not a stream")
    target = stream if stream is not None else (_default_path(dir) if path is None else Path(path))  # type: ignore[arg-type]
    was_enabled = gc.isenabled()
    objs = _snapshot_objects()
    gc.disable()
    try:
        if streaming:
            # Parts only: joining them is assemble_snapshot's job, offline, so the heap never needs to
            # be held twice in this process.
            _stream_parts(str(target), all_one, objs)
        else:
            _write_snapshot(target, all_one, objs)
    finally:
        del objs
        if was_enabled:
            gc.enable()
    return target


def _write_snapshot(target: Path | IO[str], all_one: bool, objs: list[Any]) -> None:
    strings = _Strings(None)
    node_list: list[int] = []
    edge_list: list[int] = []
    index: dict[int, int] = {}
    pending_edges: list[int] = []  # target id of each edge, in order

    def emit_node(ntype: int, name: str, oid: int, size: int, nedges: int) -> None:
        index[oid] = len(node_list) // NF
        node_list.extend((ntype, strings.get(name), 2 * (len(node_list) // NF) + 1, size, nedges, 0, 0))

    def emit_edge(src: int, etype: int, name: Any, target: Any) -> None:
        ref = name if etype in (E_ELEMENT, E_HIDDEN) and _isa(name, int) else strings.get(str(name))
        pending_edges.append(id(target))
        edge_list.extend((etype if _isa(name, int) or etype not in (E_ELEMENT, E_HIDDEN) else E_INTERNAL, ref, 0))

    n, e = _walk(objs, emit_node, emit_edge, all_one)
    for k, tid in enumerate(pending_edges):
        edge_list[3 * k + 2] = index[tid] * NF
    del pending_edges, index
    head = {"meta": _meta(), "node_count": n, "edge_count": e, "trace_function_count": 0}

    def write(fh: IO[str]) -> None:
        # json.dump() streams through the pure-Python encoder; joining ints is ~20x faster.
        fh.write('{"snapshot":' + json.dumps(head, separators=(",", ":")) + ',"nodes":[')
        _write_ints(fh, node_list)
        fh.write('],"edges":[')
        _write_ints(fh, edge_list)
        fh.write('],"trace_function_infos":[],"trace_tree":[],"samples":[],"locations":[],"strings":')
        fh.write(json.dumps(strings.items, separators=(",", ":")))
        fh.write("}")

    if isinstance(target, Path):
        with atomic_open(target, "w", encoding="utf-8") as fh:
            write(fh)
    else:
        write(target)


def _write_ints(fh: IO[str], values: list[int], chunk: int = 1 << 16) -> None:
    for i in range(0, len(values), chunk):
        if i:
            fh.write(",")
        fh.write(",".join(map(str, values[i:i + chunk])))


def _stream_parts(prefix: str, all_one: bool, objs: list[Any] | None = None) -> None:
    if objs is None:
        objs = _snapshot_objects()
    with open(prefix + ".nodes", "w", encoding="utf-8") as nf, open(prefix + ".edges", "w", encoding="utf-8") as ef, \
            open(prefix + ".strings", "w", encoding="utf-8") as sf:
        strings = _Strings(sf)

        def emit_node(ntype: int, name: str, oid: int, size: int, nedges: int) -> None:
            nf.write(f"{oid} {ntype} {strings.get(name)} {size} {nedges}\n")

        def emit_edge(src: int, etype: int, name: Any, target: Any) -> None:
            if not _isa(name, int) and etype in (E_ELEMENT, E_HIDDEN):
                etype = E_INTERNAL  # element/hidden edges are named by index; others by string
            ref = name if etype in (E_ELEMENT, E_HIDDEN) else strings.get(str(name))
            ef.write(f"{src} {etype} {ref} {id(target)}\n")

        n, e = _walk(objs, emit_node, emit_edge, all_one)
    atomic_write_text(prefix + ".metadata.json", json.dumps({"node_count": n, "edge_count": e, "complete": True}))


def assemble_snapshot(prefix: str | os.PathLike[str], path: str | os.PathLike[str], *,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Join the parts written by a streaming snapshot into one ``.heapsnapshot`` file.

    Works on the parts of a process that died mid-walk: a truncated last line, and edges to
    objects that never got a node, are dropped and counted. Memory: an id -> index map and a few
    integers per node; nodes and edges are streamed from the parts into the output. Returns counts:
    nodes, edges, dropped_edges, truncated_lines, complete (1 if the walk finished).

    ``progress(done, total)``, if given, is called about once per MiB of parts read (the edges
    part is read twice, so it counts twice in ``total``), and with ``done == total`` at the end;
    ``omniprof assemble`` draws it as a bar.
    """
    from array import array

    prefix = str(prefix)
    parts = {ext: prefix + ext for ext in (".nodes", ".edges", ".strings")}
    for p in parts.values():
        if not os.path.exists(p):
            raise TraceReadError(f"cannot assemble {prefix}: missing part {p}")
    meter = _Meter(progress, sum(os.path.getsize(parts[ext]) for ext in (".strings", ".nodes", ".edges", ".edges")))
    truncated = 0
    strings: list[str] = []
    for ln in _iter_lines(parts[".strings"], meter):
        try:
            strings.append(json.loads(ln))
        except ValueError:
            truncated += 1
            break
    index: dict[int, int] = {}
    ntype, nname, nsize = array("b"), array("q"), array("q")
    for ln in _iter_lines(parts[".nodes"], meter):
        f = ln.split()
        if len(f) != 5 or not all(p.lstrip("-").isdigit() for p in f) or int(f[2]) >= len(strings):
            truncated += 1
            break
        index[int(f[0])] = len(ntype)
        ntype.append(int(f[1]))
        nname.append(int(f[2]))
        nsize.append(int(f[3]))
    n = len(ntype)
    nedges = array("q", bytes(8 * n))
    dropped = edges_ok = 0

    def edges() -> Iterator[tuple[int, int, int, int]]:
        """(source index, type, name_or_index, target offset) of every usable edge, in file order."""
        nonlocal dropped, truncated
        last_src = 0
        for ln in _iter_lines(parts[".edges"], meter):
            f = ln.split()
            if len(f) != 4 or not all(p.lstrip("-").isdigit() for p in f):
                truncated += 1
                return
            si, di = index.get(int(f[0])), index.get(int(f[3]))
            et, ref = int(f[1]), int(f[2])
            if si is None or di is None or si < last_src or (et not in (E_ELEMENT, E_HIDDEN) and ref >= len(strings)):
                dropped += 1
                continue
            last_src = si
            yield si, et, ref, di * NF

    for si, _, _, _ in edges():
        nedges[si] += 1
        edges_ok += 1
    complete = os.path.exists(prefix + ".metadata.json")
    head = {"meta": _meta(), "node_count": n, "edge_count": edges_ok, "trace_function_count": 0}
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write('{"snapshot":' + json.dumps(head, separators=(",", ":")) + ',"nodes":[')
        for i in range(n):
            fh.write(("," if i else "") + f"{ntype[i]},{nname[i]},{2 * i + 1},{nsize[i]},{nedges[i]},0,0")
        fh.write('],"edges":[')
        dropped = 0  # counted again by the second pass
        first = True
        for _, et, ref, to in edges():
            fh.write(("" if first else ",") + f"{et},{ref},{to}")
            first = False
        fh.write('],"trace_function_infos":[],"trace_tree":[],"samples":[],"locations":[],"strings":[')
        for i, st in enumerate(strings):
            fh.write(("," if i else "") + json.dumps(st))
        fh.write("]}")
    meter.finish()
    return {"nodes": n, "edges": edges_ok, "dropped_edges": dropped, "truncated_lines": truncated,
            "complete": int(complete)}


class _Meter:
    """Characters read from the parts (ASCII: bytes), passed to a ``progress(done, total)`` callback."""

    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def add(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.total, self.total)


def _iter_lines(path: str, meter: _Meter | None = None) -> Iterator[str]:
    """Lines of a part file; an unterminated last line (a process killed mid-write) is marked so it
    fails to parse. Read a MiB at a time; ``meter`` counts each MiB."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            lines = fh.readlines(1 << 20)
            if not lines:
                return
            if meter is not None:
                meter.add(sum(map(len, lines)))
            for line in lines:
                yield line[:-1] if line.endswith("\n") else line + "\x00"
