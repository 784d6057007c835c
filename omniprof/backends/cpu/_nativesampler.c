/*
 * The cpu backend's native sampling engine (optional; the backend falls back to the signal engine).
 *
 * A native thread (pthread, never a Python thread, never holding the GIL) wakes at jittered
 * intervals around the requested one and reads the frame stack of every Python thread of this
 * interpreter where it is at that moment: the thread-state list, each thread's current frame, and
 * every frame's code object and instruction pointer, so the line is the one executing, not the next
 * eval-breaker check's. Nothing waits for the GIL or for a safe point; no ptrace. A thread that is
 * running is asked by a real-time signal to copy its own state (snapshot_running()), so what is
 * read is one instant of it; others are read from outside.
 *
 * Safety: the other threads keep running while we read, so a pointer read from their structures may
 * be stale by the time it is followed. Every read of interpreter memory goes through
 * process_vm_readv() on our own pid (the kernel copies and returns EFAULT for an unmapped address
 * instead of faulting; a process may always read itself, whatever Yama or ptrace rules say) or,
 * where that syscall is refused (seccomp), through write() into a pipe (same EFAULT contract).
 * What is read is validated: a thread state must point back at our interpreter, a code object's
 * type must be PyCode_Type, an instruction pointer must lie inside its code, depth is bounded.
 * A thread sample that fails any check is counted as torn and not recorded.
 *
 * No Python API runs off the GIL: the engine records raw (code address, byte offset) pairs; code
 * objects are looked up and validated later, under the GIL, by resolve_codes().
 *
 * Struct offsets come from this interpreter's own headers (3.10-3.12, internal headers with
 * Py_BUILD_CORE) or from _PyRuntime.debug_offsets (3.13), the offsets CPython publishes for
 * out-of-process tools.
 */
#define PY_SSIZE_T_CLEAN
#if defined(__linux__)
/* internal headers (struct layouts) need Py_BUILD_CORE before Python.h, as CPython's own modules do */
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#endif
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>

#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030E0000 && defined(__linux__)
#define OMNIPROF_NATIVE 1
#endif

#ifdef OMNIPROF_NATIVE
#include <internal/pycore_interp.h>
#include <internal/pycore_runtime.h>
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#endif
#if PY_VERSION_HEX < 0x030D0000
#include <internal/pycore_gil.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <linux/futex.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#endif

#define MODE_WALL 0
#define MODE_CPU 1
#define MODE_GIL 2

/* flags of a sample */
#define F_IDLE 1u     /* the thread was not on a CPU since the previous tick */
#define F_GIL 2u      /* the thread held the GIL at the tick */

#ifdef OMNIPROF_NATIVE

/* ---------------------------------------------------------------------------------------------
 * Offsets
 */
typedef struct {
    size_t interp_head;       /* PyInterpreterState -> first PyThreadState */
    size_t ts_next, ts_interp, ts_thread_id, ts_native_id, ts_frame;
    int ts_frame_via_cframe;  /* 3.11/3.12: ts_frame is tstate->cframe; cframe->current_frame */
    size_t cframe_current;
    size_t ts_size;           /* bytes of PyThreadState to read (covers every field above) */
    size_t ts_chunk, ts_top;  /* 3.11+: the thread's frame data stack (chunk, top): copied in one read */
    size_t chunk_data, chunk_size, chunk_prev, chunk_top;
    int legacy;               /* 3.10: PyFrameObject chain (f_back, f_code, f_lasti in code units) */
    size_t fr_code, fr_previous, fr_instr, fr_owner, fr_size;
    size_t fr_gen;            /* 3.10: PyFrameObject.f_gen, the generator/coroutine running the frame */
    size_t fr_state;          /* 3.10: PyFrameObject.f_state (a frame on a thread's stack is executing) */
    int owner_cstack;         /* owner value of C-stack shim frames (-1: none) */
    size_t code_adaptive, code_firstlineno, code_name, code_filename;
    uintptr_t gil;            /* address of the GIL state (0: unknown) */
    size_t gil_holder, gil_locked;
    int gil_via_interp;       /* 3.12+: the GIL state pointer is read from interp */
    size_t interp_gil_ptr;
} offsets_t;

static offsets_t O;

#define MAXOF(a, b) ((a) > (b) ? (a) : (b))
#if PY_VERSION_HEX >= 0x030B0000
#define OWNED_BY_GENERATOR FRAME_OWNED_BY_GENERATOR
#else
#define OWNED_BY_GENERATOR 1
#endif

