"""Derive the struct offsets ``omniprof.live`` needs for CPython 3.10-3.12 from each interpreter's own headers.

For each python given (default: every pyenv 3.10-3.12 found), a small C program is compiled against that
python's internal headers (``Py_BUILD_CORE``) and prints ``offsetof()`` / ``sizeof()`` of the fields the
out-of-process reader follows; the result is one entry per minor version. CPython 3.13+ publishes the
same offsets in ``_PyRuntime.debug_offsets``: its entry holds only the few that those lack.

    python benchmarks/live/gen_offsets.py            # print the table
    python benchmarks/live/gen_offsets.py --write    # rewrite omniprof/live/_offsets.py

tests/test_live_offsets.py derives them again for the pythons present and compares.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pprint
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, os.pardir, os.pardir, "omniprof", "live", "_offsets.py")

# (key, C expression): evaluated as a long long
COMMON = [
    ("runtime.interpreters_head", "offsetof(_PyRuntimeState, interpreters.head)"),
    ("tstate.next", "offsetof(PyThreadState, next)"),
    ("tstate.interp", "offsetof(PyThreadState, interp)"),
    ("tstate.thread_id", "offsetof(PyThreadState, thread_id)"),
    ("tstate.size", "sizeof(PyThreadState)"),
    ("gil.locked", "offsetof(struct _gil_runtime_state, locked)"),
    ("gil.holder", "offsetof(struct _gil_runtime_state, last_holder)"),
    ("code.name", "offsetof(PyCodeObject, co_name)"),
    ("code.filename", "offsetof(PyCodeObject, co_filename)"),
    ("code.firstlineno", "offsetof(PyCodeObject, co_firstlineno)"),
    ("code.linetable", "offsetof(PyCodeObject, co_linetable)"),
    ("unicode.state", "offsetof(PyASCIIObject, state)"),
    ("unicode.length", "offsetof(PyASCIIObject, length)"),
    ("unicode.ascii_size", "sizeof(PyASCIIObject)"),
    ("unicode.compact_size", "sizeof(PyCompactUnicodeObject)"),
    ("bytes.ob_sval", "offsetof(PyBytesObject, ob_sval)"),
    ("type.tp_name", "offsetof(PyTypeObject, tp_name)"),
]
PER_MINOR = {
    (3, 10): [
        ("interp.threads_head", "offsetof(PyInterpreterState, tstate_head)"),
        ("runtime.gil", "offsetof(_PyRuntimeState, ceval.gil)"),
        ("tstate.frame", "offsetof(PyThreadState, frame)"),
        ("frame.previous", "offsetof(PyFrameObject, f_back)"),
        ("frame.code", "offsetof(PyFrameObject, f_code)"),
        ("frame.lasti", "offsetof(PyFrameObject, f_lasti)"),
        ("code.code", "offsetof(PyCodeObject, co_code)"),
    ],
    (3, 11): [("runtime.gil", "offsetof(_PyRuntimeState, ceval.gil)")],
    (3, 12): [("interp.ceval_gil", "offsetof(PyInterpreterState, ceval.gil)"),
              ("frame.owner_cstack", "FRAME_OWNED_BY_CSTACK")],
}
# 3.11 and 3.12: _PyInterpreterFrame in the thread's data stack, reached through tstate->cframe
_FRAMES_311 = [
    ("interp.threads_head", "offsetof(PyInterpreterState, threads.head)"),
    ("tstate.native_thread_id", "offsetof(PyThreadState, native_thread_id)"),
    ("tstate.cframe", "offsetof(PyThreadState, cframe)"),
    ("cframe.current_frame", "offsetof(_PyCFrame, current_frame)"),
    ("frame.previous", "offsetof(_PyInterpreterFrame, previous)"),
    ("frame.code", "offsetof(_PyInterpreterFrame, f_code)"),
    ("frame.instr", "offsetof(_PyInterpreterFrame, prev_instr)"),
    ("frame.owner", "offsetof(_PyInterpreterFrame, owner)"),
    ("code.code_adaptive", "offsetof(PyCodeObject, co_code_adaptive)"),
    ("code.qualname", "offsetof(PyCodeObject, co_qualname)"),
]
PER_MINOR[(3, 11)] += _FRAMES_311
PER_MINOR[(3, 12)] += _FRAMES_311
# 3.11+: a thread's frames live in its data stack (chunks): read in one piece
_CHUNK = [
    ("tstate.datastack_chunk", "offsetof(PyThreadState, datastack_chunk)"),
    ("tstate.datastack_top", "offsetof(PyThreadState, datastack_top)"),
    ("chunk.data", "offsetof(_PyStackChunk, data)"),
]
PER_MINOR[(3, 11)] += _CHUNK
PER_MINOR[(3, 12)] += _CHUNK
# objects, to read thread names (threading._active: {ident: Thread}) from sys.modules
_OBJECTS = [
    ("type.dictoffset", "offsetof(PyTypeObject, tp_dictoffset)"),
    ("type.basicsize", "offsetof(PyTypeObject, tp_basicsize)"),
    ("type.flags", "offsetof(PyTypeObject, tp_flags)"),
    ("heaptype.cached_keys", "offsetof(PyHeapTypeObject, ht_cached_keys)"),
    ("dict.ma_keys", "offsetof(PyDictObject, ma_keys)"),
    ("dict.ma_values", "offsetof(PyDictObject, ma_values)"),
]
_KEYS_311 = [
    ("dictkeys.log2_size", "offsetof(PyDictKeysObject, dk_log2_size)"),
    ("dictkeys.log2_index_bytes", "offsetof(PyDictKeysObject, dk_log2_index_bytes)"),
    ("dictkeys.kind", "offsetof(PyDictKeysObject, dk_kind)"),
    ("dictkeys.nentries", "offsetof(PyDictKeysObject, dk_nentries)"),
    ("dictkeys.indices", "offsetof(PyDictKeysObject, dk_indices)"),
    ("dictvalues.values", "offsetof(PyDictValues, values)"),
    ("flag.managed_dict", "Py_TPFLAGS_MANAGED_DICT"),
]
PER_MINOR[(3, 10)] += _OBJECTS + [("interp.modules", "offsetof(PyInterpreterState, modules)"),
                                  ("long.size", "offsetof(PyVarObject, ob_size)"),
                                  ("long.digits", "offsetof(PyLongObject, ob_digit)")]
PER_MINOR[(3, 11)] += _OBJECTS + _KEYS_311 + [("interp.modules", "offsetof(PyInterpreterState, modules)"),
                                              ("long.size", "offsetof(PyVarObject, ob_size)"),
                                              ("long.digits", "offsetof(PyLongObject, ob_digit)")]
PER_MINOR[(3, 12)] += _OBJECTS + _KEYS_311 + [("interp.modules", "offsetof(PyInterpreterState, imports.modules)"),
                                              ("long.tag", "offsetof(PyLongObject, long_value.lv_tag)"),
                                              ("long.digits", "offsetof(PyLongObject, long_value.ob_digit)")]
#: 3.13: only what _PyRuntime.debug_offsets does not publish
EXTRA_ONLY = {(3, 13): _CHUNK + _KEYS_311 + [
    ("type.dictoffset", "offsetof(PyTypeObject, tp_dictoffset)"),
    ("type.basicsize", "offsetof(PyTypeObject, tp_basicsize)"),
    ("heaptype.cached_keys", "offsetof(PyHeapTypeObject, ht_cached_keys)"),
    ("flag.inline_values", "Py_TPFLAGS_INLINE_VALUES")]}
HEADERS = {
    (3, 10): ["internal/pycore_runtime.h", "internal/pycore_interp.h", "frameobject.h"],
    (3, 11): ["internal/pycore_runtime.h", "internal/pycore_interp.h", "internal/pycore_frame.h",
              "internal/pycore_dict.h"],
    (3, 12): ["internal/pycore_runtime.h", "internal/pycore_interp.h", "internal/pycore_frame.h",
              "internal/pycore_dict.h"],
    (3, 13): ["internal/pycore_runtime.h", "internal/pycore_interp.h", "internal/pycore_frame.h",
              "internal/pycore_dict.h"],
}


def pythons() -> list[str]:
    """The pyenv pythons 3.10-3.13 present on this machine."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    out = []
    for minor in (10, 11, 12, 13):
        out += sorted(glob.glob(os.path.join(root, "versions", f"3.{minor}.*", "bin", f"python3.{minor}")))[-1:]
    return out


