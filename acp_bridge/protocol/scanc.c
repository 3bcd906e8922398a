/*
 * acp_bridge.protocol.scanc: the C line scanner. acp_bridge/protocol/scan.py is the
 * definition (scan_reference) and says what the segments are; this is the same in one pass
 * over the bytes, held equal to it by tests/protocol/test_scan.py.
 *
 * Each line gets one validating pass of a recursive-descent JSON parser: strict RFC 8259
 * grammar, strict UTF-8, no control bytes in strings, valid escapes, depth at most 128 (the
 * codec's MAX_DEPTH). While it validates, it reads the few members that decide whether the
 * line is a plain update: jsonrpc, method, id, params at depth 1; sessionId, update under
 * params; sessionUpdate under params.update.
 *
 * Soundness: a line is put in a RUN only if the reference would call it plain, with the same
 * session id. Whatever is not certain makes the line a LINE (the caller decodes it as usual):
 * a backslash in a key of those three objects or in a value read, a duplicate of a member
 * read, an integer part over 100 digits, an exponent over 4 digits or one that could reach
 * 10^300 (the reference refuses numbers beyond a double, and big integers beyond 4300 digits).
 *
 * Also here (one extension to build): the journal's run codec, elide() and restore(), at the
 * end of the file; acp_bridge/store/elide.py is their definition.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 128
#define MAX_INT_DIGITS 100
#define MAX_EXP_DIGITS 4
#define MAX_MAGNITUDE 300

typedef const unsigned char *ptr;

enum { ROLE_OTHER, ROLE_TOP, ROLE_PARAMS, ROLE_UPDATE };
enum { KEY_OTHER, KEY_JSONRPC, KEY_METHOD, KEY_ID, KEY_PARAMS, KEY_SID, KEY_UPDATE, KEY_KIND };
enum {
    SEEN_JSONRPC = 1,
    SEEN_METHOD = 2,
    SEEN_PARAMS = 4,
    SEEN_SID = 8,
    SEEN_UPDATE = 16,
    SEEN_KIND = 32,
    SEEN_ALL = 63,
};

typedef struct {
    ptr end;
    unsigned seen;
    ptr sid;
    Py_ssize_t sid_len;
    PyObject *setup; /* tuple of bytes: the sessionUpdate kinds that are never plain */
} Line;

/* Bytes in a string: 0 plain, 1 '"', 2 '\\', 3 control (refused), 4 UTF-8 lead or stray */
static unsigned char str_class[256];
static unsigned char is_digit[256];
static unsigned char is_hex[256];

static void
init_tables(void)
{
    for (int c = 0; c < 256; c++) {
        str_class[c] = c < 0x20 ? 3 : c >= 0x80 ? 4 : 0;
        is_digit[c] = c >= '0' && c <= '9';
        is_hex[c] = is_digit[c] || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    }
    str_class['"'] = 1;
    str_class['\\'] = 2;
}

static inline ptr
skip_ws(ptr p, ptr end)
{
    /* (LF cannot occur in a line; CR only as its last byte, which the caller cut off) */
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

/* p just past a lead byte c >= 0x80: past the sequence, or NULL (Unicode table 3-7: no
 * overlongs, no surrogates, nothing above U+10FFFF) */
static inline ptr
utf8_tail(ptr p, ptr end, unsigned char c)
{
    unsigned char lo = 0x80, hi = 0xBF;
    int n;
    if (c >= 0xC2 && c <= 0xDF)
        n = 1;
    else if (c == 0xE0) {
        n = 2;
        lo = 0xA0;
    }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        n = 2;
    else if (c == 0xED) {
        n = 2;
        hi = 0x9F;
    }
    else if (c == 0xF0) {
        n = 3;
        lo = 0x90;
    }
    else if (c >= 0xF1 && c <= 0xF3)
        n = 3;
    else if (c == 0xF4) {
        n = 3;
        hi = 0x8F;
    }
    else
        return NULL;
    if (end - p < n || p[0] < lo || p[0] > hi)
        return NULL;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return NULL;
    return p + n;
}

#define ONES UINT64_C(0x0101010101010101)
#define HIGHS UINT64_C(0x8080808080808080)

/* p just past the opening quote: past the closing quote, or NULL; *escaped is set when the
 * string holds a backslash */
static ptr
string(ptr p, ptr end, int *escaped)
{
    for (;;) {
        /* eight plain bytes at a time: none < 0x20, >= 0x80, '"' or '\\' */
        while (end - p >= 8) {
            uint64_t v, q, b;
            memcpy(&v, p, 8);
            q = v ^ (ONES * '"');
            b = v ^ (ONES * '\\');
            if ((((v - ONES * 0x20) & ~v) | v | ((q - ONES) & ~q) | ((b - ONES) & ~b)) & HIGHS)
                break;
            p += 8;
        }
        while (p < end && str_class[*p] == 0)
            p++;
        if (p >= end)
            return NULL;
        unsigned char c = *p++;
        switch (str_class[c]) {
        case 1:
            return p;
        case 2:
            *escaped = 1;
            if (p >= end)
                return NULL;
            c = *p++;
            switch (c) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                break;
            case 'u':
                if (end - p < 4 || !is_hex[p[0]] || !is_hex[p[1]] || !is_hex[p[2]] ||
                    !is_hex[p[3]])
                    return NULL;
                p += 4;
                break;
            default:
                return NULL;
            }
            break;
        case 3:
            return NULL;
        default:
            p = utf8_tail(p, end, c);
            if (p == NULL)
                return NULL;
        }
    }
}

