/* Keyed draws for whole batch slices, the same numbers a NumPy Generator gives.
 *
 * A row's generator is NumPy's Philox-4x64 (10 rounds) keyed (seed, purpose) with its
 * counter starting at (0, 0, position, epoch), exactly as shardfeed.sampling.keys.sample_rng
 * builds it. This file reproduces that stream (the 4-word buffer, the 32-bit half kept for
 * the next 32-bit draw) and the two draws the random-resized crop makes from it,
 * Generator.random() and Generator.integers(n), so a slice's crop boxes and flips come from
 * one call instead of a generator a row. The stream state after a row's draws is handed
 * back, so a later transform can go on drawing from the same generator.
 *
 * It also deals a patch schedule's slots (slot_orders): the keyed permutation of each block
 * of outputs that shardfeed.sampling.patches.block_permutations makes through NumPy.
 *
 * Python checks the results against NumPy before using this module (see
 * shardfeed/sampling/crop_draws.py and shardfeed/sampling/patches.py): a build that differs
 * is never used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define M0 0xD2E7470EE14C6C93ULL
#define M1 0xCA5A826395121157ULL
#define W0 0x9E3779B97F4A7C15ULL
#define W1 0xBB67AE8584CAA73BULL

typedef struct {
    uint64_t ctr[4];
    uint64_t key[2];
    uint64_t buffer[4];
    int buffer_pos;
    int has_uint32;
    uint32_t uinteger;
} stream;

static inline void mulhilo(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo)
{
    __uint128_t p = (__uint128_t)a * b;
    *hi = (uint64_t)(p >> 64);
    *lo = (uint64_t)p;
}

static void philox_block(const uint64_t in[4], const uint64_t key_in[2], uint64_t out[4])
{
    uint64_t c0 = in[0], c1 = in[1], c2 = in[2], c3 = in[3];
    uint64_t k0 = key_in[0], k1 = key_in[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += W0;
            k1 += W1;
        }
        uint64_t hi0, lo0, hi1, lo1;
        mulhilo(M0, c0, &hi0, &lo0);
        mulhilo(M1, c2, &hi1, &lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static uint64_t next_u64(stream *s)
{
    if (s->buffer_pos < 4)
        return s->buffer[s->buffer_pos++];
    if (++s->ctr[0] == 0 && ++s->ctr[1] == 0 && ++s->ctr[2] == 0)
        ++s->ctr[3];
    philox_block(s->ctr, s->key, s->buffer);
    s->buffer_pos = 1;
    return s->buffer[0];
}

static uint32_t next_u32(stream *s)
{
    if (s->has_uint32) {
        s->has_uint32 = 0;
        return s->uinteger;
    }
    uint64_t next = next_u64(s);
    s->has_uint32 = 1;
    s->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

static double next_double(stream *s)
{
    return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Generator.integers(n) for 1 <= n <= 2^32 - 1: Lemire's method on 32-bit draws. */
static int64_t below(stream *s, int64_t n)
{
    uint32_t rng = (uint32_t)(n - 1);
    if (rng == 0)
        return 0;
    uint32_t excl = rng + 1;
    uint64_t m = (uint64_t)next_u32(s) * excl;
    uint32_t leftover = (uint32_t)m;
    if (leftover < excl) {
        uint32_t threshold = (UINT32_MAX - rng) % excl;
        while (leftover < threshold) {
            m = (uint64_t)next_u32(s) * excl;
            leftover = (uint32_t)m;
        }
    }
    return (int64_t)(m >> 32);
}

/* Python's round() of a float: half to even. */
static double py_round(double x)
{
    double r = round(x);
    if (fabs(x - r) == 0.5)
        r = 2.0 * round(x / 2.0);
    return r;
}

typedef struct {
    double scale_lo, scale_range, log_lo, log_range, ratio_lo, ratio_hi, hflip;
    long attempts;
} crop_params;

/* boxes[0..4] = y, x, h, w, flip; the same draws as transforms.boxes.random_resized_box (its
 * random() form) followed by the flip of CropDecoderBase._draw_flip. */
