/* shardfeed.pipeline._jpeg_record: one record read from its mapped shard and its JPEG decoded
 * at DCT scale 1/d in one call: the copy, its checks, the parse and the decode without the
 * GIL, and no bytes object for the record or its JPEG.
 *
 *   decode(maps, offsets, which, records, verify, names, count, image, d, max_pixels)
 *           -> (bytearray, int, int, int, int, list, int) | None
 *       The one record of ``which``/``records`` (int64 arrays of one item: its map and its
 *       number there, as _wire.gather takes them) copied out of its map into memory of its
 *       own, its framing (and, verify, its data CRC) checked there and its tf.train.Example
 *       parsed there (exactly ``count`` features, or any number >= the names with -1, as
 *       _wire.gather_columns parses). Feature ``names[image]`` must hold one bytes value, a
 *       plain JPEG: three components coded as YCbCr in one of the samplings simplejpeg
 *       names, of at most ``max_pixels`` pixels (and at least 8 a side where d > 1), ending
 *       with its end-of-image marker; it is decoded to RGB at scale 1/d (d 1, 2, 4 or 8;
 *       libjpeg's fast integer IDCT and smooth upsampling, as simplejpeg's
 *       ``decode_jpeg(..., fastdct=True)`` decodes) into a new bytearray of
 *       ceil(height / d) x ceil(width / d) x 3 pixels. Returns (pixels, its height, its width,
 *       the JPEG's height, its width, the other features' columns as
 *       _wire.gather_columns gives them for one record (``names`` without ``image``, in
 *       order), the record's bytes read); None for anything else, whatever the reason (a bad
 *       CRC, another encoding or feature set, another kind of image, a libjpeg error or
 *       warning, a page of a cut-short map): the caller then reads and decodes the record by
 *       the Python path, which gives the same pixels or names the fault. Nothing here
 *       decides an error message.
 *
 * The framing and Example code are format/_wire.c's, compiled into this module (its own
 * module definition left out).
 */

#define SHARDFEED_EMBEDDED 1
#include "../format/_wire.c"

#include "../transforms/decode/_jpeg_errors.h"

#define CHANNELS 3

static void on_message(j_common_ptr cinfo, int level)
{
    if (level < 0) /* a warning (corrupt data): the record is left to the caller, now (not
                    * after a whole decode of what a damaged header claims) */
        longjmp(((Errors *)cinfo->err)->jump, 1);
}

/* Chroma at one sample a block, luma at one of the samplings simplejpeg's header reader
 * names (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1): it refuses the others, which the Python path
 * then names. */
static int plain_sampling(const struct jpeg_decompress_struct *dec)
{
    const jpeg_component_info *c = dec->comp_info;
    if (c[1].h_samp_factor != 1 || c[1].v_samp_factor != 1 || c[2].h_samp_factor != 1
            || c[2].v_samp_factor != 1)
        return 0;
    int h = c[0].h_samp_factor, v = c[0].v_samp_factor;
    return (h == 1 && v == 1) || (h == 2 && v == 1) || (h == 2 && v == 2) || (h == 1 && v == 2)
           || (h == 4 && v == 1);
}

/* The decompressor made, the header read and the decode started at 1/d; 1 where the JPEG is
 * one this call takes. */
static int start(struct jpeg_decompress_struct *dec, Errors *errors, const uint8_t *data,
                 size_t n, int d, Py_ssize_t max_pixels)
{
    if (n < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[n - 2] != 0xFF || data[n - 1] != 0xD9)
        return 0;
    if (setjmp(errors->jump) != 0)
        return 0;
    jpeg_create_decompress(dec);
    jpeg_mem_src(dec, data, (unsigned long)n);
    if (jpeg_read_header(dec, TRUE) != JPEG_HEADER_OK || dec->num_components != CHANNELS
            || dec->jpeg_color_space != JCS_YCbCr || dec->image_height == 0
            || dec->image_width == 0
            || (double)dec->image_height * (double)dec->image_width > (double)max_pixels
            || !plain_sampling(dec)
            /* under 8 pixels, simplejpeg's scale for 1/d is another k/8 of the same size */
            || (d > 1 && (dec->image_height < 8 || dec->image_width < 8)))
        return 0;
    dec->out_color_space = JCS_RGB;
    dec->dct_method = JDCT_IFAST;
    dec->do_fancy_upsampling = TRUE;
    dec->scale_num = 1;
    dec->scale_denom = (unsigned int)d;
    jpeg_start_decompress(dec);
    return dec->output_components == CHANNELS
           && dec->output_height == (dec->image_height + (unsigned)d - 1) / (unsigned)d
           && dec->output_width == (dec->image_width + (unsigned)d - 1) / (unsigned)d;
}

/* Every scanline into ``pixels`` (``rows``: a pointer a row, to fill) and the stream read to
 * its end; 1 without an error or a warning (a warning jumps out: see on_message). All the
 * rows are offered to each read, as simplejpeg's decoder offers them. */
static int finish(struct jpeg_decompress_struct *dec, Errors *errors, uint8_t *pixels,
                  JSAMPROW *rows)
{
    if (setjmp(errors->jump) != 0)
        return 0;
    size_t stride = (size_t)dec->output_width * CHANNELS;
    for (JDIMENSION i = 0; i < dec->output_height; i++)
        rows[i] = pixels + (size_t)i * stride;
    while (dec->output_scanline < dec->output_height) {
        JDIMENSION at = dec->output_scanline;
        if (jpeg_read_scanlines(dec, rows + at, dec->output_height - at) == 0)
            return 0;
    }
    jpeg_finish_decompress(dec);
    return 1;
}