/* p at a '-' or a digit: past the number, or NULL (also for the ones that might overflow) */
static ptr
number(ptr p, ptr end)
{
    if (*p == '-')
        p++;
    if (p >= end)
        return NULL;
    ptr digits = p;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (p < end && is_digit[*p])
            p++;
    else
        return NULL;
    Py_ssize_t int_digits = p - digits;
    if (int_digits > MAX_INT_DIGITS)
        return NULL;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit[*p])
            return NULL;
        while (p < end && is_digit[*p])
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int negative = 0;
        long exponent = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            negative = *p == '-';
            p++;
        }
        ptr first = p;
        while (p < end && is_digit[*p]) {
            if (p - first >= MAX_EXP_DIGITS)
                return NULL;
            exponent = exponent * 10 + (*p - '0');
            p++;
        }
        if (p == first)
            return NULL;
        /* (a negative exponent only underflows, to a finite value) */
        if (!negative && int_digits + exponent > MAX_MAGNITUDE)
            return NULL;
    }
    return p;
}

static ptr object(Line *line, ptr p, int role, int depth);
static ptr value_end(Line *line, ptr p, int depth);

/* After a container's item, p just past it (NULL: the item was not valid): past `close`,
 * with *closed set; or past the comma and the blanks before the next item; else NULL */
static inline ptr
after_item(ptr p, ptr end, char close, int *closed)
{
    if (p == NULL)
        return NULL;
    p = skip_ws(p, end);
    if (p >= end)
        return NULL;
    if (*p == close) {
        *closed = 1;
        return p + 1;
    }
    if (*p != ',')
        return NULL;
    return skip_ws(p + 1, end);
}

static ptr
array(Line *line, ptr p, int depth)
{
    ptr end = line->end;
    if (depth > MAX_DEPTH)
        return NULL;
    p = skip_ws(p, end);
    if (p < end && *p == ']')
        return p + 1;
    for (;;) {
        int closed = 0;
        p = after_item(value_end(line, p, depth), end, ']', &closed);
        if (p == NULL || closed)
            return p;
    }
}

/* p at the first byte of a value inside a container of depth `depth`: past it, or NULL */
static ptr
value_end(Line *line, ptr p, int depth)
{
    ptr end = line->end;
    int escaped = 0;
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"':
        return string(p + 1, end, &escaped);
    case '{':
        return object(line, p + 1, ROLE_OTHER, depth + 1);
    case '[':
        return array(line, p + 1, depth + 1);
    case 't':
        return end - p >= 4 && memcmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f':
        return end - p >= 5 && memcmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n':
        return end - p >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default:
        if (*p == '-' || is_digit[*p])
            return number(p, end);
        return NULL;
    }
}

static inline int
key_of(int role, ptr k, Py_ssize_t n)
{
#define IS(lit) (n == (Py_ssize_t)sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)
    switch (role) {
    case ROLE_TOP:
        if (IS("jsonrpc"))
            return KEY_JSONRPC;
        if (IS("method"))
            return KEY_METHOD;
        if (IS("id"))
            return KEY_ID;
        if (IS("params"))
            return KEY_PARAMS;
        return KEY_OTHER;
    case ROLE_PARAMS:
        if (IS("sessionId"))
            return KEY_SID;
        if (IS("update"))
            return KEY_UPDATE;
        return KEY_OTHER;
    case ROLE_UPDATE:
        return IS("sessionUpdate") ? KEY_KIND : KEY_OTHER;
    default:
        return KEY_OTHER;
    }
#undef IS
}

