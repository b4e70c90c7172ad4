/* The compiled half of fr_pickle_scan in C, built when distdoctor is installed (where a C compiler is found; the
 * build is optional, the wheels carry it): run() executes a pickle's opcodes into a node table, entry_codes()
 * gives every value under the entries an id and groups the entries (tests/doctor/test_fr_pickle_scan.py checks
 * it against the unpickler's path). Every index is checked against its array's length: a caller's mistake or
 * a hostile file gives FAIL, never a read or write out of bounds. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FAIL (-1)
enum { NONE, FALSE_, TRUE_, INT, BIG, FLOAT, STR, LIST, TUPLE, DICT };  /* node kinds; node 0: a missing key's None */
enum { INT_OK, INT_NONE, INT_OTHER };  /* fr_coded's: how an entry's integer field was written */

#include "_fr_pickle_run.h"

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h;
}

typedef struct {
    const uint8_t *buf; int64_t n_buf;
    const int8_t *kinds; const int64_t *ival, *ival2, *head, *child, *nxt; int64_t n_nodes, n_edges;
    const uint8_t *names; int64_t name_stride; const int64_t *name_len; int64_t n_fields, n_shared;
    int64_t *vid, *table, *rep, *n_ids, *todo, *key_field; int64_t n_table, n_todo;
    int64_t *fields; int64_t n_entries; int64_t *row_table; int64_t n_row_table; int64_t *row_ids, *row_first;
    int64_t *codes, *frames_id, *ints; int8_t *int_state;
} Codes;

static int64_t field_of(const Codes *c, int64_t key) {  /* which of `names` the key node spells, -1 if none */
    if (c->kinds[key] != STR) return -1;
    int64_t s = c->ival[key], e = c->ival2[key];
    if (s < 0 || s > e || e > c->n_buf) return -1;
    for (int64_t f = 0; f < c->n_fields; f++)
        if (c->name_len[f] == e - s && memcmp(c->buf + s, c->names + f * c->name_stride, (size_t)(e - s)) == 0)
            return f;
    return -1;
}

/* One value's id, its items' first (iteratively: a dump may nest deeply); FAIL for a value that contains itself. */
static int64_t value_id(const Codes *c, int64_t root) {
    if (root < 0 || root >= c->n_nodes) return FAIL;
    if (c->vid[root] >= 0) return c->vid[root];
    int64_t top = 1, mask = c->n_table - 1;
    c->todo[0] = root;
    while (top > 0) {
        int64_t node = c->todo[top - 1];
        if (c->vid[node] >= 0) { top--; continue; }
        int8_t k = c->kinds[node];
        int container = k == LIST || k == TUPLE || k == DICT;
        if (container && c->vid[node] == -1) {  /* first visit: its items first */
            c->vid[node] = -2;
            for (int64_t edge = c->head[node]; edge >= 0; edge = c->nxt[edge]) {
                if (edge >= c->n_edges || c->child[edge] < 0 || c->child[edge] >= c->n_nodes) return FAIL;
                int64_t item = c->child[edge];
                if (c->vid[item] == -2) return FAIL;  /* an item that is its own ancestor */
                if (c->vid[item] == -1) {
                    if (top >= c->n_todo) return FAIL;
                    c->todo[top++] = item;
                }
            }
            continue;
        }
        uint64_t hv = mix(1469598103934665603ull, (uint64_t)k);
        if (k == INT || k == FLOAT) hv = mix(hv, (uint64_t)c->ival[node]);
        else if (k == STR || k == BIG) {
            if (c->ival[node] < 0 || c->ival[node] > c->ival2[node] || c->ival2[node] > c->n_buf) return FAIL;
            for (int64_t p = c->ival[node]; p < c->ival2[node]; p++) hv = (hv ^ c->buf[p]) * 1099511628211ull;
            hv = mix(hv, (uint64_t)(c->ival2[node] - c->ival[node]));
        } else if (container) {
            for (int64_t edge = c->head[node]; edge >= 0; edge = c->nxt[edge])
                hv = mix(hv, (uint64_t)c->vid[c->child[edge]]);
        }
        int64_t slot = (int64_t)(hv & (uint64_t)mask), got;
        for (;;) {
            got = c->table[slot];
            if (got < 0) {  /* a new value */
                got = c->n_ids[0]++;
                c->table[slot] = got;
                c->rep[got] = node;
                break;
            }
            int64_t other = c->rep[got];
            if (c->kinds[other] == k) {  /* equal to that id's representative? */
                int same;
                if (k == INT || k == FLOAT) same = c->ival[node] == c->ival[other];
                else if (k == STR || k == BIG) {
                    int64_t len = c->ival2[node] - c->ival[node];
                    same = len == c->ival2[other] - c->ival[other]
                        && memcmp(c->buf + c->ival[node], c->buf + c->ival[other], (size_t)len) == 0;
                } else if (container) {
                    int64_t ea = c->head[node], eb = c->head[other];
                    while (ea >= 0 && eb >= 0 && c->vid[c->child[ea]] == c->vid[c->child[eb]]) {
                        ea = c->nxt[ea];
                        eb = c->nxt[eb];
                    }
                    same = ea < 0 && eb < 0;
                } else same = 1;  /* NONE, TRUE, FALSE */
                if (same) break;
            }
            slot = (slot + 1) & mask;
        }
        c->vid[node] = got;
        top--;
    }
    return c->vid[root];
}

