/*
 * Sampling allocation tracer for CPython (omniprof backend "memory").
 *
 * Installs hooks on the PYMEM_DOMAIN_MEM and PYMEM_DOMAIN_OBJ allocators (and RAW when the GIL is
 * held). Every allocation is counted exactly (number and bytes); one in about 1/sample_rate is
 * recorded with its size and Python stack. The choice is a Bernoulli(sample_rate) per allocation,
 * drawn as a geometric skip count so the common path is one decrement. Frees of recorded pointers
 * are tracked so the report knows which sampled allocations were still alive at the end.
 *
 * Records live in plain C arrays (allocated with the original RAW allocator) and are handed to
 * Python by take(). Code objects in recorded stacks hold a reference until taken.
 */
#define PY_SSIZE_T_CLEAN
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
/* 3.11-3.13: the interpreter's own frames and instance layouts are read in place (the public API
 * would materialise a frame object for every level, allocating inside the allocator hook, and
 * reading __dict__ builds the dict an instance kept lazily). The internal headers need
 * Py_BUILD_CORE before Python.h, as CPython's own modules have it. */
#define OMNIPROF_INTERNALS 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#endif
#include <Python.h>
#include <frameobject.h>
#ifdef OMNIPROF_INTERNALS
#include <internal/pycore_frame.h>
#include <internal/pycore_dict.h>
#include <internal/pycore_object.h>
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t t_ns;
    uint64_t t_free_ns; /* when the block was freed (0: alive) */
    uint64_t size;
    uint64_t thread_id;
    uintptr_t ptr;
    uint32_t frame_start;
    uint32_t nframes;
    uint8_t domain;
    uint8_t freed;
    uint8_t sure; /* recorded because of its size, not sampled: stands for itself alone */
    /* What would be the object's type pointer if the block holds an object starting at offset 0,
     * 16 or 32 (no header, a GC header, a GC header and the managed-dict pointers): read when the
     * block is freed or when sampling stops, while the block is still allocated. take() keeps the
     * candidate that names a known type. */
    uintptr_t type_cand[3];
} Record;

static const size_t TYPE_OFFSETS[3] = {0, 16, 32};

static void read_type_candidates(Record *r) {
    for (int k = 0; k < 3; k++) {
        size_t off = TYPE_OFFSETS[k];
        r->type_cand[k] = (r->domain == 2 && r->size >= off + 2 * sizeof(void *))
                              ? *(uintptr_t *)(r->ptr + off + sizeof(void *)) : 0;
    }
}

typedef struct {
    PyObject *code; /* owned reference */
    int addr;       /* byte offset of the current instruction (line resolved in take()), or -1 - line */
} FrameRec;

static PyMemAllocatorEx orig_raw, orig_mem, orig_obj;
static int active = 0;
static double sample_rate = 0.01;
static double inv_log1m_rate = 0.0; /* 1 / log(1 - sample_rate), drawn into every skip count */
static uint64_t always_bytes = UINT64_MAX; /* allocations at least this large are always recorded */
static uint64_t max_records = 1000000;
static uint32_t max_frames = 128;
static uint64_t countdown = 1;
static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static Record *records = NULL;
static uint64_t nrecords = 0, cap_records = 0;
static FrameRec *frames = NULL;
static uint64_t nframes_total = 0, cap_frames = 0;

/* exact running totals over time */
#define MAX_TIMELINE 100000
typedef struct { uint64_t t_ns, allocations, bytes; } TimePoint;
static TimePoint timeline[MAX_TIMELINE];
static uint64_t ntimeline = 0, timeline_next_ns = 0, timeline_dropped = 0;
static uint64_t last_t_ns = 0; /* time of the latest recorded allocation */

/* exact counters. The countdown runs down once per allocation below always_bytes, so the hot path
 * keeps no count of its own: allocations = (skip counts drawn) - countdown + large allocations. */
static uint64_t drawn = 1, large_seen = 0, bytes_seen = 0, dropped = 0, frees_of_sampled = 0;
static inline uint64_t allocs_seen(void) { return drawn - countdown + large_seen; }

/* open-addressing map: sampled live pointer -> record index + 1 (0 = empty, tombstone = UINT64_MAX);
 * a key and its value side by side, so a probe costs one cache line, not two */
typedef struct { uintptr_t key; uint64_t val; } MapSlot;
static MapSlot *map = NULL;
static uint64_t map_cap = 0, map_used = 0;

