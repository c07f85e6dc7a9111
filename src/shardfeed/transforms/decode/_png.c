/* shardfeed.transforms.decode._png: many small PNGs decoded into their batch rows in one
 * call, without the GIL.
 *
 *   decode_rows(values, out, max_pixels) -> bytes
 *       values: a list of bytes, one PNG a row; out: a writable C-contiguous uint8 array of
 *       shape (rows, height, width, channels), channels 1 (grey) or 3 (RGB). Returns one
 *       byte a row: 1 where the row's PNG was decoded into its row of out, 0 where it was
 *       left alone for the Python path (OpenCV), which decodes it or names its fault.
 *
 * Only the plainest PNGs are taken: 8-bit grey (colour type 0) into one channel or 8-bit
 * RGB (colour type 2) into three, not interlaced, exactly the row's height and width, every
 * chunk's CRC sound, no chunk but IHDR, IDAT, IEND and text or metadata chunks that do not
 * bear on pixels, one zlib stream that fills the image exactly. For those, the pixels are
 * fixed by the PNG specification (the filtered scanlines' samples), which is what OpenCV
 * returns; anything else is the Python path's.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static const uint8_t SIGNATURE[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

static uint32_t load_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int chunk_is(const uint8_t *type, const char *name)
{
    return memcmp(type, name, 4) == 0;
}

/* Ancillary chunks that carry no pixel meaning for an 8-bit grey or RGB image read as it is
 * stored: physical size, text, time. (gAMA, sRGB, iCCP, tRNS, sBIT... are not taken.) */
static int harmless_chunk(const uint8_t *type)
{
    return chunk_is(type, "pHYs") || chunk_is(type, "tEXt") || chunk_is(type, "zTXt")
           || chunk_is(type, "iTXt") || chunk_is(type, "tIME");
}

typedef struct {
    z_stream zs;
    int ready;
    uint8_t *scanlines;  /* the inflated, filtered scanlines: height * (1 + stride) */
    size_t capacity;
} Inflater;

/* Inflate the IDAT chunks of data[0:size) (chunks start at ``at``) into scanlines; 1 when
 * they hold exactly ``expected`` bytes in one complete zlib stream and end with IEND. */
static int inflate_idat(Inflater *inf, const uint8_t *data, size_t size, size_t at,
                        size_t expected)
{
    if (inf->ready) {
        if (inflateReset(&inf->zs) != Z_OK)
            return 0;
    } else {
        memset(&inf->zs, 0, sizeof(inf->zs));
        if (inflateInit(&inf->zs) != Z_OK)
            return 0;
        inf->ready = 1;
    }
    inf->zs.next_out = inf->scanlines;
    inf->zs.avail_out = (uInt)expected;
    int ended = 0, seen_idat = 0, after_idat = 0;
    while (at + 12 <= size) {
        uint32_t length = load_be32(data + at);
        const uint8_t *type = data + at + 4;
        if (length > size - at - 12)
            return 0;
        const uint8_t *body = type + 4;
        if ((uint32_t)crc32(crc32(0L, Z_NULL, 0), type, length + 4) != load_be32(body + length))
            return 0;
        at += 12 + (size_t)length;
        if (chunk_is(type, "IEND"))
            return ended && length == 0 && at == size;
        if (chunk_is(type, "IDAT")) {
            if (after_idat || ended)
                return 0;  /* IDAT chunks must follow each other; data after the stream */
            seen_idat = 1;
            inf->zs.next_in = (Bytef *)body;
            inf->zs.avail_in = length;
            int rc = inflate(&inf->zs, Z_NO_FLUSH);
            if (rc == Z_STREAM_END)
                ended = 1;
            else if (rc != Z_OK && !(rc == Z_BUF_ERROR && inf->zs.avail_in == 0))
                return 0;
            if (inf->zs.avail_in != 0)
                return 0;  /* bytes beyond the stream's end */
            if (ended && inf->zs.avail_out != 0)
                return 0;  /* the stream ended short of the image */
        } else if (harmless_chunk(type)) {
            if (seen_idat)
                after_idat = 1;
        } else {
            return 0;
        }
    }
    return 0;  /* no IEND */
}

static uint8_t paeth(int a, int b, int c)
{
    int p = a + b - c;
    int pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    if (pa <= pb && pa <= pc)
        return (uint8_t)a;
    return (uint8_t)(pb <= pc ? b : c);
}

/* Undo the filter of each scanline into the rows of ``image``; 0 for an unknown filter.
 * The first row has a zero row above it; a pixel's left neighbour before the row is zero. */