/* p at a '"': the string's content (no escape allowed) in *s, *n; past it, or NULL */
static inline ptr
plain_string(ptr p, ptr end, ptr *s, Py_ssize_t *n)
{
    int escaped = 0;
    if (p >= end || *p != '"')
        return NULL;
    *s = p + 1;
    p = string(p + 1, end, &escaped);
    if (p == NULL || escaped)
        return NULL;
    *n = p - 1 - *s;
    return p;
}

static int
is_setup_kind(PyObject *setup, ptr s, Py_ssize_t n)
{
    Py_ssize_t count = PyTuple_GET_SIZE(setup);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *kind = PyTuple_GET_ITEM(setup, i);
        if (PyBytes_GET_SIZE(kind) == n && memcmp(PyBytes_AS_STRING(kind), s, n) == 0)
            return 1;
    }
    return 0;
}

/* p just past a '{' opening an object of depth `depth`: past its '}', or NULL */
static ptr
object(Line *line, ptr p, int role, int depth)
{
    ptr end = line->end;
    if (depth > MAX_DEPTH)
        return NULL;
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        return p + 1;
    for (;;) {
        int escaped = 0, key = KEY_OTHER;
        if (p >= end || *p != '"')
            return NULL;
        ptr k = p + 1;
        p = string(k, end, &escaped);
        if (p == NULL)
            return NULL;
        if (role != ROLE_OTHER) {
            if (escaped) /* (it might spell a member read: not sure) */
                return NULL;
            key = key_of(role, k, p - 1 - k);
        }
        p = skip_ws(p, end);
        if (p >= end || *p != ':')
            return NULL;
        p = skip_ws(p + 1, end);
        if (p >= end)
            return NULL;
        ptr s;
        Py_ssize_t n;
        switch (key) {
        case KEY_JSONRPC:
            if (line->seen & SEEN_JSONRPC || end - p < 5 || memcmp(p, "\"2.0\"", 5) != 0)
                return NULL;
            line->seen |= SEEN_JSONRPC;
            p += 5;
            break;
        case KEY_METHOD:
            if (line->seen & SEEN_METHOD || end - p < 16 ||
                memcmp(p, "\"session/update\"", 16) != 0)
                return NULL;
            line->seen |= SEEN_METHOD;
            p += 16;
            break;
        case KEY_ID:
            return NULL; /* a request: never plain */
        case KEY_PARAMS:
            if (line->seen & SEEN_PARAMS || *p != '{')
                return NULL;
            line->seen |= SEEN_PARAMS;
            p = object(line, p + 1, ROLE_PARAMS, depth + 1);
            break;
        case KEY_SID:
            if (line->seen & SEEN_SID)
                return NULL;
            line->seen |= SEEN_SID;
            p = plain_string(p, end, &line->sid, &line->sid_len);
            break;
        case KEY_UPDATE:
            if (line->seen & SEEN_UPDATE || *p != '{')
                return NULL;
            line->seen |= SEEN_UPDATE;
            p = object(line, p + 1, ROLE_UPDATE, depth + 1);
            break;
        case KEY_KIND:
            if (line->seen & SEEN_KIND)
                return NULL;
            line->seen |= SEEN_KIND;
            p = plain_string(p, end, &s, &n);
            if (p != NULL && is_setup_kind(line->setup, s, n))
                return NULL;
            break;
        default:
            p = value_end(line, p, depth);
        }
        int closed = 0;
        p = after_item(p, end, '}', &closed);
        if (p == NULL || closed)
            return p;
    }
}

/* Whether the line [p, end) (no newline) is a plain update; its session id in line->sid */
static int
is_plain(Line *line, ptr p, ptr end)
{
    if (end[-1] == '\r')
        end--; /* (JSON whitespace; any other CR is refused by the grammar) */
    line->end = end;
    line->seen = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = object(line, p + 1, ROLE_TOP, 1);
    if (p == NULL)
        return 0;
    return skip_ws(p, end) == end && line->seen == SEEN_ALL;
}

