"""Another process's memory, read with ``process_vm_readv``; its mapped ELF files' symbols.

Reads never stop the target: the kernel copies what is there now (``EFAULT`` for an address that is
not mapped: the caller sees :class:`TornRead`). A read the kernel refuses is diagnosed once
(:func:`permission_hint`): another user, Yama's ``ptrace_scope``, a container without
``CAP_SYS_PTRACE``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator, Sequence

from omniprof.errors import LiveTargetError

__all__ = ["ProcessMemory", "TornRead", "find_symbols", "permission_hint", "mapped_files"]

CAP_SYS_PTRACE = 19


class TornRead(Exception):
    """An address the target does not map (now): a pointer read while the target changed it."""


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_readv = _libc.process_vm_readv
_readv.restype = ctypes.c_ssize_t
_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.c_ulong]


def _uids(pid: int) -> tuple[int, int]:
    """(real uid of process pid, effective uid of this process)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1]), os.geteuid()
    return -1, os.geteuid()


def _has_cap(cap: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except OSError:
        pass
    return False


def permission_hint(pid: int) -> str:
    """One line: why this process may not read process ``pid``, and the fix."""
    try:
        target_uid, me = _uids(pid)
    except OSError:
        target_uid, me = -1, os.geteuid()
    has_ptrace = _has_cap(CAP_SYS_PTRACE)
    if target_uid != me and target_uid >= 0 and not has_ptrace:
        import pwd

        try:
            owner = pwd.getpwuid(target_uid).pw_name
        except KeyError:
            owner = str(target_uid)
        fix = "as root (sudo)" if target_uid == 0 else f"as {owner!r} or as root (sudo)"
        return (f"permission denied reading process {pid}: it belongs to user {owner!r} and this is uid {me}; "
                f"run omniprof {fix}")
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip() or 0)
    except (OSError, ValueError):
        scope = 0
    if scope >= 3:
        return (f"permission denied reading process {pid}: kernel.yama.ptrace_scope=3 forbids reading any other "
                f"process until reboot; boot with it lower")
    if scope >= 1 and not has_ptrace:
        return (f"permission denied reading process {pid}: kernel.yama.ptrace_scope={scope} lets a process read "
                f"only its own children; run as root (sudo), or `sudo sysctl kernel.yama.ptrace_scope=0`")
    if not has_ptrace:
        return (f"permission denied reading process {pid}: this process lacks CAP_SYS_PTRACE (a container?); "
                f"run the container with --cap-add SYS_PTRACE, or omniprof in the target's own container")
    return (f"permission denied reading process {pid} (a seccomp filter or LSM refuses process_vm_readv); "
            f"run omniprof outside that sandbox or allow process_vm_readv")


def _check_alive(pid: int) -> None:
    if not os.path.exists(f"/proc/{pid}"):
        raise LiveTargetError(f"no process {pid} (it has exited, or the pid is wrong)", cause="gone")


