/*
 * _nbgrad.c -- the CPython extension over libnbgrad (numpy's C API).  The pythonic layer (keyword arguments,
 * result objects, dxtbx and PyTorch) is nbgrad/__init__.py; this file does the calls, the array checks and the
 * error translation.
 *
 * It binds the public API of include/nbgrad.h alone.  An Experiment owns an nbg_builder (the library's parser of the
 * command line's flags and loader of the files they name), which owns its nbg_experiment and what that points to
 * (the HKL table, the sources, the panels, the motions, the mask), and one library context.  The library never
 * prints: its errors are raised with the context's message (nbg_errmsg) as the exception of the status, and the
 * builder's notes are the Experiment's log.  Every call that works on an
 * Experiment takes its lock (so one context is used by one thread at a time, as the library requires) and
 * releases the GIL while the library runs, so that two Experiments render concurrently from two threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------------------------------------- */
/* Exceptions                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

static PyObject *Error, *InvalidError, *MemError, *FileError, *FormatError, *UnsupportedError, *DeviceError;

/* Raises the exception for a library status with the message; returns NULL. */
static PyObject *raise_status(int status, const char *msg)
{
    PyObject *type = status == NBG_EINVAL    ? InvalidError
                     : status == NBG_ENOMEM  ? MemError
                     : status == NBG_EIO     ? FileError
                     : status == NBG_EFORMAT ? FormatError
                     : status == NBG_EUNSUP  ? UnsupportedError
                     : status == NBG_ENODEV || status == NBG_ECUDA ? DeviceError
                                                                   : Error;
    if (msg == NULL || msg[0] == '\0') {
        msg = nbg_strerror(status);
    }
    PyObject *exc = PyObject_CallFunction(type, "s", msg);
    if (exc != NULL) {
        PyObject *st = PyLong_FromLong(status);
        if (st != NULL) {
            PyObject_SetAttrString(exc, "status", st);
            Py_DECREF(st);
        }
        PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* A short-lived CPU context for the calls that need one only for its error message (file readers, writers). */
static nbg_ctx *scratch_ctx(void)
{
    nbg_ctx *ctx = NULL;
    int st = nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1);
    if (st != NBG_OK) {
        raise_status(st, "could not create a context");
        return NULL;
    }
    return ctx;
}

static PyObject *raise_ctx(nbg_ctx *ctx, int status)
{
    return raise_status(status, nbg_errmsg(ctx));
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Arrays                                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */

/* Whether a has an image's shape: (spixels, fpixels), or flat (npix,). */
static int image_shape_ok(PyArrayObject *a, int spixels, int fpixels, size_t npix)
{
    const int nd = PyArray_NDIM(a);
    const npy_intp *d = PyArray_DIMS(a);
    return (nd == 2 && d[0] == spixels && d[1] == fpixels) || (nd == 1 && (size_t)d[0] == npix);
}

/* 1 when every value of obj converts to an integer of [lo, hi] exactly (for the integer formats: a float image is
 * not silently truncated, a count is not wrapped); else a ValueError naming the argument and the first value. */
static int exact_integers(PyObject *obj, const char *name, double lo, double hi)
{
    PyArrayObject *d = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (d == NULL) {
        return 0;
    }
    const double *v = PyArray_DATA(d);
    const npy_intp n = PyArray_SIZE(d);
    for (npy_intp i = 0; i < n; ++i) {
        if (!(v[i] >= lo && v[i] <= hi) || v[i] != floor(v[i])) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s: element %zu is %.17g, not an integer of %.0f to %.0f (round or clip the "
                     "image first: it would be truncated)", name, (size_t)i, v[i], lo, hi);
            PyErr_SetString(PyExc_ValueError, msg);
            Py_DECREF(d);
            return 0;
        }
    }
    Py_DECREF(d);
    return 1;
}

/* Converts obj once to a C-contiguous array of type `type` (any array-like of real numbers) holding exactly
 * npix elements: shape (spixels, fpixels) or flat (npix,) when spixels is 0 any shape of npix elements.  Anything
 * else is a ValueError naming the argument and the shape expected. */
static PyArrayObject *as_image(PyObject *obj, const char *name, int type, int spixels, int fpixels, size_t npix)
{
    if (PyArray_Check(obj)) {
        const char kind = PyArray_DESCR((PyArrayObject *)obj)->kind;
        if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f') {
            PyErr_Format(PyExc_ValueError, "%s: expected real numbers (shape (%d, %d)), got an array of dtype %R",
                         name, spixels, fpixels, (PyObject *)PyArray_DESCR((PyArrayObject *)obj));
            return NULL;
        }
    }
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(obj, type, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_Format(PyExc_ValueError, "%s: expected an array of real numbers of shape (%d, %d): %S", name, spixels,
                     fpixels, v != NULL ? v : Py_None);
        Py_XDECREF(t);
        Py_XDECREF(v);
        Py_XDECREF(tb);
        return NULL;
    }
    if (!image_shape_ok(a, spixels, fpixels, npix)) {
        PyObject *shape = PyObject_GetAttrString((PyObject *)a, "shape");
        PyErr_Format(PyExc_ValueError, "%s: expected shape (%d, %d) (or %zu values), got shape %S", name, spixels,
                     fpixels, npix, shape != NULL ? shape : Py_None);
        Py_XDECREF(shape);
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Experiment                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    nbg_builder *b;        /* the library's builder: it owns the experiment and what it points to (the table, the
                              sources, the panels, the motions, the mask) */
    nbg_experiment *e;     /* nbg_builder_experiment(b) */
    nbg_hkl *hkl;          /* nbg_builder_hkl(b): the builder's table (set_hkl replaces it) */
    nbg_panel_motion *motions; /* nbg_builder_motions(b): the panel groups' motions (zero unless -motions) */
    int nmotions;
    nbg_ctx *ctx;
    PyThread_type_lock lock;
    unsigned long owner;   /* the thread holding the lock, and how many times (a callback reentering on it) */
    int depth;
    int ready;             /* parsed and validated */
    int fpixels, spixels;  /* the image size (pixel counts do not depend on the differentiable parameters) */
    PyObject *log;         /* what the builder said (notes, warnings, the files read), as the program prints it */
    uint32_t *pixels;      /* the pixel list e->pixels points to (set_pixels; NULL: the whole image), owned here */
    long npixels;
} ExperimentObject;

static PyTypeObject ExperimentType;

/* Takes the experiment's lock, letting other threads run while waiting.  The thread that holds it takes it again
 * (a refine's progress callback reading the experiment being refined); exp_check refuses there what would change
 * the experiment or start another computation on it. */
static void exp_lock(ExperimentObject *x)
{
    const unsigned long me = PyThread_get_thread_ident();
    if (x->depth > 0 && x->owner == me) {
        x->depth++;
        return;
    }
    if (!PyThread_acquire_lock(x->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(x->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    x->owner = me;
    x->depth = 1;
}

static void exp_unlock(ExperimentObject *x)
{
    if (--x->depth == 0) {
        x->owner = 0;
        PyThread_release_lock(x->lock);
    }
}

/* What a callback may do with the experiment its call is using (on the thread that holds it): read it, render it. */
static int exp_reader(const char *what)
{
    static const char *const ok[] = {"copy", "get_param", "F", "hkl_origin", "shape", "describe", "geometry",
                                     "smv_header", "simulate", "get_pixels", NULL};
    for (int i = 0; ok[i] != NULL; ++i) {
        if (strcmp(what, ok[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static int exp_validate(ExperimentObject *x);

static int exp_check(PyObject *o, const char *what)
{
    if (!PyObject_TypeCheck(o, &ExperimentType)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an nbgrad.Experiment, got %.100s", what, Py_TYPE(o)->tp_name);
        return 0;
    }
    if (!((ExperimentObject *)o)->ready) {
        PyErr_SetString(PyExc_ValueError, "the Experiment was not initialised");
        return 0;
    }
    const ExperimentObject *xo = (const ExperimentObject *)o;
    if (xo->depth > 0 && xo->owner == PyThread_get_thread_ident() && !exp_reader(what)) {
        PyErr_Format(PyExc_RuntimeError, "%s: the experiment is in use by a call on this thread (a refine's progress "
                     "callback may read it or render it, not change it or start another computation on it)", what);
        return 0;
    }
    /* made with validate=False and not checked since: the image size is not known yet */
    if (((ExperimentObject *)o)->fpixels == 0 && strcmp(what, "validate") != 0 && strcmp(what, "apply_geometry") != 0 &&
        strcmp(what, "set_hkl") != 0 && strcmp(what, "set_param") != 0) {
        return exp_validate((ExperimentObject *)o);
    }
    return 1;
}

static void exp_release(ExperimentObject *x)
{
    free(x->pixels);
    x->pixels = NULL;
    x->npixels = 0;
    nbg_builder_destroy(x->b);
    x->b = NULL;
    x->e = NULL;
    x->hkl = NULL;
    x->motions = NULL;
    x->nmotions = 0;
    x->ready = 0;
    nbg_ctx_destroy(x->ctx);
    x->ctx = NULL;
}

/* Points the object's shortcuts at its builder's experiment, table and motions. */
static void exp_attach(ExperimentObject *x, nbg_builder *b)
{
    x->b = b;
    x->e = nbg_builder_experiment(b);
    x->hkl = nbg_builder_hkl(b);
    x->nmotions = nbg_builder_motions(b, &x->motions);
    x->ready = 1;
}

static PyObject *Experiment_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    ExperimentObject *x = (ExperimentObject *)type->tp_alloc(type, 0);
    if (x == NULL) {
        return NULL;
    }
    x->lock = PyThread_allocate_lock();
    if (x->lock == NULL) {
        Py_DECREF(x);
        return PyErr_NoMemory();
    }
    x->log = PyUnicode_FromString("");
    return (PyObject *)x;
}

static void Experiment_dealloc(ExperimentObject *x)
{
    exp_release(x);
    if (x->lock != NULL) {
        PyThread_free_lock(x->lock);
    }
    Py_XDECREF(x->log);
    Py_TYPE(x)->tp_free((PyObject *)x);
}

/* The builder's messages as the program prints them, a line each (a new str): information as it is, notes and
 * warnings after "nbgrad: note: " and "nbgrad: warning: ". */
static PyObject *builder_log(const nbg_builder *b)
{
    PyObject *parts = PyList_New(0);
    if (parts == NULL) {
        return NULL;
    }
    for (int i = 0; i < nbg_builder_nmessages(b); ++i) {
        nbg_msg_level level = NBG_MSG_INFO;
        const char *text = nbg_builder_message(b, i, &level);
        PyObject *line = PyUnicode_FromFormat("%s%s\n", level == NBG_MSG_NOTE      ? "nbgrad: note: "
                                                        : level == NBG_MSG_WARNING ? "nbgrad: warning: "
                                                                                   : "",
                                              text);
        if (line == NULL || PyList_Append(parts, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(parts);
            return NULL;
        }
        Py_DECREF(line);
    }
    PyObject *empty = PyUnicode_FromString("");
    PyObject *s = empty != NULL ? PyUnicode_Join(empty, parts) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(parts);
    return s;
}

/* Checks the experiment as the library sees it (nbg_describe: ranges, geometry, sampling, limits) and records
 * the image size.  An experiment without structure factors yet (no table, default_F 0) is checked with F = 1:
 * it may get its table later (set_hkl). */
static int exp_validate(ExperimentObject *x)
{
    nbg_experiment probe = *x->e;
    nbg_report r;
    int st;
    if (probe.hkl == NULL && probe.default_F == 0) {
        probe.default_F = 1;
    }
    Py_BEGIN_ALLOW_THREADS
    st = nbg_describe(x->ctx, &probe, &r);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        return 0;
    }
    /* a detector of panels: the panels' concatenation, one row of r.npix pixels (as the program's files hold it) */
    x->fpixels = probe.npanels > 0 ? (int)r.npix : r.fpixels;
    x->spixels = probe.npanels > 0 ? 1 : r.spixels;
    return 1;
}

/* Experiment.__init__(argv): argv a sequence of str, the command line's flags (no program name).  The library's
 * builder parses them and reads the files they name (nbg_builder_parse, nbg_builder_load); its failure is raised
 * with its message as the exception of its status (a bad flag or value: InvalidError, a ValueError). */
static int Experiment_init(ExperimentObject *x, PyObject *args, PyObject *kw)
{
    PyObject *seq = NULL;
    int validate = 1;
    static char *kwlist[] = {"argv", "validate", NULL};
    /* validate=0 defers the library's check to the first call (or apply_geometry): an experiment that gets its
     * detector and crystal from a geometry afterwards is incomplete until then */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Op:Experiment", kwlist, &seq, &validate)) {
        return -1;
    }
    exp_release(x);
    PyObject *fast = seq != NULL ? PySequence_Fast(seq, "argv must be a sequence of str") : PyList_New(0);
    if (fast == NULL) {
        return -1;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const char **argv = calloc((size_t)n + 1, sizeof *argv);
    nbg_builder *b = NULL;
    nbg_ctx *pctx = NULL;
    int rc = -1, st;
    if (argv == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "argv[%zd]: expected str, got %.100s", i, Py_TYPE(item)->tp_name);
            goto done;
        }
        argv[i] = PyUnicode_AsUTF8(item);
        if (argv[i] == NULL) {
            goto done;
        }
    }
    if ((st = nbg_builder_create(&b)) != NBG_OK) {
        raise_status(st, "could not create a builder");
        goto done;
    }
    if ((pctx = scratch_ctx()) == NULL) {
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    st = nbg_builder_parse(pctx, b, (int)n, argv);
    if (st == NBG_OK) {
        st = nbg_builder_load(pctx, b);
    }
    Py_END_ALLOW_THREADS
    PyObject *log = builder_log(b);
    if (log == NULL) {
        goto done;
    }
    Py_XSETREF(x->log, log);
    if (st != NBG_OK) {
        raise_ctx(pctx, st);
        goto done;
    }
    exp_attach(x, b);
    b = NULL;
    if ((st = nbg_builder_ctx_create(x->b, &x->ctx)) != NBG_OK) {
        raise_status(st, "could not create the context (-device, -threads, -max_memory)");
        goto done;
    }
    if (validate && !exp_validate(x)) {
        goto done;
    }
    rc = 0;
done:
    if (rc != 0 && x->ready) {
        exp_release(x);
    }
    nbg_builder_destroy(b);
    nbg_ctx_destroy(pctx);
    free(argv);
    Py_DECREF(fast);
    return rc;
}

/* A deep copy (nbg_builder_copy): the table, sources, panels, motions and mask are duplicated and the copy's
 * experiment points at its own. */
static PyObject *Experiment_copy(ExperimentObject *x, PyObject *unused)
{
    if (!exp_check((PyObject *)x, "copy")) {
        return NULL;
    }
    ExperimentObject *y = (ExperimentObject *)Experiment_new(Py_TYPE(x), NULL, NULL);
    if (y == NULL) {
        return NULL;
    }
    nbg_builder *b = NULL;
    exp_lock(x);
    int st = nbg_builder_copy(x->b, &b);
    y->fpixels = x->fpixels;
    y->spixels = x->spixels;
    Py_XSETREF(y->log, Py_NewRef(x->log));
    exp_unlock(x);
    if (st != NBG_OK) {
        Py_DECREF(y);
        return raise_status(st, "could not copy the experiment");
    }
    exp_attach(y, b);
    y->e->pixels = NULL; /* the copy's own list, or none */
    y->e->npixels_list = 0;
    if (x->pixels != NULL) {
        exp_lock(x);
        y->pixels = malloc((size_t)x->npixels * sizeof *y->pixels);
        if (y->pixels != NULL) {
            memcpy(y->pixels, x->pixels, (size_t)x->npixels * sizeof *y->pixels);
            y->npixels = x->npixels;
            y->e->pixels = y->pixels;
            y->e->npixels_list = y->npixels;
        }
        exp_unlock(x);
        if (y->pixels == NULL) {
            Py_DECREF(y);
            return PyErr_NoMemory();
        }
    }
    st = nbg_builder_ctx_create(y->b, &y->ctx);
    if (st != NBG_OK) {
        Py_DECREF(y);
        return raise_status(st, "could not create the context");
    }
    return (PyObject *)y;
}

/* frame(k): image k of the series as the program renders it (nbg_builder_frame): a copy with the crystal turned from
 * phi0 + k osc and, for a scan-varying crystal from an experiment list, image k's own crystal. */
static PyObject *Experiment_frame(ExperimentObject *x, PyObject *args)
{
    int k;
    if (!PyArg_ParseTuple(args, "i:frame", &k)) {
        return NULL;
    }
    ExperimentObject *y = (ExperimentObject *)Experiment_copy(x, NULL);
    if (y == NULL) {
        return NULL;
    }
    nbg_experiment fe;
    const int st = nbg_builder_frame(y->ctx, y->b, k, &fe);
    if (st != NBG_OK) {
        raise_ctx(y->ctx, st);
        Py_DECREF(y);
        return NULL;
    }
    *y->e = fe;
    return (PyObject *)y;
}

/* The panel groups' motions: the builder keeps them (zero unless -motions), and gives them to the
 * experiment only with -motions, as the program does (a zero motion still goes through the placement, which need not
 * reproduce the unmoved panels' rounding).  A call that names a motion parameter gives them to it; motions_attach
 * returns 1 when it did, and motions_settle takes them back after the call unless a motion is non-zero now. */
static int motions_attach(ExperimentObject *x)
{
    nbg_experiment *e = x->e;
    if (e->motions != NULL || x->nmotions <= 0 || x->motions == NULL) {
        return 0;
    }
    e->motions = x->motions;
    e->nmotions = x->nmotions;
    return 1;
}

static void motions_settle(ExperimentObject *x, int attached)
{
    if (!attached) {
        return;
    }
    for (int g = 0; g < x->nmotions; ++g) {
        for (int c = 0; c < 3; ++c) {
            if (x->motions[g].shift[c] != 0 || x->motions[g].rot[c] != 0) {
                return;
            }
        }
    }
    x->e->motions = NULL;
    x->e->nmotions = 0;
}

/* A scalar, panel-motion or domain-turn parameter by name or alias ("a", "wavelength", "g3.shift_x", "d1.rot_x"); -1
 * with an exception. */
static int param_index(ExperimentObject *x, PyObject *name)
{
    const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (s == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "a parameter name must be a str, got %.100s", Py_TYPE(name)->tp_name);
        return -1;
    }
    int p = nbg_param_from_name(s);
    if (p < 0) {
        PyErr_Format(PyExc_ValueError, "unknown parameter '%s'", s);
    } else if (p >= NBG_P_DOMAIN0) { /* a mosaic domain's own turn */
        if ((p - NBG_P_DOMAIN0) / 3 >= x->e->ndomain_rot) {
            PyErr_Format(PyExc_ValueError, "'%s': the crystal's domains with turns of their own are %d (-domain_rot)",
                         s, x->e->ndomain_rot);
            p = -1;
        }
    } else if (p >= NBG_NPARAMS && (p - NBG_P_MOTION0) / 6 >= x->nmotions) {
        PyErr_Format(PyExc_ValueError, "'%s': the detector has %d panel groups", s, x->nmotions);
        p = -1;
    }
    return p;
}

/* The detector response the losses read the observed counts through (nbg_experiment.response): (pedestal, gain,
 * read_noise). */
static PyObject *Experiment_response(ExperimentObject *x, PyObject *unused)
{
    if (!exp_check((PyObject *)x, "get_param")) return NULL;
    exp_lock(x);
    const nbg_detector_model r = x->e->response;
    exp_unlock(x);
    return Py_BuildValue("(ddd)", r.pedestal, r.gain, r.read_noise);
}

static PyObject *Experiment_set_response(ExperimentObject *x, PyObject *args)
{
    double ped, gain, rn;
    if (!PyArg_ParseTuple(args, "ddd:set_response", &ped, &gain, &rn)) return NULL;
    if (!exp_check((PyObject *)x, "set_response")) return NULL;
    if (!isfinite(ped)) return PyErr_Format(PyExc_ValueError, "pedestal = %g: a finite number of counts", ped);
    if (!(gain > 0) || !isfinite(gain)) return PyErr_Format(PyExc_ValueError, "gain = %g: counts per photon, > 0", gain);
    if (!(rn >= 0) || !isfinite(rn)) return PyErr_Format(PyExc_ValueError, "read_noise = %g: counts rms, >= 0", rn);
    exp_lock(x);
    x->e->response.pedestal = ped;
    x->e->response.gain = gain;
    x->e->response.read_noise = rn;
    exp_unlock(x);
    Py_RETURN_NONE;
}

/* The pixel list the calls render and fit (nbg_experiment.pixels): a uint32 array of flat pixel indices, or None
 * (the whole image). */
static PyObject *Experiment_get_pixels(ExperimentObject *x, PyObject *unused)
{
    if (!exp_check((PyObject *)x, "get_pixels")) return NULL;
    exp_lock(x);
    PyObject *out = Py_None;
    if (x->pixels != NULL) {
        npy_intp n = (npy_intp)x->npixels;
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT32);
        if (a != NULL) memcpy(PyArray_DATA(a), x->pixels, (size_t)n * sizeof(uint32_t));
        out = (PyObject *)a;
    } else {
        Py_INCREF(out);
    }
    exp_unlock(x);
    return out;
}

/* set_pixels(list or None): flat pixel indices in [0, npix), in increasing order (the library checks the order
 * when it uses the list), kept as the experiment's own copy. */
static PyObject *Experiment_set_pixels(ExperimentObject *x, PyObject *obj)
{
    if (!exp_check((PyObject *)x, "set_pixels")) return NULL;
    uint32_t *list = NULL;
    long n = 0;
    if (obj != Py_None) {
        PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_INT64, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
        if (a == NULL) return NULL;
        n = (long)PyArray_DIM(a, 0);
        const int64_t *v = PyArray_DATA(a);
        const int64_t npix = (int64_t)x->fpixels * x->spixels;
        for (long i = 0; i < n; ++i) {
            if (v[i] < 0 || v[i] >= npix) {
                PyErr_Format(PyExc_ValueError, "pixels[%ld] = %lld: a flat pixel index in [0, %lld)", i,
                             (long long)v[i], (long long)npix);
                Py_DECREF(a);
                return NULL;
            }
        }
        list = malloc((n > 0 ? (size_t)n : 1) * sizeof *list);
        if (list == NULL) {
            Py_DECREF(a);
            return PyErr_NoMemory();
        }
        for (long i = 0; i < n; ++i) list[i] = (uint32_t)v[i];
        Py_DECREF(a);
    }
    exp_lock(x);
    free(x->pixels);
    x->pixels = list;
    x->npixels = n;
    x->e->pixels = list;
    x->e->npixels_list = n;
    exp_unlock(x);
    Py_RETURN_NONE;
}

static PyObject *Experiment_get_param(ExperimentObject *x, PyObject *name)
{
    if (!exp_check((PyObject *)x, "get_param")) return NULL;
    int p = param_index(x, name);
    if (p < 0) return NULL;
    double v = NAN;
    exp_lock(x);
    /* a motion reads the parser's list, given to the experiment or not */
    nbg_experiment probe = *x->e;
    if (p >= NBG_NPARAMS) {
        probe.motions = x->motions;
        probe.nmotions = x->nmotions;
    }
    nbg_param_get(&probe, (nbg_param)p, &v);
    /* a cell length or angle left unset (NAN) takes a's value or 90 deg, as the library reads it */
    if (isnan(v) && p >= NBG_P_B && p <= NBG_P_C) v = x->e->cell[0];
    if (isnan(v) && p >= NBG_P_ALPHA && p <= NBG_P_GAMMA) v = 90;
    exp_unlock(x);
    return PyFloat_FromDouble(v);
}

static PyObject *Experiment_set_param(ExperimentObject *x, PyObject *args)
{
    PyObject *name;
    double v;
    if (!PyArg_ParseTuple(args, "Od:set_param", &name, &v)) return NULL;
    if (!exp_check((PyObject *)x, "set_param")) return NULL;
    int p = param_index(x, name);
    if (p < 0) return NULL;
    char lab[64];
    if (!nbg_param_in_bounds((nbg_param)p, v)) {
        return PyErr_Format(PyExc_ValueError, "%s = %R is out of range (see nbg_param_in_bounds)",
                            nbg_param_label(NULL, (nbg_param)p, lab, sizeof lab), PyTuple_GET_ITEM(args, 1));
    }
    exp_lock(x);
    /* a cell given as "a" alone has NAN b and c; setting one of them must not silently move the others */
    if (p >= NBG_P_A && p <= NBG_P_GAMMA) {
        for (int i = 1; i < 6; ++i) {
            if (isnan(x->e->cell[i])) x->e->cell[i] = i < 3 ? x->e->cell[0] : 90;
        }
    }
    const int attached = p >= NBG_NPARAMS ? motions_attach(x) : 0;
    nbg_param_set(x->e, (nbg_param)p, v);
    motions_settle(x, attached);
    exp_unlock(x);
    Py_RETURN_NONE;
}

/* The table as a new (nh, nk, nl) float64 array, or None without one. */
static PyObject *Experiment_get_F(ExperimentObject *x, void *closure)
{
    if (!exp_check((PyObject *)x, "F")) return NULL;
    if (x->e->hkl == NULL) Py_RETURN_NONE;
    const nbg_hkl *h = x->e->hkl;
    npy_intp dims[3] = {h->h_max - h->h_min + 1, h->k_max - h->k_min + 1, h->l_max - h->l_min + 1};
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(3, dims, NPY_FLOAT64);
    if (a == NULL) return NULL;
    exp_lock(x);
    memcpy(PyArray_DATA(a), h->F, (size_t)PyArray_SIZE(a) * sizeof(double));
    exp_unlock(x);
    return (PyObject *)a;
}

static int Experiment_set_F(ExperimentObject *x, PyObject *value, void *closure)
{
    if (!exp_check((PyObject *)x, "set F")) return -1;
    if (value == NULL || x->e->hkl == NULL) {
        PyErr_SetString(PyExc_AttributeError, "F: the experiment has no table (set one with set_hkl)");
        return -1;
    }
    nbg_hkl *h = x->hkl;
    const int nh = h->h_max - h->h_min + 1, nk = h->k_max - h->k_min + 1, nl = h->l_max - h->l_min + 1;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(value, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL || PyArray_NDIM(a) != 3 || PyArray_DIM(a, 0) != nh || PyArray_DIM(a, 1) != nk ||
        PyArray_DIM(a, 2) != nl) {
        Py_XDECREF(a);
        PyErr_Format(PyExc_ValueError, "F: expected an array of shape (%d, %d, %d)", nh, nk, nl);
        return -1;
    }
    exp_lock(x);
    memcpy(h->F, PyArray_DATA(a), (size_t)PyArray_SIZE(a) * sizeof(double));
    exp_unlock(x);
    Py_DECREF(a);
    return 0;
}

/* set_hkl(F, origin): a new table, F of shape (nh, nk, nl) indexed from origin = (h_min, k_min, l_min). */
static PyObject *Experiment_set_hkl(ExperimentObject *x, PyObject *args)
{
    PyObject *obj;
    int h0, k0, l0;
    if (!PyArg_ParseTuple(args, "O(iii):set_hkl", &obj, &h0, &k0, &l0)) return NULL;
    if (!exp_check((PyObject *)x, "set_hkl")) return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL || PyArray_NDIM(a) != 3 || PyArray_SIZE(a) == 0) {
        Py_XDECREF(a);
        return PyErr_Format(PyExc_ValueError, "F: expected a non-empty 3-d array (nh, nk, nl)");
    }
    double *F = malloc((size_t)PyArray_SIZE(a) * sizeof(double));
    if (F == NULL) {
        Py_DECREF(a);
        return PyErr_NoMemory();
    }
    memcpy(F, PyArray_DATA(a), (size_t)PyArray_SIZE(a) * sizeof(double));
    exp_lock(x);
    nbg_hkl_free(x->hkl);
    x->hkl->h_min = h0;
    x->hkl->k_min = k0;
    x->hkl->l_min = l0;
    x->hkl->h_max = h0 + (int)PyArray_DIM(a, 0) - 1;
    x->hkl->k_max = k0 + (int)PyArray_DIM(a, 1) - 1;
    x->hkl->l_max = l0 + (int)PyArray_DIM(a, 2) - 1;
    x->hkl->F = F;
    x->hkl->nrefl = (long)PyArray_SIZE(a);
    x->e->hkl = x->hkl;
    exp_unlock(x);
    Py_DECREF(a);
    Py_RETURN_NONE;
}

static PyObject *Experiment_get_origin(ExperimentObject *x, void *closure)
{
    if (!exp_check((PyObject *)x, "hkl_origin")) return NULL;
    if (x->e->hkl == NULL) Py_RETURN_NONE;
    return Py_BuildValue("(iii)", x->e->hkl->h_min, x->e->hkl->k_min, x->e->hkl->l_min);
}

static PyObject *Experiment_get_shape(ExperimentObject *x, void *closure)
{
    if (!exp_check((PyObject *)x, "shape")) return NULL;
    return Py_BuildValue("(ii)", x->spixels, x->fpixels);
}

static PyObject *Experiment_get_log(ExperimentObject *x, void *closure)
{
    return Py_NewRef(x->log);
}

static PyObject *Experiment_get_default_F(ExperimentObject *x, void *closure)
{
    return PyFloat_FromDouble(x->e->default_F);
}

static PyObject *vec(const double *v, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t != NULL && i < n; ++i) {
        PyTuple_SET_ITEM(t, i, PyFloat_FromDouble(v[i]));
    }
    return t;
}

#define SET(d, key, obj)                                                                                            \
    do {                                                                                                            \
        PyObject *o_ = (obj);                                                                                       \
        if (o_ == NULL || PyDict_SetItemString(d, key, o_) < 0) {                                                   \
            Py_XDECREF(o_);                                                                                         \
            Py_DECREF(d);                                                                                           \
            return NULL;                                                                                            \
        }                                                                                                           \
        Py_DECREF(o_);                                                                                              \
    } while (0)

static PyObject *report_dict(const nbg_report *r)
{
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    SET(d, "fpixels", PyLong_FromLong(r->fpixels));
    SET(d, "spixels", PyLong_FromLong(r->spixels));
    SET(d, "pixel", PyFloat_FromDouble(r->pixel));
    SET(d, "distance", PyFloat_FromDouble(r->distance));
    SET(d, "close_distance", PyFloat_FromDouble(r->close_distance));
    SET(d, "Xbeam", PyFloat_FromDouble(r->Xbeam));
    SET(d, "Ybeam", PyFloat_FromDouble(r->Ybeam));
    SET(d, "Fbeam", PyFloat_FromDouble(r->Fbeam));
    SET(d, "Sbeam", PyFloat_FromDouble(r->Sbeam));
    SET(d, "pix0", vec(r->pix0, 3));
    SET(d, "fdet", vec(r->fdet, 3));
    SET(d, "sdet", vec(r->sdet, 3));
    SET(d, "odet", vec(r->odet, 3));
    SET(d, "beam", vec(r->beam, 3));
    SET(d, "spindle", vec(r->spindle, 3));
    SET(d, "lambda", PyFloat_FromDouble(r->lambda));
    SET(d, "oversample", PyLong_FromLong(r->oversample));
    SET(d, "recommended_oversample", PyLong_FromLong(r->recommended_oversample));
    SET(d, "nsources", PyLong_FromLong(r->nsources));
    SET(d, "phi0", PyFloat_FromDouble(r->phi0));
    SET(d, "osc", PyFloat_FromDouble(r->osc));
    SET(d, "phisteps", PyLong_FromLong(r->phisteps));
    SET(d, "sensor_model", PyUnicode_FromString(r->sensor_model == NBG_SENSOR_PHYSICAL ? "physical" : "nanobragg"));
    SET(d, "mosaic_domains", PyLong_FromLong(r->mosaic_domains));
    SET(d, "steps", PyLong_FromLong(r->steps));
    SET(d, "cell", vec(r->cell, 6));
    SET(d, "real_vectors", vec(r->real_vectors, 9));
    SET(d, "recip_vectors", vec(r->recip_vectors, 9));
    SET(d, "fluence", PyFloat_FromDouble(r->fluence));
    SET(d, "solid_angle", PyFloat_FromDouble(r->solid_angle));
    SET(d, "time_setup", PyFloat_FromDouble(r->time_setup));
    SET(d, "time_kernel", PyFloat_FromDouble(r->time_kernel));
    return d;
}

static PyObject *Experiment_describe(ExperimentObject *x, PyObject *unused)
{
    if (!exp_check((PyObject *)x, "describe")) return NULL;
    nbg_report r;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_describe(x->ctx, x->e, &r);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        exp_unlock(x);
        return NULL;
    }
    exp_unlock(x);
    return report_dict(&r);
}

/* --- nbg_geometry <-> dict ---------------------------------------------------------------------------------- */

/* A multi-axis goniometer (nbg_goniometer) as a dict: axes (innermost first), angles (deg), names, scan_axis, and
 * the fixed and setting rotations they give (rows) */
static PyObject *goniometer_dict(const nbg_goniometer *gn)
{
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    PyObject *axes = PyTuple_New(gn->naxes), *names = PyTuple_New(gn->naxes);
    for (int i = 0; axes != NULL && names != NULL && i < gn->naxes; ++i) {
        PyObject *a = vec(gn->axes[i], 3), *n = PyUnicode_FromString(gn->names[i]);
        if (a == NULL || n == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(n);
            Py_CLEAR(axes);
            break;
        }
        PyTuple_SET_ITEM(axes, i, a);
        PyTuple_SET_ITEM(names, i, n);
    }
    if (axes == NULL) Py_CLEAR(names);
    SET(d, "axes", axes);
    SET(d, "angles", vec(gn->angles, gn->naxes));
    SET(d, "names", names);
    SET(d, "scan_axis", PyLong_FromLong(gn->scan_axis));
    SET(d, "fixed_rotation", Py_BuildValue("(NNN)", vec(gn->fixed, 3), vec(gn->fixed + 3, 3), vec(gn->fixed + 6, 3)));
    SET(d, "setting_rotation",
        Py_BuildValue("(NNN)", vec(gn->setting, 3), vec(gn->setting + 3, 3), vec(gn->setting + 6, 3)));
    return d;
}

static PyObject *geometry_dict(const nbg_geometry *g)
{
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    SET(d, "fpixels", PyLong_FromLong(g->fpixels));
    SET(d, "spixels", PyLong_FromLong(g->spixels));
    SET(d, "pixel_f", PyFloat_FromDouble(g->pixel_f));
    SET(d, "pixel_s", PyFloat_FromDouble(g->pixel_s));
    SET(d, "fast", vec(g->fast, 3));
    SET(d, "slow", vec(g->slow, 3));
    SET(d, "origin", vec(g->origin, 3));
    SET(d, "thickness", PyFloat_FromDouble(g->thickness));
    SET(d, "mu", PyFloat_FromDouble(g->mu));
    SET(d, "material", PyUnicode_FromString(g->material));
    SET(d, "sensor_model", PyLong_FromLong(g->sensor_model));
    SET(d, "sensor_layers", PyLong_FromLong(g->sensor_layers));
    SET(d, "saturation", PyFloat_FromDouble(g->saturation));
    SET(d, "pedestal", PyFloat_FromDouble(g->pedestal));
    SET(d, "gain", PyFloat_FromDouble(g->gain));
    SET(d, "response_stated", PyLong_FromLong(g->response_stated));
    SET(d, "direction", vec(g->direction, 3));
    SET(d, "wavelength", PyFloat_FromDouble(g->wavelength));
    SET(d, "polarization_normal", vec(g->polarization_normal, 3));
    SET(d, "polarization_fraction", PyFloat_FromDouble(g->polarization_fraction));
    SET(d, "axis", vec(g->axis, 3));
    if (g->goniometer.naxes > 0) SET(d, "goniometer", goniometer_dict(&g->goniometer));
    SET(d, "scan_start", PyFloat_FromDouble(g->scan_start));
    SET(d, "scan_width", PyFloat_FromDouble(g->scan_width));
    SET(d, "nframes", PyLong_FromLong(g->nframes));
    SET(d, "exposure", PyFloat_FromDouble(g->exposure));
    if (g->has_crystal) {
        SET(d, "real_space", Py_BuildValue("(NNN)", vec(g->real_space, 3), vec(g->real_space + 3, 3),
                                           vec(g->real_space + 6, 3)));
        SET(d, "space_group", PyUnicode_FromString(g->space_group));
    }
    return d;
}

static int get_vec(PyObject *d, const char *key, double *out, int n)
{
    PyObject *o = PyDict_GetItemString(d, key);
    if (o == NULL) return 1;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(o, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL || PyArray_SIZE(a) != n) {
        Py_XDECREF(a);
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "geometry['%s']: expected %d numbers", key, n);
        return 0;
    }
    memcpy(out, PyArray_DATA(a), (size_t)n * sizeof(double));
    Py_DECREF(a);
    return 1;
}

static int get_num(PyObject *d, const char *key, double *out)
{
    PyObject *o = PyDict_GetItemString(d, key);
    if (o == NULL) return 1;
    double v = PyFloat_AsDouble(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "geometry['%s']: expected a number", key);
        return 0;
    }
    *out = v;
    return 1;
}

