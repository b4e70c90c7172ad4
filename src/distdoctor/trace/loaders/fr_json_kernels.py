"""fr_json_scan's compiled half in numba (the `fast` extra), used where its C twin was not built; a change
here is made in _fr_json_kernel.c too (the tests run both). One pass over the whole file validates it as JSON
the way msgspec's decoder does when it skips a value (string control characters, number grammar, literals,
commas and colons; not UTF-8), so a file the per-entry reader would refuse is refused here too; strings with a
backslash are not read here at all (FAIL_ESCAPE). Most entries are a copy of an earlier one but for their
integers: such an entry is read by replaying the bytes of its group's first entry (replay), which validates it
too; only the others are scanned byte by byte. All of it lives in this one file: numba's disk cache notices a
change to a function's own file only."""

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

# Compiled on first use and cached on disk next to this file (or in NUMBA_CACHE_DIR): later processes load it.
njit = numba.njit(cache=True, nogil=True, boundscheck=False)

# Negative results: fr_json_scan then hands the file to the per-entry reader.
FAIL_LAYOUT, FAIL_TWICE, FAIL_NOT_INT, FAIL_CAPACITY, FAIL_ESCAPE, FAIL_INVALID = -1, -2, -3, -4, -5, -6
_ENTRIES = np.frombuffer(b"entries", np.uint8)
_TRUE = np.frombuffer(b"true", np.uint8)
_FALSE = np.frombuffer(b"false", np.uint8)
_NULL = np.frombuffer(b"null", np.uint8)


@njit
def skip_space(buf, i):
    n = len(buf)
    while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
        i += 1
    return i


@njit
def string_end(buf, i):
    """After the string opening at i; FAIL_INVALID (control character, no closing quote), FAIL_ESCAPE (backslash)."""
    n = len(buf)
    j = i + 1
    while j < n:
        c = buf[j]
        if c == 34:
            return j + 1
        if c == 92:
            return FAIL_ESCAPE
        if c < 32:
            return FAIL_INVALID
        j += 1
    return FAIL_INVALID


@njit
def is_digit(buf, i):
    return i < len(buf) and 48 <= buf[i] <= 57


@njit
def number_end(buf, i):
    """JSON number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?"""
    n = len(buf)
    if i < n and buf[i] == 45:
        i += 1
    if not is_digit(buf, i):
        return FAIL_INVALID
    if buf[i] == 48:
        i += 1
    else:
        while is_digit(buf, i):
            i += 1
    if i < n and buf[i] == 46:
        i += 1
        if not is_digit(buf, i):
            return FAIL_INVALID
        while is_digit(buf, i):
            i += 1
    if i < n and (buf[i] == 101 or buf[i] == 69):
        i += 1
        if i < n and (buf[i] == 43 or buf[i] == 45):
            i += 1
        if not is_digit(buf, i):
            return FAIL_INVALID
        while is_digit(buf, i):
            i += 1
    return i


@njit
def literal_end(buf, i, word):
    if i + len(word) > len(buf):
        return FAIL_INVALID
    for t in range(len(word)):
        if buf[i + t] != word[t]:
            return FAIL_INVALID
    return i + len(word)


@njit
def key_then_colon(buf, i):
    """At a member's key (whitespace allowed before it): the position after its colon, or a failure."""
    key_end, start = member_start(buf, skip_space(buf, i))
    return key_end if key_end < 0 else start


@njit
def member_start(buf, i):
    """At an object member's key (its opening quote at i): (after the key, its value's position), or (failure, i)."""
    if i >= len(buf) or buf[i] != 34:
        return FAIL_INVALID, i
    key_end = string_end(buf, i)
    if key_end < 0:
        return key_end, i
    j = skip_space(buf, key_end)
    if j >= len(buf) or buf[j] != 58:
        return FAIL_INVALID, i
    return key_end, skip_space(buf, j + 1)


@njit
def open_object(buf, i):
    """At an object's opening brace: (its first member's position, 1), or (the position after it, 0) if empty."""
    i = skip_space(buf, i + 1)
    if i < len(buf) and buf[i] == 125:
        return i + 1, 0
    return i, 1


@njit
def next_member(buf, i):
    """After a member's value at i: (the next member's position, 1), (after the closing brace, 0), or a failure."""
    i = skip_space(buf, i)
    if i < len(buf) and buf[i] == 44:
        return skip_space(buf, i + 1), 1
    if i < len(buf) and buf[i] == 125:
        return i + 1, 0
    return i, FAIL_INVALID