static int init_offsets(PyInterpreterState *interp) {
    memset(&O, 0, sizeof O);
    O.owner_cstack = -1;
#if PY_VERSION_HEX >= 0x030D0000
    _Py_DebugOffsets *d = &_PyRuntime.debug_offsets;
    if (memcmp(d->cookie, _Py_Debug_Cookie, sizeof d->cookie) != 0) return -1;
    O.interp_head = (size_t)d->interpreter_state.threads_head;
    O.ts_next = (size_t)d->thread_state.next;
    O.ts_interp = (size_t)d->thread_state.interp;
    O.ts_thread_id = (size_t)d->thread_state.thread_id;
    O.ts_native_id = (size_t)d->thread_state.native_thread_id;
    O.ts_frame = (size_t)d->thread_state.current_frame;
    O.ts_size = (size_t)d->thread_state.size;
    O.fr_code = (size_t)d->interpreter_frame.executable;
    O.fr_previous = (size_t)d->interpreter_frame.previous;
    O.fr_instr = (size_t)d->interpreter_frame.instr_ptr;
    O.fr_owner = (size_t)d->interpreter_frame.owner;
    O.fr_size = MAXOF(MAXOF(O.fr_code, O.fr_previous), MAXOF(O.fr_instr, O.fr_owner)) + 8;
    O.owner_cstack = FRAME_OWNED_BY_CSTACK;
    O.code_adaptive = (size_t)d->code_object.co_code_adaptive;
    O.code_firstlineno = (size_t)d->code_object.firstlineno;
    O.code_name = (size_t)d->code_object.name;
    O.code_filename = (size_t)d->code_object.filename;
    O.gil_via_interp = 1;
    O.interp_gil_ptr = offsetof(PyInterpreterState, ceval.gil);
    O.gil_holder = offsetof(struct _gil_runtime_state, last_holder);
    O.gil_locked = offsetof(struct _gil_runtime_state, locked);
#else
#if PY_VERSION_HEX >= 0x030B0000
    O.interp_head = offsetof(PyInterpreterState, threads.head);
    O.ts_frame = offsetof(PyThreadState, cframe);
    O.ts_frame_via_cframe = 1;
    O.cframe_current = offsetof(_PyCFrame, current_frame);
    O.fr_code = offsetof(_PyInterpreterFrame, f_code);
    O.fr_previous = offsetof(_PyInterpreterFrame, previous);
    O.fr_instr = offsetof(_PyInterpreterFrame, prev_instr);
    O.fr_owner = offsetof(_PyInterpreterFrame, owner);
    O.fr_size = MAXOF(MAXOF(O.fr_code, O.fr_previous), MAXOF(O.fr_instr, O.fr_owner)) + 8;
#if PY_VERSION_HEX >= 0x030C0000
    O.owner_cstack = FRAME_OWNED_BY_CSTACK;
#endif
    O.code_adaptive = offsetof(PyCodeObject, co_code_adaptive);
#else
    O.interp_head = offsetof(PyInterpreterState, tstate_head);
    O.ts_frame = offsetof(PyThreadState, frame);
    O.legacy = 1;
    O.fr_code = offsetof(PyFrameObject, f_code);
    O.fr_previous = offsetof(PyFrameObject, f_back);
    O.fr_instr = offsetof(PyFrameObject, f_lasti);
    O.fr_owner = 0;
#if PY_VERSION_HEX < 0x030B0000
    O.fr_gen = offsetof(PyFrameObject, f_gen);
    O.fr_state = offsetof(PyFrameObject, f_state);
#endif
    O.fr_size = MAXOF(MAXOF(O.fr_code, O.fr_previous), MAXOF(MAXOF(O.fr_instr, O.fr_gen), O.fr_state)) + 8;
    O.code_adaptive = 0;
#endif
    O.ts_next = offsetof(PyThreadState, next);
    O.ts_interp = offsetof(PyThreadState, interp);
    O.ts_thread_id = offsetof(PyThreadState, thread_id);
#if PY_VERSION_HEX >= 0x030B0000
    O.ts_native_id = offsetof(PyThreadState, native_thread_id);
#else
    O.ts_native_id = (size_t)-1;  /* 3.10 keeps no native id in the thread state: set_native_ids() */
#endif
    O.ts_size = sizeof(PyThreadState);
    O.code_firstlineno = offsetof(PyCodeObject, co_firstlineno);
    O.code_name = offsetof(PyCodeObject, co_name);
    O.code_filename = offsetof(PyCodeObject, co_filename);
#if PY_VERSION_HEX >= 0x030C0000
    O.gil_via_interp = 1;
    O.interp_gil_ptr = offsetof(PyInterpreterState, ceval.gil);
#else
    O.gil = (uintptr_t)&_PyRuntime.ceval.gil;
#endif
    O.gil_holder = offsetof(struct _gil_runtime_state, last_holder);
    O.gil_locked = offsetof(struct _gil_runtime_state, locked);
#endif
#if PY_VERSION_HEX >= 0x030B0000
    /* 3.11+: the thread's frame data stack, in chunks (the same layout in every version) */
    O.ts_chunk = offsetof(PyThreadState, datastack_chunk);
    O.ts_top = offsetof(PyThreadState, datastack_top);
    O.chunk_data = offsetof(_PyStackChunk, data);
    O.chunk_size = offsetof(_PyStackChunk, size);
    O.chunk_prev = offsetof(_PyStackChunk, previous);
    O.chunk_top = offsetof(_PyStackChunk, top);
    if (O.ts_size < O.ts_top + 8) O.ts_size = O.ts_top + 8;
#endif
    (void)interp;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Fault-safe reads
 */
static pid_t self_pid;
static int use_pipe = 0;
static int pipe_fd[2] = {-1, -1};

static int read_pipe(void *dst, uintptr_t src, size_t n) {
    /* write() copies from our memory in the kernel: EFAULT for an unmapped source */
    ssize_t w = write(pipe_fd[1], (const void *)src, n);
    if (w != (ssize_t)n) {
        if (w > 0) { char junk[512]; while (read(pipe_fd[0], junk, sizeof junk) > 0) {} }
        return -1;
    }
    return read(pipe_fd[0], dst, n) == (ssize_t)n ? 0 : -1;
}

static inline int safe_read(void *dst, uintptr_t src, size_t n) {
    if (src < 4096 || src + n < src) return -1;
    if (use_pipe) return read_pipe(dst, src, n);
    struct iovec l = {dst, n}, r = {(void *)src, n};
    return process_vm_readv(self_pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : -1;
}

/* Check that fault-safe reads work here; choose the pipe where process_vm_readv is refused. */
static int setup_reads(char *why, size_t why_len) {
    self_pid = getpid();
    static volatile uint64_t probe = 0x0123456789abcdefULL;
    uint64_t got = 0;
    struct iovec l = {&got, 8}, r = {(void *)&probe, 8};
    errno = 0;
    const char *force = getenv("OMNIPROF_NATIVE_READS");  /* "pipe": test the fallback path */
    if (!(force && strcmp(force, "pipe") == 0) && process_vm_readv(self_pid, &l, 1, &r, 1, 0) == 8 && got == probe) {
        /* an unmapped page must fail cleanly */
        if (process_vm_readv(self_pid, &l, 1, &(struct iovec){(void *)8, 8}, 1, 0) < 0 && errno == EFAULT) {
            use_pipe = 0;
            return 0;
        }
    }
    int err = errno;
    if (pipe_fd[0] < 0) {
        if (pipe(pipe_fd) != 0) {
            snprintf(why, why_len, "process_vm_readv refused (errno %d) and no pipe available", err);
            return -1;
        }
        fcntl(pipe_fd[0], F_SETFL, O_NONBLOCK);
        fcntl(pipe_fd[1], F_SETFL, O_NONBLOCK);
    }
    use_pipe = 1;
    got = 0;
    if (read_pipe(&got, (uintptr_t)&probe, 8) == 0 && got == probe && read_pipe(&got, 4096 * 3 - 8, 8) != 0) return 0;
    snprintf(why, why_len, "neither process_vm_readv (errno %d) nor pipe copies read memory safely here", err);
    return -1;
}

/* Several regions copied in one system call, as close to one instant as can be. writev() to a pipe
 * copies each region with copy_from_user (fault-safe, no page pinning): the regions are read
 * nanoseconds apart, where process_vm_readv pins each page first (hundreds of nanoseconds between
 * regions: longer than a short Python call). Returns the bytes copied into `l` (the regions in order;
 * a fault ends the copy there), or -1. */
static int snap_pipe[2] = {-1, -1};
static size_t snap_pipe_cap;

static ssize_t gather_read(struct iovec *l, struct iovec *r, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += r[i].iov_len;
    if (snap_pipe[0] < 0) {
        if (pipe(snap_pipe) == 0) {
            fcntl(snap_pipe[0], F_SETFL, O_NONBLOCK);
            fcntl(snap_pipe[1], F_SETFL, O_NONBLOCK);
            fcntl(snap_pipe[1], F_SETPIPE_SZ, 1 << 20);
            int cap = fcntl(snap_pipe[1], F_GETPIPE_SZ);
            snap_pipe_cap = cap > 0 ? (size_t)cap : 0;
        } else {
            snap_pipe[0] = snap_pipe[1] = -1;
        }
    }
    if (snap_pipe[0] < 0 || total > snap_pipe_cap) {
        if (use_pipe) return -1;
        return process_vm_readv(self_pid, l, n, r, n, 0);
    }
    ssize_t w = writev(snap_pipe[1], r, n);
    if (w <= 0) return -1;
    ssize_t got = readv(snap_pipe[0], l, n);
    if (got != w) {  /* never expected: leave the pipe empty for the next call */
        char junk[4096];
        while (read(snap_pipe[0], junk, sizeof junk) > 0) {}
        return -1;
    }
    return got;
}

/* ---------------------------------------------------------------------------------------------
 * Engine state (one engine per process)
 */
typedef struct { int64_t t_ns; uint64_t thread_id; int64_t weight_ns; int64_t sid_flags; uint64_t gen; } sample_t;
typedef struct {
    uint64_t thread_id; unsigned long native_id; int64_t last_t; int64_t last_cpu; int seen; int stat_fd;
    uintptr_t chunk, chunk_end;  /* 3.11+: the data-stack chunk last seen and where it ends */
    uintptr_t gen_frames[4]; int n_gen_frames;  /* generator frames met by the last walk (outside the chunk) */
    uintptr_t cframes[4]; int n_cframes;         /* 3.11/3.12: C-level eval loops seen lately, newest first */
    uintptr_t old_lo, old_hi, old_top_at;        /* the chunk below (a deep stack's callers) and its top field */
    uint64_t old_top;
    int sig_misses; int64_t no_signal_until;     /* asked by signal and did not answer: read from outside */
} thread_t;
typedef struct { uintptr_t ptr; int32_t firstlineno; uintptr_t name, filename; int64_t nbytes; } code_t;
typedef struct { uint64_t hash; int64_t start; int32_t len; int32_t reported; } stack_t_;

#define MAX_THREADS 4096
#define MAX_EXCLUDE 64

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    volatile int running, stop_req;
    PyInterpreterState *interp;
    int64_t interval_ns;
    int mode;
    int max_depth;
    int64_t max_pending;
    int64_t t_start, t_prev;
    /* samples not yet drained */
    sample_t *samples; int64_t n_samples, cap_samples;
    /* interned stacks: words (code, offset) leaf first */
    uint64_t *words; int64_t n_words, cap_words;
    stack_t_ *stacks; int64_t n_stacks, cap_stacks, n_stacks_reported;
    int64_t *stack_table; int64_t stack_table_size;  /* open addressing: stack index + 1, 0 empty */
    code_t *codes; int64_t codes_size, n_codes;       /* open addressing on ptr */
    uintptr_t *new_codes; int64_t n_new_codes, cap_new_codes;
    thread_t threads[MAX_THREADS]; int n_threads;
    uint64_t exclude[MAX_EXCLUDE]; int n_exclude;
    uint64_t native_map[MAX_EXCLUDE * 4][2]; int n_native_map;  /* 3.10: thread id -> native id */
    /* stats */
    int64_t ticks, samples_total, torn, dropped, idle_samples, thread_reads, retries, snapshots, signal_reads, signal_timeouts;
    int64_t truncated;  /* samples whose stack was deeper than max_depth: the innermost max_depth frames kept */
    int64_t engine_cpu_ns, max_lag_ns;
    /* the process was stopped (SIGSTOP, Ctrl-Z, a debugger, a frozen container): ticks far apart
     * while the process used (almost) no CPU. That time is counted here, never given to a sample */
    int64_t stopped_ns, stops, proc_cpu_prev;
    uint64_t rng;
    int64_t deadline_ns;   /* 0: none; else stop by itself at this time (peek) */
    uint64_t first_tick_done;
    char error[200];
} E;

static int64_t now_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t hash_words(const uint64_t *w, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        h ^= w[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        h *= 0x100000001b3ULL;
    }
    return h ? h : 1;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t item) {
    if (need <= *cap) return 0;
    int64_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * item);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* index of the stack (interned), or -1 (no memory) */
static int64_t intern_stack(const uint64_t *w, int64_t n) {
    uint64_t h = hash_words(w, n);
    if (E.stack_table_size == 0 || (E.n_stacks + 1) * 2 > E.stack_table_size) {
        int64_t ns = E.stack_table_size ? E.stack_table_size * 2 : 4096;
        int64_t *t = calloc((size_t)ns, sizeof *t);
        if (!t) return -1;
        for (int64_t i = 0; i < E.n_stacks; i++) {
            int64_t j = (int64_t)(E.stacks[i].hash & (uint64_t)(ns - 1));
            while (t[j]) j = (j + 1) & (ns - 1);
            t[j] = i + 1;
        }
        free(E.stack_table);
        E.stack_table = t;
        E.stack_table_size = ns;
    }
    int64_t mask = E.stack_table_size - 1, j = (int64_t)(h & (uint64_t)mask);
    while (E.stack_table[j]) {
        stack_t_ *s = &E.stacks[E.stack_table[j] - 1];
        if (s->hash == h && s->len == n && memcmp(E.words + s->start, w, (size_t)n * 8) == 0)
            return E.stack_table[j] - 1;
        j = (j + 1) & mask;
    }
    if (grow((void **)&E.words, &E.cap_words, E.n_words + n, 8) < 0) return -1;
    if (grow((void **)&E.stacks, &E.cap_stacks, E.n_stacks + 1, sizeof(stack_t_)) < 0) return -1;
    memcpy(E.words + E.n_words, w, (size_t)n * 8);
    stack_t_ *s = &E.stacks[E.n_stacks];
    s->hash = h; s->start = E.n_words; s->len = (int32_t)n; s->reported = 0;
    E.n_words += n;
    E.stack_table[j] = E.n_stacks + 1;
    return E.n_stacks++;
}

/* The code cache: a code address is checked (type) once, with its identity kept for resolve_codes. */
static code_t *code_lookup(uintptr_t p) {
    int64_t mask = E.codes_size - 1, j = (int64_t)((p >> 4) & (uint64_t)mask);
    while (E.codes[j].ptr) {
        if (E.codes[j].ptr == p) return &E.codes[j];
        j = (j + 1) & mask;
    }
    return &E.codes[j];  /* empty slot */
}

static int code_rehash(void) {
    int64_t ns = E.codes_size ? E.codes_size * 2 : 4096;
    code_t *old = E.codes;
    int64_t olds = E.codes_size;
    E.codes = calloc((size_t)ns, sizeof(code_t));
    if (!E.codes) { E.codes = old; return -1; }
    E.codes_size = ns;
    for (int64_t i = 0; i < olds; i++)
        if (old[i].ptr) *code_lookup(old[i].ptr) = old[i];
    free(old);
    return 0;
}

/* New code objects wake the drain thread (wait_new_codes), which resolves them under the GIL and so
 * keeps them alive: a code object that dies before the next periodic drain (a short script's module
 * code, freed when runpy returns) would otherwise be stale at the final drain. Posted once until the
 * waiter takes it; sem_post is async-signal-safe (check_code also runs in the snapshot signal handler). */
static sem_t code_sem;
static int code_sem_ready = 0;
static volatile sig_atomic_t code_wake_posted = 0;

static void wake_for_codes(void) {
    if (code_sem_ready && !code_wake_posted) {
        code_wake_posted = 1;
        sem_post(&code_sem);
    }
}

/* Validate a code object at p: returns its cache entry or NULL (not a code object). */
static code_t *check_code(uintptr_t p, int64_t *code_bytes) {
    if ((E.n_codes + 1) * 2 > E.codes_size && code_rehash() < 0) return NULL;
    code_t *c = code_lookup(p);
    /* Seen before: a code object referenced by a live frame stays alive, so the address still holds
     * it; a torn read that lands on another known code address is caught by the bounds check or, at
     * worst, names one wrong frame; resolve_codes() checks every address again under the GIL. */
    if (c->ptr) { *code_bytes = c->nbytes; return c; }
    PyVarObject head;
    if (safe_read(&head, p, sizeof head) < 0) return NULL;
    if ((uintptr_t)head.ob_base.ob_type != (uintptr_t)&PyCode_Type) return NULL;
    int64_t nbytes = (int64_t)head.ob_size * 2;
    if (O.legacy) {  /* 3.10: the bytecode is a bytes object */
#if PY_VERSION_HEX < 0x030B0000
        uintptr_t bc;
        PyVarObject bh;
        if (safe_read(&bc, p + offsetof(PyCodeObject, co_code), 8) < 0 || safe_read(&bh, bc, sizeof bh) < 0 ||
            (uintptr_t)bh.ob_base.ob_type != (uintptr_t)&PyBytes_Type)
            return NULL;
        nbytes = (int64_t)bh.ob_size;
#endif
    }
    int32_t fl;
    uintptr_t nm, fn;
    if (safe_read(&fl, p + O.code_firstlineno, 4) < 0 || safe_read(&nm, p + O.code_name, 8) < 0 ||
        safe_read(&fn, p + O.code_filename, 8) < 0)
        return NULL;
    if (grow((void **)&E.new_codes, &E.cap_new_codes, E.n_new_codes + 1, sizeof(uintptr_t)) < 0) return NULL;
    c->ptr = p; c->firstlineno = fl; c->name = nm; c->filename = fn; c->nbytes = nbytes;
    *code_bytes = nbytes;
    E.n_codes++;
    E.new_codes[E.n_new_codes++] = p;
    wake_for_codes();
    return c;
}

static thread_t *thread_entry(uint64_t tid, unsigned long native) {
    for (int i = 0; i < E.n_threads; i++)
        if (E.threads[i].thread_id == tid && E.threads[i].native_id == native) return &E.threads[i];
    if (E.n_threads >= MAX_THREADS) {
        /* forget threads not seen at the last tick */
        int k = 0;
        for (int i = 0; i < E.n_threads; i++) {
            if (E.threads[i].seen) E.threads[k++] = E.threads[i];
            else if (E.threads[i].stat_fd >= 0) close(E.threads[i].stat_fd);
        }
        E.n_threads = k;
        if (k >= MAX_THREADS) return NULL;
    }
    thread_t *t = &E.threads[E.n_threads++];
    t->thread_id = tid; t->native_id = native; t->last_t = -1; t->last_cpu = -1; t->seen = 0; t->stat_fd = -1;
    t->chunk = t->chunk_end = 0;
    t->n_gen_frames = 0;
    t->n_cframes = 0;
    t->old_lo = t->old_hi = t->old_top_at = 0;
    t->old_top = 0;
    t->sig_misses = 0;
    t->no_signal_until = 0;
    return t;
}

/* CPU time of thread `native` (Linux per-thread CPU clock of another thread of this process). */
static int64_t thread_cpu_ns(unsigned long native) {
    if (native == 0) return -1;
    clockid_t cid = (clockid_t)(((~(unsigned int)native) << 3) | 6);  /* MAKE_THREAD_CPUCLOCK(tid, SCHED) */
    struct timespec ts;
    if (clock_gettime(cid, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* 1 when the kernel has the thread runnable or running ('R'): preempted on a loaded machine is
 * not idle. Read from /proc/self/task/N/stat through a descriptor kept per thread. */
static int thread_runnable(thread_t *t) {
    if (t->native_id == 0) return 0;
    if (t->stat_fd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%lu/stat", t->native_id);
        t->stat_fd = open(path, O_RDONLY | O_CLOEXEC);
        if (t->stat_fd < 0) return 0;
    }
    char buf[512];
    ssize_t n = pread(t->stat_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'R';
}

static void close_thread_fds(void) {
    for (int i = 0; i < E.n_threads; i++)
        if (E.threads[i].stat_fd >= 0) { close(E.threads[i].stat_fd); E.threads[i].stat_fd = -1; }
}

static int excluded(uint64_t tid) {
    for (int i = 0; i < E.n_exclude; i++)
        if (E.exclude[i] == tid) return 1;
    return 0;
}

/* The current thread's frame data stack, copied in one read (3.11+): frames inside it are read from
 * the copy, others (generators' frames, older chunks) one by one. */
#define CHUNK_COPY_MAX (512 * 1024)
static char *chunk_buf;
static uintptr_t chunk_lo, chunk_hi;

/* Generator/coroutine frames live in their generator object, outside the chunk: those the thread's
 * last walk met are read with the chunk, in the same call (a generator that yields between two reads
 * has lost its caller link: read apart, such a frame made one sample in nine torn, and the retry,
 * taken just after the yield, moved those samples from the generator's callees to its consumer). */
#define SNAP_GENS 4
static uintptr_t snap_gen_addr[SNAP_GENS];
static char snap_gen_buf[SNAP_GENS][128];
static int snap_n_gens;

/* The chunk below the current one, read in the same call: a stack deeper than one chunk (16 KiB,
 * ~120 frames) otherwise had its callers read one system call each (64 us a tick at 120 frames). */
static char *old_buf;
static uintptr_t old_lo, old_hi;

static inline int read_frame(char *dst, uintptr_t frame, size_t n) {
    if (frame >= chunk_lo && frame < chunk_hi && n <= chunk_hi - frame) {  /* no overflow on a torn pointer */
        memcpy(dst, chunk_buf + (frame - chunk_lo), n);
        return 0;
    }
    if (frame >= old_lo && frame < old_hi && n <= old_hi - frame) {
        memcpy(dst, old_buf + (frame - old_lo), n);
        return 0;
    }
    for (int i = 0; i < snap_n_gens; i++)
        if (snap_gen_addr[i] == frame && n <= sizeof snap_gen_buf[i]) {
            memcpy(dst, snap_gen_buf[i], n);
            return 0;
        }
    return safe_read(dst, frame, n);
}

static void copy_chunk(const char *ts) {
    chunk_lo = chunk_hi = 0;
    old_lo = old_hi = 0;
    snap_n_gens = 0;
    if (O.legacy || !O.ts_top || !chunk_buf) return;
    uintptr_t chunk, top;
    memcpy(&chunk, ts + O.ts_chunk, 8);
    memcpy(&top, ts + O.ts_top, 8);
    uintptr_t lo = chunk + O.chunk_data;
    if (!chunk || top <= lo || top - lo > CHUNK_COPY_MAX) return;
    if (safe_read(chunk_buf, lo, top - lo) < 0) return;
    chunk_lo = lo;
    chunk_hi = top;
}

/* The leaf frame read with the chunk by snapshot() (valid while snap_ok), else read by walk_thread. */
static uintptr_t snap_frame;
static int snap_ok;
/* When the last snapshot's gather began: the sample's time. What the copy shows was there at or
 * after it (a task that a stack shows was made before the gather, up to the few ns between this
 * stamp and the read). Taken here and not when the sample is stored: a read that the engine's
 * preemption delays (a syscall's return is where a busy CPU switches) would otherwise be stamped
 * by the preemption's length late. In the signal handler it is the stopped thread's own time. */
static int64_t snap_read_ns;
#define SNAP_MARGIN 512  /* bytes copied past the last-seen stack top: frames pushed since */
#define SNAP_LEAF 256    /* bytes below the stack top read first: the leaf frame */
#define SNAP_TOP 1024    /* then down to here: its nearest callers */

/* Read a thread's state, its data-stack chunk and then its current frame pointer in ONE
 * process_vm_readv, so the frames walked are those of one instant: read with syscalls microseconds
 * apart, a call that returned and a new one pushed at the same address in between shows the new
 * callee's code at the old leaf (heavy(i); tiny(i) sampled by parts gave tiny twice its time). `ts` holds the thread state read a moment ago (for the chunk's
 * address and top, and 3.11/3.12's cframe); on success it is replaced by the fresh one. */
static int snapshot_once(thread_t *th, uintptr_t tstate, char *ts, uintptr_t *cframe_now) {
    uintptr_t chunk, top;
    memcpy(&chunk, ts + O.ts_chunk, 8);
    memcpy(&top, ts + O.ts_top, 8);
    if (!chunk) return -1;
    if (th->chunk != chunk) {
        uint64_t size = 0;
        uintptr_t prev = 0;
        if (safe_read(&size, chunk + O.chunk_size, 8) < 0 || size < O.chunk_data || size > (1ULL << 32)) return -1;
        if (safe_read(&prev, chunk + O.chunk_prev, 8) < 0) return -1;
        th->chunk = chunk;
        th->chunk_end = chunk + size;
        th->old_lo = th->old_hi = th->old_top_at = 0;
        uint64_t ptop = 0, psize = 0;
        if (prev && safe_read(&ptop, prev + O.chunk_top, 8) == 0 && safe_read(&psize, prev + O.chunk_size, 8) == 0 &&
            ptop > 0 && O.chunk_data + ptop * 8 <= psize && ptop * 8 <= CHUNK_COPY_MAX) {
            th->old_lo = prev + O.chunk_data;
            th->old_hi = th->old_lo + ptop * 8;
            th->old_top_at = prev + O.chunk_top;
            th->old_top = ptop;
        }
    }
    uintptr_t lo = chunk + O.chunk_data;
    uintptr_t hi = top + SNAP_MARGIN;
    if (hi > th->chunk_end) hi = th->chunk_end;
    if (hi - lo > CHUNK_COPY_MAX) hi = lo + CHUNK_COPY_MAX;
    if (top < lo || hi <= lo) return -1;
    static char fresh[4096];
    if (O.ts_size > sizeof fresh) return -1;
    uintptr_t current[4] = {0, 0, 0, 0};
    struct iovec l[10 + SNAP_GENS], r[10 + SNAP_GENS];
    int n = 0;
    /* Order matters, as the thread runs on while we read (hot cache lines cost a transfer from its
     * core each: the whole read takes hundreds of nanoseconds). First the thread state, then the
     * leaf pointer: 3.11/3.12 keep it in the C-level eval loop running now (tstate->cframe), which
     * changes each time C code resumes Python code (any generator in 3.11, one driven by sum() in
     * 3.12); a loop that has returned still holds its last leaf on the C stack, so every loop the
     * thread used lately is read, and the thread state just read says which is live. Then the frames,
     * the top of the stack first: a frame that returns meanwhile keeps its bytes (frames are not
     * cleared), so the leaf the pointer named is read as it was, unless a new call reused its
     * address in between; then the generator frames the last walk met (outside the chunk); then the
     * rest of the stack, whose frames wait for the ones above them. */
    l[n] = (struct iovec){fresh, O.ts_size}; r[n++] = (struct iovec){(void *)tstate, O.ts_size};
    int nc = O.ts_frame_via_cframe ? th->n_cframes : 0;
    for (int i = 0; i < nc; i++) {
        l[n] = (struct iovec){&current[i], 8};
        r[n++] = (struct iovec){(void *)(th->cframes[i] + O.cframe_current), 8};
    }
    /* the stack from its top down: [top - LEAF, hi) holds the leaf (a frame is rarely bigger), then
     * [top - SNAP_TOP, top - LEAF) its nearest callers, then the rest */
    uintptr_t split1 = top > lo + SNAP_LEAF ? (top - SNAP_LEAF) & ~(uintptr_t)7 : lo;
    uintptr_t split2 = top > lo + SNAP_TOP ? (top - SNAP_TOP) & ~(uintptr_t)7 : lo;
    if (split1 < lo) split1 = lo;
    if (split2 < lo) split2 = lo;
    l[n] = (struct iovec){chunk_buf + (split1 - lo), hi - split1}; r[n++] = (struct iovec){(void *)split1, hi - split1};
    ssize_t want = (ssize_t)(O.ts_size + 8 * (size_t)nc + (hi - lo));
    int g0 = n;
    for (int i = 0; i < th->n_gen_frames && i < SNAP_GENS && O.fr_size <= sizeof snap_gen_buf[0]; i++) {
        l[n] = (struct iovec){snap_gen_buf[i], O.fr_size};
        r[n++] = (struct iovec){(void *)th->gen_frames[i], O.fr_size};
        want += (ssize_t)O.fr_size;
    }
    int gens = n - g0;
    if (split1 > split2) {
        l[n] = (struct iovec){chunk_buf + (split2 - lo), split1 - split2};
        r[n++] = (struct iovec){(void *)split2, split1 - split2};
    }
    if (split2 > lo) { l[n] = (struct iovec){chunk_buf, split2 - lo}; r[n++] = (struct iovec){(void *)lo, split2 - lo}; }
    /* the chunk below: its frames are all suspended callers (they run again only once this chunk is
     * gone), so it is read last; its top field with it, to notice a chunk popped and pushed again at
     * the same address over a different stack */
    uint64_t old_top_now = 0;
    int with_old = th->old_hi > th->old_lo && old_buf != NULL;
    if (with_old) {
        l[n] = (struct iovec){old_buf, th->old_hi - th->old_lo};
        r[n++] = (struct iovec){(void *)th->old_lo, th->old_hi - th->old_lo};
        l[n] = (struct iovec){&old_top_now, 8}; r[n++] = (struct iovec){(void *)th->old_top_at, 8};
    }
    snap_read_ns = now_ns(CLOCK_MONOTONIC);
    ssize_t got = gather_read(l, r, n);
    if (got < want) return -1;  /* a generator frame freed since the last walk, or the chunk gone */
    old_lo = old_hi = 0;
    if (with_old) {
        if (got == want + (ssize_t)(th->old_hi - th->old_lo) + 8 && old_top_now == th->old_top) {
            old_lo = th->old_lo;
            old_hi = th->old_hi;
        } else {
            th->chunk = 0;  /* read the chunks' headers again next time */
        }
    }
    uintptr_t chunk2, leaf = 0;
    memcpy(&chunk2, fresh + O.ts_chunk, 8);
    if (chunk2 != chunk) return -1;  /* moved on to another chunk */
    if (O.ts_frame_via_cframe) {
        memcpy(cframe_now, fresh + O.ts_frame, 8);
        int k = -1;
        for (int i = 0; i < nc; i++) if (th->cframes[i] == *cframe_now) { k = i; break; }
        if (k < 0) return -2;  /* a loop not read: the caller learns it and reads again */
        leaf = current[k];
        if (k > 0) {  /* newest first */
            uintptr_t c = th->cframes[k];
            memmove(&th->cframes[1], &th->cframes[0], (size_t)k * sizeof th->cframes[0]);
            th->cframes[0] = c;
        }
    } else {
        memcpy(&leaf, fresh + O.ts_frame, 8);
    }
    for (int i = 0; i < gens; i++) snap_gen_addr[i] = th->gen_frames[i];
    snap_n_gens = gens;
    memcpy(ts, fresh, O.ts_size);
    chunk_lo = lo;
    chunk_hi = hi;
    snap_frame = leaf;
    snap_ok = 1;
    E.snapshots++;
    return 0;
}

static int snapshot(thread_t *th, uintptr_t tstate, char *ts) {
    snap_ok = 0;
    chunk_lo = chunk_hi = 0;
    old_lo = old_hi = 0;
    snap_n_gens = 0;
    if (O.legacy || !O.ts_top || !chunk_buf) return -1;
    uintptr_t cframe_now = 0;
    if (O.ts_frame_via_cframe) {
        memcpy(&cframe_now, ts + O.ts_frame, 8);
        if (!cframe_now) return -1;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        if (O.ts_frame_via_cframe) {
            int known = 0;
            for (int i = 0; i < th->n_cframes; i++) known |= th->cframes[i] == cframe_now;
            if (!known) {  /* learn it: newest first, the oldest forgotten */
                int keep = th->n_cframes < 4 ? th->n_cframes : 3;
                memmove(&th->cframes[1], &th->cframes[0], (size_t)keep * sizeof th->cframes[0]);
                th->cframes[0] = cframe_now;
                th->n_cframes = keep + 1;
            }
        }
        int rc = snapshot_once(th, tstate, ts, &cframe_now);
        if (rc != -2) return rc;
        if (!cframe_now) return -1;
    }
    return -1;
}

/* A running thread reads itself. Read from another thread, a running thread moves on while its
 * stack is copied (each hot cache line comes from the thread's own core: hundreds of nanoseconds
 * for the read), so a call shorter than that is seen after it returned: on a generator handing
 * out items every half microsecond, heavy() showed 35-45% of the samples where the interpreter
 * spent 55-60% (in-thread reference), 42% of them at its final RETURN_VALUE. So the engine asks a
 * thread that is running to copy its own state: a real-time signal whose handler, on that thread,
 * runs the same snapshot() (system calls and memcpy only: async-signal-safe) while the thread is
 * stopped in it, and the engine walks the copy. The handler never calls Python, never waits for
 * the GIL or a safe point. A thread that is not running (sleeping, waiting for a CPU, blocking the
 * signal) is read from outside as before: it is not changing. The signal restarts interrupted
 * system calls (SA_RESTART); it goes only to threads that were on a CPU during the last interval.
 * OMNIPROF_NATIVE_SIGNALS=0 turns it off. */
#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() do {} while (0)
#endif
#define SIGNAL_WAIT_NS 200000
#define SIGNAL_SPIN_NS 30000  /* then sleep: spinning could keep a thread sharing our CPU from answering */
static int snap_sig;                 /* 0: not installed */
static volatile int req_state;       /* 0 idle, 1 asked, 2 being served, 3 served */
static volatile pid_t req_tid;
static thread_t *req_th;
static uintptr_t req_tstate;
static char *req_ts;
static volatile int req_rc;
static volatile int eng_sleeping;    /* the engine waits in futex(): the handler must wake it */

/* CPU time the program's threads spent in on_snap_signal (from its first instruction to its last:
 * the kernel's delivery and sigreturn are not in it), summed over the session: what the engine
 * takes from the program's own threads, reported beside the engine thread's own CPU time. */
static volatile int64_t handler_cpu_ns;

static void on_snap_signal(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)si; (void)uc;
    int saved = errno;
    int64_t t0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    int expect = 1;
    if (!__atomic_compare_exchange_n(&req_state, &expect, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        __atomic_add_fetch(&handler_cpu_ns, now_ns(CLOCK_THREAD_CPUTIME_ID) - t0, __ATOMIC_RELAXED);
        errno = saved;
        return;
    }
    if ((pid_t)syscall(SYS_gettid) != req_tid) {  /* a late signal meant for an earlier request */
        __atomic_store_n(&req_state, 1, __ATOMIC_RELEASE);
        __atomic_add_fetch(&handler_cpu_ns, now_ns(CLOCK_THREAD_CPUTIME_ID) - t0, __ATOMIC_RELAXED);
        errno = saved;
        return;
    }
    req_rc = snapshot(req_th, req_tstate, req_ts);
    __atomic_store_n(&req_state, 3, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&eng_sleeping, __ATOMIC_SEQ_CST))  /* a wake costs the thread a system call: only when needed */
        syscall(SYS_futex, &req_state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    __atomic_add_fetch(&handler_cpu_ns, now_ns(CLOCK_THREAD_CPUTIME_ID) - t0, __ATOMIC_RELAXED);
    errno = saved;
}

static void install_snap_signal(void) {
    if (snap_sig) return;
    const char *env = getenv("OMNIPROF_NATIVE_SIGNALS");
    if (env && strcmp(env, "0") == 0) return;
    for (int s = SIGRTMIN + 3; s <= SIGRTMAX - 3; s++) {
        struct sigaction old;
        if (sigaction(s, NULL, &old) != 0) continue;
        if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;  /* someone's */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_snap_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigfillset(&sa.sa_mask);
        if (sigaction(s, &sa, NULL) == 0) snap_sig = s;  /* kept for the process's life: a signal still
                                                          * in flight after a stop must find it */
        return;
    }
}

/* snapshot(), done by the thread itself when it is running; from here otherwise. */
static int snapshot_running(thread_t *th, uintptr_t tstate, char *ts, unsigned long native, int running) {
    if (!snap_sig || !running || !native || O.legacy || E.ticks < th->no_signal_until)
        return snapshot(th, tstate, ts);
    req_th = th; req_tstate = tstate; req_ts = ts; req_tid = (pid_t)native; req_rc = -1;
    __atomic_store_n(&req_state, 1, __ATOMIC_RELEASE);
    if (syscall(SYS_tgkill, self_pid, (pid_t)native, snap_sig) != 0) {
        __atomic_store_n(&req_state, 0, __ATOMIC_RELEASE);
        return snapshot(th, tstate, ts);
    }
    int64_t t0 = now_ns(CLOCK_MONOTONIC);
    for (;;) {
        int st = __atomic_load_n(&req_state, __ATOMIC_ACQUIRE);
        int64_t waited = now_ns(CLOCK_MONOTONIC) - t0;
        if (st == 3) {
            __atomic_store_n(&req_state, 0, __ATOMIC_RELEASE);
            E.signal_reads++;
            th->sig_misses = 0;
            return req_rc;
        }
        if (st == 1 && waited > SIGNAL_WAIT_NS) {
            int expect = 1;
            if (__atomic_compare_exchange_n(&req_state, &expect, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                /* not running after all (preempted), or blocking the signal: it is not changing now */
                E.signal_timeouts++;
                /* twenty in a row: it blocks the signal (or never runs when asked): ask again later */
                if (++th->sig_misses >= 20) { th->no_signal_until = E.ticks + 1000; th->sig_misses = 0; }
                return snapshot(th, tstate, ts);
            }
        }
        if (waited > 100 * SIGNAL_WAIT_NS) {  /* a handler that never ends: never */
            __atomic_store_n(&req_state, 0, __ATOMIC_RELEASE);
            return -1;
        }
        /* sleep until the handler is done (it wakes us) or the wait is over: spinning here could keep
         * the thread asked from the CPU it needs to answer */
        if (waited < SIGNAL_SPIN_NS) {  /* answered within microseconds when it runs on another CPU */
            CPU_RELAX();
            continue;
        }
        int64_t left = (st == 1 ? SIGNAL_WAIT_NS : 100 * SIGNAL_WAIT_NS) - waited;
        if (left < 1000) left = 1000;
        struct timespec rel = {left / 1000000000LL, left % 1000000000LL};
        __atomic_store_n(&eng_sleeping, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&req_state, __ATOMIC_SEQ_CST) == st)
            syscall(SYS_futex, &req_state, FUTEX_WAIT_PRIVATE, st, &rel, NULL, 0);
        __atomic_store_n(&eng_sleeping, 0, __ATOMIC_SEQ_CST);
    }
}

/* Set by walk_thread when it stopped at max_depth frames (the stack goes deeper). */
static int walk_truncated;

/* Walk one thread's frames into w (leaf first). Returns pairs written, or -1 when torn. A stack
 * deeper than max_depth keeps its innermost max_depth frames (walk_truncated set): a deep
 * recursion is a sample, counted as truncated, not a torn read (every sample of it was lost). */
static int64_t walk_thread(thread_t *th, const char *ts, uint64_t *w, uint64_t *gen) {
    *gen = 0;
    walk_truncated = 0;
    th->n_gen_frames = 0;
    uintptr_t frame;
    memcpy(&frame, ts + O.ts_frame, 8);
    if (snap_ok) {
        frame = snap_frame;
        snap_ok = 0;
    } else if (O.ts_frame_via_cframe) {
        if (frame == 0) return 0;
        if (safe_read(&frame, frame + O.cframe_current, 8) < 0) return -1;
    }
    int64_t n = 0;
    char buf[128];
    int hops = 0;
    while (frame) {
        if (n >= E.max_depth) { walk_truncated = 1; break; }
        if (++hops > 4 * E.max_depth || (frame & 7)) return -1;
        if (O.fr_size > sizeof buf || read_frame(buf, frame, O.fr_size) < 0) return -1;
        uintptr_t code, prev;
        memcpy(&code, buf + O.fr_code, 8);
        memcpy(&prev, buf + O.fr_previous, 8);
        /* A generator's or coroutine's frame links to its caller only while it runs: the interpreter
         * sets `previous` (3.10: f_back) when the generator is resumed and clears it when it yields
         * or returns. One met with no caller was therefore read after it had yielded (its thread
         * moved on between our reads of the thread state and of this frame): a torn sample, which
         * would otherwise show the generator as a root frame without its callers. */
        if (O.legacy) {
            /* 3.10 frames are objects that outlive their run (a returned frame loses its caller
             * link and is kept as its code's spare): a frame with no caller that is not executing (0)
             * or unwinding (2) was read after it returned, a torn read that would show it as a root
             * frame. (One that returned but still links to its caller is the thread a few
             * instructions ago, on its way back to that caller: kept.) */
            signed char state = (signed char)buf[O.fr_state];
            if (!prev && state != 0 && state != 2) return -1;
            uintptr_t g;
            memcpy(&g, buf + O.fr_gen, 8);
            if (g) {
                if (!prev) return -1;
                *gen = g;  /* the root-most is a task's coroutine */
            }
        } else {
            char owner = buf[O.fr_owner];
            if (O.owner_cstack >= 0 && owner == O.owner_cstack) { frame = prev; continue; }
            if (owner == OWNED_BY_GENERATOR) {
                if (th->n_gen_frames < SNAP_GENS) th->gen_frames[th->n_gen_frames++] = frame;
                if (!prev) return -1;
                *gen = frame;  /* the root-most is a task's coroutine */
            }
        }
        int64_t code_bytes = 0;
        code_t *c = check_code(code, &code_bytes);
        if (c == NULL) return -1;
        int64_t off;
        if (O.legacy) {
            int lasti;
            memcpy(&lasti, buf + O.fr_instr, 4);
            off = lasti < 0 ? 0 : (int64_t)lasti * 2;
        } else {
            uintptr_t ip;
            memcpy(&ip, buf + O.fr_instr, 8);
            off = (int64_t)ip - (int64_t)(code + O.code_adaptive);
            if (off < 0 && off >= -2) off = 0;  /* a frame not started yet points one unit before */
        }
        if (off < 0 || off > code_bytes) return -1;
        w[2 * n] = code;
        w[2 * n + 1] = (uint64_t)off;
        n++;
        frame = prev;
    }
    return n;
}

static uint64_t rng_next(void) {
    E.rng ^= E.rng << 13; E.rng ^= E.rng >> 7; E.rng ^= E.rng << 17;
    return E.rng;
}

static void tick(int64_t t, uint64_t *w, char *ts, int64_t skip) {
    uintptr_t holder = 0;
    int locked = 0;
    if (O.gil || O.gil_via_interp) {
        uintptr_t gil = O.gil;
        if (O.gil_via_interp && safe_read(&gil, (uintptr_t)E.interp + O.interp_gil_ptr, 8) < 0) gil = 0;
        if (gil) {
            if (safe_read(&holder, gil + O.gil_holder, 8) < 0) holder = 0;
            if (safe_read(&locked, gil + O.gil_locked, 4) < 0) locked = 0;
        }
    }
    for (int i = 0; i < E.n_threads; i++) E.threads[i].seen = 0;
    uintptr_t tstate;
    if (safe_read(&tstate, (uintptr_t)E.interp + O.interp_head, 8) < 0) { E.torn++; return; }
    int count = 0;
    while (tstate && count++ < MAX_THREADS) {
        if (safe_read(ts, tstate, O.ts_size) < 0) { E.torn++; break; }
        uintptr_t interp, next;
        memcpy(&interp, ts + O.ts_interp, 8);
        memcpy(&next, ts + O.ts_next, 8);
        if (interp != (uintptr_t)E.interp) { E.torn++; break; }  /* freed and reused under us */
        uint64_t tid;
        unsigned long native;
        memcpy(&tid, ts + O.ts_thread_id, sizeof tid);
        if (O.ts_native_id != (size_t)-1) memcpy(&native, ts + O.ts_native_id, sizeof native);
        else {
            native = 0;
            for (int k = 0; k < E.n_native_map; k++)
                if (E.native_map[k][0] == tid) { native = (unsigned long)E.native_map[k][1]; break; }
        }
        uintptr_t cur = tstate;
        tstate = next;
        if (tid == 0 || excluded(tid)) continue;
        thread_t *th = thread_entry(tid, native);
        if (!th) continue;
        th->seen = 1;
        int64_t cpu = thread_cpu_ns(native);
        int64_t since = th->last_t >= 0 ? t - th->last_t : t - (E.t_prev ? E.t_prev : E.t_start);
        if (skip) since = since > skip ? since - skip : 0;  /* the stopped time is no thread's */
        int idle;
        if (cpu < 0) idle = 0;                     /* no CPU clock: not known to be idle */
        else if (th->last_cpu < 0) idle = !thread_runnable(th);  /* first sight: no delta yet, ask the kernel */
        else idle = (cpu - th->last_cpu) * 10 < since && !thread_runnable(th);  /* on a CPU < 10% of the
                                                     interval and not waiting for one */
        int has_gil = locked && holder == cur;
        th->last_t = t;
        th->last_cpu = cpu;
        if (E.mode == MODE_CPU && idle) continue;
        if (E.mode == MODE_GIL && !has_gil) continue;
        E.thread_reads++;
        uint64_t gen;
        if (snapshot_running(th, cur, ts, native, !idle && cpu >= 0) < 0) {
            snap_read_ns = now_ns(CLOCK_MONOTONIC);
            if (O.legacy) safe_read(ts, cur, O.ts_size);  /* 3.10: the leaf pointer as fresh as can be */
            copy_chunk(ts);
        }
        int64_t n = walk_thread(th, ts, w, &gen);
        if (n < 0) {
            /* torn: the thread changed its stack while we read it; read it once more, now */
            uint64_t tid2 = 0;
            uintptr_t interp2 = 0;
            if (safe_read(ts, cur, O.ts_size) == 0) {
                memcpy(&tid2, ts + O.ts_thread_id, sizeof tid2);
                memcpy(&interp2, ts + O.ts_interp, 8);
            }
            if (tid2 == tid && interp2 == (uintptr_t)E.interp) {
                E.retries++;
                if (snapshot(th, cur, ts) < 0) {
                    snap_read_ns = now_ns(CLOCK_MONOTONIC);
                    copy_chunk(ts);
                }
                n = walk_thread(th, ts, w, &gen);
            }
            if (n < 0) { E.torn++; continue; }
        }
        if (E.n_samples >= E.max_pending) { E.dropped++; continue; }
        int64_t sid = intern_stack(w, 2 * n);
        if (sid < 0 || grow((void **)&E.samples, &E.cap_samples, E.n_samples + 1, sizeof(sample_t)) < 0) {
            E.dropped++;
            continue;
        }
        sample_t *s = &E.samples[E.n_samples++];
        if (walk_truncated) E.truncated++;
        /* stamped when the stack was read, not at the tick (the read can lag the tick by a
         * preemption; an asyncio task is matched by its creation time, so a stack must not look
         * older than the task it shows): see snap_read_ns */
        s->t_ns = snap_read_ns; s->thread_id = tid; s->weight_ns = since; s->gen = gen;
        s->sid_flags = sid | ((int64_t)((idle ? F_IDLE : 0) | (has_gil ? F_GIL : 0)) << 40);
        E.samples_total++;
        if (idle) E.idle_samples++;
    }
}

static void *engine_main(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);  /* signals are the program's, never this thread's */
    uint64_t *w = malloc((size_t)E.max_depth * 2 * 8 + 16);
    char *ts = malloc(O.ts_size + 16);
    if (!chunk_buf) chunk_buf = malloc(CHUNK_COPY_MAX);
    if (!old_buf) old_buf = malloc(CHUNK_COPY_MAX);
    if (!w || !ts) { free(w); free(ts); snprintf(E.error, sizeof E.error, "out of memory"); E.running = 0; return NULL; }
    int64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    int64_t due = now_ns(CLOCK_MONOTONIC);
    while (!E.stop_req) {
        /* jittered: uniform in [0.5, 1.5) x interval, mean interval, so no workload period aliases */
        int64_t d = E.interval_ns / 2 + (int64_t)(rng_next() % (uint64_t)(E.interval_ns > 0 ? E.interval_ns : 1));
        due += d;
        int64_t t = now_ns(CLOCK_MONOTONIC);
        if (due < t - 20 * E.interval_ns) due = t + d;  /* far behind (suspended): restart the schedule */
        if (due > t) {
            struct timespec ts_;
            ts_.tv_sec = due / 1000000000LL;
            ts_.tv_nsec = due % 1000000000LL;
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts_, NULL) == EINTR) {}
        }
        if (E.stop_req) break;
        t = now_ns(CLOCK_MONOTONIC);
        if (t - due > E.max_lag_ns) E.max_lag_ns = t - due;
        if (E.deadline_ns && t >= E.deadline_ns) break;
        /* A tick far behind the previous one while the whole process used under a tenth of that gap
         * in CPU: the process was not running (stopped), not a long call; the gap is left out. */
        int64_t pcpu = now_ns(CLOCK_PROCESS_CPUTIME_ID), skip = 0;
        int64_t far = 50 * E.interval_ns > 50000000LL ? 50 * E.interval_ns : 50000000LL;
        if (E.t_prev && t - E.t_prev > far && E.proc_cpu_prev >= 0 && pcpu >= 0
                && (pcpu - E.proc_cpu_prev) * 10 < t - E.t_prev)
            skip = t - E.t_prev - E.interval_ns;
        E.proc_cpu_prev = pcpu;
        pthread_mutex_lock(&E.lock);
        if (skip) { E.stopped_ns += skip; E.stops++; }
        tick(t, w, ts, skip);
        E.ticks++;
        E.t_prev = t;
        E.engine_cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
        pthread_mutex_unlock(&E.lock);
    }
    pthread_mutex_lock(&E.lock);
    E.engine_cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    pthread_mutex_unlock(&E.lock);
    free(w);
    free(ts);
    pthread_mutex_lock(&E.lock);
    close_thread_fds();
    E.n_threads = 0;
    pthread_mutex_unlock(&E.lock);
    E.running = 0;
    return NULL;
}

static void reset_session(void) {
    E.n_samples = 0;
    E.n_words = 0;
    E.n_stacks = 0;
    E.n_stacks_reported = 0;
    if (E.stack_table) memset(E.stack_table, 0, (size_t)E.stack_table_size * sizeof *E.stack_table);
    if (E.codes) memset(E.codes, 0, (size_t)E.codes_size * sizeof *E.codes);
    E.n_codes = 0;
    E.n_new_codes = 0;
    close_thread_fds();
    E.n_threads = 0;
    E.ticks = E.samples_total = E.torn = E.dropped = E.idle_samples = E.thread_reads = E.retries = E.snapshots = E.signal_reads = E.signal_timeouts = 0;
    E.truncated = 0;
    E.engine_cpu_ns = E.max_lag_ns = 0;
    __atomic_store_n(&handler_cpu_ns, 0, __ATOMIC_RELAXED);
    E.stopped_ns = E.stops = 0;
    E.proc_cpu_prev = -1;
    E.t_prev = 0;
}

static int started_once = 0;
static int joinable = 0;

/* Take E.lock from a thread that holds the GIL. The GIL is let go while waiting: drain() holds
 * E.lock while it takes the GIL back, so a GIL holder that blocked on E.lock would deadlock with it
 * (seen: start() against the new session's first drain). Rule: never block on E.lock with the GIL. */
static void lock_engine(void) {
    if (pthread_mutex_trylock(&E.lock) == 0) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&E.lock);
    Py_END_ALLOW_THREADS
}

static void join_engine(void) {
    if (joinable) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(E.thread, NULL);
        Py_END_ALLOW_THREADS
        joinable = 0;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Peek: a C-level signal handler wakes a standby native thread, which samples for a set time at
 * full rate even while the main thread is inside a long C call (no Python code needs to run).
 */
static sem_t peek_sem, peek_done;
static volatile sig_atomic_t peek_pending = 0;
static pthread_t peek_thread;
static int peek_armed = 0, peek_signum = 0;
static struct sigaction peek_old;
static int64_t peek_duration_ns, peek_interval_ns;
static int peek_mode;
static volatile int peek_quit = 0;
static volatile int peek_result = 0;  /* 1: sampled; 2: skipped (a session was running) */

static void peek_handler(int sig) {
    (void)sig;
    if (!peek_pending) {
        peek_pending = 1;
        sem_post(&peek_sem);  /* async-signal-safe */
    }
}

static void start_engine_locked(int64_t interval_ns, int mode, int max_depth, int64_t max_pending, int64_t deadline);

static void *peek_main(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        while (sem_wait(&peek_sem) != 0 && errno == EINTR) {}
        if (peek_quit) break;
        if (E.running) { peek_result = 2; sem_post(&peek_done); continue; }  /* a session runs: no peek */
        int64_t t = now_ns(CLOCK_MONOTONIC);
        start_engine_locked(peek_interval_ns, peek_mode, 256, 1 << 22, t + peek_duration_ns);
        engine_main(NULL);
        peek_result = 1;
        sem_post(&peek_done);
    }
    return NULL;
}

static void start_engine_locked(int64_t interval_ns, int mode, int max_depth, int64_t max_pending, int64_t deadline) {
    reset_session();
    E.interval_ns = interval_ns;
    E.mode = mode;
    E.max_depth = max_depth;
    E.max_pending = max_pending;
    E.t_start = now_ns(CLOCK_MONOTONIC);
    E.deadline_ns = deadline;
    E.stop_req = 0;
    E.error[0] = 0;
    E.running = 1;
    if (!E.rng) E.rng = 0x5EEDULL * 2654435761ULL + 1;
}

#endif /* OMNIPROF_NATIVE */

/* ---------------------------------------------------------------------------------------------
 * Python API
 */
#ifdef OMNIPROF_NATIVE
/* In a forked child only the forking thread exists: the engine's and the peek's threads are the
 * parent's. The child starts with no engine running (a new session starts a thread of its own), a
 * fresh lock (the engine may have held it at the fork), its own pid for the reads, and no peek. */
static void atfork_child(void) {
    E.running = 0;
    E.stop_req = 0;
    joinable = 0;
    req_state = 0;
    if (started_once) pthread_mutex_init(&E.lock, NULL);
    /* the pipe is shared with the parent (never read the parent's copies), the stat files name the
     * parent's threads: the child's copies are closed, made again when needed */
    for (int k = 0; k < 2; k++) if (pipe_fd[k] >= 0) { close(pipe_fd[k]); pipe_fd[k] = -1; }
    for (int k = 0; k < 2; k++) if (snap_pipe[k] >= 0) { close(snap_pipe[k]); snap_pipe[k] = -1; }
    use_pipe = 0;
    self_pid = getpid();
    close_thread_fds();
    E.n_threads = 0;
    E.n_samples = 0;
    if (peek_armed) {
        /* the signal keeps the C handler (it only posts a semaphore nobody waits on): restore the
         * previous disposition, the Python side re-arms peek in the child if it wants it */
        sigaction(peek_signum, &peek_old, NULL);
        peek_armed = 0;
        peek_pending = 0;
        peek_quit = 0;
    }
}
#endif

static PyObject *py_available(PyObject *self, PyObject *noargs) {
#ifdef OMNIPROF_NATIVE
    char why[200] = "";
    if (init_offsets(PyInterpreterState_Get()) < 0) return Py_BuildValue("(Os)", Py_False, "_Py_DebugOffsets cookie mismatch");
    if (setup_reads(why, sizeof why) < 0) return Py_BuildValue("(Os)", Py_False, why);
    return Py_BuildValue("(Os)", Py_True, use_pipe ? "pipe copies (process_vm_readv refused)" : "process_vm_readv");
#else
    return Py_BuildValue("(Os)", Py_False, "the native engine needs Linux and CPython 3.10-3.13");
#endif
}

static PyObject *py_start(PyObject *self, PyObject *args) {
#ifdef OMNIPROF_NATIVE
    long long interval_ns, max_pending;
    int mode, max_depth;
    PyObject *excl;
    if (!PyArg_ParseTuple(args, "LiiLO", &interval_ns, &mode, &max_depth, &max_pending, &excl)) return NULL;
    if (interval_ns <= 0 || mode < 0 || mode > 2 || max_depth < 1) {
        PyErr_SetString(PyExc_ValueError, "bad engine parameters");
        return NULL;
    }
    if (E.running) {
        PyErr_SetString(PyExc_RuntimeError, "the native sampling engine is already running");
        return NULL;
    }
    join_engine();
    char why[200] = "";
    if (init_offsets(PyInterpreterState_Get()) < 0 || setup_reads(why, sizeof why) < 0) {
        PyErr_Format(PyExc_RuntimeError, "native sampling engine unavailable: %s", why);
        return NULL;
    }
    if (!started_once) {
        pthread_mutex_init(&E.lock, NULL);
        started_once = 1;
    }
    install_snap_signal();
    E.interp = PyInterpreterState_Get();
    E.n_exclude = 0;
    PyObject *it = PyObject_GetIter(excl);
    if (!it) return NULL;
    PyObject *x;
    while ((x = PyIter_Next(it)) && E.n_exclude < MAX_EXCLUDE) {
        E.exclude[E.n_exclude++] = PyLong_AsUnsignedLongLongMask(x);
        Py_DECREF(x);
    }
    Py_XDECREF(x);
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    while (code_sem_ready && sem_trywait(&code_sem) == 0) {}  /* the last session's stop() post */
    code_wake_posted = 0;
    lock_engine();
    start_engine_locked(interval_ns, mode, max_depth, max_pending, 0);
    pthread_mutex_unlock(&E.lock);
    int rc = pthread_create(&E.thread, NULL, engine_main, NULL);
    if (rc != 0) {
        E.running = 0;
        PyErr_Format(PyExc_RuntimeError, "could not start the native sampling thread (errno %d)", rc);
        return NULL;
    }
    joinable = 1;
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "the native engine needs Linux and CPython 3.10-3.13");
    return NULL;
#endif
}

