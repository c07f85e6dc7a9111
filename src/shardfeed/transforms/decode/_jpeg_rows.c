/* shardfeed.transforms.decode._jpeg_rows: a slice's JPEG crops decoded, resized and flipped
 * into their batch rows in one call that holds no GIL.
 *
 *   crop_rows(values, table, out, out_h, out_w, fast_dct, fast_upsample) -> bytes
 *       values: a list of bytes, one JPEG a batch row; table: int64 rows of (row, height,
 *       width, y, x, h, w, flip, whole, d); out: the batch's images, a writable C-contiguous uint8
 *       buffer of len(values) x out_h x out_w x 3. For each table row, the box (y, x, h, w)
 *       of the row's image (``height`` x ``width``, as its frame header says) is decoded to
 *       RGB (libjpeg: ``fast_dct`` its fast integer IDCT, ``fast_upsample`` chroma by
 *       replication), resized to out_h x out_w as OpenCV's ``cv2.resize(...,
 *       interpolation=cv2.INTER_LINEAR)`` resizes 8-bit images (the same fixed-point
 *       arithmetic: the same bytes) and, where ``flip``, mirrored left to right, into batch
 *       row ``row``. Where ``d`` is 2, 4 or 8 the image is decoded at DCT scale 1/d instead
 *       and the box sampled from it by the scaled warp (``warp`` below). Returns one byte a
 *       table row: 1 where it was written, 0 where it was left for the caller: any libjpeg
 *       error or warning, a frame of another size than the table's, a JPEG without its
 *       end-of-image marker, a box outside the image or shrunk 2x or more both ways after
 *       the scale (which OpenCV resizes by area), a ``d`` of another value (0: not taken),
 *       a value that is not bytes.
 *
 *   warp(src, out, out_h, out_w, y, x, h, w, d, flip) -> None
 *       The scaled warp: box (y, x, h, w) of a full-size image, sampled from ``src`` (that
 *       image decoded at scale 1/d: (H', W', C) uint8, pixels contiguous, rows any stride)
 *       into a contiguous out_h x out_w x C ``out``, mirrored where ``flip``. Output pixel
 *       (i, j) is the bilinear sample of ``src`` at the box's pixel centre, in scaled pixels
 *       ``X = (x + (j + 0.5) w / out_w) / d - 0.5`` (and Y alike), rounded to 1/2048 of a
 *       pixel (ties up) in exact integer arithmetic; neighbours outside ``src`` are its edge
 *       pixels; the weighted sum, in units of 2^-22, rounded half up. Exactly the arithmetic of
 *       ``warp.scaled_warp``'s NumPy form (shardfeed/transforms/decode/warp.py).
 *
 *   cut_rows(images, boxes, out, scaled) -> bytes
 *       Patches cut from decoded images into their batch rows: row i of ``out`` (a writable
 *       C-contiguous n x out_h x out_w x c buffer) from box i of ``boxes`` (n x 4 int64:
 *       y, x, h, w) of ``images[i]`` ((H, W, c) pixels of out's item type, each pixel
 *       contiguous, rows any stride). Not ``scaled``: the box copied to the row's top left,
 *       the rest of the row zeros (a box at most out_h x out_w). ``scaled``: the box resized
 *       to out_h x out_w as ``resize`` does (uint8, c = 3), where OpenCV would resize it
 *       linearly (shrunk under 2x one way at least). Returns one byte a row, 1 written, 0
 *       left to the caller: an image of another type, layout or channel count, an item type
 *       that is not one plain number (objects), an image whose bytes overlap ``out``, a box
 *       outside its image or larger than the row, a resize OpenCV makes by area.
 *       One call a slice, the GIL released for all its rows; an image of several rows (the
 *       same object) has its buffer taken once.
 *
 *   resize(src, out, out_h, out_w, flip) -> None
 *       The resize alone, from a (h, w, 3) uint8 buffer (pixels contiguous, rows any stride)
 *       into a contiguous out_h x out_w x 3 one: for the tests.
 *
 * The pixels of a box are those of the whole image decoded and sliced: with ``fast_upsample``
 * only the box's iMCU columns are decoded (jpeg_crop_scanline) and the rows above it skipped
 * (jpeg_skip_scanlines), which give the whole decode's pixels when chroma is replicated;
 * with libjpeg's smooth upsampling (whose filter reads neighbouring chroma) every column is
 * decoded and the rows above the box read and dropped. Rows below the box: where ``whole``,
 * decoded (the box's columns) and the stream read to its end marker
 * (jpeg_finish_decompress), so that damage anywhere in it leaves the row to the caller as a
 * whole decode would fail; else not read at all, as a region decode reads them (the row
 * must still end with its end-of-image marker).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "_jpeg_errors.h"

/* jpeg_crop_scanline and jpeg_skip_scanlines are libjpeg-turbo's; before 2.1 they gave other
 * pixels in some cases (4:4:0 smooth upsampling). Anything older is not built: the Python
 * path decodes instead (native_rows.py also checks the pixels against it once). */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
#error "libjpeg-turbo 2.1 or newer is needed"
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define COEF_SCALE 2048 /* OpenCV's INTER_RESIZE_COEF_SCALE: 11 fractional bits */
#define CHANNELS 3
#define COLUMNS 10 /* int64s a table row */

/* ---- the resize: cv2.resize(src, (out_w, out_h), interpolation=INTER_LINEAR), uint8 ---- */

