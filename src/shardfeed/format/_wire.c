/* shardfeed.format._wire: the per-record work of a batch of TFRecord records, in C.
 *
 * Functions, each doing for many records what the Python format layer does for one:
 *
 *   unframe(blobs, ranges, starts, ends, verify) -> list[bytes] | int | None
 *       The payloads of records held in coalesced reads, their framing (and data CRC)
 *       checked; or the member number of the first record that fails a check, so that the
 *       Python path can name its fault; None for reads that are not bytes.
 *
 *   example_columns(payloads, names, count) -> list | None
 *       The named features of many serialized tf.train.Example messages, gathered one
 *       column a feature; or None for anything outside the plain encoding every writer
 *       produces (the Python path then decodes them, or names what differs).
 *
 *   gather(maps, offsets, which, records, verify) -> list[bytes] | int
 *       The payloads of records read straight from memory-mapped shards (record r of map
 *       which[i] lies between offsets[which[i]][r] and [r + 1]), their framing checked as
 *       unframe checks it; or the position of the first record that does not lie within
 *       its map, fails a check, or sits on a page the file no longer has (a shard cut
 *       short while mapped raises SIGBUS on that page: caught here, never a crash).
 *
 *   drop_pages(map) -> None
 *       madvise(MADV_DONTNEED) over a whole read-only map (its resident pages dropped from
 *       the process; the page cache keeps them), without the GIL: mmap.madvise keeps it
 *       for the whole call, which takes a millisecond for a large map's pages.
 *
 *   gather_columns(maps, offsets, which, records, verify, names, count, fills)
 *           -> (list, int) | int | None
 *       gather and example_columns in one pass, without a bytes object a record: each
 *       record copied from its map into a scratch buffer, checked there and parsed there;
 *       the columns and the bytes read, or what gather and example_columns give back for
 *       records they do not accept. A feature given a fill buffer has its one bytes value of
 *       each record copied into that record's row of the buffer (its column is None);
 *       a value of another size is not accepted.
 *
 * All of them only accept what they are sure of: a record they do not accept is handed back to the
 * Python path, which gives the same values or raises the same error as before. Nothing
 * here decides an error message. The checking loops run without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define WIRE_LITTLE_ENDIAN 1
#else
#define WIRE_LITTLE_ENDIAN 0
#endif

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ------------------------- */

static uint32_t crc_tables[8][256];

static void crc_build_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int bit = 0; bit < 8; bit++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_tables[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_tables[t][i] = (crc_tables[t - 1][i] >> 8)
                               ^ crc_tables[0][crc_tables[t - 1][i] & 0xFFu];
}

static uint32_t crc_bytewise(uint32_t c, const uint8_t *p, size_t n)
{
    while (n--)
        c = (c >> 8) ^ crc_tables[0][(c ^ *p++) & 0xFFu];
    return c;
}