static PyObject *py_exclude(PyObject *self, PyObject *arg) {
#ifdef OMNIPROF_NATIVE
    uint64_t tid = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred()) return NULL;
    lock_engine();
    if (!excluded(tid) && E.n_exclude < MAX_EXCLUDE) E.exclude[E.n_exclude++] = tid;
    pthread_mutex_unlock(&E.lock);
#endif
    Py_RETURN_NONE;
}

/* set_native_ids({thread id: native id}): for CPython 3.10, whose thread states lack the native id */
static PyObject *py_set_native_ids(PyObject *self, PyObject *arg) {
#ifdef OMNIPROF_NATIVE
    if (!PyDict_Check(arg)) { PyErr_SetString(PyExc_TypeError, "expected a dict"); return NULL; }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    uint64_t tmp[MAX_EXCLUDE * 4][2];
    int n = 0;
    while (PyDict_Next(arg, &pos, &k, &v) && n < MAX_EXCLUDE * 4) {
        tmp[n][0] = PyLong_AsUnsignedLongLongMask(k);
        tmp[n][1] = PyLong_AsUnsignedLongLongMask(v);
        n++;
    }
    if (PyErr_Occurred()) return NULL;
    if (!started_once) { pthread_mutex_init(&E.lock, NULL); started_once = 1; }
    lock_engine();
    memcpy(E.native_map, tmp, sizeof tmp);
    E.n_native_map = n;
    pthread_mutex_unlock(&E.lock);
#endif
    Py_RETURN_NONE;
}