static int
append_steal(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *
tuple_of(int n, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, Py_ssize_t d)
{
    Py_ssize_t values[4] = {a, b, c, d};
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(values[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *
run_tuple(Py_ssize_t start, Py_ssize_t end, Py_ssize_t count, ptr sid, Py_ssize_t sid_len)
{
    PyObject *t = PyTuple_New(5);
    if (t == NULL)
        return NULL;
    PyObject *items[5] = {
        PyLong_FromLong(0),
        PyLong_FromSsize_t(start),
        PyLong_FromSsize_t(end),
        PyLong_FromSsize_t(count),
        /* (validated UTF-8 without escapes: the reference's str, byte for byte) */
        PyUnicode_DecodeUTF8((const char *)sid, sid_len, "strict"),
    };
    for (int i = 0; i < 5; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 5; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(t);
            return NULL;
        }
    }
    for (int i = 0; i < 5; i++)
        PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

static PyObject *
scan(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t max_line, max_run = PY_SSIZE_T_MAX;
    PyObject *setup, *out = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nO!|n:scan", &buf, &max_line, &PyTuple_Type, &setup,
                          &max_run))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(setup); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(setup, i))) {
            PyErr_SetString(PyExc_TypeError, "the setup kinds must be bytes");
            goto done;
        }
    ptr base = buf.buf, end = base + buf.len, p = base;
    if (buf.len && end[-1] != '\n') {
        PyErr_SetString(PyExc_ValueError, "the block must end with a newline");
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    Line line;
    line.setup = setup;
    /* the run being grown: run_start < 0 when none */
    Py_ssize_t run_start = -1, run_end = 0, run_count = 0, sid_len = 0;
    ptr sid = NULL;
#define FLUSH()                                                                  \
    do {                                                                         \
        if (run_start >= 0) {                                                    \
            if (append_steal(out, run_tuple(run_start, run_end, run_count, sid, sid_len)) < 0) \
                goto fail;                                                       \
            run_start = -1;                                                      \
        }                                                                        \
    } while (0)
    while (p < end) {
        ptr nl = memchr(p, '\n', end - p);
        Py_ssize_t len = nl - p, start = p - base;
        if (len > max_line) {
            FLUSH();
            if (append_steal(out, tuple_of(2, 2, len, 0, 0)) < 0)
                goto fail;
        }
        else if (len == 0 || (len == 1 && *p == '\r')) {
            FLUSH();
        }
        else if (is_plain(&line, p, nl)) {
            if (run_start >= 0 && run_count < max_run && line.sid_len == sid_len &&
                memcmp(line.sid, sid, sid_len) == 0) {
                run_end = nl + 1 - base;
                run_count++;
            }
            else {
                FLUSH();
                run_start = start;
                run_end = nl + 1 - base;
                run_count = 1;
                sid = line.sid;
                sid_len = line.sid_len;
            }
        }
        else {
            FLUSH();
            if (append_steal(out, tuple_of(3, 1, start, nl - base, 0)) < 0)
                goto fail;
        }
        p = nl + 1;
    }
    FLUSH();
#undef FLUSH
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyBuffer_Release(&buf);
    return out;
}

/* ------------------------------------------------------------------------------------------
 * A journal run with each line's prefix shared with the line before elided: elide() and
 * restore(). acp_bridge/store/elide.py is the definition (elide_reference, restore_reference) and
 * says what the format is; these are the same, held equal to it by tests/store/test_elide.py.
 */

#define MAX_VARINT 9

/* the length of the common prefix of a[0:an] and b[0:bn] */
static inline Py_ssize_t
common_prefix(ptr a, Py_ssize_t an, ptr b, Py_ssize_t bn)
{
    Py_ssize_t m = an < bn ? an : bn, i = 0;
    while (m - i >= 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y)
            break;
        i += 8;
    }
    while (i < m && a[i] == b[i])
        i++;
    return i;
}

