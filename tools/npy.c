/*
 * npy.c -- NumPy .npy files: a strict reader and a numpy-identical writer.
 *
 * The layout (numpy's NEP 1), all integers little-endian:
 *
 *   offset 0   "\x93NUMPY"              magic
 *          6   major, minor             1.0, 2.0 or 3.0
 *          8   header length            u16 in 1.0, u32 in 2.0 and 3.0
 *   8+2 | 8+4  header                   "{'descr': '<f4', 'fortran_order': False,
 *                                         'shape': (2, 3), }" + spaces + '\n'
 *   then       data                     C order, exactly count * itemsize bytes
 *
 * Reading goes through a byte_source (a FILE or a memory image) in fixed
 * chunks, so both paths share one parser and a float32 result never needs a
 * second copy of the raw data.  When the total size is known (memory,
 * regular files) a header that promises more data than there is fails before
 * anything is allocated.
 */
#include "tools/npy.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static_assert(sizeof(float) == 4 && sizeof(double) == 8,
              "the .npy conversions assume 4-byte IEEE floats and 8-byte IEEE doubles");

#if defined(__GNUC__)
#define NPY_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define NPY_PRINTF(fmt_index, first_arg)
#endif

/* Data moves through a stack buffer of this size; a multiple of every itemsize. */
enum { CHUNK_BYTES = 1 << 16 };

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* numpy's writer leaves room for axis 0 to grow to this many digits in place. */
enum { GROWTH_AXIS_MAX_DIGITS = 21 };
/* numpy aligns the data start to this, for memory mapping. */
enum { ARRAY_ALIGN = 64 };

/* The dtypes attnjit reads, as numpy spells them after the byte order. */
typedef enum npy_dtype { DTYPE_F2, DTYPE_F4, DTYPE_F8, DTYPE_I4, DTYPE_U1, DTYPE_COUNT } npy_dtype;

static const struct dtype_info {
    const char *code;
    size_t itemsize;
    int is_float;
} dtype_table[DTYPE_COUNT] = {
    [DTYPE_F2] = {"f2", 2, 1},
    [DTYPE_F4] = {"f4", 4, 1},
    [DTYPE_F8] = {"f8", 8, 1},
    [DTYPE_I4] = {"i4", 4, 0},
    [DTYPE_U1] = {"u1", 1, 0},   /* f8 KV-cache codes, widened to int32 */
};

/* What the caller asked for: float32 (from any float dtype) or int32 as is. */
typedef enum element_want { WANT_F32, WANT_I32 } element_want;

/* Both results are four bytes wide in memory. */
enum { RESULT_ITEMSIZE = 4 };

/* Where messages go: "name: text", truncated to errcap. */
typedef struct report {
    const char *name;
    char *err;
    size_t errcap;
} report;

/* The parsed header: the dict's three values plus what follows from them. */
typedef struct npy_header {
    char descr[16];
    int fortran_order;
    int rank;
    int64_t shape[NPY_MAX_RANK];
    npy_dtype dtype;
    uint64_t count;      /* elements */
    uint64_t data_bytes; /* count * itemsize, as stored */
} npy_header;

#define SOURCE_SIZE_UNKNOWN UINT64_MAX

typedef struct byte_source {
    FILE *file;               /* NULL for a memory image */
    const unsigned char *mem;
    uint64_t size;            /* total bytes, or SOURCE_SIZE_UNKNOWN (pipes) */
    uint64_t pos;
    int read_errno;           /* why a file read failed; 0 when it did not */
} byte_source;

static npy_status read_file(const char *path, element_want want, npy_array *out, char *err,
                            size_t errcap);
static npy_status read_memory(const void *data, size_t len, const char *name, element_want want,
                              npy_array *out, char *err, size_t errcap);
static npy_status read_array(byte_source *src, element_want want, npy_array *out,
                             const report *rep);
static npy_status write_array(const char *path, const void *data, npy_dtype dtype, int rank,
                              const int64_t *shape, char *err, size_t errcap);

/* ------------------------------------------------------------ public entries */

npy_status npy_read_f32(const char *path, npy_array *out, char *err, size_t errcap)
{
    return read_file(path, WANT_F32, out, err, errcap);
}

npy_status npy_read_i32(const char *path, npy_array *out, char *err, size_t errcap)
{
    return read_file(path, WANT_I32, out, err, errcap);
}

