"""The compiled half of fr_pickle_scan in numba (the `fast` extra), used where its C twin was not built; a change
here is made in _fr_pickle_kernel.c too (the tests run both).

`run` executes a pickle's opcodes the way CPython's C unpickler does, but builds no Python object: every value
becomes a node (its kind, its integer or the span of its bytes), and a container's items are a linked list of
edges. Only the opcodes that builtin scalars and containers are written with are read (those of protocols 2 to
5, and what torch's C++ pickler writes); any other opcode, and anything the C unpickler would refuse or that
this reader does not check as it does, returns FAIL and the unpickler takes the file. Nothing in the file is
ever called or looked up: it names no code this reader could run.

`entry_codes` then gives every value under the Flight Recorder entries a value id: equal ids for values of
equal kind and equal content (nodes hashed bottom-up), so entries are grouped by the ids of their repeating
fields without a Python object per entry. Everything compiled lives in this one file: numba's disk cache
notices a change to a function's own file only."""

import numba
import numpy as np

from distdoctor.trace.loaders.fr_coded import INT_NONE, INT_OK, INT_OTHER  # how each integer field was written

njit = numba.njit(cache=True, nogil=True, boundscheck=False)
# Small helpers are inlined. The kernels are each one loop all the same: a helper given arrays, inlined or not,
# adds reference counting on each of them per call, which costs more than most opcodes' work.
inline = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")

FAIL = -1
# Node kinds. Node 0 is a None that stands for a key an entry does not have (dict.get gives None).
NONE, FALSE, TRUE, INT, BIG, FLOAT, STR, LIST, TUPLE, DICT = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9


@inline
def _uint(buf, i, width):
    """A little-endian unsigned integer of `width` bytes (width <= 8) at i."""
    v = np.uint64(0)
    for k in range(width):
        v |= np.uint64(buf[i + k]) << np.uint64(8 * k)
    return v


@inline
def _read(i, width, avail, n):
    """The end of the unpickler's buffer after it reads `width` bytes at i, or FAIL (also past the file's end,
    n). The safe unpickler reads a
    file object: it reads what an opcode asks for (a FRAME: the whole frame) and serves later reads from that
    buffer, but a read that runs past the buffer's end drops the bytes left in it and reads on from the file.
    No pickler writes that (an opcode split across a frame's end), and its bytes would be read otherwise here."""
    if i + width > n:
        return FAIL
    if i + width <= avail:
        return avail
    if i >= avail:
        return i + width
    return FAIL


