/*
 * test_npy.c -- the tool's .npy reader and writer: round trips, numpy's own
 * bytes, f2/f8 conversion, a catalogue of malformed files with their
 * messages, every prefix of a valid file, byte mutations (no crash, no
 * inconsistent result), and the writer's I/O errors.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tools/npy.h"

/* ---------------------------------------------------------------- helpers */

static char tmp_dir[] = "/tmp/test_npy_XXXXXX";

/* A path inside the test's scratch directory, by value so several can live. */
typedef struct path_buf {
    char s[256];
} path_buf;

static path_buf tmp_path(const char *name)
{
    path_buf path;
    snprintf(path.s, sizeof path.s, "%s/%s", tmp_dir, name);
    return path;
}

static uint32_t float_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

static void put_le(unsigned char *p, uint64_t v, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_f64(unsigned char *p, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    put_le(p, bits, 8);
}

/* A .npy image from its parts, every byte as given: magic, version major.0,
 * the length field, the header, the data.  Returns the image's length. */
static size_t image_raw(unsigned char *buf, int major, uint32_t header_len_field,
                        const char *header, size_t header_len, const void *data, size_t data_len)
{
    size_t field_bytes = major == 1 ? 2 : 4;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    put_le(buf + 8, header_len_field, field_bytes);
    size_t n = 8 + field_bytes;
    memcpy(buf + n, header, header_len);
    n += header_len;
    if (data_len)
        memcpy(buf + n, data, data_len);
    return n + data_len;
}

/* A well-formed image: the dict padded with spaces and '\n' as numpy pads it,
 * so the data starts at a multiple of 64. */
static size_t image(unsigned char *buf, int major, const char *dict, const void *data,
                    size_t data_len)
{
    char header[1024];
    size_t preamble = major == 1 ? 10 : 12;
    size_t n = strlen(dict);
    memcpy(header, dict, n);
    while ((preamble + n + 1) % 64 != 0)
        header[n++] = ' ';
    header[n++] = '\n';
    return image_raw(buf, major, (uint32_t)n, header, n, data, data_len);
}

/* The 24 bytes of np.arange(6, dtype=np.float32). */
static const unsigned char arange6_f32[24] = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,
    0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xa0, 0x40,
};

static const char dict_2x3_f4[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

static int file_bytes(const char *path, unsigned char *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    *len = fread(buf, 1, cap, f);
    fclose(f);
    return 1;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(data, 1, len, f) == len);
        CHECK(fclose(f) == 0);
    }
}

/* The reader fails with `want` and a message holding `needle`, and leaves
 * the array zeroed. */
static void expect_failure_as(int read_i32, const char *what, const unsigned char *img,
                              size_t len, npy_status want, const char *needle)
{
    npy_array a;
    char err[256] = "";
    npy_status got = read_i32 ? npy_read_i32_mem(img, len, "x.npy", &a, err, sizeof err)
                              : npy_read_f32_mem(img, len, "x.npy", &a, err, sizeof err);
    CHECK_MSG(got == want, "%s: status %d, want %d (%s)", what, got, want, err);
    CHECK_MSG(strstr(err, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, needle);
    CHECK_MSG(strncmp(err, "x.npy: ", 7) == 0, "%s: message \"%s\" lacks the name", what, err);
    CHECK_MSG(a.f32 == NULL && a.i32 == NULL && a.count == 0 && a.rank == 0,
              "%s: the array is not zeroed after a failure", what);
    npy_free(&a);
}

static void expect_failure(const char *what, const unsigned char *img, size_t len,
                           npy_status want, const char *needle)
{
    expect_failure_as(0, what, img, len, want, needle);
}

/* ---------------------------------------------------------------- round trips */

static const int64_t round_trip_shapes[5][4] = {{0}, {7}, {2, 3}, {2, 3, 4}, {2, 1, 3, 5}};

static size_t product(int rank, const int64_t *shape)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)shape[i];
    return n;
}

/* The data starts at a multiple of 64 and the file ends right after it. */
static void check_layout(const char *path, size_t count)
{
    static unsigned char buf[4096];
    size_t len = 0;
    CHECK(file_bytes(path, buf, sizeof buf, &len));
    size_t data_start = 10 + (size_t)(buf[8] | buf[9] << 8);
    CHECK_MSG(data_start % 64 == 0, "%s: data starts at %zu", path, data_start);
    CHECK_MSG(len == data_start + 4 * count, "%s: %zu bytes, want %zu", path, len,
              data_start + 4 * count);
    CHECK(buf[data_start - 1] == '\n');
}

/* Writes data (int32 with is_i32, else float) at every shape of
 * round_trip_shapes, checks the file's layout and reads the same values
 * back; then_check(path) runs after each read's npy_free. */