@njit
def skip_value(buf, i, stack):
    """Validate the JSON value starting at i (whitespace allowed before it); the position after it, or a
    failure. `stack` holds the open containers (its length is the depth limit)."""
    n = len(buf)
    depth = 0
    while True:
        i = skip_space(buf, i)
        if i >= n:
            return FAIL_INVALID
        c = buf[i]
        if c == 123 or c == 91:
            closer = 125 if c == 123 else 93
            j = skip_space(buf, i + 1)
            if j < n and buf[j] == closer:
                i = j + 1  # an empty container is a whole value
            else:
                if depth >= len(stack):
                    return FAIL_INVALID
                stack[depth] = c
                depth += 1
                i = key_then_colon(buf, j) if c == 123 else j
                if i < 0:
                    return i
                continue  # the first member's value
        elif c == 34:
            i = string_end(buf, i)
        elif c == 116:
            i = literal_end(buf, i, _TRUE)
        elif c == 102:
            i = literal_end(buf, i, _FALSE)
        elif c == 110:
            i = literal_end(buf, i, _NULL)
        else:
            i = number_end(buf, i)
        if i < 0:
            return i
        # A value ended at i: close containers, or go on to the next member.
        while depth > 0:
            i = skip_space(buf, i)
            if i >= n:
                return FAIL_INVALID
            c = buf[i]
            top = stack[depth - 1]
            if c == 44:
                i = key_then_colon(buf, i + 1) if top == 123 else i + 1
                if i < 0:
                    return i
                break
            if c == (125 if top == 123 else 93):
                depth -= 1
                i += 1
            else:
                return FAIL_INVALID
        if depth == 0:
            return i


@njit
def own_int_end(buf, i, own, state, n, k):
    """Read a non-negative integer (into own[n, k], state 1) or null (state 2) at i; the position after it, or
    FAIL_NOT_INT for any other value (the per-entry reader then takes the file, valid or not)."""
    size = len(buf)
    if i < size and buf[i] == 110:
        i = literal_end(buf, i, _NULL)
        if i < 0:
            return i
        state[n, k] = 2
        return i
    if i >= size or not (48 <= buf[i] <= 57) or (buf[i] == 48 and is_digit(buf, i + 1)):
        return FAIL_NOT_INT  # not a digit, or a leading zero (invalid JSON)
    value = np.uint64(0)
    start = i
    while i < size and 48 <= buf[i] <= 57:
        value = value * np.uint64(10) + np.uint64(buf[i] - 48)
        i += 1
    if i - start > 19 or value > np.uint64(9223372036854775807):
        return FAIL_NOT_INT
    if i < size and (buf[i] == 46 or buf[i] == 101 or buf[i] == 69):
        return FAIL_NOT_INT  # a float
    own[n, k] = np.int64(value)
    state[n, k] = 1
    return i


@njit
def field_of(buf, start, end, names, name_len, slots, mix):
    """The known field named buf[start:end], or -1: `slots` (over length, first and last byte) names a candidate."""
    length = end - start
    if length <= 0:
        return -1
    k = slots[(length * mix[0] + buf[start] * mix[1] + buf[end - 1]) & (len(slots) - 1)]
    if k < 0 or name_len[k] != length:
        return -1
    for t in range(length):
        if buf[start + t] != names[k, t]:
            return -1
    return k


@njit
def spans_digest(buf, spans, e):
    """A 64-bit digest (FNV-1a) of entry e's repeating fields."""
    h = np.uint64(14695981039346656037)
    prime = np.uint64(1099511628211)
    for s in range(spans.shape[1]):
        a, b = spans[e, s, 0], spans[e, s, 1]
        h = (h ^ np.uint64(s + 1)) * prime
        h = (h ^ np.uint64(b - a + 1)) * prime
        for t in range(a, b):
            h = (h ^ np.uint64(buf[t])) * prime
    return h


@intrinsic
def same_bytes(typingctx, buf, i, j, length):
    """buf[i:i + length] == buf[j:j + length], by the C library's memcmp (a byte loop that stops at the first
    difference does not vectorize)."""
    def codegen(context, builder, signature, args):
        array, *ints = args
        i, j, length = (context.cast(builder, v, t, types.int64) for v, t in zip(ints, signature.args[1:]))
        data = context.make_array(signature.args[0])(context, builder, array).data
        byte_ptr = ir.IntType(8).as_pointer()
        memcmp = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), [byte_ptr, byte_ptr, ir.IntType(64)]), "memcmp")
        got = builder.call(memcmp, [builder.gep(data, [i]), builder.gep(data, [j]), length])
        return builder.icmp_signed("==", got, ir.Constant(ir.IntType(32), 0))
    return types.boolean(buf, i, j, length), codegen