npy_status npy_read_f32_mem(const void *data, size_t len, const char *name, npy_array *out,
                            char *err, size_t errcap)
{
    return read_memory(data, len, name, WANT_F32, out, err, errcap);
}

npy_status npy_read_i32_mem(const void *data, size_t len, const char *name, npy_array *out,
                            char *err, size_t errcap)
{
    return read_memory(data, len, name, WANT_I32, out, err, errcap);
}

npy_status npy_write_f32(const char *path, const float *data, int rank, const int64_t *shape,
                         char *err, size_t errcap)
{
    return write_array(path, data, DTYPE_F4, rank, shape, err, errcap);
}

npy_status npy_write_i32(const char *path, const int32_t *data, int rank, const int64_t *shape,
                         char *err, size_t errcap)
{
    return write_array(path, data, DTYPE_I4, rank, shape, err, errcap);
}

void npy_free(npy_array *a)
{
    if (!a)
        return;
    free(a->f32);
    free(a->i32);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------ small helpers */

NPY_PRINTF(3, 4)
static npy_status fail(const report *rep, npy_status status, const char *fmt, ...)
{
    if (rep->err && rep->errcap > 0) {
        int n = snprintf(rep->err, rep->errcap, "%s: ", rep->name);
        if (n >= 0 && (size_t)n < rep->errcap) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(rep->err + n, rep->errcap - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return status;
}

/* *out = a * b when that is at most limit; 0 (and *out untouched) otherwise.
 * Division instead of multiplication, so nothing can overflow. */
static int mul_within(uint64_t a, uint64_t b, uint64_t limit, uint64_t *out)
{
    if (b != 0 && a > limit / b)
        return 0;
    *out = a * b;
    return 1;
}

/* The largest byte count we read or write: the cap, or what size_t can hold. */
static uint64_t data_byte_limit(void)
{
    return NPY_MAX_DATA_BYTES < (uint64_t)SIZE_MAX ? NPY_MAX_DATA_BYTES : (uint64_t)SIZE_MAX;
}

/* The element count of a shape whose dims are already known to be >= 0, or 0
 * when the data (stored and as a 4-byte result) would pass the byte limit.
 * Zero dims are skipped so that every nonzero dim is bounded as well. */
static int element_count(int rank, const int64_t *shape, size_t itemsize, uint64_t *count)
{
    size_t widest = itemsize > RESULT_ITEMSIZE ? itemsize : RESULT_ITEMSIZE;
    uint64_t limit = data_byte_limit() / widest;
    uint64_t product = 1;
    int any_zero = 0;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0)
            any_zero = 1;
        else if (!mul_within(product, (uint64_t)shape[i], limit, &product))
            return 0;
    }
    *count = any_zero ? 0 : product;
    return 1;
}

/* A shape as Python writes a tuple: "()", "(5,)", "(2, 3)". */
static void format_shape(char *buf, size_t cap, int rank, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, rank == 1 ? ",)" : ")");
}

/* Room for format_shape of NPY_MAX_RANK int64 dims. */
enum { SHAPE_TEXT_CAP = 4 + NPY_MAX_RANK * 22 };