static void round_trip(const char *prefix, const void *data, int is_i32,
                       void (*then_check)(const char *path, const npy_array *freed))
{
    size_t elem = is_i32 ? sizeof(int32_t) : sizeof(float);
    for (int rank = 0; rank <= 4; rank++) {
        const int64_t *shape = round_trip_shapes[rank];
        size_t count = product(rank, shape);
        char name[32];
        snprintf(name, sizeof name, "%s_rank%d.npy", prefix, rank);
        path_buf file = tmp_path(name);
        const char *path = file.s;
        char err[256] = "";
        npy_status st = is_i32 ? npy_write_i32(path, data, rank, shape, err, sizeof err)
                               : npy_write_f32(path, data, rank, shape, err, sizeof err);
        CHECK_MSG(st == NPY_OK, "%s", err);
        check_layout(path, count);

        npy_array a;
        st = is_i32 ? npy_read_i32(path, &a, err, sizeof err)
                    : npy_read_f32(path, &a, err, sizeof err);
        CHECK_MSG(st == NPY_OK, "%s", err);
        CHECK(a.rank == rank);
        CHECK(memcmp(a.shape, shape, (size_t)rank * sizeof shape[0]) == 0);
        CHECK(strcmp(a.dtype, is_i32 ? "i4" : "f4") == 0);
        CHECK(a.count == count);
        const void *got = is_i32 ? (const void *)a.i32 : (const void *)a.f32;
        const void *other = is_i32 ? (const void *)a.f32 : (const void *)a.i32;
        CHECK(other == NULL);
        CHECK(got != NULL && memcmp(got, data, count * elem) == 0);
        npy_free(&a);
        then_check(path, &a);
    }
}

static void f32_freed(const char *path, const npy_array *freed)
{
    (void)path;
    CHECK(freed->f32 == NULL && freed->count == 0);
}

static void test_round_trip_f32(void)
{
    float data[120];
    for (int i = 0; i < 120; i++)
        data[i] = (float)i * 0.37f - 11.0f;
    data[1] = -0.0f;
    data[2] = INFINITY;
    data[3] = -INFINITY;
    data[4] = NAN;
    data[5] = FLT_TRUE_MIN;
    data[6] = FLT_MAX;
    round_trip("f32", data, 0, f32_freed);
}

/* An int32 file is not float data, and the other way round. */
static void i32_not_f32(const char *path, const npy_array *freed)
{
    (void)freed;
    npy_array a;
    char err[256] = "";
    CHECK(npy_read_f32(path, &a, err, sizeof err) == NPY_ERR_UNSUPPORTED);
    CHECK(strstr(err, "'<i4' is an integer array") != NULL);
    CHECK(npy_read_i32(tmp_path("f32_rank2.npy").s, &a, err, sizeof err) ==
          NPY_ERR_UNSUPPORTED);
    CHECK(strstr(err, "'<f4' is not int32") != NULL);
}

static void test_round_trip_i32(void)
{
    int32_t data[120];
    for (int i = 0; i < 120; i++)
        data[i] = i * 7919 - 400000;
    data[0] = INT32_MIN;
    data[1] = INT32_MAX;
    data[2] = -1;
    round_trip("i32", data, 1, i32_not_f32);
}

static void test_empty_arrays(void)
{
    static const int64_t shapes[2][3] = {{0}, {2, 0, 3}};
    static const int ranks[2] = {1, 3};
    for (int s = 0; s < 2; s++) {
        path_buf file = tmp_path("empty.npy");
        const char *path = file.s;
        char err[256] = "";
        npy_array a;
        /* No data is needed for no elements. */
        CHECK_MSG(npy_write_f32(path, NULL, ranks[s], shapes[s], err, sizeof err) == NPY_OK, "%s",
                  err);
        check_layout(path, 0);
        CHECK_MSG(npy_read_f32(path, &a, err, sizeof err) == NPY_OK, "%s", err);
        CHECK(a.rank == ranks[s] && a.count == 0 && a.f32 != NULL);
        CHECK(a.shape[0] == shapes[s][0] && a.shape[ranks[s] - 1] == shapes[s][ranks[s] - 1]);
        npy_free(&a);

        CHECK_MSG(npy_write_i32(path, NULL, ranks[s], shapes[s], err, sizeof err) == NPY_OK, "%s",
                  err);
        CHECK_MSG(npy_read_i32(path, &a, err, sizeof err) == NPY_OK, "%s", err);
        CHECK(a.count == 0 && a.i32 != NULL && a.f32 == NULL);
        npy_free(&a);
    }
}

/* ---------------------------------------------------------------- numpy's bytes */

/* np.save of np.arange(6, dtype=np.float32).reshape(2, 3) and of
 * np.float32(3), written out by hand: numpy 2.x pads the dict with 21 -
 * len(str(shape[0])) spaces of growth room, then to a 64-byte data start. */
