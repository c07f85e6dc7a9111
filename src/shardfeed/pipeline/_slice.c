/* shardfeed.pipeline._slice: a slice of small records built into its batch rows in one call,
 * the whole loop without the GIL.
 *
 *   slice_rows(maps, offsets, starts, records, verify, names, count, actions, outs, first_row)
 *           -> (int, list) | None
 *       For record i (global record records[i]: record records[i] - starts[k] of map k, the
 *       last k with starts[k] <= records[i], as ShardTable.shard_of finds it; its bytes
 *       between offsets[k][r] and [r + 1], as _wire.gather_columns reads them):
 *       check its framing (and, verify, its data CRC) in the map, parse its tf.train.Example
 *       (exactly ``count`` features, or any number >= the names with -1), and for each name j
 *       do what actions[j] = (action, kind, length, expect) says with row first_row + i of
 *       outs[j] (a writable C-contiguous array whose first dimension is the batch's rows):
 *         NUMERIC  a numeric feature of ``kind`` (1 float, 2 int64) and ``length`` values,
 *                  stored as they are (float32 NaNs quietened, as the column path does); with
 *                  expect >= 0, every value must equal it (a raw image's height, width,
 *                  channels);
 *         BYTES    one bytes value, returned in a list (outs[j] is None);
 *         PNG      one bytes value, the plainest 8-bit PNG of exactly the row's size, decoded
 *                  into the row (see transforms/decode/_png.c);
 *         RAW      one bytes value of exactly the row's size, copied into the row.
 *       Returns (bytes read, [list of values or None] a name); None as soon as one record is
 *       not accepted, whatever the reason (a bad CRC, another encoding, another feature set, a
 *       PNG outside the plain kind, a value of another size, a page of a cut-short map): the
 *       rows written so far are then unspecified, and the caller builds the slice by the
 *       Python path, which gives the same bytes or names the fault. Nothing here decides an
 *       error message.
 *
 * The framing, Example and PNG code are those of format/_wire.c and transforms/decode/_png.c,
 * compiled into this module (their own module definitions left out).
 */

#define SHARDFEED_EMBEDDED 1
#include "../format/_wire.c"
#include "../transforms/decode/_png.c"

#define ACT_NUMERIC 1
#define ACT_BYTES 2
#define ACT_PNG 3
#define ACT_RAW 4
#define MAX_NAMES 64

typedef struct {
    int action, kind;
    Py_ssize_t length;       /* NUMERIC: values a record */
    long long expect;        /* NUMERIC: the value every one must be, or -1 */
    uint8_t *rows;           /* row 0 of the batch's array (NULL for BYTES) */
    Py_ssize_t row_bytes;    /* bytes of one row */
    size_t height, width, channels;  /* PNG */
} Action;

/* The one bytes value of a found feature: 0 unless it is one. */
static int single_value(const Found *f, Cursor *value)
{
    Cursor list = {f->list, f->list_end};
    return f->kind == KIND_BYTES && f->values == 1 && read_field(&list, TAG_1, value);
}

/* Record i's numeric feature into its row; 0 when it has another kind, length or value. */
static int store_numeric(const Found *f, const Action *a, uint8_t *row)
{
    if (f->kind != a->kind || f->values != a->length)
        return 0;
    if (a->kind == KIND_FLOAT) {
        for (Py_ssize_t k = 0; k < a->length; k++) {
            uint32_t bits = (uint32_t)load_le(f->list + 4 * k, 4);
            if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu))
                bits |= 0x00400000u;
            memcpy(row + 4 * k, &bits, 4);
        }
        return a->expect < 0;
    }
    Cursor packed = {f->list, f->list_end};
    for (Py_ssize_t k = 0; k < a->length; k++) {
        uint64_t v = 0;
        read_varint(&packed, &v);  /* checked while counting */
        int64_t s = (int64_t)v;
        if (a->expect >= 0 && s != a->expect)
            return 0;
        memcpy(row + 8 * k, &s, 8);
    }
    return 1;
}