static int get_int(PyObject *d, const char *key, int *out)
{
    double v = *out;
    if (!get_num(d, key, &v)) return 0;
    if (v != floor(v) || fabs(v) > 2e9) {
        PyErr_Format(PyExc_ValueError, "geometry['%s']: expected an integer", key);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int get_str(PyObject *d, const char *key, char *out, size_t size)
{
    PyObject *o = PyDict_GetItemString(d, key);
    if (o == NULL) return 1;
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (s == NULL || strlen(s) >= size) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "geometry['%s']: expected a str of at most %zu characters", key, size - 1);
        return 0;
    }
    snprintf(out, size, "%s", s);
    return 1;
}

static const char *const geometry_keys[] = {
    "fpixels", "spixels", "pixel_f", "pixel_s", "fast", "slow", "origin", "thickness", "mu", "material",
    "sensor_model", "sensor_layers", "saturation", "pedestal", "gain", "response_stated", "direction", "wavelength", "polarization_normal",
    "polarization_fraction",
    "axis", "scan_start", "scan_width", "nframes", "exposure", "real_space", "space_group", "goniometer", NULL};

/* geometry['goniometer'] into g->goniometer: axes, angles and scan_axis (names optional; fixed_rotation and
 * setting_rotation, which geometry_dict gives, are taken as derived: the library computes them again).  A
 * ValueError names what does not fit; the values themselves are checked by the library (nbg_goniometer_derive). */