static void test_numpy_bytes(void)
{
    static unsigned char expected[128 + 24];
    memcpy(expected, "\x93NUMPY\x01\x00\x76\x00", 10);
    memset(expected + 10, ' ', 117);
    memcpy(expected + 10, dict_2x3_f4, strlen(dict_2x3_f4));
    expected[127] = '\n';
    memcpy(expected + 128, arange6_f32, 24);

    float values[6] = {0, 1, 2, 3, 4, 5};
    const int64_t shape[2] = {2, 3};
    path_buf file = tmp_path("arange.npy");
    const char *path = file.s;
    char err[256] = "";
    CHECK_MSG(npy_write_f32(path, values, 2, shape, err, sizeof err) == NPY_OK, "%s", err);
    unsigned char got[512];
    size_t len = 0;
    CHECK(file_bytes(path, got, sizeof got, &len));
    CHECK_MSG(len == sizeof expected && memcmp(got, expected, sizeof expected) == 0,
              "the writer's bytes differ from numpy's (%zu bytes)", len);

    npy_array a;
    CHECK_MSG(npy_read_f32_mem(expected, sizeof expected, "arange", &a, err, sizeof err) == NPY_OK,
              "%s", err);
    CHECK(a.rank == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.count == 6);
    CHECK(a.f32 && memcmp(a.f32, values, sizeof values) == 0);
    npy_free(&a);

    static const char scalar_dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }";
    static unsigned char scalar[128 + 4];
    memcpy(scalar, "\x93NUMPY\x01\x00\x76\x00", 10);
    memset(scalar + 10, ' ', 117);
    memcpy(scalar + 10, scalar_dict, strlen(scalar_dict));
    scalar[127] = '\n';
    memcpy(scalar + 128, "\x00\x00\x40\x40", 4);
    float three = 3.0f;
    CHECK(npy_write_f32(path, &three, 0, NULL, err, sizeof err) == NPY_OK);
    CHECK(file_bytes(path, got, sizeof got, &len));
    CHECK(len == sizeof scalar && memcmp(got, scalar, sizeof scalar) == 0);
}

/* ---------------------------------------------------------------- conversions */

static void check_f32_bits(const npy_array *a, const uint32_t *want, size_t n, const char *what)
{
    CHECK_MSG(a->count == n && a->f32 != NULL, "%s: count %zu, want %zu", what, a->count, n);
    for (size_t i = 0; a->f32 && i < n && i < a->count; i++)
        CHECK_MSG(float_bits(a->f32[i]) == want[i], "%s[%zu]: 0x%08x, want 0x%08x", what, i,
                  float_bits(a->f32[i]), want[i]);
}

static void test_f2(void)
{
    static const struct {
        uint16_t half;
        uint32_t bits;
    } cases[] = {
        {0x0000, 0x00000000u}, /* +0 */
        {0x8000, 0x80000000u}, /* -0 */
        {0x3c00, 0x3f800000u}, /* 1 */
        {0xc000, 0xc0000000u}, /* -2 */
        {0x3555, 0x3eaaa000u}, /* 0.333251953125 */
        {0x0001, 0x33800000u}, /* smallest subnormal, 2^-24 */
        {0x03ff, 0x387fc000u}, /* largest subnormal, 1023 * 2^-24 */
        {0x8200, 0xb8000000u}, /* -2^-15, a subnormal */
        {0x0400, 0x38800000u}, /* smallest normal, 2^-14 */
        {0x7bff, 0x477fe000u}, /* largest finite, 65504 */
        {0x7c00, 0x7f800000u}, /* inf */
        {0xfc00, 0xff800000u}, /* -inf */
        {0x7e00, 0x7fc00000u}, /* quiet NaN */
        {0xfd01, 0xffa02000u}, /* signalling NaN with payload, kept */
    };
    enum { N = sizeof cases / sizeof cases[0] };
    unsigned char data[2 * N];
    uint32_t want[N];
    for (int i = 0; i < N; i++) {
        put_le(data + 2 * i, cases[i].half, 2);
        want[i] = cases[i].bits;
    }
    /* The table's bit patterns, cross-checked against arithmetic. */
    float smallest_sub, largest_sub;
    memcpy(&smallest_sub, &want[5], 4);
    memcpy(&largest_sub, &want[6], 4);
    CHECK(smallest_sub == ldexpf(1.0f, -24) && largest_sub == ldexpf(1023.0f, -24));

    static unsigned char img[1024];
    char dict[128], err[256] = "";
    snprintf(dict, sizeof dict, "{'descr': '<f2', 'fortran_order': False, 'shape': (%d,), }", N);
    for (int major = 1; major <= 3; major++) {
        size_t len = image(img, major, dict, data, sizeof data);
        npy_array a;
        CHECK_MSG(npy_read_f32_mem(img, len, "f2", &a, err, sizeof err) == NPY_OK, "v%d: %s", major,
                  err);
        CHECK(a.rank == 1 && a.shape[0] == N && strcmp(a.dtype, "f2") == 0 && a.i32 == NULL);
        check_f32_bits(&a, want, N, major == 1 ? "f2 v1.0" : "f2 v2.0/3.0");
        npy_free(&a);
    }
}