def derive(python: str) -> tuple[tuple[int, int], dict[str, int]]:
    """(major, minor), {key: value} for one python, read from its headers by a compiled program."""
    info = json.loads(subprocess.run(
        [python, "-c", "import json, sys, sysconfig; print(json.dumps([sys.version_info[:2], "
                       "sysconfig.get_paths()['include'], sysconfig.get_config_var('CC') or 'cc']))"],
        check=True, capture_output=True, text=True).stdout)
    ver, include = tuple(info[0]), info[1]
    fields = EXTRA_ONLY[ver] if ver in EXTRA_ONLY else COMMON + PER_MINOR[ver]
    src = ["#define Py_BUILD_CORE 1", "#include <Python.h>", "#include <stddef.h>", "#include <stdio.h>"]
    src += [f"#include <{h}>" for h in HEADERS[ver]]
    src.append("int main(void) {")
    src += [f'    printf("%s %lld\\n", "{k}", (long long)({expr}));' for k, expr in fields]
    src += ["    return 0;", "}"]
    with tempfile.TemporaryDirectory() as tmp:
        c, exe = os.path.join(tmp, "offsets.c"), os.path.join(tmp, "offsets")
        with open(c, "w") as f:
            f.write("\n".join(src) + "\n")
        subprocess.run(["cc", "-w", "-I", include, c, "-o", exe], check=True, capture_output=True, text=True)
        lines = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n")
    return ver, {k: int(v) for k, v in (ln.split() for ln in lines if ln)}


def render(table: dict[tuple[int, int], dict[str, int]]) -> str:
    return ('"""Struct offsets of CPython 3.10-3.13 (x86-64/aarch64 Linux builds), for the out-of-process reader.\n\n'
            "Generated by ``benchmarks/live/gen_offsets.py --write`` from each version's internal headers; do not\n"
            'edit. 3.13 reads most from ``_PyRuntime.debug_offsets``: its entry holds only the rest."""\n\n'
            f"OFFSETS: dict[tuple[int, int], dict[str, int]] = {pprint.pformat(table, width=110, sort_dicts=True)}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("python", nargs="*", help="interpreters to read (default: pyenv's 3.10-3.13)")
    ap.add_argument("--write", action="store_true", help="rewrite omniprof/live/_offsets.py")
    ns = ap.parse_args()
    table = dict(derive(p) for p in (ns.python or pythons()))
    if ns.write:
        tmp = TABLE + ".tmp"
        with open(tmp, "w") as f:
            f.write(render(table))
        os.replace(tmp, TABLE)
    else:
        pprint.pprint(table, width=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