static int goniometer_from_dict(PyObject *d, nbg_goniometer *gn)
{
    PyObject *o = PyDict_GetItemString(d, "goniometer");
    if (o == NULL || o == Py_None) return 1;
    if (!PyDict_Check(o)) {
        PyErr_Format(PyExc_TypeError, "geometry['goniometer']: expected a dict, got %.100s", Py_TYPE(o)->tp_name);
        return 0;
    }
    static const char *const keys[] = {"axes", "angles", "names", "scan_axis", "fixed_rotation", "setting_rotation",
                                       NULL};
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &key, &val)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int i = 0; k != NULL && keys[i] != NULL; ++i) known |= strcmp(k, keys[i]) == 0;
        if (!known) {
            PyErr_Format(PyExc_ValueError, "geometry['goniometer']: unknown key %R", key);
            return 0;
        }
    }
    PyObject *axes = PyDict_GetItemString(o, "axes"), *angles = PyDict_GetItemString(o, "angles");
    PyObject *names = PyDict_GetItemString(o, "names"), *scan = PyDict_GetItemString(o, "scan_axis");
    if (axes == NULL || angles == NULL || scan == NULL) {
        PyErr_SetString(PyExc_ValueError, "geometry['goniometer']: needs 'axes', 'angles' and 'scan_axis'");
        return 0;
    }
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(axes, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL || PyArray_NDIM(a) != 2 || PyArray_DIM(a, 1) != 3 || PyArray_DIM(a, 0) < 1 ||
        PyArray_DIM(a, 0) > NBG_GONIO_MAX_AXES) {
        Py_XDECREF(a);
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "geometry['goniometer']['axes']: expected 1 to %d axes of 3 numbers",
                     NBG_GONIO_MAX_AXES);
        return 0;
    }
    const int n = (int)PyArray_DIM(a, 0);
    memset(gn, 0, sizeof *gn);
    gn->naxes = n;
    memcpy(gn->axes, PyArray_DATA(a), (size_t)n * 3 * sizeof(double));
    Py_DECREF(a);
    PyArrayObject *b = (PyArrayObject *)PyArray_FROM_OTF(angles, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (b == NULL || PyArray_SIZE(b) != n) {
        Py_XDECREF(b);
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "geometry['goniometer']['angles']: expected %d numbers (one per axis)", n);
        return 0;
    }
    memcpy(gn->angles, PyArray_DATA(b), (size_t)n * sizeof(double));
    Py_DECREF(b);
    if (names != NULL && names != Py_None) {
        PyObject *seq = PySequence_Fast(names, "");
        int ok = seq != NULL && PySequence_Fast_GET_SIZE(seq) == n;
        for (int i = 0; ok && i < n; ++i) {
            PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
            const char *str = PyUnicode_Check(it) ? PyUnicode_AsUTF8(it) : NULL;
            ok = str != NULL && strlen(str) < sizeof gn->names[i];
            if (ok) snprintf(gn->names[i], sizeof gn->names[i], "%s", str);
        }
        Py_XDECREF(seq);
        if (!ok) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "geometry['goniometer']['names']: expected %d str (one per axis) of at "
                         "most %zu characters", n, sizeof gn->names[0] - 1);
            return 0;
        }
    }
    long k = PyLong_Check(scan) ? PyLong_AsLong(scan) : -1;
    if (!PyLong_Check(scan) || (k == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "geometry['goniometer']['scan_axis']: expected an int");
        return 0;
    }
    gn->scan_axis = k < INT_MIN || k > INT_MAX ? -1 : (int)k; /* out of range: the library says so */
    return 1;
}

/* A geometry dict into g: the keys given over the library's defaults (nbg_geometry_default); an unknown key is a
 * ValueError naming it, so that a misspelt key is not silently dropped. */
static int geometry_from_dict(PyObject *d, nbg_geometry *g)
{
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "geometry: expected a dict, got %.100s", Py_TYPE(d)->tp_name);
        return 0;
    }
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &val)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int i = 0; k != NULL && geometry_keys[i] != NULL; ++i) known |= strcmp(k, geometry_keys[i]) == 0;
        if (!known) {
            PyErr_Format(PyExc_ValueError, "geometry: unknown key %R", key);
            return 0;
        }
    }
    nbg_geometry_default(g);
    g->has_crystal = PyDict_GetItemString(d, "real_space") != NULL;
    return get_int(d, "fpixels", &g->fpixels) && get_int(d, "spixels", &g->spixels) &&
           get_num(d, "pixel_f", &g->pixel_f) && get_num(d, "pixel_s", &g->pixel_s) && get_vec(d, "fast", g->fast, 3) &&
           get_vec(d, "slow", g->slow, 3) && get_vec(d, "origin", g->origin, 3) &&
           get_num(d, "thickness", &g->thickness) && get_num(d, "mu", &g->mu) &&
           get_str(d, "material", g->material, sizeof g->material) && get_int(d, "sensor_model", &g->sensor_model) &&
           get_int(d, "sensor_layers", &g->sensor_layers) && get_num(d, "saturation", &g->saturation) &&
           get_num(d, "pedestal", &g->pedestal) && get_num(d, "gain", &g->gain) &&
           get_int(d, "response_stated", &g->response_stated) &&
           get_vec(d, "direction", g->direction, 3) && get_num(d, "wavelength", &g->wavelength) &&
           get_vec(d, "polarization_normal", g->polarization_normal, 3) &&
           get_num(d, "polarization_fraction", &g->polarization_fraction) && get_vec(d, "axis", g->axis, 3) &&
           get_num(d, "scan_start", &g->scan_start) && get_num(d, "scan_width", &g->scan_width) &&
           get_int(d, "nframes", &g->nframes) && get_num(d, "exposure", &g->exposure) &&
           get_vec(d, "real_space", g->real_space, 9) &&
           get_str(d, "space_group", g->space_group, sizeof g->space_group) && goniometer_from_dict(d, &g->goniometer);
}

static PyObject *Experiment_geometry(ExperimentObject *x, PyObject *args, PyObject *kw)
{
    int nframes = 1;
    static char *kwlist[] = {"nframes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i:geometry", kwlist, &nframes)) return NULL;
    if (!exp_check((PyObject *)x, "geometry")) return NULL;
    nbg_report r;
    nbg_geometry g;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_describe(x->ctx, x->e, &r);
    if (st == NBG_OK) st = nbg_geometry_from_report(x->ctx, x->e, &r, nframes, &g);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        exp_unlock(x);
        return NULL;
    }
    exp_unlock(x);
    return geometry_dict(&g);
}