class ProcessMemory:
    """Fault-safe reads of process ``pid``'s memory."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.reads = 0
        _check_alive(pid)

    def read(self, addr: int, n: int) -> bytes:
        """``n`` bytes at ``addr``; :class:`TornRead` when unmapped, LiveTargetError when refused or gone."""
        if addr < 4096 or n <= 0:
            raise TornRead(addr)
        buf = ctypes.create_string_buffer(n)
        local = _IOVec(ctypes.addressof(buf), n)
        remote = _IOVec(addr, n)
        self.reads += 1
        got = _readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got == n:
            return buf.raw
        self._fail(got, addr)
        raise TornRead(addr)

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """Several regions in one system call; a region that could not be read (and every one after
        it: the kernel stops at the first fault) is None."""
        if not spans:
            return []
        bufs = [ctypes.create_string_buffer(max(n, 1)) for _, n in spans]
        local = (_IOVec * len(spans))(*[_IOVec(ctypes.addressof(b), n) for b, (_, n) in zip(bufs, spans)])
        remote = (_IOVec * len(spans))(*[_IOVec(a if a >= 4096 else 0, n) for a, n in spans])
        self.reads += 1
        got = _readv(self.pid, local, len(spans), remote, len(spans), 0)
        if got < 0:
            self._fail(got, spans[0][0])
            got = 0
        out: list[bytes | None] = []
        for b, (_, n) in zip(bufs, spans):
            if got >= n:
                out.append(b.raw[:n])
                got -= n
            else:
                got = 0
                out.append(None)
        return out

    def _fail(self, got: int, addr: int) -> None:
        err = ctypes.get_errno()
        if got >= 0 or err == errno.EFAULT:
            return
        if err == errno.ESRCH:
            raise LiveTargetError(f"process {self.pid} has exited", cause="gone")
        if err == errno.EPERM:
            raise LiveTargetError(permission_hint(self.pid), cause="permission")
        if err == errno.ENOSYS:
            raise LiveTargetError("process_vm_readv is not available on this kernel (Linux 3.2+ needed)",
                                  cause="permission")
        raise LiveTargetError(f"reading process {self.pid} at {addr:#x} failed: {os.strerror(err)}")

    def u64(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")


def mapped_files(pid: int) -> list[tuple[int, int, str]]:
    """(start address, file offset, path) of every file-backed mapping of ``pid``."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise LiveTargetError(f"no process {pid} (it has exited, or the pid is wrong)", cause="gone") from None
    except PermissionError:
        raise LiveTargetError(permission_hint(pid), cause="permission") from None
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.append((int(parts[0].split("-")[0], 16), int(parts[2], 16), parts[5]))
    return out


def _sections(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(sh_type, sh_offset, sh_size, sh_link, sh_entsize) of each section of a 64-bit ELF."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        _name, sh_type, _flags, _addr, off, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        yield sh_type, off, size, link, entsize


def _first_load_vaddr(data: bytes) -> int:
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    lows = []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr = struct.unpack_from("<IIQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            lows.append(p_vaddr - p_offset)
    return min(lows) if lows else 0


def elf_symbols(path: str, names: Sequence[str]) -> tuple[dict[str, tuple[int, int]], int, bool]:
    """``{name: (st_value, st_size)}`` of the wanted symbols in ELF file ``path`` (.dynsym and .symtab),
    the file's link-time base, and whether it is position-independent."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return {}, 0, False
    e_type, = struct.unpack_from("<H", data, 0x10)
    want = {n.encode() for n in names}
    found: dict[str, tuple[int, int]] = {}
    for sh_type, off, size, link, entsize in list(_sections(data)):
        if sh_type not in (2, 11) or not entsize:  # SHT_SYMTAB, SHT_DYNSYM
            continue
        str_off = list(_sections(data))[link][1]
        for k in range(size // entsize):
            st_name, _info, _other, shndx, value, sz = struct.unpack_from("<IBBHQQ", data, off + k * entsize)
            if not value or not shndx:
                continue
            end = data.index(b"\0", str_off + st_name)
            nm = data[str_off + st_name:end]
            if nm in want:
                found.setdefault(nm.decode(), (value, sz))
        if len(found) == len(want):
            break
    return found, _first_load_vaddr(data), e_type == 3  # ET_DYN


def find_symbols(pid: int, names: Sequence[str]) -> tuple[dict[str, int], str]:
    """Runtime addresses of ``names`` in the first mapped file (the executable, then libpython*) that
    defines the first of them, and that file's path."""
    maps = mapped_files(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    seen: dict[str, int] = {}
    for start, off, path in maps:
        if off == 0 and path not in seen:
            seen[path] = start
    order = [p for p in seen if p == exe] + [p for p in seen if "libpython" in os.path.basename(p)]
    for path in order:
        local = f"/proc/{pid}/root{path}"
        try:
            syms, base, pie = elf_symbols(local if os.path.exists(local) else path, names)
        except (OSError, struct.error, ValueError, IndexError):
            continue
        if names[0] not in syms:
            continue
        bias = seen[path] - base if pie else 0
        return {n: v + bias for n, (v, _) in syms.items()}, path
    return {}, exe