/* Huge pages for a large image's memory where the system gives them on request, as NumPy
 * asks for its arrays of 4 MiB or more: a 1566² image is 1,800 page faults in small pages
 * (on 2 cores, such a JPEG read and decoded at full scale took 14.0 ms of CPU without, 11.9
 * with; simplejpeg's decode alone, into NumPy's memory, 11.3). */
static void advise_huge_pages(uint8_t *p, size_t size)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)1 << 21;
    if (size < ((size_t)4 << 20))
        return;
    uintptr_t first = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)p + size) & ~(huge - 1);
    if (end > first)
        madvise((void *)first, end - first, MADV_HUGEPAGE);
#endif
}

static PyObject *record_decode(PyObject *self, PyObject *args)
{
    PyObject *maps, *offsets, *which, *records, *names;
    int verify, d;
    Py_ssize_t count, image, max_pixels;
    if (!PyArg_ParseTuple(args, "O!O!OOpO!nnin", &PyTuple_Type, &maps, &PyTuple_Type, &offsets,
                          &which, &records, &verify, &PyTuple_Type, &names, &count, &image, &d,
                          &max_pixels))
        return NULL;
    Py_ssize_t nnames = PyTuple_GET_SIZE(names);
    if (!WIRE_LITTLE_ENDIAN || nnames == 0 || image < 0 || image >= nnames
            || (d != 1 && d != 2 && d != 4 && d != 8))
        Py_RETURN_NONE;
    GatherArgs g;
    if (gather_open(&g, maps, offsets, which, records) != 0)
        return NULL;
    Key *keys = PyMem_Calloc((size_t)nnames + MAX_ENTRIES, sizeof(Key));
    Found *found = PyMem_Calloc((size_t)nnames * 2, sizeof(Found));
    Py_buffer *fills = PyMem_Calloc((size_t)nnames, sizeof(Py_buffer)); /* none: all NULL */
    Span span;
    PyObject *result = NULL, *pixels = NULL;
    uint8_t *scratch = NULL;
    if (keys == NULL || found == NULL || fills == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Found *others = found + nnames;
    if (g.records.len / 8 != 1) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t where = gather_spans(&g, &span, 1);
    if (where != -2) {
        result = where == -1 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if (take_keys(names, keys) != 0)
        goto done;
    Parse parse = {keys, nnames, count, found, keys + nnames, fills, 1, 1};

    /* the copy, its checks and the parse; the header read and the decode started */
    struct jpeg_decompress_struct dec;
    Errors errors;
    memset(&dec, 0, sizeof(dec));
    dec.err = jpeg_std_error(&errors.pub);
    errors.pub.error_exit = on_error;
    errors.pub.emit_message = on_message;
    errors.pub.output_message = no_output;
    int made = 0, taken = 0;
    Cursor value = {NULL, NULL};
    PyThreadState *state = PyEval_SaveThread();
    scratch = malloc((size_t)span.size);
    if (scratch != NULL && parse_spans(&span, 1, scratch, verify, &parse) == -1 && parse.plain) {
        const Found *f = &found[image];
        Cursor list = {f->list, f->list_end};
        if (f->kind == KIND_BYTES && f->values == 1 && read_field(&list, TAG_1, &value)) {
            made = 1;
            taken = start(&dec, &errors, value.p, (size_t)(value.end - value.p), d, max_pixels);
        }
    }
    PyEval_RestoreThread(state);
    size_t size = 0;
    if (taken && (__builtin_mul_overflow((size_t)dec.output_height, (size_t)dec.output_width,
                                         &size)
                  || __builtin_mul_overflow(size, (size_t)CHANNELS, &size)
                  || size > (size_t)PY_SSIZE_T_MAX))
        taken = 0;
    if (taken) {
        pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (pixels == NULL) {
            taken = 0;
            PyErr_Clear(); /* no memory for the pixels: the Python path says so */
        } else {
            state = PyEval_SaveThread();
            advise_huge_pages((uint8_t *)PyByteArray_AS_STRING(pixels), size);
            JSAMPROW *rows = malloc((size_t)dec.output_height * sizeof(JSAMPROW));
            taken = rows != NULL
                    && finish(&dec, &errors, (uint8_t *)PyByteArray_AS_STRING(pixels), rows);
            free(rows);
            PyEval_RestoreThread(state);
        }
    }
    int height = 0, width = 0, full_height = 0, full_width = 0;
    if (made) {
        height = (int)dec.output_height, width = (int)dec.output_width;
        full_height = (int)dec.image_height, full_width = (int)dec.image_width;
        jpeg_destroy_decompress(&dec);
    }
    if (!taken) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t j = 0, k = 0; j < nnames; j++)
        if (j != image)
            others[k++] = found[j];
    PyObject *columns = build_columns(others, 1, nnames - 1, NULL);
    if (columns == NULL || columns == Py_None) {
        result = columns;
        goto done;
    }
    result = Py_BuildValue("(OiiiiNn)", pixels, height, width, full_height, full_width, columns,
                           span.size);
done:
    Py_XDECREF(pixels);
    free(scratch);
    PyMem_Free(keys);
    PyMem_Free(found);
    PyMem_Free(fills);
    gather_release(&g);
    return result;
}

static PyMethodDef record_methods[] = {
    {"decode", record_decode, METH_VARARGS,
     "decode(maps, offsets, which, records, verify, names, count, image, d, max_pixels)"
     " -> (bytearray, int, int, int, int, list, int) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef record_module = {
    PyModuleDef_HEAD_INIT, "_jpeg_record",
    "A record read from its mapped shard and its JPEG decoded at 1/d in one call (see "
    "shardfeed.pipeline.native_patches).",
    -1, record_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_record(void)
{
    wire_setup();
    return PyModule_Create(&record_module);
}
