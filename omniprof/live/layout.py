"""Where the fields the reader follows lie in a given CPython's structs.

3.10-3.12: the table of :mod:`._offsets` (generated from each version's headers). 3.13: the
``_Py_DebugOffsets`` that CPython keeps at the start of ``_PyRuntime`` for out-of-process tools,
read from the target itself. Keys are the table's (``"tstate.next"``, ``"code.name"``, ...).
"""

from __future__ import annotations

import re
import struct

import attrs

from omniprof.errors import LiveTargetError
from omniprof.live._offsets import OFFSETS
from omniprof.live.memory import ProcessMemory, TornRead, find_symbols, mapped_files

__all__ = ["Layout", "load_layout", "SUPPORTED"]

SUPPORTED = ((3, 10), (3, 11), (3, 12), (3, 13))
DEBUG_COOKIE = b"xdebugpy"

# 3.13's _Py_DebugOffsets after the 8-byte cookie: uint64 fields in declaration order
# (Include/internal/pycore_runtime.h); "-" marks a field the reader does not use.
_DEBUG_FIELDS_313 = (
    "version", "-",
    "-", "-", "runtime.interpreters_head",
    "-", "-", "-", "interp.threads_head", "-", "interp.modules", "-", "-", "-", "-", "-", "interp.gil_locked",
    "interp.gil_holder",
    "tstate.size", "-", "tstate.next", "tstate.interp", "tstate.current_frame", "tstate.thread_id",
    "tstate.native_thread_id", "-", "-",
    "-", "frame.previous", "frame.code", "frame.instr", "-", "frame.owner",
    "-", "code.filename", "code.name", "code.qualname", "code.linetable", "code.firstlineno", "-", "-", "-",
    "code.code_adaptive",
    "-", "-",
    "-", "type.tp_name", "-", "type.flags",
    "-", "-", "-",
    "-", "-", "-",
    "-", "dict.ma_keys", "dict.ma_values",
    "-", "-",
    "-", "long.tag", "long.digits",
    "-", "-", "bytes.ob_sval",
    "-", "unicode.state", "unicode.length", "unicode.ascii_size",
)


@attrs.frozen
class Layout:
    """A target interpreter: its version, ``_PyRuntime``'s address and the struct offsets."""

    version: tuple[int, int]
    runtime: int
    off: dict[str, int] = attrs.field(eq=False)
    binary: str = ""

    @property
    def legacy(self) -> bool:
        """3.10: a chain of PyFrameObjects (f_back), ``f_lasti`` in code units."""
        return self.version < (3, 11)


def _version(mem: ProcessMemory, syms: dict[str, int], binary: str) -> tuple[int, int]:
    if "Py_Version" in syms:
        try:
            hexv = int.from_bytes(mem.read(syms["Py_Version"], 4), "little")
            return hexv >> 24, (hexv >> 16) & 0xFF
        except TornRead:
            pass
    m = re.search(r"python(\d)\.(\d+)", binary.rsplit("/", 1)[-1])
    if m:
        return int(m.group(1)), int(m.group(2))
    raise LiveTargetError(f"process {mem.pid}: cannot tell which CPython {binary} is", cause="not_python")


def load_layout(mem: ProcessMemory) -> Layout:
    """Find ``_PyRuntime`` in process ``mem.pid`` (ELF symbols of its executable or libpython) and
    its struct offsets."""
    syms, binary = find_symbols(mem.pid, ("_PyRuntime", "Py_Version"))
    if "_PyRuntime" not in syms:
        m = re.search(r"python(\d)\.(\d+)", " ".join(p for _, _, p in mapped_files(mem.pid)))
        if m:  # a Python older than 3.7 (no _PyRuntime): say which
            raise LiveTargetError(f"process {mem.pid} runs Python {m.group(1)}.{m.group(2)}; omniprof reads CPython "
                                  f"3.10-3.13 from outside", cause="not_python")
        raise LiveTargetError(f"process {mem.pid} is not CPython (no _PyRuntime symbol in {binary or 'its executable'} "
                              f"or a mapped libpython)", cause="not_python")
    version = _version(mem, syms, binary)
    runtime = syms["_PyRuntime"]
    if version not in SUPPORTED:
        raise LiveTargetError(f"process {mem.pid} runs CPython {version[0]}.{version[1]}; omniprof reads 3.10-3.13 "
                              f"from outside", cause="not_python")
    if version >= (3, 13):
        raw = mem.read(runtime, 8 + 8 * len(_DEBUG_FIELDS_313))
        if raw[:8] != DEBUG_COOKIE:
            raise LiveTargetError(f"process {mem.pid}: _PyRuntime.debug_offsets has no valid cookie (a CPython "
                                  f"{version[0]}.{version[1]} build omniprof does not know)", cause="not_python")
        values = struct.unpack_from(f"<{len(_DEBUG_FIELDS_313)}Q", raw, 8)
        off = dict(OFFSETS.get(version, {}))  # the few the debug offsets lack (generated from the headers)
        off.update((k, v) for k, v in zip(_DEBUG_FIELDS_313, values) if k != "-")
        off["frame.owner_cstack"] = 3  # FRAME_OWNED_BY_CSTACK (pycore_frame.h), not among the debug offsets
        off["unicode.compact_size"] = off["unicode.ascii_size"] + 16  # utf8_length, utf8
        if off.pop("version") >> 16 != (version[0] << 8 | version[1]):
            raise LiveTargetError(f"process {mem.pid}: debug offsets of another version than {version}",
                                  cause="not_python")
    else:
        off = dict(OFFSETS[version])
    return Layout(version=version, runtime=runtime, off=off, binary=binary)