static PyObject *py_stop(PyObject *self, PyObject *noargs) {
#ifdef OMNIPROF_NATIVE
    E.stop_req = 1;
    join_engine();
    if (code_sem_ready) sem_post(&code_sem);  /* the drain thread's wait ends now, not at its timeout */
#endif
    Py_RETURN_NONE;
}

/* drain() -> (samples bytes, [(stack index, (code, offset, ...))...], [new code addresses], stats dict)
 * Samples: 5 int64 per sample: t_ns, thread id, weight_ns, stack index | flags << 40, address of the
 * root-most coroutine/generator frame (0: none; asyncio tasks are told apart by it). */
static PyObject *py_drain(PyObject *self, PyObject *noargs) {
#ifdef OMNIPROF_NATIVE
    if (!started_once) return Py_BuildValue("(y#[][]{})", "", (Py_ssize_t)0);
    sample_t *copy = NULL;
    int64_t n = 0;
    PyObject *stacks = NULL, *codes = NULL, *stats = NULL;
    /* Copy out under the lock, taken with the GIL let go (lock_engine: the engine thread never takes
     * the GIL, and no GIL holder blocks on the lock). */
    lock_engine();
    n = E.n_samples;
    copy = n ? malloc((size_t)n * sizeof(sample_t)) : NULL;
    if (n && !copy) { pthread_mutex_unlock(&E.lock); return PyErr_NoMemory(); }
    if (n) memcpy(copy, E.samples, (size_t)n * sizeof(sample_t));
    E.n_samples = 0;
    stacks = PyList_New(0);
    codes = PyList_New(0);
    if (!stacks || !codes) goto fail;
    for (int64_t i = E.n_stacks_reported; i < E.n_stacks; i++) {
        stack_t_ *s = &E.stacks[i];
        PyObject *tup = PyTuple_New(s->len);
        if (!tup) goto fail;
        for (int32_t k = 0; k < s->len; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(E.words[s->start + k]);
            if (!v) { Py_DECREF(tup); goto fail; }
            PyTuple_SET_ITEM(tup, k, v);
        }
        PyObject *pair = Py_BuildValue("(LN)", (long long)i, tup);
        if (!pair || PyList_Append(stacks, pair) < 0) { Py_XDECREF(pair); goto fail; }
        Py_DECREF(pair);
    }
    E.n_stacks_reported = E.n_stacks;
    for (int64_t i = 0; i < E.n_new_codes; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(E.new_codes[i]);
        if (!v || PyList_Append(codes, v) < 0) { Py_XDECREF(v); goto fail; }
        Py_DECREF(v);
    }
    E.n_new_codes = 0;
    stats = Py_BuildValue("{sLsLsLsLsLsLsLsLsLsLsLsLsLsLsLsLsLsi}", "ticks", (long long)E.ticks, "samples", (long long)E.samples_total,
                          "truncated", (long long)E.truncated,
                          "snapshots", (long long)E.snapshots, "signal_reads", (long long)E.signal_reads,
                          "signal_timeouts", (long long)E.signal_timeouts,
                          "torn", (long long)E.torn, "retries", (long long)E.retries, "dropped", (long long)E.dropped,
                          "idle_samples", (long long)E.idle_samples, "thread_reads", (long long)E.thread_reads,
                          "engine_cpu_ns", (long long)E.engine_cpu_ns, "max_lag_ns", (long long)E.max_lag_ns,
                          "handler_cpu_ns", (long long)__atomic_load_n(&handler_cpu_ns, __ATOMIC_RELAXED),
                          "t_start_ns", (long long)E.t_start, "stopped_ns", (long long)E.stopped_ns,
                          "stops", (long long)E.stops, "running", (int)E.running);
    pthread_mutex_unlock(&E.lock);
    if (!stats) goto fail_unlocked;
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)copy, (Py_ssize_t)(n * (int64_t)sizeof(sample_t)));
    free(copy);
    if (!bytes) { Py_DECREF(stacks); Py_DECREF(codes); Py_DECREF(stats); return NULL; }
    return Py_BuildValue("(NNNN)", bytes, stacks, codes, stats);