typedef struct {
    int *xofs;     /* a destination column's first source column (times CHANNELS) */
    int16_t *alpha; /* its two weights */
    int xmin, xmax; /* columns outside [xmin, xmax) take one source pixel, weight COEF_SCALE */
    int flip;
    int32_t *rows[2]; /* two horizontally resized source rows */
    int have[2];      /* which source row each holds, -1 none */
} Resizer;

static int16_t coef(float c)
{
    long v = lrintf(c * (float)COEF_SCALE); /* cvRound: to nearest, ties to even */
    return (int16_t)(v < INT16_MIN ? INT16_MIN : v > INT16_MAX ? INT16_MAX : v);
}

/* The horizontal plan for ``sw`` source columns to ``dw``: OpenCV's, source columns before
 * the first or past the last clamped to the edge with weights (1, 0). ``flip``: the plan of
 * the mirrored output (its column dx is column dw - 1 - dx of the plain one); the columns
 * that take one source pixel are then those before ``xmin``, else those from ``xmax`` on. */
static void plan_columns(Resizer *r, int sw, int dw, int flip)
{
    double scale = 1.0 / ((double)dw / sw);
    int xmax = dw;
    for (int dx = 0; dx < dw; dx++) {
        float fx = (float)((dx + 0.5) * scale - 0.5);
        int sx = (int)floorf(fx);
        fx -= (float)sx;
        if (sx < 0) {
            fx = 0.f;
            sx = 0;
        }
        if (sx + 1 >= sw) {
            if (dx < xmax)
                xmax = dx;
            if (sx >= sw - 1) {
                fx = 0.f;
                sx = sw - 1;
            }
        }
        int at = flip ? dw - 1 - dx : dx;
        r->xofs[at] = sx * CHANNELS;
        r->alpha[2 * at] = coef(1.f - fx);
        r->alpha[2 * at + 1] = coef(fx);
    }
    r->flip = flip;
    r->xmin = flip ? dw - xmax : 0;
    r->xmax = flip ? dw : xmax;
}

/* One source row resized horizontally (OpenCV's 8-bit step: ``p[c] * a0 + p[c + 3] * a1``
 * into int32). ``readable``: bytes that may be read from ``s`` on (the vector step reads 8 at
 * a pixel); ``d`` has room for one int32 past the row (the vector step writes 4 at a time). */
static void resize_row(const Resizer *r, const uint8_t *restrict s, size_t readable, int dw,
                       int32_t *restrict d)
{
    const int *xofs = r->xofs;
    const int16_t *alpha = r->alpha;
    for (int dx = 0; dx < r->xmin; dx++) {
        const uint8_t *p = s + xofs[dx];
        d[3 * dx] = p[0] * COEF_SCALE;
        d[3 * dx + 1] = p[1] * COEF_SCALE;
        d[3 * dx + 2] = p[2] * COEF_SCALE;
    }
    for (int dx = r->xmin; dx < r->xmax; dx++) {
        const uint8_t *p = s + xofs[dx];
        int a0 = alpha[2 * dx], a1 = alpha[2 * dx + 1];
#ifdef __SSE2__
        if ((size_t)xofs[dx] + 8 <= readable) {
            /* [p0..p7] as 16 bits, paired (p0, p3), (p1, p4), (p2, p5), (p3, p6) */
            __m128i v = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)p),
                                          _mm_setzero_si128());
            __m128i pairs = _mm_unpacklo_epi16(v, _mm_srli_si128(v, 6));
            __m128i w = _mm_set1_epi32((int32_t)(((uint32_t)(uint16_t)a1 << 16)
                                                 | (uint16_t)a0));
            _mm_storeu_si128((__m128i *)(d + 3 * dx), _mm_madd_epi16(pairs, w));
            continue;
        }
#endif
        d[3 * dx] = p[0] * a0 + p[3] * a1;
        d[3 * dx + 1] = p[1] * a0 + p[4] * a1;
        d[3 * dx + 2] = p[2] * a0 + p[5] * a1;
    }
    for (int dx = r->xmax; dx < dw; dx++) {
        const uint8_t *p = s + xofs[dx];
        d[3 * dx] = p[0] * COEF_SCALE;
        d[3 * dx + 1] = p[1] * COEF_SCALE;
        d[3 * dx + 2] = p[2] * COEF_SCALE;
    }
}

/* Source row ``sy`` resized horizontally, in one of the two row buffers (the other kept). */
static const int32_t *source_row(Resizer *r, const uint8_t *src, ptrdiff_t stride, int sh,
                                 int sw, int sy, int dw, int keep)
{
    for (int k = 0; k < 2; k++)
        if (r->have[k] == sy)
            return r->rows[k];
    int k = r->have[0] == keep ? 1 : 0;
    /* the rows below this one may be read, and the last row's own pixels */
    size_t readable = (size_t)(sh - 1 - sy) * (size_t)stride + (size_t)sw * CHANNELS;
    resize_row(r, src + (ptrdiff_t)sy * stride, readable, dw, r->rows[k]);
    r->have[k] = sy;
    return r->rows[k];
}

/* One output row from two horizontally resized rows: OpenCV's 8-bit vertical step, each
 * term ``(b * (s >> 4)) >> 16`` (s >> 4 < 2^15: a 16-bit high multiply, as OpenCV's own
 * vector code computes it), their sum rounded off by 2 bits. */
