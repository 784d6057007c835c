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


def _describe(obj: Any) -> tuple[int, str]:
    if isinstance(obj, str):
        return T_STRING, obj[:MAX_NAME]
    if isinstance(obj, (bool, int, float, complex)):
        return T_NUMBER, repr(obj)[:MAX_NAME]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return T_ARRAY, type(obj).__name__
    if isinstance(obj, types.CodeType):
        return T_CODE, getattr(obj, "co_qualname", obj.co_name)
    if isinstance(obj, _FUNCS):
        return T_CLOSURE, getattr(obj, "__qualname__", getattr(obj, "__name__", "function"))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return T_NATIVE, type(obj).__name__
    if isinstance(obj, types.ModuleType):
        return T_OBJECT, f"module {obj.__name__}"
    if isinstance(obj, type):
        return T_OBJECT, f"class {obj.__qualname__}"
    return T_OBJECT, type(obj).__qualname__


def _size(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:  # objects whose __sizeof__ is broken still get a node
        return 0


def _edges(obj: Any) -> Iterator[tuple[int, Any, Any]]:
    """(edge type, name or index, target) for every reference held by ``obj``."""
    if isinstance(obj, dict):
        for i, (k, val) in enumerate(list(obj.items())):
            if isinstance(k, str):
                yield E_PROPERTY, k, val
            else:
                yield E_INTERNAL, f"key {i}", k
                yield E_INTERNAL, f"[{repr(k)[:60]}]", val
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):  # list iteration tolerates concurrent changes
            yield E_ELEMENT, i, item
        return
    if isinstance(obj, (set, frozenset)):
        for i, item in enumerate(list(obj)):
            yield E_ELEMENT, i, item
        return
    d = getattr(obj, "__dict__", None) if not isinstance(obj, (type, types.ModuleType)) else None
    if isinstance(d, dict):
        for k, val in list(d.items()):
            if isinstance(k, str):
                yield E_PROPERTY, k, val
    try:
        refs = gc.get_referents(obj)
    except Exception:
        return
    for i, r in enumerate(refs):
        if r is d:
            yield E_INTERNAL, "__dict__", r
        elif isinstance(r, type) and r is type(obj):
            yield E_INTERNAL, "__class__", r
        else:
            yield E_HIDDEN, i, r


class _Strings:
    """String table with de-duplication bounded so a huge heap cannot grow it without limit."""

    def __init__(self, sink: IO[str] | None, limit: int = 200_000) -> None:
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
        if len(self.index) < self.limit:
            self.index[s] = i
        if self.sink is not None:
            self.sink.write(json.dumps(s) + "\n")
        else:
            self.items.append(s)
        return i


def _user_frame() -> types.FrameType | None:
    """The innermost frame of the current thread outside this module (the snapshot's caller)."""
    f: types.FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    return f


def _walk(emit_node: Any, emit_edge: Any, all_one: bool, exclude: tuple[Any, ...] = ()) -> tuple[int, int]:
    """Visit every live object once; emit nodes (with their edges right after). Returns counts.

    ``exclude`` holds the snapshot's own bookkeeping objects, which are left out of the graph.
    """
    objs = gc.get_objects()
    own = {id(objs), *(id(x) for x in exclude)}
    seen: set[int] = {id(o) for o in objs}
    seen |= own
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
        if id(target) not in seen:
            seen.add(id(target))
            pending.append(target)
        emit_edge(ROOT_ID, etype, name, target)
        edges += 1

    def visit(obj: Any) -> None:
        nonlocal nodes, edges
        out = [(t, n, r) for t, n, r in _edges(obj) if not isinstance(r, _SKIP) and id(r) not in own]
        ntype, name = _describe(obj)
        emit_node(ntype, name, id(obj), 1 if all_one else _size(obj), len(out))
        nodes += 1
        for t, n, r in out:
            if id(r) not in seen:
                seen.add(id(r))
                pending.append(r)
            emit_edge(id(obj), t, n, r)
            edges += 1

    for obj in objs:
        if id(obj) in own or isinstance(obj, _SKIP):
            continue
        if isinstance(obj, types.FrameType) and obj.f_code.co_filename == __file__:
            continue  # the snapshot's own frames
        visit(obj)
    while pending:
        visit(pending.popleft())
    del objs
    return nodes, edges