fail:
    pthread_mutex_unlock(&E.lock);
fail_unlocked:
    free(copy);
    Py_XDECREF(stacks);
    Py_XDECREF(codes);
    Py_XDECREF(stats);
    return NULL;
#else
    PyErr_SetString(PyExc_RuntimeError, "the native engine needs Linux and CPython 3.10-3.13");
    return NULL;
#endif
}

/* resolve_codes([addr, ...]) -> [code object or None, ...]: under the GIL, each address is checked
 * again (readable, type PyCode_Type, a sane reference count, the same first line, name and file
 * objects as when the engine first saw it) before it is turned into a reference. */
static PyObject *py_resolve_codes(PyObject *self, PyObject *arg) {
#ifdef OMNIPROF_NATIVE
    PyObject *seq = PySequence_Fast(arg, "resolve_codes() expects a sequence of addresses");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (!out) { Py_DECREF(seq); return NULL; }
    lock_engine();  /* the engine may be running: the code table is shared */
    for (Py_ssize_t i = 0; i < n; i++) {
        uintptr_t p = (uintptr_t)PyLong_AsUnsignedLongLongMask(PySequence_Fast_GET_ITEM(seq, i));
        PyObject *res = Py_None;
        code_t *c = E.codes_size ? code_lookup(p) : NULL;
        PyVarObject head;
        int32_t fl;
        uintptr_t nm, fn, nmt = 0, fnt = 0;
        /* every field is read fault-safely; a freed object fails the type or the reference count test
         * (malloc writes its own pointers there), a reused address fails the identity test */
        if (c && c->ptr == p && safe_read(&head, p, sizeof head) == 0 &&
            (uintptr_t)head.ob_base.ob_type == (uintptr_t)&PyCode_Type && head.ob_base.ob_refcnt > 0 &&
            (uint64_t)head.ob_base.ob_refcnt <= ((uint64_t)1 << 32) &&
            safe_read(&fl, p + O.code_firstlineno, 4) == 0 && safe_read(&nm, p + O.code_name, 8) == 0 &&
            safe_read(&fn, p + O.code_filename, 8) == 0 && fl == c->firstlineno && nm == c->name &&
            fn == c->filename && safe_read(&nmt, nm + offsetof(PyObject, ob_type), 8) == 0 &&
            safe_read(&fnt, fn + offsetof(PyObject, ob_type), 8) == 0 && nmt == (uintptr_t)&PyUnicode_Type &&
            fnt == (uintptr_t)&PyUnicode_Type)
            res = (PyObject *)p;
        Py_INCREF(res);
        PyList_SET_ITEM(out, i, res);
    }
    pthread_mutex_unlock(&E.lock);
    Py_DECREF(seq);
    return out;
#else
    PyErr_SetString(PyExc_RuntimeError, "the native engine needs Linux and CPython 3.10-3.13");
    return NULL;
#endif
}

