/* The compiled half of fr_json_scan in C, built when distdoctor is installed (where a C compiler is found; the
 * build is optional, the wheels carry it): validation, grouping and replay of a dump's entries.
 * tests/doctor/test_fr_json_scan.py checks it against the Python reader. Python calls scan() with numpy arrays
 * (fr_json_scan._scan_with), the field names among them (from fr_schema); their shapes are checked. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { FAIL_LAYOUT = -1, FAIL_TWICE = -2, FAIL_NOT_INT = -3, FAIL_CAPACITY = -4, FAIL_ESCAPE = -5,
       FAIL_INVALID = -6 };
enum { OP_EXACT = 0, OP_FREE = 1, OP_OWN = 2 };
#define RECENT 8

typedef struct {
    const uint8_t *buf; int64_t size;
    const uint8_t *names; int64_t name_stride; const int64_t *name_len;
    const int64_t *slots; int64_t n_slots; const int64_t *mix;
    int64_t *bounds; int64_t capacity;
    int64_t *own; uint8_t *state; int64_t n_own;
    int64_t *spans; int64_t n_shared;
    uint8_t *stack; int64_t depth_limit;
    int64_t *region; int64_t *groups;
    int64_t *table; int64_t n_table; uint64_t *group_digest; int64_t *first; int64_t max_groups; int64_t *n_groups;
    int64_t *progs; int64_t *prog_len; int64_t n_progs; int64_t *ops; int64_t n_ops; int64_t *successor;
} Scan;

static int64_t skip_space(const Scan *s, int64_t i) {
    while (i < s->size && (s->buf[i] == 32 || s->buf[i] == 10 || s->buf[i] == 13 || s->buf[i] == 9)) i++;
    return i;
}

static int64_t string_end(const Scan *s, int64_t i) {
    for (int64_t j = i + 1; j < s->size; j++) {
        uint8_t c = s->buf[j];
        if (c == 34) return j + 1;
        if (c == 92) return FAIL_ESCAPE;
        if (c < 32) return FAIL_INVALID;
    }
    return FAIL_INVALID;
}

static int is_digit(const Scan *s, int64_t i) { return i < s->size && s->buf[i] >= 48 && s->buf[i] <= 57; }

static int64_t number_end(const Scan *s, int64_t i) {
    if (i < s->size && s->buf[i] == 45) i++;
    if (!is_digit(s, i)) return FAIL_INVALID;
    if (s->buf[i] == 48) i++;
    else while (is_digit(s, i)) i++;
    if (i < s->size && s->buf[i] == 46) {
        i++;
        if (!is_digit(s, i)) return FAIL_INVALID;
        while (is_digit(s, i)) i++;
    }
    if (i < s->size && (s->buf[i] == 101 || s->buf[i] == 69)) {
        i++;
        if (i < s->size && (s->buf[i] == 43 || s->buf[i] == 45)) i++;
        if (!is_digit(s, i)) return FAIL_INVALID;
        while (is_digit(s, i)) i++;
    }
    return i;
}

static int64_t literal_end(const Scan *s, int64_t i, const char *word, int64_t len) {
    if (i + len > s->size || memcmp(s->buf + i, word, (size_t)len) != 0) return FAIL_INVALID;
    return i + len;
}

/* At an object member's key (its opening quote at i): *start = its value's position; returns after the key,
 * or a failure (then *start = i). */
static int64_t member_start(const Scan *s, int64_t i, int64_t *start) {
    *start = i;
    if (i >= s->size || s->buf[i] != 34) return FAIL_INVALID;
    int64_t key_end = string_end(s, i);
    if (key_end < 0) return key_end;
    int64_t j = skip_space(s, key_end);
    if (j >= s->size || s->buf[j] != 58) return FAIL_INVALID;
    *start = skip_space(s, j + 1);
    return key_end;
}

static int64_t key_then_colon(const Scan *s, int64_t i) {
    int64_t start, key_end = member_start(s, skip_space(s, i), &start);
    return key_end < 0 ? key_end : start;
}

/* At an object's opening brace: *more = 1 and its first member's position, or *more = 0 and after it. */
static int64_t open_object(const Scan *s, int64_t i, int *more) {
    i = skip_space(s, i + 1);
    if (i < s->size && s->buf[i] == 125) { *more = 0; return i + 1; }
    *more = 1;
    return i;
}