static void test_f8(void)
{
    const double in[] = {
        1.0, 0.1, -2.5, 1e-50,
        1.0 + ldexp(1, -24),     /* a tie: to even, 1 */
        1.0 + 3 * ldexp(1, -24), /* a tie: to even, 1 + 2^-22 */
        (double)FLT_MAX * (1 + ldexp(1, -30)), /* under half an ulp above: FLT_MAX */
        ldexp(1, -149), ldexp(1, -150), /* float's smallest subnormal; a tie down to 0 */
        INFINITY, -INFINITY, NAN,
    };
    const float out[] = {
        1.0f, 0.1f, -2.5f, 0.0f, 1.0f, 1.0f + ldexpf(1, -22), FLT_MAX, FLT_TRUE_MIN, 0.0f,
        INFINITY, -INFINITY, NAN,
    };
    enum { N = sizeof in / sizeof in[0] };
    unsigned char data[8 * N];
    uint32_t want[N];
    for (int i = 0; i < N; i++) {
        put_f64(data + 8 * i, in[i]);
        want[i] = float_bits(out[i]);
    }
    static unsigned char img[1024];
    char dict[128], err[256] = "";
    snprintf(dict, sizeof dict, "{'descr': '<f8', 'fortran_order': False, 'shape': (%d,), }", N);
    size_t len = image(img, 3, dict, data, sizeof data);
    npy_array a;
    CHECK_MSG(npy_read_f32_mem(img, len, "f8", &a, err, sizeof err) == NPY_OK, "%s", err);
    CHECK(strcmp(a.dtype, "f8") == 0);
    CHECK(a.count == N && a.f32 && isnan(a.f32[N - 1]));
    want[N - 1] = a.f32 ? float_bits(a.f32[N - 1]) : 0; /* any NaN will do */
    check_f32_bits(&a, want, N, "f8");
    npy_free(&a);

    /* A finite value that float32 cannot hold is refused, not made infinite. */
    put_f64(data + 8, -1e300);
    len = image(img, 1, dict, data, sizeof data);
    expect_failure("f8 out of range", img, len, NPY_ERR_UNSUPPORTED,
                   "element 1 of the '<f8' data (-1e+300) is outside the float32 range");
}

/* ---------------------------------------------------------------- accepted headers */

static void test_header_variants(void)
{
    static const char *const dicts[] = {
        "{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3), }",
        "{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3), }",
        "{'shape': (2, 3), 'descr': '<f4', 'fortran_order': False}",
        "{\"fortran_order\": False, \"shape\": (2, 3), \"descr\": \"<f4\"}",
        "{'descr':'<f4','fortran_order':False,'shape':(2,3)}",
        "  {  'descr'  :  '<f4'  ,  'fortran_order'  :  False  ,  'shape'  :  ( 2 , 3 , )  ,  }  ",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3,), }",
    };
    static unsigned char img[1024];
    for (size_t d = 0; d < sizeof dicts / sizeof dicts[0]; d++) {
        size_t len = image(img, 1, dicts[d], arange6_f32, sizeof arange6_f32);
        npy_array a;
        char err[256] = "";
        CHECK_MSG(npy_read_f32_mem(img, len, "v", &a, err, sizeof err) == NPY_OK, "%s: %s",
                  dicts[d], err);
        CHECK(a.rank == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.f32 && a.f32[5] == 5.0f);
        npy_free(&a);
    }

    /* Unpadded, and padded for 16-byte alignment as numpy < 1.9 did. */
    static const char unpadded[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)}\n";
    size_t len = image_raw(img, 1, sizeof unpadded - 1, unpadded, sizeof unpadded - 1,
                           arange6_f32, sizeof arange6_f32);
    npy_array a;
    char err[256] = "";
    CHECK_MSG(npy_read_f32_mem(img, len, "unpadded", &a, err, sizeof err) == NPY_OK, "%s", err);
    CHECK(a.rank == 1 && a.shape[0] == 6 && a.count == 6);
    npy_free(&a);
    char padded16[96];
    memset(padded16, ' ', 86);
    memcpy(padded16, unpadded, sizeof unpadded - 2);
    padded16[85] = '\n';
    len = image_raw(img, 1, 86, padded16, 86, arange6_f32, sizeof arange6_f32);
    CHECK_MSG(npy_read_f32_mem(img, len, "padded16", &a, err, sizeof err) == NPY_OK, "%s", err);
    npy_free(&a);

    /* int32 with either accepted byte-order mark, and rank 8. */
    int32_t seqlens[3] = {0, 5, 12};
    unsigned char raw[12];
    for (int i = 0; i < 3; i++)
        put_le(raw + 4 * i, (uint32_t)seqlens[i], 4);
    len = image(img, 2, "{'descr': '=i4', 'fortran_order': False, 'shape': (3,), }", raw, 12);
    CHECK_MSG(npy_read_i32_mem(img, len, "cu", &a, err, sizeof err) == NPY_OK, "%s", err);
    CHECK(a.i32 && memcmp(a.i32, seqlens, sizeof seqlens) == 0 && a.f32 == NULL);
    npy_free(&a);
    len = image(img, 1,
                "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 1, 3, 1, 1, 1, 1, 1), }",
                raw, 12);
    CHECK_MSG(npy_read_i32_mem(img, len, "rank8", &a, err, sizeof err) == NPY_OK, "%s", err);
    CHECK(a.rank == 8 && a.shape[2] == 3 && a.count == 3);
    npy_free(&a);
}

/* ---------------------------------------------------------------- malformed files */