static PyObject *Experiment_apply_geometry(ExperimentObject *x, PyObject *d)
{
    if (!exp_check((PyObject *)x, "apply_geometry")) return NULL;
    nbg_geometry g;
    if (!geometry_from_dict(d, &g)) return NULL;
    exp_lock(x);
    nbg_experiment saved = *x->e;
    int st = nbg_experiment_from_geometry(x->ctx, &g, x->e);
    if (st != NBG_OK) {
        *x->e = saved;
        raise_ctx(x->ctx, st);
        exp_unlock(x);
        return NULL;
    }
    exp_unlock(x);
    if (!exp_validate(x)) {
        *x->e = saved;
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Experiment_smv_header(ExperimentObject *x, PyObject *unused);

static PyObject *Experiment_validate(ExperimentObject *x, PyObject *unused)
{
    if (!exp_check((PyObject *)x, "validate")) return NULL;
    exp_lock(x);
    int ok = exp_validate(x);
    exp_unlock(x);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Experiment_methods[] = {
    {"copy", (PyCFunction)Experiment_copy, METH_NOARGS, "A deep copy (own table, sources and mask)."},
    {"frame", (PyCFunction)Experiment_frame, METH_VARARGS,
     "frame(k): image k (0-based) of the rotation series as the program renders it, a copy: the crystal turned from "
     "phi0 + k osc through osc and, when an experiment list's crystal is scan-varying (dials.refine's "
     "A_at_scan_points), image k's own crystal (the mean of the A matrices at its start and end)."},
    {"__copy__", (PyCFunction)Experiment_copy, METH_NOARGS, NULL},
    {"get_param", (PyCFunction)Experiment_get_param, METH_O, "get_param(name) -> float"},
    {"set_param", (PyCFunction)Experiment_set_param, METH_VARARGS, "set_param(name, value)"},
    {"response", (PyCFunction)Experiment_response, METH_NOARGS,
     "response() -> (pedestal, gain, read_noise): how the observed counts relate to photons (the losses')"},
    {"set_response", (PyCFunction)Experiment_set_response, METH_VARARGS, "set_response(pedestal, gain, read_noise)"},
    {"get_pixels", (PyCFunction)Experiment_get_pixels, METH_NOARGS,
     "get_pixels() -> uint32 array of flat pixel indices, or None (the whole image)"},
    {"set_pixels", (PyCFunction)Experiment_set_pixels, METH_O, "set_pixels(indices or None)"},
    {"set_hkl", (PyCFunction)Experiment_set_hkl, METH_VARARGS,
     "set_hkl(F, origin): a new structure-factor table F[h-h0, k-k0, l-l0], origin = (h0, k0, l0)"},
    {"describe", (PyCFunction)Experiment_describe, METH_NOARGS, "The geometry and sampling derived (nbg_describe)."},
    {"geometry", (PyCFunction)(void (*)(void))Experiment_geometry, METH_VARARGS | METH_KEYWORDS,
     "geometry(nframes=1) -> dict: the experiment in DIALS's frame (nbg_geometry)"},
    {"apply_geometry", (PyCFunction)Experiment_apply_geometry, METH_O,
     "apply_geometry(dict): detector, beam, scan and crystal from a geometry dict (nbg_experiment_from_geometry)"},
    {"smv_header", (PyCFunction)Experiment_smv_header, METH_NOARGS, "The SMV header nanoBragg would write."},
    {"validate", (PyCFunction)Experiment_validate, METH_NOARGS,
     "Checks the experiment as the library does (ValueError with its message)."},
    {NULL}};

static PyGetSetDef Experiment_getset[] = {
    {"F", (getter)Experiment_get_F, (setter)Experiment_set_F, "the structure-factor table (nh, nk, nl), or None",
     NULL},
    {"hkl_origin", (getter)Experiment_get_origin, NULL, "(h_min, k_min, l_min) of the table, or None", NULL},
    {"shape", (getter)Experiment_get_shape, NULL, "the image shape (slow, fast)", NULL},
    {"log", (getter)Experiment_get_log, NULL, "what the flag parser printed (notes, warnings)", NULL},
    {"default_F", (getter)Experiment_get_default_F, NULL, "F outside the table", NULL},
    {NULL}};

static PyTypeObject ExperimentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "nbgrad._nbgrad.Experiment",
    .tp_basicsize = sizeof(ExperimentObject),
    .tp_dealloc = (destructor)Experiment_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "An experiment (nbg_experiment) and what it points to.",
    .tp_methods = Experiment_methods,
    .tp_getset = Experiment_getset,
    .tp_init = (initproc)Experiment_init,
    .tp_new = Experiment_new,
};

/* ---------------------------------------------------------------------------------------------------------- */
/* Simulation and gradients                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */

static PyArrayObject *new_image(const ExperimentObject *x)
{
    npy_intp dims[2] = {x->spixels, x->fpixels};
    return (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
}

static PyObject *py_simulate(PyObject *self, PyObject *args)
{
    PyObject *o, *outobj = Py_None;
    int want_report = 0;
    if (!PyArg_ParseTuple(args, "O|pO:simulate", &o, &want_report, &outobj)) return NULL;
    if (!exp_check(o, "simulate")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    PyArrayObject *img;
    if (outobj == Py_None) {
        img = new_image(x);
        if (img == NULL) return NULL;
    } else {
        /* the caller's buffer, written in place: it must be exactly what the library writes (no copy back) */
        if (!PyArray_Check(outobj) || PyArray_TYPE((PyArrayObject *)outobj) != NPY_FLOAT32 ||
            !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)outobj) || !PyArray_ISWRITEABLE((PyArrayObject *)outobj) ||
            !image_shape_ok((PyArrayObject *)outobj, x->spixels, x->fpixels, (size_t)x->fpixels * x->spixels)) {
            return PyErr_Format(PyExc_ValueError, "out: expected a writable C-contiguous float32 array of shape "
                                "(%d, %d) (or %zu values)", x->spixels, x->fpixels, (size_t)x->fpixels * x->spixels);
        }
        img = (PyArrayObject *)Py_NewRef(outobj);
    }
    nbg_report r;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_simulate(x->ctx, x->e, PyArray_DATA(img), (size_t)PyArray_SIZE(img), &r);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        exp_unlock(x);
        Py_DECREF(img);
        return NULL;
    }
    exp_unlock(x);
    if (want_report) {
        return Py_BuildValue("(NN)", img, report_dict(&r));
    }
    return (PyObject *)img;
}

/* The library call alone, timed inside the extension (for bench/bench_python.py): seconds of each of n calls,
 * into a preallocated image, without the GIL or the array's allocation. */
static PyObject *py_time_simulate(PyObject *self, PyObject *args)
{
    PyObject *o;
    int n;
    if (!PyArg_ParseTuple(args, "Oi:_time_simulate", &o, &n)) return NULL;
    if (!exp_check(o, "_time_simulate")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    const size_t npix = (size_t)x->fpixels * x->spixels;
    float *img = malloc(npix * sizeof(float));
    PyObject *out = PyList_New(0);
    if (img == NULL || out == NULL) {
        free(img);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    exp_lock(x);
    for (int i = 0; i < n; ++i) {
        struct timespec t0, t1;
        int st;
        Py_BEGIN_ALLOW_THREADS
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = nbg_simulate(x->ctx, x->e, img, npix, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        Py_END_ALLOW_THREADS
        if (st != NBG_OK) {
            raise_ctx(x->ctx, st);
            Py_CLEAR(out);
            break;
        }
        PyObject *t = PyFloat_FromDouble((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        PyList_Append(out, t);
        Py_DECREF(t);
    }
    exp_unlock(x);
    free(img);
    return out;
}

/* Parameter names, a str or a sequence of str (joined with commas), parsed for x's experiment by the library
 * (nbg_params_parse with flags: names, aliases, groups, "all", "g3.shift_x", "panel_shift", "F", "F(h,k,l)") into
 * *ids (malloc'd, the caller frees it) and *n, in the order given, without repeats; *want_F is set when the word "F"
 * (every structure factor) is among them.  Call with x's lock held; *attached as motions_attach says (the motions
 * stay given to the experiment only when a motion parameter is named; motions_settle after the call).  0 with an
 * exception on failure. */
static int parse_params(ExperimentObject *x, PyObject *list, int flags, nbg_param **ids, int *n, int *want_F,
                        int *attached)
{
    *ids = NULL;
    *n = 0;
    *want_F = 0;
    *attached = 0;
    PyObject *joined = NULL;
    if (PyUnicode_Check(list)) {
        joined = Py_NewRef(list);
    } else {
        PyObject *fast = PySequence_Fast(list, "params must be a sequence of parameter names");
        if (fast == NULL) return 0;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
            PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
            if (!PyUnicode_Check(item)) {
                PyErr_Format(PyExc_TypeError, "a parameter name must be a str, got %.100s", Py_TYPE(item)->tp_name);
                Py_DECREF(fast);
                return 0;
            }
        }
        PyObject *sep = PyUnicode_FromString(",");
        if (sep != NULL) joined = PyUnicode_Join(sep, fast);
        Py_XDECREF(sep);
        Py_DECREF(fast);
        if (joined == NULL) return 0;
    }
    const char *s = PyUnicode_AsUTF8(joined);
    if (s == NULL) {
        Py_DECREF(joined);
        return 0;
    }
    /* the word "F" alone (outside the parentheses of "F(h,k,l)"), spaces around it allowed */
    for (const char *p = s; *p != '\0';) {
        while (*p == ',' || *p == ' ' || *p == '\t') ++p;
        const char *w = p;
        int depth = 0;
        while (*p != '\0' && (depth > 0 || *p != ',')) {
            depth += *p == '(' ? 1 : *p == ')' ? -1 : 0;
            ++p;
        }
        const char *end = p;
        while (end > w && (end[-1] == ' ' || end[-1] == '\t')) --end;
        if (end - w == 1 && *w == 'F') *want_F = 1;
    }
    int empty = 1;
    for (const char *p = s; *p != '\0'; ++p) {
        if (*p != ',' && *p != ' ' && *p != '\t') empty = 0;
    }
    if (empty) {
        Py_DECREF(joined);
        return 1;
    }
    *attached = motions_attach(x);
    int st = nbg_params_parse(x->ctx, x->e, s, flags, ids, n);
    Py_DECREF(joined);
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        motions_settle(x, *attached);
        *attached = 0;
        free(*ids);
        *ids = NULL;
        *n = 0;
        return 0;
    }
    int motion = 0;
    for (int j = 0; j < *n; ++j) {
        motion |= (*ids)[j] >= NBG_P_MOTION0 && (*ids)[j] < NBG_P_DOMAIN0;
    }
    if (!motion) {
        motions_settle(x, *attached);
        *attached = 0;
    }
    return 1;
}

/* A parameter's name as the results key it ("a", "g3.shift_x", "F(1,2,3)"; "F" for the directional check). */
static PyObject *param_label(const ExperimentObject *x, nbg_param p)
{
    char lab[96];
    if (p == NBG_P_F_ALL) return PyUnicode_FromString("F");
    return PyUnicode_FromString(nbg_param_label(x->e, p, lab, sizeof lab));
}

/* {name: dL/dtheta} for the parameters listed, in their order; with want_F the structure factors under "F": an
 * array of the table's shape (nh, nk, nl) (entries not listed 0), or dL/d(default_F) as a float without a table. */
static PyObject *grad_dict(const ExperimentObject *x, const nbg_param *ids, int n, const double *g, int want_F)
{
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    const nbg_hkl *h = x->e->hkl;
    PyArrayObject *dF = NULL;
    for (int j = 0; j < n; ++j) {
        PyObject *key = NULL, *val = NULL;
        if (want_F && ids[j] >= NBG_P_F0 && h != NULL) {
            if (dF == NULL) {
                npy_intp dims[3] = {h->h_max - h->h_min + 1, h->k_max - h->k_min + 1, h->l_max - h->l_min + 1};
                dF = (PyArrayObject *)PyArray_ZEROS(3, dims, NPY_FLOAT64, 0);
                if (dF == NULL || PyDict_SetItemString(d, "F", (PyObject *)dF) < 0) goto fail;
            }
            const npy_intp i = ids[j] - NBG_P_F0;
            if (i < PyArray_SIZE(dF)) ((double *)PyArray_DATA(dF))[i] = g[j];
            continue;
        }
        key = want_F && ids[j] >= NBG_P_F0 ? PyUnicode_FromString("F") : param_label(x, ids[j]);
        val = PyFloat_FromDouble(g[j]);
        const int bad = key == NULL || val == NULL || PyDict_SetItem(d, key, val) < 0;
        Py_XDECREF(key);
        Py_XDECREF(val);
        if (bad) goto fail;
    }
    Py_XDECREF(dF);
    return d;
fail:
    Py_XDECREF(dF);
    Py_DECREF(d);
    return NULL;
}

/* grad(exp, dLdI, params) -> (dict, image) */
static PyObject *py_grad(PyObject *self, PyObject *args)
{
    PyObject *o, *dobj, *plist;
    if (!PyArg_ParseTuple(args, "OOO:grad", &o, &dobj, &plist)) return NULL;
    if (!exp_check(o, "grad")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    const size_t npix = (size_t)x->fpixels * x->spixels;
    PyArrayObject *dLdI = as_image(dobj, "dLdI", NPY_FLOAT32, x->spixels, x->fpixels, npix);
    if (dLdI == NULL) return NULL;
    PyArrayObject *img = NULL;
    PyObject *out = NULL;
    nbg_param *ids = NULL;
    double *g = NULL;
    int n, want_F, attached;
    exp_lock(x);
    if (!parse_params(x, plist, 0, &ids, &n, &want_F, &attached)) goto done;
    img = new_image(x);
    g = calloc(n > 0 ? (size_t)n : 1, sizeof *g);
    if (img == NULL || g == NULL) {
        if (g == NULL) PyErr_NoMemory();
        goto done;
    }
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = nbg_simulate_grad(x->ctx, x->e, PyArray_DATA(dLdI), ids, n, g, PyArray_DATA(img), npix, NULL);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
    } else {
        out = Py_BuildValue("(NO)", grad_dict(x, ids, n, g, want_F), img);
    }
done:
    motions_settle(x, attached);
    exp_unlock(x);
    free(ids);
    free(g);
    Py_DECREF(dLdI);
    Py_XDECREF(img);
    return out;
}

/* loss_grad(exp, observed, weights, loss, params) -> (L, dict, image) */
static PyObject *py_loss_grad(PyObject *self, PyObject *args)
{
    PyObject *o, *oobj, *wobj, *plist;
    int loss;
    if (!PyArg_ParseTuple(args, "OOOiO:loss_grad", &o, &oobj, &wobj, &loss, &plist)) return NULL;
    if (!exp_check(o, "loss_grad")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    const size_t npix = (size_t)x->fpixels * x->spixels;
    PyArrayObject *obs = as_image(oobj, "observed", NPY_FLOAT32, x->spixels, x->fpixels, npix), *w = NULL;
    if (obs == NULL) return NULL;
    if (wobj != Py_None && (w = as_image(wobj, "weights", NPY_FLOAT32, x->spixels, x->fpixels, npix)) == NULL) {
        Py_DECREF(obs);
        return NULL;
    }
    PyArrayObject *img = NULL;
    PyObject *out = NULL;
    nbg_param *ids = NULL;
    double *g = NULL;
    int n, want_F, attached;
    exp_lock(x);
    if (!parse_params(x, plist, 0, &ids, &n, &want_F, &attached)) goto done;
    img = new_image(x);
    g = calloc(n > 0 ? (size_t)n : 1, sizeof *g);
    if (img == NULL || g == NULL) {
        if (g == NULL) PyErr_NoMemory();
        goto done;
    }
    double L = 0;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = nbg_loss_grad(x->ctx, x->e, (nbg_loss)loss, PyArray_DATA(obs), w != NULL ? PyArray_DATA(w) : NULL, ids,
                       n, &L, g, PyArray_DATA(img), npix);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
    } else {
        out = Py_BuildValue("(dNO)", L, grad_dict(x, ids, n, g, want_F), img);
    }
done:
    motions_settle(x, attached);
    exp_unlock(x);
    free(ids);
    free(g);
    Py_DECREF(obs);
    Py_XDECREF(w);
    Py_XDECREF(img);
    return out;
}

/* The tangent images of the parameters named in plist (a list; groups expanded in place: tangent j is the j-th
 * parameter) and the image, in one render (nbg_simulate_tangents): (tangents (n, slow, fast) float64, image), the image
 * float64 (the model image before its rounding) when dbl, else float32 (nbg_simulate_jvp's).  what names the call. */
static PyObject *tangents_call(PyObject *o, PyObject *plist, int dbl, const char *what)
{
    if (!exp_check(o, what)) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    PyArrayObject *tan = NULL, *img = NULL;
    PyObject *out = NULL;
    nbg_param *ids = NULL;
    int n, want_F, attached;
    exp_lock(x);
    if (!parse_params(x, plist, 0, &ids, &n, &want_F, &attached)) goto done;
    if (want_F) {
        PyErr_Format(PyExc_ValueError, "%s: 'F' has no tangent images (use grad for the table)", what);
        goto done;
    }
    npy_intp dims[3] = {n, x->spixels, x->fpixels};
    tan = (PyArrayObject *)PyArray_SimpleNew(3, dims, NPY_FLOAT64);
    img = dbl ? (PyArrayObject *)PyArray_SimpleNew(2, dims + 1, NPY_FLOAT64) : new_image(x);
    if (tan != NULL && img != NULL) {
        int st;
        Py_BEGIN_ALLOW_THREADS
        st = nbg_simulate_tangents(x->ctx, x->e, ids, n, n > 0 ? PyArray_DATA(tan) : NULL,
                                   dbl ? NULL : PyArray_DATA(img), dbl ? PyArray_DATA(img) : NULL,
                                   (size_t)x->fpixels * x->spixels);
        Py_END_ALLOW_THREADS
        if (st != NBG_OK) {
            raise_ctx(x->ctx, st);
        } else {
            out = Py_BuildValue("(OO)", tan, img);
        }
    }
done:
    motions_settle(x, attached);
    exp_unlock(x);
    free(ids);
    Py_XDECREF(tan);
    Py_XDECREF(img);
    return out;
}

/* jvp(exp, params) -> (tangents (n, slow, fast) float64, image float32) */
static PyObject *py_jvp(PyObject *self, PyObject *args)
{
    PyObject *o, *plist;
    if (!PyArg_ParseTuple(args, "OO:jvp", &o, &plist)) return NULL;
    return tangents_call(o, plist, 0, "jvp");
}

/* _tangents(exp, params, double) -> (tangents, image): as jvp, the list possibly empty, the image float64 when double
 * is true.  For the PyTorch adapter (nbgrad.torch). */
static PyObject *py_tangents(PyObject *self, PyObject *args)
{
    PyObject *o, *plist;
    int dbl;
    if (!PyArg_ParseTuple(args, "OOp:_tangents", &o, &plist, &dbl)) return NULL;
    return tangents_call(o, plist, dbl, "_tangents");
}

/* The progress callback of nbg_refine runs without the GIL; it takes it for the Python callable.  An exception
 * raised by the callable is kept and re-raised after the refinement (the library cannot be stopped early). */
typedef struct {
    PyObject *fn;
    PyObject *exc_type, *exc_value, *exc_tb;
} progress_ctx;

static void refine_progress(void *user, int iter, double loss, double gnorm, double step)
{
    progress_ctx *p = user;
    PyGILState_STATE gs = PyGILState_Ensure();
    if (p->exc_type == NULL) {
        PyObject *r = PyObject_CallFunction(p->fn, "iddd", iter, loss, gnorm, step);
        if (r == NULL) {
            PyErr_Fetch(&p->exc_type, &p->exc_value, &p->exc_tb);
        }
        Py_XDECREF(r);
    }
    PyGILState_Release(gs);
}

/* refine(exp, observed, weights, params, method, loss, max_iter, ftol, gtol, progress) -> dict */
static PyObject *py_refine(PyObject *self, PyObject *args)
{
    PyObject *o, *oobj, *wobj, *plist, *progress;
    int method, loss, max_iter;
    double ftol, gtol;
    if (!PyArg_ParseTuple(args, "OOOOiiiddO:refine", &o, &oobj, &wobj, &plist, &method, &loss, &max_iter, &ftol,
                          &gtol, &progress))
        return NULL;
    if (!exp_check(o, "refine")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    const size_t npix = (size_t)x->fpixels * x->spixels;
    PyArrayObject *obs = as_image(oobj, "observed", NPY_FLOAT32, x->spixels, x->fpixels, npix), *w = NULL;
    if (obs == NULL) return NULL;
    if (wobj != Py_None && (w = as_image(wobj, "weights", NPY_FLOAT32, x->spixels, x->fpixels, npix)) == NULL) {
        Py_DECREF(obs);
        return NULL;
    }
    nbg_refine_options opt;
    nbg_refine_options_default(&opt);
    opt.method = (nbg_optimizer)method;
    opt.loss = (nbg_loss)loss;
    opt.max_iter = max_iter;
    opt.ftol = ftol;
    opt.gtol = gtol;
    progress_ctx pc = {progress, NULL, NULL, NULL};
    if (progress != Py_None) {
        opt.progress = refine_progress;
        opt.user = &pc;
    }
    nbg_refine_result res;
    memset(&res, 0, sizeof res);
    PyObject *out = NULL, *names = NULL;
    nbg_param *ids = NULL;
    int n, want_F, attached, st = NBG_OK;
    exp_lock(x);
    if (!parse_params(x, plist, 0, &ids, &n, &want_F, &attached)) goto unlock;
    /* "F": the table's measured entries fitted with the others as per-reflection scales (nbg_refine_options.F) */
    int nF = 0, m = 0;
    for (int j = 0; j < n; ++j) nF += ids[j] >= NBG_P_F0;
    if (nF > 0 && !want_F) {
        PyErr_SetString(PyExc_ValueError, "refine: the structure factors are fitted as a whole ('F'), not single "
                        "entries F(h,k,l)");
        goto unlock;
    }
    for (int j = 0; j < n; ++j) {
        if (ids[j] < NBG_P_F0) ids[m++] = ids[j];
    }
    n = m;
    if (want_F) {
        if (x->e->hkl == NULL || x->e->hkl != x->hkl) {
            PyErr_SetString(PyExc_ValueError, "refine: 'F' fits the experiment's structure-factor table, and it has "
                            "none (set one with set_hkl)");
            goto unlock;
        }
        opt.F = x->hkl;
    }
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "refine: list one or more parameters (with 'F': besides it)");
        goto unlock;
    }
    Py_BEGIN_ALLOW_THREADS
    st = nbg_refine(x->ctx, x->e, PyArray_DATA(obs), w != NULL ? PyArray_DATA(w) : NULL, npix, ids, n, &opt,
                    &res);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        goto unlock;
    }
    /* the names while the experiment is held (a structure factor's Miller indices are its table's) */
    names = PyList_New(res.nparams);
    for (int j = 0; names != NULL && j < res.nparams; ++j) {
        PyObject *s = param_label(x, res.params[j]);
        if (s == NULL) {
            Py_CLEAR(names);
            break;
        }
        PyList_SET_ITEM(names, j, s);
    }
unlock:
    motions_settle(x, attached);
    exp_unlock(x);
    if (st != NBG_OK || names == NULL) goto done;
    if (pc.exc_type != NULL) {
        PyErr_Restore(pc.exc_type, pc.exc_value, pc.exc_tb); /* steals the three references */
        pc.exc_type = pc.exc_value = pc.exc_tb = NULL;
        goto done;
    }
    npy_intp dims[2] = {res.nparams, res.nparams};
    PyArrayObject *corr = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT64);
    if (corr == NULL) goto done;
    memcpy(PyArray_DATA(corr), res.corr, (size_t)res.nparams * res.nparams * sizeof(double));
    out = Py_BuildValue("{s:O,s:N,s:N,s:N,s:N,s:d,s:d,s:i,s:O}", "params", names, "start", vec(res.start, res.nparams),
                        "value", vec(res.value, res.nparams), "sigma", vec(res.sigma, res.nparams), "corr", corr,
                        "start_loss", res.start_loss, "loss", res.loss, "iterations", res.iterations, "converged",
                        res.converged ? Py_True : Py_False);
    if (out != NULL) {
        /* the space group's doing: what it constrained, and each listed parameter's leader (-1 held) */
        PyObject *tied = PyList_New(res.nparams);
        for (int j = 0; tied != NULL && j < res.nparams; ++j) {
            PyList_SET_ITEM(tied, j, PyLong_FromLong(res.tied != NULL ? res.tied[j] : j));
        }
        PyObject *ctext = PyUnicode_FromString(res.constraint);
        if (tied == NULL || ctext == NULL || PyDict_SetItemString(out, "tied", tied) != 0 ||
            PyDict_SetItemString(out, "constraint", ctext) != 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(tied);
        Py_XDECREF(ctext);
    }
done:
    Py_XDECREF(names);
    Py_XDECREF(pc.exc_type);
    Py_XDECREF(pc.exc_value);
    Py_XDECREF(pc.exc_tb);
    nbg_refine_result_free(&res);
    free(ids);
    Py_DECREF(obs);
    Py_XDECREF(w);
    return out;
}

/* gradcheck(exp, params, rtol, h_scale) -> list of dicts ("F": the structure factors along one direction) */
static PyObject *py_gradcheck(PyObject *self, PyObject *args)
{
    PyObject *o, *plist;
    double rtol, hscale;
    if (!PyArg_ParseTuple(args, "OOdd:gradcheck", &o, &plist, &rtol, &hscale)) return NULL;
    if (!exp_check(o, "gradcheck")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    nbg_param *ids = NULL;
    nbg_gradcheck_result *res = NULL;
    PyObject *out = NULL;
    int n, want_F, attached;
    exp_lock(x);
    if (!parse_params(x, plist, NBG_PARSE_F_ALL, &ids, &n, &want_F, &attached)) goto done;
    res = calloc(n > 0 ? (size_t)n : 1, sizeof *res);
    if (res == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = nbg_gradcheck(x->ctx, x->e, ids, n, rtol, hscale, res);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        goto done;
    }
    out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; ++i) {
        PyObject *name = param_label(x, res[i].param);
        PyObject *d = name == NULL ? NULL
                                   : Py_BuildValue("{s:N,s:d,s:d,s:d,s:d,s:d,s:l,s:O,s:s}", "param", name, "adjoint",
                                                   res[i].adjoint, "numeric", res[i].numeric, "relerr", res[i].relerr,
                                                   "step", res[i].step, "order", res[i].order, "excluded",
                                                   res[i].excluded, "passed", res[i].pass ? Py_True : Py_False,
                                                   "reason", res[i].reason);
        if (d == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, d);
    }
done:
    motions_settle(x, attached);
    exp_unlock(x);
    free(ids);
    free(res);
    return out;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Files                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */

/* Runs a file call with a scratch context and the GIL released; raises on failure.  The call is a statement
 * using `ctx` and assigning `st`. */
#define FILE_CALL(call)                                                                                             \
    nbg_ctx *ctx = scratch_ctx();                                                                                   \
    int st = NBG_EINVAL;                                                                                            \
    if (ctx != NULL) {                                                                                              \
        Py_BEGIN_ALLOW_THREADS                                                                                      \
        st = (call);                                                                                                \
        Py_END_ALLOW_THREADS                                                                                        \
        if (st != NBG_OK) raise_ctx(ctx, st);                                                                       \
        nbg_ctx_destroy(ctx);                                                                                       \
    }

static PyObject *py_read_hkl(PyObject *self, PyObject *args)
{
    PyObject *path;
    double defF = 0;
    int fdump = 0;
    if (!PyArg_ParseTuple(args, "O&|dp:read_hkl", PyUnicode_FSConverter, &path, &defF, &fdump)) return NULL;
    nbg_hkl h = {0};
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(fdump ? nbg_hkl_read_fdump(ctx, p, &h) : nbg_hkl_read(ctx, p, defF, &h));
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    npy_intp dims[3] = {h.h_max - h.h_min + 1, h.k_max - h.k_min + 1, h.l_max - h.l_min + 1};
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(3, dims, NPY_FLOAT64);
    if (a != NULL) memcpy(PyArray_DATA(a), h.F, (size_t)PyArray_SIZE(a) * sizeof(double));
    nbg_hkl_free(&h);
    if (a == NULL) return NULL;
    return Py_BuildValue("(N(iii)l)", a, h.h_min, h.k_min, h.l_min, h.nrefl);
}

static PyObject *py_write_fdump(PyObject *self, PyObject *args)
{
    PyObject *path, *fobj;
    int h0, k0, l0;
    if (!PyArg_ParseTuple(args, "O&O(iii):write_fdump", PyUnicode_FSConverter, &path, &fobj, &h0, &k0, &l0))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(fobj, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL || PyArray_NDIM(a) != 3) {
        Py_XDECREF(a);
        Py_DECREF(path);
        return PyErr_Format(PyExc_ValueError, "F: expected a 3-d array (nh, nk, nl)");
    }
    nbg_hkl h = {h0, h0 + (int)PyArray_DIM(a, 0) - 1, k0, k0 + (int)PyArray_DIM(a, 1) - 1, l0,
                 l0 + (int)PyArray_DIM(a, 2) - 1, PyArray_DATA(a), (long)PyArray_SIZE(a)};
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_hkl_write_fdump(ctx, p, &h));
    Py_DECREF(path);
    Py_DECREF(a);
    if (st != NBG_OK) return NULL;
    Py_RETURN_NONE;
}

static PyObject *smv_dict(const nbg_smv_header *h)
{
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    SET(d, "fpixels", PyLong_FromLong(h->fpixels));
    SET(d, "spixels", PyLong_FromLong(h->spixels));
    SET(d, "pixel", PyFloat_FromDouble(h->pixel));
    SET(d, "distance", PyFloat_FromDouble(h->distance));
    SET(d, "close_distance", PyFloat_FromDouble(h->close_distance));
    SET(d, "lambda", PyFloat_FromDouble(h->lambda));
    SET(d, "Xbeam", PyFloat_FromDouble(h->Xbeam));
    SET(d, "Ybeam", PyFloat_FromDouble(h->Ybeam));
    SET(d, "Fbeam", PyFloat_FromDouble(h->Fbeam));
    SET(d, "Sbeam", PyFloat_FromDouble(h->Sbeam));
    SET(d, "detsize_s", PyFloat_FromDouble(h->detsize_s));
    SET(d, "dials_origin", vec(h->dials_origin, 3));
    SET(d, "ORGX", PyFloat_FromDouble(h->ORGX));
    SET(d, "ORGY", PyFloat_FromDouble(h->ORGY));
    SET(d, "phi0", PyFloat_FromDouble(h->phi0));
    SET(d, "osc", PyFloat_FromDouble(h->osc));
    SET(d, "twotheta", PyFloat_FromDouble(h->twotheta));
    if (h->has_adc_offset) SET(d, "adc_offset", PyFloat_FromDouble(h->adc_offset));
    return d;
}

static PyObject *Experiment_smv_header(ExperimentObject *x, PyObject *unused)
{
    if (!exp_check((PyObject *)x, "smv_header")) return NULL;
    nbg_report r;
    nbg_smv_header h;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_describe(x->ctx, x->e, &r);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
        exp_unlock(x);
        return NULL;
    }
    exp_unlock(x);
    nbg_smv_header_from_report(&r, &h);
    return smv_dict(&h);
}

static int smv_from_dict(PyObject *d, nbg_smv_header *h)
{
    static const char *const keys[] = {"fpixels", "spixels", "pixel", "distance", "close_distance", "lambda",
                                       "Xbeam", "Ybeam", "Fbeam", "Sbeam", "detsize_s", "dials_origin", "ORGX",
                                       "ORGY", "phi0", "osc", "twotheta", "adc_offset", NULL};
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "header: expected a dict");
        return 0;
    }
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &val)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int i = 0; k != NULL && keys[i] != NULL; ++i) known |= strcmp(k, keys[i]) == 0;
        if (!known) {
            PyErr_Format(PyExc_ValueError, "header: unknown key %R", key);
            return 0;
        }
    }
    memset(h, 0, sizeof *h);
    h->has_adc_offset = PyDict_GetItemString(d, "adc_offset") != NULL;
    return get_int(d, "fpixels", &h->fpixels) && get_int(d, "spixels", &h->spixels) && get_num(d, "pixel", &h->pixel) &&
           get_num(d, "distance", &h->distance) && get_num(d, "close_distance", &h->close_distance) &&
           get_num(d, "lambda", &h->lambda) && get_num(d, "Xbeam", &h->Xbeam) && get_num(d, "Ybeam", &h->Ybeam) &&
           get_num(d, "Fbeam", &h->Fbeam) && get_num(d, "Sbeam", &h->Sbeam) && get_num(d, "detsize_s", &h->detsize_s) &&
           get_vec(d, "dials_origin", h->dials_origin, 3) && get_num(d, "ORGX", &h->ORGX) &&
           get_num(d, "ORGY", &h->ORGY) && get_num(d, "phi0", &h->phi0) && get_num(d, "osc", &h->osc) &&
           get_num(d, "twotheta", &h->twotheta) && get_num(d, "adc_offset", &h->adc_offset);
}

