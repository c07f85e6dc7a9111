/* shardfeed.storage._recv: a ranged GET's body read straight into the bytes it is handed
 * back as.
 *
 *   exact(fd, n, prefix, timeout[, total]) -> bytes
 *       ``prefix`` (bytes already received past the headers) followed by what the socket
 *       ``fd`` gives until there are ``n`` bytes; shorter only where the peer closed first
 *       (the caller names that). ``timeout`` seconds for each wait (negative: none), as the
 *       socket's own timeout applies to each receive, and ``total`` seconds for all of it
 *       (negative or left out: no limit; a body that trickles in never lets one wait pass):
 *       TimeoutError when either passes.
 *
 * The Python path (recv_into a bytearray, then bytes of it) zero-fills a buffer the size of
 * the range and copies it once more; for ranges of megabytes both passes touch fresh pages.
 * Here the bytes object is made uninitialised and filled by recv(2) alone, without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

/* One receive into ``at`` (waiting up to ``timeout_ms`` for data where the socket has none
 * yet): bytes received, 0 at the peer's close, -1 with ``*err`` set (ETIMEDOUT for a wait
 * that passed). Runs without the GIL. */
static ssize_t receive(int fd, char *at, size_t size, int timeout_ms, int *err)
{
    for (;;) {
        ssize_t got = recv(fd, at, size, 0);
        if (got >= 0)
            return got;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *err = errno;
            return -1;
        }
        struct pollfd wait = {.fd = fd, .events = POLLIN, .revents = 0};
        int ready = poll(&wait, 1, timeout_ms);
        if (ready == 0) {
            *err = ETIMEDOUT;
            return -1;
        }
        if (ready < 0) {
            *err = errno;
            return -1;
        }
    }
}

static double monotonic_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int milliseconds(double seconds)
{
    return seconds * 1000.0 > INT_MAX ? INT_MAX : (int)ceil(seconds * 1000.0);
}

static PyObject *recv_exact(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t n;
    Py_buffer prefix;
    double timeout;
    double total = -1.0;
    if (!PyArg_ParseTuple(args, "iny*d|d", &fd, &n, &prefix, &timeout, &total))
        return NULL;
    if (n < 0 || prefix.len > n) {
        PyBuffer_Release(&prefix);
        PyErr_SetString(PyExc_ValueError, "the prefix is longer than the body");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    char *base = PyBytes_AS_STRING(out);
    memcpy(base, prefix.buf, (size_t)prefix.len);
    Py_ssize_t have = prefix.len;
    PyBuffer_Release(&prefix);
    int timeout_ms = timeout < 0 ? -1 : milliseconds(timeout);
    double ends = total < 0 ? -1.0 : monotonic_seconds() + total;
    while (have < n) {
        int err = 0;
        ssize_t got;
        int wait_ms = timeout_ms;
        if (ends >= 0) {
            double left = ends - monotonic_seconds();
            if (left <= 0) {
                Py_DECREF(out);
                PyErr_SetString(PyExc_TimeoutError, "timed out");
                return NULL;
            }
            if (wait_ms < 0 || milliseconds(left) < wait_ms)
                wait_ms = milliseconds(left);
        }
        Py_BEGIN_ALLOW_THREADS
        got = receive(fd, base + have, (size_t)(n - have), wait_ms, &err);
        Py_END_ALLOW_THREADS
        if (got > 0) {
            have += got;
            continue;
        }
        if (got == 0)
            break;  /* the peer closed: the caller sees the short body */
        if (err == EINTR) {
            if (PyErr_CheckSignals() < 0) {
                Py_DECREF(out);
                return NULL;
            }
            continue;
        }
        Py_DECREF(out);
        if (err == ETIMEDOUT) {
            PyErr_SetString(PyExc_TimeoutError, "timed out");
            return NULL;
        }
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (have < n && _PyBytes_Resize(&out, have) < 0)
        return NULL;
    return out;
}

static PyMethodDef recv_methods[] = {
    {"exact", recv_exact, METH_VARARGS,
     "exact(fd, n, prefix, timeout[, total]) -> bytes: prefix then the socket's next bytes, "
     "n in all (fewer where the peer closed first); TimeoutError when one wait passes "
     "timeout seconds or all of it total seconds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef recv_module = {
    PyModuleDef_HEAD_INIT, "shardfeed.storage._recv",
    "A ranged GET's body read straight into its bytes object.", -1, recv_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recv(void)
{
    return PyModule_Create(&recv_module);
}