@njit
def same_spans(buf, spans, e, r):
    """Entries e and r have byte-identical repeating fields."""
    for s in range(spans.shape[1]):
        a, b = spans[e, s, 0], spans[e, s, 1]
        ra, rb = spans[r, s, 0], spans[r, s, 1]
        if b - a != rb - ra or not same_bytes(buf, a, ra, b - a):
            return False
    return True


@njit
def group_of(buf, spans, e, table, group_digest, first, n_groups):
    """The group (numbered first seen first; -1 beyond len(first)) of the entries whose repeating fields are
    byte-identical to entry e's. A hash table on the digest finds the candidates; bytes decide."""
    h = spans_digest(buf, spans, e)
    mask = len(table) - 1
    slot = np.int64(h & np.uint64(mask))
    while True:
        g = table[slot]
        if g < 0:
            g = n_groups[0]
            if g >= len(first):
                return -1
            table[slot] = g
            group_digest[g] = h
            first[g] = e
            n_groups[0] = g + 1
            return g
        if group_digest[g] == h and same_spans(buf, spans, e, first[g]):
            return g
        slot = (slot + 1) & mask


# A replay program: ops (kind, a, b) recorded from a group's first entry.
OP_EXACT, OP_FREE, OP_OWN = 0, 1, 2  # its bytes a..b again; any valid value (a field nobody reads); own field a
RECENT = 8  # groups tried, most recently used first, when the one that followed last time does not fit


@njit
def emit(ops, m, kind, a, b):
    """Append an op (an empty EXACT is dropped); the new count, or len(ops) + 1 once it no longer fits."""
    if kind == OP_EXACT and b <= a:
        return m
    if m >= len(ops):
        return len(ops) + 1
    ops[m, 0], ops[m, 1], ops[m, 2] = kind, a, b
    return m + 1


@njit
def replay(buf, i, prog, m, own, state, n, stack):
    """Read the entry at i as a copy of the entry `prog` was recorded from that differs only in its own
    integers and in fields nobody reads (validated here): its integers go to own/state and the position after
    it is returned; else -1. Its repeating fields are then byte-identical to that entry's: the same group."""
    for k in range(own.shape[1]):
        state[n, k] = 0
    for t in range(m):
        kind, a, b = prog[t, 0], prog[t, 1], prog[t, 2]
        if kind == OP_EXACT:
            if i + (b - a) > len(buf) or not same_bytes(buf, i, a, b - a):
                return -1
            i += b - a
        elif kind == OP_FREE:
            i = skip_value(buf, i, stack)
        else:
            i = own_int_end(buf, i, own, state, n, a)
        if i < 0:
            return -1
    return i


@njit
def scan_entry(buf, i, n, names, name_len, slots, mix, own, state, spans, stack, ops):
    """Scan the entry object at i byte by byte: its own integers, the spans of its repeating fields, its
    replay program into `ops`. Returns (the position after it or a failure, the op count)."""
    n_own = own.shape[1]
    for k in range(n_own):
        state[n, k] = 0
        own[n, k] = 0  # (a failed replay may have written some)
    for s in range(spans.shape[1]):
        spans[n, s, 0] = -1
        spans[n, s, 1] = -1
    m = 0
    cursor = i
    i, more = open_object(buf, i)
    while more:
        key_end, start = member_start(buf, i)
        if key_end < 0:
            return key_end, m
        k = field_of(buf, i + 1, key_end - 1, names, name_len, slots, mix)
        if 0 <= k < n_own:  # a plain integer or null, read in place
            if state[n, k] != 0:
                return FAIL_TWICE, m
            i = own_int_end(buf, start, own, state, n, k)
            m = emit(ops, emit(ops, m, OP_EXACT, cursor, start), OP_OWN, k, 0)
            cursor = i
        else:
            i = skip_value(buf, start, stack)
            if k < 0:  # a field nobody reads: any valid value when replayed
                m = emit(ops, emit(ops, m, OP_EXACT, cursor, start), OP_FREE, 0, 0)
                cursor = i
        if i < 0:
            return i, m
        if k >= n_own:
            s = k - n_own
            if spans[n, s, 0] >= 0:
                return FAIL_TWICE, m
            spans[n, s, 0] = start
            spans[n, s, 1] = i
        i, more = next_member(buf, i)
        if more < 0:
            return FAIL_INVALID, m
    return i, emit(ops, m, OP_EXACT, cursor, i)