static uint32_t crc_software(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
#if WIRE_LITTLE_ENDIAN
    while (n >= 8) {  /* eight bytes a step, one table each */
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = crc_tables[7][w & 0xFF] ^ crc_tables[6][(w >> 8) & 0xFF]
            ^ crc_tables[5][(w >> 16) & 0xFF] ^ crc_tables[4][(w >> 24) & 0xFF]
            ^ crc_tables[3][(w >> 32) & 0xFF] ^ crc_tables[2][(w >> 40) & 0xFF]
            ^ crc_tables[1][(w >> 48) & 0xFF] ^ crc_tables[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    return crc_bytewise(c, p, n) ^ 0xFFFFFFFFu;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define WIRE_HAVE_CRC_INSTRUCTION 1

/* The instruction's result waits on the previous one (3 cycles): three lanes of LANE_BYTES
 * run side by side and are joined by shifting a lane's CRC over the bytes after it (a CRC is
 * linear: the state after data D from state s is shift(s, |D|) ^ (the state after D from 0)). */
#define LANE_BYTES 256
static uint32_t lane_shift[4][256];  /* shift over LANE_BYTES zero bytes, a byte of s a table */

static void crc_build_lane_shift(void)
{
    for (int j = 0; j < 4; j++) {
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t c = v << (8 * j);
            for (int k = 0; k < LANE_BYTES; k++)
                c = (c >> 8) ^ crc_tables[0][c & 0xFFu];
            lane_shift[j][v] = c;
        }
    }
}

static inline uint32_t shift_over_lane(uint32_t c)
{
    return lane_shift[0][c & 0xFFu] ^ lane_shift[1][(c >> 8) & 0xFFu]
           ^ lane_shift[2][(c >> 16) & 0xFFu] ^ lane_shift[3][c >> 24];
}

__attribute__((target("sse4.2")))
static uint32_t crc_instruction(const uint8_t *p, size_t n)
{
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 3 * LANE_BYTES) {
        uint64_t a = c, b = 0, d = 0, w0, w1, w2;
        for (size_t i = 0; i < LANE_BYTES; i += 8) {
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + LANE_BYTES + i, 8);
            memcpy(&w2, p + 2 * LANE_BYTES + i, 8);
            a = _mm_crc32_u64(a, w0);
            b = _mm_crc32_u64(b, w1);
            d = _mm_crc32_u64(d, w2);
        }
        c = shift_over_lane(shift_over_lane((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
        p += 3 * LANE_BYTES;
        n -= 3 * LANE_BYTES;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#else
#define WIRE_HAVE_CRC_INSTRUCTION 0
#endif

static int use_crc_instruction = 0;

static uint32_t crc32c(const uint8_t *p, size_t n)
{
#if WIRE_HAVE_CRC_INSTRUCTION
    if (use_crc_instruction)
        return crc_instruction(p, n);
#endif
    return crc_software(p, n);
}

static uint32_t masked(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

static uint64_t load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- framing ----------------------------------------------------------------------- */

#define HEADER_BYTES 12
#define FRAMING_BYTES 16

/* Whether the record in p[0:size) is sound: its length field equals its size, the length's
 * CRC matches, and (verify) the payload's CRC matches. */
static int record_sound(const uint8_t *p, Py_ssize_t size, int verify)
{
    if (size < FRAMING_BYTES)
        return 0;
    uint64_t length = load_le(p, 8);
    if (length != (uint64_t)(size - FRAMING_BYTES))
        return 0;
    if ((uint32_t)load_le(p + 8, 4) != masked(crc32c(p, 8)))
        return 0;
    if (!verify)
        return 1;
    return (uint32_t)load_le(p + HEADER_BYTES + length, 4)
           == masked(crc32c(p + HEADER_BYTES, (size_t)length));
}

/* Whether the payload copied to `copy` matches the data CRC of the record at p[0:size)
 * (whose framing record_sound accepted). */
static int payload_sound(const uint8_t *copy, const uint8_t *p, Py_ssize_t size)
{
    size_t length = (size_t)(size - FRAMING_BYTES);
    return (uint32_t)load_le(p + HEADER_BYTES + length, 4) == masked(crc32c(copy, length));
}

typedef struct {
    const uint8_t *at;  /* the record's first byte */
    Py_ssize_t size;    /* framing included */
} Span;

/* The records of a plan as spans into their reads; -2 when a record does not lie within
 * its read (the Python path names it), -3 for a read that is not bytes, -1 with an
 * exception set for arguments of the wrong kind, else 0. */
static int plan_spans(PyObject *blobs, PyObject *ranges, PyObject *starts, PyObject *ends,
                      Span *spans, Py_ssize_t count, Py_ssize_t *bad)
{
    Py_ssize_t nranges = PyList_GET_SIZE(ranges);
    if (PyList_GET_SIZE(blobs) != nranges) {
        PyErr_SetString(PyExc_ValueError, "one read a range is needed");
        return -1;
    }
    for (Py_ssize_t r = 0; r < nranges; r++) {
        PyObject *blob = PyList_GET_ITEM(blobs, r);
        PyObject *range = PyList_GET_ITEM(ranges, r);
        if (!PyBytes_Check(blob))
            return -3;  /* another buffer type: the Python path reads it */
        if (!PyTuple_Check(range) || PyTuple_GET_SIZE(range) != 3
                || !PyTuple_Check(PyTuple_GET_ITEM(range, 2))) {
            PyErr_SetString(PyExc_TypeError, "ranges are (offset, length, members)");
            return -1;
        }
        Py_ssize_t offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(range, 0));
        if (offset == -1 && PyErr_Occurred())
            return -1;
        PyObject *members = PyTuple_GET_ITEM(range, 2);
        const uint8_t *base = (const uint8_t *)PyBytes_AS_STRING(blob);
        Py_ssize_t blob_size = PyBytes_GET_SIZE(blob);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(members); i++) {
            Py_ssize_t m = PyLong_AsSsize_t(PyTuple_GET_ITEM(members, i));
            if (m == -1 && PyErr_Occurred())
                return -1;
            if (m < 0 || m >= count) {
                PyErr_SetString(PyExc_IndexError, "a range member is out of range");
                return -1;
            }
            Py_ssize_t a = PyLong_AsSsize_t(PyList_GET_ITEM(starts, m));
            Py_ssize_t b = PyLong_AsSsize_t(PyList_GET_ITEM(ends, m));
            if ((a == -1 || b == -1) && PyErr_Occurred())
                return -1;
            a -= offset;
            b -= offset;
            if (a < 0 || b < a || b > blob_size) {
                *bad = m;
                return -2;
            }
            spans[m].at = base + a;
            spans[m].size = b - a;
        }
    }
    return 0;
}

/* Work below these sizes keeps the GIL: giving it up costs more than it frees when the
 * other threads need it back at once. */
#define RELEASE_GIL_BYTES (1 << 20)
#define RELEASE_GIL_FIELDS (1 << 16)

static PyThreadState *release_if(int cond)
{
    return cond ? PyEval_SaveThread() : NULL;
}

static void restore(PyThreadState *state)
{
    if (state != NULL)
        PyEval_RestoreThread(state);
}

static PyObject *wire_unframe(PyObject *self, PyObject *args)
{
    PyObject *blobs, *ranges, *starts, *ends;
    int verify;
    if (!PyArg_ParseTuple(args, "O!O!O!O!p", &PyList_Type, &blobs, &PyList_Type, &ranges,
                          &PyList_Type, &starts, &PyList_Type, &ends, &verify))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(starts);
    if (PyList_GET_SIZE(ends) != count) {
        PyErr_SetString(PyExc_ValueError, "starts and ends differ in length");
        return NULL;
    }
    Span *spans = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Span));
    if (spans == NULL)
        return PyErr_NoMemory();
    Py_ssize_t bad = -1;
    int planned = plan_spans(blobs, ranges, starts, ends, spans, count, &bad);
    if (planned == -1 || planned == -3) {
        PyMem_Free(spans);
        if (planned == -1)
            return NULL;
        Py_RETURN_NONE;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t m = 0; planned == 0 && m < count; m++) {
        if (spans[m].at == NULL) {  /* a record no range holds */
            PyErr_SetString(PyExc_ValueError, "a record is in no range");
            PyMem_Free(spans);
            return NULL;
        }
        total += spans[m].size;
    }
    if (planned == 0) {
        /* the reads stay alive while the GIL is released: a tuple holds them, whatever
         * happens to the list */
        PyObject *held = PyList_AsTuple(blobs);
        if (held == NULL) {
            PyMem_Free(spans);
            return NULL;
        }
        PyThreadState *state = release_if(total >= RELEASE_GIL_BYTES);
        for (Py_ssize_t m = 0; m < count; m++) {
            if (!record_sound(spans[m].at, spans[m].size, verify)) {
                bad = m;
                break;
            }
        }
        restore(state);
        Py_DECREF(held);
    }
    if (bad >= 0) {
        PyMem_Free(spans);
        return PyLong_FromSsize_t(bad);
    }
    PyObject *out = PyList_New(count);
    for (Py_ssize_t m = 0; out != NULL && m < count; m++) {
        PyObject *payload = PyBytes_FromStringAndSize(
            (const char *)spans[m].at + HEADER_BYTES, spans[m].size - FRAMING_BYTES);
        if (payload == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, m, payload);
    }
    PyMem_Free(spans);
    return out;
}

/* ---- gather from memory-mapped shards -------------------------------------------------- */

/* A read of a mapped page past the end of a file that was cut short raises SIGBUS. A
 * thread copying from a map sets its guard; the handler jumps back to it. A SIGBUS
 * anywhere else goes to the handler there was before: called, where it is a function (the
 * handler of another module that compiles this file in, whose guard it may be: given back
 * for good, the next SIGBUS under this module's guard would go there and kill the
 * process); else given back, and the instruction faults again into it (the default: the
 * process ends). */
static _Thread_local sigjmp_buf *bus_guard = NULL;
static struct sigaction bus_before;
static int bus_installed = 0;  /* set under the GIL */

static void on_bus(int signum, siginfo_t *info, void *context)
{
    sigjmp_buf *guard = bus_guard;
    if (guard != NULL) {
        bus_guard = NULL;
        siglongjmp(*guard, 1);
    }
    if (bus_before.sa_flags & SA_SIGINFO) {
        if (bus_before.sa_sigaction != NULL) {
            bus_before.sa_sigaction(signum, info, context);
            return;
        }
    } else if (bus_before.sa_handler != SIG_DFL && bus_before.sa_handler != SIG_IGN) {
        bus_before.sa_handler(signum);
        return;
    }
    sigaction(SIGBUS, &bus_before, NULL);
}

static int install_bus_handler(void)
{
    if (bus_installed)
        return 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_bus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    /* the handler before read first: a SIGBUS between the two calls finds it set */
    if (sigaction(SIGBUS, NULL, &bus_before) != 0 || sigaction(SIGBUS, &action, NULL) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    bus_installed = 1;
    return 0;
}

/* A 64-bit integer array's buffer (NumPy int64/uint64, little-endian); -1 with an
 * exception set for anything else. */
static int int64_buffer(PyObject *obj, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (view->itemsize != 8 || view->ndim != 1 || f[1] != '\0' || strchr("qQlL", f[0]) == NULL) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "a 1-D array of 64-bit integers is needed");
        return -1;
    }
    return 0;
}

typedef struct {
    Py_ssize_t nmaps;
    Py_buffer *maps;     /* nmaps bytes-like maps */
    Py_buffer *offsets;  /* nmaps int64 arrays */
    Py_buffer which, records;
    Py_ssize_t held;     /* buffers of maps and offsets taken so far */
    int have_which, have_records;
} GatherArgs;

static void gather_release(GatherArgs *g)
{
    for (Py_ssize_t k = 0; k < g->held; k++) {
        PyBuffer_Release(&g->maps[k]);
        PyBuffer_Release(&g->offsets[k]);
    }
    if (g->have_which)
        PyBuffer_Release(&g->which);
    if (g->have_records)
        PyBuffer_Release(&g->records);
    PyMem_Free(g->maps);
    PyMem_Free(g->offsets);
}

static int gather_take(GatherArgs *g, PyObject *maps, PyObject *offsets, PyObject *which,
                       PyObject *records)
{
    memset(g, 0, sizeof *g);
    g->nmaps = PyTuple_GET_SIZE(maps);
    if (PyTuple_GET_SIZE(offsets) != g->nmaps) {
        PyErr_SetString(PyExc_ValueError, "one offsets array a map is needed");
        return -1;
    }
    g->maps = PyMem_Calloc((size_t)(g->nmaps ? g->nmaps : 1), sizeof(Py_buffer));
    g->offsets = PyMem_Calloc((size_t)(g->nmaps ? g->nmaps : 1), sizeof(Py_buffer));
    if (g->maps == NULL || g->offsets == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < g->nmaps; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(maps, k), &g->maps[k], PyBUF_SIMPLE) != 0)
            return -1;
        if (int64_buffer(PyTuple_GET_ITEM(offsets, k), &g->offsets[k]) != 0) {
            PyBuffer_Release(&g->maps[k]);
            return -1;
        }
        g->held = k + 1;
    }
    if (int64_buffer(which, &g->which) != 0)
        return -1;
    g->have_which = 1;
    if (int64_buffer(records, &g->records) != 0)
        return -1;
    g->have_records = 1;
    if (g->which.len != g->records.len) {
        PyErr_SetString(PyExc_ValueError, "which and records differ in length");
        return -1;
    }
    return 0;
}