static void vertical(const int32_t *restrict s0, const int32_t *restrict s1, int32_t b0,
                     int32_t b1, uint8_t *restrict out, int n)
{
    int i = 0;
#ifdef __SSE2__
    const __m128i w0 = _mm_set1_epi16((int16_t)b0), w1 = _mm_set1_epi16((int16_t)b1);
    const __m128i two = _mm_set1_epi16(2);
    for (; i + 16 <= n; i += 16) {
        __m128i r[2];
        for (int k = 0; k < 2; k++) {
            const int32_t *a = s0 + i + 8 * k, *b = s1 + i + 8 * k;
            __m128i x0 = _mm_packs_epi32(_mm_srai_epi32(_mm_loadu_si128((const __m128i *)a), 4),
                                         _mm_srai_epi32(_mm_loadu_si128((const __m128i *)(a + 4)), 4));
            __m128i x1 = _mm_packs_epi32(_mm_srai_epi32(_mm_loadu_si128((const __m128i *)b), 4),
                                         _mm_srai_epi32(_mm_loadu_si128((const __m128i *)(b + 4)), 4));
            __m128i sum = _mm_add_epi16(_mm_mulhi_epi16(x0, w0), _mm_mulhi_epi16(x1, w1));
            r[k] = _mm_srai_epi16(_mm_add_epi16(sum, two), 2);
        }
        _mm_storeu_si128((__m128i *)(out + i), _mm_packus_epi16(r[0], r[1]));
    }
#endif
    for (; i < n; i++) {
        int32_t v = (((b0 * (s0[i] >> 4)) >> 16) + ((b1 * (s1[i] >> 4)) >> 16) + 2) >> 2;
        out[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}

/* src: sh x sw x 3 (rows ``stride`` bytes apart) -> dst: dh x dw x 3, contiguous. Vertically,
 * OpenCV keeps the weights of a row above the first or below the last and reads the edge row
 * for it (so an edge output row mixes the edge row with itself, with two roundings). */
static void resize_linear(Resizer *r, const uint8_t *src, ptrdiff_t stride, int sh, int sw,
                          uint8_t *dst, int dh, int dw, int flip)
{
    plan_columns(r, sw, dw, flip);
    r->have[0] = r->have[1] = -1;
    double scale = 1.0 / ((double)dh / sh);
    for (int dy = 0; dy < dh; dy++) {
        float fy = (float)((dy + 0.5) * scale - 0.5);
        int sy = (int)floorf(fy);
        fy -= (float)sy;
        int b0 = coef(1.f - fy), b1 = coef(fy);
        int y0 = sy < 0 ? 0 : sy > sh - 1 ? sh - 1 : sy;
        int y1 = sy + 1 < 0 ? 0 : sy + 1 > sh - 1 ? sh - 1 : sy + 1;
        const int32_t *s0 = source_row(r, src, stride, sh, sw, y0, dw, -2);
        const int32_t *s1 = source_row(r, src, stride, sh, sw, y1, dw, y0);
        vertical(s0, s1, b0, b1, dst + (size_t)dy * dw * CHANNELS, dw * CHANNELS);
    }
}

static int resizer_init(Resizer *r, int dw)
{
    r->xofs = malloc(sizeof(int) * (size_t)dw);
    r->alpha = malloc(sizeof(int16_t) * 2 * (size_t)dw);
    r->rows[0] = malloc(sizeof(int32_t) * (CHANNELS * (size_t)dw + 1));
    r->rows[1] = malloc(sizeof(int32_t) * (CHANNELS * (size_t)dw + 1));
    return r->xofs && r->alpha && r->rows[0] && r->rows[1];
}

static void resizer_free(Resizer *r)
{
    free(r->xofs);
    free(r->alpha);
    free(r->rows[0]);
    free(r->rows[1]);
}

/* ---- the scaled warp (see the header): exact integer arithmetic ---- */

#define WARP_BITS 11
#define WARP_ONE (1 << WARP_BITS)

static int64_t floor_div(int64_t a, int64_t b) /* b > 0 */
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* For each of ``n`` outputs along one axis of box (b0, bl) at scale 1/d: the two source
 * indices (clamped to [0, limit)) and the second one's weight, in 1/2048. */
static void warp_axis(int64_t b0, int64_t bl, int n, int d, int limit, int *ia, int *ib,
                      int32_t *f)
{
    int64_t den = 2 * (int64_t)d * n;
    for (int j = 0; j < n; j++) {
        /* X * 2048 = 2048 (2 b0 n + (2j + 1) bl - d n) / (2 d n), rounded half up */
        int64_t num = (int64_t)WARP_ONE * (2 * b0 * n + (2 * (int64_t)j + 1) * bl - (int64_t)d * n);
        int64_t q = floor_div(2 * num + den, 2 * den);
        int64_t i0 = floor_div(q, WARP_ONE);
        f[j] = (int32_t)(q - i0 * WARP_ONE);
        ia[j] = (int)(i0 < 0 ? 0 : i0 > limit - 1 ? limit - 1 : i0);
        ib[j] = (int)(i0 + 1 < 0 ? 0 : i0 + 1 > limit - 1 ? limit - 1 : i0 + 1);
    }
}

typedef struct {
    int *xa, *xb, *ya, *yb;
    int32_t *fx, *fy;
    int32_t *rows[2];
    int have[2];
    int col0; /* the image column the source rows' first pixel is */
    int cap_w, cap_h, cap_c;
} Warper;

static void warper_free(Warper *w)
{
    free(w->xa); free(w->xb); free(w->ya); free(w->yb); free(w->fx); free(w->fy);
    free(w->rows[0]); free(w->rows[1]);
    memset(w, 0, sizeof(*w));
}

static int warper_fit(Warper *w, int dh, int dw, int c)
{
    if (w->xa != NULL && w->cap_w == dw && w->cap_h == dh && w->cap_c == c)
        return 1;
    warper_free(w);
    w->xa = malloc(sizeof(int) * (size_t)dw);
    w->xb = malloc(sizeof(int) * (size_t)dw);
    w->fx = malloc(sizeof(int32_t) * (size_t)dw);
    w->ya = malloc(sizeof(int) * (size_t)dh);
    w->yb = malloc(sizeof(int) * (size_t)dh);
    w->fy = malloc(sizeof(int32_t) * (size_t)dh);
    w->rows[0] = malloc(sizeof(int32_t) * (size_t)dw * (size_t)c);
    w->rows[1] = malloc(sizeof(int32_t) * (size_t)dw * (size_t)c);
    w->cap_w = dw, w->cap_h = dh, w->cap_c = c;
    if (!(w->xa && w->xb && w->fx && w->ya && w->yb && w->fy && w->rows[0] && w->rows[1])) {
        warper_free(w);
        return 0;
    }
    return 1;
}

/* The plan of a box: source columns and rows of every output (flip folded into columns). */
static void warp_plan(Warper *w, int64_t y, int64_t x, int64_t h, int64_t bw, int d, int sh,
                      int sw, int dh, int dw, int flip)
{
    warp_axis(y, h, dh, d, sh, w->ya, w->yb, w->fy);
    warp_axis(x, bw, dw, d, sw, w->xa, w->xb, w->fx);
    if (flip)
        for (int i = 0, k = dw - 1; i < k; i++, k--) {
            int t = w->xa[i]; w->xa[i] = w->xa[k]; w->xa[k] = t;
            t = w->xb[i]; w->xb[i] = w->xb[k]; w->xb[k] = t;
            int32_t u = w->fx[i]; w->fx[i] = w->fx[k]; w->fx[k] = u;
        }
    w->have[0] = w->have[1] = -1;
}

/* Source row ``sy`` (a pointer to its column ``col0``) weighted horizontally, cached. */
static const int32_t *warp_row(Warper *w, const uint8_t *row, int sy, int dw, int c, int keep)
{
    for (int k = 0; k < 2; k++)
        if (w->have[k] == sy)
            return w->rows[k];
    int k = w->have[0] == keep ? 1 : 0;
    int32_t *d = w->rows[k];
    for (int j = 0; j < dw; j++) {
        const uint8_t *a = row + (size_t)(w->xa[j] - w->col0) * c;
        const uint8_t *b = row + (size_t)(w->xb[j] - w->col0) * c;
        int32_t f = w->fx[j], g = WARP_ONE - f;
        for (int ch = 0; ch < c; ch++)
            d[j * c + ch] = a[ch] * g + b[ch] * f;
    }
    w->have[k] = sy;
    return d;
}

/* ``base``: the pixel of source row ``first``, column ``col0``; rows ``stride`` apart. */
static void warp_apply(Warper *w, const uint8_t *base, ptrdiff_t stride, int first, int col0,
                       int dh, int dw, int c, uint8_t *dst)
{
    int n = dw * c;
    w->col0 = col0;
    for (int i = 0; i < dh; i++) {
        int ya = w->ya[i], yb = w->yb[i];
        const int32_t *r0 = warp_row(w, base + (ptrdiff_t)(ya - first) * stride, ya, dw, c, -2);
        const int32_t *r1 = warp_row(w, base + (ptrdiff_t)(yb - first) * stride, yb, dw, c, ya);
        int32_t f = w->fy[i], g = WARP_ONE - f;
        uint8_t *out = dst + (size_t)i * (size_t)n;
        for (int k = 0; k < n; k++)
            out[k] = (uint8_t)((r0[k] * g + r1[k] * f + (1 << (2 * WARP_BITS - 1)))
                               >> (2 * WARP_BITS));
    }
}

/* ---- the decode ---- */

static void on_message(j_common_ptr cinfo, int level)
{
    if (level < 0) /* a warning (corrupt data): the row is left to the caller */
        cinfo->err->num_warnings++;
}

typedef struct {
    uint8_t *pixels; /* the box's decoded rows */
    size_t size;
    JSAMPROW *rows;
    size_t nrows;
} Scratch;

static int scratch_fit(Scratch *s, size_t bytes, size_t rows)
{
    if (bytes > s->size) {
        uint8_t *p = realloc(s->pixels, bytes);
        if (p == NULL)
            return 0;
        s->pixels = p;
        s->size = bytes;
    }
    if (rows > s->nrows) {
        JSAMPROW *p = realloc(s->rows, rows * sizeof(JSAMPROW));
        if (p == NULL)
            return 0;
        s->rows = p;
        s->nrows = rows;
    }
    return 1;
}

typedef struct {
    int height, width, y, x, h, w, flip, whole, d;
} Box;

/* Decodes ``box`` of one JPEG and resizes it into ``dst``; 1 done, 0 left to the caller. */
static int crop_row(struct jpeg_decompress_struct *d, Errors *errors, const uint8_t *data,
                    size_t n, const Box *box, int fast_dct, int fast_upsample, Scratch *s,
                    Resizer *r, Warper *wp, uint8_t *dst, int dh, int dw)
{
    if (n < 4 || data[n - 2] != 0xFF || data[n - 1] != 0xD9)
        return 0;
    if (setjmp(errors->jump) != 0) {
        jpeg_abort_decompress(d);
        return 0;
    }
    errors->pub.num_warnings = 0;
    jpeg_mem_src(d, data, (unsigned long)n);
    if (jpeg_read_header(d, TRUE) != JPEG_HEADER_OK || (int)d->image_height != box->height
            || (int)d->image_width != box->width) {
        jpeg_abort_decompress(d);
        return 0;
    }
    d->out_color_space = JCS_RGB;
    d->dct_method = fast_dct ? JDCT_IFAST : JDCT_ISLOW;
    d->do_fancy_upsampling = fast_upsample ? FALSE : TRUE;
    d->scale_num = 1;
    d->scale_denom = (unsigned int)box->d;
    jpeg_start_decompress(d);
    int sh = (int)d->output_height, sw = (int)d->output_width; /* ceil(height / d), ... */
    if (d->output_components != CHANNELS || sh != (box->height + box->d - 1) / box->d
            || sw != (box->width + box->d - 1) / box->d) {
        jpeg_abort_decompress(d);
        return 0;
    }
    /* the decoded rows [top, top + rows) and columns [x0, x0 + cols) the output reads */
    int top = box->y, rows = box->h, x0 = box->x, cols = box->w;
    if (box->d > 1) {
        warp_plan(wp, box->y, box->x, box->h, box->w, box->d, sh, sw, dh, dw, box->flip);
        int lo = sh, hi = 0;
        for (int i = 0; i < dh; i++) {
            lo = wp->ya[i] < lo ? wp->ya[i] : lo;
            hi = wp->yb[i] > hi ? wp->yb[i] : hi;
        }
        top = lo, rows = hi - lo + 1;
        lo = sw, hi = 0;
        for (int j = 0; j < dw; j++) {
            lo = wp->xa[j] < lo ? wp->xa[j] : lo;
            hi = wp->xb[j] > hi ? wp->xb[j] : hi;
        }
        x0 = lo, cols = hi - lo + 1;
    }
    JDIMENSION left = (JDIMENSION)x0, across = (JDIMENSION)cols;
    if (fast_upsample) {
        jpeg_crop_scanline(d, &left, &across); /* widened to whole iMCU columns */
        if (top > 0 && jpeg_skip_scanlines(d, (JDIMENSION)top) != (JDIMENSION)top) {
            jpeg_abort_decompress(d);
            return 0;
        }
    } else {
        left = 0;
    }
    size_t stride = (size_t)d->output_width * CHANNELS;
    int above = fast_upsample ? 0 : top; /* rows read and dropped */
    if (!scratch_fit(s, stride * ((size_t)rows + 1), (size_t)rows)) { /* + a spare row */
        jpeg_abort_decompress(d);
        return 0;
    }
    for (int k = 0; k < rows; k++)
        s->rows[k] = s->pixels + (size_t)k * stride;
    while (above > 0) {
        JSAMPROW drop = s->pixels;
        if (jpeg_read_scanlines(d, &drop, 1) != 1) {
            jpeg_abort_decompress(d);
            return 0;
        }
        above--;
    }
    int got = 0;
    while (got < rows) {
        JDIMENSION read = jpeg_read_scanlines(d, s->rows + got, (JDIMENSION)(rows - got));
        if (read == 0) {
            jpeg_abort_decompress(d);
            return 0;
        }
        got += (int)read;
    }
    if (box->whole) {
        /* the rest entropy-decoded and the stream read to its end, as a whole decode reads
         * it: damage anywhere is a warning, and the row the caller's (which names it) */
        /* (read, not skipped: libjpeg-turbo 2.1's skip below a cropped scanline warns of
         * damage that is not there, and a skip to the last row reads nothing) */
        JSAMPROW spare = s->pixels + (size_t)rows * stride;
        while (d->output_scanline < d->output_height) {
            if (jpeg_read_scanlines(d, &spare, 1) != 1) {
                jpeg_abort_decompress(d);
                return 0;
            }
        }
        jpeg_finish_decompress(d);
    } else {
        jpeg_abort_decompress(d);
    }
    if (errors->pub.num_warnings != 0)
        return 0;
    if (box->d > 1) /* the buffer's first pixel: row ``top``, column ``left`` */
        warp_apply(wp, s->pixels, (ptrdiff_t)stride, top, (int)left, dh, dw, CHANNELS, dst);
    else
        resize_linear(r, s->pixels + (size_t)(box->x - (int)left) * CHANNELS,
                      (ptrdiff_t)stride, box->h, box->w, dst, dh, dw, box->flip);
    return 1;
}

/* Whether the table row can be done here at all (the rest is checked while decoding). */
static int takes(const Box *b, int dh, int dw)
{
    if (b->height <= 0 || b->width <= 0 || b->h <= 0 || b->w <= 0 || b->y < 0 || b->x < 0
            || b->y > b->height - b->h || b->x > b->width - b->w
            || (b->d != 1 && b->d != 2 && b->d != 4 && b->d != 8))
        return 0;
    /* OpenCV resizes that by area */
    return !((int64_t)b->h >= 2 * (int64_t)b->d * dh && (int64_t)b->w >= 2 * (int64_t)b->d * dw);
}

static PyObject *jpeg_crop_rows(PyObject *self, PyObject *args)
{
    PyObject *values, *result = NULL;
    Py_buffer table = {0}, out = {0};
    int dh, dw, fast_dct, fast_upsample;
    if (!PyArg_ParseTuple(args, "O!y*w*iipp", &PyList_Type, &values, &table, &out, &dh, &dw,
                          &fast_dct, &fast_upsample))
        return NULL;
    Py_ssize_t nvalues = PyList_GET_SIZE(values);
    Py_ssize_t count = table.len / (Py_ssize_t)(COLUMNS * sizeof(int64_t));
    size_t image = (size_t)(dh > 0 ? dh : 0) * (size_t)(dw > 0 ? dw : 0) * CHANNELS;
    const int64_t *rows = table.buf;
    PyObject **held = NULL;
    const uint8_t **datas = NULL;
    size_t *sizes = NULL;
    Box *boxes = NULL;
    if (table.len % (Py_ssize_t)(COLUMNS * sizeof(int64_t)) != 0 || dh <= 0 || dw <= 0
            || (size_t)out.len != image * (size_t)nvalues || !PyBuffer_IsContiguous(&out, 'C')) {
        PyErr_SetString(PyExc_ValueError, "crop_rows: a table of 10 int64 a row and an out of "
                        "len(values) contiguous out_h x out_w x 3 images expected");
        goto done;
    }
    PyObject *done_flags = PyBytes_FromStringAndSize(NULL, count);
    if (done_flags == NULL)
        goto done;
    uint8_t *flags = (uint8_t *)PyBytes_AS_STRING(done_flags);
    memset(flags, 0, (size_t)count);
    held = PyMem_Calloc((size_t)(count ? count : 1), sizeof(PyObject *));
    datas = PyMem_Calloc((size_t)(count ? count : 1), sizeof(uint8_t *));
    sizes = PyMem_Calloc((size_t)(count ? count : 1), sizeof(size_t));
    boxes = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Box));
    if (held == NULL || datas == NULL || sizes == NULL || boxes == NULL) {
        Py_DECREF(done_flags);
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const int64_t *t = rows + i * COLUMNS;
        if (t[0] < 0 || t[0] >= nvalues)
            continue;
        PyObject *v = PyList_GET_ITEM(values, t[0]);
        if (!PyBytes_Check(v))
            continue;
        Box b = {(int)t[1], (int)t[2], (int)t[3], (int)t[4], (int)t[5], (int)t[6], t[7] != 0,
                 t[8] != 0, (int)t[9]};
        for (int k = 1; k < 7; k++)
            if (t[k] < 0 || t[k] > INT32_MAX)
                b.h = 0; /* refused by takes() */
        if (t[9] < 0 || t[9] > 8)
            b.d = 0;
        if (!takes(&b, dh, dw))
            continue;
        held[i] = Py_NewRef(v); /* the list may change while the GIL is free */
        datas[i] = (const uint8_t *)PyBytes_AS_STRING(v);
        sizes[i] = (size_t)PyBytes_GET_SIZE(v);
        boxes[i] = b;
    }
    Py_BEGIN_ALLOW_THREADS
    struct jpeg_decompress_struct d;
    Errors errors;
    Scratch s = {NULL, 0, NULL, 0};
    Resizer r;
    Warper wp;
    memset(&wp, 0, sizeof(wp));
    int ready = resizer_init(&r, dw) && warper_fit(&wp, dh, dw, CHANNELS);
    d.err = jpeg_std_error(&errors.pub);
    errors.pub.error_exit = on_error;
    errors.pub.emit_message = on_message;
    errors.pub.output_message = no_output;
    if (ready && setjmp(errors.jump) == 0) {
        jpeg_create_decompress(&d);
        for (Py_ssize_t i = 0; i < count; i++)
            if (held[i] != NULL)
                flags[i] = (uint8_t)crop_row(&d, &errors, datas[i], sizes[i], &boxes[i],
                                             fast_dct, fast_upsample, &s, &r, &wp,
                                             (uint8_t *)out.buf + image * (size_t)rows[i * COLUMNS],
                                             dh, dw);
        jpeg_destroy_decompress(&d);
    }
    resizer_free(&r);
    warper_free(&wp);
    free(s.pixels);
    free(s.rows);
    Py_END_ALLOW_THREADS
    result = done_flags;
done:
    for (Py_ssize_t i = 0; held != NULL && i < count; i++)
        Py_XDECREF(held[i]);
    PyMem_Free(held);
    PyMem_Free(datas);
    PyMem_Free(sizes);
    PyMem_Free(boxes);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    return result;
}

