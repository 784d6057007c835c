"""Python objects of another process, read from outside: dicts, ints, an instance's attributes.

Enough to name threads: ``sys.modules["threading"]._active`` maps each thread's ident to its
``Thread``, whose ``_name`` is the name. Layouts: 3.10 keeps an instance's ``__dict__`` at the type's
``tp_dictoffset`` and its dict keys in ``Objects/dict-common.h`` (not installed, so written here);
3.11+ keep a "managed" dict before the object (3.11: values at -32, dict at -24; 3.12: one word at
-24, the values' address - 1 (odd) or the dict's; 3.13: dict at -24, values inline after the
object), the keys shared in the type.
"""

from __future__ import annotations

import struct

from omniprof.live.memory import ProcessMemory, TornRead

__all__ = ["ObjectReader"]

_MAX_ENTRIES = 1 << 16
# 3.10's PyDictKeysObject (Objects/dict-common.h): refcnt, size, lookup, usable, nentries, indices[]
_KEYS_310 = {"dictkeys.size": 8, "dictkeys.nentries": 32, "dictkeys.indices": 40}


class ObjectReader:
    """Reads dicts, ints, strs and attributes of process ``mem.pid``'s objects (offsets ``off``)."""

    def __init__(self, mem: ProcessMemory, off: dict[str, int], version: tuple[int, int], read_str: object) -> None:
        self.mem, self.version = mem, version
        self.off = {**_KEYS_310, **off} if version < (3, 11) else off
        self.read_str = read_str  # PythonProcess.read_str

    def _u64(self, addr: int) -> int:
        return self.mem.u64(addr)

    def dict_items(self, d: int, keys: int = 0, values: int = 0) -> list[tuple[int, int]]:
        """(key address, value address) of each live entry of the dict at ``d`` (or of the keys
        object ``keys`` with the split values array ``values``, when ``d`` is 0)."""
        o = self.off
        if d:
            keys = self._u64(d + o["dict.ma_keys"])
            values = self._u64(d + o["dict.ma_values"])
            if values and self.version >= (3, 11):
                values += o["dictvalues.values"]
        if self.version < (3, 11):
            hdr = self.mem.read(keys, o["dictkeys.indices"])
            size, = struct.unpack_from("<q", hdr, o["dictkeys.size"])
            n, = struct.unpack_from("<q", hdr, o["dictkeys.nentries"])
            ix = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
            entries, width, general = keys + o["dictkeys.indices"] + size * ix, 24, True
        else:
            hdr = self.mem.read(keys, o["dictkeys.indices"])
            log2_index = hdr[o["dictkeys.log2_index_bytes"]]
            n, = struct.unpack_from("<q", hdr, o["dictkeys.nentries"])
            general = hdr[o["dictkeys.kind"]] == 0  # DICT_KEYS_GENERAL: (hash, key, value)
            entries, width = keys + o["dictkeys.indices"] + (1 << log2_index), 24 if general else 16
        if not 0 <= n <= _MAX_ENTRIES:
            raise TornRead(keys)
        raw = self.mem.read(entries, n * width) if n else b""
        vals = struct.unpack(f"<{n}Q", self.mem.read(values, 8 * n)) if values and n else None
        out = []
        for i in range(n):
            base = i * width + (8 if general else 0)
            k, v = struct.unpack_from("<QQ", raw, base)
            if vals is not None:
                v = vals[i]
            if k and v:
                out.append((k, v))
        return out

    def str_or_none(self, addr: int) -> str | None:
        try:
            return self.read_str(addr)  # type: ignore[operator]
        except TornRead:
            return None

    def lookup(self, items: list[tuple[int, int]], name: str) -> int:
        """The value of str key ``name`` among ``items`` (0: absent)."""
        for k, v in items:
            if self.str_or_none(k) == name:
                return v
        return 0

    def read_int(self, addr: int) -> int:
        """A non-negative ``int`` object's value (30-bit digits)."""
        o = self.off
        if "long.tag" in o:  # 3.12+: digits count in lv_tag >> 3, sign in its low bits
            tag = self._u64(addr + o["long.tag"])
            n, negative = tag >> 3, (tag & 3) == 2
        else:
            n = struct.unpack("<q", self.mem.read(addr + o["long.size"], 8))[0]
            negative, n = n < 0, abs(n)
        if n > 8:
            raise TornRead(addr)
        digits = struct.unpack(f"<{n}I", self.mem.read(addr + o["long.digits"], 4 * n)) if n else ()
        value = sum(d << (30 * i) for i, d in enumerate(digits))
        return -value if negative else value

    def attrs_of(self, obj: int) -> list[tuple[int, int]]:
        """(key, value) addresses of an instance's attributes (its ``__dict__`` or inline values)."""
        o, v = self.off, self.version
        tp = self._u64(obj + 8)
        if v < (3, 11):
            dictoffset = struct.unpack("<q", self.mem.read(tp + o["type.dictoffset"], 8))[0]
            d = self._u64(obj + dictoffset) if dictoffset > 0 else 0
            return self.dict_items(d) if d else []
        flags = self._u64(tp + o["type.flags"]) if "type.flags" in o else 0
        cached = self._u64(tp + o["heaptype.cached_keys"])
        vals_at = o["dictvalues.values"]
        if v < (3, 12):
            if not flags & o["flag.managed_dict"]:
                return []
            values, d = self._u64(obj - 32), self._u64(obj - 24)
            if d:
                return self.dict_items(d)
            return self.dict_items(0, cached, values + vals_at) if values and cached else []
        if v < (3, 13):
            if not flags & o["flag.managed_dict"]:
                return []
            word = self._u64(obj - 24)
            if word & 1:  # values, stored as their address - 1
                return self.dict_items(0, cached, word + 1 + vals_at) if cached else []
            return self.dict_items(word) if word else []
        d = self._u64(obj - 24) if flags & o["flag.managed_dict"] else 0
        if d:
            return self.dict_items(d)
        if flags & o["flag.inline_values"] and cached:
            basicsize = struct.unpack("<q", self.mem.read(tp + o["type.basicsize"], 8))[0]
            return self.dict_items(0, cached, obj + basicsize + vals_at)
        return []

    def thread_names(self, interp: int) -> dict[int, str]:
        """``threading._active``: thread ident -> name (empty when threading was never imported)."""
        o = self.off
        modules = self._u64(interp + o["interp.modules"])
        if not modules:
            return {}
        threading = self.lookup(self.dict_items(modules), "threading")
        if not threading:
            return {}
        md_dict = self._u64(threading + 16)  # PyModuleObject: PyObject_HEAD, then md_dict
        active = self.lookup(self.dict_items(md_dict), "_active")
        out = {}
        for k, thread in self.dict_items(active) if active else []:
            name = self.lookup(self.attrs_of(thread), "_name")
            text = self.str_or_none(name) if name else None
            if text is not None:
                out[self.read_int(k)] = text
        return out
