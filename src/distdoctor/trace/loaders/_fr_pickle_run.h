/* The pickle interpreter of _fr_pickle_kernel.c: run() executes a pickle's opcodes, as CPython's C unpickler does,
 * into a table of nodes (kind, integer or byte span, items as a linked list of edges); no Python object is built.
 * Included by _fr_pickle_kernel.c (one translation unit), which defines FAIL and the node kinds. */

static uint64_t uint_at(const uint8_t *buf, int64_t i, int width) {  /* little-endian, width <= 8 */
    uint64_t v = 0;
    for (int k = 0; k < width; k++) v |= (uint64_t)buf[i + k] << (8 * k);
    return v;
}

/* The end of the unpickler's buffer after it reads `width` bytes at i, or FAIL (as the unpickler's _read). */
static int64_t read_at(int64_t i, int64_t width, int64_t avail, int64_t n) {
    if (width < 0 || i + width > n) return FAIL;
    if (i + width <= avail) return avail;
    if (i >= avail) return i + width;
    return FAIL;
}

static int utf8_ok(const uint8_t *buf, int64_t i, int64_t e) {  /* 'surrogatepass', as BINUNICODE asks */
    while (i < e) {
        uint8_t c = buf[i];
        int need, lo, hi;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { need = 1; lo = 0x80; hi = 0xBF; }
        else if (c == 0xE0) { need = 2; lo = 0xA0; hi = 0xBF; }
        else if (c >= 0xE1 && c <= 0xEF) { need = 2; lo = 0x80; hi = 0xBF; }
        else if (c == 0xF0) { need = 3; lo = 0x90; hi = 0xBF; }
        else if (c >= 0xF1 && c <= 0xF3) { need = 3; lo = 0x80; hi = 0xBF; }
        else if (c == 0xF4) { need = 3; lo = 0x80; hi = 0x8F; }
        else return 0;
        if (i + need >= e) return 0;
        if (buf[i + 1] < lo || buf[i + 1] > hi) return 0;
        for (int k = 2; k <= need; k++) if (buf[i + k] < 0x80 || buf[i + k] > 0xBF) return 0;
        i += need + 1;
    }
    return 1;
}

static int hashable(int8_t kind) { return kind != LIST && kind != DICT && kind != TUPLE; }

typedef struct {
    const uint8_t *buf; int64_t n;
    int8_t *kinds; int64_t *ival, *ival2, *head, *tail; int64_t n_nodes;
    int64_t *child, *nxt; int64_t n_edges; int64_t *stack; int64_t n_stack; int64_t *marks; int64_t n_marks;
    int64_t *memo; int64_t n_memo; int64_t *root;
} Run;

/* Where the interpreter stands: the read position and the end of the buffer read so far, the nodes, edges,
 * stack slots, marks and memo slots used, the innermost MARK (`fence`). */
typedef struct { int64_t i, avail, nn, ne, sp, mp, fence, memo_len; } At;
#define NOT_NEW (-2)

#define NEED(cond) do { if (!(cond)) return FAIL; } while (0)
#define READ(width) do { a->avail = read_at(a->i, (width), a->avail, r->n); if (a->avail < 0) return FAIL; } while (0)

/* BINGET, LONG_BINGET (a memo slot onto the stack), BINPUT, LONG_BINPUT, MEMOIZE (the top into a slot). */
static int64_t memo_op(const Run *r, At *a, uint8_t op) {
    if (op == 0x68 || op == 0x6A) {
        int width = op == 0x68 ? 1 : 4;
        READ(width);
        int64_t idx = (int64_t)uint_at(r->buf, a->i, width);
        a->i += width;
        NEED(idx < r->n_memo && r->memo[idx] != 0 && a->sp < r->n_stack);
        r->stack[a->sp++] = r->memo[idx];
        return 0;
    }
    NEED(a->sp > a->fence);
    int64_t idx = a->memo_len;
    if (op != 0x94) {
        int width = op == 0x71 ? 1 : 4;
        READ(width);
        idx = (int64_t)uint_at(r->buf, a->i, width);
        a->i += width;
    }
    NEED(idx < r->n_memo);
    if (r->memo[idx] == 0) a->memo_len++;
    r->memo[idx] = r->stack[a->sp - 1];
    if (idx >= r->root[1]) r->root[1] = idx + 1;
    return 0;
}

/* APPEND, APPENDS, SETITEM, SETITEMS (into the container below the items), TUPLE, TUPLE1-3 (a new one). */
static int64_t items_op(const Run *r, At *a, uint8_t op) {
    int makes_tuple = op == 0x74 || (op >= 0x85 && op <= 0x87);
    int64_t start, target;
    if (op == 0x61 || op == 0x73) start = a->sp - (op == 0x73 ? 2 : 1);
    else if (op >= 0x85 && op <= 0x87) start = a->sp - (op - 0x84);
    else {
        NEED(a->mp > 0);
        start = r->marks[--a->mp];
        a->fence = a->mp > 0 ? r->marks[a->mp - 1] : 0;
    }
    if (makes_tuple) {
        NEED(start >= a->fence && a->nn < r->n_nodes);
        target = a->nn;
        r->kinds[a->nn] = TUPLE;
        r->head[a->nn++] = -1;
    } else {
        NEED(start > a->fence);  /* the target lies below a MARK (or there is none) */
        target = r->stack[start - 1];
        if (op == 0x73 || op == 0x75) {
            NEED(r->kinds[target] == DICT && (a->sp - start) % 2 == 0);
            for (int64_t k = start; k < a->sp; k += 2) NEED(hashable(r->kinds[r->stack[k]]));
        } else NEED(r->kinds[target] == LIST);
    }
    NEED(a->ne + (a->sp - start) <= r->n_edges);
    for (int64_t k = start; k < a->sp; k++) {  /* the items, appended to the target's list of edges */
        r->child[a->ne] = r->stack[k];
        r->nxt[a->ne] = -1;
        if (r->head[target] < 0) r->head[target] = a->ne;
        else r->nxt[r->tail[target]] = a->ne;
        r->tail[target] = a->ne++;
    }
    a->sp = start;
    if (makes_tuple) r->stack[a->sp++] = target;
    return 0;
}