static void draw_row(stream *s, int64_t height, int64_t width, const crop_params *p,
                     int64_t *box)
{
    double area = (double)(height * width);
    for (long k = 0; k < p->attempts; k++) {
        double target = area * (p->scale_lo + p->scale_range * next_double(s));
        double aspect = exp(p->log_lo + p->log_range * next_double(s));
        double w = py_round(sqrt(target * aspect));
        double h = py_round(sqrt(target / aspect));
        if (0 < w && w <= (double)width && 0 < h && h <= (double)height) {
            int64_t hi = (int64_t)h, wi = (int64_t)w;
            box[0] = below(s, height - hi + 1);
            box[1] = below(s, width - wi + 1);
            box[2] = hi;
            box[3] = wi;
            goto flip;
        }
    }
    {
        double in_ratio = (double)width / (double)height;
        int64_t h = height, w = width;
        if (in_ratio < p->ratio_lo) {
            double v = py_round((double)width / p->ratio_lo);
            h = v < 1 ? 1 : (int64_t)v;
            if (h > height)
                h = height;
        } else if (in_ratio > p->ratio_hi) {
            double v = py_round((double)height * p->ratio_hi);
            w = v < 1 ? 1 : (int64_t)v;
            if (w > width)
                w = width;
        }
        box[0] = (height - h) / 2;
        box[1] = (width - w) / 2;
        box[2] = h;
        box[3] = w;
    }
flip:
    box[4] = p->hflip > 0.0 && next_double(s) < p->hflip;
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t items, int writable,
                      const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0)
        return -1;
    if (view->len != items * 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must hold %zd 64-bit items", name, items);
        return -1;
    }
    return 0;
}

/* The views of a slice's arrays: positions (n 64-bit items, n from its length), heights and
 * widths (n each, in [1, 2^31)), then ``outs`` writable arrays of widths[k] * n items each.
 * Returns the views held (``*got``; all five held when it returns 1), 0 with an exception
 * set; the caller releases the first ``*got`` views either way. */
static int open_views(PyObject *pos_obj, PyObject *h_obj, PyObject *w_obj, PyObject **outs,
                      const Py_ssize_t *out_widths, const char **out_names, int out_count,
                      Py_buffer *v, int *got, Py_ssize_t *n)
{
    *got = 0;
    if (PyObject_GetBuffer(pos_obj, &v[0], PyBUF_C_CONTIGUOUS) != 0)
        return 0;
    *got = 1;
    *n = v[0].len / 8;
    if (v[0].len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "positions must hold 64-bit items");
        return 0;
    }
    if (get_buffer(h_obj, &v[1], *n, 0, "heights") != 0)
        return 0;
    *got = 2;
    if (get_buffer(w_obj, &v[2], *n, 0, "widths") != 0)
        return 0;
    *got = 3;
    for (int k = 0; k < out_count; k++) {
        if (get_buffer(outs[k], &v[3 + k], out_widths[k] * *n, 1, out_names[k]) != 0)
            return 0;
        *got = 4 + k;
    }
    const int64_t *hv = v[1].buf, *wv = v[2].buf;
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (hv[i] < 1 || wv[i] < 1 || hv[i] >= ((int64_t)1 << 31) || wv[i] >= ((int64_t)1 << 31)) {
            PyErr_SetString(PyExc_ValueError, "heights and widths must be in [1, 2**31)");
            return 0;
        }
    }
    return 1;
}