static uint64_t load_le(const unsigned char *p, size_t bytes)
{
    uint64_t v = 0;
    for (size_t i = bytes; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

static void store_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* IEEE half to float: exact, since every half is a float32 value. */
static float half_to_float(uint16_t half)
{
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1fu;
    uint32_t mantissa = half & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | mantissa << 13; /* inf, or NaN with its payload */
    } else if (exponent != 0) {
        bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
    } else if (mantissa == 0) {
        bits = sign;
    } else {
        /* A subnormal m * 2^-24 is a normal float32: shift the leading one
         * up to the implicit bit, lowering the exponent once per step. */
        uint32_t shift = 0;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            shift++;
        }
        bits = sign | (127 - 14 - shift) << 23 | (mantissa & 0x3ffu) << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ------------------------------------------------------------ byte sources */

static size_t source_read(byte_source *src, void *dst, size_t n)
{
    size_t got;
    if (src->file) {
        errno = 0;
        got = fread(dst, 1, n, src->file);
        if (got < n && ferror(src->file))
            src->read_errno = errno ? errno : EIO;
    } else {
        uint64_t left = src->size - src->pos;
        got = n < left ? n : (size_t)left;
        if (got)
            memcpy(dst, src->mem + src->pos, got);
    }
    src->pos += got;
    return got;
}

static npy_status read_file(const char *path, element_want want, npy_array *out, char *err,
                            size_t errcap)
{
    report rep = {path ? path : "<null>", err, errcap};
    if (!out)
        return fail(&rep, NPY_ERR_INVALID_ARG, "the output array is NULL");
    memset(out, 0, sizeof *out);
    if (!path)
        return fail(&rep, NPY_ERR_INVALID_ARG, "the path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(&rep, NPY_ERR_IO, "cannot open: %s", strerror(errno));
    byte_source src = {.file = f, .size = SOURCE_SIZE_UNKNOWN};
    struct stat st;
    if (fstat(fileno(f), &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            fclose(f);
            return fail(&rep, NPY_ERR_IO, "cannot read: %s", strerror(EISDIR));
        }
        if (S_ISREG(st.st_mode))
            src.size = (uint64_t)st.st_size;
    }
    npy_status status = read_array(&src, want, out, &rep);
    fclose(f);
    return status;
}

static npy_status read_memory(const void *data, size_t len, const char *name, element_want want,
                              npy_array *out, char *err, size_t errcap)
{
    report rep = {name ? name : "<memory>", err, errcap};
    if (!out)
        return fail(&rep, NPY_ERR_INVALID_ARG, "the output array is NULL");
    memset(out, 0, sizeof *out);
    if (!data && len > 0)
        return fail(&rep, NPY_ERR_INVALID_ARG, "data is NULL but len is %zu", len);
    byte_source src = {.mem = data, .size = len};
    return read_array(&src, want, out, &rep);
}

/* ------------------------------------------------------------ the reader */

static npy_status read_header(byte_source *src, npy_header *h, const report *rep);
static npy_status check_header(npy_header *h, element_want want, const report *rep);
static npy_status read_data(byte_source *src, const npy_header *h, npy_array *out,
                            const report *rep);

static npy_status read_array(byte_source *src, element_want want, npy_array *out,
                             const report *rep)
{
    npy_header h;
    npy_status status = read_header(src, &h, rep);
    if (status == NPY_OK)
        status = check_header(&h, want, rep);
    if (status != NPY_OK)
        return status;

    if (src->size != SOURCE_SIZE_UNKNOWN) {
        uint64_t have = src->size - src->pos;
        if (have < h.data_bytes)
            return fail(rep, NPY_ERR_FORMAT,
                        "truncated data: header promises %" PRIu64 " bytes, file has %" PRIu64,
                        h.data_bytes, have);
        if (have > h.data_bytes)
            return fail(rep, NPY_ERR_FORMAT,
                        "trailing data: header promises %" PRIu64 " bytes, file has %" PRIu64,
                        h.data_bytes, have);
    }

    out->rank = h.rank;
    memcpy(out->shape, h.shape, sizeof h.shape);
    memcpy(out->dtype, dtype_table[h.dtype].code, 3);
    out->count = (size_t)h.count;
    /* One byte for an empty array, so a successful read always has data. */
    size_t result_bytes = h.count ? (size_t)h.count * RESULT_ITEMSIZE : 1;
    void *result = malloc(result_bytes);
    if (!result) {
        npy_free(out);
        return fail(rep, NPY_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for the data",
                    result_bytes);
    }
    if (dtype_table[h.dtype].is_float)
        out->f32 = result;
    else
        out->i32 = result;

    status = read_data(src, &h, out, rep);
    if (status != NPY_OK)
        npy_free(out);
    return status;
}

/* ---- the preamble */

static npy_status parse_header_dict(const char *text, size_t len, npy_header *h,
                                    const report *rep);

static npy_status read_header(byte_source *src, npy_header *h, const report *rep)
{
    unsigned char preamble[12];
    size_t got = source_read(src, preamble, 8);
    if (src->read_errno)
        return fail(rep, NPY_ERR_IO, "cannot read: %s", strerror(src->read_errno));
    if (got == 0)
        return fail(rep, NPY_ERR_FORMAT, "empty file, not a .npy array");
    size_t magic_seen = got < sizeof npy_magic ? got : sizeof npy_magic;
    if (memcmp(preamble, npy_magic, magic_seen) != 0)
        return fail(rep, NPY_ERR_FORMAT, "not a .npy file (bad magic)");
    if (got < 8)
        return fail(rep, NPY_ERR_FORMAT, "truncated: the file ends inside the preamble (%zu bytes)",
                    got);

    int major = preamble[6], minor = preamble[7];
    if (major < 1 || major > 3 || minor != 0)
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "unsupported .npy format version %d.%d (attnjit reads 1.0, 2.0 and 3.0)",
                    major, minor);
    size_t length_bytes = major == 1 ? 2 : 4;
    got = source_read(src, preamble + 8, length_bytes);
    if (src->read_errno)
        return fail(rep, NPY_ERR_IO, "cannot read: %s", strerror(src->read_errno));
    if (got < length_bytes)
        return fail(rep, NPY_ERR_FORMAT,
                    "truncated: the file ends inside the preamble (%zu bytes)", 8 + got);

    uint64_t header_len = load_le(preamble + 8, length_bytes);
    if (src->size != SOURCE_SIZE_UNKNOWN && header_len > src->size - src->pos)
        return fail(rep, NPY_ERR_FORMAT,
                    "header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)",
                    header_len, src->size);
    if (header_len > NPY_MAX_HEADER_BYTES)
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "header length %" PRIu64 " is over the limit of %d bytes", header_len,
                    NPY_MAX_HEADER_BYTES);

    char text[NPY_MAX_HEADER_BYTES];
    got = source_read(src, text, (size_t)header_len);
    if (src->read_errno)
        return fail(rep, NPY_ERR_IO, "cannot read: %s", strerror(src->read_errno));
    if (got < header_len)
        return fail(rep, NPY_ERR_FORMAT,
                    "truncated: header length %" PRIu64 " but the file ends %zu bytes into it",
                    header_len, got);
    return parse_header_dict(text, (size_t)header_len, h, rep);
}

/* ---- the header dict
 *
 * Exactly the Python literal numpy writes, not Python's whole grammar:
 *
 *   header := ' '* '{' ' '* [entry (' '* ',' ' '* entry)* [' '* ',']] ' '* '}' ' '* '\n'
 *   entry  := string ' '* ':' ' '* value
 *   value  := string | 'True' | 'False' | '(' [dim (',' dim)* [',']] ')'
 *
 * with spaces allowed around every token of a shape, a 1-tuple needing its
 * trailing comma as in Python, dims written in decimal without sign or
 * leading zeros, and strings quoted with ' or " holding printable ASCII
 * without backslashes.
 */

enum header_key { KEY_DESCR, KEY_FORTRAN_ORDER, KEY_SHAPE, KEY_COUNT };
static const char *const header_key_names[KEY_COUNT] = {
    [KEY_DESCR] = "descr",
    [KEY_FORTRAN_ORDER] = "fortran_order",
    [KEY_SHAPE] = "shape",
};

enum { HEADER_STRING_CAP = 32 };

typedef struct header_parser {
    const char *text; /* the header's first byte, for offsets in messages */
    const char *pos;
    const char *end;  /* the final '\n' */
    const report *rep;
} header_parser;

/* What stands at the cursor for messages: up to 12 characters, to the next
 * space, quoted and made printable. */
static const char *describe_next(const header_parser *p, char *buf, size_t cap)
{
    if (p->pos == p->end)
        return "the end of the header";
    size_t n = 0;
    buf[n++] = '\'';
    for (const char *c = p->pos; c < p->end && c < p->pos + 12 && n + 6 < cap; c++) {
        unsigned char ch = (unsigned char)*c;
        if (ch == ' ' && c > p->pos)
            break;
        if (ch >= 0x20 && ch < 0x7f)
            buf[n++] = (char)ch;
        else
            n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", ch);
    }
    buf[n++] = '\'';
    buf[n] = '\0';
    return buf;
}

NPY_PRINTF(2, 3)
static npy_status syntax_error(const header_parser *p, const char *fmt, ...)
{
    char what[160], found[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fail(p->rep, NPY_ERR_FORMAT, "header byte %td: %s, found %s", p->pos - p->text, what,
                describe_next(p, found, sizeof found));
}

static void skip_spaces(header_parser *p)
{
    while (p->pos < p->end && *p->pos == ' ')
        p->pos++;
}

static int at(const header_parser *p, char c)
{
    return p->pos < p->end && *p->pos == c;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* A character that would continue a Python name or number. */
static int continues_token(const header_parser *p)
{
    if (p->pos == p->end)
        return 0;
    char c = *p->pos;
    return is_digit(c) || c == '_' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static npy_status parse_string(header_parser *p, char *dst, const char *what)
{
    if (!at(p, '\'') && !at(p, '"'))
        return syntax_error(p, "expected %s in quotes", what);
    /* Find the closing quote first, so a missing one is named as such. */
    const char *close = memchr(p->pos + 1, *p->pos, (size_t)(p->end - p->pos - 1));
    if (!close)
        return fail(p->rep, NPY_ERR_FORMAT, "header byte %td: unterminated string",
                    p->pos - p->text);
    size_t n = 0;
    for (p->pos++; p->pos < close; p->pos++) {
        char c = *p->pos;
        if (c < 0x20 || c > 0x7e || c == '\\')
            return syntax_error(p, "expected printable ASCII without '\\' in a string");
        if (n + 1 == HEADER_STRING_CAP)
            return syntax_error(p, "expected a string of at most %d characters",
                                HEADER_STRING_CAP - 1);
        dst[n++] = c;
    }
    p->pos++;
    dst[n] = '\0';
    return NPY_OK;
}

static npy_status parse_bool(header_parser *p, int *value)
{
    static const char *const words[2] = {"False", "True"};
    for (int v = 0; v < 2; v++) {
        size_t n = strlen(words[v]);
        if ((size_t)(p->end - p->pos) >= n && memcmp(p->pos, words[v], n) == 0) {
            p->pos += n;
            if (continues_token(p)) {
                p->pos -= n;
                break;
            }
            *value = v;
            return NPY_OK;
        }
    }
    return syntax_error(p, "expected True or False for 'fortran_order'");
}

static npy_status parse_dim(header_parser *p, int64_t *dim)
{
    if (at(p, '-') && p->pos + 1 < p->end && is_digit(p->pos[1]))
        return fail(p->rep, NPY_ERR_FORMAT, "header byte %td: negative dimension in 'shape'",
                    p->pos - p->text);
    if (p->pos == p->end || !is_digit(*p->pos))
        return syntax_error(p, "expected a non-negative integer dimension");
    const char *start = p->pos;
    if (*p->pos == '0' && p->pos + 1 < p->end && is_digit(p->pos[1]))
        return syntax_error(p, "expected a dimension without leading zeros");
    int64_t value = 0;
    while (p->pos < p->end && is_digit(*p->pos)) {
        int digit = *p->pos - '0';
        if (value > (INT64_MAX - digit) / 10) {
            p->pos = start;
            return syntax_error(p, "expected a dimension below 2^63");
        }
        value = value * 10 + digit;
        p->pos++;
    }
    if (continues_token(p)) {
        p->pos = start;
        return syntax_error(p, "expected a non-negative integer dimension");
    }
    *dim = value;
    return NPY_OK;
}

static npy_status parse_shape(header_parser *p, npy_header *h)
{
    if (!at(p, '('))
        return syntax_error(p, "expected a tuple '(...)' for 'shape'");
    p->pos++;
    skip_spaces(p);
    h->rank = 0;
    int trailing_comma = 0;
    while (!at(p, ')')) {
        if (h->rank == NPY_MAX_RANK)
            return syntax_error(p, "expected at most %d dimensions in 'shape'", NPY_MAX_RANK);
        npy_status status = parse_dim(p, &h->shape[h->rank]);
        if (status != NPY_OK)
            return status;
        h->rank++;
        skip_spaces(p);
        trailing_comma = at(p, ',');
        if (trailing_comma) {
            p->pos++;
            skip_spaces(p);
        } else if (!at(p, ')')) {
            return syntax_error(p, "expected ',' or ')' in 'shape'");
        }
    }
    if (h->rank == 1 && !trailing_comma)
        return syntax_error(p, "expected a trailing comma in a 1-tuple 'shape' ((n,), not (n))");
    p->pos++;
    return NPY_OK;
}

static npy_status parse_descr(header_parser *p, npy_header *h)
{
    char descr[HEADER_STRING_CAP];
    npy_status status = parse_string(p, descr, "a dtype string such as '<f4' for 'descr'");
    if (status != NPY_OK)
        return status;
    if (strlen(descr) >= sizeof h->descr)
        return fail(p->rep, NPY_ERR_UNSUPPORTED, "unsupported dtype '%s'", descr);
    memcpy(h->descr, descr, strlen(descr) + 1);
    return NPY_OK;
}

static npy_status parse_header_dict(const char *text, size_t len, npy_header *h,
                                    const report *rep)
{
    memset(h, 0, sizeof *h);
    if (len == 0 || text[len - 1] != '\n')
        return fail(rep, NPY_ERR_FORMAT, "header does not end with a newline");
    header_parser p = {.text = text, .pos = text, .end = text + len - 1, .rep = rep};

    skip_spaces(&p);
    if (!at(&p, '{'))
        return syntax_error(&p, "expected '{' to open the header dict");
    p.pos++;
    int seen[KEY_COUNT] = {0};
    for (;;) {
        skip_spaces(&p);
        if (at(&p, '}'))
            break;
        if (p.pos == p.end)
            return syntax_error(&p, "expected '}' to close the header dict");
        const char *key_start = p.pos;
        char name[HEADER_STRING_CAP];
        npy_status status = parse_string(&p, name, "a key or '}'");
        if (status != NPY_OK)
            return status;
        enum header_key key = KEY_COUNT;
        for (int k = 0; k < KEY_COUNT; k++)
            if (strcmp(name, header_key_names[k]) == 0)
                key = (enum header_key)k;
        if (key == KEY_COUNT)
            return fail(rep, NPY_ERR_FORMAT,
                        "header byte %td: unknown key '%s' (expected 'descr', "
                        "'fortran_order' and 'shape')",
                        key_start - text, name);
        if (seen[key])
            return fail(rep, NPY_ERR_FORMAT, "header byte %td: duplicate key '%s'",
                        key_start - text, name);
        seen[key] = 1;

        skip_spaces(&p);
        if (!at(&p, ':'))
            return syntax_error(&p, "expected ':' after '%s'", name);
        p.pos++;
        skip_spaces(&p);
        if (key == KEY_DESCR)
            status = parse_descr(&p, h);
        else if (key == KEY_FORTRAN_ORDER)
            status = parse_bool(&p, &h->fortran_order);
        else
            status = parse_shape(&p, h);
        if (status != NPY_OK)
            return status;
        skip_spaces(&p);
        if (at(&p, ','))
            p.pos++;
        else if (!at(&p, '}'))
            return syntax_error(&p, "expected ',' or '}' after the value of '%s'", name);
    }
    p.pos++;
    skip_spaces(&p);
    if (p.pos != p.end)
        return syntax_error(&p, "expected only spaces after the header dict");
    for (int k = 0; k < KEY_COUNT; k++)
        if (!seen[k])
            return fail(rep, NPY_ERR_FORMAT, "header lacks the key '%s'", header_key_names[k]);
    return NPY_OK;
}

/* ---- what the header means */

static npy_status check_header(npy_header *h, element_want want, const report *rep)
{
    const char *descr = h->descr;
    if (descr[0] == '>')
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "big-endian dtype '%s' is not supported; save it little-endian "
                    "(arr.astype(arr.dtype.newbyteorder('<')))",
                    descr);
    h->dtype = DTYPE_COUNT;
    if (descr[0] == '<' || descr[0] == '=' || descr[0] == '|')
        for (int d = 0; d < DTYPE_COUNT; d++)
            if (strcmp(descr + 1, dtype_table[d].code) == 0)
                h->dtype = (npy_dtype)d;
    if (h->dtype == DTYPE_COUNT)
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "unsupported dtype '%s' (attnjit reads '<f2', '<f4', '<f8', '<i4' and '|u1')",
                    descr);
    if (want == WANT_F32 && !dtype_table[h->dtype].is_float)
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "dtype '%s' is an integer array; expected floats ('<f2', '<f4' or '<f8')",
                    descr);
    if (want == WANT_I32 && h->dtype != DTYPE_I4 && h->dtype != DTYPE_U1)
        return fail(rep, NPY_ERR_UNSUPPORTED, "dtype '%s' is not int32; expected '<i4'", descr);
    if (h->fortran_order)
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "fortran_order True is not supported; save a C-order array "
                    "(np.ascontiguousarray)");

    size_t itemsize = dtype_table[h->dtype].itemsize;
    if (!element_count(h->rank, h->shape, itemsize, &h->count)) {
        char shape[SHAPE_TEXT_CAP];
        format_shape(shape, sizeof shape, h->rank, h->shape);
        return fail(rep, NPY_ERR_UNSUPPORTED,
                    "shape %s of '%s' is too large: the data would pass the %" PRIu64
                    "-byte limit",
                    shape, descr, data_byte_limit());
    }
    h->data_bytes = h->count * itemsize;
    return NPY_OK;
}