static inline Py_ssize_t
varint_size(Py_ssize_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* data[0:n] elided into out (room for n bytes): the size written, or -1 when it would not be
 * smaller than n */
static Py_ssize_t
elide_into(ptr data, Py_ssize_t n, unsigned char *out)
{
    ptr p = data, end = data + n, prev = data;
    Py_ssize_t at = 0, prev_len = 0;
    while (p < end) {
        /* (compared up to the end of the data: the line before holds no newline, so the
         * prefix stops at this line's newline at the latest; the newline is searched for
         * after it, each byte read once) */
        Py_ssize_t shared = common_prefix(prev, prev_len, p, end - p);
        ptr nl = memchr(p + shared, '\n', end - p - shared);
        ptr content_end = nl != NULL ? nl : end, stop = nl != NULL ? nl + 1 : end;
        Py_ssize_t len = content_end - p;
        Py_ssize_t rest = (stop - p) - shared;
        /* (the output must end below n: each record adds at least one byte) */
        if (at + varint_size(shared) + rest >= n)
            return -1;
        Py_ssize_t v = shared;
        while (v >= 0x80) {
            out[at++] = (unsigned char)((v & 0x7F) | 0x80);
            v >>= 7;
        }
        out[at++] = (unsigned char)v;
        memcpy(out + at, p + shared, rest);
        at += rest;
        prev = p;
        prev_len = len;
        p = stop;
    }
    return at < n ? at : -1;
}

static PyObject *
elide(PyObject *self, PyObject *arg)
{
    Py_buffer buf;
    (void)self;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    if (buf.len > 0)
        out = PyBytes_FromStringAndSize(NULL, buf.len);
    if (buf.len > 0 && out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t size = -1;
    if (out != NULL) {
        /* (with the GIL held: a run of 64 KiB is over in a few microseconds, and letting the
         * GIL go for so little costs the writer a context switch to take it back) */
        size = elide_into(buf.buf, buf.len, (unsigned char *)PyBytes_AS_STRING(out));
    }
    PyBuffer_Release(&buf);
    if (size < 0) {
        Py_XDECREF(out);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&out, size) < 0)
        return NULL;
    return out;
}

/* blob[0:n] restored into out[0:size]: NULL, or what is wrong with the blob */
static const char *
restore_into(ptr blob, Py_ssize_t n, unsigned char *out, Py_ssize_t size)
{
    ptr p = blob, end = blob + n;
    const unsigned char *prev = out;
    Py_ssize_t at = 0, prev_len = 0;
    while (p < end) {
        uint64_t shared = 0;
        int count = 0;
        for (;;) {
            if (count == MAX_VARINT)
                return "a prefix length of more than 9 bytes";
            if (p >= end)
                return "a record cut short in its prefix length";
            unsigned char byte = *p++;
            shared |= (uint64_t)(byte & 0x7F) << (7 * count);
            count++;
            if (!(byte & 0x80)) {
                if (byte == 0 && count > 1)
                    return "a prefix length not minimal";
                break;
            }
        }
        if (shared > (uint64_t)prev_len)
            return "a prefix longer than the line before";
        Py_ssize_t s = (Py_ssize_t)shared;
        ptr nl = memchr(p, '\n', end - p);
        ptr content_end = nl != NULL ? nl : end, stop = nl != NULL ? nl + 1 : end;
        Py_ssize_t rest = stop - p, content = content_end - p;
        if (s < prev_len && content > 0 && p[0] == prev[s])
            return "a shared prefix not whole";
        if (nl == NULL && s + rest == 0)
            return "an empty last line";
        if (s + rest > size - at)
            return "more bytes than the index says";
        /* (the line before ends before `at`: the copies do not overlap) */
        memcpy(out + at, prev, s);
        memcpy(out + at + s, p, rest);
        prev = out + at;
        prev_len = s + content;
        at += s + rest;
        p = stop;
    }
    return at == size ? NULL : "fewer bytes than the index says";
}

static PyObject *
restore(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t size;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n:restore", &buf, &size))
        return NULL;
    if (size < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "a negative size");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const char *error = restore_into(buf.buf, buf.len, (unsigned char *)PyBytes_AS_STRING(out), size);
    PyBuffer_Release(&buf);
    if (error != NULL) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(block, max_line, setup_kinds[, max_run]) -> segments; see acp_bridge.protocol.scan"},
    {"elide", elide, METH_O, "elide(data) -> bytes or None; see acp_bridge.store.elide"},
    {"restore", restore, METH_VARARGS, "restore(blob, size) -> bytes; see acp_bridge.store.elide"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "acp_bridge.protocol.scanc",
    "The C line scanner and journal run codec; acp_bridge.protocol.scan and acp_bridge.store.elide are "
    "their definitions and interfaces.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_scanc(void)
{
    init_tables();
    return PyModule_Create(&module);
}