static int unfilter(const uint8_t *scanlines, uint8_t *image, size_t height, size_t stride,
                    size_t bpp)
{
    static const uint8_t zeros[4096];
    uint8_t *zero_row = NULL;
    const uint8_t *prior = zeros;
    if (stride > sizeof(zeros)) {
        zero_row = calloc(stride, 1);
        if (zero_row == NULL)
            return 0;
        prior = zero_row;
    }
    int ok = 1;
    for (size_t y = 0; ok && y < height; y++) {
        const uint8_t *line = scanlines + y * (stride + 1);
        const uint8_t *raw = line + 1;
        uint8_t *row = image + y * stride;
        size_t x;
        switch (line[0]) {
        case 0:
            memcpy(row, raw, stride);
            break;
        case 1:
            memcpy(row, raw, bpp);
            for (x = bpp; x < stride; x++)
                row[x] = (uint8_t)(raw[x] + row[x - bpp]);
            break;
        case 2:
            for (x = 0; x < stride; x++)
                row[x] = (uint8_t)(raw[x] + prior[x]);
            break;
        case 3:
            for (x = 0; x < bpp; x++)
                row[x] = (uint8_t)(raw[x] + (prior[x] >> 1));
            for (; x < stride; x++)
                row[x] = (uint8_t)(raw[x] + ((row[x - bpp] + prior[x]) >> 1));
            break;
        case 4:
            for (x = 0; x < bpp; x++)
                row[x] = (uint8_t)(raw[x] + prior[x]);  /* Paeth of (0, up, 0) is up */
            for (; x < stride; x++)
                row[x] = (uint8_t)(raw[x] + paeth(row[x - bpp], prior[x], prior[x - bpp]));
            break;
        default:
            ok = 0;
        }
        prior = row;
    }
    free(zero_row);
    return ok;
}

/* One PNG into ``image`` (height x width x channels); 1 when decoded, 0 when left alone.
 * ``image`` may hold partial rows after a 0: the caller's Python path writes it again. */
static int decode_one(Inflater *inf, const uint8_t *data, size_t size, uint8_t *image,
                      size_t height, size_t width, size_t channels)
{
    if (size < 8 + 25 || memcmp(data, SIGNATURE, 8) != 0)
        return 0;
    const uint8_t *ihdr = data + 8;
    if (load_be32(ihdr) != 13 || !chunk_is(ihdr + 4, "IHDR")
            || (uint32_t)crc32(crc32(0L, Z_NULL, 0), ihdr + 4, 17) != load_be32(ihdr + 21))
        return 0;
    const uint8_t *h = ihdr + 8;
    uint8_t colour_type = channels == 1 ? 0 : 2;
    if (load_be32(h) != width || load_be32(h + 4) != height || h[8] != 8
            || h[9] != colour_type || h[10] != 0 || h[11] != 0 || h[12] != 0)
        return 0;
    size_t stride = width * channels;
    if (!inflate_idat(inf, data, size, 8 + 25, height * (stride + 1)))
        return 0;
    return unfilter(inf->scanlines, image, height, stride, channels);
}

#ifndef SHARDFEED_EMBEDDED  /* another module compiles this file into itself (see pipeline/_slice.c) */
static PyObject *png_decode_rows(PyObject *self, PyObject *args)
{
    PyObject *values;
    PyObject *out_obj;
    Py_ssize_t max_pixels;
    if (!PyArg_ParseTuple(args, "O!On", &PyList_Type, &values, &out_obj, &max_pixels))
        return NULL;
    Py_buffer out;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return NULL;
    PyObject *held = NULL, *done = NULL;
    Inflater inf = {0};
    if (out.ndim != 4 || out.format == NULL || strcmp(out.format, "B") != 0
            || (out.shape[3] != 1 && out.shape[3] != 3)
            || PyList_GET_SIZE(values) != out.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "out must be uint8 (rows, height, width, 1 or 3), "
                                          "one row a value");
        goto fail;
    }
    Py_ssize_t rows = out.shape[0];
    size_t height = (size_t)out.shape[1], width = (size_t)out.shape[2];
    size_t channels = (size_t)out.shape[3];
    size_t row_bytes = height * width * channels;
    done = PyBytes_FromStringAndSize(NULL, rows);
    held = PyList_AsTuple(values);  /* keeps every value alive while the GIL is released */
    if (done == NULL || held == NULL)
        goto fail;
    uint8_t *flags = (uint8_t *)PyBytes_AS_STRING(done);
    memset(flags, 0, (size_t)rows);
    if (rows == 0 || height == 0 || width == 0 || (Py_ssize_t)(height * width) > max_pixels)
        goto finish;  /* nothing to do, or every row is the Python path's (it names the size) */
    inf.capacity = height * (width * channels + 1);
    inf.scanlines = PyMem_RawMalloc(inf.capacity);
    if (inf.scanlines == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < rows; i++) {
        PyObject *value = PyTuple_GET_ITEM(held, i);
        if (!PyBytes_Check(value))
            continue;
        flags[i] = (uint8_t)decode_one(&inf, (const uint8_t *)PyBytes_AS_STRING(value),
                                       (size_t)PyBytes_GET_SIZE(value),
                                       (uint8_t *)out.buf + (size_t)i * row_bytes,
                                       height, width, channels);
    }
    Py_END_ALLOW_THREADS
finish:
    if (inf.ready)
        inflateEnd(&inf.zs);
    PyMem_RawFree(inf.scanlines);
    Py_XDECREF(held);
    PyBuffer_Release(&out);
    return done;
fail:
    if (inf.ready)
        inflateEnd(&inf.zs);
    PyMem_RawFree(inf.scanlines);
    Py_XDECREF(held);
    Py_XDECREF(done);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef png_methods[] = {
    {"decode_rows", png_decode_rows, METH_VARARGS,
     "decode_rows(values, out, max_pixels) -> bytes (1 a row decoded, 0 a row left)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef png_module = {
    PyModuleDef_HEAD_INIT, "_png",
    "Many small PNGs decoded into their batch rows (see shardfeed.transforms.decode.png_rows).",
    -1, png_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__png(void)
{
    return PyModule_Create(&png_module);
}
#endif