/* The SIGBUS handler installed and the arguments' buffers taken; -1 (nothing held) with an
 * exception set when either fails. */
static int gather_open(GatherArgs *g, PyObject *maps, PyObject *offsets, PyObject *which,
                       PyObject *records)
{
    if (install_bus_handler() != 0)
        return -1;
    if (gather_take(g, maps, offsets, which, records) != 0) {
        gather_release(g);
        return -1;
    }
    return 0;
}

/* Each record's span in its map; the position of the first that does not lie within its
 * map (or whose offsets are out of order), -1 with an exception for a map number out of
 * range, else -2. */
static Py_ssize_t gather_spans(const GatherArgs *g, Span *spans, Py_ssize_t count)
{
    const int64_t *which = (const int64_t *)g->which.buf;
    const int64_t *records = (const int64_t *)g->records.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t k = which[i], r = records[i];
        if (k < 0 || k >= g->nmaps) {
            PyErr_SetString(PyExc_IndexError, "a map number is out of range");
            return -1;
        }
        const Py_buffer *offsets = &g->offsets[k];
        if (r < 0 || r + 1 >= offsets->len / 8)
            return i;
        const uint64_t *at = (const uint64_t *)offsets->buf;
        uint64_t start = at[r], end = at[r + 1];
        if (start > end || end - start < FRAMING_BYTES || end > (uint64_t)g->maps[k].len)
            return i;
        spans[i].at = (const uint8_t *)g->maps[k].buf + start;
        spans[i].size = (Py_ssize_t)(end - start);
    }
    return -2;
}