/* An opcode that pushes a new value: its kind (NOT_NEW for other opcodes; FAIL), *value and *value2. */
static int64_t scalar_op(const Run *r, At *a, uint8_t op, int64_t *value, int64_t *value2) {
    const uint8_t *buf = r->buf;
    if (op == 0x4B) {  /* BININT1 */
        READ(1);
        *value = buf[a->i++];
        return INT;
    }
    if (op == 0x8A || op == 0x8B) {  /* LONG1, LONG4: little-endian two's complement of a given length */
        int width = op == 0x8A ? 1 : 4;
        READ(width);
        int64_t size = (int64_t)uint_at(buf, a->i, width);
        NEED(!(width == 4 && size >= ((int64_t)1 << 31)));  /* a negative length: the unpickler refuses it */
        a->i += width;
        READ(size);
        int64_t at = a->i;
        a->i += size;
        if (size > 8) {
            *value = at;
            *value2 = at + size;
            return BIG;
        }
        if (size > 0) {
            uint64_t u = uint_at(buf, at, (int)size);
            if (size < 8 && buf[at + size - 1] >= 0x80) u |= ~(uint64_t)0 << (8 * size);  /* sign-extended */
            *value = (int64_t)u;
        }
        return INT;
    }
    if (op == 0x4A || op == 0x4D) {  /* BININT (4, signed), BININT2 (2) */
        int width = op == 0x4A ? 4 : 2;
        READ(width);
        *value = (int64_t)uint_at(buf, a->i, width);
        if (width == 4 && *value >= ((int64_t)1 << 31)) *value -= (int64_t)1 << 32;
        a->i += width;
        return INT;
    }
    if (op == 0x8C || op == 0x58 || op == 0x8D) {  /* SHORT_BINUNICODE (1), BINUNICODE (4), 8 */
        int width = op == 0x8C ? 1 : op == 0x58 ? 4 : 8;
        READ(width);
        uint64_t size = uint_at(buf, a->i, width);
        a->i += width;
        NEED(size <= (uint64_t)(r->n - a->i));
        int64_t end = a->i + (int64_t)size;
        READ(end - a->i);
        NEED(utf8_ok(buf, a->i, end));
        *value = a->i;
        *value2 = end;
        a->i = end;
        return STR;
    }
    if (op == 0x47) {  /* BINFLOAT: 8 bytes big-endian; the bits are its identity, the offset its value */
        READ(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; k++) bits = (bits << 8) | buf[a->i + k];
        *value = (int64_t)bits;
        *value2 = a->i;
        a->i += 8;
        return FLOAT;
    }
    if (op == 0x5D || op == 0x7D || op == 0x29)  /* EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE */
        return op == 0x5D ? LIST : op == 0x7D ? DICT : TUPLE;
    if (op == 0x4E || op == 0x88 || op == 0x89)  /* NONE, NEWTRUE, NEWFALSE */
        return op == 0x4E ? NONE : op == 0x88 ? TRUE_ : FALSE_;
    return NOT_NEW;
}

/* The opcodes in `r->buf` executed into the node table: the node count, or FAIL (root[0]: the top value). */
static int64_t run(const Run *r) {
    At at = {0, 0, 1, 0, 0, 0, 0, 0}, *a = &at;
    NEED(r->n_nodes > 0);
    r->kinds[0] = NONE;
    r->head[0] = -1;
    while (a->i < r->n) {
        READ(1);
        uint8_t op = r->buf[a->i++];
        int64_t value = 0, value2 = 0, new = scalar_op(r, a, op, &value, &value2);
        if (new == FAIL) return FAIL;
        if (new != NOT_NEW) {
            NEED(a->nn < r->n_nodes && a->sp < r->n_stack);
            r->kinds[a->nn] = (int8_t)new;
            r->ival[a->nn] = value;
            r->ival2[a->nn] = value2;
            r->head[a->nn] = -1;
            r->stack[a->sp++] = a->nn++;
        } else if (op == 0x68 || op == 0x6A || op == 0x71 || op == 0x72 || op == 0x94) {
            NEED(memo_op(r, a, op) == 0);
        } else if (op == 0x61 || op == 0x65 || op == 0x73 || op == 0x75 || op == 0x74 || (op >= 0x85 && op <= 0x87)) {
            NEED(items_op(r, a, op) == 0);
        } else if (op == 0x28) {  /* MARK */
            NEED(a->mp < r->n_marks);
            r->marks[a->mp++] = a->sp;
            a->fence = a->sp;
        } else if (op == 0x2E) {  /* STOP */
            NEED(a->sp > a->fence);
            r->root[0] = r->stack[a->sp - 1];
            return a->nn;
        } else if (op == 0x95) {  /* FRAME: its length, then the frame is read ahead into the buffer */
            READ(8);
            uint64_t length = uint_at(r->buf, a->i, 8);
            a->i += 8;
            NEED(length <= (uint64_t)(r->n - a->i));
            READ((int64_t)length);  /* (i stays) */
        } else if (op == 0x80) {  /* PROTO */
            READ(1);
            NEED(r->buf[a->i] <= 5);
            a->i++;
        } else {
            return FAIL;  /* an opcode builtin values are not written with here (or a global): the unpickler's */
        }
    }
    return FAIL;  /* no STOP */
}
