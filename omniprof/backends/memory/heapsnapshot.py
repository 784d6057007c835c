"""Heap snapshots of the live Python object graph in Chrome DevTools' ``.heapsnapshot`` format.

The format (V8's): one JSON object with ``snapshot.meta`` describing flat integer arrays
``nodes`` (7 fields per node: type, name, id, self_size, edge_count, trace_node_id, detachedness)
and ``edges`` (3 fields: type, name_or_index, to_node, where to_node is the target's offset in
``nodes``), and a ``strings`` table that names refer to. Node 0 is a synthetic root.

Python objects map to node types: ``str`` -> string, numbers -> number, list/tuple/set -> array,
functions -> closure, code -> code, everything else -> object named after its class (so DevTools'
"Constructor" view groups instances by class). Edges: dict items and instance attributes are
``property`` edges named by key, sequence items ``element`` edges by index, other references
``hidden`` edges. ``self_size`` is ``sys.getsizeof`` (or 1 for every node with ``all_one=True``,
to count objects instead of bytes, as Julia's ``all_one``).

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
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from omniprof.core.fileio import atomic_open, atomic_write_text
from omniprof.errors import TraceReadError

__all__ = ["take_heap_snapshot", "assemble_snapshot", "NODE_FIELDS", "EDGE_FIELDS", "NODE_TYPES", "EDGE_TYPES"]

NODE_FIELDS = ["type", "name", "id", "self_size", "edge_count", "trace_node_id", "detachedness"]
NODE_TYPES = ["hidden", "array", "string", "object", "code", "closure", "regexp", "number", "native", "synthetic",
              "concatenated string", "sliced string", "symbol", "bigint", "object shape"]
EDGE_FIELDS = ["type", "name_or_index", "to_node"]
EDGE_TYPES = ["context", "element", "property", "internal", "hidden", "shortcut", "weak"]
T_ARRAY, T_STRING, T_OBJECT, T_CODE, T_CLOSURE, T_NUMBER, T_NATIVE, T_SYNTHETIC = 1, 2, 3, 4, 5, 7, 8, 9
E_ELEMENT, E_PROPERTY, E_INTERNAL, E_HIDDEN = 1, 2, 3, 4
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
    if _isa(obj, (list, tuple, set, frozenset)):
        return T_ARRAY, type(obj).__name__
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


def _edges(obj: Any) -> Iterator[tuple[int, Any, Any]]:
    """(edge type, name or index, target) for every reference held by ``obj``."""
    if _isa(obj, dict):
        for i, (k, val) in enumerate(list(obj.items())):
            if _isa(k, str):
                yield E_PROPERTY, k, val
            else:
                yield E_INTERNAL, f"key {i}", k
                yield E_INTERNAL, f"[{repr(k)[:60]}]", val
        return
    if _isa(obj, (list, tuple)):
        for i, item in enumerate(obj):  # list iteration tolerates concurrent changes
            yield E_ELEMENT, i, item
        return
    if _isa(obj, (set, frozenset)):
        for i, item in enumerate(list(obj)):
            yield E_ELEMENT, i, item
        return
    try:
        d = getattr(obj, "__dict__", None) if not _isa(obj, (type, types.ModuleType)) else None
    except Exception:  # properties or __getattr__ that raise
        d = None
    if _isa(d, dict):
        for k, val in list(d.items()):
            if _isa(k, str):
                yield E_PROPERTY, k, val
    try:
        refs = gc.get_referents(obj)
    except Exception:
        return
    for i, r in enumerate(refs):
        if r is d:
            yield E_INTERNAL, "__dict__", r
        elif r is type(obj):
            yield E_INTERNAL, "__class__", r
        else:
            yield E_HIDDEN, i, r


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


def _user_frame() -> types.FrameType | None:
    """The innermost frame of the current thread outside this module (the snapshot's caller)."""
    f: types.FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    return f


def _walk(emit_node: Any, emit_edge: Any, all_one: bool, exclude: tuple[Any, ...] = ()) -> tuple[int, int]:
    """Visit every live object once; emit nodes (with their edges right after). Returns counts.

    ``exclude`` holds the snapshot's own bookkeeping objects, which are left out of the graph.
    Warnings raised by objects as they are looked at (deprecated attributes reached through
    ``__dict__``, say) are the heap's business, not the user's: they are not shown.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _walk_quiet(emit_node, emit_edge, all_one, exclude)


def _walk_quiet(emit_node: Any, emit_edge: Any, all_one: bool, exclude: tuple[Any, ...]) -> tuple[int, int]:
    objs = gc.get_objects()
    own = {id(objs), *(id(x) for x in exclude)}
    seen = _IdSet()
    for o in objs:
        seen.add_new(id(o))
    for oid in own:
        seen.add_new(oid)
    add_new = seen.add_new
    pending: deque[Any] = deque()
    nodes = edges = 0

    roots: list[tuple[int, Any, Any]] = []
    for name, mod in list(sys.modules.items()):
        if mod is not None:
            roots.append((E_PROPERTY, name, mod))
    me = __import__("threading").get_ident()
    for tid, frame in sys._current_frames().items():
        if tid == me:
            frame = _user_frame()
            if frame is None:
                continue
        roots.append((E_ELEMENT, tid, frame))
    own.add(id(roots))
    emit_node(T_SYNTHETIC, "(Python roots)", ROOT_ID, 0, len(roots))
    nodes += 1
    for etype, name, target in roots:
        if add_new(id(target)):
            pending.append(target)
        emit_edge(ROOT_ID, etype, name, target)
        edges += 1

    def visit(obj: Any) -> None:
        nonlocal nodes, edges
        out = [(t, n, r) for t, n, r in _edges(obj) if not _isa(r, _SKIP) and id(r) not in own]
        ntype, name = _describe(obj)
        emit_node(ntype, name, id(obj), 1 if all_one else _size(obj), len(out))
        nodes += 1
        for t, n, r in out:
            if add_new(id(r)):
                pending.append(r)
            emit_edge(id(obj), t, n, r)
            edges += 1

    for obj in objs:
        if id(obj) in own or _isa(obj, _SKIP):
            continue
        if _isa(obj, types.FrameType) and obj.f_code.co_filename == __file__:
            continue  # the snapshot's own frames
        visit(obj)
    while pending:
        visit(pending.popleft())
    del objs
    return nodes, edges


def take_heap_snapshot(path: str | os.PathLike[str] | None = None, *, all_one: bool = False,
                       streaming: bool = False) -> Path:
    """Write a snapshot of the live Python heap; returns ``path`` (with ``streaming``: the parts' prefix).

    Args:
        path: output file (default ``<pid>_<time>.heapsnapshot`` in the current directory).
            With ``streaming=True`` the parts are written beside it as ``<path>.nodes`` etc.
        all_one: every node's size is 1 (counts objects instead of bytes).
        streaming: write the parts ``<path>.nodes``, ``<path>.edges``, ``<path>.strings`` and
            ``<path>.metadata.json`` while walking, holding neither the graph nor the output in
            memory; join them later, offline, with ``assemble_snapshot(path, out)``.

    .. versionadded:: 0.1
    """
    import time

    if path is None:
        path = Path.cwd() / f"{os.getpid()}_{time.strftime('%Y%m%d_%H%M%S')}.heapsnapshot"
    path = Path(path)
    if streaming:
        # Parts only: joining them is assemble_snapshot's job, offline, so the heap never needs to
        # be held twice in this process.
        _stream_parts(str(path), all_one)
        return path
    strings = _Strings(None)
    node_list: list[int] = []
    edge_list: list[int] = []
    index: dict[int, int] = {}
    pending_edges: list[tuple[int, int, int]] = []  # (position in edge_list, target id)

    def emit_node(ntype: int, name: str, oid: int, size: int, nedges: int) -> None:
        index[oid] = len(node_list) // NF
        node_list.extend((ntype, strings.get(name), 2 * (len(node_list) // NF) + 1, size, nedges, 0, 0))

    def emit_edge(src: int, etype: int, name: Any, target: Any) -> None:
        ref = name if etype in (E_ELEMENT, E_HIDDEN) else strings.get(str(name))
        pending_edges.append((len(edge_list), id(target)))
        edge_list.extend((etype, ref, 0))

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        n, e = _walk(emit_node, emit_edge, all_one,
                     exclude=(strings.items, strings.index, node_list, edge_list, index, pending_edges))
    finally:
        if was_enabled:
            gc.enable()
    for pos, tid in pending_edges:
        edge_list[pos + 2] = index[tid] * NF
    head = {"meta": _meta(), "node_count": n, "edge_count": e, "trace_function_count": 0}
    with atomic_open(path, "w", encoding="utf-8") as fh:
        # json.dump() streams through the pure-Python encoder; joining ints is ~20x faster.
        fh.write('{"snapshot":' + json.dumps(head, separators=(",", ":")) + ',"nodes":[')
        _write_ints(fh, node_list)
        fh.write('],"edges":[')
        _write_ints(fh, edge_list)
        fh.write('],"trace_function_infos":[],"trace_tree":[],"samples":[],"locations":[],"strings":')
        fh.write(json.dumps(strings.items, separators=(",", ":")))
        fh.write("}")
    return path


def _write_ints(fh: IO[str], values: list[int], chunk: int = 1 << 16) -> None:
    for i in range(0, len(values), chunk):
        if i:
            fh.write(",")
        fh.write(",".join(map(str, values[i:i + chunk])))


def _stream_parts(prefix: str, all_one: bool) -> None:
    with open(prefix + ".nodes", "w", encoding="utf-8") as nf, open(prefix + ".edges", "w", encoding="utf-8") as ef, \
            open(prefix + ".strings", "w", encoding="utf-8") as sf:
        strings = _Strings(sf)

        def emit_node(ntype: int, name: str, oid: int, size: int, nedges: int) -> None:
            nf.write(f"{oid} {ntype} {strings.get(name)} {size} {nedges}\n")

        def emit_edge(src: int, etype: int, name: Any, target: Any) -> None:
            ref = name if etype in (E_ELEMENT, E_HIDDEN) else strings.get(str(name))
            ef.write(f"{src} {etype} {ref} {id(target)}\n")

        was_enabled = gc.isenabled()
        gc.disable()
        try:
            n, e = _walk(emit_node, emit_edge, all_one, exclude=(strings.index,))
        finally:
            if was_enabled:
                gc.enable()
    atomic_write_text(prefix + ".metadata.json", json.dumps({"node_count": n, "edge_count": e, "complete": True}))


def assemble_snapshot(prefix: str | os.PathLike[str], path: str | os.PathLike[str]) -> dict[str, int]:
    """Join the parts written by a streaming snapshot into one ``.heapsnapshot`` file.

    Works on the parts of a process that died mid-walk: a truncated last line, and edges to
    objects that never got a node, are dropped and counted. Memory: an id -> index map and a few
    integers per node; nodes and edges are streamed from the parts into the output. Returns counts:
    nodes, edges, dropped_edges, truncated_lines, complete (1 if the walk finished).
    """
    from array import array

    prefix = str(prefix)
    parts = {ext: prefix + ext for ext in (".nodes", ".edges", ".strings")}
    for p in parts.values():
        if not os.path.exists(p):
            raise TraceReadError(f"cannot assemble {prefix}: missing part {p}")
    truncated = 0
    strings: list[str] = []
    for ln in _iter_lines(parts[".strings"]):
        try:
            strings.append(json.loads(ln))
        except ValueError:
            truncated += 1
            break
    index: dict[int, int] = {}
    ntype, nname, nsize = array("b"), array("q"), array("q")
    for ln in _iter_lines(parts[".nodes"]):
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
        for ln in _iter_lines(parts[".edges"]):
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
    return {"nodes": n, "edges": edges_ok, "dropped_edges": dropped, "truncated_lines": truncated,
            "complete": int(complete)}


def _iter_lines(path: str) -> Iterator[str]:
    """Lines of a part file; an unterminated last line (a process killed mid-write) is marked so it
    fails to parse."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            yield line[:-1] if line.endswith("\n") else line + "\x00"