/* Records ahead of the one being read whose first bytes are asked of memory: records of
 * a shuffled slice lie apart, and each one's first line would otherwise wait on memory
 * with nothing else to do. */
#define PREFETCH_AHEAD 4
#define PREFETCH_BYTES 2048

static inline void prefetch_span(const Span *span)
{
    Py_ssize_t size = span->size < PREFETCH_BYTES ? span->size : PREFETCH_BYTES;
    for (Py_ssize_t b = 0; b < size; b += 64)
        __builtin_prefetch(span->at + b, 0, 0);
}

/* Copy a record's payload to ``copy``, then check its framing and (verify) the copy's data
 * CRC: the copy's wide loads bring the record in from memory faster than the CRC's, the CRC
 * then reads it from the cache, and the bytes handed on are the bytes checked. */
static inline int copy_record(const Span *span, uint8_t *copy, int verify)
{
    memcpy(copy, span->at + HEADER_BYTES, (size_t)(span->size - FRAMING_BYTES));
    return record_sound(span->at, span->size, 0)
           && (!verify || payload_sound(copy, span->at, span->size));
}

/* Check and copy each record's payload into its bytes object, SIGBUS caught; the position
 * of the first record that fails, else -1. Runs without the GIL. */
static Py_ssize_t gather_copy(const Span *spans, PyObject *out, Py_ssize_t count, int verify)
{
    volatile Py_ssize_t reached = 0;
    sigjmp_buf guard;
    if (sigsetjmp(guard, 1) != 0)
        return reached;  /* a page of the map is gone: the file was cut short */
    bus_guard = &guard;
    Py_ssize_t bad = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        reached = i;
        if (i + PREFETCH_AHEAD < count)
            prefetch_span(&spans[i + PREFETCH_AHEAD]);
        if (!copy_record(&spans[i], (uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(out, i)),
                         verify)) {
            bad = i;
            break;
        }
    }
    bus_guard = NULL;
    return bad;
}

#define RELEASE_GIL_GATHER (1 << 16)

static PyObject *wire_gather(PyObject *self, PyObject *args)
{
    PyObject *maps, *offsets, *which, *records;
    int verify;
    if (!PyArg_ParseTuple(args, "O!O!OOp", &PyTuple_Type, &maps, &PyTuple_Type, &offsets,
                          &which, &records, &verify))
        return NULL;
    GatherArgs g;
    if (gather_open(&g, maps, offsets, which, records) != 0)
        return NULL;
    Py_ssize_t count = g.records.len / 8;
    Span *spans = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Span));
    PyObject *out = spans != NULL ? PyList_New(count) : PyErr_NoMemory();
    Py_ssize_t bad = out != NULL ? gather_spans(&g, spans, count) : -1;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; bad == -2 && i < count; i++) {
        PyObject *payload = PyBytes_FromStringAndSize(NULL, spans[i].size - FRAMING_BYTES);
        if (payload == NULL)
            bad = -1;
        else
            PyList_SET_ITEM(out, i, payload);
        total += spans[i].size;
    }
    if (bad == -2) {
        PyThreadState *state = release_if(total >= RELEASE_GIL_GATHER);
        bad = gather_copy(spans, out, count, verify);
        restore(state);
    }
    gather_release(&g);
    PyMem_Free(spans);
    if (bad == -1 && !PyErr_Occurred())
        return out;
    Py_XDECREF(out);
    return bad >= 0 ? PyLong_FromSsize_t(bad) : NULL;
}

/* ---- tf.train.Example ---------------------------------------------------------------- */

/* Wire tags (field number << 3 | wire type 2, length-delimited) of the messages accepted:
 *   Example  { Features features = 1; }
 *   Features { map<string, Feature> feature = 1; }   entry { string key = 1; Feature value = 2; }
 *   Feature  { oneof kind { BytesList = 1; FloatList = 2; Int64List = 3; } }
 *   BytesList { repeated bytes value = 1; }  FloatList / Int64List { packed value = 1; } */
#define TAG_1 0x0A
#define TAG_2 0x12
#define TAG_3 0x1A
#define KIND_BYTES 0
#define KIND_FLOAT 1
#define KIND_INT64 2
#define MAX_ENTRIES 512

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Cursor;

/* One varint; 0 when it runs past the end or over ten bytes. */
static inline int read_varint(Cursor *c, uint64_t *value)
{
    if (c->p < c->end && *c->p < 0x80) {  /* one byte: every tag, most lengths */
        *value = *c->p++;
        return 1;
    }
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (c->p >= c->end)
            return 0;
        uint8_t byte = *c->p++;
        if (shift == 63 && byte > 1)
            return 0;  /* more than 64 bits: left to the Python path */
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return 1;
        }
    }
    return 0;
}

/* A field of ``tag`` with a length: its contents as a cursor; 0 for anything else. */
static inline int read_field(Cursor *c, uint64_t tag, Cursor *inner)
{
    uint64_t got, length;
    if (!read_varint(c, &got) || got != tag || !read_varint(c, &length))
        return 0;
    if (length > (uint64_t)(c->end - c->p))
        return 0;
    inner->p = c->p;
    inner->end = c->p + length;
    c->p += length;
    return 1;
}

