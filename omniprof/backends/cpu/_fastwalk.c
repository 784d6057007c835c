/*
 * Fast stack walk for the cpu sampler (optional; stacks.walk falls back to pure Python).
 *
 * walk(frame) returns the same leaf-first flat tuple as the Python walk,
 * (id(code), f_lasti, id(code), f_lasti, ...), but on CPython 3.11 and 3.12 it reads the
 * interpreter's frames in place: no frame object is created for the callers (the Python walk's
 * f_back materialises one per level, and each costs again when its function returns).
 * codes(frame) returns the code objects of the same frames (to keep them alive by id).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define OMNIPROF_INTERNAL_FRAMES 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#include <internal/pycore_frame.h>
#endif

#define MAX_DEPTH 4096

/* Walks that stopped at MAX_DEPTH frames with more below (the innermost MAX_DEPTH kept): read by
 * truncated(), so the sampler counts the samples it cut instead of cutting them silently. */
static long long n_truncated;

/* Interned ints: the same code address / offset always gives the same int object, so comparing a
 * new stack tuple with the one already in the sampler's table is a pointer check per item instead
 * of an int comparison (an address is its id() whatever code lives there, so the cache is never
 * stale). */
#define ID_CACHE 4096            /* direct-mapped on the address */
#define OFF_CACHE 65536          /* offsets below this are interned */
static void *id_keys[ID_CACHE];
static PyObject *id_vals[ID_CACHE];
static PyObject *off_vals[OFF_CACHE];

static PyObject *id_int(void *p) {
    size_t h = ((uintptr_t)p >> 4) & (ID_CACHE - 1);
    if (id_keys[h] == p && id_vals[h] != NULL) {
        Py_INCREF(id_vals[h]);
        return id_vals[h];
    }
    PyObject *v = PyLong_FromVoidPtr(p);
    if (!v) return NULL;
    Py_XSETREF(id_vals[h], Py_NewRef(v));
    id_keys[h] = p;
    return v;
}

static PyObject *off_int(long off) {
    if (off < 0 || off >= OFF_CACHE) return PyLong_FromLong(off);
    PyObject *v = off_vals[off];
    if (v == NULL) {
        v = PyLong_FromLong(off);
        if (!v) return NULL;
        off_vals[off] = v;  /* the cache keeps one reference */
    }
    Py_INCREF(v);
    return v;
}

#ifdef OMNIPROF_INTERNAL_FRAMES
static inline int skip(_PyInterpreterFrame *f) {
    if (_PyFrame_IsIncomplete(f)) return 1;
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK) return 1;
#endif
    return 0;
}
#endif

static PyObject *py_walk(PyObject *self, PyObject *arg) {
    if (arg == Py_None) return PyTuple_New(0);
    if (!PyFrame_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "walk() expects a frame or None");
        return NULL;
    }
#ifdef OMNIPROF_INTERNAL_FRAMES
    _PyInterpreterFrame *top = ((PyFrameObject *)arg)->f_frame, *f;
    Py_ssize_t n = 0;
    for (f = top; f != NULL && n < MAX_DEPTH; f = f->previous)
        if (!skip(f)) n++;
    for (; f != NULL; f = f->previous)
        if (!skip(f)) { n_truncated++; break; }
    /* Allocate first: a tuple allocation may run the cyclic GC (and its Python callbacks); the
     * int allocations below cannot, so the frames are read with no Python code in between. */
    PyObject *out = PyTuple_New(2 * n);
    if (!out) return NULL;
    Py_ssize_t i = 0;
    for (f = top; f != NULL && i < 2 * n; f = f->previous) {
        if (skip(f)) continue;
        PyObject *id = id_int((void *)f->f_code);
        int lasti = _PyInterpreterFrame_LASTI(f);
        PyObject *off = off_int(lasti < 0 ? -1 : lasti * (long)sizeof(_Py_CODEUNIT));
        if (!id || !off) { Py_XDECREF(id); Py_XDECREF(off); Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, id);
        PyTuple_SET_ITEM(out, i + 1, off);
        i += 2;
    }
    if (i < 2 * n) {  /* cannot happen: the chain did not change; keep the tuple valid anyway */
        if (_PyTuple_Resize(&out, i) < 0) return NULL;
    }
    return out;
#else
    PyErr_SetString(PyExc_NotImplementedError, "in-place frame walk needs CPython 3.11 or 3.12");
    return NULL;
#endif
}

static PyObject *py_codes(PyObject *self, PyObject *arg) {
    if (arg == Py_None) return PyList_New(0);
    if (!PyFrame_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "codes() expects a frame or None");
        return NULL;
    }
#ifdef OMNIPROF_INTERNAL_FRAMES
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    _PyInterpreterFrame *f = ((PyFrameObject *)arg)->f_frame;
    for (int depth = 0; f != NULL && depth < MAX_DEPTH; f = f->previous, depth++) {
        if (skip(f)) continue;
        if (PyList_Append(out, (PyObject *)f->f_code) < 0) { Py_DECREF(out); return NULL; }
    }
    return out;
#else
    PyErr_SetString(PyExc_NotImplementedError, "in-place frame walk needs CPython 3.11 or 3.12");
    return NULL;
#endif
}

static PyObject *py_truncated(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(n_truncated);
}

static PyMethodDef methods[] = {
    {"truncated", py_truncated, METH_NOARGS, "truncated() -> walks so far cut at MAX_DEPTH frames (the innermost kept)"},
    {"walk", py_walk, METH_O, "walk(frame) -> leaf-first (id(code), f_lasti, ...) tuple, read in place"},
    {"codes", py_codes, METH_O, "codes(frame) -> code objects of frame and its callers, leaf first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastwalk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastwalk(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