/* After a member's value: *more = 1 (next member), 0 (after the closing brace) or FAIL_INVALID. */
static int64_t next_member(const Scan *s, int64_t i, int *more) {
    i = skip_space(s, i);
    if (i < s->size && s->buf[i] == 44) { *more = 1; return skip_space(s, i + 1); }
    if (i < s->size && s->buf[i] == 125) { *more = 0; return i + 1; }
    *more = FAIL_INVALID;
    return i;
}

static int64_t skip_value(const Scan *s, int64_t i) {
    int64_t n = s->size, depth = 0;
    for (;;) {
        i = skip_space(s, i);
        if (i >= n) return FAIL_INVALID;
        uint8_t c = s->buf[i];
        if (c == 123 || c == 91) {
            uint8_t closer = c == 123 ? 125 : 93;
            int64_t j = skip_space(s, i + 1);
            if (j < n && s->buf[j] == closer) {
                i = j + 1;
            } else {
                if (depth >= s->depth_limit) return FAIL_INVALID;
                s->stack[depth++] = c;
                i = c == 123 ? key_then_colon(s, j) : j;
                if (i < 0) return i;
                continue;
            }
        } else if (c == 34) i = string_end(s, i);
        else if (c == 116) i = literal_end(s, i, "true", 4);
        else if (c == 102) i = literal_end(s, i, "false", 5);
        else if (c == 110) i = literal_end(s, i, "null", 4);
        else i = number_end(s, i);
        if (i < 0) return i;
        while (depth > 0) {
            i = skip_space(s, i);
            if (i >= n) return FAIL_INVALID;
            c = s->buf[i];
            uint8_t top = s->stack[depth - 1];
            if (c == 44) {
                i = top == 123 ? key_then_colon(s, i + 1) : i + 1;
                if (i < 0) return i;
                break;
            }
            if (c == (top == 123 ? 125 : 93)) { depth--; i++; }
            else return FAIL_INVALID;
        }
        if (depth == 0) return i;
    }
}

static int64_t own_int_end(const Scan *s, int64_t i, int64_t n, int64_t k) {
    int64_t size = s->size;
    if (i < size && s->buf[i] == 110) {
        i = literal_end(s, i, "null", 4);
        if (i < 0) return i;
        s->state[n * s->n_own + k] = 2;
        return i;
    }
    if (i >= size || !(s->buf[i] >= 48 && s->buf[i] <= 57) || (s->buf[i] == 48 && is_digit(s, i + 1)))
        return FAIL_NOT_INT;
    uint64_t value = 0;
    int64_t start = i;
    while (i < size && s->buf[i] >= 48 && s->buf[i] <= 57) value = value * 10u + (uint64_t)(s->buf[i++] - 48);
    if (i - start > 19 || value > (uint64_t)INT64_MAX) return FAIL_NOT_INT;
    if (i < size && (s->buf[i] == 46 || s->buf[i] == 101 || s->buf[i] == 69)) return FAIL_NOT_INT;
    s->own[n * s->n_own + k] = (int64_t)value;
    s->state[n * s->n_own + k] = 1;
    return i;
}

static int64_t field_of(const Scan *s, int64_t start, int64_t end) {
    int64_t length = end - start;
    if (length <= 0) return -1;
    int64_t k = s->slots[(length * s->mix[0] + s->buf[start] * s->mix[1] + s->buf[end - 1]) & (s->n_slots - 1)];
    if (k < 0 || s->name_len[k] != length) return -1;
    return memcmp(s->buf + start, s->names + k * s->name_stride, (size_t)length) == 0 ? k : -1;
}

#define SPAN(e, f, side) s->spans[((e) * s->n_shared + (f)) * 2 + (side)]

static uint64_t spans_digest(const Scan *s, int64_t e) {
    uint64_t h = 14695981039346656037ull, prime = 1099511628211ull;
    for (int64_t f = 0; f < s->n_shared; f++) {
        int64_t a = SPAN(e, f, 0), b = SPAN(e, f, 1);
        h = (h ^ (uint64_t)(f + 1)) * prime;
        h = (h ^ (uint64_t)(b - a + 1)) * prime;
        for (int64_t t = a; t < b; t++) h = (h ^ (uint64_t)s->buf[t]) * prime;
    }
    return h;
}