/* Every action of one parsed record; 0 at the first it does not accept. */
static int store_record(const Found *found, const Action *actions, Py_ssize_t nnames,
                        Py_ssize_t row, Inflater *inf)
{
    for (Py_ssize_t j = 0; j < nnames; j++) {
        const Action *a = &actions[j];
        const Found *f = &found[j];
        uint8_t *target = a->rows == NULL ? NULL : a->rows + row * a->row_bytes;
        Cursor value;
        switch (a->action) {
        case ACT_NUMERIC:
            if (!store_numeric(f, a, target))
                return 0;
            break;
        case ACT_BYTES:
            if (!single_value(f, &value))
                return 0;
            break;
        case ACT_PNG:
            if (!single_value(f, &value)
                    || !decode_one(inf, value.p, (size_t)(value.end - value.p), target,
                                   a->height, a->width, a->channels))
                return 0;
            break;
        case ACT_RAW:
            if (!single_value(f, &value) || value.end - value.p != a->row_bytes)
                return 0;
            memcpy(target, value.p, (size_t)a->row_bytes);
            break;
        default:
            return 0;
        }
    }
    return 1;
}

/* Each record's span in its map, from global record numbers; 0 (nothing said) when one is
 * out of range or does not lie within its map. */
static int slice_spans(const GatherArgs *g, const int64_t *starts, Py_ssize_t nstarts,
                       Span *spans, Py_ssize_t count)
{
    const int64_t *records = (const int64_t *)g->records.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t r = records[i];
        if (nstarts < 2 || r < 0 || r >= starts[nstarts - 1])
            return 0;
        Py_ssize_t lo = 0, hi = nstarts;  /* the first start above r */
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (starts[mid] <= r)
                lo = mid + 1;
            else
                hi = mid;
        }
        Py_ssize_t k = lo - 1;
        if (k < 0 || k >= g->nmaps)
            return 0;
        int64_t local = r - starts[k];
        const Py_buffer *offsets = &g->offsets[k];
        if (local + 1 >= offsets->len / 8)
            return 0;
        const uint64_t *at = (const uint64_t *)offsets->buf;
        uint64_t start = at[local], end = at[local + 1];
        if (start > end || end - start < FRAMING_BYTES || end > (uint64_t)g->maps[k].len)
            return 0;
        spans[i].at = (const uint8_t *)g->maps[k].buf + start;
        spans[i].size = (Py_ssize_t)(end - start);
    }
    return 1;
}

typedef struct {
    const Span *spans;
    Py_ssize_t count, first_row;
    int verify;
    Parse parse;
    const Action *actions;
    Inflater *inf;
} SliceJob;

/* The loop over the records, SIGBUS caught; 1 when every record was accepted. Runs without
 * the GIL. */
static int run_slice(SliceJob *job)
{
    volatile int ok = 0;
    sigjmp_buf guard;
    if (sigsetjmp(guard, 1) != 0)
        return 0;  /* a page of a map is gone: the file was cut short */
    bus_guard = &guard;
    const Span *spans = job->spans;
    Parse *parse = &job->parse;
    Py_ssize_t i = 0;
    for (; i < job->count; i++) {
        if (i + PREFETCH_AHEAD < job->count)
            prefetch_span(&spans[i + PREFETCH_AHEAD]);
        const Span *span = &spans[i];
        Found *found = &parse->found[i * parse->nnames];
        if (!record_sound(span->at, span->size, job->verify)
                || !read_example(span->at + HEADER_BYTES, span->size - FRAMING_BYTES,
                                 parse->keys, parse->nnames, parse->count, found, parse->seen)
                || !store_record(found, job->actions, parse->nnames, job->first_row + i,
                                 job->inf))
            break;
    }
    ok = i == job->count;
    bus_guard = NULL;
    return ok;
}