@njit
def read_entry(buf, i, n, names, name_len, slots, mix, own, state, spans, stack, table, group_digest, first,
               n_groups, progs, prog_len, ops, guess, recent):
    """The entry at i: (its group or a failure, the position after it). Replayed against `guess` (the group
    that followed the previous entry's last time) and the recently used groups; else scanned byte by byte and
    grouped by its bytes (group_of), a new group's program recorded."""
    g = guess  # (a group without a program, past MAX_PROGRAMS or MAX_OPS, is never replayed)
    end = replay(buf, i, progs[g], prog_len[g], own, state, n, stack) if 0 <= g < len(prog_len) and prog_len[g] \
        else -1
    t = 0
    while end < 0 and t < len(recent):
        g = recent[t]
        t += 1
        if 0 <= g < len(prog_len) and prog_len[g] and g != guess:
            end = replay(buf, i, progs[g], prog_len[g], own, state, n, stack)
    if end >= 0:
        return g, end
    end, m = scan_entry(buf, i, n, names, name_len, slots, mix, own, state, spans, stack, ops)
    if end < 0:
        return end, i
    known = n_groups[0]
    g = group_of(buf, spans, n, table, group_digest, first, n_groups)
    if g < 0:
        return FAIL_CAPACITY, end
    if g == known and g < len(prog_len) and m <= len(ops):  # a new group: its first entry's program
        progs[g, :m] = ops[:m]
        prog_len[g] = m
    return g, end


@njit
def scan_entries(buf, i, names, name_len, slots, mix, bounds, own, state, spans, stack, groups, table,
                 group_digest, first, n_groups, progs, prog_len, ops, successor):
    """Walk the `entries` array at i: per entry its own integers (state 1) or nulls (state 2) and its group;
    for the first entry of each group its bounds and the spans of its repeating fields (-1 when absent).
    Returns (entry count or a failure, position after the array)."""
    size = len(buf)
    if i >= size or buf[i] != 91:
        return FAIL_LAYOUT, i
    i = skip_space(buf, i + 1)
    if i < size and buf[i] == 93:
        return 0, i + 1
    n = 0
    prev = -1
    recent = np.full(RECENT, -1, np.int64)
    while True:
        if i >= size or buf[i] != 123:
            return FAIL_LAYOUT, i
        if n >= bounds.shape[0]:
            return FAIL_CAPACITY, i
        guess = successor[prev] if prev >= 0 else -1
        g, end = read_entry(buf, i, n, names, name_len, slots, mix, own, state, spans, stack, table,
                            group_digest, first, n_groups, progs, prog_len, ops, guess, recent)
        if g < 0:
            return g, end
        bounds[n, 0], bounds[n, 1] = i, end
        if prev >= 0:
            successor[prev] = g
        t = RECENT - 1  # g to the front of the recently used
        for u in range(RECENT):
            if recent[u] == g:
                t = u
                break
        recent[1:t + 1] = recent[:t].copy()
        recent[0] = g
        prev = g
        groups[n] = g
        n += 1
        i = skip_space(buf, end)
        if i < size and buf[i] == 44:
            i = skip_space(buf, i + 1)
            continue
        if i < size and buf[i] == 93:
            return n, i + 1
        return FAIL_INVALID, i


@njit
def scan(buf, names, name_len, slots, mix, bounds, own, state, spans, stack, region, groups, table, group_digest,
         first, n_groups, progs, prog_len, ops, successor):
    """Validate the whole document (one JSON object) and scan its top-level `entries` array, whose span goes
    to region[0:2]. Returns the entry count or a failure."""
    size = len(buf)
    i = skip_space(buf, 0)
    if i >= size or buf[i] != 123:
        return FAIL_LAYOUT
    found = FAIL_LAYOUT  # no entries key
    i, more = open_object(buf, i)
    while more:
        key_end, start = member_start(buf, i)
        if key_end < 0:
            return key_end
        is_entries = key_end - i - 2 == len(_ENTRIES)
        if is_entries:
            for t in range(len(_ENTRIES)):
                if buf[i + 1 + t] != _ENTRIES[t]:
                    is_entries = False
                    break
        if is_entries:
            if found != FAIL_LAYOUT:
                return FAIL_TWICE
            found, i = scan_entries(buf, start, names, name_len, slots, mix, bounds, own, state, spans, stack,
                                    groups, table, group_digest, first, n_groups, progs, prog_len, ops, successor)
            if found < 0:
                return found
            region[0] = start
            region[1] = i
        else:
            i = skip_value(buf, start, stack)
            if i < 0:
                return i
        i, more = next_member(buf, i)
        if more < 0:
            return FAIL_INVALID
    if skip_space(buf, i) != size:
        return FAIL_INVALID  # something after the object
    return found