/* Live sampled blocks counted by address, in front of the map: nearly every free is of a block
 * never sampled and must learn so in a few instructions. The slot is bits 4-21 of the address
 * (blocks are 16-byte aligned), not a hash: frees close in address (pymalloc's pools, whose blocks
 * are reused last-in first-out) touch the same few cache lines. A zero count proves "not sampled";
 * the count drops when its block is freed, so an address sampled once and reused since costs no
 * probe (a bit filter cannot unset a bit: the hot, reused blocks of a loop kept their bits, and
 * nearly every free probed the map -- 78 instructions a free instead of 6). Blocks 4 MiB apart
 * share a slot, so a slot is taken with probability about live sampled blocks / 2^18 -- and a hot
 * block whose slot is taken by a long-lived sampled block meets it at every free: a program that
 * keeps what it allocated (15,000 live sampled blocks: 6% of the slots) had its churn probe the
 * map on 6% of frees. A second count, by a hash of the whole address, stands between the two:
 * a block collides in both with probability about (live / 2^18)^2 (0.3% there), and it is read
 * only when the first is not zero, out of line. A count that reaches 255 stays there (always
 * probe) until take() clears them all. */
#define LIVE_BITS 18
static uint8_t live_count[1u << LIVE_BITS];
static uint8_t live_count2[1u << LIVE_BITS];
static uint64_t live_entries = 0;
#define LIVE_SLOT(p) ((((uintptr_t)(p)) >> 4) & ((1u << LIVE_BITS) - 1))
#define LIVE_SLOT2(p) ((uint32_t)(((((uintptr_t)(p)) >> 4) * 0x9E3779B97F4A7C15ULL) >> (64 - LIVE_BITS)))

static inline void live_counts_add(uintptr_t key, int delta) {
    uint8_t *c = &live_count[LIVE_SLOT(key)], *c2 = &live_count2[LIVE_SLOT2(key)];
    if (*c < 255) *c = (uint8_t)(*c + delta);
    if (*c2 < 255) *c2 = (uint8_t)(*c2 + delta);
}

/* Set while we record: an allocation the tracer itself made then would not be recorded (it makes
 * none: frames are read in place, buffers come from the RAW allocator, which is not hooked, and
 * take() refuses to run while the hooks are in). MEM and OBJ hooks run with the GIL held, so one
 * global flag serves every thread. */
static int in_hook = 0;

