/* A reference for the cpu engine's accuracy: where the interpreter REALLY is at random instants.
 *
 * A SIGPROF timer (process CPU time) interrupts the busy thread between two machine instructions; the
 * handler, running on that thread, reads the thread's own current frame (code and instruction) from
 * memory nothing else is changing at that moment. No race with the thread, no reading from outside:
 * what the native engine approximates with reads from another thread, this gets exactly (at the
 * price of running on the profiled thread, which is why it is a test tool and not an engine).
 *
 *   start(interval_us, thread_ident)  record that thread's stack at each interrupt
 *   stop() -> ([(code address, offset)], interrupts that landed on other threads)
 *   stacks() -> [tuple of code addresses, leaf first] of the last run, one per pair above
 * The chain is read by following `previous` from the current frame: the interpreter links a new
 * frame to its caller before making it current, so the chain is whole at any instruction.
 */
#define PY_SSIZE_T_CLEAN
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#else
#include "frameobject.h"
#endif
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>

#define CAP (1 << 20)
#define WCAP (1 << 23)
#define MAXD 512
static uintptr_t ref_codes[CAP];
static int64_t ref_offs[CAP];
static uint32_t ref_start[CAP], ref_len[CAP];
static uintptr_t ref_words[WCAP];
static long ref_nw;
static volatile long ref_n, ref_missed;
static PyThreadState *ref_ts;
static pthread_t ref_thread;
static struct sigaction ref_old;

static void on_prof(int sig) {
    (void)sig;
    if (!pthread_equal(pthread_self(), ref_thread)) { ref_missed++; return; }
    if (ref_n >= CAP) return;
    PyThreadState *ts = ref_ts;
    uintptr_t code = 0;
    int64_t off = -1;
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
    while (f && f->owner == FRAME_OWNED_BY_CSTACK) f = f->previous;
    if (f) {
        code = (uintptr_t)f->f_executable;
        off = (int64_t)((char *)f->instr_ptr - (char *)_PyCode_CODE((PyCodeObject *)f->f_executable));
    }
#elif PY_VERSION_HEX >= 0x030B0000
    _PyInterpreterFrame *f = ts->cframe ? ts->cframe->current_frame : NULL;
#if PY_VERSION_HEX >= 0x030C0000
    while (f && f->owner == FRAME_OWNED_BY_CSTACK) f = f->previous;
#endif
    if (f) {
        code = (uintptr_t)f->f_code;
        off = (int64_t)((char *)f->prev_instr - (char *)_PyCode_CODE(f->f_code));
    }
#else
    PyFrameObject *f = ts->frame;
    if (f) {
        code = (uintptr_t)f->f_code;
        off = (int64_t)f->f_lasti * 2;
    }
#endif
    ref_codes[ref_n] = code;
    ref_offs[ref_n] = off;
    ref_start[ref_n] = (uint32_t)ref_nw;
    uint32_t d = 0;
#if PY_VERSION_HEX >= 0x030B0000
    for (_PyInterpreterFrame *g = f; g && d < MAXD && ref_nw < WCAP; g = g->previous) {
#if PY_VERSION_HEX >= 0x030C0000
        if (g->owner == FRAME_OWNED_BY_CSTACK) continue;
#endif
#if PY_VERSION_HEX >= 0x030D0000
        ref_words[ref_nw++] = (uintptr_t)g->f_executable;
#else
        ref_words[ref_nw++] = (uintptr_t)g->f_code;
#endif
        d++;
    }
#else
    for (PyFrameObject *g = f; g && d < MAXD && ref_nw < WCAP; g = g->f_back) {
        ref_words[ref_nw++] = (uintptr_t)g->f_code;
        d++;
    }
#endif
    ref_len[ref_n] = d;
    ref_n++;
}

static PyObject *start(PyObject *self, PyObject *args) {
    long interval_us;
    unsigned long ident;
    if (!PyArg_ParseTuple(args, "lk", &interval_us, &ident)) return NULL;
    PyThreadState *ts = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
    while (ts && ts->thread_id != ident) ts = PyThreadState_Next(ts);
    if (!ts) { PyErr_SetString(PyExc_ValueError, "no such thread"); return NULL; }
    ref_ts = ts;
    ref_thread = (pthread_t)ident;
    ref_n = ref_missed = 0;
    ref_nw = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_prof;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, &ref_old) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    struct itimerval it = {{interval_us / 1000000, interval_us % 1000000}, {interval_us / 1000000, interval_us % 1000000}};
    if (setitimer(ITIMER_PROF, &it, NULL) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *stop(PyObject *self, PyObject *noargs) {
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    sigaction(SIGPROF, &ref_old, NULL);
    PyObject *out = PyList_New(ref_n);
    if (!out) return NULL;
    for (long i = 0; i < ref_n; i++) {
        PyObject *t = Py_BuildValue("(KL)", (unsigned long long)ref_codes[i], (long long)ref_offs[i]);
        if (!t) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, t);
    }
    return Py_BuildValue("(Nl)", out, (long)ref_missed);
}

static PyObject *stacks(PyObject *self, PyObject *noargs) {
    PyObject *out = PyList_New(ref_n);
    if (!out) return NULL;
    for (long i = 0; i < ref_n; i++) {
        PyObject *t = PyTuple_New(ref_len[i]);
        if (!t) { Py_DECREF(out); return NULL; }
        for (uint32_t k = 0; k < ref_len[i]; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)ref_words[ref_start[i] + k]);
            if (!v) { Py_DECREF(t); Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(t, k, v);
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"stacks", stacks, METH_NOARGS, "stacks() -> [tuple of code addresses, leaf first] of the last run"},
    {"start", start, METH_VARARGS, "start(interval_us, thread_ident)"},
    {"stop", stop, METH_NOARGS, "stop() -> ([(code address, offset)], interrupts on other threads)"},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_inthread_ref", NULL, -1, methods};
PyMODINIT_FUNC PyInit__inthread_ref(void) { return PyModule_Create(&mod); }