static int same_spans(const Scan *s, int64_t e, int64_t r) {
    for (int64_t f = 0; f < s->n_shared; f++) {
        int64_t a = SPAN(e, f, 0), b = SPAN(e, f, 1), ra = SPAN(r, f, 0), rb = SPAN(r, f, 1);
        if (b - a != rb - ra || (b > a && memcmp(s->buf + a, s->buf + ra, (size_t)(b - a)) != 0)) return 0;
    }
    return 1;
}

static int64_t group_of(const Scan *s, int64_t e) {
    uint64_t h = spans_digest(s, e);
    int64_t mask = s->n_table - 1, slot = (int64_t)(h & (uint64_t)mask);
    for (;;) {
        int64_t g = s->table[slot];
        if (g < 0) {
            g = s->n_groups[0];
            if (g >= s->max_groups) return -1;
            s->table[slot] = g;
            s->group_digest[g] = h;
            s->first[g] = e;
            s->n_groups[0] = g + 1;
            return g;
        }
        if (s->group_digest[g] == h && same_spans(s, e, s->first[g])) return g;
        slot = (slot + 1) & mask;
    }
}

static int64_t emit(const Scan *s, int64_t m, int64_t kind, int64_t a, int64_t b) {
    if (kind == OP_EXACT && b <= a) return m;
    if (m >= s->n_ops) return s->n_ops + 1;
    s->ops[m * 3] = kind; s->ops[m * 3 + 1] = a; s->ops[m * 3 + 2] = b;
    return m + 1;
}

static int64_t replay(const Scan *s, int64_t i, const int64_t *prog, int64_t m, int64_t n) {
    for (int64_t k = 0; k < s->n_own; k++) s->state[n * s->n_own + k] = 0;
    for (int64_t t = 0; t < m; t++) {
        int64_t kind = prog[t * 3], a = prog[t * 3 + 1], b = prog[t * 3 + 2];
        if (kind == OP_EXACT) {
            if (i + (b - a) > s->size || memcmp(s->buf + i, s->buf + a, (size_t)(b - a)) != 0) return -1;
            i += b - a;
        } else if (kind == OP_FREE) i = skip_value(s, i);
        else i = own_int_end(s, i, n, a);
        if (i < 0) return -1;
    }
    return i;
}

static int64_t scan_entry(const Scan *s, int64_t i, int64_t n, int64_t *m_out) {
    int64_t n_own = s->n_own, m = 0, cursor = i;
    for (int64_t k = 0; k < n_own; k++) { s->state[n * n_own + k] = 0; s->own[n * n_own + k] = 0; }
    for (int64_t f = 0; f < s->n_shared; f++) { SPAN(n, f, 0) = -1; SPAN(n, f, 1) = -1; }
    int more;
    i = open_object(s, i, &more);
    while (more) {
        int64_t start, key_end = member_start(s, i, &start);
        if (key_end < 0) { *m_out = m; return key_end; }
        int64_t k = field_of(s, i + 1, key_end - 1);
        if (k >= 0 && k < n_own) {
            if (s->state[n * n_own + k] != 0) { *m_out = m; return FAIL_TWICE; }
            i = own_int_end(s, start, n, k);
            m = emit(s, emit(s, m, OP_EXACT, cursor, start), OP_OWN, k, 0);
            cursor = i;
        } else {
            i = skip_value(s, start);
            if (k < 0) {
                m = emit(s, emit(s, m, OP_EXACT, cursor, start), OP_FREE, 0, 0);
                cursor = i;
            }
        }
        if (i < 0) { *m_out = m; return i; }
        if (k >= n_own) {
            int64_t f = k - n_own;
            if (SPAN(n, f, 0) >= 0) { *m_out = m; return FAIL_TWICE; }
            SPAN(n, f, 0) = start;
            SPAN(n, f, 1) = i;
        }
        i = next_member(s, i, &more);
        if (more < 0) { *m_out = m; return FAIL_INVALID; }
    }
    *m_out = emit(s, m, OP_EXACT, cursor, i);
    return i;
}