/* Cases that differ from a valid (2, 3) '<f4' file only in the dict. */
static void test_malformed_dicts(void)
{
    static const struct {
        const char *dict;
        npy_status want;
        const char *needle;
    } cases[] = {
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "big-endian dtype '>f4' is not supported"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "unsupported dtype '<c8'"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "unsupported dtype '|O'"},
        {"{'descr': '<U4', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "unsupported dtype '<U4'"},
        {"{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "unsupported dtype '<i8'"},
        {"{'descr': 'f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "unsupported dtype 'f4'"},
        {"{'descr': '<f4xxxxxxxxxxxxxxxxx', 'fortran_order': False, 'shape': (2, 3), }",
         NPY_ERR_UNSUPPORTED, "unsupported dtype '<f4xxxxxxxxxxxxxxxxx'"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "expected a dtype string such as '<f4' for 'descr' in quotes, found '[("},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", NPY_ERR_UNSUPPORTED,
         "fortran_order True is not supported"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "expected True or False for 'fortran_order', found '0,"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "expected True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'order': 'C'}",
         NPY_ERR_FORMAT, "unknown key 'order'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'shape': (2, 3)}",
         NPY_ERR_FORMAT, "header byte 58: duplicate key 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False}", NPY_ERR_FORMAT,
         "header lacks the key 'shape'"},
        {"{}", NPY_ERR_FORMAT, "header lacks the key 'descr'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ", NPY_ERR_FORMAT,
         "expected '}' to close the header dict, found the end of the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", NPY_ERR_FORMAT,
         "expected ',' or '}' after the value of 'shape', found the end of the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x", NPY_ERR_FORMAT,
         "expected only spaces after the header dict, found 'x'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }}", NPY_ERR_FORMAT,
         "expected only spaces after the header dict"},
        {"'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", NPY_ERR_FORMAT,
         "expected '{' to open the header dict"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "expected ':' after 'descr'"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "expected ',' or '}' after the value of 'descr', found 'fortran_orde"},
        {"{'descr': '<f4", NPY_ERR_FORMAT, "header byte 10: unterminated string"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "expected a key or '}' in quotes, found 'descr"},
        {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "without '\\' in a string"},
        {"{'descr':\t'<f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "found '\\x09'<f4'"},
        {"{'descr': '\xc3\xa9', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "found '\\xc3\\xa9'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", NPY_ERR_FORMAT,
         "header byte 54: negative dimension in 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", NPY_ERR_FORMAT,
         "expected a non-negative integer dimension, found 'x)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3.0), }", NPY_ERR_FORMAT,
         "expected a non-negative integer dimension, found '3.0)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3L), }", NPY_ERR_FORMAT,
         "expected a non-negative integer dimension, found '3L)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (02, 3), }", NPY_ERR_FORMAT,
         "expected a dimension without leading zeros"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", NPY_ERR_FORMAT,
         "expected ',' or ')' in 'shape', found '3)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (,), }", NPY_ERR_FORMAT,
         "expected a non-negative integer dimension, found ',)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", NPY_ERR_FORMAT,
         "expected a trailing comma in a 1-tuple 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", NPY_ERR_FORMAT,
         "expected a tuple '(...)' for 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 2, 3, 1), }",
         NPY_ERR_FORMAT, "expected at most 8 dimensions in 'shape', found '1)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", NPY_ERR_FORMAT,
         "expected ',' or ')' in 'shape', found the end of the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 3), }",
         NPY_ERR_FORMAT, "expected a dimension below 2^63"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
         NPY_ERR_UNSUPPORTED,
         "shape (4294967296, 4294967296, 16) of '<f4' is too large: the data would pass the "
         "17179869184-byte limit"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807, 0), }",
         NPY_ERR_UNSUPPORTED, "is too large"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (1073741824, 3), }",
         NPY_ERR_UNSUPPORTED, "is too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }", NPY_ERR_FORMAT,
         "truncated data: header promises 4000000 bytes, file has 24"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", NPY_ERR_FORMAT,
         "trailing data: header promises 16 bytes, file has 24"},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", NPY_ERR_FORMAT,
         "trailing data: header promises 12 bytes, file has 24"},
    };
    static unsigned char img[1024];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len = image(img, 1, cases[c].dict, arange6_f32, sizeof arange6_f32);
        expect_failure(cases[c].dict, img, len, cases[c].want, cases[c].needle);
    }
}