static void *raw_malloc(size_t n) { return orig_raw.malloc(orig_raw.ctx, n); }
static void *raw_realloc(void *p, size_t n) { return orig_raw.realloc(orig_raw.ctx, p, n); }
static void raw_free(void *p) { orig_raw.free(orig_raw.ctx, p); }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_next(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

/* splitmix64: turns any seed (1, 42, ...) into a well-mixed xorshift state, so sampling is
 * unbiased from the first allocation (a small seed used raw gives tiny first draws of u, hence
 * long first skips: thousands of allocations never sampled). */
static uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t draw_countdown(void) {
    if (sample_rate >= 1.0) return 1;
    if (sample_rate <= 0.0) return UINT64_MAX; /* sample_rate=0: count, record nothing */
    double u = ((rng_next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* (0,1) */
    double k = floor(log(u) * inv_log1m_rate);
    if (k > 1e18) k = 1e18;
    return (uint64_t)k + 1;
}

static uint64_t hash_ptr(uintptr_t p) {
    uint64_t x = (uint64_t)p >> 4;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int map_grow(void) {
    /* tombstones only (frees of sampled blocks) are swept at the same size; it doubles when live
     * entries fill a quarter of it */
    uint64_t ncap = !map_cap ? 1024 : (live_entries + 1) * 4 > map_cap ? map_cap * 2 : map_cap;
    MapSlot *nm = raw_malloc(ncap * sizeof(MapSlot));
    if (!nm) return -1;
    memset(nm, 0, ncap * sizeof(MapSlot));
    uint64_t used = 0;
    for (uint64_t i = 0; i < map_cap; i++) {
        if (map[i].key && map[i].val && map[i].val != UINT64_MAX) {
            uint64_t h = hash_ptr(map[i].key) & (ncap - 1);
            while (nm[h].key) h = (h + 1) & (ncap - 1);
            nm[h] = map[i];
            used++;
        }
    }
    if (map) raw_free(map);
    map = nm; map_cap = ncap; map_used = used;
    return 0;
}

static void map_put(uintptr_t key, uint64_t val) {
    if ((map_used + 1) * 2 > map_cap && map_grow() < 0) return;
    uint64_t h = hash_ptr(key) & (map_cap - 1);
    while (map[h].key && map[h].key != key) h = (h + 1) & (map_cap - 1);
    if (!map[h].key) map_used++;
    if (map[h].key != key || !map[h].val || map[h].val == UINT64_MAX) {
        live_counts_add(key, 1);
        live_entries++;
    }
    map[h].key = key;
    map[h].val = val;
}

/* remove key; returns record index + 1 or 0 */
static uint64_t map_pop(uintptr_t key) {
    if (!map_cap) return 0;
    uint64_t h = hash_ptr(key) & (map_cap - 1);
    while (map[h].key) {
        if (map[h].key == key && map[h].val != UINT64_MAX) {
            uint64_t v = map[h].val;
            map[h].val = UINT64_MAX; /* tombstone keeps probe chains intact */
            live_counts_add(key, -1);
            live_entries--;
            return v;
        }
        h = (h + 1) & (map_cap - 1);
    }
    return 0;
}

/* readable: the block is still allocated (a free hook, before the real free); a realloc has
 * already moved or resized it, so its candidates are not read (the type stays unknown). */
static void note_sampled_free(void *ptr, int readable) {
    uint64_t v = map_pop((uintptr_t)ptr);
    if (v) {
        records[v - 1].freed = 1;
        /* no clock read here (a clock_gettime per free of a sampled block costs as much as the
         * rest of the free path on a VM): the time of the latest sampled allocation, which at
         * rate p is at most ~1/p allocations old -- the live-bytes timeline is per millisecond */
        records[v - 1].t_free_ns = last_t_ns;
        if (readable) read_type_candidates(&records[v - 1]);
        frees_of_sampled++;
    }
}

/* every free: one load of the block's live count by address, nearly always zero */
static inline int live_hint(void *ptr) { return __builtin_expect(live_count[LIVE_SLOT(ptr)] != 0, 0); }

/* then, out of line, the count by hash, before the map is probed (RAW frees without the GIL are
 * not looked up: the map is the GIL's) */
static inline int maybe_sampled(void *ptr, int domain) {
    return live_hint(ptr) && ptr && live_count2[LIVE_SLOT2(ptr)] != 0 && (domain != 0 || PyGILState_Check());
}

static int ensure_capacity(uint32_t want_frames) {
    if (nrecords >= cap_records) {
        uint64_t ncap = cap_records ? cap_records * 2 : 4096;
        if (ncap > max_records) ncap = max_records;
        Record *n = raw_realloc(records, ncap * sizeof(Record));
        if (!n) return -1;
        records = n; cap_records = ncap;
    }
    if (nframes_total + want_frames > cap_frames) {
        uint64_t ncap = cap_frames ? cap_frames * 2 : 65536;
        while (ncap < nframes_total + want_frames) ncap *= 2;
        FrameRec *n = raw_realloc(frames, ncap * sizeof(FrameRec));
        if (!n) return -1;
        frames = n; cap_frames = ncap;
    }
    return 0;
}

static void record(void *ptr, size_t size, uint8_t domain) {
    if (nrecords >= max_records) { dropped++; return; }
    if (ensure_capacity(max_frames) < 0) { dropped++; return; }
    in_hook = 1;
    PyThreadState *ts = PyGILState_GetThisThreadState();
    Record *r = &records[nrecords];
    r->t_ns = last_t_ns = now_ns();
    r->t_free_ns = 0;
    if (ntimeline < MAX_TIMELINE && r->t_ns >= timeline_next_ns) {
        /* exact running totals, at most one point a millisecond (taken only when sampling) */
        timeline[ntimeline].t_ns = r->t_ns;
        timeline[ntimeline].allocations = allocs_seen();
        timeline[ntimeline].bytes = bytes_seen;
        ntimeline++;
        timeline_next_ns = r->t_ns + 1000000ULL;
    } else if (ntimeline >= MAX_TIMELINE) {
        timeline_dropped++;
    }
    r->size = size;
    r->thread_id = (uint64_t)PyThread_get_thread_ident();
    r->ptr = (uintptr_t)ptr;
    r->frame_start = (uint32_t)nframes_total;
    r->nframes = 0;
    r->domain = domain;
    r->freed = 0;
    r->sure = 0;
    r->type_cand[0] = r->type_cand[1] = r->type_cand[2] = 0;
#ifdef OMNIPROF_INTERNALS
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts ? ts->current_frame : NULL;
#else
    _PyInterpreterFrame *f = ts ? ts->cframe->current_frame : NULL;
#endif
    while (f && r->nframes < max_frames) {
#if PY_VERSION_HEX >= 0x030D0000
        if (f->owner != FRAME_OWNED_BY_CSTACK && PyCode_Check(f->f_executable) && !_PyFrame_IsIncomplete(f)) {
            PyCodeObject *co = (PyCodeObject *)f->f_executable;
#else
        if (!_PyFrame_IsIncomplete(f)
#if PY_VERSION_HEX >= 0x030C0000
            && f->owner != FRAME_OWNED_BY_CSTACK
#endif
        ) {
            PyCodeObject *co = f->f_code;
#endif
            FrameRec *fr = &frames[nframes_total++];
            Py_INCREF(co);
            fr->code = (PyObject *)co;
            fr->addr = _PyInterpreterFrame_LASTI(f) * (int)sizeof(_Py_CODEUNIT);
            r->nframes++;
        }
        f = f->previous;
    }
#else
    PyFrameObject *f = ts ? PyThreadState_GetFrame(ts) : NULL; /* new reference */
    while (f && r->nframes < max_frames) {
        FrameRec *fr = &frames[nframes_total++];
        fr->code = (PyObject *)PyFrame_GetCode(f); /* new reference, kept until take() */
        fr->addr = -1 - PyFrame_GetLineNumber(f);
        r->nframes++;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
#endif
    nrecords++;
    map_put((uintptr_t)ptr, nrecords);
    in_hook = 0;
}

/* Large allocations are all recorded (a stratum sampled at rate 1): the estimate of bytes does not
 * hinge on catching the few that weigh most (a list's growth, a big buffer). */
static __attribute__((noinline)) void on_large(void *ptr, size_t size, uint8_t domain) {
    large_seen++;
    if (in_hook || (domain == 0 && !PyGILState_Check())) return;
    record(ptr, size, domain);
    if (nrecords && records[nrecords - 1].ptr == (uintptr_t)ptr) records[nrecords - 1].sure = 1;
}

/* the countdown reached zero: this allocation is sampled */
static __attribute__((noinline)) void on_sampled(void *ptr, size_t size, uint8_t domain) {
    countdown = draw_countdown();
    drawn += countdown;
    if (in_hook || (domain == 0 && !PyGILState_Check())) return; /* RAW without the GIL: no stack to take */
    record(ptr, size, domain);
}

/* Record a made allocation that counts_as_recorded() chose: a large one, or the one the countdown
 * ran down to. */
static inline void record_chosen(void *p, size_t size, uint8_t domain) {
    if (size >= always_bytes) on_large(p, size, domain);
    else on_sampled(p, size, domain);
}

/* An allocation that is recorded: a large one, or the one the countdown ran down to. Made here,
 * then recorded; one that fails is taken out of the counts again. */
static __attribute__((noinline)) void *alloc_recorded(PyMemAllocatorEx *orig, int zeroed, size_t ne, size_t n,
                                                      uint8_t domain) {
    void *p = zeroed ? orig->calloc(orig->ctx, ne, n) : orig->malloc(orig->ctx, n);
    size_t size = zeroed ? ne * n : n;
    int large = size >= always_bytes;
    if (!p) {
        bytes_seen -= size;
        if (!large) { countdown = draw_countdown(); drawn += countdown - 1; } /* the failed one is no allocation */
        return NULL;
    }
    record_chosen(p, size, domain);
    return p;
}

/* every allocation: add its bytes, run the countdown down; nearly always the last step is a tail
 * call of the real allocator (no frame of ours around it). One that fails there (MemoryError) is
 * still counted: it cannot be told from here without keeping a frame around every call. */
static inline int counts_as_recorded(size_t size) {
    bytes_seen += size;
    return __builtin_expect(size >= always_bytes, 0) || __builtin_expect(--countdown == 0, 0);
}

/* The free hook's common path is a load, a test and a tail call of the real free. */
#define HOOKS(NAME, ORIG, DOMAIN)                                                            \
    static void *NAME##_malloc(void *ctx, size_t n) {                                       \
        if (counts_as_recorded(n)) return alloc_recorded(&ORIG, 0, 1, n, DOMAIN);           \
        return ORIG.malloc(ORIG.ctx, n);                                                    \
    }                                                                                       \
    static void *NAME##_calloc(void *ctx, size_t ne, size_t es) {                           \
        if (counts_as_recorded(ne * es)) return alloc_recorded(&ORIG, 1, ne, es, DOMAIN);   \
        return ORIG.calloc(ORIG.ctx, ne, es);                                               \
    }                                                                                       \
    static void *NAME##_realloc(void *ctx, void *old, size_t n) {                           \
        void *p = ORIG.realloc(ORIG.ctx, old, n);                                           \
        if (p) {                                                                            \
            if (maybe_sampled(old, DOMAIN)) note_sampled_free(old, 0);                      \
            if (counts_as_recorded(n)) record_chosen(p, n, DOMAIN);                         \
        }                                                                                   \
        return p;                                                                           \
    }                                                                                       \
    static __attribute__((noinline)) void NAME##_free_hinted(void *p) {                     \
        if (maybe_sampled(p, DOMAIN)) note_sampled_free(p, 1);                              \
        ORIG.free(ORIG.ctx, p);                                                             \
    }                                                                                       \
    static void NAME##_free(void *ctx, void *p) {                                           \
        if (live_hint(p)) NAME##_free_hinted(p);                                            \
        else ORIG.free(ORIG.ctx, p);                                                        \
    }

HOOKS(hraw, orig_raw, 0)
HOOKS(hmem, orig_mem, 1)
HOOKS(hobj, orig_obj, 2)

static PyMemAllocatorEx hook_raw = {NULL, hraw_malloc, hraw_calloc, hraw_realloc, hraw_free};
static PyMemAllocatorEx hook_mem = {NULL, hmem_malloc, hmem_calloc, hmem_realloc, hmem_free};
static PyMemAllocatorEx hook_obj = {NULL, hobj_malloc, hobj_calloc, hobj_realloc, hobj_free};

static void release_frames(uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; i++) Py_XDECREF(frames[i].code);
}

