"""Every thread's Python stack of a running CPython 3.10-3.13, read from outside (``process_vm_readv``).

The target is never stopped: what is read may change under the reader. Each pointer followed is
checked (a code object's type is ``code``, a thread state points back at its interpreter, depth is
bounded); a thread whose stack fails a check is reported torn (:class:`ThreadStack.torn`), never as
a wrong stack. Code objects are decoded once (name, file, first line, line table) and kept by address,
checked again by their name and file pointers each time they are met.
"""

from __future__ import annotations

import os
import struct

import attrs

from omniprof.core.results import Frame
from omniprof.errors import LiveTargetError
from omniprof.live.layout import Layout, load_layout
from omniprof.live.memory import ProcessMemory, TornRead

__all__ = ["PythonProcess", "ThreadStack", "line_for_offset"]

MAX_DEPTH = 1024
MAX_THREADS = 4096
_MAX_STR = 4096
_MAX_LINETABLE = 1 << 20
_MAX_CHUNK = 1 << 20
_TOP_FIRST = 512  # bytes below a data stack's top read right after the leaf pointer (the leaf and its callers)
_MARGIN = 512     # and past it: frames pushed since the thread state was read


@attrs.frozen
class ThreadStack:
    """One thread at one moment: ``frames`` innermost first (empty when the thread runs no Python)."""

    thread_id: int
    native_id: int | None
    name: str
    holds_gil: bool
    frames: tuple[Frame, ...] = ()
    torn: bool = False
    truncated: bool = False


@attrs.frozen
class _Code:
    name: str
    filename: str
    firstlineno: int
    linetable: bytes
    start: int  # address of the first code unit (3.11+), 0 on 3.10
    name_ptr: int
    file_ptr: int


def _varint(tbl: bytes, i: int) -> tuple[int, int]:
    b = tbl[i]
    i += 1
    val, shift = b & 63, 6
    while b & 64:
        b = tbl[i]
        i += 1
        val |= (b & 63) << shift
        shift += 6
    return val, i


def line_for_offset(version: tuple[int, int], linetable: bytes, firstlineno: int, offset: int) -> int:
    """The source line of the instruction at byte ``offset`` of a code object (0: none), from its
    ``co_linetable``: 3.10's (bytes delta, line delta) pairs, or 3.11+'s location entries."""
    if offset < 0:
        return firstlineno
    line, addr, i, n = firstlineno, 0, 0, len(linetable)
    if version < (3, 11):
        while i + 1 < n:
            sdelta, ldelta = linetable[i], linetable[i + 1]
            i += 2
            cur = None
            if ldelta != 0x80:
                line += ldelta - 256 if ldelta > 127 else ldelta
                cur = line
            end = addr + sdelta
            if addr <= offset < end:
                return cur or 0
            addr = end
        return 0
    while i < n:
        b = linetable[i]
        i += 1
        code, length = (b >> 3) & 15, (b & 7) + 1
        cur = line
        if code == 15:  # no location
            cur = None
        elif code == 14 or code == 13:  # long form / no column: a signed varint line delta
            v, i = _varint(linetable, i)
            line += -(v >> 1) if v & 1 else v >> 1
            cur = line
            if code == 14:
                for _ in range(3):
                    _, i = _varint(linetable, i)
        elif code >= 10:  # one-line forms
            line += code - 10
            cur = line
            i += 2
        else:  # short forms: the same line
            i += 1
        end = addr + 2 * length
        if addr <= offset < end:
            return cur or 0
        addr = end
    return 0