/* ``obj``'s buffer into ``src`` (1), or 0 with ``out`` released and the error set. */
static int source_of(PyObject *obj, Py_buffer *src, Py_buffer *out)
{
    if (PyObject_GetBuffer(obj, src, PyBUF_STRIDES) == 0)
        return 1;
    PyBuffer_Release(out);
    return 0;
}

/* Whether ``src`` is (h, w, c) uint8 pixels, each pixel's ``c`` bytes contiguous, rows of
 * at least w pixels apart (any stride). */
static int pixels_ok(const Py_buffer *src, int c)
{
    return src->ndim == 3 && src->shape[2] == c && src->itemsize == 1 && src->strides[2] == 1
           && src->strides[1] == c && src->shape[0] > 0 && src->shape[1] > 0
           && src->strides[0] >= src->shape[1] * c;
}

static PyObject *jpeg_resize(PyObject *self, PyObject *args)
{
    PyObject *src_obj;
    Py_buffer out = {0};
    int dh, dw, flip;
    if (!PyArg_ParseTuple(args, "Ow*iip", &src_obj, &out, &dh, &dw, &flip))
        return NULL;
    Py_buffer src;
    if (!source_of(src_obj, &src, &out))
        return NULL;
    PyObject *result = NULL;
    if (!pixels_ok(&src, CHANNELS)
            || dh <= 0 || dw <= 0 || (size_t)out.len != (size_t)dh * (size_t)dw * CHANNELS) {
        PyErr_SetString(PyExc_ValueError, "resize: (h, w, 3) uint8 rows in, a contiguous "
                        "out_h x out_w x 3 out");
    } else {
        Resizer r;
        if (!resizer_init(&r, dw)) {
            resizer_free(&r);
            PyErr_NoMemory();
        } else {
            resize_linear(&r, src.buf, src.strides[0], (int)src.shape[0], (int)src.shape[1],
                          out.buf, dh, dw, flip);
            resizer_free(&r);
            result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

/* Whether image buffer ``img`` can give row pixels of ``out`` (n x h x w x c): (H, W, c)
 * items of out's size and format, each pixel's c items contiguous, rows apart by a whole
 * row at least. */
/* Whether ``format`` (a buffer's struct format) is one plain number: bytes that may be
 * copied as they are (never an object pointer, whose copy would need a reference). */
static int plain_number(const char *format)
{
    if (format == NULL)
        return 1; /* unsigned bytes */
    if (*format == '<' || *format == '=' || *format == '@' || *format == '>' || *format == '!')
        format++;
    return format[0] != '\0' && format[1] == '\0' && strchr("bBhHiIlLqQefd?", format[0]) != NULL;
}

static int cut_source_ok(const Py_buffer *img, const Py_buffer *out)
{
    Py_ssize_t item = out->itemsize, c = out->shape[3];
    const char *fa = img->format ? img->format : "B", *fb = out->format ? out->format : "B";
    if (img->ndim != 3 || img->itemsize != item || strcmp(fa, fb) != 0 || img->shape[2] != c
            || img->strides[2] != item || img->strides[1] != c * item || img->shape[0] <= 0
            || img->shape[1] <= 0 || img->strides[0] < img->shape[1] * c * item)
        return 0;
    /* the image's bytes apart from the rows written (a view of ``out``: left to NumPy) */
    const char *lo = img->buf, *hi = lo + (img->shape[0] - 1) * img->strides[0]
                                      + img->shape[1] * c * item;
    const char *olo = out->buf, *ohi = olo + out->len;
    return hi <= olo || lo >= ohi;
}

/* Row ``i``'s patch into ``dst``; 1 done, 0 left to the caller (see the header). */
static int cut_one(const Py_buffer *img, const int64_t *box, uint8_t *dst, int oh, int ow,
                   Py_ssize_t c, Py_ssize_t item, int scaled, Resizer *r)
{
    int64_t y = box[0], x = box[1], h = box[2], w = box[3];
    int64_t H = img->shape[0], W = img->shape[1];
    if (y < 0 || x < 0 || h < 1 || w < 1 || y > H - h || x > W - w)
        return 0;
    const uint8_t *src = (const uint8_t *)img->buf + y * img->strides[0] + x * c * item;
    size_t pixel = (size_t)(c * item), row = (size_t)ow * pixel;
    if (!scaled) {
        if (h > oh || w > ow)
            return 0;
        for (int64_t k = 0; k < h; k++) {
            uint8_t *to = dst + (size_t)k * row;
            memcpy(to, src + k * img->strides[0], (size_t)w * pixel);
            memset(to + (size_t)w * pixel, 0, row - (size_t)w * pixel);
        }
        memset(dst + (size_t)h * row, 0, (size_t)(oh - h) * row);
        return 1;
    }
    if (item != 1 || c != CHANNELS || (h >= 2 * (int64_t)oh && w >= 2 * (int64_t)ow)
            || h > INT32_MAX || w > INT32_MAX)
        return 0;  /* OpenCV resizes these by area, or these are not 8-bit RGB */
    resize_linear(r, src, img->strides[0], (int)h, (int)w, dst, oh, ow, 0);
    return 1;
}

static PyObject *jpeg_cut_rows(PyObject *self, PyObject *args)
{
    PyObject *images, *out_obj;
    Py_buffer boxes = {0}, out = {0};
    int scaled;
    if (!PyArg_ParseTuple(args, "O!y*Op", &PyList_Type, &images, &boxes, &out_obj, &scaled))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_RECORDS) != 0) {
        PyBuffer_Release(&boxes);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(images);
    PyObject *result = NULL, *held = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t got = 0, *first = NULL, *which = NULL;
    if (!plain_number(out.format)) { /* objects, records: the caller cuts them */
        result = PyBytes_FromStringAndSize(NULL, n);
        if (result != NULL)
            memset(PyBytes_AS_STRING(result), 0, (size_t)n);
        goto done;
    }
    if (out.ndim != 4 || !PyBuffer_IsContiguous(&out, 'C') || out.shape[0] != n
            || out.shape[1] < 1 || out.shape[2] < 1 || out.shape[3] < 1
            || out.shape[1] > INT32_MAX || out.shape[2] > INT32_MAX
            || boxes.len != n * 4 * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "cut_rows: a C-contiguous n x h x w x c out, n x 4 "
                        "int64 boxes, n images");
        goto done;
    }
    /* the images stay alive while the GIL is released: a tuple holds them */
    held = PyList_AsTuple(images);
    views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    /* rows of one image (a slice's patches share few) share the view of its first row:
     * ``first`` maps an image (by identity) to that row, ``which`` a row to it */
    Py_ssize_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    first = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    which = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    result = PyBytes_FromStringAndSize(NULL, n);
    if (held == NULL || views == NULL || first == NULL || which == NULL || result == NULL) {
        Py_CLEAR(result);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < cap; k++)
        first[k] = -1;
    char *done_rows = PyBytes_AS_STRING(result);
    for (; got < n; got++) {
        PyObject *image = PyTuple_GET_ITEM(held, got);
        size_t at = (size_t)((((uintptr_t)image >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 20)
                    & (size_t)(cap - 1);
        while (first[at] != -1 && PyTuple_GET_ITEM(held, first[at]) != image)
            at = (at + 1) & (size_t)(cap - 1);
        if (first[at] != -1) {
            which[got] = first[at];  /* views[got] stays empty (obj NULL): not released */
            continue;
        }
        first[at] = which[got] = got;
        if (PyObject_GetBuffer(image, &views[got], PyBUF_RECORDS_RO) != 0) {
            PyErr_Clear();  /* not a buffer of pixels: left to the caller */
            views[got].obj = NULL;
            views[got].ndim = -1;
        }
    }
    int oh = (int)out.shape[1], ow = (int)out.shape[2];
    Py_ssize_t c = out.shape[3], item = out.itemsize;
    size_t row_bytes = (size_t)oh * (size_t)ow * (size_t)(c * item);
    const int64_t *table = (const int64_t *)boxes.buf;
    Resizer r = {0};
    int ready = !scaled || resizer_init(&r, ow);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const Py_buffer *view = &views[which[i]];
        done_rows[i] = (char)(ready && view->ndim == 3 && cut_source_ok(view, &out)
                              && cut_one(view, table + 4 * i,
                                         (uint8_t *)out.buf + (size_t)i * row_bytes, oh, ow, c,
                                         item, scaled, &r));
    }
    Py_END_ALLOW_THREADS
    if (scaled)
        resizer_free(&r);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(first);
    PyMem_Free(which);
    Py_XDECREF(held);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *jpeg_warp(PyObject *self, PyObject *args)
{
    PyObject *src_obj;
    Py_buffer out = {0};
    int dh, dw, d, flip;
    long long y, x, h, w;
    if (!PyArg_ParseTuple(args, "Ow*iiLLLLip", &src_obj, &out, &dh, &dw, &y, &x, &h, &w, &d,
                          &flip))
        return NULL;
    Py_buffer src;
    if (!source_of(src_obj, &src, &out))
        return NULL;
    PyObject *result = NULL;
    int c = src.ndim == 3 ? (int)src.shape[2] : 0;
    if (c < 1 || c > 4 || !pixels_ok(&src, c)
            || dh <= 0 || dw <= 0 || d < 1 || d > 8 || h <= 0 || w <= 0
            || llabs(y) > INT32_MAX || llabs(x) > INT32_MAX || h > INT32_MAX || w > INT32_MAX
            || (size_t)out.len != (size_t)dh * (size_t)dw * (size_t)c) {
        PyErr_SetString(PyExc_ValueError, "warp: (h, w, c) uint8 rows in (c 1 to 4), a "
                        "contiguous out_h x out_w x c out, a box of positive size, d in 1..8");
    } else {
        Warper wp;
        memset(&wp, 0, sizeof(wp));
        if (!warper_fit(&wp, dh, dw, c)) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS
            warp_plan(&wp, y, x, h, w, d, (int)src.shape[0], (int)src.shape[1], dh, dw, flip);
            warp_apply(&wp, src.buf, src.strides[0], 0, 0, dh, dw, c, out.buf);
            Py_END_ALLOW_THREADS
            warper_free(&wp);
            result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef jpeg_rows_methods[] = {
    {"crop_rows", jpeg_crop_rows, METH_VARARGS,
     "crop_rows(values, table, out, out_h, out_w, fast_dct, fast_upsample) -> bytes"},
    {"cut_rows", jpeg_cut_rows, METH_VARARGS,
     "cut_rows(images, boxes, out, scaled) -> bytes"},
    {"resize", jpeg_resize, METH_VARARGS, "resize(src, out, out_h, out_w, flip) -> None"},
    {"warp", jpeg_warp, METH_VARARGS,
     "warp(src, out, out_h, out_w, y, x, h, w, d, flip) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef jpeg_rows_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_jpeg_rows",
    .m_doc = "A slice's JPEG crops decoded, resized and flipped into their batch rows "
             "without the GIL.",
    .m_size = -1,
    .m_methods = jpeg_rows_methods,
};

PyMODINIT_FUNC PyInit__jpeg_rows(void)
{
    return PyModule_Create(&jpeg_rows_module);
}