/* write_smv(path, header, data uint16 (spixels, fpixels)) */
static PyObject *py_write_smv(PyObject *self, PyObject *args)
{
    PyObject *path, *hobj, *dobj;
    if (!PyArg_ParseTuple(args, "O&OO:write_smv", PyUnicode_FSConverter, &path, &hobj, &dobj)) return NULL;
    nbg_smv_header h;
    if (!smv_from_dict(hobj, &h)) {
        Py_DECREF(path);
        return NULL;
    }
    if (h.fpixels <= 0 || h.spixels <= 0) {
        Py_DECREF(path);
        return PyErr_Format(PyExc_ValueError, "header: fpixels and spixels must be positive");
    }
    PyArrayObject *a = exact_integers(dobj, "data", 0, 65535)
                           ? as_image(dobj, "data", NPY_UINT16, h.spixels, h.fpixels, (size_t)h.fpixels * h.spixels)
                           : NULL;
    if (a == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_write_smv(ctx, p, &h, PyArray_DATA(a)));
    Py_DECREF(path);
    Py_DECREF(a);
    if (st != NBG_OK) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_read_smv(PyObject *self, PyObject *args)
{
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&:read_smv", PyUnicode_FSConverter, &path)) return NULL;
    nbg_smv_header h;
    uint16_t *data = NULL;
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_read_smv(ctx, p, &h, &data));
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    npy_intp dims[2] = {h.spixels, h.fpixels};
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_UINT16);
    if (a != NULL) memcpy(PyArray_DATA(a), data, (size_t)PyArray_SIZE(a) * sizeof(uint16_t));
    free(data);
    if (a == NULL) return NULL;
    return Py_BuildValue("(NN)", a, smv_dict(&h));
}

/* write_float(path, image): any float image, written as float32 */
static PyObject *py_write_float(PyObject *self, PyObject *args)
{
    PyObject *path, *iobj;
    if (!PyArg_ParseTuple(args, "O&O:write_float", PyUnicode_FSConverter, &path, &iobj)) return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(iobj, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_write_float(ctx, p, PyArray_DATA(a), (size_t)PyArray_SIZE(a)));
    Py_DECREF(path);
    Py_DECREF(a);
    if (st != NBG_OK) return NULL;
    Py_RETURN_NONE;
}

static PyArrayObject *image2d(PyObject *obj, const char *name)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a != NULL && PyArray_NDIM(a) != 2) {
        Py_DECREF(a);
        PyErr_Format(PyExc_ValueError, "%s: expected a 2-d image (slow, fast)", name);
        return NULL;
    }
    return a;
}

static PyObject *py_write_pgm(PyObject *self, PyObject *args)
{
    PyObject *path, *iobj;
    double scale;
    if (!PyArg_ParseTuple(args, "O&Od:write_pgm", PyUnicode_FSConverter, &path, &iobj, &scale)) return NULL;
    PyArrayObject *a = image2d(iobj, "image");
    if (a == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_write_pgm(ctx, p, PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0), scale));
    Py_DECREF(path);
    Py_DECREF(a);
    if (st != NBG_OK) return NULL;
    Py_RETURN_NONE;
}

static int parse_roi(PyObject *o, int roi[4], int **proi)
{
    *proi = NULL;
    if (o == Py_None) return 1;
    if (!PyArg_ParseTuple(o, "iiii", &roi[0], &roi[1], &roi[2], &roi[3])) return 0;
    *proi = roi;
    return 1;
}

/* int_image(image, scale, adc, roi) -> uint16 array */
static PyObject *py_int_image(PyObject *self, PyObject *args)
{
    PyObject *iobj, *roiobj;
    double scale, adc;
    int roi[4], *proi;
    if (!PyArg_ParseTuple(args, "OddO:int_image", &iobj, &scale, &adc, &roiobj)) return NULL;
    if (!parse_roi(roiobj, roi, &proi)) return NULL;
    PyArrayObject *a = image2d(iobj, "image");
    if (a == NULL) return NULL;
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(2, PyArray_DIMS(a), NPY_UINT16);
    if (out == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    FILE_CALL(nbg_int_image(ctx, PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0), proi, scale, adc,
                            PyArray_DATA(out)));
    Py_DECREF(a);
    if (st != NBG_OK) {
        Py_DECREF(out);
        return NULL;
    }
    return (PyObject *)out;
}

/* noise_image(image, seed, adc, roi) -> (uint16 array, photons, overloads) */
static PyObject *py_noise_image(PyObject *self, PyObject *args)
{
    PyObject *iobj, *roiobj;
    long seed;
    double adc;
    int roi[4], *proi;
    if (!PyArg_ParseTuple(args, "OldO:noise_image", &iobj, &seed, &adc, &roiobj)) return NULL;
    if (!parse_roi(roiobj, roi, &proi)) return NULL;
    PyArrayObject *a = image2d(iobj, "image");
    if (a == NULL) return NULL;
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(2, PyArray_DIMS(a), NPY_UINT16);
    if (out == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    long photons = 0, overloads = 0;
    FILE_CALL(nbg_noise_image(ctx, PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0), proi, adc, seed,
                              PyArray_DATA(out), &photons, &overloads));
    Py_DECREF(a);
    if (st != NBG_OK) {
        Py_DECREF(out);
        return NULL;
    }
    return Py_BuildValue("(Nll)", out, photons, overloads);
}

/* read_image(path, frame, expect_npix) -> (flat float32 image, geometry dict or None, complete, mask or None) */
static PyObject *py_read_image(PyObject *self, PyObject *args)
{
    PyObject *path;
    int frame = 0;
    Py_ssize_t expect = 0;
    if (!PyArg_ParseTuple(args, "O&|in:read_image", PyUnicode_FSConverter, &path, &frame, &expect)) return NULL;
    float *img = NULL;
    uint8_t *mask = NULL;
    size_t npix = 0;
    nbg_geometry g;
    int have = 0;
    nbg_geometry_default(&g);
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_read_image(ctx, p, frame, (size_t)expect, &img, &npix, &g, &have, &mask));
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    npy_intp n = (npy_intp)npix;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    PyArrayObject *m = NULL;
    if (a != NULL) memcpy(PyArray_DATA(a), img, npix * sizeof(float));
    if (a != NULL && mask != NULL && (m = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT8)) != NULL) {
        memcpy(PyArray_DATA(m), mask, npix);
    }
    free(img);
    free(mask);
    if (a == NULL || (mask != NULL && m == NULL)) {
        Py_XDECREF(a);
        return NULL;
    }
    PyObject *gd = g.fpixels > 0 ? geometry_dict(&g) : Py_NewRef(Py_None);
    return Py_BuildValue("(NNON)", a, gd, have ? Py_True : Py_False, m != NULL ? (PyObject *)m : Py_NewRef(Py_None));
}

static const char *value_source(nbg_value_source v)
{
    return v == NBG_FROM_OPTION ? "given" : v == NBG_FROM_FILE ? "file" : v == NBG_FROM_MODEL ? "experiment list"
                                                                                          : "default";
}

/* Each panel's own pedestal, gain and read noise (lists: None or one value per panel each; the library checks the
 * count against the panels) into opt, their arrays in arr (to release after the call); 0 with the exception set. */