/* ---- the data */

/* Converts n stored elements at raw into out, starting at element first. */
static npy_status convert_elements(const npy_header *h, const unsigned char *raw, size_t n,
                                   size_t first, npy_array *out, const report *rep)
{
    switch (h->dtype) {
    case DTYPE_F2:
        for (size_t i = 0; i < n; i++)
            out->f32[first + i] = half_to_float((uint16_t)load_le(raw + 2 * i, 2));
        break;
    case DTYPE_F4:
    case DTYPE_I4: {   /* the 4-byte words as they are */
        unsigned char *dst = h->dtype == DTYPE_F4 ? (unsigned char *)&out->f32[first]
                                                  : (unsigned char *)&out->i32[first];
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)load_le(raw + 4 * i, 4);
            memcpy(dst + 4 * i, &bits, sizeof bits);
        }
        break;
    }
    case DTYPE_F8:
        for (size_t i = 0; i < n; i++) {
            uint64_t bits = load_le(raw + 8 * i, 8);
            double wide;
            memcpy(&wide, &bits, sizeof wide);
            float narrow = (float)wide; /* rounds to nearest */
            /* An infinity made from a finite value would be a wrong answer. */
            if (isinf(narrow) && isfinite(wide))
                return fail(rep, NPY_ERR_UNSUPPORTED,
                            "element %zu of the '%s' data (%g) is outside the float32 range",
                            first + i, h->descr, wide);
            out->f32[first + i] = narrow;
        }
        break;
    case DTYPE_U1:
        for (size_t i = 0; i < n; i++)
            out->i32[first + i] = raw[i];
        break;
    case DTYPE_COUNT:
        break;
    }
    return NPY_OK;
}