/* entry_codes: each entry's row, its frames' value id and its integer fields; rows or FAIL. */
static int64_t entry_codes(const Codes *c, int64_t entries) {
    int64_t rows = 0, e = 0, row_mask = c->n_row_table - 1, nf = c->n_fields, ns = c->n_shared;
    /* Every index read from the node table is checked against its array (run() keeps them within bounds; this
     * keeps a caller's mistake from reading outside them). */
    if (entries < 0 || entries >= c->n_nodes) return FAIL;
    for (int64_t edge = c->head[entries]; edge >= 0; edge = c->nxt[edge]) {
        if (edge >= c->n_edges || c->child[edge] < 0 || c->child[edge] >= c->n_nodes) return FAIL;
        int64_t entry = c->child[edge];
        if (c->kinds[entry] != DICT || e >= c->n_entries) return FAIL;
        int64_t *fields = c->fields + e * nf;
        for (int64_t f = 0; f < nf; f++) fields[f] = 0;
        for (int64_t item = c->head[entry]; item >= 0;) {
            if (item >= c->n_edges || c->nxt[item] < 0 || c->nxt[item] >= c->n_edges) return FAIL;  /* (in pairs) */
            int64_t key = c->child[item], value_edge = c->nxt[item];
            if (key < 0 || key >= c->n_nodes || c->child[value_edge] < 0 || c->child[value_edge] >= c->n_nodes)
                return FAIL;
            int64_t f = c->key_field[key];
            if (f == -2) f = c->key_field[key] = field_of(c, key);
            if (f >= 0) fields[f] = c->child[value_edge];  /* a key given twice: its last value, as in the dict */
            item = c->nxt[value_edge];
        }
        uint64_t h = 7;
        for (int64_t f = 0; f <= ns; f++) {
            int64_t id = value_id(c, fields[f]);
            if (id < 0) return FAIL;
            if (f < ns) h = mix(h, (uint64_t)id);
            else c->frames_id[e] = id;
        }
        int64_t slot = (int64_t)(h & (uint64_t)row_mask);
        for (;;) {
            int64_t r = c->row_table[slot];
            if (r < 0) {
                c->row_table[slot] = rows;
                for (int64_t f = 0; f < ns; f++) c->row_ids[rows * ns + f] = c->vid[fields[f]];
                c->row_first[rows] = e;
                c->codes[e] = rows++;
                break;
            }
            int same = 1;
            for (int64_t f = 0; f < ns && same; f++) same = c->row_ids[r * ns + f] == c->vid[fields[f]];
            if (same) { c->codes[e] = r; break; }
            slot = (slot + 1) & row_mask;
        }
        int64_t n_ints = nf - ns - 1;
        for (int64_t j = 0; j < n_ints; j++) {
            int64_t node = fields[ns + 1 + j];
            int8_t k = c->kinds[node];
            c->ints[e * n_ints + j] = k == INT ? c->ival[node] : 0;
            c->int_state[e * n_ints + j] = (int8_t)(k == INT ? INT_OK : k == NONE ? INT_NONE : INT_OTHER);
        }
        e++;
    }
    return rows;
}