static int response_lists(const char *what, PyObject *const lists[3], nbg_observed_options *opt, PyArrayObject *arr[3])
{
    const double **dst[3] = {&opt->panel_pedestal, &opt->panel_gain, &opt->panel_read_noise};
    for (int k = 0; k < 3; ++k) {
        arr[k] = NULL;
        if (lists[k] == Py_None) continue;
        arr[k] = (PyArrayObject *)PyArray_FROMANY(lists[k], NPY_FLOAT64, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
        if (arr[k] == NULL) {
            for (int j = 0; j < k; ++j) Py_XDECREF(arr[j]);
            return 0;
        }
        *dst[k] = (const double *)PyArray_DATA(arr[k]);
        opt->npanel_values = (int)PyArray_DIM(arr[k], 0);
    }
    for (int k = 0; k < 3; ++k) {
        if (arr[k] != NULL && (int)PyArray_DIM(arr[k], 0) != opt->npanel_values) {
            PyErr_Format(PyExc_ValueError, "%s: the panel lists differ in length (%d and %d values)", what,
                         (int)PyArray_DIM(arr[k], 0), opt->npanel_values);
            for (int j = 0; j < 3; ++j) Py_XDECREF(arr[j]);
            return 0;
        }
    }
    return 1;
}

/* read_observed(exp, path, frame, pedestal, gain, read_noise, adc) -> (flat float32 image, flat uint8 use, info
 * dict): nbg_observed_read with exp's experiment (its mask joins the file's); NAN for a value not given.  exp's
 * detector response becomes the one chosen. */
static PyObject *py_read_observed(PyObject *self, PyObject *args)
{
    PyObject *o, *path, *lists[3] = {Py_None, Py_None, Py_None};
    int frame = 0;
    nbg_observed_options opt;
    nbg_observed_options_default(&opt);
    if (!PyArg_ParseTuple(args, "OO&idddd|OOO:read_observed", &o, PyUnicode_FSConverter, &path, &frame,
                          &opt.pedestal, &opt.gain, &opt.read_noise, &opt.adc, &lists[0], &lists[1], &lists[2]))
        return NULL;
    if (!exp_check(o, "read_observed")) {
        Py_DECREF(path);
        return NULL;
    }
    ExperimentObject *x = (ExperimentObject *)o;
    PyArrayObject *arr[3] = {NULL, NULL, NULL};
    if (!response_lists("read_observed", lists, &opt, arr)) {
        Py_DECREF(path);
        return NULL;
    }
    if (isnan(opt.adc)) {
        opt.adc = nbg_builder_adc(x->b);
    }
    opt.what = "read_observed";
    opt.mask_what = "the experiment's mask";
    nbg_observed ob;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_observed_read(x->ctx, x->e, PyBytes_AS_STRING(path), frame, &opt, &ob);
    Py_END_ALLOW_THREADS
    if (st == NBG_OK) {
        /* the panels are the builder's, which this experiment owns */
        st = nbg_observed_apply_response(x->ctx, &ob, x->e, (nbg_panel *)x->e->panels, x->e->npanels);
        if (st != NBG_OK) nbg_observed_free(&ob);
    }
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
    }
    exp_unlock(x);
    for (int k = 0; k < 3; ++k) Py_XDECREF(arr[k]);
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    npy_intp n = (npy_intp)ob.npix;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    PyArrayObject *m = a != NULL ? (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT8) : NULL;
    PyObject *info = NULL;
    if (m != NULL) {
        memcpy(PyArray_DATA(a), ob.image, ob.npix * sizeof(float));
        memcpy(PyArray_DATA(m), ob.use, ob.npix);
        PyObject *gd = ob.geometry.fpixels > 0 ? geometry_dict(&ob.geometry) : Py_NewRef(Py_None);
        info = gd == NULL ? NULL
               : Py_BuildValue("{s:s,s:(ddd),s:(sss),s:N,s:O,s:i,s:d,s:l,s:l,s:l,s:l,s:s,s:s,s:s}", "file", ob.file,
                               "response", ob.response.pedestal, ob.response.gain, ob.response.read_noise, "from",
                               value_source(ob.pedestal_from), value_source(ob.gain_from),
                               value_source(ob.read_noise_from), "geometry", gd, "complete",
                               ob.have_geometry ? Py_True : Py_False, "scan_stated", ob.geometry.scan_stated,
                               "saturation", ob.saturation, "left_mask", ob.nleft_mask, "left_file", ob.nleft_file,
                               "left_overload", ob.nleft_overload, "negative", ob.nnegative, "response_text",
                               ob.response_text, "note", ob.note, "left_out", ob.left_out);
        if (info != NULL && ob.panel_response != NULL) {
            PyObject *pr = PyList_New(ob.npanel_response);
            for (int q = 0; pr != NULL && q < ob.npanel_response; ++q) {
                const nbg_detector_model *r = &ob.panel_response[q];
                PyObject *t = Py_BuildValue("(ddd)", r->pedestal, r->gain, r->read_noise);
                if (t == NULL) {
                    Py_CLEAR(pr);
                    break;
                }
                PyList_SET_ITEM(pr, q, t);
            }
            if (pr == NULL || PyDict_SetItemString(info, "panel_response", pr) != 0) {
                Py_CLEAR(info);
            }
            Py_XDECREF(pr);
        }
    }
    nbg_observed_free(&ob);
    if (info == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(m);
        return NULL;
    }
    return Py_BuildValue("(NNN)", a, m, info);
}

/* spot_pixels(exp, image or None, half, frac, use or None, centres or None) -> uint32 array: nbg_spot_pixels around
 * the pixels of image (None: exp's model, rendered whole) above nbg_spot_threshold's threshold (frac of its range over
 * the pixels use keeps), or around the centres ((n, 2) fast, slow) when given. */
static PyObject *py_spot_pixels(PyObject *self, PyObject *args)
{
    PyObject *o, *iobj, *uobj, *cobj;
    int half;
    double frac;
    if (!PyArg_ParseTuple(args, "OOidOO:spot_pixels", &o, &iobj, &half, &frac, &uobj, &cobj)) return NULL;
    if (!exp_check(o, "spot_pixels")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    const size_t npix = (size_t)x->fpixels * (size_t)x->spixels;
    PyArrayObject *img = NULL, *use = NULL, *cen = NULL;
    PyObject *out = NULL;
    float *model = NULL;
    uint32_t *list = NULL;
    long n = 0, nc = 0;
    double thr = INFINITY;
    int st = NBG_OK;
    if (cobj != Py_None) {
        cen = (PyArrayObject *)PyArray_FROMANY(cobj, NPY_FLOAT64, 2, 2, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
        if (cen == NULL) return NULL;
        if (PyArray_DIM(cen, 1) != 2) {
            Py_DECREF(cen);
            return PyErr_Format(PyExc_ValueError, "centres: expected shape (n, 2) (fast, slow), got %ld columns",
                                (long)PyArray_DIM(cen, 1));
        }
        nc = (long)PyArray_DIM(cen, 0);
    } else {
        if (iobj != Py_None && (img = as_image(iobj, "image", NPY_FLOAT32, x->spixels, x->fpixels, npix)) == NULL)
            goto done;
        if (uobj != Py_None && (use = as_image(uobj, "mask", NPY_UINT8, x->spixels, x->fpixels, npix)) == NULL)
            goto done;
    }
    exp_lock(x);
    nbg_experiment whole = *x->e;
    whole.pixels = NULL; /* the model rendered whole */
    whole.npixels_list = 0;
    const float *im = img != NULL ? PyArray_DATA(img) : NULL;
    Py_BEGIN_ALLOW_THREADS
    if (cen == NULL && im == NULL) {
        model = malloc(npix * sizeof *model);
        st = model == NULL ? NBG_ENOMEM : nbg_simulate(x->ctx, &whole, model, npix, NULL);
        im = model;
    }
    if (st == NBG_OK && cen == NULL &&
        !nbg_spot_threshold(im, use != NULL ? PyArray_DATA(use) : NULL, npix, frac, &thr)) {
        st = 1; /* flat */
    }
    if (st == NBG_OK) {
        st = nbg_spot_pixels(x->ctx, &whole, cen != NULL ? NULL : im, npix, thr, cen != NULL ? PyArray_DATA(cen) : NULL,
                             nc, half, &list, &n);
    }
    Py_END_ALLOW_THREADS
    if (st == 1) {
        PyErr_Format(PyExc_ValueError, "spot_pixels: the image is flat (%g): no spot to box", thr);
    } else if (st == NBG_ENOMEM && model == NULL) {
        PyErr_NoMemory();
    } else if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
    }
    exp_unlock(x);
    if (st == NBG_OK) {
        npy_intp dn = (npy_intp)n;
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &dn, NPY_UINT32);
        if (a != NULL && n > 0) memcpy(PyArray_DATA(a), list, (size_t)n * sizeof(uint32_t));
        out = (PyObject *)a;
    }
done:
    free(model);
    free(list);
    Py_XDECREF(img);
    Py_XDECREF(use);
    Py_XDECREF(cen);
    return out;
}

/* A new C-contiguous array of n rows of `cols` elements (cols 0: a vector) of `type`, copied from data (NULL: no
 * such column, None). */
static PyObject *column_array(const void *data, long n, int cols, int type, size_t elsize)
{
    if (data == NULL) Py_RETURN_NONE;
    npy_intp dims[2] = {(npy_intp)n, cols};
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(cols > 0 ? 2 : 1, dims, type);
    if (a != NULL && n > 0) memcpy(PyArray_DATA(a), data, (size_t)n * (size_t)(cols > 0 ? cols : 1) * elsize);
    return (PyObject *)a;
}

/* read_refl(path) -> dict: nbg_read_refl's columns under DIALS's names ("panel", "xyzobs.px.value", "bbox", "id",
 * "miller_index", "flags", "xyzcal.px"; None where the table has none), the shoeboxes' "shoebox_panel",
 * "shoebox_bbox", "shoebox_offset" (n + 1, int64) and "shoebox_mask" (None without a shoebox column), and "nrows",
 * "ncolumns", "has_shoebox". */
static PyObject *py_read_refl(PyObject *self, PyObject *args)
{
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&:read_refl", PyUnicode_FSConverter, &path)) return NULL;
    nbg_reflections r;
    memset(&r, 0, sizeof r);
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_read_refl(ctx, p, &r));
    Py_DECREF(path);
    if (st != NBG_OK) {
        nbg_reflections_free(&r);
        return NULL;
    }
    PyObject *d = Py_BuildValue(
        "{s:l,s:i,s:O,s:N,s:N,s:N,s:N,s:N,s:N,s:N}", "nrows", r.n, "ncolumns", r.ncolumns, "has_shoebox",
        r.has_shoebox ? Py_True : Py_False, "panel", column_array(r.panel, r.n, 0, NPY_INT32, sizeof(int)),
        "xyzobs.px.value", column_array(r.xyz, r.n, 3, NPY_FLOAT64, sizeof(double)), "bbox",
        column_array(r.bbox, r.n, 6, NPY_INT32, sizeof(int)), "id", column_array(r.id, r.n, 0, NPY_INT32, sizeof(int)),
        "miller_index", column_array(r.hkl, r.n, 3, NPY_INT32, sizeof(int)), "flags",
        column_array(r.flags, r.n, 0, NPY_UINT64, sizeof(uint64_t)), "xyzcal.px",
        column_array(r.xyzcal, r.n, 3, NPY_FLOAT64, sizeof(double)));
    if (d != NULL) {
        const long nm = r.shoebox_offset != NULL ? r.shoebox_offset[r.n] : 0;
        PyObject *c[4] = {column_array(r.shoebox_panel, r.n, 0, NPY_INT32, sizeof(int)),
                          column_array(r.shoebox_bbox, r.n, 6, NPY_INT32, sizeof(int)),
                          column_array(r.shoebox_offset, r.n + 1, 0, NPY_LONG, sizeof(long)),
                          r.shoebox_offset == NULL ? (Py_INCREF(Py_None), Py_None)
                          : nm == 0 ? PyArray_SimpleNew(1, (npy_intp[]){0}, NPY_INT32)
                                    : column_array(r.shoebox_mask, nm, 0, NPY_INT32, sizeof(int))};
        static const char *const key[4] = {"shoebox_panel", "shoebox_bbox", "shoebox_offset", "shoebox_mask"};
        for (int k = 0; k < 4; ++k) {
            if (c[k] == NULL || PyDict_SetItemString(d, key[k], c[k]) != 0) {
                Py_CLEAR(d);
            }
            Py_XDECREF(c[k]);
        }
    }
    nbg_reflections_free(&r);
    return d;
}

/* obj as a C-contiguous int32 array of n x cols values (cols 0: n values; n < 0: any n, set), every value an
 * integer (exact_integers); NULL with a ValueError naming the argument otherwise. */
static PyArrayObject *int_column(PyObject *obj, const char *name, long *n, int cols)
{
    if (!exact_integers(obj, name, -2147483648.0, 2147483647.0)) return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_INT32, cols > 0 ? 2 : 1, cols > 0 ? 2 : 1,
                                                        NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) return NULL;
    if ((cols > 0 && PyArray_DIM(a, 1) != cols) || (*n >= 0 && PyArray_DIM(a, 0) != *n)) {
        PyObject *shape = PyObject_GetAttrString((PyObject *)a, "shape");
        if (cols > 0)
            PyErr_Format(PyExc_ValueError, "%s: expected shape (%ld, %d), got %S", name, *n, cols,
                         shape != NULL ? shape : Py_None);
        else
            PyErr_Format(PyExc_ValueError, "%s: expected shape (%ld,), got %S", name, *n,
                         shape != NULL ? shape : Py_None);
        Py_XDECREF(shape);
        Py_DECREF(a);
        return NULL;
    }
    *n = (long)PyArray_DIM(a, 0);
    return a;
}

/* obj as a C-contiguous float64 array of n x cols values (cols 0: n values) */
static PyArrayObject *real_column(PyObject *obj, const char *name, long n, int cols)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_FLOAT64, cols > 0 ? 2 : 1, cols > 0 ? 2 : 1,
                                                        NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) return NULL;
    if ((cols > 0 && PyArray_DIM(a, 1) != cols) || PyArray_DIM(a, 0) != n) {
        PyObject *shape = PyObject_GetAttrString((PyObject *)a, "shape");
        if (cols > 0)
            PyErr_Format(PyExc_ValueError, "%s: expected shape (%ld, %d), got %S", name, n, cols,
                         shape != NULL ? shape : Py_None);
        else
            PyErr_Format(PyExc_ValueError, "%s: expected shape (%ld,), got %S", name, n,
                         shape != NULL ? shape : Py_None);
        Py_XDECREF(shape);
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

/* reflection_centroids(exp, hkl (n, 3), panel (n,), x (n,), y (n,), radius) -> (cx, cy, photons):
 * nbg_reflection_centroids, as refine -centroids computes them */
static PyObject *py_reflection_centroids(PyObject *self, PyObject *args)
{
    PyObject *o, *hobj, *pobj, *xobj, *yobj;
    int radius;
    if (!PyArg_ParseTuple(args, "OOOOOi:reflection_centroids", &o, &hobj, &pobj, &xobj, &yobj, &radius)) return NULL;
    if (!exp_check(o, "reflection_centroids")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    long n = -1;
    PyArrayObject *h = int_column(hobj, "hkl", &n, 3), *pa = NULL, *xa = NULL, *ya = NULL, *cx = NULL, *cy = NULL,
                  *ph = NULL;
    PyObject *out = NULL;
    if (h == NULL || (pa = int_column(pobj, "panel", &n, 0)) == NULL || (xa = real_column(xobj, "x", n, 0)) == NULL ||
        (ya = real_column(yobj, "y", n, 0)) == NULL)
        goto done;
    npy_intp dn = (npy_intp)n;
    cx = (PyArrayObject *)PyArray_SimpleNew(1, &dn, NPY_FLOAT64);
    cy = (PyArrayObject *)PyArray_SimpleNew(1, &dn, NPY_FLOAT64);
    ph = (PyArrayObject *)PyArray_SimpleNew(1, &dn, NPY_FLOAT64);
    if (cx == NULL || cy == NULL || ph == NULL) goto done;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_reflection_centroids(x->ctx, x->e, n, PyArray_DATA(h), PyArray_DATA(pa), PyArray_DATA(xa),
                                  PyArray_DATA(ya), radius, PyArray_DATA(cx), PyArray_DATA(cy), PyArray_DATA(ph));
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) raise_ctx(x->ctx, st);
    exp_unlock(x);
    if (st == NBG_OK) out = Py_BuildValue("(OOO)", cx, cy, ph);
done:
    Py_XDECREF(h);
    Py_XDECREF(pa);
    Py_XDECREF(xa);
    Py_XDECREF(ya);
    Py_XDECREF(cx);
    Py_XDECREF(cy);
    Py_XDECREF(ph);
    return out;
}

/* The spot pixels of reflection table r's rows, as refine -spotlist FILE.refl draws them: (pixels, boxes, skipped),
 * or NULL with the context's error raised.  code < 0: nbg_reflection_boxes with half-width arg; else
 * nbg_reflection_shoebox_boxes with mask bits code and dilation arg; then nbg_spot_box_pixels. */
static PyObject *refl_box_pixels(ExperimentObject *x, const nbg_reflections *r, int code, int arg)
{
    PyObject *out = NULL;
    nbg_spot_box *boxes = NULL;
    uint32_t *list = NULL;
    long nb = 0, skipped = 0, np = 0;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = code < 0 ? nbg_reflection_boxes(x->ctx, x->e, r, arg, &boxes, &nb, &skipped)
                  : nbg_reflection_shoebox_boxes(x->ctx, x->e, r, code, arg, &boxes, &nb, &skipped);
    if (st == NBG_OK) st = nbg_spot_box_pixels(x->ctx, x->e, boxes, nb, &list, &np);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) raise_ctx(x->ctx, st);
    exp_unlock(x);
    if (st == NBG_OK) {
        npy_intp dn = (npy_intp)np;
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &dn, NPY_UINT32);
        if (a != NULL && np > 0) memcpy(PyArray_DATA(a), list, (size_t)np * sizeof(uint32_t));
        if (a != NULL) out = Py_BuildValue("(Nll)", a, nb, skipped);
    }
    free(boxes);
    free(list);
    return out;
}

/* refl_spot_pixels(exp, panel (n,), xyz (n, 3), bbox (n, 6) or None, id (n,) or None, half) -> (pixels, boxes,
 * skipped): nbg_reflection_boxes (half < 0: the bounding boxes) and nbg_spot_box_pixels, as refine -spotlist
 * FILE.refl draws the spot regions */