/* The actions and their rows; -1 with an exception set for arguments of the wrong kind. */
static int take_actions(PyObject *actions, PyObject *outs, Py_ssize_t nnames, Py_ssize_t last_row,
                        Action *into, Py_buffer *views)
{
    if (PyTuple_GET_SIZE(actions) != nnames || PyTuple_GET_SIZE(outs) != nnames) {
        PyErr_SetString(PyExc_ValueError, "one action and one out (or None) a name are needed");
        return -1;
    }
    for (Py_ssize_t j = 0; j < nnames; j++) {
        Action *a = &into[j];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(actions, j), "iinL", &a->action, &a->kind,
                              &a->length, &a->expect))
            return -1;
        PyObject *out = PyTuple_GET_ITEM(outs, j);
        if (a->action == ACT_BYTES || out == Py_None) {
            if (a->action != ACT_BYTES) {
                PyErr_SetString(PyExc_ValueError, "only a bytes action has no out");
                return -1;
            }
            continue;
        }
        if (PyObject_GetBuffer(out, &views[j], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_ND) != 0)
            return -1;
        Py_buffer *v = &views[j];
        if (v->ndim < 1 || v->shape[0] <= last_row) {
            PyErr_SetString(PyExc_ValueError, "an out has fewer rows than the slice needs");
            return -1;
        }
        a->rows = (uint8_t *)v->buf;
        a->row_bytes = v->len / v->shape[0];
        if (a->action == ACT_NUMERIC) {
            Py_ssize_t item = a->kind == KIND_FLOAT ? 4 : 8;
            if ((a->kind != KIND_FLOAT && a->kind != KIND_INT64) || a->length < 1
                    || a->row_bytes != a->length * item) {
                PyErr_SetString(PyExc_ValueError, "a numeric out's rows do not hold its values");
                return -1;
            }
        } else if (a->action == ACT_PNG) {
            if (v->ndim != 4 || v->itemsize != 1 || (v->shape[3] != 1 && v->shape[3] != 3)) {
                PyErr_SetString(PyExc_ValueError, "a PNG out is uint8 (rows, h, w, 1 or 3)");
                return -1;
            }
            a->height = (size_t)v->shape[1];
            a->width = (size_t)v->shape[2];
            a->channels = (size_t)v->shape[3];
        } else if (a->action != ACT_RAW) {
            PyErr_SetString(PyExc_ValueError, "an unknown action");
            return -1;
        }
    }
    return 0;
}

/* The BYTES columns, built from the parsed records (with the GIL). A value equal to the
   row before's is that row's object again (bytes are immutable): a column such as
   image/format, the same few bytes in every row, costs no allocation a row here and no free
   a row where the batch is dropped. */
static PyObject *bytes_columns(const Found *found, const Action *actions, Py_ssize_t nrecords,
                               Py_ssize_t nnames)
{
    PyObject *columns = PyList_New(nnames);
    for (Py_ssize_t j = 0; columns != NULL && j < nnames; j++) {
        if (actions[j].action != ACT_BYTES) {
            PyList_SET_ITEM(columns, j, Py_NewRef(Py_None));
            continue;
        }
        PyObject *column = PyList_New(nrecords);
        PyObject *last = NULL;  /* the row before's value (borrowed from the column) */
        for (Py_ssize_t i = 0; column != NULL && i < nrecords; i++) {
            Cursor value = {NULL, NULL};
            single_value(&found[i * nnames + j], &value);  /* checked in the loop */
            Py_ssize_t size = value.end - value.p;
            PyObject *b;
            if (last != NULL && PyBytes_GET_SIZE(last) == size
                    && (size == 0 || memcmp(PyBytes_AS_STRING(last), value.p, (size_t)size) == 0))
                b = Py_NewRef(last);
            else
                b = PyBytes_FromStringAndSize((const char *)value.p, size);
            if (b == NULL) {
                Py_CLEAR(column);
            } else {
                PyList_SET_ITEM(column, i, b);
                last = b;
            }
        }
        if (column == NULL)
            Py_CLEAR(columns);
        else
            PyList_SET_ITEM(columns, j, column);
    }
    return columns;
}