/* Releases the first ``got`` views; None where ``ok``, else NULL (the exception stands). */
static PyObject *close_views(Py_buffer *v, int got, int ok)
{
    for (int k = 0; k < got; k++)
        PyBuffer_Release(&v[k]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* resized_crops(key0, key1, epoch, positions, heights, widths, params, boxes, states)
 *
 * positions, heights, widths: n int64 each (heights and widths >= 1, < 2^31);
 * params: (scale_lo, scale_range, log_lo, log_range, ratio_lo, ratio_hi, hflip, attempts);
 * boxes: n x 5 int64 out (y, x, h, w, flip); states: n x 11 uint64 out (counter[4],
 * buffer[4], buffer_pos, has_uint32, uinteger) after the row's draws. */
static PyObject *resized_crops(PyObject *self, PyObject *args)
{
    unsigned long long key0, key1, epoch;
    PyObject *pos_obj, *h_obj, *w_obj, *box_obj, *state_obj;
    crop_params p;
    if (!PyArg_ParseTuple(args, "KKKOOO(dddddddl)OO", &key0, &key1, &epoch, &pos_obj, &h_obj,
                          &w_obj, &p.scale_lo, &p.scale_range, &p.log_lo, &p.log_range,
                          &p.ratio_lo, &p.ratio_hi, &p.hflip, &p.attempts, &box_obj,
                          &state_obj))
        return NULL;
    /* views: positions, heights, widths, boxes, states; got: how many are held */
    Py_buffer v[5];
    int got = 0;
    Py_ssize_t n = 0;
    PyObject *outs[2] = {box_obj, state_obj};
    const Py_ssize_t widths[2] = {5, 11};
    const char *names[2] = {"boxes", "states"};
    int ok = open_views(pos_obj, h_obj, w_obj, outs, widths, names, 2, v, &got, &n);
    if (ok) {
        const int64_t *hv = v[1].buf, *wv = v[2].buf;
        const uint64_t *pv = v[0].buf;
        int64_t *bv = v[3].buf;
        uint64_t *sv = v[4].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            stream s = {{0, 0, pv[i], epoch}, {key0, key1}, {0, 0, 0, 0}, 4, 0, 0};
            draw_row(&s, hv[i], wv[i], &p, bv + 5 * i);
            uint64_t *out = sv + 11 * i;
            memcpy(out, s.ctr, sizeof s.ctr);
            memcpy(out + 4, s.buffer, sizeof s.buffer);
            out[8] = (uint64_t)s.buffer_pos;
            out[9] = (uint64_t)s.has_uint32;
            out[10] = s.uinteger;
        }
        Py_END_ALLOW_THREADS
    }
    return close_views(v, got, ok);
}

/* patch_boxes(key0, key1, epoch, positions, heights, widths, params, boxes)
 *
 * positions, heights, widths: n int64 each (heights and widths >= 1, < 2^31);
 * params: (patch_h, patch_w, denominator, scale_lo, scale_range, has_scale);
 * boxes: n x 4 int64 out (y, x, h, w): the crop of a patch in the image as decoded, drawn
 * as shardfeed.pipeline.patch_crops.draw_patch_box draws it (a scale from uniform() where
 * has_scale, the crop's size from it, then integers() for y and x). */
static PyObject *patch_boxes(PyObject *self, PyObject *args)
{
    unsigned long long key0, key1, epoch;
    long long ph, pw, d;
    double scale_lo, scale_range;
    int has_scale;
    PyObject *pos_obj, *h_obj, *w_obj, *box_obj;
    if (!PyArg_ParseTuple(args, "KKKOOO(LLLddp)O", &key0, &key1, &epoch, &pos_obj, &h_obj,
                          &w_obj, &ph, &pw, &d, &scale_lo, &scale_range, &has_scale, &box_obj))
        return NULL;
    if (ph < 1 || pw < 1 || d < 1) {
        PyErr_SetString(PyExc_ValueError, "patch sizes and the denominator must be >= 1");
        return NULL;
    }
    Py_buffer v[4];
    int got = 0;
    Py_ssize_t n = 0;
    PyObject *outs[1] = {box_obj};
    const Py_ssize_t widths[1] = {4};
    const char *names[1] = {"boxes"};
    int ok = open_views(pos_obj, h_obj, w_obj, outs, widths, names, 1, v, &got, &n);
    if (ok) {
        const int64_t *hv = v[1].buf, *wv = v[2].buf;
        const uint64_t *pv = v[0].buf;
        int64_t *bv = v[3].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            stream s = {{0, 0, pv[i], epoch}, {key0, key1}, {0, 0, 0, 0}, 4, 0, 0};
            int64_t ch = ph, cw = pw;
            if (has_scale) {
                double sc = scale_lo + scale_range * next_double(&s);
                double rh = py_round((double)ph * sc / (double)d);
                double rw = py_round((double)pw * sc / (double)d);
                ch = rh < 1 ? 1 : (rh > 2147483647.0 ? 2147483647 : (int64_t)rh);
                cw = rw < 1 ? 1 : (rw > 2147483647.0 ? 2147483647 : (int64_t)rw);
            }
            if (ch > hv[i])
                ch = hv[i];
            if (cw > wv[i])
                cw = wv[i];
            int64_t *box = bv + 4 * i;
            box[0] = below(&s, hv[i] - ch + 1);
            box[1] = below(&s, wv[i] - cw + 1);
            box[2] = ch;
            box[3] = cw;
        }
        Py_END_ALLOW_THREADS
    }
    return close_views(v, got, ok);
}

/* The splitmix64 finaliser of shardfeed.sampling.keys (mix64). */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t draw;  /* the slot's 53-bit uniform, as an integer: the same order as the float */
    int64_t slot;
} slot_draw;

static int by_draw(const void *a, const void *b)
{
    const slot_draw *x = a, *y = b;
    if (x->draw != y->draw)
        return x->draw < y->draw ? -1 : 1;
    return x->slot < y->slot ? -1 : (x->slot > y->slot);  /* ties by slot: a stable sort */
}