static PyObject *py_refl_spot_pixels(PyObject *self, PyObject *args)
{
    PyObject *o, *pobj, *xobj, *bobj, *iobj;
    int half;
    if (!PyArg_ParseTuple(args, "OOOOOi:refl_spot_pixels", &o, &pobj, &xobj, &bobj, &iobj, &half)) return NULL;
    if (!exp_check(o, "spot_pixels")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    long n = -1;
    PyArrayObject *pa = int_column(pobj, "panel", &n, 0), *xa = NULL, *ba = NULL, *ia = NULL;
    PyObject *out = NULL;
    if (pa == NULL || (xa = real_column(xobj, "xyzobs.px.value", n, 3)) == NULL ||
        (bobj != Py_None && (ba = int_column(bobj, "bbox", &n, 6)) == NULL) ||
        (iobj != Py_None && (ia = int_column(iobj, "id", &n, 0)) == NULL))
        goto done;
    nbg_reflections r;
    memset(&r, 0, sizeof r);
    r.n = n;
    r.panel = PyArray_DATA(pa);
    r.xyz = PyArray_DATA(xa);
    r.bbox = ba != NULL ? PyArray_DATA(ba) : NULL;
    r.id = ia != NULL ? PyArray_DATA(ia) : NULL;
    out = refl_box_pixels(x, &r, -1, half);
done:
    Py_XDECREF(pa);
    Py_XDECREF(xa);
    Py_XDECREF(ba);
    Py_XDECREF(ia);
    return out;
}

/* refl_shoebox_pixels(exp, id (n,) or None, shoebox_panel (n,), shoebox_bbox (n, 6), shoebox_offset (n + 1,),
 * shoebox_mask, code, dilate) -> (pixels, boxes, skipped): nbg_reflection_shoebox_boxes and nbg_spot_box_pixels, as
 * refine -spotlist FILE.refl -spot_shoebox N draws the spot regions.  The arrays are checked against each other
 * first (offsets from 0, each row's mask empty or its box's volume, the last offset the mask's length). */
static PyObject *py_refl_shoebox_pixels(PyObject *self, PyObject *args)
{
    PyObject *o, *iobj, *pobj, *bobj, *fobj, *mobj;
    int code, dilate;
    if (!PyArg_ParseTuple(args, "OOOOOOii:refl_shoebox_pixels", &o, &iobj, &pobj, &bobj, &fobj, &mobj, &code,
                          &dilate))
        return NULL;
    if (!exp_check(o, "spot_pixels")) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    long n = -1, nm = -1;
    PyArrayObject *pa = int_column(pobj, "shoebox_panel", &n, 0), *ba = NULL, *ia = NULL, *fa = NULL, *ma = NULL;
    PyObject *out = NULL;
    if (pa == NULL || (ba = int_column(bobj, "shoebox_bbox", &n, 6)) == NULL ||
        (iobj != Py_None && (ia = int_column(iobj, "id", &n, 0)) == NULL) ||
        (ma = int_column(mobj, "shoebox_mask", &nm, 0)) == NULL)
        goto done;
    fa = (PyArrayObject *)PyArray_FROMANY(fobj, NPY_LONG, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (fa == NULL) goto done;
    if (PyArray_DIM(fa, 0) != n + 1) {
        PyErr_Format(PyExc_ValueError, "shoebox_offset: expected %ld offsets (one more than the rows), got %ld", n + 1,
                     (long)PyArray_DIM(fa, 0));
        goto done;
    }
    const long *off = PyArray_DATA(fa);
    const int *bb = PyArray_DATA(ba);
    for (long t = 0; t < n; ++t) {
        const long vol = off[t + 1] - off[t];
        const int *b = bb + 6 * t;
        if ((t == 0 && off[0] != 0) || b[1] < b[0] || b[3] < b[2] || b[5] < b[4] ||
            (vol != 0 && vol != ((long)b[1] - b[0]) * ((long)b[3] - b[2]) * ((long)b[5] - b[4]))) {
            PyErr_Format(PyExc_ValueError, "shoebox row %ld: its mask (offsets %ld to %ld) does not fill its box "
                         "(%d %d %d %d %d %d), or the box is reversed", t, off[t], off[t + 1], b[0], b[1], b[2], b[3],
                         b[4], b[5]);
            goto done;
        }
    }
    if (off[n] != nm || (n == 0 && off[0] != 0)) {
        PyErr_Format(PyExc_ValueError, "shoebox_offset: the last offset is %ld, the mask holds %ld values", off[n], nm);
        goto done;
    }
    nbg_reflections r;
    memset(&r, 0, sizeof r);
    r.n = n;
    r.id = ia != NULL ? PyArray_DATA(ia) : NULL;
    r.shoebox_panel = PyArray_DATA(pa);
    r.shoebox_bbox = PyArray_DATA(ba);
    r.shoebox_offset = (long *)off;
    r.shoebox_mask = PyArray_DATA(ma);
    out = refl_box_pixels(x, &r, code, dilate);
done:
    Py_XDECREF(pa);
    Py_XDECREF(ba);
    Py_XDECREF(ia);
    Py_XDECREF(fa);
    Py_XDECREF(ma);
    return out;
}

static PyObject *py_read_expt(PyObject *self, PyObject *args)
{
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&:read_expt", PyUnicode_FSConverter, &path)) return NULL;
    nbg_geometry g;
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_read_expt(ctx, p, &g));
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    return geometry_dict(&g);
}

static PyObject *py_write_expt(PyObject *self, PyObject *args)
{
    PyObject *path, *gobj;
    const char *images = "";
    if (!PyArg_ParseTuple(args, "O&O|s:write_expt", PyUnicode_FSConverter, &path, &gobj, &images)) return NULL;
    nbg_geometry g;
    if (!geometry_from_dict(gobj, &g)) {
        Py_DECREF(path);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_write_expt(ctx, p, &g, images));
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    Py_RETURN_NONE;
}

/* write_nxmx(path, geometry, frames (n, slow, fast) float32 or int32, mask) */
static PyObject *py_write_nxmx(PyObject *self, PyObject *args)
{
    PyObject *path, *gobj, *fobj, *mobj;
    if (!PyArg_ParseTuple(args, "O&OOO:write_nxmx", PyUnicode_FSConverter, &path, &gobj, &fobj, &mobj)) return NULL;
    nbg_geometry g;
    PyArrayObject *a = NULL, *m = NULL;
    PyObject *out = NULL;
    if (!geometry_from_dict(gobj, &g)) goto done;
    nbg_geometry_beam_to_minus_z(&g, NULL, 0); /* NXmx holds a beam along -z: the program's -nxsfile turns it too */
    /* integers stay integers (counts); anything else is written as float32 */
    const int isint = PyArray_Check(fobj) && PyArray_ISINTEGER((PyArrayObject *)fobj);
    a = (PyArrayObject *)PyArray_FROM_OTF(fobj, isint ? NPY_INT32 : NPY_FLOAT32,
                                          NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) goto done;
    const npy_intp npix = (npy_intp)g.fpixels * g.spixels;
    if (npix <= 0 || PyArray_SIZE(a) == 0 || PyArray_SIZE(a) % npix != 0 ||
        (PyArray_NDIM(a) >= 2 && (PyArray_DIM(a, PyArray_NDIM(a) - 1) != g.fpixels ||
                                  PyArray_DIM(a, PyArray_NDIM(a) - 2) != g.spixels))) {
        PyErr_Format(PyExc_ValueError, "frames: expected shape (nframes, %d, %d)", g.spixels, g.fpixels);
        goto done;
    }
    if (mobj != Py_None) {
        m = as_image(mobj, "mask", NPY_UINT8, g.spixels, g.fpixels, (size_t)npix);
        if (m == NULL) goto done;
    }
    const int nframes = (int)(PyArray_SIZE(a) / npix);
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_write_nxmx(ctx, p, &g, isint ? NBG_DATA_INT32 : NBG_DATA_FLOAT32, PyArray_DATA(a), nframes,
                             m != NULL ? PyArray_DATA(m) : NULL));
    if (st == NBG_OK) out = Py_NewRef(Py_None);
done:
    Py_DECREF(path);
    Py_XDECREF(a);
    Py_XDECREF(m);
    return out;
}

/* write_cbf(path, geometry, data int32 (slow, fast), frame) */
static PyObject *py_write_cbf(PyObject *self, PyObject *args)
{
    PyObject *path, *gobj, *dobj;
    int frame = 0;
    if (!PyArg_ParseTuple(args, "O&OO|i:write_cbf", PyUnicode_FSConverter, &path, &gobj, &dobj, &frame)) return NULL;
    nbg_geometry g;
    PyArrayObject *a = NULL;
    PyObject *out = NULL;
    if (!geometry_from_dict(gobj, &g)) goto done;
    if (!exact_integers(dobj, "data", -2147483648.0, 2147483647.0)) goto done;
    a = as_image(dobj, "data", NPY_INT32, g.spixels, g.fpixels, (size_t)g.fpixels * g.spixels);
    if (a == NULL) goto done;
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_write_cbf(ctx, p, &g, frame, PyArray_DATA(a)));
    if (st == NBG_OK) out = Py_NewRef(Py_None);
done:
    Py_DECREF(path);
    Py_XDECREF(a);
    return out;
}

/* The builder's flag table (nbg_flag_info), for the keyword check: a list of (names, arg, help), names a list of
 * the flag's names (the main one first, then its aliases), arg the names of its values (None: a switch). */
static PyObject *py_flag_table(PyObject *self, PyObject *unused)
{
    PyObject *l = PyList_New(0);
    const char *names, *arg, *help;
    for (int i = 0; l != NULL && nbg_flag_info(i, &names, &arg, &help) == NBG_OK; ++i) {
        PyObject *ns = PyUnicode_FromString(names), *nl = ns != NULL ? PyUnicode_Split(ns, NULL, -1) : NULL;
        PyObject *t = nl != NULL ? Py_BuildValue("(Nzs)", nl, arg, help) : NULL;
        Py_XDECREF(ns);
        if (t == NULL || PyList_Append(l, t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(l);
            break;
        }
        Py_DECREF(t);
    }
    return l;
}

/* The table of scalar parameters (nbg_param_info), ids 0 .. NBG_NPARAMS-1: a list of dicts. */
static PyObject *py_param_info(PyObject *self, PyObject *unused)
{
    PyObject *l = PyList_New(NBG_NPARAMS);
    for (int p = 0; l != NULL && p < NBG_NPARAMS; ++p) {
        nbg_param_info in;
        if (nbg_param_info_get((nbg_param)p, &in) != NBG_OK) {
            Py_DECREF(l);
            return PyErr_Format(PyExc_RuntimeError, "nbg_param_info_get(%d) failed", p);
        }
        PyObject *groups = PyUnicode_FromString(in.groups), *gl = NULL, *d = NULL;
        if (groups != NULL) gl = PyUnicode_Split(groups, NULL, -1);
        Py_XDECREF(groups);
        if (gl != NULL) {
            d = Py_BuildValue("{s:s,s:s,s:s,s:s,s:N,s:s,s:d,s:d,s:O,s:d,s:d}", "name", in.name, "alias", in.alias,
                              "unit", in.unit, "flag", in.flag, "groups", gl, "help", in.help, "lo", in.lo, "hi",
                              in.hi, "optional", in.optional ? Py_True : Py_False, "bound_lo", in.bound_lo,
                              "bound_hi", in.bound_hi);
        }
        if (d == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, p, d);
    }
    return l;
}

/* The parameter groups a list may name (nbg_param_groups): a list of str. */
static PyObject *py_param_groups(PyObject *self, PyObject *unused)
{
    PyObject *s = PyUnicode_FromString(nbg_param_groups());
    if (s == NULL) return NULL;
    PyObject *l = PyUnicode_Split(s, NULL, -1);
    Py_DECREF(s);
    return l;
}

static PyObject *py_param_names(PyObject *self, PyObject *unused)
{
    PyObject *l = PyList_New(NBG_NPARAMS);
    for (int p = 0; l != NULL && p < NBG_NPARAMS; ++p) {
        PyList_SET_ITEM(l, p, PyUnicode_FromString(nbg_param_name((nbg_param)p)));
    }
    return l;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Shot lists, batch and ensemble                                                                              */
/* ---------------------------------------------------------------------------------------------------------- */

/* A shot list read by the library (nbg_shots_read), immutable: ShotList(path). */
typedef struct {
    PyObject_HEAD
    nbg_shot_list l;
} ShotListObject;

static PyTypeObject ShotListType;

static void ShotList_dealloc(ShotListObject *s)
{
    nbg_shots_free(&s->l);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int ShotList_init(ShotListObject *s, PyObject *args, PyObject *kw)
{
    PyObject *path;
    static char *kwlist[] = {"path", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:ShotList", kwlist, PyUnicode_FSConverter, &path)) return -1;
    nbg_shots_free(&s->l);
    nbg_shot_list l = {0};
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_shots_read(ctx, p, &l));
    Py_DECREF(path);
    if (st != NBG_OK) return -1;
    s->l = l;
    return 0;
}

static Py_ssize_t ShotList_len(ShotListObject *s) { return s->l.n; }

/* shot i as a dict of the keys its line gave (and "line") */
static PyObject *ShotList_item(ShotListObject *s, Py_ssize_t i)
{
    if (i < 0 || i >= s->l.n) {
        PyErr_SetString(PyExc_IndexError, "shot index out of range");
        return NULL;
    }
    const nbg_shot *h = &s->l.v[i];
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    SET(d, "id", PyUnicode_FromString(h->id));
    if (h->has & NBG_SHOT_MISSET) SET(d, "misset", vec(h->misset, 3));
    if (h->has & NBG_SHOT_ORIENT) SET(d, "orient", vec(h->orient, 3));
    if (h->has & NBG_SHOT_A) SET(d, "A", vec(h->A, 9));
    if (h->has & NBG_SHOT_CELL) SET(d, "cell", vec(h->cell, 6));
    if (h->has & NBG_SHOT_N) SET(d, "N", vec(h->N, 3));
    if (h->has & NBG_SHOT_MOSAIC) SET(d, "mosaic", PyFloat_FromDouble(h->mosaic));
    if (h->has & NBG_SHOT_DOMAINS) SET(d, "mosaic_domains", PyLong_FromLong(h->mosaic_domains));
    if (h->has & NBG_SHOT_LAMBDA) SET(d, "lambda", PyFloat_FromDouble(h->lambda));
    if (h->has & NBG_SHOT_PHI) SET(d, "phi", PyFloat_FromDouble(h->phi));
    if (h->has & NBG_SHOT_FLUENCE) SET(d, "fluence", PyFloat_FromDouble(h->fluence));
    if (h->has & NBG_SHOT_SCALE) SET(d, "scale", PyFloat_FromDouble(h->scale));
    if (h->has & NBG_SHOT_SEED) SET(d, "seed", PyLong_FromLong(h->seed));
    if (h->has & NBG_SHOT_SOURCE) SET(d, "sourcefile", PyUnicode_FromString(h->sourcefile));
    if (h->has & NBG_SHOT_EXPT) SET(d, "expt", PyUnicode_FromString(h->expt));
    if (h->has & NBG_SHOT_SPECTRUM_SHIFT) SET(d, "spectrum_shift", PyFloat_FromDouble(h->spectrum_shift));
    if (h->has & NBG_SHOT_SPECTRUM_SCALE) SET(d, "spectrum_scale", PyFloat_FromDouble(h->spectrum_scale));
    SET(d, "line", PyLong_FromLong(h->line));
    return d;
}

static PyObject *ShotList_get_ids(ShotListObject *s, void *closure)
{
    PyObject *t = PyTuple_New(s->l.n);
    for (int i = 0; t != NULL && i < s->l.n; ++i) {
        PyObject *id = PyUnicode_FromString(s->l.v[i].id);
        if (id == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, id);
    }
    return t;
}

static PyObject *ShotList_get_path(ShotListObject *s, void *closure)
{
    return PyUnicode_DecodeFSDefault(s->l.path != NULL ? s->l.path : "");
}

static PySequenceMethods ShotList_seq = {.sq_length = (lenfunc)ShotList_len, .sq_item = (ssizeargfunc)ShotList_item};

static PyGetSetDef ShotList_getset[] = {
    {"ids", (getter)ShotList_get_ids, NULL, "the shots' ids, in the list's order", NULL},
    {"path", (getter)ShotList_get_path, NULL, "the file read", NULL},
    {NULL}};

static PyTypeObject ShotListType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "nbgrad.ShotList",
    .tp_basicsize = sizeof(ShotListObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "ShotList(path): a shot list (JSON lines) read by the library (nbg_shots_read).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ShotList_init,
    .tp_dealloc = (destructor)ShotList_dealloc,
    .tp_as_sequence = &ShotList_seq,
    .tp_getset = ShotList_getset,
};

static int shots_check(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &ShotListType)) {
        PyErr_Format(PyExc_TypeError, "expected an nbgrad.ShotList, got %.100s", Py_TYPE(o)->tp_name);
        return 0;
    }
    if (((ShotListObject *)o)->l.n == 0) {
        PyErr_SetString(PyExc_ValueError, "the ShotList was not initialised");
        return 0;
    }
    return 1;
}

/* make_shots(path, n, seed, cell or None, cell_jitter, N, N_jitter, scale_jitter): nbg_shots_make */
static PyObject *py_make_shots(PyObject *self, PyObject *args)
{
    PyObject *path, *cell;
    nbg_shots_make_options o;
    nbg_shots_make_options_default(&o);
    if (!PyArg_ParseTuple(args, "O&llOdddd:make_shots", PyUnicode_FSConverter, &path, &o.n, &o.seed, &cell,
                          &o.cell_jitter, &o.N, &o.N_jitter, &o.scale_jitter))
        return NULL;
    if (cell != Py_None) {
        PyObject *fast = PySequence_Fast(cell, "cell must be 6 numbers");
        if (fast == NULL || PySequence_Fast_GET_SIZE(fast) != 6) {
            if (fast != NULL) PyErr_SetString(PyExc_ValueError, "cell must be 6 numbers (a b c alpha beta gamma)");
            Py_XDECREF(fast);
            Py_DECREF(path);
            return NULL;
        }
        for (int k = 0; k < 6; ++k) {
            o.cell[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, k));
        }
        Py_DECREF(fast);
        if (PyErr_Occurred()) {
            Py_DECREF(path);
            return NULL;
        }
        o.have_cell = 1;
    }
    const char *p = PyBytes_AS_STRING(path);
    FILE_CALL(nbg_shots_make(ctx, &o, p));
    Py_DECREF(path);
    if (st != NBG_OK) return NULL;
    Py_RETURN_NONE;
}