static PyObject *py_start(PyObject *self, PyObject *args) {
    double rate;
    unsigned long long maxrec, seed;
    unsigned int maxfr;
    int trace_raw;
    unsigned long long always = 0;
    if (!PyArg_ParseTuple(args, "dKIKp|K", &rate, &maxrec, &maxfr, &seed, &trace_raw, &always)) return NULL;
    if (active) { PyErr_SetString(PyExc_RuntimeError, "allocation sampler already running"); return NULL; }
    if (!(rate >= 0.0 && rate <= 1.0)) { PyErr_SetString(PyExc_ValueError, "sample_rate must be in [0, 1]"); return NULL; }
    sample_rate = rate;
    always_bytes = (always && rate > 0.0) ? (uint64_t)always : UINT64_MAX;
    max_records = maxrec ? maxrec : 1;
    max_frames = maxfr ? maxfr : 1;
    inv_log1m_rate = (rate > 0.0 && rate < 1.0) ? 1.0 / log1p(-rate) : 0.0;
    rng_state = splitmix64(seed);
    if (!rng_state) rng_state = 0x9E3779B97F4A7C15ULL;
    uint64_t carried = drawn - countdown; /* allocations counted before a stop() not yet taken */
    countdown = draw_countdown();
    drawn = countdown + carried;
    PyMem_GetAllocator(PYMEM_DOMAIN_RAW, &orig_raw);
    PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &orig_mem);
    PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &orig_obj);
    if (trace_raw) PyMem_SetAllocator(PYMEM_DOMAIN_RAW, &hook_raw);
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &hook_mem);
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &hook_obj);
    active = trace_raw ? 2 : 1;
    Py_RETURN_NONE;
}