static int valid_utf8(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int more;
        uint32_t cp;
        if ((b & 0xE0) == 0xC0) { more = 1; cp = b & 0x1F; }
        else if ((b & 0xF0) == 0xE0) { more = 2; cp = b & 0x0F; }
        else if ((b & 0xF8) == 0xF0) { more = 3; cp = b & 0x07; }
        else return 0;
        if (n - i <= more)
            return 0;
        for (int k = 1; k <= more; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) || (more == 3 && cp < 0x10000)
                || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += more + 1;
    }
    return 1;
}

typedef struct {
    int kind;            /* KIND_*, or -1 when the record lacks the feature */
    const uint8_t *list; /* the list message's contents */
    const uint8_t *list_end;
    Py_ssize_t values;   /* how many values */
} Found;

/* The values of a list message: how many, after checking its encoding. */
static int count_values(int kind, Cursor list, Found *found)
{
    found->list = list.p;
    found->list_end = list.end;
    found->values = 0;
    if (kind == KIND_BYTES) {
        while (list.p < list.end) {
            Cursor value;
            if (!read_field(&list, TAG_1, &value))
                return 0;
            found->values++;
        }
        return 1;
    }
    if (list.p == list.end)
        return 1;  /* an empty list */
    Cursor packed;
    if (!read_field(&list, TAG_1, &packed) || list.p != list.end)
        return 0;  /* unpacked or split encodings: left to the Python path */
    found->list = packed.p;
    found->list_end = packed.end;
    if (kind == KIND_FLOAT) {
        Py_ssize_t n = packed.end - packed.p;
        if (n % 4)
            return 0;
        found->values = n / 4;
        return 1;
    }
    while (packed.p < packed.end) {
        uint64_t v;
        if (!read_varint(&packed, &v))
            return 0;
        found->values++;
    }
    return 1;
}

/* A Feature message: exactly one list, of a known kind. */
static int read_feature(Cursor feature, Found *found)
{
    uint64_t tag;
    Cursor probe = feature;
    if (!read_varint(&probe, &tag))
        return 0;
    int kind = tag == TAG_1 ? KIND_BYTES : tag == TAG_2 ? KIND_FLOAT : tag == TAG_3 ? KIND_INT64 : -1;
    Cursor list;
    if (kind < 0 || !read_field(&feature, tag, &list) || feature.p != feature.end)
        return 0;
    found->kind = kind;
    return count_values(kind, list, found);
}

typedef struct {
    const uint8_t *key;
    Py_ssize_t key_size;
} Key;

/* One Example: every wanted feature found, in ``found[0:nnames)``; 0 when the record is
 * not plainly encoded, lacks a wanted feature, holds a key twice, or (count >= 0) holds
 * another number of features. */
static int read_example(const uint8_t *p, Py_ssize_t size, const Key *names, Py_ssize_t nnames,
                        Py_ssize_t count, Found *found, Key *seen)
{
    Cursor message = {p, p + size};
    Cursor features;
    if (!read_field(&message, TAG_1, &features) || message.p != message.end)
        return 0;
    for (Py_ssize_t j = 0; j < nnames; j++)
        found[j].kind = -1;
    Py_ssize_t entries = 0;
    while (features.p < features.end) {
        Cursor entry, key, value;
        if (!read_field(&features, TAG_1, &entry) || !read_field(&entry, TAG_1, &key)
                || !read_field(&entry, TAG_2, &value) || entry.p != entry.end)
            return 0;
        Py_ssize_t key_size = key.end - key.p;
        if (entries == MAX_ENTRIES || !valid_utf8(key.p, key_size))
            return 0;
        for (Py_ssize_t e = 0; e < entries; e++)
            if (seen[e].key_size == key_size && memcmp(seen[e].key, key.p, (size_t)key_size) == 0)
                return 0;
        seen[entries].key = key.p;
        seen[entries].key_size = key_size;
        entries++;
        Found unwanted;  /* every feature is checked, as the parser checks the whole message */
        Found *into = &unwanted;
        for (Py_ssize_t j = 0; j < nnames; j++) {
            if (names[j].key_size == key_size
                    && memcmp(names[j].key, key.p, (size_t)key_size) == 0) {
                into = &found[j];
                break;
            }
        }
        if (!read_feature(value, into))
            return 0;
    }
    if (count >= 0 && entries != count)
        return 0;
    for (Py_ssize_t j = 0; j < nnames; j++)
        if (found[j].kind < 0)
            return 0;
    return 1;
}

/* Copies of large values into the bytes objects made for them, done after every column is
 * built, without the GIL where they add up (the objects are not yet seen by Python). */
#define DEFER_COPY_BYTES 512

typedef struct {
    char *to;
    const uint8_t *from;
    Py_ssize_t size;
} Copy;

typedef struct {
    Copy *items;
    Py_ssize_t len, cap, bytes;
} Copies;

static int copies_add(Copies *copies, char *to, const uint8_t *from, Py_ssize_t size)
{
    if (copies->len == copies->cap) {
        Py_ssize_t cap = copies->cap ? 2 * copies->cap : 64;
        Copy *items = PyMem_Realloc(copies->items, (size_t)cap * sizeof(Copy));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        copies->items = items;
        copies->cap = cap;
    }
    copies->items[copies->len++] = (Copy){to, from, size};
    copies->bytes += size;
    return 0;
}

/* Runs and frees the copies (nothing to undo on failure: the caller drops the objects). */
static void copies_run(Copies *copies)
{
    PyThreadState *state = release_if(copies->bytes >= RELEASE_GIL_GATHER);
    for (Py_ssize_t i = 0; i < copies->len; i++)
        memcpy(copies->items[i].to, copies->items[i].from, (size_t)copies->items[i].size);
    restore(state);
    PyMem_Free(copies->items);
    *copies = (Copies){NULL, 0, 0, 0};
}