static npy_status read_data(byte_source *src, const npy_header *h, npy_array *out,
                            const report *rep)
{
    size_t itemsize = dtype_table[h->dtype].itemsize;
    unsigned char chunk[CHUNK_BYTES];
    size_t done = 0;
    while (done < h->count) {
        size_t n = CHUNK_BYTES / itemsize;
        if (n > h->count - done)
            n = (size_t)h->count - done;
        size_t got = source_read(src, chunk, n * itemsize);
        if (src->read_errno)
            return fail(rep, NPY_ERR_IO, "cannot read: %s", strerror(src->read_errno));
        if (got < n * itemsize)
            return fail(rep, NPY_ERR_FORMAT,
                        "truncated data: header promises %" PRIu64 " bytes, file has %zu",
                        h->data_bytes, done * itemsize + got);
        npy_status status = convert_elements(h, chunk, n, done, out, rep);
        if (status != NPY_OK)
            return status;
        done += n;
    }
    /* Sources of unknown size (pipes) are checked for extra bytes only now. */
    unsigned char extra;
    size_t got = source_read(src, &extra, 1);
    if (src->read_errno)
        return fail(rep, NPY_ERR_IO, "cannot read: %s", strerror(src->read_errno));
    if (got)
        return fail(rep, NPY_ERR_FORMAT,
                    "trailing data: header promises %" PRIu64 " bytes, file has more",
                    h->data_bytes);
    return NPY_OK;
}