static PyObject *py_stop(PyObject *self, PyObject *noargs) {
    if (!active) Py_RETURN_NONE;
    in_hook = 1;
    for (uint64_t i = 0; i < nrecords; i++) /* blocks still allocated: read them while we know it */
        if (!records[i].freed) read_type_candidates(&records[i]);
    in_hook = 0;
    if (active == 2) PyMem_SetAllocator(PYMEM_DOMAIN_RAW, &orig_raw);
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &orig_mem);
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &orig_obj);
    active = 0;
    Py_RETURN_NONE;
}

/* Drop the session's records, counters, timeline and live-block filter: after take() has built
 * its lists, or in a forked child (discard()), where they are the parent's. */
static void forget_session(void) {
    release_frames(0, nframes_total);
    nrecords = 0;
    nframes_total = 0;
    drawn = countdown;
    large_seen = bytes_seen = dropped = frees_of_sampled = 0;
    ntimeline = timeline_next_ns = timeline_dropped = 0;
    if (map_cap) { memset(map, 0, map_cap * sizeof(MapSlot)); map_used = 0; }
    memset(live_count, 0, sizeof(live_count));
    memset(live_count2, 0, sizeof(live_count2));
    live_entries = 0;
    in_hook = 0;
}

/* take(types) -> (records, stats). records: list of (t_ns, size, thread_id, freed, domain, ((code, line), ...),
 * type) root-last; type is types[candidate address] for the first candidate found in the dict types
 * ({id(type): name}), or None. */