/* One value as a bytes object: a large one's copy is left to ``copies``. */
static PyObject *bytes_value(Cursor value, Copies *copies)
{
    Py_ssize_t size = value.end - value.p;
    if (size < DEFER_COPY_BYTES)
        return PyBytes_FromStringAndSize((const char *)value.p, size);
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b != NULL && copies_add(copies, PyBytes_AS_STRING(b), value.p, size) != 0)
        Py_CLEAR(b);
    return b;
}

/* Column j for every record: a list of bytes (one value) or lists of bytes. A small single
 * value equal to the row before's is that row's object again (bytes are immutable): a
 * column such as image/format, the same few bytes in every record, costs no allocation a
 * row here and no free a row where the column is dropped. */
static PyObject *bytes_column(const Found *found, Py_ssize_t nrecords, Py_ssize_t nnames,
                              Py_ssize_t j, Copies *copies)
{
    PyObject *column = PyList_New(nrecords);
    PyObject *last = NULL;  /* the row before's single small value (borrowed from the column) */
    for (Py_ssize_t i = 0; column != NULL && i < nrecords; i++) {
        const Found *f = &found[i * nnames + j];
        Cursor list = {f->list, f->list_end};
        PyObject *cell = f->values == 1 ? NULL : PyList_New(f->values);
        if (f->values != 1 && cell == NULL) {
            Py_CLEAR(column);
            break;
        }
        if (f->values == 1) {
            Cursor value = {NULL, NULL};
            Cursor peek = list;
            read_field(&peek, TAG_1, &value);  /* checked while counting */
            Py_ssize_t size = value.end - value.p;
            if (last != NULL && size < DEFER_COPY_BYTES && PyBytes_GET_SIZE(last) == size
                    && (size == 0 || memcmp(PyBytes_AS_STRING(last), value.p,
                                            (size_t)size) == 0)) {
                PyList_SET_ITEM(column, i, Py_NewRef(last));
                continue;
            }
        }
        for (Py_ssize_t k = 0; k < f->values; k++) {
            Cursor value = {NULL, NULL};
            read_field(&list, TAG_1, &value);  /* checked while counting */
            PyObject *b = bytes_value(value, copies);
            if (b == NULL) {
                Py_XDECREF(cell);
                Py_CLEAR(column);
                return NULL;
            }
            if (cell == NULL)
                cell = b;
            else
                PyList_SET_ITEM(cell, k, b);
        }
        if (f->values == 1)
            last = PyBytes_GET_SIZE(cell) < DEFER_COPY_BYTES ? cell : NULL;
        PyList_SET_ITEM(column, i, cell);
    }
    return column;
}

/* Column j for every record, numbers packed in native order into a bytearray (the arrays
 * viewing it are writable, as the parser's are): float32 as stored (a NaN
 * quietened, as a round trip through a Python float does), int64 from their varints. */
static PyObject *numeric_column(const Found *found, Py_ssize_t nrecords, Py_ssize_t nnames,
                                Py_ssize_t j, int kind, Py_ssize_t length)
{
    Py_ssize_t item = kind == KIND_FLOAT ? 4 : 8;
    PyObject *data = PyByteArray_FromStringAndSize(NULL, nrecords * length * item);
    if (data == NULL)
        return NULL;
    uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(data);
    for (Py_ssize_t i = 0; i < nrecords; i++) {
        const Found *f = &found[i * nnames + j];
        if (kind == KIND_FLOAT) {
            for (Py_ssize_t k = 0; k < length; k++) {
                uint32_t bits = (uint32_t)load_le(f->list + 4 * k, 4);
                if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu))
                    bits |= 0x00400000u;
                memcpy(out, &bits, 4);
                out += 4;
            }
        } else {
            Cursor packed = {f->list, f->list_end};
            for (Py_ssize_t k = 0; k < length; k++) {
                uint64_t v = 0;
                read_varint(&packed, &v);  /* checked while counting */
                int64_t s = (int64_t)v;
                memcpy(out, &s, 8);
                out += 8;
            }
        }
    }
    return Py_BuildValue("(inN)", kind, length, data);
}

/* The columns, once every record was read: None when a feature's kind or a numeric
 * feature's length differs between records. A feature with a fill buffer (``fills`` non-NULL
 * and ``fills[j].buf`` set) was copied there already: its column is None. */
static PyObject *build_columns_into(const Found *found, Py_ssize_t nrecords, Py_ssize_t nnames,
                               const Py_buffer *fills, Copies *copies)
{
    PyObject *out = PyList_New(nnames);
    for (Py_ssize_t j = 0; out != NULL && j < nnames; j++) {
        if (fills != NULL && fills[j].buf != NULL) {
            PyList_SET_ITEM(out, j, Py_NewRef(Py_None));
            continue;
        }
        int kind = found[j].kind;
        Py_ssize_t length = found[j].values;
        for (Py_ssize_t i = 1; i < nrecords; i++) {
            const Found *f = &found[i * nnames + j];
            if (f->kind != kind || (kind != KIND_BYTES && f->values != length)) {
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
        }
        PyObject *column = kind == KIND_BYTES
            ? Py_BuildValue("(iN)", kind, bytes_column(found, nrecords, nnames, j, copies))
            : numeric_column(found, nrecords, nnames, j, kind, length);
        if (column == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, j, column);
    }
    return out;
}

/* build_columns_into, then the large values copied in (without the GIL where they add up). */
static PyObject *build_columns(const Found *found, Py_ssize_t nrecords, Py_ssize_t nnames,
                               const Py_buffer *fills)
{
    Copies copies = {NULL, 0, 0, 0};
    PyObject *out = build_columns_into(found, nrecords, nnames, fills, &copies);
    if (out != NULL && out != Py_None)
        copies_run(&copies);
    PyMem_Free(copies.items);
    return out;
}

/* Keys from a tuple of bytes names; -1 with an exception set. */
static int take_keys(PyObject *names, Key *keys)
{
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(names); j++) {
        PyObject *name = PyTuple_GET_ITEM(names, j);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "feature names are bytes");
            return -1;
        }
        keys[j].key = (const uint8_t *)PyBytes_AS_STRING(name);
        keys[j].key_size = PyBytes_GET_SIZE(name);
    }
    return 0;
}