/* batch_shot(exp, shots, i, base_seed, want_image, floatfile, noisefile, smv_adc) -> dict: shot i rendered
 * (nbg_shot_experiment_make, nbg_simulate) as nbgrad batch renders it, its raw floats and its noise image (SMV,
 * nbg_noise_image with the shot's seed and the builder's -adc) written where a name is given (None: not). */
static PyObject *py_batch_shot(PyObject *self, PyObject *args)
{
    PyObject *o, *so, *fpath, *npath;
    int i, want_image, smv_adc;
    long base_seed;
    if (!PyArg_ParseTuple(args, "OOilpOOp:batch_shot", &o, &so, &i, &base_seed, &want_image, &fpath, &npath, &smv_adc))
        return NULL;
    if (!exp_check(o, "batch") || !shots_check(so)) return NULL;
    ExperimentObject *x = (ExperimentObject *)o;
    const nbg_shot_list *l = &((ShotListObject *)so)->l;
    if (i < 0 || i >= l->n) return PyErr_Format(PyExc_IndexError, "shot %d: the list has %d", i, l->n);
    PyObject *fb = NULL, *nb = NULL;
    if ((fpath != Py_None && !PyUnicode_FSConverter(fpath, &fb)) || (npath != Py_None && !PyUnicode_FSConverter(npath, &nb))) {
        Py_XDECREF(fb);
        return NULL;
    }
    const char *ff = fb != NULL ? PyBytes_AS_STRING(fb) : NULL, *nf = nb != NULL ? PyBytes_AS_STRING(nb) : NULL;
    nbg_shot_experiment se;
    nbg_report r;
    float *img = NULL;
    uint16_t *noise = NULL;
    long photons = 0, overloads = 0;
    int st, nopanels_noise = 0;
    exp_lock(x);
    const double adc = nbg_builder_adc(x->b);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_shot_experiment_make(x->ctx, x->b, l, i, base_seed, &se);
    if (st == NBG_OK) {
        img = malloc(sizeof(float) * (se.npix ? se.npix : 1));
        st = img == NULL ? NBG_ENOMEM : nbg_simulate(x->ctx, &se.e, img, se.npix, &r);
    }
    if (st == NBG_OK && ff != NULL) {
        st = nbg_write_float(x->ctx, ff, img, se.npix);
    }
    if (st == NBG_OK && nf != NULL) {
        if (se.e.npanels > 0) {
            nopanels_noise = 1;
        } else if ((noise = malloc(sizeof(uint16_t) * se.npix)) == NULL) {
            st = NBG_ENOMEM;
        } else if ((st = nbg_noise_image(x->ctx, img, r.fpixels, r.spixels, se.e.roi, adc, se.seed, noise, &photons,
                                         &overloads)) == NBG_OK) {
            nbg_smv_header h;
            nbg_smv_header_from_report(&r, &h);
            h.has_adc_offset = smv_adc;
            h.adc_offset = adc;
            st = nbg_write_smv(x->ctx, nf, &h, noise);
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
    } else if (nopanels_noise) {
        PyErr_SetString(PyExc_NotImplementedError, "batch: noisefile with panels: use the program (nbgrad batch)");
    } else {
        PyObject *image = Py_None;
        Py_INCREF(image);
        if (want_image) {
            const int panels = se.e.npanels > 0;
            npy_intp dims[2] = {panels ? 1 : r.spixels, panels ? (npy_intp)se.npix : r.fpixels};
            Py_DECREF(image);
            image = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
            if (image != NULL) memcpy(PyArray_DATA((PyArrayObject *)image), img, sizeof(float) * se.npix);
        }
        if (image != NULL) {
            out = Py_BuildValue("{s:s,s:N,s:l,s:s,s:l,s:l}", "id", l->v[i].id, "image", image, "seed", se.seed,
                                "warning", se.warning, "photons", photons, "overloads", overloads);
        }
    }
    exp_unlock(x);
    nbg_shot_experiment_free(&se);
    free(img);
    free(noise);
    Py_XDECREF(fb);
    Py_XDECREF(nb);
    return out;
}

/* The ensemble's progress: like refine's, the GIL taken for the Python callable, an exception kept. */
static void ensemble_progress(void *user, nbg_ensemble_event what, int done, int total, const char *text)
{
    progress_ctx *p = user;
    static const char *const names[] = {"info", "warning", "cycle", "shot"};
    PyGILState_STATE gs = PyGILState_Ensure();
    if (p->exc_type == NULL) {
        PyObject *r = PyObject_CallFunction(p->fn, "siis", names[(int)what & 3], done, total, text);
        if (r == NULL) {
            PyErr_Fetch(&p->exc_type, &p->exc_value, &p->exc_tb);
        }
        Py_XDECREF(r);
    }
    PyGILState_Release(gs);
}

static PyObject *param_list_labels(const ExperimentObject *x, const nbg_param *p, int n)
{
    PyObject *names = PyList_New(n);
    for (int j = 0; names != NULL && j < n; ++j) {
        PyObject *s = param_label(x, p[j]);
        if (s == NULL) {
            Py_CLEAR(names);
            break;
        }
        PyList_SET_ITEM(names, j, s);
    }
    return names;
}

/* ensemble(exp, shots, observed, global, local, cycles, loss, spots, spot_frac, progress) -> dict (nbg_ensemble) */
static PyObject *py_ensemble(PyObject *self, PyObject *args)
{
    PyObject *o, *so, *progress, *lists[3] = {Py_None, Py_None, Py_None};
    const char *observed, *global, *local;
    nbg_ensemble_options opt;
    nbg_ensemble_options_default(&opt);
    nbg_observed_options resp;
    nbg_observed_options_default(&resp);
    int loss;
    if (!PyArg_ParseTuple(args, "OOsssiiidO|dddOOO:ensemble", &o, &so, &observed, &global, &local, &opt.cycles,
                          &loss, &opt.spots, &opt.spot_frac, &progress, &resp.pedestal, &resp.gain, &resp.read_noise,
                          &lists[0], &lists[1], &lists[2]))
        return NULL;
    if (!exp_check(o, "ensemble") || !shots_check(so)) return NULL;
    PyArrayObject *arr[3];
    if (!response_lists("ensemble", lists, &resp, arr)) return NULL;
    opt.response = &resp;
    ExperimentObject *x = (ExperimentObject *)o;
    const nbg_shot_list *l = &((ShotListObject *)so)->l;
    opt.observed = observed;
    opt.global = global;
    opt.local = local;
    opt.loss = (nbg_loss)loss;
    progress_ctx pc = {progress, NULL, NULL, NULL};
    if (progress != Py_None) {
        opt.progress = ensemble_progress;
        opt.user = &pc;
    }
    nbg_ensemble_result res;
    memset(&res, 0, sizeof res);
    PyObject *out = NULL, *gnames = NULL, *lnames = NULL;
    int st;
    exp_lock(x);
    Py_BEGIN_ALLOW_THREADS
    st = nbg_ensemble(x->ctx, x->b, l, &opt, &res);
    Py_END_ALLOW_THREADS
    if (st != NBG_OK) {
        raise_ctx(x->ctx, st);
    } else {
        gnames = param_list_labels(x, res.globals, res.nglobals);
        lnames = param_list_labels(x, res.locals, res.nlocals);
    }
    exp_unlock(x);
    if (st != NBG_OK || gnames == NULL || lnames == NULL) goto done;
    if (pc.exc_type != NULL) {
        PyErr_Restore(pc.exc_type, pc.exc_value, pc.exc_tb);
        pc.exc_type = pc.exc_value = pc.exc_tb = NULL;
        goto done;
    }
    npy_intp dF = (npy_intp)res.nF, dl[2] = {res.nshots, res.nlocals};
    PyArrayObject *F = (PyArrayObject *)PyArray_SimpleNew(1, &dF, NPY_FLOAT64);
    PyArrayObject *Fs = (PyArrayObject *)PyArray_SimpleNew(1, &dF, NPY_FLOAT64);
    PyArrayObject *lv = (PyArrayObject *)PyArray_SimpleNew(2, dl, NPY_FLOAT64);
    if (F == NULL || Fs == NULL || lv == NULL) {
        Py_XDECREF(F), Py_XDECREF(Fs), Py_XDECREF(lv);
        goto done;
    }
    if (res.nF > 0) {
        memcpy(PyArray_DATA(F), res.F, sizeof(double) * res.nF);
        memcpy(PyArray_DATA(Fs), res.F_sigma, sizeof(double) * res.nF);
    }
    if (res.nshots > 0 && res.nlocals > 0) {
        memcpy(PyArray_DATA(lv), res.local_value, sizeof(double) * (size_t)res.nshots * res.nlocals);
    }
    out = Py_BuildValue("{s:i,s:d,s:d,s:O,s:N,s:N,s:O,s:N,s:N,s:O,s:N,s:i,s:l,s:l,s:l,s:l,s:l}", "shots", res.nshots,
                        "start_loss", res.start_loss, "loss", res.loss, "global_params", gnames, "global_value",
                        vec(res.global_value, res.nglobals), "global_sigma", vec(res.global_sigma, res.nglobals),
                        "has_F", res.has_F ? Py_True : Py_False, "F", F, "F_sigma", Fs, "local_params", lnames,
                        "local_value", lv, "local_not_converged", res.local_not_converged, "F_measured",
                        res.F_measured, "evaluations", res.evaluations, "spot_pixels", res.spot_pixels, "spot_total",
                        res.spot_total, "spot_whole", res.spot_whole);
done:
    for (int k = 0; k < 3; ++k) Py_XDECREF(arr[k]);
    Py_XDECREF(gnames);
    Py_XDECREF(lnames);
    Py_XDECREF(pc.exc_type);
    Py_XDECREF(pc.exc_value);
    Py_XDECREF(pc.exc_tb);
    nbg_ensemble_result_free(&res);
    return out;
}

static PyMethodDef module_methods[] = {
    {"simulate", py_simulate, METH_VARARGS, "simulate(exp, report=False, out=None) -> image"},
    {"_time_simulate", py_time_simulate, METH_VARARGS, "seconds of n library calls (benchmark)"},
    {"grad", py_grad, METH_VARARGS, "grad(exp, dLdI, params) -> (dict, image)"},
    {"loss_grad", py_loss_grad, METH_VARARGS, "loss_grad(exp, observed, weights, loss, params) -> (L, dict, image)"},
    {"jvp", py_jvp, METH_VARARGS, "jvp(exp, params) -> (tangents, image)"},
    {"_tangents", py_tangents, METH_VARARGS, "_tangents(exp, params, double) -> (tangents, image) (nbgrad.torch)"},
    {"refine", py_refine, METH_VARARGS, "refine(...) -> dict"},
    {"gradcheck", py_gradcheck, METH_VARARGS, "gradcheck(exp, params, rtol, h_scale) -> list of dicts"},
    {"read_hkl", py_read_hkl, METH_VARARGS, "read_hkl(path, default_F=0, fdump=False) -> (F, origin, nrefl)"},
    {"write_fdump", py_write_fdump, METH_VARARGS, "write_fdump(path, F, origin)"},
    {"write_smv", py_write_smv, METH_VARARGS, "write_smv(path, header, data)"},
    {"read_smv", py_read_smv, METH_VARARGS, "read_smv(path) -> (data, header)"},
    {"write_float", py_write_float, METH_VARARGS, "write_float(path, image)"},
    {"write_pgm", py_write_pgm, METH_VARARGS, "write_pgm(path, image, scale)"},
    {"int_image", py_int_image, METH_VARARGS, "int_image(image, scale, adc, roi) -> uint16 image"},
    {"noise_image", py_noise_image, METH_VARARGS, "noise_image(image, seed, adc, roi) -> (image, photons, overloads)"},
    {"read_image", py_read_image, METH_VARARGS,
     "read_image(path, frame, expect_npix) -> (image, geom, complete, mask)"},
    {"spot_pixels", py_spot_pixels, METH_VARARGS,
     "spot_pixels(exp, image, half, frac, mask, centres) -> uint32 array of flat pixel indices"},
    {"read_observed", py_read_observed, METH_VARARGS,
     "read_observed(exp, path, frame, pedestal, gain, read_noise, adc) -> (image, use, info)"},
    {"read_refl", py_read_refl, METH_VARARGS, "read_refl(path) -> dict of a DIALS reflection table's columns"},
    {"reflection_centroids", py_reflection_centroids, METH_VARARGS,
     "reflection_centroids(exp, hkl, panel, x, y, radius) -> (cx, cy, photons)"},
    {"refl_spot_pixels", py_refl_spot_pixels, METH_VARARGS,
     "refl_spot_pixels(exp, panel, xyz, bbox, id, half) -> (pixels, boxes, skipped)"},
    {"refl_shoebox_pixels", py_refl_shoebox_pixels, METH_VARARGS,
     "refl_shoebox_pixels(exp, id, shoebox_panel, shoebox_bbox, shoebox_offset, shoebox_mask, code, dilate) -> "
     "(pixels, boxes, skipped)"},
    {"read_expt", py_read_expt, METH_VARARGS, "read_expt(path) -> geometry dict"},
    {"write_expt", py_write_expt, METH_VARARGS, "write_expt(path, geometry, images='')"},
    {"write_nxmx", py_write_nxmx, METH_VARARGS, "write_nxmx(path, geometry, frames, mask)"},
    {"write_cbf", py_write_cbf, METH_VARARGS, "write_cbf(path, geometry, data, frame=0)"},
    {"flag_table", py_flag_table, METH_NOARGS, "the flag table: (names, arg, help) per flag"},
    {"param_names", py_param_names, METH_NOARGS, "the differentiable parameters' names"},
    {"param_info", py_param_info, METH_NOARGS, "the table of scalar parameters (nbg_param_info): a list of dicts"},
    {"param_groups", py_param_groups, METH_NOARGS, "the parameter groups a list may name (nbg_param_groups)"},
    {"make_shots", py_make_shots, METH_VARARGS,
     "make_shots(path, n, seed, cell, cell_jitter, N, N_jitter, scale_jitter): a shot list written (nbg_shots_make)"},
    {"batch_shot", py_batch_shot, METH_VARARGS,
     "batch_shot(exp, shots, i, base_seed, want_image, floatfile, noisefile, smv_adc) -> dict (one shot of a batch)"},
    {"ensemble", py_ensemble, METH_VARARGS,
     "ensemble(exp, shots, observed, global, local, cycles, loss, spots, spot_frac, progress) -> dict (nbg_ensemble)"},
    {NULL}};

/* The module's name: _nbgrad, or another for a second build of the same source against a library compiled for
 * other CPUs (python/setup.py builds _nbgrad_v3 with -DNBG_PY_MODULE=_nbgrad_v3; nbgrad/_cpu.py picks one). */
#ifndef NBG_PY_MODULE
#define NBG_PY_MODULE _nbgrad
#endif
#define NBG_STR2(x) #x
#define NBG_STR(x) NBG_STR2(x)
#define NBG_CAT2(a, b) a##b
#define NBG_CAT(a, b) NBG_CAT2(a, b)
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "nbgrad." NBG_STR(NBG_PY_MODULE), "libnbgrad's calls.", -1,
                                    module_methods};

static PyObject *new_error(PyObject *m, const char *name, PyObject *bases, const char *doc)
{
    char full[64];
    snprintf(full, sizeof full, "nbgrad.%s", name);
    PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    Py_DECREF(bases);
    if (e != NULL && PyModule_AddObjectRef(m, name, e) < 0) {
        Py_CLEAR(e);
    }
    return e;
}

PyMODINIT_FUNC NBG_CAT(PyInit_, NBG_PY_MODULE)(void)
{
    import_array();
    if (PyType_Ready(&ExperimentType) < 0) return NULL;
    if (PyType_Ready(&ShotListType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Experiment", (PyObject *)&ExperimentType) < 0) goto fail;
    if (PyModule_AddObjectRef(m, "ShotList", (PyObject *)&ShotListType) < 0) goto fail;
    Error = new_error(m, "Error", Py_BuildValue("(O)", PyExc_RuntimeError), "A library call failed (nbg_errmsg).");
    if (Error == NULL) goto fail;
    InvalidError = new_error(m, "InvalidError", Py_BuildValue("(OO)", Error, PyExc_ValueError),
                             "An invalid argument or experiment (NBG_EINVAL).");
    MemError = new_error(m, "LimitError", Py_BuildValue("(OO)", Error, PyExc_MemoryError),
                         "An allocation failed or went over the context's limits (NBG_ENOMEM).");
    FileError = new_error(m, "FileError", Py_BuildValue("(OO)", Error, PyExc_OSError),
                          "A file could not be opened, read or written (NBG_EIO).");
    FormatError = new_error(m, "FormatError", Py_BuildValue("(OO)", Error, PyExc_ValueError),
                            "A file's content is malformed (NBG_EFORMAT).");
    UnsupportedError = new_error(m, "UnsupportedError", Py_BuildValue("(OO)", Error, PyExc_NotImplementedError),
                                 "Not supported by this backend or build (NBG_EUNSUP).");
    DeviceError = new_error(m, "DeviceError", Py_BuildValue("(O)", Error), "No GPU, or a CUDA call failed.");
    if (!InvalidError || !MemError || !FileError || !FormatError || !UnsupportedError || !DeviceError) goto fail;
    PyModule_AddStringConstant(m, "LIBRARY_VERSION", NBG_VERSION);
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