/* ------------------------------------------------------------ the writer */

/* Large enough for the preamble, the dict with NPY_MAX_RANK dims, the growth
 * room and the alignment padding. */
enum { HEADER_BUF_CAP = 512 };

/*
 * The version 1.0 preamble and header as numpy 2.x writes them, byte for
 * byte; returns the total length (a multiple of ARRAY_ALIGN):
 *
 *   \x93NUMPY 01 00 <u16 len> {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *   then GROWTH_AXIS_MAX_DIGITS - digits(shape[0]) spaces (rank > 0 only),
 *   then 1..64 spaces and '\n' so the data starts aligned (never 0 spaces:
 *   numpy pads a full 64 when already aligned).
 */
static size_t format_header(unsigned char *buf, const char *descr, int rank,
                            const int64_t *shape)
{
    char shape_text[SHAPE_TEXT_CAP];
    format_shape(shape_text, sizeof shape_text, rank, shape);
    char *dict = (char *)buf + 10;
    static_assert(10 + SHAPE_TEXT_CAP + 64 + GROWTH_AXIS_MAX_DIGITS + ARRAY_ALIGN + 1 <=
                      HEADER_BUF_CAP,
                  "HEADER_BUF_CAP holds the longest header");
    size_t n = (size_t)snprintf(dict, HEADER_BUF_CAP - 10,
                                "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
                                shape_text);
    if (rank > 0) {
        char first_dim[24];
        size_t growth = GROWTH_AXIS_MAX_DIGITS -
                        (size_t)snprintf(first_dim, sizeof first_dim, "%" PRId64, shape[0]);
        memset(dict + n, ' ', growth);
        n += growth;
    }
    size_t padding = ARRAY_ALIGN - (10 + n + 1) % ARRAY_ALIGN;
    memset(dict + n, ' ', padding);
    n += padding;
    dict[n++] = '\n';

    memcpy(buf, npy_magic, sizeof npy_magic);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (unsigned char)(n & 0xff);
    buf[9] = (unsigned char)(n >> 8);
    return 10 + n;
}