/* slot_orders(key0, key1, n, refresh_every, end, positions, out) -> None or int
 *
 * The order position of each output of ``positions`` (int64, each in [0, end)) under
 * ``pick="stratified"``: ``p // refresh_every`` plus the slot the keyed permutation of its
 * block of ``n`` outputs deals it, the stable argsort of the block's uniforms
 * (keys.uniform_many: two keyed splitmix64 rounds, ``key0`` and ``key1`` its two keys).
 * Outputs in order (never decreasing): each block's permutation is made once a call.
 * ``out``: as many int64. Returns the index of the first position outside [0, end), or -1
 * where a position is below the one before it (nothing written either way: the caller
 * takes NumPy's path, which keeps blocks across calls), else None. */
static PyObject *slot_orders(PyObject *self, PyObject *args)
{
    unsigned long long key0, key1;
    long long n, refresh, end;
    PyObject *pos_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "KKLLLOO", &key0, &key1, &n, &refresh, &end, &pos_obj,
                          &out_obj))
        return NULL;
    if (n < 1 || refresh < 1 || n > ((long long)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "n must be in [1, 2**40], refresh_every >= 1");
        return NULL;
    }
    Py_buffer v[2];
    if (PyObject_GetBuffer(pos_obj, &v[0], PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    Py_ssize_t count = v[0].len / 8;
    if (v[0].len % 8 != 0) {
        PyBuffer_Release(&v[0]);
        PyErr_SetString(PyExc_ValueError, "positions must hold 64-bit items");
        return NULL;
    }
    if (get_buffer(out_obj, &v[1], count, 1, "out") != 0) {
        PyBuffer_Release(&v[0]);
        return NULL;
    }
    const int64_t *pv = v[0].buf;
    int64_t *qv = v[1].buf;
    PyObject *result = NULL;
    Py_ssize_t bad = -1;  /* -1: none; -2: a position below the one before */
    for (Py_ssize_t i = 0; i < count && bad < 0; i++)
        if (pv[i] < 0 || pv[i] >= end)
            bad = i;
    for (Py_ssize_t i = 1; i < count && bad < 0; i++)
        if (pv[i] < pv[i - 1])
            bad = -2;
    slot_draw *block = NULL;
    int64_t *perm = NULL;
    if (bad != -1)
        result = PyLong_FromSsize_t(bad == -2 ? -1 : bad);
    else if (count > 0) {
        block = PyMem_RawMalloc((size_t)n * sizeof(slot_draw));
        perm = PyMem_RawMalloc((size_t)n * sizeof(int64_t));
        if (block == NULL || perm == NULL)
            PyErr_NoMemory();
    }
    if (bad == -1 && (count == 0 || (block != NULL && perm != NULL))) {
        Py_BEGIN_ALLOW_THREADS
        int64_t made = -1;  /* the block whose permutation ``perm`` holds */
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t b = pv[i] / n;
            if (b != made) {
                for (int64_t j = 0; j < n; j++) {
                    uint64_t h = mix64(((uint64_t)b * (uint64_t)n + (uint64_t)j) * W0 + key0);
                    block[j].draw = mix64(h ^ key1) >> 11;
                    block[j].slot = j;
                }
                qsort(block, (size_t)n, sizeof(slot_draw), by_draw);
                for (int64_t j = 0; j < n; j++)
                    perm[j] = block[j].slot;
                made = b;
            }
            qv[i] = pv[i] / refresh + perm[pv[i] - b * n];
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyMem_RawFree(block);
    PyMem_RawFree(perm);
    PyBuffer_Release(&v[0]);
    PyBuffer_Release(&v[1]);
    return result;
}

static PyMethodDef draws_methods[] = {
    {"patch_boxes", patch_boxes, METH_VARARGS,
     "Patch crops of a slice's outputs from their keyed Philox streams."},
    {"slot_orders", slot_orders, METH_VARARGS,
     "Order positions of outputs under the stratified pick: keyed block permutations."},
    {"resized_crops", resized_crops, METH_VARARGS,
     "Random-resized-crop boxes and flips of a slice's rows from their keyed Philox streams."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef draws_module = {
    PyModuleDef_HEAD_INIT, "_draws",
    "Keyed draws for whole batch slices (see shardfeed/sampling/crop_draws.py).", -1,
    draws_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__draws(void)
{
    return PyModule_Create(&draws_module);
}