static PyObject *py_take(PyObject *self, PyObject *types) {
    if (types != Py_None && !PyDict_Check(types)) { PyErr_SetString(PyExc_TypeError, "take(types): a dict or None"); return NULL; }
    if (active) { PyErr_SetString(PyExc_RuntimeError, "take(): stop() the sampler first"); return NULL; }
    PyObject *out = PyList_New((Py_ssize_t)nrecords);
    if (!out) return NULL;
    for (uint64_t i = 0; i < nrecords; i++) {
        Record *r = &records[i];
        PyObject *stack = PyTuple_New(r->nframes);
        if (!stack) { Py_DECREF(out); return NULL; }
        for (uint32_t j = 0; j < r->nframes; j++) {
            FrameRec *fr = &frames[r->frame_start + j];
            int line = fr->addr < 0 ? -1 - fr->addr : PyCode_Addr2Line((PyCodeObject *)fr->code, fr->addr);
            PyObject *pair = Py_BuildValue("(Oi)", fr->code, line);
            if (!pair) { Py_DECREF(stack); Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(stack, j, pair);
        }
        PyObject *tname = Py_None;
        for (int k = 0; k < 3 && types != Py_None && tname == Py_None; k++) {
            if (!r->type_cand[k]) continue;
            PyObject *key = PyLong_FromVoidPtr((void *)r->type_cand[k]);
            if (!key) { Py_DECREF(stack); Py_DECREF(out); return NULL; }
            PyObject *hit = PyDict_GetItemWithError(types, key); /* borrowed */
            Py_DECREF(key);
            if (hit) tname = hit;
            else if (PyErr_Occurred()) { Py_DECREF(stack); Py_DECREF(out); return NULL; }
        }
        PyObject *item = Py_BuildValue("(KKKiiNOKi)", (unsigned long long)r->t_ns, (unsigned long long)r->size,
                                       (unsigned long long)r->thread_id, (int)r->freed, (int)r->domain, stack, tname,
                                       (unsigned long long)r->t_free_ns, (int)r->sure);
        if (!item) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    PyObject *tl = PyList_New((Py_ssize_t)ntimeline);
    if (!tl) { Py_DECREF(out); return NULL; }
    for (uint64_t i = 0; i < ntimeline; i++) {
        PyObject *pt = Py_BuildValue("(KKK)", (unsigned long long)timeline[i].t_ns,
                                     (unsigned long long)timeline[i].allocations, (unsigned long long)timeline[i].bytes);
        if (!pt) { Py_DECREF(tl); Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(tl, (Py_ssize_t)i, pt);
    }
    PyObject *stats = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:N,s:K}", "allocations", (unsigned long long)allocs_seen(),
                                    "allocated_bytes", (unsigned long long)bytes_seen, "sampled",
                                    (unsigned long long)nrecords, "dropped", (unsigned long long)dropped,
                                    "frees_of_sampled", (unsigned long long)frees_of_sampled,
                                    "timeline", tl, "timeline_dropped", (unsigned long long)timeline_dropped);
    forget_session();
    if (!stats) { Py_DECREF(out); return NULL; }
    return Py_BuildValue("(NN)", out, stats);
}

/* discard(): stop if running and drop every record without building anything (a forked child:
 * the records and the session are the parent's). */
static PyObject *py_discard(PyObject *self, PyObject *noargs) {
    if (active) {
        if (active == 2) PyMem_SetAllocator(PYMEM_DOMAIN_RAW, &orig_raw);
        PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &orig_mem);
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &orig_obj);
        active = 0;
    }
    forget_session();
    Py_RETURN_NONE;
}

