"""The compiled half of fr_json_scan (numba, the `fast` extra): imported only when a scan is asked for, since
importing numba takes a noticeable fraction of a second.

One pass over the whole file validates it as JSON the way msgspec's decoder does when it skips a value (string
control characters, number grammar, literals, commas and colons; not UTF-8), so a file the per-entry reader
would refuse is refused here too. Strings with a backslash are not read here at all (FAIL_ESCAPE)."""

import numba
import numpy as np

# Compiled on first use and cached on disk next to this file (or in NUMBA_CACHE_DIR): later processes load it.
njit = numba.njit(cache=True, nogil=True, boundscheck=False)

# Negative results (see fr_json_scan.REASONS).
FAIL_LAYOUT, FAIL_TWICE, FAIL_NOT_INT, FAIL_CAPACITY, FAIL_ESCAPE, FAIL_INVALID = -1, -2, -3, -4, -5, -6
MAX_DEPTH = 256  # nesting beyond this is refused, as msgspec refuses very deep nesting
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
    """The position after the string opening at i; FAIL_INVALID for a control character or no closing quote,
    FAIL_ESCAPE for a backslash."""
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
    """At an object member (its key's opening quote at i): (the position after the key, the position of its
    value), or (a failure, i)."""
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
    """At an object's opening brace: (its first member's position, 1), or (the position after it, 0) when it is
    empty."""
    i = skip_space(buf, i + 1)
    if i < len(buf) and buf[i] == 125:
        return i + 1, 0
    return i, 1


@njit
def next_member(buf, i):
    """After an object member's value at i: (the next member's position, 1), (the position after the closing
    brace, 0), or (i, FAIL_INVALID)."""
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
def value_extent(buf, i):
    """Where the value at i ends, by its strings and brackets only (its grammar is checked elsewhere)."""
    n = len(buf)
    if i >= n:
        return FAIL_INVALID
    c = buf[i]
    if c == 34:
        return string_end(buf, i)
    if c == 91 or c == 123:
        depth = 0
        while i < n:
            c = buf[i]
            if c == 34:
                i = string_end(buf, i)
                if i < 0:
                    return i
                continue
            if c == 91 or c == 123:
                depth += 1
            elif c == 93 or c == 125:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return FAIL_INVALID
    while i < n:
        c = buf[i]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            break
        i += 1
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
    """The index of the known field named buf[start:end], or -1: one candidate from `slots` (a collision-free
    table over length, first and last byte), then compared byte for byte."""
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
    """A 64-bit digest of entry e's repeating fields (FNV-1a in four interleaved lanes, for speed)."""
    h = np.uint64(14695981039346656037)
    prime = np.uint64(1099511628211)
    for s in range(spans.shape[1]):
        a = spans[e, s, 0]
        b = spans[e, s, 1]
        h = (h ^ np.uint64(s + 1)) * prime
        h = (h ^ np.uint64(b - a + 1)) * prime
        h0 = h
        h1 = h ^ np.uint64(1)
        h2 = h ^ np.uint64(2)
        h3 = h ^ np.uint64(3)
        t = a
        while t + 4 <= b:
            h0 = (h0 ^ np.uint64(buf[t])) * prime
            h1 = (h1 ^ np.uint64(buf[t + 1])) * prime
            h2 = (h2 ^ np.uint64(buf[t + 2])) * prime
            h3 = (h3 ^ np.uint64(buf[t + 3])) * prime
            t += 4
        while t < b:
            h0 = (h0 ^ np.uint64(buf[t])) * prime
            t += 1
        h = (((h0 * prime) ^ h1) * prime ^ h2) * prime ^ h3
    return h


@njit
def same_spans(buf, spans, e, r):
    """Entries e and r have byte-identical repeating fields."""
    for s in range(spans.shape[1]):
        a, b = spans[e, s, 0], spans[e, s, 1]
        ra, rb = spans[r, s, 0], spans[r, s, 1]
        if b - a != rb - ra:
            return False
        for t in range(b - a):
            if buf[a + t] != buf[ra + t]:
                return False
    return True


@njit
def group_of(buf, spans, e, table, group_digest, first, n_groups):
    """The group of entries whose repeating fields are byte-identical to entry e's (a new one if none yet),
    numbered in order of first appearance; -1 when there are more groups than `first` holds. A hash table on
    the digest finds the candidates; bytes decide."""
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


@njit
def scan_entries(buf, i, names, name_len, slots, mix, bounds, own, state, spans, stack, groups, table,
                 group_digest, first, n_groups):
    """Walk the `entries` array at i: per entry its bounds, own integers (state 1) or nulls (state 2), the
    spans of the repeating fields (-1 when absent) and its group (see group_of). Returns (entry count or a
    failure, position after the array)."""
    n_own = own.shape[1]
    n_shared = spans.shape[1]
    size = len(buf)
    if i >= size or buf[i] != 91:
        return FAIL_LAYOUT, i
    i = skip_space(buf, i + 1)
    if i < size and buf[i] == 93:
        return 0, i + 1
    n = 0
    while True:
        if i >= size or buf[i] != 123:
            return FAIL_LAYOUT, i
        if n >= bounds.shape[0]:
            return FAIL_CAPACITY, i
        bounds[n, 0] = i
        for k in range(n_own):
            state[n, k] = 0
        for s in range(n_shared):
            spans[n, s, 0] = -1
            spans[n, s, 1] = -1
        i, more = open_object(buf, i)
        while more:
            key_end, start = member_start(buf, i)
            if key_end < 0:
                return key_end, i
            k = field_of(buf, i + 1, key_end - 1, names, name_len, slots, mix)
            if 0 <= k < n_own:  # a plain integer or null, read in place
                if state[n, k] != 0:
                    return FAIL_TWICE, start
                i = own_int_end(buf, start, own, state, n, k)
                if i < 0:
                    return i, start
            else:
                # A repeating field's bytes are validated where its group's first entry is decoded
                # (msgspec): here only where it ends. Other fields are validated here.
                i = value_extent(buf, start) if k >= 0 else skip_value(buf, start, stack)
                if i < 0:
                    return i, start
            if k >= n_own:
                s = k - n_own
                if spans[n, s, 0] >= 0:
                    return FAIL_TWICE, start
                spans[n, s, 0] = start
                spans[n, s, 1] = i
            i, more = next_member(buf, i)
            if more < 0:
                return FAIL_INVALID, i
        bounds[n, 1] = i
        g = group_of(buf, spans, n, table, group_digest, first, n_groups)
        if g < 0:
            return FAIL_CAPACITY, i
        groups[n] = g
        n += 1
        i = skip_space(buf, i)
        if i < size and buf[i] == 44:
            i = skip_space(buf, i + 1)
            continue
        if i < size and buf[i] == 93:
            return n, i + 1
        return FAIL_INVALID, i


@njit
def scan(buf, names, name_len, slots, mix, bounds, own, state, spans, stack, region, groups, table, group_digest,
         first, n_groups):
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
                                    groups, table, group_digest, first, n_groups)
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