static npy_status write_array(const char *path, const void *data, npy_dtype dtype, int rank,
                              const int64_t *shape, char *err, size_t errcap)
{
    report rep = {path ? path : "<null>", err, errcap};
    if (!path)
        return fail(&rep, NPY_ERR_INVALID_ARG, "the path is NULL");
    if (rank < 0 || rank > NPY_MAX_RANK)
        return fail(&rep, NPY_ERR_INVALID_ARG, "rank %d is outside 0..%d", rank, NPY_MAX_RANK);
    if (rank > 0 && !shape)
        return fail(&rep, NPY_ERR_INVALID_ARG, "shape is NULL for rank %d", rank);
    for (int i = 0; i < rank; i++)
        if (shape[i] < 0)
            return fail(&rep, NPY_ERR_INVALID_ARG, "dimension %d is negative (%" PRId64 ")", i,
                        shape[i]);
    uint64_t count;
    if (!element_count(rank, shape, RESULT_ITEMSIZE, &count)) {
        char shape_text[SHAPE_TEXT_CAP];
        format_shape(shape_text, sizeof shape_text, rank, shape);
        return fail(&rep, NPY_ERR_INVALID_ARG,
                    "shape %s is too large: the data would pass the %" PRIu64 "-byte limit",
                    shape_text, data_byte_limit());
    }
    if (count > 0 && !data)
        return fail(&rep, NPY_ERR_INVALID_ARG, "data is NULL for %" PRIu64 " elements", count);

    unsigned char header[HEADER_BUF_CAP];
    char descr[4] = {'<'};
    memcpy(descr + 1, dtype_table[dtype].code, 3);
    size_t header_len = format_header(header, descr, rank, shape);

    FILE *f = fopen(path, "wb");
    if (!f)
        return fail(&rep, NPY_ERR_IO, "cannot open for writing: %s", strerror(errno));
    errno = 0;
    int failed = fwrite(header, 1, header_len, f) != header_len;

    /* float32 and int32 alike: four bytes each, stored little-endian. */
    const unsigned char *src = data;
    unsigned char chunk[CHUNK_BYTES];
    size_t per_chunk = CHUNK_BYTES / 4;
    for (uint64_t done = 0; done < count && !failed; done += per_chunk) {
        size_t n = count - done < per_chunk ? (size_t)(count - done) : per_chunk;
        for (size_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, src + 4 * (done + i), sizeof bits);
            store_le32(chunk + 4 * i, bits);
        }
        failed = fwrite(chunk, 4, n, f) != n;
    }
    int saved_errno = errno;
    if (fclose(f) != 0 && !failed) {
        failed = 1;
        saved_errno = errno;
    }
    if (failed)
        return fail(&rep, NPY_ERR_IO, "cannot write: %s", strerror(saved_errno ? saved_errno : EIO));
    return NPY_OK;
}