/* The entry at i: its group or a failure; *end = the position after it. */
static int64_t read_entry(const Scan *s, int64_t i, int64_t n, int64_t guess, const int64_t *recent, int64_t *end) {
    int64_t g = guess, e = -1;
    if (g >= 0 && g < s->n_progs && s->prog_len[g])
        e = replay(s, i, s->progs + g * s->n_ops * 3, s->prog_len[g], n);
    for (int t = 0; e < 0 && t < RECENT; t++) {
        g = recent[t];
        if (g >= 0 && g < s->n_progs && s->prog_len[g] && g != guess)
            e = replay(s, i, s->progs + g * s->n_ops * 3, s->prog_len[g], n);
    }
    if (e >= 0) { *end = e; return g; }
    int64_t m;
    e = scan_entry(s, i, n, &m);
    if (e < 0) { *end = i; return e; }
    *end = e;
    int64_t known = s->n_groups[0];
    g = group_of(s, n);
    if (g < 0) return FAIL_CAPACITY;
    if (g == known && g < s->n_progs && m <= s->n_ops) {
        memcpy(s->progs + g * s->n_ops * 3, s->ops, (size_t)(m * 3) * sizeof(int64_t));
        s->prog_len[g] = m;
    }
    return g;
}

/* The `entries` array at i: the entry count or a failure; *after = the position after the array. */
static int64_t scan_entries(const Scan *s, int64_t i, int64_t *after) {
    int64_t size = s->size;
    *after = i;
    if (i >= size || s->buf[i] != 91) return FAIL_LAYOUT;
    i = skip_space(s, i + 1);
    if (i < size && s->buf[i] == 93) { *after = i + 1; return 0; }
    int64_t n = 0, prev = -1, recent[RECENT];
    for (int t = 0; t < RECENT; t++) recent[t] = -1;
    for (;;) {
        *after = i;
        if (i >= size || s->buf[i] != 123) return FAIL_LAYOUT;
        if (n >= s->capacity) return FAIL_CAPACITY;
        int64_t guess = prev >= 0 ? s->successor[prev] : -1, end;
        int64_t g = read_entry(s, i, n, guess, recent, &end);
        if (g < 0) { *after = end; return g; }
        s->bounds[n * 2] = i; s->bounds[n * 2 + 1] = end;
        if (prev >= 0) s->successor[prev] = g;
        int t = RECENT - 1;
        for (int u = 0; u < RECENT; u++) if (recent[u] == g) { t = u; break; }
        memmove(recent + 1, recent, (size_t)t * sizeof(int64_t));
        recent[0] = g;
        prev = g;
        s->groups[n++] = g;
        i = skip_space(s, end);
        if (i < size && s->buf[i] == 44) { i = skip_space(s, i + 1); continue; }
        if (i < size && s->buf[i] == 93) { *after = i + 1; return n; }
        *after = i;
        return FAIL_INVALID;
    }
}

static int64_t scan_document(const Scan *s) {
    int64_t size = s->size, i = skip_space(s, 0), found = FAIL_LAYOUT;
    if (i >= size || s->buf[i] != 123) return FAIL_LAYOUT;
    int more;
    i = open_object(s, i, &more);
    while (more) {
        int64_t start, key_end = member_start(s, i, &start);
        if (key_end < 0) return key_end;
        if (key_end - i - 2 == 7 && memcmp(s->buf + i + 1, "entries", 7) == 0) {
            if (found != FAIL_LAYOUT) return FAIL_TWICE;
            found = scan_entries(s, start, &i);
            if (found < 0) return found;
            s->region[0] = start;
            s->region[1] = i;
        } else {
            i = skip_value(s, start);
            if (i < 0) return i;
        }
        i = next_member(s, i, &more);
        if (more < 0) return FAIL_INVALID;
    }
    if (skip_space(s, i) != size) return FAIL_INVALID;
    return found;
}

/* ---- the Python entry point: scan(buf, names, ..., successor) as fr_json_scan._scan_with passes them ---- */

typedef struct { const char *name; int ndim; Py_ssize_t itemsize; int writable; } Want;

static const Want WANTS[20] = {
    {"buf", 1, 1, 0}, {"names", 2, 1, 0}, {"name_len", 1, 8, 0}, {"slots", 1, 8, 0}, {"mix", 1, 8, 0},
    {"bounds", 2, 8, 1}, {"own", 2, 8, 1}, {"state", 2, 1, 1}, {"spans", 3, 8, 1}, {"stack", 1, 1, 1},
    {"region", 1, 8, 1}, {"groups", 1, 8, 1}, {"table", 1, 8, 1}, {"group_digest", 1, 8, 1}, {"first", 1, 8, 1},
    {"n_groups", 1, 8, 1}, {"progs", 3, 8, 1}, {"prog_len", 1, 8, 1}, {"ops", 2, 8, 1}, {"successor", 1, 8, 1},
};