static PyObject *py_peek_arm(PyObject *self, PyObject *args) {
#ifdef OMNIPROF_NATIVE
    int signum, mode;
    long long dur, interval;
    if (!PyArg_ParseTuple(args, "iLLi", &signum, &dur, &interval, &mode)) return NULL;
    char why[200] = "";
    if (init_offsets(PyInterpreterState_Get()) < 0 || setup_reads(why, sizeof why) < 0) {
        PyErr_Format(PyExc_RuntimeError, "native sampling engine unavailable: %s", why);
        return NULL;
    }
    peek_duration_ns = dur;
    peek_interval_ns = interval;
    peek_mode = mode;
    if (peek_armed) Py_RETURN_NONE;
    if (!started_once) { pthread_mutex_init(&E.lock, NULL); started_once = 1; }
    E.interp = PyInterpreterState_Get();
    E.n_exclude = 0;
    sem_init(&peek_sem, 0, 0);
    sem_init(&peek_done, 0, 0);
    peek_quit = 0;
    peek_pending = 0;
    if (pthread_create(&peek_thread, NULL, peek_main, NULL) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "could not start the peek thread");
        return NULL;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = peek_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(signum, &sa, &peek_old) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    peek_signum = signum;
    peek_armed = 1;
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "the native engine needs Linux and CPython 3.10-3.13");
    return NULL;