/* Cases in the preamble, the header's framing and the data's length. */
static void test_malformed_framing(void)
{
    static unsigned char img[1024];
    const char *dict = dict_2x3_f4;
    size_t len = image(img, 1, dict, arange6_f32, sizeof arange6_f32);

    expect_failure("empty file", img, 0, NPY_ERR_FORMAT, "empty file, not a .npy array");
    expect_failure("NULL, 0", NULL, 0, NPY_ERR_FORMAT, "empty file");
    expect_failure("a zip (.npz)", (const unsigned char *)"PK\x03\x04\x14\x00\x00\x00\x08\x00",
                   10, NPY_ERR_FORMAT, "not a .npy file (bad magic)");
    img[5] = 'Z';
    expect_failure("bad magic", img, len, NPY_ERR_FORMAT, "not a .npy file (bad magic)");
    img[5] = 'Y';
    img[6] = 4;
    expect_failure("version 4.0", img, len, NPY_ERR_UNSUPPORTED,
                   "unsupported .npy format version 4.0 (attnjit reads 1.0, 2.0 and 3.0)");
    img[6] = 0;
    expect_failure("version 0.0", img, len, NPY_ERR_UNSUPPORTED, "version 0.0");
    img[6] = 1;
    img[7] = 1;
    expect_failure("version 1.1", img, len, NPY_ERR_UNSUPPORTED, "version 1.1");
    img[7] = 0;

    /* The header length field against the file. */
    put_le(img + 8, 1000, 2);
    expect_failure("header past the end", img, len, NPY_ERR_FORMAT,
                   "header length 1000 runs past the end of the file (152 bytes)");
    /* 0, one short and one long of the right 118: no newline at its end */
    static const uint32_t wrong_lengths[] = {0, 117, 119};
    for (size_t i = 0; i < sizeof wrong_lengths / sizeof wrong_lengths[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "header length %u", (unsigned)wrong_lengths[i]);
        put_le(img + 8, wrong_lengths[i], 2);
        expect_failure(what, img, len, NPY_ERR_FORMAT, "header does not end with a newline");
    }
    put_le(img + 8, 118, 2);

    /* A v2 length field that promises gigabytes. */
    len = image(img, 2, dict, arange6_f32, sizeof arange6_f32);
    put_le(img + 8, 0xfffffff0u, 4);
    expect_failure("v2 huge header length", img, len, NPY_ERR_FORMAT,
                   "header length 4294967280 runs past the end of the file");

    /* A header longer than numpy itself would read. */
    size_t big_len = 20000;
    char *big_header = malloc(big_len);
    unsigned char *big = malloc(big_len + 64);
    CHECK(big_header && big);
    if (big_header && big) {
        memset(big_header, ' ', big_len);
        memcpy(big_header, dict, strlen(dict));
        big_header[big_len - 1] = '\n';
        size_t n = image_raw(big, 2, (uint32_t)big_len, big_header, big_len, arange6_f32, 24);
        expect_failure("header over the limit", big, n, NPY_ERR_UNSUPPORTED,
                       "header length 20000 is over the limit of 10000 bytes");
    }
    free(big_header);
    free(big);

    /* Data shorter or longer than promised. */
    len = image(img, 1, dict, arange6_f32, sizeof arange6_f32);
    expect_failure("truncated data", img, len - 4, NPY_ERR_FORMAT,
                   "truncated data: header promises 24 bytes, file has 20");
    expect_failure("no data", img, len - 24, NPY_ERR_FORMAT,
                   "truncated data: header promises 24 bytes, file has 0");
    img[len] = 0;
    expect_failure("one byte extra", img, len + 1, NPY_ERR_FORMAT,
                   "trailing data: header promises 24 bytes, file has 25");

    /* A NUL inside the header, and a header without its newline. */
    len = image(img, 1, dict, arange6_f32, sizeof arange6_f32);
    img[20] = '\0';
    expect_failure("NUL in header", img, len, NPY_ERR_FORMAT, "found '\\x00");
    len = image(img, 1, dict, arange6_f32, sizeof arange6_f32);
    img[127] = ' ';
    expect_failure("no newline", img, len, NPY_ERR_FORMAT, "header does not end with a newline");
    len = image(img, 1, dict, arange6_f32, sizeof arange6_f32);
    img[100] = '\n';
    expect_failure("newline inside padding", img, len, NPY_ERR_FORMAT,
                   "expected only spaces after the header dict, found '\\x0a");

    /* The kind the caller asked for. */
    len = image(img, 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }",
                arange6_f32, 12);
    expect_failure_as(1, "i32 from f2", img, len, NPY_ERR_UNSUPPORTED,
                      "dtype '<f2' is not int32; expected '<i4'");
    len = image(img, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
                arange6_f32, 24);
    expect_failure_as(0, "f32 from i4", img, len, NPY_ERR_UNSUPPORTED,
                      "dtype '<i4' is an integer array; expected floats");
    expect_failure_as(1, "i4 truncated", img, len - 1, NPY_ERR_FORMAT,
                      "truncated data: header promises 24 bytes, file has 23");
}

/* Every prefix of a valid file fails cleanly; the whole file reads. */
static void test_prefixes(void)
{
    static unsigned char img[1024];
    unsigned char halves[12];
    for (int i = 0; i < 6; i++)
        put_le(halves + 2 * i, 0x3c00u + (unsigned)i, 2);
    for (int variant = 0; variant < 2; variant++) {
        size_t len = variant == 0
                         ? image(img, 1, dict_2x3_f4, arange6_f32, sizeof arange6_f32)
                         : image(img, 2, "{'descr': '<f2', 'fortran_order': False, 'shape': (6,)}",
                                 halves, sizeof halves);
        int bad = 0;
        for (size_t n = 0; n < len; n++) {
            npy_array a;
            char err[256] = "";
            npy_status st = npy_read_f32_mem(img, n, "prefix", &a, err, sizeof err);
            if (st != NPY_ERR_FORMAT || strncmp(err, "prefix: ", 8) != 0 || a.f32 != NULL) {
                fprintf(stderr, "prefix %zu of %zu: status %d, \"%s\"\n", n, len, st, err);
                bad++;
            }
            /* Past the magic, a short prefix says it is truncated, never "bad magic". */
            if (n > 0 && !strstr(err, "truncated") && !strstr(err, "runs past the end") &&
                !strstr(err, "does not end with a newline")) {
                fprintf(stderr, "prefix %zu: unexpected message \"%s\"\n", n, err);
                bad++;
            }
            npy_free(&a);
        }
        CHECK_MSG(bad == 0, "variant %d: %d prefixes misread", variant, bad);
        npy_array a;
        char err[256] = "";
        CHECK_MSG(npy_read_f32_mem(img, len, "whole", &a, err, sizeof err) == NPY_OK, "%s", err);
        CHECK(a.count == 6 && a.f32 && a.f32[5] == (variant == 0 ? 5.0f : 1.0f + 5.0f / 1024));
        npy_free(&a);
    }
}