static PyObject *py_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 20) return PyErr_Format(PyExc_TypeError, "scan() takes 20 arrays (%zd given)", nargs);
    Py_buffer v[20];
    int held = 0;  /* buffers acquired (each released below) */
    for (; held < 20; held++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (WANTS[held].writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[held], &v[held], flags) < 0) break;
        if (v[held].ndim != WANTS[held].ndim || v[held].itemsize != WANTS[held].itemsize) {
            PyErr_Format(PyExc_ValueError, "scan(): %s has the wrong shape or type", WANTS[held].name);
            held++;
            break;
        }
    }
    int ok = held == 20 && !PyErr_Occurred();
    int64_t n = 0;
    if (ok) {
        Scan s = {
            .buf = v[0].buf, .size = v[0].shape[0],
            .names = v[1].buf, .name_stride = v[1].shape[1], .name_len = v[2].buf,
            .slots = v[3].buf, .n_slots = v[3].shape[0], .mix = v[4].buf,
            .bounds = v[5].buf, .capacity = v[5].shape[0],
            .own = v[6].buf, .state = v[7].buf, .n_own = v[6].shape[1],
            .spans = v[8].buf, .n_shared = v[8].shape[1],
            .stack = v[9].buf, .depth_limit = v[9].shape[0],
            .region = v[10].buf, .groups = v[11].buf,
            .table = v[12].buf, .n_table = v[12].shape[0], .group_digest = v[13].buf, .first = v[14].buf,
            .max_groups = v[14].shape[0], .n_groups = v[15].buf,
            .progs = v[16].buf, .prog_len = v[17].buf, .n_progs = v[17].shape[0],
            .ops = v[18].buf, .n_ops = v[18].shape[0], .successor = v[19].buf,
        };
        /* Every index the kernel writes or reads is bounded by these shapes: a caller's mistake is an error,
         * never a write out of bounds. */
        ok = v[5].shape[1] == 2 && v[6].shape[0] >= s.capacity && v[7].shape[0] >= s.capacity
            && v[7].shape[1] == s.n_own && v[8].shape[0] >= s.capacity && v[8].shape[2] == 2
            && v[11].shape[0] >= s.capacity && s.n_own + s.n_shared == v[1].shape[0]
            && v[2].shape[0] == v[1].shape[0] && v[4].shape[0] == 2 && v[10].shape[0] == 2 && v[15].shape[0] == 1
            && s.n_slots > 0 && (s.n_slots & (s.n_slots - 1)) == 0
            && s.n_table > 0 && (s.n_table & (s.n_table - 1)) == 0
            && v[13].shape[0] >= s.max_groups && v[19].shape[0] >= s.max_groups
            && v[16].shape[0] >= s.n_progs && v[16].shape[1] == s.n_ops && v[16].shape[2] == 3 && v[18].shape[1] == 3;
        for (Py_ssize_t k = 0; ok && k < s.n_slots; k++)
            ok = s.slots[k] < v[1].shape[0];
        for (Py_ssize_t k = 0; ok && k < v[2].shape[0]; k++)
            ok = s.name_len[k] >= 0 && s.name_len[k] <= s.name_stride;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "scan(): the arrays' shapes do not agree");
        } else {
            Py_BEGIN_ALLOW_THREADS  /* each call has its own scratch arrays */
            n = scan_document(&s);
            Py_END_ALLOW_THREADS
        }
    }
    for (int k = 0; k < held; k++) PyBuffer_Release(&v[k]);
    return ok ? PyLong_FromLongLong(n) : NULL;
}

static PyMethodDef METHODS[] = {
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_FASTCALL,
     "scan(buf, names, name_len, slots, mix, bounds, own, state, spans, stack, region, groups, table, "
     "group_digest, first, n_groups, progs, prog_len, ops, successor) -> entry count or a failure (< 0)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, .m_name = "distdoctor.trace.loaders._fr_json_kernel", .m_size = -1, .m_methods = METHODS,
};

PyMODINIT_FUNC PyInit__fr_json_kernel(void) { return PyModule_Create(&MODULE); }