/* ---- the Python side: run, entry_codes and count_items as fr_pickle_scan calls them ---- */

static int take(PyObject *obj, Py_buffer *v, int ndim, Py_ssize_t itemsize, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) return -1;
    if (v->ndim != ndim || v->itemsize != itemsize) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_ValueError, "%s has the wrong shape or type", name);
        return -1;
    }
    return 0;
}

static int take_all(PyObject *const *args, Py_buffer *v, const char *const *names, const int *ndim,
                    const Py_ssize_t *itemsize, const int *writable, int count) {
    for (int k = 0; k < count; k++) {
        if (names[k] == NULL) continue;  /* (an integer argument) */
        if (take(args[k], &v[k], ndim[k], itemsize[k], writable[k], names[k]) < 0) {
            while (k-- > 0) if (names[k] != NULL) PyBuffer_Release(&v[k]);
            return -1;
        }
    }
    return 0;
}

static void release_all(Py_buffer *v, const char *const *names, int count) {
    for (int k = 0; k < count; k++) if (names[k] != NULL) PyBuffer_Release(&v[k]);
}

#define LEN(k) ((int64_t)v[k].shape[0])

static PyObject *py_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char *const names[12] = {"buf", "kinds", "ival", "ival2", "head", "tail", "child", "nxt",
                                          "stack", "marks", "memo", "root"};
    static const int ndim[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const int writable[12] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const Py_ssize_t size[12] = {1, 1, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    if (nargs != 12) return PyErr_Format(PyExc_TypeError, "run() takes 12 arrays (%zd given)", nargs);
    Py_buffer v[12];
    if (take_all(args, v, names, ndim, size, writable, 12) < 0) return NULL;
    int64_t nodes = LEN(1);
    if (LEN(2) < nodes || LEN(3) < nodes || LEN(4) < nodes || LEN(5) < nodes || LEN(7) < LEN(6) || LEN(11) != 2) {
        release_all(v, names, 12);
        return PyErr_Format(PyExc_ValueError, "run(): the arrays' lengths do not agree");
    }
    Run r = {v[0].buf, LEN(0), v[1].buf, v[2].buf, v[3].buf, v[4].buf, v[5].buf, nodes, v[6].buf, v[7].buf,
             LEN(6), v[8].buf, LEN(8), v[9].buf, LEN(9), v[10].buf, LEN(10), v[11].buf};
    int64_t got;
    Py_BEGIN_ALLOW_THREADS  /* each thread has its own scratch arrays (fr_pickle_scan) */
    got = run(&r);
    Py_END_ALLOW_THREADS
    release_all(v, names, 12);
    return PyLong_FromLongLong(got);
}

static PyObject *py_entry_codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    enum { N = 25 };
    static const char *const names[N] = {NULL, "buf", "kinds", "ival", "ival2", "head", "child", "nxt", "names",
        "name_len", NULL, "vid", "table", "rep", "n_ids", "todo", "key_field", "fields", "row_table", "row_ids",
        "row_first", "codes", "frames_id", "ints", "int_state"};
    static const int ndim[N] = {0, 1, 1, 1, 1, 1, 1, 1, 2, 1, 0, 1, 1, 1, 1, 1, 1, 2, 1, 2, 1, 1, 1, 2, 2};
    static const int writable[N] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const Py_ssize_t size[N] = {0, 1, 1, 8, 8, 8, 8, 8, 1, 8, 0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 1};
    if (nargs != N) return PyErr_Format(PyExc_TypeError, "entry_codes() takes %d arguments (%zd given)", N, nargs);
    int64_t entries = PyLong_AsLongLong(args[0]), n_shared = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer v[N];
    if (take_all(args, v, names, ndim, size, writable, N) < 0) return NULL;
    /* Nodes: those run() made (vid and rep have one slot each); the arrays must hold them, and the tables must
     * have room for more ids than nodes (open addressing always finds a free slot). */
    int64_t nodes = LEN(11), n_fields = LEN(9), n_entries = LEN(17), table = LEN(12), row_table = LEN(18);
    int ok = LEN(2) >= nodes && LEN(3) >= nodes && LEN(4) >= nodes && LEN(5) >= nodes && LEN(13) >= nodes
        && LEN(16) >= nodes && LEN(15) >= 1 && LEN(14) == 1 && LEN(7) >= LEN(6) && LEN(8) == n_fields
        && v[17].shape[1] == n_fields && 0 <= n_shared && n_shared < n_fields
        && table > nodes && (table & (table - 1)) == 0 && row_table > n_entries && (row_table & (row_table - 1)) == 0
        && LEN(19) >= n_entries && v[19].shape[1] == n_shared && LEN(20) >= n_entries && LEN(21) >= n_entries
        && LEN(22) >= n_entries && LEN(23) >= n_entries && v[23].shape[1] == n_fields - n_shared - 1
        && LEN(24) >= n_entries && v[24].shape[1] == v[23].shape[1];
    const int64_t *name_len = v[9].buf;
    for (int64_t f = 0; ok && f < n_fields; f++) ok = name_len[f] >= 0 && name_len[f] <= v[8].shape[1];
    const int64_t *head = v[5].buf, *child = v[6].buf, *nxt = v[7].buf, *ival = v[3].buf, *ival2 = v[4].buf;
    const int8_t *kinds = v[2].buf;
    int64_t rows = FAIL;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "entry_codes(): the arrays' lengths do not agree");
    } else {
        Codes c = {v[1].buf, LEN(1), kinds, ival, ival2, head, child, nxt, nodes, LEN(6), v[8].buf, v[8].shape[1],
                   name_len, n_fields, n_shared, v[11].buf, v[12].buf, v[13].buf, v[14].buf, v[15].buf, v[16].buf,
                   table, LEN(15), v[17].buf, n_entries, v[18].buf, row_table, v[19].buf, v[20].buf, v[21].buf,
                   v[22].buf, v[23].buf, v[24].buf};
        Py_BEGIN_ALLOW_THREADS
        rows = entry_codes(&c, entries);
        Py_END_ALLOW_THREADS
    }
    release_all(v, names, N);
    return ok ? PyLong_FromLongLong(rows) : NULL;
}