/* instance_state(obj) -> (attrs, dict, values_bytes) without materialising anything.
 * CPython 3.11+ keeps an instance's attributes in a values array until someone asks for __dict__
 * (3.11/3.12: a separate block the object points to; 3.13: inline, right after the object);
 * reading __dict__ (or vars(), dir(), __getstate__) builds the dict for good.
 * attrs: ((name, value), ...) read from that array and the type's shared keys, or None when the
 * object keeps no such array (or it is no longer the attributes' home); dict: the instance dict
 * when it exists (None otherwise); values_bytes: the array's size in bytes (a separate block on
 * 3.11/3.12, or memory of the instance on 3.13: not counted by sys.getsizeof either way). */
#ifdef OMNIPROF_INTERNALS
/* The values array's bytes. 3.11/3.12: a prefix (insertion order and its size, rounded up to
 * a pointer; its size is byte [-1]) and one slot per usable key, as many as the type's shared keys
 * had when the object was made; they only shrink afterwards (each new instance takes one), so the
 * keys now give a lower bound, and the prefix (round_up(slots + 2, 8)) bounds it both ways: exact
 * once the type has settled, at most 7 slots short for the first instances of a class.
 * 3.13: the header, capacity slots and the insertion order after them. */
static Py_ssize_t values_size(PyDictValues *values, PyDictKeysObject *keys) {
    const Py_ssize_t w = (Py_ssize_t)sizeof(PyObject *);
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t cap = values->capacity;
    (void)keys;
    return (cap + 1) * w + ((cap + w - 1) / w) * w;
#else
    Py_ssize_t prefix = ((uint8_t *)values)[-1];
    Py_ssize_t slots = keys->dk_nentries + keys->dk_usable;
    if (slots < prefix - w - 1) slots = prefix - w - 1;
    if (slots > prefix - 2) slots = prefix - 2;
    if (slots < 0) slots = 0;
    return prefix + slots * w;
#endif
}
#endif

static PyObject *py_instance_state(PyObject *self, PyObject *obj) {
    PyTypeObject *tp = Py_TYPE(obj);
    PyObject *dict = NULL;
    PyObject *attrs = NULL;
    Py_ssize_t values_bytes = 0;
#ifdef OMNIPROF_INTERNALS
    if (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        PyDictValues *values = NULL;
        Py_ssize_t nslots = 0; /* how many of values' slots hold attributes by key index */
#if PY_VERSION_HEX >= 0x030D0000
        dict = (PyObject *)_PyObject_ManagedDictPointer(obj)->dict;
        if (tp->tp_flags & Py_TPFLAGS_INLINE_VALUES) {
            PyDictValues *inl = _PyObject_InlineValues(obj);
            values_bytes = values_size(inl, NULL); /* part of the instance, valid or not */
            /* valid: the attributes live here (a dict built from them shares this array);
             * not valid: they moved to the dict */
            if (inl->valid) { values = inl; nslots = inl->capacity; }
        }
#elif PY_VERSION_HEX >= 0x030C0000
        PyDictOrValues dorv = *_PyObject_DictOrValuesPointer(obj);
        if (_PyDictOrValues_IsValues(dorv)) values = _PyDictOrValues_GetValues(dorv);
        else dict = _PyDictOrValues_GetDict(dorv);
#else
        values = *_PyObject_ValuesPointer(obj);
        if (!values) dict = *_PyObject_ManagedDictPointer(obj);
#endif
        PyDictKeysObject *keys = (tp->tp_flags & Py_TPFLAGS_HEAPTYPE) ? ((PyHeapTypeObject *)tp)->ht_cached_keys : NULL;
        if (values && keys && DK_IS_UNICODE(keys)) {
            PyDictUnicodeEntry *ents = DK_UNICODE_ENTRIES(keys);
            Py_ssize_t n = keys->dk_nentries;
#if PY_VERSION_HEX < 0x030D0000
            values_bytes = values_size(values, keys);
            nslots = n; /* every key index is below this object's slot count (see values_size) */
#endif
            if (n > nslots) n = nslots;
            attrs = PyList_New(0);
            if (!attrs) return NULL;
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *v = values->values[i];
                if (!v || !ents[i].me_key) continue;
                PyObject *pair = PyTuple_Pack(2, ents[i].me_key, v);
                if (!pair || PyList_Append(attrs, pair) < 0) { Py_XDECREF(pair); Py_DECREF(attrs); return NULL; }
                Py_DECREF(pair);
            }
        }
    } else