static PyObject *slice_rows(PyObject *self, PyObject *args)
{
    PyObject *maps, *offsets, *starts_obj, *records, *names, *actions, *outs;
    int verify;
    Py_ssize_t count, first_row;
    if (!PyArg_ParseTuple(args, "O!O!OOpO!nO!O!n", &PyTuple_Type, &maps, &PyTuple_Type, &offsets,
                          &starts_obj, &records, &verify, &PyTuple_Type, &names, &count,
                          &PyTuple_Type, &actions, &PyTuple_Type, &outs, &first_row))
        return NULL;
    Py_ssize_t nnames = PyTuple_GET_SIZE(names);
    if (!WIRE_LITTLE_ENDIAN || nnames == 0 || nnames > MAX_NAMES || first_row < 0)
        Py_RETURN_NONE;
    Py_buffer starts;
    if (int64_buffer(starts_obj, &starts) != 0)
        return NULL;
    GatherArgs g;
    if (gather_open(&g, maps, offsets, records, records) != 0) {
        PyBuffer_Release(&starts);
        return NULL;
    }
    Py_ssize_t nrecords = g.records.len / 8;
    Action acts[MAX_NAMES];
    Py_buffer views[MAX_NAMES];
    memset(acts, 0, sizeof acts);
    memset(views, 0, sizeof views);
    Key *keys = PyMem_Calloc((size_t)nnames + MAX_ENTRIES, sizeof(Key));
    Found *found = PyMem_Calloc((size_t)(nrecords ? nrecords * nnames : 1), sizeof(Found));
    Span *spans = PyMem_Calloc((size_t)(nrecords ? nrecords : 1), sizeof(Span));
    Inflater inf = {0};
    PyObject *result = NULL;
    if (keys == NULL || found == NULL || spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (take_keys(names, keys) != 0
            || take_actions(actions, outs, nnames, first_row + nrecords - 1, acts, views) != 0)
        goto done;
    size_t scanlines = 0;
    for (Py_ssize_t j = 0; j < nnames; j++)
        if (acts[j].action == ACT_PNG) {
            size_t need = acts[j].height * (acts[j].width * acts[j].channels + 1);
            scanlines = need > scanlines ? need : scanlines;
        }
    if (scanlines) {
        inf.capacity = scanlines;
        inf.scanlines = PyMem_RawMalloc(scanlines);
        if (inf.scanlines == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (nrecords == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t total = 0;
    SliceJob job = {spans, nrecords, first_row, verify,
                    {keys, nnames, count, found, keys + nnames, NULL, nrecords, 1}, acts, &inf};
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = slice_spans(&g, (const int64_t *)starts.buf, starts.len / 8, spans, nrecords);
    for (Py_ssize_t i = 0; ok && i < nrecords; i++)
        total += spans[i].size;
    ok = ok && run_slice(&job);
    Py_END_ALLOW_THREADS
    if (!ok) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *columns = bytes_columns(found, acts, nrecords, nnames);
    result = columns == NULL ? NULL : Py_BuildValue("(nN)", total, columns);
done:
    for (Py_ssize_t j = 0; j < nnames && j < MAX_NAMES; j++)
        if (views[j].buf != NULL)
            PyBuffer_Release(&views[j]);
    if (inf.ready)
        inflateEnd(&inf.zs);
    PyMem_RawFree(inf.scanlines);
    gather_release(&g);
    PyBuffer_Release(&starts);
    PyMem_Free(keys);
    PyMem_Free(found);
    PyMem_Free(spans);
    return result;
}

static PyMethodDef slice_methods[] = {
    {"slice_rows", slice_rows, METH_VARARGS,
     "slice_rows(maps, offsets, starts, records, verify, names, count, actions, outs, first_row)"
     " -> (int, list) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef slice_module = {
    PyModuleDef_HEAD_INIT, "_slice",
    "A slice of small records built into its batch rows in one call (see "
    "shardfeed.pipeline.produce).",
    -1, slice_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__slice(void)
{
    wire_setup();
    return PyModule_Create(&slice_module);
}