def take_heap_snapshot(path: str | os.PathLike[str] | None = None, *, all_one: bool = False,
                       streaming: bool = False) -> Path:
    """Write a snapshot of the live Python heap; returns the path of the ``.heapsnapshot`` file.

    Args:
        path: output file (default ``<pid>_<time>.heapsnapshot`` in the current directory).
            With ``streaming=True`` the parts are written beside it as ``<path>.nodes`` etc.
        all_one: every node's size is 1 (counts objects instead of bytes).
        streaming: write parts while walking, so the heap never needs to fit twice in memory, then
            assemble them (the parts are removed once assembled).

    .. versionadded:: 0.1
    """
    import time

    if path is None:
        path = Path.cwd() / f"{os.getpid()}_{time.strftime('%Y%m%d_%H%M%S')}.heapsnapshot"
    path = Path(path)
    if streaming:
        prefix = str(path)
        _stream_parts(prefix, all_one)
        assemble_snapshot(prefix, path)
        for ext in (".nodes", ".edges", ".strings", ".metadata.json"):
            try:
                os.unlink(prefix + ext)
            except OSError:
                pass
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
    doc = {"snapshot": {"meta": _meta(), "node_count": n, "edge_count": e, "trace_function_count": 0},
           "nodes": node_list, "edges": edge_list, "trace_function_infos": [], "trace_tree": [], "samples": [],
           "locations": [], "strings": strings.items}
    with atomic_open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return path


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

    Works on the parts of a process that died mid-walk: truncated last lines and edges to objects
    that never got a node are dropped and counted. Returns counts: nodes, edges, dropped_edges,
    truncated_lines, complete (1 if the walk finished).
    """
    prefix = str(prefix)
    try:
        node_lines = _read_lines(prefix + ".nodes")
        edge_lines = _read_lines(prefix + ".edges")
        string_lines = _read_lines(prefix + ".strings")
    except OSError as e:
        raise TraceReadError(f"cannot read snapshot parts {prefix}.*: {e.strerror or e}") from e
    truncated = 0
    strings: list[str] = []
    for ln in string_lines:
        try:
            strings.append(json.loads(ln))
        except ValueError:
            truncated += 1
            break
    index: dict[int, int] = {}
    nodes: list[list[int]] = []
    for ln in node_lines:
        parts = ln.split()
        if len(parts) != 5 or not all(p.lstrip("-").isdigit() for p in parts):
            truncated += 1
            break
        oid, ntype, name, size, _ = (int(p) for p in parts)
        if name >= len(strings):
            truncated += 1
            break
        index[oid] = len(nodes)
        nodes.append([ntype, name, 2 * len(nodes) + 1, size, 0, 0, 0])
    by_src: dict[int, list[tuple[int, int, int]]] = {}
    dropped = 0
    for ln in edge_lines:
        parts = ln.split()
        if len(parts) != 4 or not all(p.lstrip("-").isdigit() for p in parts):
            truncated += 1
            break
        src, etype, ref, dst = (int(p) for p in parts)
        si, di = index.get(src), index.get(dst)
        if si is None or di is None or (etype not in (E_ELEMENT, E_HIDDEN) and ref >= len(strings)):
            dropped += 1
            continue
        by_src.setdefault(si, []).append((etype, ref, di * NF))
    flat_nodes: list[int] = []
    flat_edges: list[int] = []
    for i, node in enumerate(nodes):
        es = by_src.get(i, ())
        node[4] = len(es)
        flat_nodes.extend(node)
        for e in es:
            flat_edges.extend(e)
    complete = os.path.exists(prefix + ".metadata.json")
    doc = {"snapshot": {"meta": _meta(), "node_count": len(nodes), "edge_count": len(flat_edges) // 3,
                        "trace_function_count": 0},
           "nodes": flat_nodes, "edges": flat_edges, "trace_function_infos": [], "trace_tree": [], "samples": [],
           "locations": [], "strings": strings}
    with atomic_open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return {"nodes": len(nodes), "edges": len(flat_edges) // 3, "dropped_edges": dropped,
            "truncated_lines": truncated, "complete": int(complete)}


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        data = fh.read()
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines[-1] = lines[-1] + "\x00"  # unterminated last line: mark so it fails to parse
    return lines