#endif
    if (tp->tp_dictoffset != 0
#ifdef Py_TPFLAGS_MANAGED_DICT
        && !(tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) /* a CPython newer than this reader: asking builds it */
#endif
    ) {
        /* a dict slot inside the object (negative offsets count from the end of a variable-size
         * one): reading the slot builds nothing */
        PyObject **slot = _PyObject_GetDictPtr(obj);
        if (slot) dict = *slot;
    }
    return Py_BuildValue("(NOn)", attrs ? attrs : Py_NewRef(Py_None), dict ? dict : Py_None, values_bytes);
}

/* frame_locals(frame) -> ((name, value), ...) or None, without building f_locals.
 * A frame still running on a thread's stack holds its locals in the interpreter's own frame
 * (3.11+), which the collector does not visit through the frame object: gc.get_referents(frame)
 * lists none of them, and the heap snapshot would show everything that only a running function
 * holds as unreachable. f_locals would build (3.11/3.12) or proxy (3.13) a mapping; this reads the
 * slots in place, named by the code's local, cell and free variable names (a cell variable's value
 * is its cell). A generator's frame likewise (suspended, or running on a stack: reached through
 * its frame object, the generator itself being held only by its caller's value stack). None for a
 * frame that finished (its frame object owns a copy, which the collector visits). 3.10: the frame
 * object's own slots. */
static PyObject *py_frame_locals(PyObject *self, PyObject *obj) {
    if (!PyFrame_Check(obj)) { PyErr_SetString(PyExc_TypeError, "frame_locals(frame): a frame"); return NULL; }
    PyObject **slots;
    PyObject *names[3] = {NULL, NULL, NULL}; /* name tuples in slot order */
    Py_ssize_t counts[3] = {0, 0, 0};
#ifdef OMNIPROF_INTERNALS
    _PyInterpreterFrame *f = ((PyFrameObject *)obj)->f_frame;
    if (!f || (f->owner != FRAME_OWNED_BY_THREAD && f->owner != FRAME_OWNED_BY_GENERATOR)) Py_RETURN_NONE;
#if PY_VERSION_HEX >= 0x030D0000
    if (!PyCode_Check(f->f_executable)) Py_RETURN_NONE;
    PyCodeObject *co = (PyCodeObject *)f->f_executable;
#else
    PyCodeObject *co = f->f_code;
#endif
    slots = f->localsplus;
    names[0] = co->co_localsplusnames;
    counts[0] = co->co_nlocalsplus;
#else
    PyFrameObject *f = (PyFrameObject *)obj;
    PyCodeObject *co = f->f_code;
    slots = f->f_localsplus;
    names[0] = co->co_varnames; counts[0] = co->co_nlocals;
    names[1] = co->co_cellvars; counts[1] = PyTuple_GET_SIZE(co->co_cellvars);
    names[2] = co->co_freevars; counts[2] = PyTuple_GET_SIZE(co->co_freevars);
#endif
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    Py_ssize_t at = 0;
    for (int t = 0; t < 3; t++) {
        for (Py_ssize_t i = 0; i < counts[t] && i < PyTuple_GET_SIZE(names[t]); i++, at++) {
            PyObject *v = slots[at];
            if (!v) continue;
            PyObject *pair = PyTuple_Pack(2, PyTuple_GET_ITEM(names[t], i), v);
            if (!pair || PyList_Append(out, pair) < 0) { Py_XDECREF(pair); Py_DECREF(out); return NULL; }
            Py_DECREF(pair);
        }
    }
    return out;
}

static PyObject *py_is_active(PyObject *self, PyObject *noargs) { return PyBool_FromLong(active != 0); }

static PyMethodDef methods[] = {
    {"start", py_start, METH_VARARGS, "start(sample_rate, max_records, max_frames, seed, trace_raw[, always_bytes])"},
    {"stop", py_stop, METH_NOARGS, "stop(): restore the original allocators"},
    {"take", py_take, METH_O, "take(types) -> (records, stats); clears the buffer"},
    {"instance_state", py_instance_state, METH_O, "instance_state(obj) -> (attrs, dict, values_bytes)"},
    {"frame_locals", py_frame_locals, METH_O, "frame_locals(frame) -> ((name, value), ...) or None"},
    {"is_active", py_is_active, METH_NOARGS, "True while hooks are installed"},
    {"discard", py_discard, METH_NOARGS, "discard(): stop and drop every record (a forked child)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_allocsampler", "Sampling allocation tracer.", -1, methods};

PyMODINIT_FUNC PyInit__allocsampler(void) { return PyModule_Create(&moduledef); }