class PythonProcess:
    """A running CPython process, read from outside. Raises LiveTargetError when the process is
    gone, not CPython 3.10-3.13, or not readable by this user."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.mem = ProcessMemory(pid)
        self.layout: Layout = load_layout(self.mem)
        self.version = self.layout.version
        o = self.layout.off
        self._o = o
        self._codes: dict[int, _Code] = {}
        self._types: dict[int, bool] = {}
        self._strings: dict[int, str] = {}
        self.torn_reads = 0
        self._tid_at: int | None = None  # 3.10: where glibc's struct pthread keeps the kernel thread id
        code_keys = [k for k in o if k.startswith("code.")]
        self._code_hdr = max(o[k] for k in code_keys) + 8
        frame_keys = [k for k in o if k.startswith("frame.") and k != "frame.owner_cstack"]
        self._frame_size = max(o[k] for k in frame_keys) + 8
        self._tstate_size = max(o["tstate.size"], max(o[k] for k in o if k.startswith("tstate.") and k != "tstate.size")
                                + 8)
        try:
            with open(f"/proc/{pid}/comm") as f:
                self._comm = f.read().strip()
        except OSError:
            self._comm = ""
        self.interp = self._interp()

    # ------------------------------------------------------------------ memory helpers
    def _u64(self, b: bytes, key: str) -> int:
        return struct.unpack_from("<Q", b, self._o[key])[0]

    def _interp(self) -> int:
        interp = self.mem.u64(self.layout.runtime + self._o["runtime.interpreters_head"])
        if not interp:
            raise LiveTargetError(f"process {self.pid} has no Python interpreter running (starting up or exiting)",
                                  cause="not_python")
        return interp

    def _is_code(self, addr: int, type_addr: int) -> bool:
        ok = self._types.get(type_addr)
        if ok is None:
            try:
                tp_name = self.mem.u64(type_addr + self._o["type.tp_name"])
                ok = self.mem.read(tp_name, 5) == b"code\0"
            except TornRead:
                return False
            self._types[type_addr] = ok
        return ok

    def read_str(self, addr: int) -> str:
        """A ``str`` object's text (compact strings: every name CPython makes)."""
        s = self._strings.get(addr)
        if s is not None:
            return s
        o = self._o
        hdr = self.mem.read(addr, o["unicode.compact_size"])
        state = struct.unpack_from("<I", hdr, o["unicode.state"])[0]
        length = struct.unpack_from("<q", hdr, o["unicode.length"])[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length <= _MAX_STR:
            raise TornRead(addr)
        data = self.mem.read(addr + (o["unicode.ascii_size"] if ascii_ else o["unicode.compact_size"]), length * kind)
        s = data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")
        if len(self._strings) < 100_000:
            self._strings[addr] = s
        return s

    def _read_bytes(self, addr: int) -> bytes:
        n = struct.unpack("<q", self.mem.read(addr + 16, 8))[0]
        if not 0 <= n <= _MAX_LINETABLE:
            raise TornRead(addr)
        return self.mem.read(addr + self._o["bytes.ob_sval"], n) if n else b""

    def _decode(self, addr: int, hdr: bytes) -> _Code:
        o = self._o
        if not self._is_code(addr, struct.unpack_from("<Q", hdr, 8)[0]):
            raise TornRead(addr)
        name_ptr, file_ptr = self._u64(hdr, "code.name"), self._u64(hdr, "code.filename")
        c = self._codes.get(addr)
        if c is not None and c.name_ptr == name_ptr and c.file_ptr == file_ptr:
            return c
        name = self.read_str(self._u64(hdr, "code.qualname") if "code.qualname" in o else name_ptr)
        c = _Code(name=name, filename=self.read_str(file_ptr),
                  firstlineno=struct.unpack_from("<i", hdr, o["code.firstlineno"])[0],
                  linetable=self._read_bytes(self._u64(hdr, "code.linetable")),
                  start=addr + o["code.code_adaptive"] if "code.code_adaptive" in o else 0,
                  name_ptr=name_ptr, file_ptr=file_ptr)
        self._codes[addr] = c
        return c

    def code(self, addr: int) -> _Code:
        """The code object at ``addr``, decoded (cached while its name and file pointers are unchanged)."""
        return self._decode(addr, self.mem.read(addr, self._code_hdr))

    def codes(self, addrs: list[int]) -> dict[int, _Code]:
        """Several code objects, their headers read in one system call (checked as :meth:`code` does)."""
        uniq = list(dict.fromkeys(addrs))
        out = {}
        for addr, hdr in zip(uniq, self.mem.read_many([(a, self._code_hdr) for a in uniq])):
            if hdr is None:
                raise TornRead(addr)
            out[addr] = self._decode(addr, hdr)
        return out

    # ------------------------------------------------------------------ threads and frames
    def gil_holder(self) -> int:
        """The thread state holding the GIL now (0: none, or unknown)."""
        o = self._o
        # 3.13 publishes the main interpreter's own GIL fields relative to the interpreter state
        locked_at, holder_at = o.get("interp.gil_locked"), o.get("interp.gil_holder")
        try:
            if locked_at is not None and holder_at is not None:
                gil = self.interp
            else:
                locked_at, holder_at = o["gil.locked"], o["gil.holder"]
                if "interp.ceval_gil" in o:  # 3.12: a pointer in the interpreter
                    gil = self.mem.u64(self.interp + o["interp.ceval_gil"])
                else:  # 3.10, 3.11: one GIL in the runtime
                    gil = self.layout.runtime + o["runtime.gil"]
            raw = self.mem.read(gil, max(locked_at, holder_at) + 8)
        except TornRead:
            return 0
        locked = struct.unpack_from("<i", raw, locked_at)[0]
        return struct.unpack_from("<Q", raw, holder_at)[0] if locked else 0

    def thread_states(self) -> list[tuple[int, bytes]]:
        """(address, bytes) of each thread state of the main interpreter, newest thread first."""
        out = []
        ts = self.mem.u64(self.interp + self._o["interp.threads_head"])
        seen = set()
        while ts and ts not in seen and len(out) < MAX_THREADS:
            seen.add(ts)
            buf = self.mem.read(ts, self._tstate_size)
            if self._u64(buf, "tstate.interp") != self.interp:
                raise TornRead(ts)
            out.append((ts, buf))
            ts = self._u64(buf, "tstate.next")
        return out

    def _leaf_at(self, ts: int, buf: bytes) -> int:
        """Where the thread's innermost frame pointer is stored (0: no Python frame)."""
        o = self._o
        if "tstate.cframe" in o:  # 3.11/3.12: in the C-level eval loop running now (tstate->cframe)
            cframe = self._u64(buf, "tstate.cframe")
            return cframe + o["cframe.current_frame"] if cframe else 0
        return ts + o["tstate.current_frame" if "tstate.current_frame" in o else "tstate.frame"]

    def _snapshot(self, ts: int, buf: bytes) -> tuple[int, int, int, bytes]:
        """(leaf frame, lo, hi, bytes of [lo, hi)): 3.11+ read the leaf pointer and the thread's data
        stack in ONE system call, the pointer first, then the top of the stack, then the rest (the
        thread runs on meanwhile: a frame read long after the pointer may hold a newer call)."""
        o = self._o
        at = self._leaf_at(ts, buf)
        if not at:
            return 0, 0, 0, b""
        chunk, top = self._u64(buf, "tstate.datastack_chunk"), self._u64(buf, "tstate.datastack_top")
        start = chunk + o["chunk.data"]
        if not (chunk and start < top <= start + _MAX_CHUNK):
            return self.mem.u64(at), 0, 0, b""
        split = max(start, (top - _TOP_FIRST) & ~7)
        spans = [(at, 8), (split, top - split), (start, split - start), (top, _MARGIN)]
        got = self.mem.read_many([sp for sp in spans if sp[1] > 0])
        if got[0] is None or got[1] is None:
            raise TornRead(at)
        rest = got[2] if split > start else b""
        if rest is None:
            raise TornRead(start)
        margin = got[-1] if got[-1] is not None else b""  # frames pushed since: unmapped past the end is fine
        return int.from_bytes(got[0], "little"), start, top + len(margin), rest + got[1] + margin

    def raw_stack(self, buf: bytes, ts: int = 0) -> tuple[list[tuple[int, int]], bool]:
        """(code address, byte offset) of each frame, innermost first, and whether it was cut at
        MAX_DEPTH. ``ts``: the thread state's address (``buf`` is its bytes)."""
        o, legacy = self._o, self.layout.legacy
        cstack = o.get("frame.owner_cstack", -1)
        out: list[tuple[int, int]] = []
        if "tstate.datastack_chunk" in o:
            frame, lo, hi, data = self._snapshot(ts, buf)
        else:
            frame, lo, hi, data = self._u64(buf, "tstate.frame"), 0, 0, b""
        size = self._frame_size
        hops = 0
        while frame:
            if len(out) >= MAX_DEPTH:
                return out, True
            hops += 1
            if hops > 2 * MAX_DEPTH or frame & 7:
                raise TornRead(frame)
            if lo <= frame and frame + size <= hi:
                fb = data[frame - lo:frame - lo + size]
            else:  # a generator's frame, an older chunk, or pushed since the copy
                fb = self.mem.read(frame, size)
            code, prev = self._u64(fb, "frame.code"), self._u64(fb, "frame.previous")
            if legacy:
                lasti = struct.unpack_from("<i", fb, o["frame.lasti"])[0]
                out.append((code, 2 * lasti))
            elif fb[o["frame.owner"]] != cstack:
                out.append((code, self._u64(fb, "frame.instr")))  # an address: made relative in frames()
            frame = prev
        return out, False

    def frames(self, raw: list[tuple[int, int]]) -> tuple[Frame, ...]:
        out = []
        codes = self.codes([a for a, _ in raw])
        for code_addr, at in raw:
            c = codes[code_addr]
            offset = at if self.layout.legacy else at - c.start
            if not self.layout.legacy and not -2 <= offset <= 2 * (1 << 24):
                raise TornRead(code_addr)
            line = line_for_offset(self.version, c.linetable, c.firstlineno, offset) or c.firstlineno
            out.append(Frame(name=c.name, file=c.filename, line=line))
        return tuple(out)

    def thread_names(self) -> dict[int, str]:
        """thread_id -> name from the target's ``threading._active`` (empty where unreadable)."""
        from omniprof.live.objects import ObjectReader

        try:
            return ObjectReader(self.mem, self._o, self.version, self.read_str).thread_names(self.interp)
        except (TornRead, KeyError, struct.error, ValueError):
            return {}

    def _names(self, states: list[tuple[int, bytes]]) -> dict[int, str]:
        """thread_id -> name: ``threading``'s name for it, else the OS thread name where it was set
        (differs from the process's), else ``MainThread`` for the thread that started the process."""
        out: dict[int, str] = self.thread_names()
        for i, (_, buf) in enumerate(states):
            tid = self._u64(buf, "tstate.thread_id")
            native = self._native(buf)
            comm = ""
            if native:
                try:
                    with open(f"/proc/{self.pid}/task/{native}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    pass
            if tid in out:
                continue
            main = native == self.pid if native else i == len(states) - 1
            out[tid] = "MainThread" if main else (comm if comm and comm != self._comm else f"Thread-{tid:#x}")
        return out

    def _native(self, buf: bytes) -> int | None:
        """The thread's kernel id. 3.10 keeps none: it is read from glibc's ``struct pthread``, whose
        address is the thread's ident, at the offset where the main thread's holds the pid."""
        if "tstate.native_thread_id" in self._o:
            return self._u64(buf, "tstate.native_thread_id")
        if self._tid_at is None:
            self._tid_at = self._find_tid_offset()
        if self._tid_at < 0:
            return None
        try:
            tid = struct.unpack("<i", self.mem.read(self._u64(buf, "tstate.thread_id") + self._tid_at, 4))[0]
        except TornRead:
            return None
        return tid if tid > 0 and os.path.exists(f"/proc/{self.pid}/task/{tid}") else None

    def _find_tid_offset(self) -> int:
        try:
            states = self.thread_states()
            main = self._u64(states[-1][1], "tstate.thread_id")  # the first thread state made: the last one
            raw = self.mem.read(main, 2048)
        except (TornRead, IndexError):
            return -1
        for at in range(0, len(raw) - 3, 4):
            if struct.unpack_from("<i", raw, at)[0] == self.pid:
                return at
        return -1

    def stacks(self, retries: int = 3) -> list[ThreadStack]:
        """Every thread's stack now; a thread read torn ``retries`` times in a row is marked torn."""
        for attempt in range(retries):
            try:
                states = self.thread_states()
                break
            except TornRead:
                if attempt == retries - 1:
                    raise LiveTargetError(f"process {self.pid}: its thread list kept changing while read",
                                          cause="torn") from None
        holder = self.gil_holder()
        names = self._names(states)
        out = []
        for ts, buf in states:
            tid = self._u64(buf, "tstate.thread_id")
            frames: tuple[Frame, ...] = ()
            torn, truncated = True, False
            for _ in range(retries):
                try:
                    raw, truncated = self.raw_stack(buf, ts)
                    frames = self.frames(raw)
                    torn = False
                    break
                except TornRead:
                    self.torn_reads += 1
                    try:
                        buf = self.mem.read(ts, self._tstate_size)
                    except TornRead:
                        break
            out.append(ThreadStack(thread_id=tid, native_id=self._native(buf), name=names.get(tid, ""),
                                   holds_gil=bool(holder) and holder == ts, frames=frames, torn=torn,
                                   truncated=truncated))
        return out


def python_version_of(pid: int) -> str:
    """``"3.12"``: the CPython version process ``pid`` runs (LiveTargetError if none)."""
    lay = load_layout(ProcessMemory(pid))
    return f"{lay.version[0]}.{lay.version[1]}"


def process_exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")