#endif
}

#ifdef OMNIPROF_NATIVE
/* sem_wait for at most timeout_s seconds (EINTR retried): 0 when posted, -1 on timeout. Call it
 * without the GIL. */
static int sem_wait_for(sem_t *sem, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(timeout_s * 1e9);
    ts.tv_sec += ns / 1000000000LL;
    ts.tv_nsec = ns % 1000000000LL;
    int rc;
    while ((rc = sem_timedwait(sem, &ts)) != 0 && errno == EINTR) {}
    return rc;
}
#endif

/* wait_new_codes(timeout_s) -> True when the engine saw code objects it had not seen before (or stop()
 * was called) since the last wait, False on timeout. Waits without the GIL. */
static PyObject *py_wait_new_codes(PyObject *self, PyObject *arg) {
#ifdef OMNIPROF_NATIVE
    double timeout = PyFloat_AsDouble(arg);
    if (PyErr_Occurred()) return NULL;
    if (!code_sem_ready) Py_RETURN_FALSE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sem_wait_for(&code_sem, timeout);
    Py_END_ALLOW_THREADS
    code_wake_posted = 0;  /* codes seen from here on post again */
    return PyBool_FromLong(rc == 0);
#else
    Py_RETURN_FALSE;
#endif
}

/* peek_wait(timeout_s) -> 1 when a peek's sampling finished (drain() has its samples), 2 when it was
 * skipped (a profiling session was running), 0 on timeout. */