/* Byte substitutions all over the header: every result is either a clean
 * failure with a message or an array consistent with its own shape.  Run
 * under AddressSanitizer this is a small fuzzer. */
static void test_mutations(void)
{
    static const unsigned char replacements[] = {
        0x00, ' ', '\n', '\'', '"', '(', ')', ',', ':', '{', '}', '-', '0', '9', 'T', 0xff, 0x80,
    };
    static unsigned char valid[1024], img[1024];
    size_t len = image(valid, 1, dict_2x3_f4, arange6_f32, sizeof arange6_f32);
    int inconsistent = 0, accepted = 0;
    for (size_t pos = 0; pos < 128; pos++) {
        for (size_t r = 0; r < sizeof replacements; r++) {
            memcpy(img, valid, len);
            img[pos] = replacements[r];
            npy_array a;
            char err[256] = "";
            if (npy_read_f32_mem(img, len, "m", &a, err, sizeof err) == NPY_OK) {
                accepted++;
                size_t count = 1;
                for (int i = 0; i < a.rank; i++)
                    count *= (size_t)a.shape[i];
                size_t itemsize = (size_t)(a.dtype[1] - '0');
                if (!a.f32 || a.count != count || count * itemsize != 24 || a.rank > NPY_MAX_RANK)
                    inconsistent++;
            } else if (err[0] == '\0' || a.f32 || a.i32 || strchr(err, '\n')) {
                inconsistent++;
            }
            npy_free(&a);
        }
    }
    CHECK_MSG(inconsistent == 0, "%d mutations gave inconsistent results", inconsistent);
    /* Some mutations are harmless (padding spaces, a quote style): the test
     * really exercised both outcomes. */
    CHECK(accepted > 0 && accepted < 128 * (int)sizeof replacements);
}

/* ---------------------------------------------------------------- files */