@inline
def _utf8_ok(buf, s, e):
    """Whether bytes s..e decode as UTF-8 with 'surrogatepass' (what the unpickler's BINUNICODE opcodes ask)."""
    i = s
    while i < e:
        c = buf[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            need, lo, hi = 1, 0x80, 0xBF
        elif c == 0xE0:
            need, lo, hi = 2, 0xA0, 0xBF
        elif 0xE1 <= c <= 0xEF:  # ED A0..BF (a surrogate) passes: surrogatepass
            need, lo, hi = 2, 0x80, 0xBF
        elif c == 0xF0:
            need, lo, hi = 3, 0x90, 0xBF
        elif 0xF1 <= c <= 0xF3:
            need, lo, hi = 3, 0x80, 0xBF
        elif c == 0xF4:
            need, lo, hi = 3, 0x80, 0x8F
        else:
            return False
        if i + need >= e:
            return False
        if not (lo <= buf[i + 1] <= hi):
            return False
        for k in range(2, need + 1):
            if not (0x80 <= buf[i + k] <= 0xBF):
                return False
        i += need + 1
    return True


@inline
def _hashable(kind):
    return kind != LIST and kind != DICT and kind != TUPLE  # tuples: hashable or not, left to the unpickler


@njit
def run(buf, kinds, ival, ival2, head, tail, child, nxt, stack, marks, memo, root):
    """Execute the pickle in `buf`. Returns the number of nodes (root[0]: the value STOP returns; root[1]: one
    past the highest memo slot written) or FAIL.
    `memo` starts zeroed (node 0 is never memoized: 0 is an empty slot). As in the C unpickler, a MARK fences
    the stack: nothing below it may be popped, memoized or appended to until the MARK is consumed.
    Written as one loop, without helpers that take arrays: each call of one costs reference counts on every
    array it is given, more than most opcodes' work. Opcodes are tested in the order of their frequency."""
    n = len(buf)
    kinds[0] = NONE  # node 0: the None of a missing key
    head[0] = -1
    nn = 1
    ne = 0
    sp = 0
    mp = 0
    fence = 0
    memo_len = 0
    i = 0
    avail = 0  # the end of the unpickler's buffer (see _read)
    while i < n:
        avail = _read(i, 1, avail, n)
        if avail < 0:
            return FAIL
        op = buf[i]
        i += 1
        new = -1  # the kind of the node this opcode pushes, if any
        value = np.int64(0)
        value2 = np.int64(0)
        if op == 0x68:  # BINGET
            avail = _read(i, 1, avail, n)
            if avail < 0:
                return FAIL
            idx = np.int64(buf[i])
            i += 1
            if memo[idx] == 0:
                return FAIL
            stack[sp] = memo[idx]
            sp += 1
        elif op == 0x71 or op == 0x72 or op == 0x94:  # BINPUT (1), LONG_BINPUT (4), MEMOIZE
            if sp <= fence:
                return FAIL
            if op == 0x94:
                idx = np.int64(memo_len)
            elif op == 0x71:
                avail = _read(i, 1, avail, n)
                if avail < 0:
                    return FAIL
                idx = np.int64(buf[i])
                i += 1
            else:
                avail = _read(i, 4, avail, n)
                if avail < 0:
                    return FAIL
                idx = np.int64(_uint(buf, i, 4))
                i += 4
            if idx >= len(memo):
                return FAIL
            if memo[idx] == 0:
                memo_len += 1
            memo[idx] = stack[sp - 1]
            if idx >= root[1]:
                root[1] = idx + 1
        elif op == 0x4B:  # BININT1
            avail = _read(i, 1, avail, n)
            if avail < 0:
                return FAIL
            new, value = INT, np.int64(buf[i])
            i += 1
        elif op == 0x5D or op == 0x7D or op == 0x29:  # EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE
            new = LIST if op == 0x5D else DICT if op == 0x7D else TUPLE
        elif op == 0x61 or op == 0x65 or op == 0x73 or op == 0x75 or op == 0x74 or 0x85 <= op <= 0x87:
            # APPEND, APPENDS, SETITEM, SETITEMS (into the container below the items), TUPLE, TUPLE1-3 (a new one)
            makes_tuple = op == 0x74 or 0x85 <= op <= 0x87
            if op == 0x61 or op == 0x73:
                start = sp - (2 if op == 0x73 else 1)
            elif 0x85 <= op <= 0x87:
                start = sp - (op - 0x84)
            else:
                if mp == 0:
                    return FAIL
                mp -= 1
                start = marks[mp]
                fence = marks[mp - 1] if mp > 0 else 0
            if makes_tuple:
                if start < fence:
                    return FAIL
                target = nn
                kinds[nn] = TUPLE
                head[nn] = -1
                nn += 1
            else:
                if start <= fence:
                    return FAIL  # the target lies below a MARK (or there is none)
                target = stack[start - 1]
                if op == 0x73 or op == 0x75:
                    if kinds[target] != DICT or (sp - start) % 2 != 0:
                        return FAIL
                    for k in range(start, sp, 2):
                        if not _hashable(kinds[stack[k]]):
                            return FAIL
                elif kinds[target] != LIST:
                    return FAIL
            for k in range(start, sp):  # the items, appended to the target's list of edges
                child[ne] = stack[k]
                nxt[ne] = -1
                if head[target] < 0:
                    head[target] = ne
                else:
                    nxt[tail[target]] = ne
                tail[target] = ne
                ne += 1
            sp = start
            if makes_tuple:
                stack[sp] = target
                sp += 1
        elif op == 0x28:  # MARK
            marks[mp] = sp
            mp += 1
            fence = sp
        elif op == 0x8A or op == 0x8B:  # LONG1, LONG4: little-endian two's complement of a given length
            width = 1 if op == 0x8A else 4
            avail = _read(i, width, avail, n)
            if avail < 0:
                return FAIL
            size = np.int64(_uint(buf, i, width))
            if width == 4 and size >= 2 ** 31:
                return FAIL  # a negative length: the unpickler refuses it
            i += width
            avail = _read(i, size, avail, n)
            if avail < 0:
                return FAIL
            if size <= 8:
                new = INT
                if size > 0:
                    u = _uint(buf, i, size)
                    if size < 8 and buf[i + size - 1] >= 0x80:
                        u |= ~np.uint64(0) << np.uint64(8 * size)  # sign-extended
                    value = np.int64(u)
            else:
                new, value, value2 = BIG, i, i + size
            i += size
        elif op == 0x4A or op == 0x4D:  # BININT (4, signed), BININT2 (2)
            width = 4 if op == 0x4A else 2
            avail = _read(i, width, avail, n)
            if avail < 0:
                return FAIL
            value = np.int64(_uint(buf, i, width))
            if width == 4 and value >= 2 ** 31:
                value -= 2 ** 32
            new = INT
            i += width
        elif op == 0x8C or op == 0x58 or op == 0x8D:  # SHORT_BINUNICODE (1), BINUNICODE (4), BINUNICODE8 (8)
            width = 1 if op == 0x8C else 4 if op == 0x58 else 8
            avail = _read(i, width, avail, n)
            if avail < 0:
                return FAIL
            size = _uint(buf, i, width)
            i += width
            if size > np.uint64(n - i):
                return FAIL
            end = i + np.int64(size)
            avail = _read(i, end - i, avail, n)
            if avail < 0 or not _utf8_ok(buf, i, end):
                return FAIL
            new, value, value2 = STR, i, end
            i = end
        elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE, NEWTRUE, NEWFALSE
            new = NONE if op == 0x4E else TRUE if op == 0x88 else FALSE
        elif op == 0x2E:  # STOP
            if sp <= fence:
                return FAIL
            root[0] = stack[sp - 1]
            return nn
        elif op == 0x6A:  # LONG_BINGET
            avail = _read(i, 4, avail, n)
            if avail < 0:
                return FAIL
            idx = np.int64(_uint(buf, i, 4))
            i += 4
            if idx >= len(memo) or memo[idx] == 0:
                return FAIL
            stack[sp] = memo[idx]
            sp += 1
        elif op == 0x47:  # BINFLOAT: 8 bytes big-endian; the bits are its identity, the offset its value
            avail = _read(i, 8, avail, n)
            if avail < 0:
                return FAIL
            bits = np.uint64(0)
            for k in range(8):
                bits = (bits << np.uint64(8)) | np.uint64(buf[i + k])
            new, value, value2 = FLOAT, np.int64(bits), i
            i += 8
        elif op == 0x95:  # FRAME: its length, then the frame is read ahead into the buffer
            avail = _read(i, 8, avail, n)
            if avail < 0:
                return FAIL
            length = _uint(buf, i, 8)
            i += 8
            if length > np.uint64(n - i):
                return FAIL
            avail = _read(i, np.int64(length), avail, n)  # (i stays)
            if avail < 0:
                return FAIL
        elif op == 0x80:  # PROTO
            avail = _read(i, 1, avail, n)
            if avail < 0 or buf[i] > 5:
                return FAIL
            i += 1
        else:
            return FAIL  # an opcode builtin values are not written with here (or a global): the unpickler's
        if new >= 0:
            kinds[nn] = new
            ival[nn] = value
            ival2[nn] = value2
            head[nn] = -1
            stack[sp] = nn
            sp += 1
            nn += 1
    return FAIL  # no STOP


@inline
def _mix(h, v):
    h ^= np.uint64(v) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
    return h


@inline
def _field_of(key, buf, kinds, ival, ival2, names, name_len):
    """Which of `names` the key node spells, -1 if none (or not a string)."""
    if kinds[key] != STR:
        return -1
    s, e = ival[key], ival2[key]
    for f in range(len(name_len)):
        if name_len[f] == e - s:
            same = True
            for p in range(e - s):
                if buf[s + p] != names[f, p]:
                    same = False
                    break
            if same:
                return f
    return -1


@njit
def entry_codes(entries, buf, kinds, ival, ival2, head, child, nxt, names, name_len, n_shared, vid, table, rep,
                n_ids, todo, key_field, fields, row_table, row_ids, row_first, codes, frames_id, ints, int_state):
    """For each entry (an item of the `entries` list node): its row, the distinct values of its `n_shared`
    repeating fields (rows numbered first seen first; row_ids: each row's value ids, row_first: its first entry),
    the value id of its frames (the field after them) and its integer fields (the fields after that: the value,
    0 when None or missing, and INT_OK, INT_NONE or INT_OTHER). fields[e]: each field's value node (0: missing).
    Returns the number of rows, or FAIL (an entry that is not a dict, a value that contains itself).

    A value's id: equal for values of equal kind and content. Nodes get theirs bottom-up (a container after its
    items, iteratively: a dump may nest deeply) from an open-addressing table of one representative node per id.
    One loop without helpers that take arrays (see run)."""
    n_fields = len(name_len)
    rows = 0
    row_mask = len(row_table) - 1
    mask = len(table) - 1
    e = 0
    edge = head[entries]
    while edge >= 0:
        entry = child[edge]
        edge = nxt[edge]
        if kinds[entry] != DICT:
            return FAIL
        for f in range(n_fields):
            fields[e, f] = 0
        item = head[entry]
        while item >= 0:
            key = child[item]
            value_edge = nxt[item]
            f = key_field[key]
            if f == -2:
                f = _field_of(key, buf, kinds, ival, ival2, names, name_len)
                key_field[key] = f
            if f >= 0:
                fields[e, f] = child[value_edge]  # a key given twice: its last value, as in the dict
            item = nxt[value_edge]
        h = np.uint64(7)
        for f in range(n_shared + 1):
            root = fields[e, f]
            if vid[root] < 0:
                todo[0] = root
                top = 1
                while top > 0:
                    node = todo[top - 1]
                    if vid[node] >= 0:
                        top -= 1
                        continue
                    k = kinds[node]
                    container = k == LIST or k == TUPLE or k == DICT
                    if container and vid[node] == -1:  # first visit: its items first
                        vid[node] = -2
                        c_edge = head[node]
                        while c_edge >= 0:
                            c = child[c_edge]
                            if vid[c] == -2:
                                return FAIL  # an item that is its own ancestor
                            if vid[c] == -1:
                                todo[top] = c
                                top += 1
                            c_edge = nxt[c_edge]
                        continue
                    hv = _mix(np.uint64(1469598103934665603), k)
                    if k == INT or k == FLOAT:
                        hv = _mix(hv, ival[node])
                    elif k == STR or k == BIG:
                        for p in range(ival[node], ival2[node]):
                            hv = (hv ^ np.uint64(buf[p])) * np.uint64(1099511628211)
                        hv = _mix(hv, ival2[node] - ival[node])
                    elif container:
                        c_edge = head[node]
                        while c_edge >= 0:
                            hv = _mix(hv, vid[child[c_edge]])
                            c_edge = nxt[c_edge]
                    slot = np.int64(hv & np.uint64(mask))
                    while True:
                        got = table[slot]
                        if got < 0:  # a new value
                            table[slot] = n_ids[0]
                            rep[n_ids[0]] = node
                            got = n_ids[0]
                            n_ids[0] += 1
                            break
                        other = rep[got]
                        if kinds[other] == k:  # equal to that id's representative?
                            if k == INT or k == FLOAT:
                                same = ival[node] == ival[other]
                            elif k == STR or k == BIG:
                                same = ival2[node] - ival[node] == ival2[other] - ival[other]
                                if same:
                                    for p in range(ival2[node] - ival[node]):
                                        if buf[ival[node] + p] != buf[ival[other] + p]:
                                            same = False
                                            break
                            elif container:
                                ea, eb = head[node], head[other]
                                while ea >= 0 and eb >= 0 and vid[child[ea]] == vid[child[eb]]:
                                    ea, eb = nxt[ea], nxt[eb]
                                same = ea < 0 and eb < 0
                            else:
                                same = True  # NONE, TRUE, FALSE
                            if same:
                                break
                        slot = (slot + 1) & mask
                    vid[node] = got
                    top -= 1
            if f < n_shared:
                h = _mix(h, vid[root])
            else:
                frames_id[e] = vid[root]
        slot = np.int64(h & np.uint64(row_mask))
        while True:
            r = row_table[slot]
            if r < 0:
                row_table[slot] = rows
                for f in range(n_shared):
                    row_ids[rows, f] = vid[fields[e, f]]
                row_first[rows] = e
                codes[e] = rows
                rows += 1
                break
            same = True
            for f in range(n_shared):
                if row_ids[r, f] != vid[fields[e, f]]:
                    same = False
                    break
            if same:
                codes[e] = r
                break
            slot = (slot + 1) & row_mask
        for j in range(n_fields - n_shared - 1):
            node = fields[e, n_shared + 1 + j]
            k = kinds[node]
            ints[e, j] = ival[node] if k == INT else 0
            int_state[e, j] = INT_OK if k == INT else INT_NONE if k == NONE else INT_OTHER
        e += 1
    return rows


@njit
def count_items(node, head, nxt):
    """How many items a container node holds."""
    n = 0
    e = head[node]
    while e >= 0:
        n += 1
        e = nxt[e]
    return n
