/* shardfeed.transforms.decode._jpeg_frames: the frame sizes of many JPEGs read in one call.
 *
 *   sizes(values) -> bytes
 *       values: a list of bytes, one encoded image a row. Returns two native int32 a row,
 *       (height, width), read from the row's frame header (SOF marker) where the row is a
 *       plain JPEG; (0, 0) for any other row, which the Python path reads instead
 *       (simplejpeg's header reader), and which decides what the row is.
 *
 * A plain JPEG here: it starts with SOI and a marker; every marker up to the first frame
 * header is well formed (0xFF, fill bytes, a code, a length that stays inside the data),
 * none of them SOS, EOI or a second SOI; the frame is baseline, extended or progressive
 * Huffman (SOF0, SOF1, SOF2), 8-bit, of nonzero height and width, with 1 or 3 components
 * and a header of exactly the length those give. Such a frame's size is the size libjpeg
 * reports; its colour space is grey, YCbCr or RGB, never CMYK or YCCK (four components).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* The frame size of one plain JPEG (see the file's comment) into size[0..1]; 0 if it is not
 * one (size left as it was). */
static int plain_frame_size(const uint8_t *p, size_t n, int32_t *size)
{
    if (n < 4 || p[0] != 0xFF || p[1] != 0xD8 || p[2] != 0xFF)
        return 0;
    size_t at = 2;
    for (;;) {
        if (at >= n || p[at] != 0xFF)
            return 0;
        while (at < n && p[at] == 0xFF)
            at++;
        if (n - at < 3)
            return 0; /* no room for a code and a length */
        uint8_t code = p[at++];
        if (code >= 0xD0 && code <= 0xD7)
            continue; /* a restart marker has no length */
        if (code == 0x00 || code == 0xD8 || code == 0xD9 || code == 0xDA)
            return 0;
        size_t length = ((size_t)p[at] << 8) | p[at + 1];
        if (length < 2 || length > n - at)
            return 0;
        if (code == 0xC0 || code == 0xC1 || code == 0xC2) {
            if (length < 8)
                return 0;
            const uint8_t *frame = p + at + 2;
            int32_t height = ((int32_t)frame[1] << 8) | frame[2];
            int32_t width = ((int32_t)frame[3] << 8) | frame[4];
            int components = frame[5];
            if (frame[0] != 8 || height == 0 || width == 0 || (components != 1 && components != 3)
                || length != (size_t)(8 + 3 * components))
                return 0;
            size[0] = height;
            size[1] = width;
            return 1;
        }
        if (code >= 0xC3 && code <= 0xCF && code != 0xC4 && code != 0xC8 && code != 0xCC)
            return 0; /* another kind of frame: the Python path's */
        at += length;
    }
}

static PyObject *frames_sizes(PyObject *self, PyObject *values)
{
    if (!PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "sizes() takes a list of bytes");
        return NULL;
    }
    Py_ssize_t rows = PyList_GET_SIZE(values);
    PyObject *result = PyBytes_FromStringAndSize(NULL, rows * 2 * (Py_ssize_t)sizeof(int32_t));
    if (result == NULL)
        return NULL;
    int32_t *sizes = (int32_t *)PyBytes_AS_STRING(result);
    memset(sizes, 0, (size_t)rows * 2 * sizeof(int32_t));
    for (Py_ssize_t row = 0; row < rows; row++) {
        PyObject *value = PyList_GET_ITEM(values, row);
        if (PyBytes_Check(value))
            plain_frame_size((const uint8_t *)PyBytes_AS_STRING(value),
                             (size_t)PyBytes_GET_SIZE(value), sizes + 2 * row);
    }
    return result;
}

static PyMethodDef frames_methods[] = {
    {"sizes", frames_sizes, METH_O,
     "sizes(values) -> bytes: (height, width) int32 a row, (0, 0) where not a plain JPEG"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT, "_jpeg_frames",
    "The frame sizes of many JPEGs read in one call (see _jpeg_frames.c).", -1, frames_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_frames(void)
{
    return PyModule_Create(&frames_module);
}