static void test_file_errors(void)
{
    npy_array a;
    char err[512] = "", want[512];

    path_buf missing_file = tmp_path("missing.npy");
    const char *missing = missing_file.s;
    CHECK(npy_read_f32(missing, &a, err, sizeof err) == NPY_ERR_IO);
    snprintf(want, sizeof want, "%s: cannot open: %s", missing, strerror(ENOENT));
    CHECK_MSG(strcmp(err, want) == 0, "\"%s\"", err);

    CHECK(npy_read_f32(tmp_dir, &a, err, sizeof err) == NPY_ERR_IO);
    snprintf(want, sizeof want, "%s: cannot read: %s", tmp_dir, strerror(EISDIR));
    CHECK_MSG(strcmp(err, want) == 0, "\"%s\"", err);

    /* A file cut short on disk: caught from its size, before reading data. */
    static unsigned char img[1024];
    size_t len = image(img, 1, dict_2x3_f4, arange6_f32, sizeof arange6_f32);
    path_buf cut_file = tmp_path("cut.npy");
    const char *cut = cut_file.s;
    write_bytes(cut, img, len - 4);
    CHECK(npy_read_f32(cut, &a, err, sizeof err) == NPY_ERR_FORMAT);
    snprintf(want, sizeof want, "%s: truncated data: header promises 24 bytes, file has 20", cut);
    CHECK_MSG(strcmp(err, want) == 0, "\"%s\"", err);
    write_bytes(cut, img, 20);
    CHECK(npy_read_f32(cut, &a, err, sizeof err) == NPY_ERR_FORMAT);
    CHECK_MSG(strstr(err, "header length 118 runs past the end of the file (20 bytes)"), "\"%s\"",
              err);
    img[len] = 'x';
    write_bytes(cut, img, len + 1);
    CHECK(npy_read_f32(cut, &a, err, sizeof err) == NPY_ERR_FORMAT);
    CHECK_MSG(strstr(err, "trailing data: header promises 24 bytes, file has 25"), "\"%s\"", err);
    CHECK(a.f32 == NULL);

    /* More data than one chunk, through the file path. */
    enum { BIG = 100000 };
    float *big = malloc(BIG * sizeof *big);
    CHECK(big != NULL);
    if (big) {
        for (int i = 0; i < BIG; i++)
            big[i] = (float)i / 3.0f;
        const int64_t shape[2] = {BIG / 4, 4};
        path_buf file = tmp_path("big.npy");
        const char *path = file.s;
        CHECK_MSG(npy_write_f32(path, big, 2, shape, err, sizeof err) == NPY_OK, "%s", err);
        CHECK_MSG(npy_read_f32(path, &a, err, sizeof err) == NPY_OK, "%s", err);
        CHECK(a.count == BIG && a.f32 && memcmp(a.f32, big, BIG * sizeof *big) == 0);
        npy_free(&a);
        free(big);
    }

    /* A NULL out or path is the caller's mistake; a NULL err is allowed. */
    CHECK(npy_read_f32(cut, NULL, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(strstr(err, "the output array is NULL") != NULL);
    CHECK(npy_read_i32(NULL, &a, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(npy_read_f32_mem(NULL, 5, NULL, &a, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(strcmp(err, "<memory>: data is NULL but len is 5") == 0);
    CHECK(npy_read_f32(cut, &a, NULL, 0) == NPY_ERR_FORMAT);

    /* A small err buffer gets a truncated, terminated message. */
    char small[12];
    memset(small, 'x', sizeof small);
    CHECK(npy_read_f32_mem(img, 3, "tiny.npy", &a, small, 8) == NPY_ERR_FORMAT);
    CHECK(strcmp(small, "tiny.np") == 0 && small[8] == 'x');
    CHECK(npy_read_f32_mem(img, 3, "a-very-long-name.npy", &a, small, 8) == NPY_ERR_FORMAT);
    CHECK(strcmp(small, "a-very-") == 0);
}

static void test_writer_errors(void)
{
    float values[6] = {0};
    const int64_t shape[2] = {2, 3};
    char err[512] = "", want[512];

    path_buf nowhere_file = tmp_path("no/such/dir/out.npy");
    const char *nowhere = nowhere_file.s;
    CHECK(npy_write_f32(nowhere, values, 2, shape, err, sizeof err) == NPY_ERR_IO);
    snprintf(want, sizeof want, "%s: cannot open for writing: %s", nowhere, strerror(ENOENT));
    CHECK_MSG(strcmp(err, want) == 0, "\"%s\"", err);
    CHECK(npy_write_i32(tmp_dir, (const int32_t *)values, 2, shape, err, sizeof err) ==
          NPY_ERR_IO);
    CHECK_MSG(strstr(err, strerror(EISDIR)) != NULL, "\"%s\"", err);

    /* A full disk: small writes fail when the file is closed, large ones at
     * once; both say so with the path. */
    if (access("/dev/full", W_OK) == 0) {
        snprintf(want, sizeof want, "/dev/full: cannot write: %s", strerror(ENOSPC));
        CHECK(npy_write_f32("/dev/full", values, 2, shape, err, sizeof err) == NPY_ERR_IO);
        CHECK_MSG(strcmp(err, want) == 0, "\"%s\"", err);
        enum { MANY = 1 << 20 };
        float *many = calloc(MANY, sizeof *many);
        const int64_t many_shape[1] = {MANY};
        CHECK(many != NULL);
        if (many) {
            CHECK(npy_write_f32("/dev/full", many, 1, many_shape, err, sizeof err) == NPY_ERR_IO);
            CHECK_MSG(strcmp(err, want) == 0, "\"%s\"", err);
            free(many);
        }
    } else {
        fprintf(stderr, "note: no writable /dev/full; skipping the full-disk case\n");
    }

    /* The caller's mistakes, before any file is touched. */
    path_buf file = tmp_path("never.npy");
    const char *path = file.s;
    const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(npy_write_f32(path, values, 9, nine, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(strstr(err, "rank 9 is outside 0..8") != NULL);
    CHECK(npy_write_f32(path, values, -1, shape, err, sizeof err) == NPY_ERR_INVALID_ARG);
    const int64_t negative[2] = {2, -3};
    CHECK(npy_write_f32(path, values, 2, negative, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(strstr(err, "dimension 1 is negative (-3)") != NULL);
    CHECK(npy_write_f32(path, values, 2, NULL, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(strstr(err, "shape is NULL for rank 2") != NULL);
    CHECK(npy_write_f32(path, NULL, 2, shape, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(strstr(err, "data is NULL for 6 elements") != NULL);
    const int64_t huge[2] = {INT64_MAX, 2};
    CHECK(npy_write_i32(path, (const int32_t *)values, 2, huge, err, sizeof err) ==
          NPY_ERR_INVALID_ARG);
    CHECK(strstr(err, "shape (9223372036854775807, 2) is too large") != NULL);
    CHECK(npy_write_f32(NULL, values, 2, shape, err, sizeof err) == NPY_ERR_INVALID_ARG);
    CHECK(access(path, F_OK) != 0);
}

/* ---------------------------------------------------------------- main */

static void remove_scratch(void)
{
    static const char *const names[] = {
        "f32_rank0.npy", "f32_rank1.npy", "f32_rank2.npy", "f32_rank3.npy", "f32_rank4.npy",
        "i32_rank0.npy", "i32_rank1.npy", "i32_rank2.npy", "i32_rank3.npy", "i32_rank4.npy",
        "empty.npy",     "arange.npy",    "cut.npy",       "big.npy",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        remove(tmp_path(names[i]).s);
    CHECK_MSG(rmdir(tmp_dir) == 0, "scratch directory %s left behind: %s", tmp_dir,
              strerror(errno));
}

int main(void)
{
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "cannot create a scratch directory: %s\n", strerror(errno));
        return 1;
    }
    test_round_trip_f32();
    test_round_trip_i32();
    test_empty_arrays();
    test_numpy_bytes();
    test_f2();
    test_f8();
    test_header_variants();
    test_malformed_dicts();
    test_malformed_framing();
    test_prefixes();
    test_mutations();
    test_file_errors();
    test_writer_errors();
    remove_scratch();
    return check_report();
}