static PyObject *py_peek_wait(PyObject *self, PyObject *arg) {
#ifdef OMNIPROF_NATIVE
    double timeout = PyFloat_AsDouble(arg);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sem_wait_for(&peek_done, timeout);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc == 0 ? peek_result : 0);
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *py_peek_release(PyObject *self, PyObject *noargs) {
#ifdef OMNIPROF_NATIVE
    peek_pending = 0;  /* the report is printed: the next signal starts a new peek */
#endif
    Py_RETURN_NONE;
}

static PyObject *py_peek_disarm(PyObject *self, PyObject *noargs) {
#ifdef OMNIPROF_NATIVE
    if (!peek_armed) Py_RETURN_NONE;
    sigaction(peek_signum, &peek_old, NULL);
    peek_quit = 1;
    E.stop_req = 1;
    sem_post(&peek_sem);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(peek_thread, NULL);
    Py_END_ALLOW_THREADS
    sem_destroy(&peek_sem);
    sem_destroy(&peek_done);
    peek_armed = 0;
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"available", py_available, METH_NOARGS, "available() -> (bool, how or why not)"},
    {"start", py_start, METH_VARARGS, "start(interval_ns, mode, max_depth, max_pending, exclude_thread_ids)"},
    {"exclude", py_exclude, METH_O, "exclude(thread_id): never sample this thread"},
    {"set_native_ids", py_set_native_ids, METH_O, "set_native_ids({thread id: native id}) (CPython 3.10)"},
    {"stop", py_stop, METH_NOARGS, "stop the engine thread and wait for it"},
    {"drain", py_drain, METH_NOARGS, "drain() -> (samples, new stacks, new code addresses, stats)"},
    {"resolve_codes", py_resolve_codes, METH_O, "resolve_codes(addresses) -> code objects (None: stale)"},
    {"wait_new_codes", py_wait_new_codes, METH_O, "wait_new_codes(timeout_s) -> True when new code objects were seen (or stop() called), False on timeout"},
    {"peek_arm", py_peek_arm, METH_VARARGS, "peek_arm(signum, duration_ns, interval_ns, mode)"},
    {"peek_wait", py_peek_wait, METH_O, "peek_wait(timeout_s) -> 1 when a peek's sampling ended, 2 when skipped, 0 on timeout"},
    {"peek_release", py_peek_release, METH_NOARGS, "let the next signal start a new peek"},
    {"peek_disarm", py_peek_disarm, METH_NOARGS, "restore the signal's handler, end the peek thread"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nativesampler", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nativesampler(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifdef OMNIPROF_NATIVE
    static int atfork_done = 0;  /* once per process, however often the module is initialised */
    if (!atfork_done) { pthread_atfork(NULL, NULL, atfork_child); atfork_done = 1; }
    if (!code_sem_ready && sem_init(&code_sem, 0, 0) == 0) code_sem_ready = 1;
#endif
    PyModule_AddIntConstant(m, "MODE_WALL", MODE_WALL);
    PyModule_AddIntConstant(m, "MODE_CPU", MODE_CPU);
    PyModule_AddIntConstant(m, "MODE_GIL", MODE_GIL);
    PyModule_AddIntConstant(m, "FLAG_IDLE", F_IDLE);
    PyModule_AddIntConstant(m, "FLAG_GIL", F_GIL);
    PyModule_AddIntConstant(m, "FLAG_SHIFT", 40);
#if defined(OMNIPROF_NATIVE) && PY_VERSION_HEX >= 0x030B0000
    PyModule_AddIntConstant(m, "GEN_FRAME_OFFSET", (long)offsetof(PyGenObject, gi_iframe));
#elif defined(OMNIPROF_NATIVE)
    PyModule_AddIntConstant(m, "GEN_FRAME_OFFSET", 0);  /* 3.10: the frame names its generator itself */
#else
    PyModule_AddIntConstant(m, "GEN_FRAME_OFFSET", -1);
#endif
    return m;
}