static PyObject *wire_example_columns(PyObject *self, PyObject *args)
{
    PyObject *payloads, *names;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &payloads, &PyTuple_Type, &names, &count))
        return NULL;
    Py_ssize_t nrecords = PyList_GET_SIZE(payloads);
    Py_ssize_t nnames = PyTuple_GET_SIZE(names);
    if (!WIRE_LITTLE_ENDIAN || nrecords == 0 || nnames == 0)
        Py_RETURN_NONE;
    /* a tuple holds the payloads while the GIL is released, whatever the list does */
    PyObject *held = PyList_AsTuple(payloads);
    Key *keys = PyMem_Calloc((size_t)nnames + MAX_ENTRIES, sizeof(Key));
    Found *found = PyMem_Calloc((size_t)(nrecords * nnames), sizeof(Found));
    const uint8_t **data = PyMem_Calloc((size_t)nrecords, sizeof(uint8_t *));
    Py_ssize_t *sizes = PyMem_Calloc((size_t)nrecords, sizeof(Py_ssize_t));
    PyObject *result = NULL;
    if (held == NULL || keys == NULL || found == NULL || data == NULL || sizes == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    if (take_keys(names, keys) != 0)
        goto done;
    for (Py_ssize_t i = 0; i < nrecords; i++) {
        PyObject *payload = PyTuple_GET_ITEM(held, i);
        if (!PyBytes_Check(payload)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        data[i] = (const uint8_t *)PyBytes_AS_STRING(payload);
        sizes[i] = PyBytes_GET_SIZE(payload);
    }
    int plain = 1;
    PyThreadState *state = release_if(nrecords * nnames >= RELEASE_GIL_FIELDS);
    for (Py_ssize_t i = 0; plain && i < nrecords; i++)
        plain = read_example(data[i], sizes[i], keys, nnames, count, &found[i * nnames],
                             keys + nnames);
    restore(state);
    result = plain ? build_columns(found, nrecords, nnames, NULL) : Py_NewRef(Py_None);
done:
    Py_XDECREF(held);
    PyMem_Free(keys);
    PyMem_Free(found);
    PyMem_Free(data);
    PyMem_Free(sizes);
    return result;
}

/* ---- gather, check, parse and fill in one pass -------------------------------------------- */

/* The fill buffers: fills[j] is None (the column is built) or a writable contiguous buffer
 * of nrecords equal rows, feature j's one bytes value of each record copied into its row.
 * -1 with an exception set for a buffer of another kind or size. */
static int take_fills(PyObject *fills, Py_buffer *views, Py_ssize_t nnames, Py_ssize_t nrecords)
{
    if (PyTuple_GET_SIZE(fills) != nnames) {
        PyErr_SetString(PyExc_ValueError, "one fill (or None) a name is needed");
        return -1;
    }
    for (Py_ssize_t j = 0; j < nnames; j++) {
        PyObject *fill = PyTuple_GET_ITEM(fills, j);
        if (fill == Py_None)
            continue;
        if (PyObject_GetBuffer(fill, &views[j], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0)
            return -1;
        if (nrecords == 0 || views[j].len % nrecords != 0) {
            PyBuffer_Release(&views[j]);
            views[j].buf = NULL;
            PyErr_SetString(PyExc_ValueError, "a fill buffer is not one equal row a record");
            return -1;
        }
    }
    return 0;
}

/* Copy record i's one bytes value of every filled feature into its row; 0 (nothing more
 * copied) when a value is not exactly one bytes value of the row's size. */
static int fill_rows(const Found *found, const Py_buffer *fills, Py_ssize_t nnames,
                     Py_ssize_t nrecords, Py_ssize_t i)
{
    for (Py_ssize_t j = 0; j < nnames; j++) {
        if (fills[j].buf == NULL)
            continue;
        Py_ssize_t row = fills[j].len / nrecords;
        Cursor list = {found[j].list, found[j].list_end};
        Cursor value;
        if (found[j].kind != KIND_BYTES || found[j].values != 1
                || !read_field(&list, TAG_1, &value) || value.end - value.p != row)
            return 0;
        memcpy((uint8_t *)fills[j].buf + i * row, value.p, (size_t)row);
    }
    return 1;
}

typedef struct {
    const Key *keys;
    Py_ssize_t nnames, count;
    Found *found;         /* nrecords * nnames */
    Key *seen;            /* MAX_ENTRIES */
    const Py_buffer *fills;
    Py_ssize_t nrecords;
    int plain;            /* cleared at the first record outside the plain encoding */
} Parse;

/* Each record's payload copied into ``scratch`` (one after another), its framing and (verify)
 * data CRC checked in the copy, parsed there and its filled features copied out; SIGBUS
 * caught. The position of the first record that fails a check, else -1 (``parse->plain``
 * says whether every record was parsed). Runs without the GIL. */
static Py_ssize_t parse_spans(const Span *spans, Py_ssize_t count, uint8_t *scratch, int verify,
                              Parse *parse)
{
    volatile Py_ssize_t reached = 0;
    sigjmp_buf guard;
    if (sigsetjmp(guard, 1) != 0)
        return reached;  /* a page of the map is gone: the file was cut short */
    bus_guard = &guard;
    Py_ssize_t bad = -1;
    uint8_t *at = scratch;
    for (Py_ssize_t i = 0; i < count; i++) {
        reached = i;
        if (i + PREFETCH_AHEAD < count)
            prefetch_span(&spans[i + PREFETCH_AHEAD]);
        Py_ssize_t length = spans[i].size - FRAMING_BYTES;
        if (!copy_record(&spans[i], at, verify)) {
            bad = i;
            break;
        }
        Found *found = &parse->found[i * parse->nnames];
        if (!read_example(at, length, parse->keys, parse->nnames, parse->count, found, parse->seen)
                || !fill_rows(found, parse->fills, parse->nnames, parse->nrecords, i)) {
            parse->plain = 0;
            break;
        }
        at += length;
    }
    bus_guard = NULL;
    return bad;
}

/* After the spans are known: check, parse and fill every record, then build the columns.
 * ``(columns, bytes)``, the position of a record that fails a check, None, or NULL. */
static PyObject *gathered_columns(const Span *spans, Py_ssize_t count, int verify, Parse *parse)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        total += spans[i].size;
    uint8_t *scratch = PyMem_Malloc((size_t)(total ? total : 1));
    if (scratch == NULL)
        return PyErr_NoMemory();
    PyThreadState *state = release_if(total >= RELEASE_GIL_GATHER);
    Py_ssize_t bad = parse_spans(spans, count, scratch, verify, parse);
    restore(state);
    PyObject *result;
    if (bad >= 0)
        result = PyLong_FromSsize_t(bad);
    else if (!parse->plain)
        result = Py_NewRef(Py_None);
    else {
        PyObject *columns = build_columns(parse->found, count, parse->nnames, parse->fills);
        result = columns == NULL ? NULL
            : columns == Py_None ? columns : Py_BuildValue("(Nn)", columns, total);
    }
    PyMem_Free(scratch);
    return result;
}

static PyObject *wire_gather_columns(PyObject *self, PyObject *args)
{
    PyObject *maps, *offsets, *which, *records, *names, *fills;
    int verify;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!O!OOpO!nO!", &PyTuple_Type, &maps, &PyTuple_Type, &offsets,
                          &which, &records, &verify, &PyTuple_Type, &names, &count,
                          &PyTuple_Type, &fills))
        return NULL;
    Py_ssize_t nnames = PyTuple_GET_SIZE(names);
    if (!WIRE_LITTLE_ENDIAN || nnames == 0)
        Py_RETURN_NONE;
    GatherArgs g;
    if (gather_open(&g, maps, offsets, which, records) != 0)
        return NULL;
    Py_ssize_t nrecords = g.records.len / 8;
    Parse parse = {NULL, nnames, count, NULL, NULL, NULL, nrecords, 1};
    Key *keys = PyMem_Calloc((size_t)nnames + MAX_ENTRIES, sizeof(Key));
    Py_buffer *views = PyMem_Calloc((size_t)nnames, sizeof(Py_buffer));
    Found *found = PyMem_Calloc((size_t)(nrecords ? nrecords * nnames : 1), sizeof(Found));
    Span *spans = PyMem_Calloc((size_t)(nrecords ? nrecords : 1), sizeof(Span));
    PyObject *result = NULL;
    if (keys == NULL || views == NULL || found == NULL || spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (nrecords == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (take_keys(names, keys) != 0 || take_fills(fills, views, nnames, nrecords) != 0)
        goto done;
    parse.keys = keys;
    parse.seen = keys + nnames;
    parse.found = found;
    parse.fills = views;
    Py_ssize_t bad = gather_spans(&g, spans, nrecords);
    if (bad >= 0)
        result = PyLong_FromSsize_t(bad);
    else if (bad == -2)
        result = gathered_columns(spans, nrecords, verify, &parse);
done:
    for (Py_ssize_t j = 0; views != NULL && j < nnames; j++)
        if (views[j].buf != NULL)
            PyBuffer_Release(&views[j]);
    gather_release(&g);
    PyMem_Free(keys);
    PyMem_Free(views);
    PyMem_Free(found);
    PyMem_Free(spans);
    return result;
}

static PyObject *wire_crc32c(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc32c((const uint8_t *)view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* The CRC's tables, and whether the CPU's instruction computes it: once, when a module that
 * holds this file is made. */
static void wire_setup(void)
{
    crc_build_tables();
#if WIRE_HAVE_CRC_INSTRUCTION
    __builtin_cpu_init();
    use_crc_instruction = __builtin_cpu_supports("sse4.2") != 0;
    crc_build_lane_shift();
#endif
}

static PyObject *wire_drop_pages(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || (uintptr_t)view.buf % (uintptr_t)page != 0 || !view.readonly) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "drop_pages needs a read-only map that starts on a "
                        "page (a written private map would lose what was written)");
        return NULL;
    }
    int failed = 0, error = 0;
    if (view.len > 0) {
        Py_BEGIN_ALLOW_THREADS
        failed = madvise(view.buf, (size_t)view.len, MADV_DONTNEED) != 0;
        error = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (failed) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

#ifndef SHARDFEED_EMBEDDED  /* another module compiles this file into itself (see pipeline/_slice.c) */
static PyMethodDef wire_methods[] = {
    {"unframe", wire_unframe, METH_VARARGS,
     "unframe(reads, ranges, starts, ends, verify) -> list[bytes] | int | None"},
    {"example_columns", wire_example_columns, METH_VARARGS,
     "example_columns(payloads, names, count) -> list | None"},
    {"gather", wire_gather, METH_VARARGS,
     "gather(maps, offsets, which, records, verify) -> list[bytes] | int"},
    {"gather_columns", wire_gather_columns, METH_VARARGS,
     "gather_columns(maps, offsets, which, records, verify, names, count, fills)"
     " -> (list, int) | int | None"},
    {"crc32c", wire_crc32c, METH_O, "crc32c(data) -> int"},
    {"drop_pages", wire_drop_pages, METH_O, "drop_pages(map) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT, "_wire",
    "The per-record work of a batch of TFRecord records, in C (see shardfeed.format.native).",
    -1, wire_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__wire(void)
{
    wire_setup();
    PyObject *module = PyModule_Create(&wire_module);
    if (module != NULL && PyModule_AddIntConstant(module, "crc_instruction", use_crc_instruction)) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
#endif