static PyObject *py_count_items(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char *const names[3] = {NULL, "head", "nxt"};
    static const int ndim[3] = {0, 1, 1}, writable[3] = {0, 0, 0};
    static const Py_ssize_t size[3] = {0, 8, 8};
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "count_items() takes 3 arguments (%zd given)", nargs);
    int64_t node = PyLong_AsLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer v[3];
    if (take_all(args, v, names, ndim, size, writable, 3) < 0) return NULL;
    const int64_t *head = v[1].buf, *nxt = v[2].buf;
    int64_t count = 0;
    if (0 <= node && node < LEN(1))
        for (int64_t e = head[node]; e >= 0 && e < LEN(2) && count <= LEN(2); e = nxt[e]) count++;
    release_all(v, names, 3);
    return PyLong_FromLongLong(count);
}

static PyMethodDef METHODS[] = {
    {"run", (PyCFunction)(void (*)(void))py_run, METH_FASTCALL, "run(buf, kinds, ..., root) -> nodes or FAIL"},
    {"entry_codes", (PyCFunction)(void (*)(void))py_entry_codes, METH_FASTCALL,
     "entry_codes(entries, buf, ..., int_state) -> rows or FAIL"},
    {"count_items", (PyCFunction)(void (*)(void))py_count_items, METH_FASTCALL, "count_items(node, head, nxt)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, .m_name = "distdoctor.trace.loaders._fr_pickle_kernel", .m_size = -1, .m_methods = METHODS,
};

PyMODINIT_FUNC PyInit__fr_pickle_kernel(void) {
    PyObject *m = PyModule_Create(&MODULE);
    static const char *const kinds[] = {"NONE", "FALSE", "TRUE", "INT", "BIG", "FLOAT", "STR", "LIST", "TUPLE", "DICT"};
    for (int k = 0; m != NULL && k < 10; k++)
        if (PyModule_AddIntConstant(m, kinds[k], k) < 0) Py_CLEAR(m);
    if (m != NULL && PyModule_AddIntConstant(m, "FAIL", FAIL) < 0) Py_CLEAR(m);
    return m;
}
