/*
 * test_ir.c -- the IR layer: parser, printer, verifier, hash, builder, and
 * the context's error and status API.
 *
 * usage: test_ir SPEC_DIR   (every *.aj file in SPEC_DIR must parse and
 *                            print back to itself)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "spec_dir.h"
#include "ir/dtype.h"
#include "ir/op.h"

/* ---------------------------------------------------------------- helpers */

static aj_ctx *new_ctx(void)
{
    aj_ctx *ctx = NULL;

    if (aj_ctx_create(NULL, &ctx) != AJ_OK) {
        fprintf(stderr, "aj_ctx_create failed\n");
        exit(1);
    }
    return ctx;
}

static aj_op *parse_ok(aj_ctx *ctx, const char *text, const char *name)
{
    aj_op *op = NULL;

    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), name, &op), AJ_OK);
    return op;
}

/* The op's canonical text, or "" (owned by a static buffer). */
static const char *canonical(const aj_op *op)
{
    static char buf[AJ_CANONICAL_MAX];
    char *text = NULL;

    buf[0] = '\0';
    if (op && aj_op_print(op, &text) == AJ_OK) {
        snprintf(buf, sizeof buf, "%s", text);
        aj_free(text);
    }
    return buf;
}

/* print -> parse -> print is the identity, and the hash agrees. */
static void check_round_trip(aj_ctx *ctx, const char *text, size_t len,
                             const char *name)
{
    aj_op *first = NULL, *second = NULL;
    char *text1 = NULL, *text2 = NULL;
    char hash1[AJ_HASH_HEX_LEN + 1] = "", hash2[AJ_HASH_HEX_LEN + 1] = "";

    CHECK_STATUS(ctx, aj_op_parse(ctx, text, len, name, &first), AJ_OK);
    if (!first)
        return;
    CHECK_STATUS(ctx, aj_op_print(first, &text1), AJ_OK);
    CHECK_STATUS(ctx, aj_op_hash(first, hash1), AJ_OK);
    CHECK_STATUS(ctx, aj_op_parse(ctx, text1, strlen(text1), "printed", &second),
                 AJ_OK);
    if (second) {
        CHECK_STATUS(ctx, aj_op_print(second, &text2), AJ_OK);
        CHECK_STATUS(ctx, aj_op_hash(second, hash2), AJ_OK);
        CHECK_MSG(text2 && strcmp(text1, text2) == 0,
                  "%s: print is not stable:\n%s---\n%s", name, text1,
                  text2 ? text2 : "(null)");
        CHECK_MSG(strcmp(hash1, hash2) == 0, "%s: hash %s != %s", name, hash1,
                  hash2);
    }
    CHECK_MSG(strncmp(text1, "attention ", 10) == 0 &&
                  strcmp(text1 + strlen(text1) - 2, "}\n") == 0,
              "%s: canonical text has the wrong shape:\n%s", name, text1);
    CHECK_MSG(strlen(hash1) == AJ_HASH_HEX_LEN &&
                  strspn(hash1, "0123456789abcdef") == AJ_HASH_HEX_LEN,
              "%s: hash '%s' is not 16 lowercase hex digits", name, hash1);
    aj_free(text1);
    aj_free(text2);
    aj_op_destroy(first);
    aj_op_destroy(second);
}

/* ---------------------------------------------------------------- valid */

/* Between them these use every field and every form of every value. */
static const char *const valid_specs[] = {
    /* docs/design.md's example, verbatim */
    "# causal bf16 forward, head dim 128\n"
    "attention forward flash {\n"
    "  dtype     = bf16                 # f16 | bf16 | f32\n"
    "  head_dim  = 128\n"
    "  head_dim_v = 128                 # optional, defaults to head_dim\n"
    "  mask      = causal(top_left)     # none | causal(top_left) | causal(bottom_right)\n"
    "                                   # | window(LEFT, RIGHT) | window(LEFT, RIGHT, bottom_right)\n"
    "  score_mod = softcap(30.0)        # optional: none | softcap(C) | alibi\n"
    "  scale     = default              # optional: default (1/sqrt(head_dim)) | a number\n"
    "  dropout   = 0.0                  # optional, 0 <= p < 1\n"
    "  bias      = none                 # optional, efficient only: none | add\n"
    "  layout    = padded               # optional: padded | varlen\n"
    "  accumulate = false               # optional, forward: merge into a prior O/LSE\n"
    "  deterministic = false            # optional, backward\n"
    "  schedule  = (block_m = 128, block_n = 64, warps = 4, stages = 2)  # optional\n"
    "}\n",
    /* the minimum */
    "attention forward efficient {\n  dtype = f16\n  head_dim = 64\n}\n",
    "attention backward flash {\n"
    "  dtype = bf16\n  head_dim = 96\n  mask = causal(bottom_right)\n"
    "  layout = varlen\n  deterministic = true\n  target = sm_90a\n}\n",
    "attention forward efficient {\n"
    "  dtype = f16\n  head_dim = 128\n  head_dim_v = 64\n"
    "  mask = window(128, 0)\n  score_mod = alibi\n  scale = 0.125\n"
    "  dropout = 0.1\n  bias = add\n  accumulate = true\n  target = sm_80\n}\n",
    "attention forward flash {\n"
    "  dtype = bf16\n  head_dim = 64\n  mask = window(64, 64, bottom_right)\n"
    "  score_mod = none\n  schedule = (warps = 8)\n  target = sim\n}\n",
    "attention forward flash {\n"
    "  dtype = f32\n  head_dim = 256\n  head_dim_v = 128\n"
    "  mask = window(16, 0, top_left)\n  target = cpu\n}\n",
    "attention merge {\n  dtype = f32\n  head_dim_v = 128\n}\n",
    "attention merge {\n  target = sm_90\n  head_dim_v = 64\n  dtype = bf16\n}\n",
    /* no whitespace where none is needed, no trailing newline */
    "attention forward flash{dtype=f16 head_dim=64 mask=none}",
    /* comments, tabs, CRLF line ends, fields on one line */
    "# leading comment\r\n\r\n"
    "attention\tbackward efficient   { # after the brace\r\n"
    "\tdtype = f16 head_dim = 32 # two fields on a line\r\n"
    "\t# a comment line\r\n"
    "\tbias = add dropout = 0.25\r\n"
    "}   # trailing comment\r\n",
    /* schedule keys in any order; number forms */
    "attention forward flash {\n"
    "  dtype = f16\n  head_dim = 64\n  scale = 1e-05\n  dropout = .5\n"
    "  score_mod = softcap(+2.5e1)\n"
    "  schedule = ( stages = 3 , block_n = 32 )\n}\n",
    "attention backward efficient {\n"
    "  dtype = bf16\n  head_dim = 128\n  mask = none\n  score_mod = none\n"
    "  scale = default\n  dropout = 0.0\n  bias = add\n  layout = padded\n"
    "  accumulate = false\n  deterministic = false\n  schedule = default\n"
    "  target = any\n}\n",
    /* the edges of every range */
    "attention forward flash {\n"
    "  dtype = f16\n  head_dim = 1\n  head_dim_v = 1024\n"
    "  mask = window(0, 2147483647)\n  dropout = 0.9999999999999999\n"
    "  schedule = (block_m = 256, block_n = 16, warps = 16, stages = 8)\n}\n",
    "attention forward flash {\n"
    "  dtype = f16\n  head_dim = 1024\n  scale = 3E-1\n"
    "  score_mod = softcap(1.0e+2)\n"
    "  schedule = (block_m = 16, block_n = 256, warps = 1, stages = 1)\n}\n",
    "attention forward flash {\n"
    "  dtype = f32\n  head_dim = 80\n  scale = 1.7976931348623157e308\n"
    "  score_mod = softcap(4.9406564584124654e-324)\n  dropout = 1e-300\n}\n",
    /* ALiBi's slopes named and after a softcap, spaced or not */
    "attention backward flash {\n"
    "  dtype = bf16\n  head_dim = 64\n  tensors = (slp: f32[1] grad)\n"
    "  score_mod = softcap(+2.5e1)+alibi(slp)\n}\n",
    "attention forward efficient {\n"
    "  dtype = f16\n  head_dim = 32\n  score_mod = softcap(30) +  alibi ( grad )\n}\n",
    "attention forward flash {\n"
    "  dtype = f16\n  head_dim = 32\n  tensors = (a: i32[2], s: f32[1])\n"
    "  mask = expr(a[q, k] != 0)\n  score_mod = alibi(s)\n}\n",
};

static void test_valid_specs(aj_ctx *ctx)
{
    for (size_t i = 0; i < sizeof valid_specs / sizeof valid_specs[0]; i++) {
        char name[32];

        snprintf(name, sizeof name, "valid[%zu]", i);
        check_round_trip(ctx, valid_specs[i], strlen(valid_specs[i]), name);
    }
}

/* Every *.aj file under dir parses and prints back to itself. */
static void round_trip_file(const char *name, const char *path, const char *text, size_t len,
                            void *user)
{
    (void)name;
    CHECK_MSG(text != NULL, "cannot read %s", path);
    if (text)
        check_round_trip(user, text, len, path);
}

static void test_spec_dir(aj_ctx *ctx, const char *dir)
{
    int files = spec_dir_each(dir, round_trip_file, ctx);
    CHECK_MSG(files >= 0, "cannot open spec directory %s", dir);
    printf("%s: %d example spec(s)\n", dir, files);
}

/* ---------------------------------------------------------------- canonical */

/* ALiBi's forms print canonically: the number as the printer writes
 * numbers, one space each side of the '+', the slopes' name or grad. */
static void test_alibi_forms(aj_ctx *ctx)
{
    static const char *const forms[][2] = {
        {"softcap(+2.5e1)+alibi(slp)", "score_mod = softcap(25.0) + alibi(slp)\n"},
        {"softcap(30) +  alibi ( grad )", "score_mod = softcap(30.0) + alibi(grad)\n"},
        {"softcap(1e-1) + alibi", "score_mod = softcap(0.1) + alibi\n"},
        {"alibi(slp)", "score_mod = alibi(slp)\n"},
        {"alibi", "score_mod = alibi\n"},
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "attention backward flash { dtype = f16 head_dim = 32 "
                 "tensors = (slp: f32[1] grad) score_mod = %s }", forms[i][0]);
        aj_op *op = parse_ok(ctx, spec, "alibi form");
        CHECK_MSG(strstr(canonical(op), forms[i][1]) != NULL, "%s printed:\n%s", forms[i][0],
                  canonical(op));
        aj_op_destroy(op);
    }
}

static void test_canonical_form(aj_ctx *ctx)
{
    aj_op *op = parse_ok(ctx,
        "attention forward efficient {\n"
        "  target = sm_80 dtype = f16 head_dim = 128 head_dim_v = 64\n"
        "  mask = window(8, 0, bottom_right) score_mod = softcap(30)\n"
        "  scale = 0.1 dropout = 0.125 bias = add layout = varlen\n"
        "  accumulate = true schedule = (stages = 2, block_m = 64)\n"
        "}", "canon");

    CHECK_MSG(strcmp(canonical(op),
                     "attention forward efficient {\n"
                     "  dtype = f16\n"
                     "  head_dim = 128\n"
                     "  head_dim_v = 64\n"
                     "  mask = window(8, 0, bottom_right)\n"
                     "  score_mod = softcap(30.0)\n"
                     "  scale = 0.1\n"
                     "  dropout = 0.125\n"
                     "  bias = add\n"
                     "  layout = varlen\n"
                     "  accumulate = true\n"
                     "  deterministic = false\n"
                     "  schedule = (block_m = 64, stages = 2)\n"
                     "  target = sm_80\n"
                     "}\n") == 0,
              "got:\n%s", canonical(op));
    aj_op_destroy(op);

    /* Defaults written out; head_dim_v printed as its effective value. */
    op = parse_ok(ctx, "attention backward flash { dtype = bf16 head_dim = 96 }",
                  "canon");
    CHECK_MSG(strcmp(canonical(op),
                     "attention backward flash {\n"
                     "  dtype = bf16\n"
                     "  head_dim = 96\n"
                     "  head_dim_v = 96\n"
                     "  mask = none\n"
                     "  score_mod = none\n"
                     "  scale = default\n"
                     "  dropout = 0.0\n"
                     "  bias = none\n"
                     "  layout = padded\n"
                     "  accumulate = false\n"
                     "  deterministic = false\n"
                     "  schedule = default\n"
                     "  target = any\n"
                     "}\n") == 0,
              "got:\n%s", canonical(op));
    aj_op_destroy(op);

    /* causal, window with top_left left out, schedule = (...) = 0 keys */
    op = parse_ok(ctx, "attention forward flash { dtype = f16 head_dim = 64 "
                       "mask = causal(bottom_right) schedule = (warps = 0) }",
                  "canon");
    CHECK(strstr(canonical(op), "  mask = causal(bottom_right)\n") != NULL);
    CHECK(strstr(canonical(op), "  schedule = default\n") != NULL);
    aj_op_destroy(op);
    op = parse_ok(ctx, "attention forward flash { dtype = f16 head_dim = 64 "
                       "mask = window(3, 4, top_left) }", "canon");
    CHECK(strstr(canonical(op), "  mask = window(3, 4)\n") != NULL);
    aj_op_destroy(op);

    op = parse_ok(ctx, "attention merge { head_dim_v = 80 dtype = f16 }",
                  "canon");
    CHECK_MSG(strcmp(canonical(op),
                     "attention merge {\n"
                     "  dtype = f16\n"
                     "  head_dim_v = 80\n"
                     "  target = any\n"
                     "}\n") == 0,
              "got:\n%s", canonical(op));
    aj_op_destroy(op);
}

/* The hash is the kernel cache's key: it must not drift between builds. */
static void test_known_hash(aj_ctx *ctx)
{
    aj_op *op = parse_ok(ctx, valid_specs[0], "design");
    char hash[AJ_HASH_HEX_LEN + 1] = "";

    CHECK_STATUS(ctx, aj_op_hash(op, hash), AJ_OK);
    /* A change here means the canonical text or the hash changed, and with
     * it every kernel cache key: bump the IR version if that is intended. */
    CHECK_MSG(strcmp(hash, "db4fc44da999fbda") == 0, "hash is %s", hash);
    aj_op_destroy(op);
}

static void test_numbers(aj_ctx *ctx)
{
    static const struct { double value; const char *text; } cases[] = {
        { 30.0, "30.0" },
        { 0.1, "0.1" },
        { 1e-05, "1e-05" },
        { 0.0001, "0.0001" },
        { 0.5, "0.5" },
        { 1.0 / 3.0, "0.3333333333333333" },
        { 123456.789, "123456.789" },
        { 1e15, "1000000000000000.0" },
        { 1e16, "1e+16" },
        { 1.5e20, "1.5e+20" },
        { 2.5e-5, "2.5e-05" },
        { 5e-324, "5e-324" },
        { 1.7976931348623157e308, "1.7976931348623157e+308" },
        { -1.5, "-1.5" },
        { 0.0, "0.0" },
        { -0.0, "0.0" },
        { NAN, "nan" },
        { INFINITY, "inf" },
        { -INFINITY, "-inf" },
    };
    uint64_t state = 0x9e3779b97f4a7c15u;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[AJ_NUMBER_MAX];

        aj_format_number(cases[i].value, out);
        CHECK_MSG(strcmp(out, cases[i].text) == 0, "%.17g printed as %s, want %s",
                  cases[i].value, out, cases[i].text);
    }

    /* Random dropouts survive print -> parse bit for bit. */
    for (int i = 0; i < 200; i++) {
        aj_op *op = NULL, *back = NULL;
        aj_op_info a, b;
        char *text = NULL;

        state = state * 6364136223846793005u + 1442695040888963407u;
        CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
        CHECK(aj_op_set_dropout(op, (double)(state >> 11) / 9007199254740992.0)
              == AJ_OK);
        CHECK(aj_op_set_scale(op, ldexp((double)(state >> 40), -20)) == AJ_OK);
        CHECK(aj_op_print(op, &text) == AJ_OK);
        CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "random", &back),
                     AJ_OK);
        if (back) {
            aj_op_get_info(op, &a);
            aj_op_get_info(back, &b);
            CHECK_MSG(a.dropout == b.dropout && a.scale == b.scale,
                      "%.17g/%.17g read back as %.17g/%.17g", a.dropout, a.scale,
                      b.dropout, b.scale);
        }
        aj_free(text);
        aj_op_destroy(op);
        aj_op_destroy(back);
    }
}

/* ---------------------------------------------------------------- builder */

/* The builder and the parser make the same op: same text, same hash. */
static void check_same_op(aj_ctx *ctx, aj_op *built, const char *spec)
{
    aj_op *parsed = parse_ok(ctx, spec, "same");
    char h1[AJ_HASH_HEX_LEN + 1] = "", h2[AJ_HASH_HEX_LEN + 1] = "";
    char text[AJ_CANONICAL_MAX];

    CHECK_STATUS(ctx, aj_op_verify(built), AJ_OK);
    snprintf(text, sizeof text, "%s", canonical(built));
    CHECK_MSG(strcmp(text, canonical(parsed)) == 0, "built:\n%s\nparsed:\n%s",
              text, canonical(parsed));
    CHECK(aj_op_hash(built, h1) == AJ_OK && aj_op_hash(parsed, h2) == AJ_OK &&
          strcmp(h1, h2) == 0);
    aj_op_destroy(parsed);
}

static void test_builder(aj_ctx *ctx)
{
    aj_schedule sched = { .block_m = 128, .block_n = 64, .warps = 4, .stages = 2 };
    aj_op *op = NULL;
    aj_op_info info;

    CHECK_STATUS(ctx, aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op),
                 AJ_OK);
    CHECK(aj_op_set_dtype(op, AJ_DTYPE_BF16) == AJ_OK);
    CHECK(aj_op_set_head_dims(op, 128, 0) == AJ_OK);
    CHECK(aj_op_set_mask_causal(op, AJ_ALIGN_TOP_LEFT) == AJ_OK);
    CHECK(aj_op_set_softcap(op, 30.0) == AJ_OK);
    CHECK(aj_op_set_schedule(op, &sched) == AJ_OK);
    check_same_op(ctx, op, valid_specs[0]);
    aj_op_destroy(op);

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_EFFICIENT, &op) == AJ_OK);
    CHECK(aj_op_set_dtype(op, AJ_DTYPE_F16) == AJ_OK);
    CHECK(aj_op_set_head_dims(op, 128, 64) == AJ_OK);
    CHECK(aj_op_set_mask_window(op, 128, 0, AJ_ALIGN_TOP_LEFT) == AJ_OK);
    CHECK(aj_op_set_alibi(op) == AJ_OK);
    CHECK(aj_op_set_scale(op, 0.125) == AJ_OK);
    CHECK(aj_op_set_dropout(op, 0.1) == AJ_OK);
    CHECK(aj_op_set_bias(op, AJ_BIAS_ADD) == AJ_OK);
    CHECK(aj_op_set_accumulate(op, true) == AJ_OK);
    CHECK(aj_op_set_target(op, AJ_TARGET_SM_80) == AJ_OK);
    check_same_op(ctx, op, valid_specs[3]);
    CHECK(aj_op_get_info(op, &info) == AJ_OK);
    CHECK(info.kind == AJ_KIND_FORWARD && info.variant == AJ_VARIANT_EFFICIENT);
    CHECK(info.head_dim == 128 && info.head_dim_v == 64);
    CHECK(info.mask == AJ_MASK_WINDOW && info.window_left == 128 &&
          info.window_right == 0 && info.mask_align == AJ_ALIGN_TOP_LEFT);
    CHECK(info.score_mod == AJ_SCORE_MOD_ALIBI);
    CHECK(info.scale == 0.125 && !info.scale_is_default);
    CHECK(info.dropout == 0.1 && info.bias == AJ_BIAS_ADD && info.accumulate);
    CHECK(info.target == AJ_TARGET_SM_80);

    /* Setting a field back to its default prints like never setting it. */
    CHECK(aj_op_set_mask_none(op) == AJ_OK);
    CHECK(aj_op_set_score_mod_none(op) == AJ_OK);
    CHECK(aj_op_set_scale(op, -0.0) == AJ_OK);
    CHECK(aj_op_set_dropout(op, 0.0) == AJ_OK);
    CHECK(aj_op_set_bias(op, AJ_BIAS_NONE) == AJ_OK);
    CHECK(aj_op_set_accumulate(op, false) == AJ_OK);
    CHECK(aj_op_set_target(op, AJ_TARGET_ANY) == AJ_OK);
    check_same_op(ctx, op, "attention forward efficient { dtype = f16 "
                           "head_dim = 128 head_dim_v = 64 }");
    aj_op_destroy(op);

    CHECK(aj_op_create(ctx, AJ_KIND_BACKWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_set_dtype(op, AJ_DTYPE_BF16) == AJ_OK);
    CHECK(aj_op_set_head_dims(op, 96, 96) == AJ_OK);
    CHECK(aj_op_set_mask_causal(op, AJ_ALIGN_BOTTOM_RIGHT) == AJ_OK);
    CHECK(aj_op_set_layout(op, AJ_LAYOUT_VARLEN) == AJ_OK);
    CHECK(aj_op_set_deterministic(op, true) == AJ_OK);
    CHECK(aj_op_set_target(op, AJ_TARGET_SM_90A) == AJ_OK);
    check_same_op(ctx, op, valid_specs[2]);
    aj_op_destroy(op);

    CHECK(aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_NONE, &op) == AJ_OK);
    CHECK(aj_op_set_dtype(op, AJ_DTYPE_F32) == AJ_OK);
    CHECK(aj_op_set_head_dims(op, 0, 128) == AJ_OK);
    check_same_op(ctx, op, valid_specs[6]);
    CHECK(aj_op_get_info(op, &info) == AJ_OK && info.head_dim_v == 128 &&
          info.kind == AJ_KIND_MERGE && info.variant == AJ_VARIANT_NONE);
    aj_op_destroy(op);
}

static void test_defaults_and_clone(aj_ctx *ctx)
{
    aj_op *op = NULL, *copy = NULL;
    aj_op_info info;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_get_info(op, &info) == AJ_OK);
    CHECK(info.dtype == AJ_DTYPE_F32 && info.head_dim == 64 &&
          info.head_dim_v == 64);
    CHECK(info.mask == AJ_MASK_NONE && info.score_mod == AJ_SCORE_MOD_NONE);
    CHECK(info.scale == 0.125 && info.scale_is_default);
    CHECK(info.dropout == 0.0 && info.bias == AJ_BIAS_NONE &&
          info.layout == AJ_LAYOUT_PADDED);
    CHECK(!info.accumulate && !info.deterministic);
    CHECK(info.schedule.block_m == 0 && info.schedule.block_n == 0 &&
          info.schedule.warps == 0 && info.schedule.stages == 0);
    CHECK(info.target == AJ_TARGET_ANY);
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_OK);

    /* A clone is deep: changing it leaves the original alone. */
    CHECK(aj_op_set_head_dims(op, 128, 0) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_clone(op, &copy), AJ_OK);
    CHECK(strcmp(canonical(copy), canonical(op)) == 0);
    CHECK(aj_op_set_dtype(copy, AJ_DTYPE_F16) == AJ_OK);
    CHECK(aj_op_get_info(op, &info) == AJ_OK && info.dtype == AJ_DTYPE_F32 &&
          info.head_dim == 128);
    aj_op_destroy(copy);
    aj_op_destroy(op);
}

/* ---------------------------------------------------------------- invalid */

typedef struct bad_spec {
    const char *text;
    size_t len;            /* 0: strlen(text) */
    aj_status status;
    const char *message;   /* a substring of the error, "t.aj:L:C: ..." */
} bad_spec;

#define FWD "attention forward flash {\n"
#define EFF "attention forward efficient {\n"
#define BWD "attention backward flash {\n"
#define MERGE "attention merge {\n"
#define REQ "  dtype = f16\n  head_dim = 64\n"   /* lines 2 and 3 */

static const bad_spec bad_specs[] = {
    /* input as a whole */
    { "", 0, AJ_ERR_PARSE, "t.aj:1:1: empty spec: expected 'attention KIND VARIANT {'" },
    { "# only a comment\n\n", 0, AJ_ERR_PARSE, "t.aj:3:1: empty spec" },
    { FWD "  dtype = f16\0\n  head_dim = 64\n}\n", 45, AJ_ERR_PARSE,
      "t.aj:2:14: NUL byte in the input" },
    { "attn forward flash {", 0, AJ_ERR_PARSE,
      "t.aj:1:1: expected 'attention' to start the spec, found 'attn'" },
    { FWD REQ "}\nattention", 0, AJ_ERR_PARSE,
      "t.aj:5:1: unexpected 'attention' after the closing '}' (a spec holds one op)" },
    { FWD REQ "} }", 0, AJ_ERR_PARSE, "t.aj:4:3: unexpected '}' after the closing '}'" },
    { FWD REQ, 0, AJ_ERR_PARSE,
      "t.aj:4:1: expected '}' to close the '{' at 1:25, found end of input" },
    { "attention forward flash\n  dtype = f16\n", 0, AJ_ERR_PARSE,
      "t.aj:2:3: expected '{' after the header, found 'dtype'" },
    { FWD REQ "  bias = none;\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:14: unexpected character ';'" },
    { FWD REQ "  \xc3\xa9 = 1\n}", 0, AJ_ERR_PARSE, "t.aj:4:3: unexpected byte 0xc3" },
    /* header */
    { "attention sideways flash {", 0, AJ_ERR_PARSE,
      "t.aj:1:11: expected an op kind (forward, backward or merge), found 'sideways'" },
    { "attention forward quick {", 0, AJ_ERR_PARSE,
      "t.aj:1:19: expected a variant (flash or efficient), found 'quick'" },
    { "attention backward {\n", 0, AJ_ERR_PARSE,
      "t.aj:1:20: expected a variant (flash or efficient), found '{'" },
    { "attention merge flash {", 0, AJ_ERR_PARSE,
      "t.aj:1:17: merge ops take no variant, found 'flash'" },
    { "attention merge dtype = f16", 0, AJ_ERR_PARSE,
      "t.aj:1:17: expected '{' after the header, found 'dtype'" },
    /* fields */
    { FWD REQ "  maks = none\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:3: unknown field 'maks' (expected one of dtype, head_dim, head_dim_v, "
      "tensors, mask, score_mod, sinks, scale, dropout, bias, layout, q_dtype, kv_dtype, q_layout, "
      "kv_shared, accumulate, deterministic, schedule or target)" },
    { MERGE "  dtype = f16\n  head_dimv = 64\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:3: unknown field 'head_dimv' (expected one of dtype, head_dim_v or target)" },
    { FWD REQ "  dtype = bf16\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:3: duplicate field 'dtype' (first set at 2:3)" },
    { FWD REQ "  layout padded\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:10: expected '=' after 'layout', found 'padded'" },
    { FWD REQ "  = f16\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:3: expected a field name or '}', found '='" },
    { FWD "  head_dim = 64\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:1: missing required field 'dtype' (forward ops need dtype and head_dim)" },
    { BWD "  dtype = f16\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:1: missing required field 'head_dim' (backward ops need dtype and head_dim)" },
    { MERGE "  dtype = f16\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:1: missing required field 'head_dim_v' (merge ops need dtype and head_dim_v)" },
    /* values, one kind of mistake per field type */
    { FWD "  dtype = fp16\n  head_dim = 64\n}", 0, AJ_ERR_PARSE,
      "t.aj:2:11: expected a dtype (f16, bf16 or f32), found 'fp16'" },
    { FWD "  dtype = f16\n  head_dim = 64.0\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:14: expected an integer (decimal digits, no sign), found '64.0'" },
    { FWD "  dtype = f16\n  head_dim = -64\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:14: expected an integer (decimal digits, no sign), found '-64'" },
    { FWD "  dtype = f16\n  head_dim = 99999999999\n}", 0, AJ_ERR_PARSE,
      "t.aj:3:14: integer '99999999999' is too large (at most 2147483647)" },
    { FWD REQ "  mask = window(99999999999999999999, 0)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:17: integer '99999999999999999999' is too large (at most 9223372036854775807)" },
    { FWD REQ "  mask = causal\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:10: bare 'causal' is ambiguous: write causal(top_left) (PyTorch "
      "is_causal) or causal(bottom_right) (FlashAttention)" },
    { FWD REQ "  mask = causal(top)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:17: expected an alignment (top_left or bottom_right), found 'top'" },
    { FWD REQ "  mask = sliding(4, 4)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:10: expected a mask (none, causal(top_left), causal(bottom_right), "
      "window(LEFT, RIGHT), window(LEFT, RIGHT, bottom_right) or expr(E)), found "
      "'sliding'" },
    { FWD REQ "  mask = window(4 5)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:19: expected ',' after the window's left size, found '5'" },
    { FWD REQ "  mask = window(4, 5\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:1: expected ')' after the window, found '}'" },
    { FWD REQ "  score_mod = tanh\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:15: expected a score_mod (none, softcap(C), alibi or expr(E)), found "
      "'tanh'" },
    { FWD REQ "  score_mod = softcap\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:1: expected '(' after 'softcap', found '}'" },
    { FWD REQ "  score_mod = softcap(3) +\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:1: expected alibi (softcap(C) + alibi: ALiBi after the softcap), found '}'" },
    { FWD REQ "  score_mod = softcap(3) + softcap(4)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:28: expected alibi (softcap(C) + alibi: ALiBi after the softcap), found "
      "'softcap'" },
    { FWD REQ "  score_mod = alibi + softcap(4)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:21: expected a field name or '}', found '+'" },
    { FWD REQ "  score_mod = alibi(slp\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:1: expected ')' after alibi(NAME, found '}'" },
    { FWD REQ "  score_mod = softcap(inf)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:23: expected a number, found 'inf'" },
    { FWD REQ "  score_mod = softcap(1e999)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:23: number '1e999' is out of range" },
    { FWD REQ "  dropout = 1.5.2\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:13: malformed number '1.5.2'" },
    { FWD REQ "  dropout = 1e\n}", 0, AJ_ERR_PARSE, "t.aj:4:13: malformed number '1e'" },
    { FWD REQ "  dropout = 1.\n}", 0, AJ_ERR_PARSE, "t.aj:4:13: malformed number '1.'" },
    { FWD REQ "  dropout = 0x10\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:13: malformed number '0x10'" },
    { FWD REQ "  dropout = nan\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:13: expected a number, found 'nan'" },
    { FWD REQ "  dropout = 0.00000000000000000000000000000000000000000000000000000000000000001\n}",
      0, AJ_ERR_PARSE, "t.aj:4:13: number '0.00000000000000000000000000000000000000...' "
      "is too long (at most 64 characters)" },
    { FWD REQ "  scale = fast\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:11: expected a scale (default or a number), found 'fast'" },
    { FWD REQ "  bias = mul\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:10: expected a bias (none or add), found 'mul'" },
    { FWD REQ "  layout = packed\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:12: expected a layout (padded, varlen or paged), found 'packed'" },
    { FWD REQ "  accumulate = yes\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:16: expected a boolean (false or true), found 'yes'" },
    { FWD REQ "  schedule = fast\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:14: expected a schedule (default or (block_m = N, block_n = N, "
      "warps = N, stages = N)), found 'fast'" },
    { FWD REQ "  schedule = ()\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:15: expected a schedule key (block_m, block_n, warps, stages, splits, "
      "warpgroups or producer), found ')'" },
    { FWD REQ "  schedule = (block_m = 64, block_m = 64)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:29: duplicate schedule key 'block_m'" },
    { FWD REQ "  schedule = (warps = 4 stages = 2)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:25: expected ',' or ')' in the schedule, found 'stages'" },
    { FWD REQ "  schedule = (warps = -4)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:23: expected an integer (decimal digits, no sign), found '-4'" },
    { FWD REQ "  target = sm_75\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:12: expected a target (any, sm_80, sm_90, sm_90a, sim, cpu or sm_89), found 'sm_75'" },
    /* verifier rules, reported at the field */
    { FWD "  dtype = f16\n  head_dim = 0\n}", 0, AJ_ERR_VERIFY,
      "t.aj:3:3: head_dim 0 is out of range (want 1..1024)" },
    { FWD "  dtype = f16\n  head_dim = 2048\n}", 0, AJ_ERR_VERIFY,
      "t.aj:3:3: head_dim 2048 is out of range (want 1..1024)" },
    { FWD REQ "  head_dim_v = 0\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: head_dim_v 0 is out of range (want 1..1024)" },
    { MERGE "  dtype = f16\n  head_dim_v = 1025\n}", 0, AJ_ERR_VERIFY,
      "t.aj:3:3: head_dim_v 1025 is out of range (want 1..1024)" },
    { FWD REQ "  mask = window(3000000000, 0)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: window left 3000000000 is out of range (want 0..2147483647)" },
    { FWD REQ "  mask = window(0, 2147483648, bottom_right)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: window right 2147483648 is out of range (want 0..2147483647)" },
    { FWD REQ "  score_mod = softcap(0.0)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: softcap 0.0 is out of range (want a finite number > 0)" },
    { FWD REQ "  score_mod = softcap(-1.5)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: softcap -1.5 is out of range (want a finite number > 0)" },
    { FWD REQ "  scale = 0\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: scale 0.0 is out of range (want default or a finite number > 0)" },
    { FWD REQ "  scale = -0.5\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: scale -0.5 is out of range (want default or a finite number > 0)" },
    { FWD REQ "  dropout = 1.0\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: dropout 1.0 is out of range (want 0 <= p < 1)" },
    { FWD REQ "  dropout = -0.1\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: dropout -0.1 is out of range (want 0 <= p < 1)" },
    { FWD REQ "  bias = add\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: bias = add needs the efficient variant; flash has no bias input" },
    { "attention backward efficient {\n" REQ "  accumulate = true\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: accumulate = true applies only to forward ops, not backward" },
    { EFF REQ "  deterministic = true\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: deterministic = true applies only to backward ops, not forward" },
    { FWD REQ "  schedule = (block_m = 100)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule block_m 100 is out of range (want 0 or a power of two in 16..256)" },
    { FWD REQ "  schedule = (block_n = 8)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule block_n 8 is out of range (want 0 or a power of two in 16..256)" },
    { FWD REQ "  schedule = (block_m = 512)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule block_m 512 is out of range" },
    { FWD REQ "  schedule = (warps = 3)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule warps 3 is out of range (want 0, 1, 2, 4, 8 or 16)" },
    { FWD REQ "  schedule = (warps = 32)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule warps 32 is out of range" },
    { FWD REQ "  schedule = (stages = 9)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule stages 9 is out of range (want 0..8)" },
    { MERGE "  dtype = f16\n  head_dim_v = 64\n  mask = none\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: mask does not apply to merge ops (merge takes only dtype, "
      "head_dim_v and target)" },
    { MERGE "  head_dim = 64\n  dtype = f16\n}", 0, AJ_ERR_VERIFY,
      "t.aj:2:3: head_dim does not apply to merge ops" },
    /* paged KV: a forward, without the training-only inputs */
    { "attention backward flash {\n" REQ "  layout = paged\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: layout = paged applies only to forward ops, not backward (a KV cache is "
      "read, not differentiated)" },
    { EFF REQ "  bias = add\n  layout = paged\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: layout = paged takes no bias (bias = add)" },
    { FWD REQ "  dropout = 0.1\n  layout = paged\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: layout = paged takes no dropout (an inference layout)" },
    { FWD REQ "  layout = paged\n  accumulate = true\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: accumulate = true does not apply to layout = paged" },
    { FWD REQ "  kv_dtype = bf16\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: kv_dtype = bf16 differs from dtype = f16 on layout = padded; K and V are the "
      "op's dtype or 8-bit floats (f8e4m3, f8e5m2), other element types are paged caches' "
      "only" },
    { "attention backward flash {\n" REQ "  kv_dtype = f8e5m2\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: kv_dtype = f8e5m2 applies only to forward ops, not backward (8-bit inputs "
      "are read with their descales, not differentiated)" },
    { FWD REQ "  q_dtype = f8e4m3\n  layout = paged\n}", 0, AJ_ERR_VERIFY,
      "q_dtype = f8e4m3: a paged op's queries are its dtype (its caches may be 8-bit: "
      "kv_dtype)" },
    { FWD REQ "  q_dtype = f4\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:13: expected a query dtype (f16, bf16, f32, f8e4m3 or f8e5m2), found 'f4'" },
    { FWD REQ "  layout = varlen\n  q_layout = varlen\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: q_layout applies only to layout = paged (the layout of its queries), not "
      "varlen" },
    { FWD REQ "  layout = paged\n  kv_shared = true\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: kv_shared = true needs an explicit scale" },
    { FWD REQ "  scale = 0.1\n  kv_shared = true\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: kv_shared = true applies only to layout = paged (one cache holds K and V), "
      "not padded" },
    { FWD REQ "  head_dim_v = 72\n  scale = 0.1\n  layout = paged\n  kv_shared = true\n}", 0,
      AJ_ERR_VERIFY, "t.aj:7:3: kv_shared = true: head_dim_v = 72 exceeds head_dim = 64" },
    { FWD REQ "  layout = paged\n  kv_shared = yes\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:15: expected a boolean" },
    { FWD REQ "  layout = paged\n  q_layout = paged\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:14: expected a query layout (padded or varlen), found 'paged'" },
    { FWD REQ "  layout = paged\n  kv_dtype = f4\n}", 0, AJ_ERR_PARSE,
      "t.aj:5:14: expected a KV dtype (f16, bf16, f32, f8e4m3 or f8e5m2), found 'f4'" },
    { FWD "  dtype = f8e4m3\n  head_dim = 64\n}", 0, AJ_ERR_PARSE,
      "t.aj:2:11: expected a dtype (f16, bf16 or f32), found 'f8e4m3'" },
    { FWD REQ "  schedule = (splits = 4)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule splits applies only to layout = paged, not padded" },
    { FWD REQ "  layout = paged\n  schedule = (splits = 17)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: schedule splits 17 is out of range (want 0..16)" },
    { FWD REQ "  schedule = (warpgroups = 3)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule warpgroups 3 is out of range (want 0..2)" },
    { BWD REQ "  schedule = (warpgroups = 1, producer = 1)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule producer = 1 applies to the flash forward only (the wgmma backward "
      "is not warp specialised)" },
    { "attention backward efficient {\n" REQ "  schedule = (warpgroups = 2)\n}", 0,
      AJ_ERR_VERIFY, "t.aj:4:3: schedule warpgroups applies only to flash forward and backward "
      "ops over padded or varlen tensors (the wgmma templates), not backward efficient over "
      "these tensors" },
    { "attention forward efficient {\n" REQ "  schedule = (warpgroups = 1)\n}", 0,
      AJ_ERR_VERIFY, "t.aj:4:3: schedule warpgroups applies only to flash forward and "
      "backward ops over padded or varlen tensors (the wgmma templates), not forward "
      "efficient over these tensors" },
    { FWD REQ "  layout = paged\n  schedule = (warpgroups = 2)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:5:3: schedule warpgroups applies only to flash forward and backward ops over "
      "padded or varlen tensors (the wgmma templates), not forward flash over paged caches" },
    { FWD REQ "  schedule = (producer = 1)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule producer = 1 specialises the wgmma template's warps: it needs "
      "warpgroups = 1 or 2" },
    { FWD REQ "  schedule = (warpgroups = 1, producer = 2)\n}", 0, AJ_ERR_VERIFY,
      "t.aj:4:3: schedule producer 2 is out of range (want 0 or 1)" },
    { FWD REQ "  schedule = (producer = 1, producer = 1)\n}", 0, AJ_ERR_PARSE,
      "t.aj:4:29: duplicate schedule key 'producer'" },
};

static void test_bad_specs(aj_ctx *ctx)
{
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
        const bad_spec *b = &bad_specs[i];
        size_t len = b->len ? b->len : strlen(b->text);
        aj_op *op = (aj_op *)&op;   /* a sentinel: must stay untouched */
        aj_status st = aj_op_parse(ctx, b->text, len, "t.aj", &op);

        CHECK_MSG(st == b->status, "bad[%zu]: got %s, want %s (%s)", i,
                  aj_status_str(st), aj_status_str(b->status), aj_last_error(ctx));
        CHECK_MSG(strstr(aj_last_error(ctx), b->message) != NULL,
                  "bad[%zu]: error \"%s\" lacks \"%s\"", i, aj_last_error(ctx),
                  b->message);
        CHECK_MSG(op == (aj_op *)&op, "bad[%zu]: *out was written", i);
    }
}

static void test_parse_limits(aj_ctx *ctx)
{
    size_t big = ((size_t)1 << 20) + 1;
    char *text = malloc(big);
    aj_op *op = NULL;

    /* Too large, rejected before it is read. */
    CHECK(text != NULL);
    if (text) {
        memset(text, ' ', big);
        CHECK_STATUS(ctx, aj_op_parse(ctx, text, big, "big.aj", &op),
                     AJ_ERR_PARSE);
        CHECK_ERROR(ctx, "big.aj: input is 1048577 bytes; a spec may be at most "
                         "1048576");
        /* 1 MiB itself is allowed: all blanks, so the spec is empty. */
        CHECK_STATUS(ctx, aj_op_parse(ctx, text, big - 1, "big.aj", &op),
                     AJ_ERR_PARSE);
        CHECK_ERROR(ctx, "big.aj:1:1048577: empty spec");
    }
    free(text);

    /* len is authoritative: text after it is never read. */
    CHECK_STATUS(ctx, aj_op_parse(ctx, valid_specs[1], 10, "cut", &op),
                 AJ_ERR_PARSE);
    CHECK_ERROR(ctx, "cut:1:11: expected an op kind (forward, backward or merge), "
                     "found end of input");
    /* No name: "<input>" */
    CHECK_STATUS(ctx, aj_op_parse(ctx, "attention", 9, NULL, &op), AJ_ERR_PARSE);
    CHECK_ERROR(ctx, "<input>:1:10: expected an op kind");
}

/* Every prefix and many one-byte edits of every valid spec, each in a
 * buffer of exactly its length (so ASan sees any read past the end), must
 * parse cleanly or fail with a parse or verify error; what parses must
 * print back to itself. */
static void test_mutations(aj_ctx *ctx)
{
    static const char edits[] = { '\0', '#', '(', ')', '{', '}', '=', ',', '9',
                                  '-', '.', 'e', '\n', ' ', 'x', (char)0xff };
    int bad = 0, parsed = 0, tried = 0;

    for (size_t s = 0; s < sizeof valid_specs / sizeof valid_specs[0]; s++) {
        const char *spec = valid_specs[s];
        size_t len = strlen(spec);

        for (size_t cut = 0; cut <= len; cut++) {
            for (size_t e = 0; e <= sizeof edits; e++) {
                /* e == sizeof edits: the prefix itself, unedited */
                size_t n = e < sizeof edits ? len : cut;
                char *buf = malloc(n ? n : 1);
                aj_op *op = NULL;
                aj_status st;

                if (!buf)
                    continue;
                memcpy(buf, spec, n);
                if (e < sizeof edits && cut < len)
                    buf[cut] = edits[e];
                else if (e < sizeof edits) {
                    free(buf);
                    continue;
                }
                st = aj_op_parse(ctx, buf, n, "mut", &op);
                tried++;
                if (st == AJ_OK) {
                    char text[AJ_CANONICAL_MAX];
                    aj_op *again = NULL;

                    parsed++;
                    snprintf(text, sizeof text, "%s", canonical(op));
                    if (aj_op_parse(ctx, text, strlen(text), "again", &again) !=
                            AJ_OK || strcmp(text, canonical(again)) != 0)
                        bad++;
                    aj_op_destroy(again);
                } else if (st != AJ_ERR_PARSE && st != AJ_ERR_VERIFY) {
                    bad++;
                } else if (strncmp(aj_last_error(ctx), "mut:", 4) != 0) {
                    bad++;
                }
                aj_op_destroy(op);
                free(buf);
            }
        }
    }
    CHECK_MSG(bad == 0, "%d of %d mutated specs misbehaved", bad, tried);
    CHECK(parsed > 0 && parsed < tried);
}

/* ---------------------------------------------------------------- verify */

/* Rules that neither the parser nor the setters let through are still
 * enforced by the verifier itself. */
static void test_verifier_direct(aj_ctx *ctx)
{
    aj_op *op = NULL;
    aj_field field = AJ_FIELD_COUNT;
    char msg[256];

    CHECK_STATUS(ctx, aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_NONE, &op),
                 AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_create: forward ops need variant flash or efficient, "
                     "got none");
    CHECK_STATUS(ctx, aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_FLASH, &op),
                 AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_create: merge ops take no variant, got flash");
    CHECK(op == NULL);

    CHECK(aj_op_create(ctx, AJ_KIND_BACKWARD, AJ_VARIANT_EFFICIENT, &op) == AJ_OK);
    if (!op)
        return;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_OK);

    op->variant = AJ_VARIANT_NONE;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK(field == AJ_FIELD_HEADER);
    CHECK(strcmp(msg, "backward ops need variant flash or efficient, got none") == 0);
    op->variant = AJ_VARIANT_EFFICIENT;

    op->mask = (aj_mask_spec){ .kind = AJ_MASK_WINDOW, .left = -1 };
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK(field == AJ_FIELD_MASK);
    CHECK(strcmp(msg, "window left -1 is out of range (want 0..2147483647)") == 0);
    /* aj_op_verify runs the same rules when no setter failed. */
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_verify: window left -1 is out of range");
    op->mask = (aj_mask_spec){ .kind = AJ_MASK_NONE };

    op->schedule.stages = -1;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK(field == AJ_FIELD_SCHEDULE);
    CHECK(strcmp(msg, "schedule stages -1 is out of range (want 0..8)") == 0);
    op->schedule.stages = 0;

    op->dtype = (aj_dtype)7;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK(field == AJ_FIELD_DTYPE);
    CHECK(strcmp(msg, "dtype 7 is out of range (want 0..2)") == 0);
    aj_op_destroy(op);

    /* A merge op with a non-default field it does not have. */
    CHECK(aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_NONE, &op) == AJ_OK);
    if (!op)
        return;
    op->dropout = 0.5;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK(field == AJ_FIELD_DROPOUT);
    CHECK(strstr(msg, "dropout does not apply to merge ops") == msg);
    aj_op_destroy(op);
}

/* ---------------------------------------------------------------- setters */

/* layout = paged with kv_dtype and splits: builder, text and hash agree;
 * kv_dtype prints only for paged ops, so the others hash as before. */
/* schedule warpgroups: builder, text and hash agree; the setter refuses
 * what the verifier does; 0 prints nothing (the hash of before) */
static void test_warpgroups(aj_ctx *ctx)
{
    static const char text[] =
        "attention forward flash {\n  dtype = bf16\n  head_dim = 128\n"
        "  schedule = (block_n = 64, warpgroups = 2)\n}\n";
    aj_op *built = NULL, *parsed = NULL;
    char hb[AJ_HASH_HEX_LEN + 1], hp[AJ_HASH_HEX_LEN + 1], h0[AJ_HASH_HEX_LEN + 1];
    char *printed = NULL;
    int32_t wg = -1;
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &built) == AJ_OK);
    CHECK(aj_op_parse(ctx, text, strlen(text), "w.aj", &parsed) == AJ_OK);
    if (!built || !parsed)
        goto done;
    CHECK(aj_op_set_dtype(built, AJ_DTYPE_BF16) == AJ_OK);
    CHECK(aj_op_set_head_dims(built, 128, 0) == AJ_OK);
    CHECK(aj_op_set_schedule(built, &(aj_schedule){.block_n = 64}) == AJ_OK);
    CHECK(aj_op_get_warpgroups(built, &wg) == AJ_OK && wg == 0);
    CHECK(aj_op_hash(built, h0) == AJ_OK);
    CHECK(aj_op_set_warpgroups(built, 2) == AJ_OK);
    CHECK(aj_op_get_warpgroups(built, &wg) == AJ_OK && wg == 2);
    CHECK(aj_op_hash(built, hb) == AJ_OK && aj_op_hash(parsed, hp) == AJ_OK);
    CHECK_MSG(strcmp(hb, hp) == 0 && strcmp(hb, h0) != 0, "built %s, parsed %s, plain %s", hb,
              hp, h0);
    CHECK(aj_op_print(parsed, &printed) == AJ_OK);
    CHECK_MSG(printed && strstr(printed, "  schedule = (block_n = 64, warpgroups = 2)\n"),
              "printed: %s", printed);
    /* the wgmma template is not the paged one's: the op as a whole is refused */
    CHECK(aj_op_set_layout(built, AJ_LAYOUT_PAGED) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_verify(built), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "schedule warpgroups applies only to flash forward and backward ops over "
                     "padded or varlen tensors");
    CHECK(aj_op_set_layout(built, AJ_LAYOUT_PADDED) == AJ_OK);
    CHECK(aj_op_set_warpgroups(built, 0) == AJ_OK && aj_op_hash(built, hb) == AJ_OK &&
          strcmp(hb, h0) == 0);
    CHECK_STATUS(ctx, aj_op_set_warpgroups(built, -1), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_warpgroups: schedule warpgroups -1 is out of range (want 0..2)");
    /* producer: only with warpgroups; printed after them, in the hash */
    int32_t producer = -1;
    CHECK_STATUS(ctx, aj_op_set_producer(built, 1), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_producer: schedule producer = 1 specialises the wgmma "
                     "template's warps: it needs warpgroups = 1 or 2");
    CHECK(aj_op_set_warpgroups(built, 2) == AJ_OK && aj_op_set_producer(built, 1) == AJ_OK);
    CHECK(aj_op_get_producer(built, &producer) == AJ_OK && producer == 1);
    char hw[AJ_HASH_HEX_LEN + 1];
    CHECK(aj_op_hash(built, hw) == AJ_OK && strcmp(hw, hp) != 0);
    aj_free(printed);
    printed = NULL;
    CHECK(aj_op_print(built, &printed) == AJ_OK);
    CHECK_MSG(printed && strstr(printed, "  schedule = (block_n = 64, warpgroups = 2, "
                                         "producer = 1)\n"), "printed: %s", printed);
    CHECK_STATUS(ctx, aj_op_set_warpgroups(built, 0), AJ_ERR_VERIFY);
    CHECK_STATUS(ctx, aj_op_set_producer(built, 3), AJ_ERR_INVALID_ARG);
done:
    aj_free(printed);
    aj_op_destroy(built);
    aj_op_destroy(parsed);
}

static void test_paged(aj_ctx *ctx)
{
    static const char text[] =
        "attention forward flash {\n  dtype = bf16\n  head_dim = 128\n  layout = paged\n"
        "  kv_dtype = f8e5m2\n  schedule = (splits = 8)\n}\n";
    aj_op *built = NULL, *parsed = NULL, *plain = NULL;
    char hb[AJ_HASH_HEX_LEN + 1], hp[AJ_HASH_HEX_LEN + 1];
    char *printed = NULL;
    aj_op_info info;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &built) == AJ_OK);
    CHECK(aj_op_parse(ctx, text, strlen(text), "p.aj", &parsed) == AJ_OK);
    if (!built || !parsed)
        goto done;
    CHECK(aj_op_set_dtype(built, AJ_DTYPE_BF16) == AJ_OK);
    CHECK(aj_op_set_head_dims(built, 128, 0) == AJ_OK);
    CHECK(aj_op_set_layout(built, AJ_LAYOUT_PAGED) == AJ_OK);
    CHECK(aj_op_get_info(built, &info) == AJ_OK);
    CHECK(info.kv_dtype == AJ_DTYPE_BF16 && info.splits == 0);   /* defaults */
    CHECK(aj_op_set_kv_dtype(built, AJ_DTYPE_F8E5M2) == AJ_OK);
    CHECK(aj_op_set_splits(built, 8) == AJ_OK);
    CHECK(aj_op_verify(built) == AJ_OK);
    CHECK(aj_op_get_info(built, &info) == AJ_OK);
    CHECK(info.layout == AJ_LAYOUT_PAGED && info.kv_dtype == AJ_DTYPE_F8E5M2 &&
          info.splits == 8);
    CHECK(aj_op_hash(built, hb) == AJ_OK && aj_op_hash(parsed, hp) == AJ_OK);
    CHECK_MSG(strcmp(hb, hp) == 0, "built %s, parsed %s", hb, hp);
    CHECK(aj_op_print(parsed, &printed) == AJ_OK);
    CHECK_MSG(printed && strstr(printed, "  layout = paged\n  kv_dtype = f8e5m2\n") &&
              strstr(printed, "  schedule = (splits = 8)\n"), "printed: %s", printed);
    /* padded queries print no q_layout (the text and hash of before);
     * varlen ones print it after kv_dtype, and read back the same */
    CHECK(printed && !strstr(printed, "q_layout"));
    CHECK(aj_op_set_q_layout(built, AJ_LAYOUT_VARLEN) == AJ_OK);
    CHECK(aj_op_get_info(built, &info) == AJ_OK && info.q_layout == AJ_LAYOUT_VARLEN);
    aj_free(printed);
    printed = NULL;
    CHECK(aj_op_print(built, &printed) == AJ_OK);
    CHECK_MSG(printed && strstr(printed, "  kv_dtype = f8e5m2\n  q_layout = varlen\n"),
              "printed: %s", printed);
    aj_op_destroy(parsed);
    parsed = NULL;
    CHECK(printed && aj_op_parse(ctx, printed, strlen(printed), "v.aj", &parsed) == AJ_OK);
    CHECK(parsed && aj_op_hash(built, hb) == AJ_OK && aj_op_hash(parsed, hp) == AJ_OK &&
          strcmp(hb, hp) == 0);
    CHECK_STATUS(ctx, aj_op_set_q_layout(built, AJ_LAYOUT_PAGED), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_q_layout: q_layout paged is not a query layout (want padded "
                     "or varlen)");
    /* a different kv_dtype or split count is a different kernel */
    CHECK(aj_op_set_kv_dtype(built, AJ_DTYPE_F8E4M3) == AJ_OK);
    CHECK(aj_op_hash(built, hb) == AJ_OK && strcmp(hb, hp) != 0);
    /* setters refuse what the verifier refuses, naming the value */
    CHECK_STATUS(ctx, aj_op_set_splits(built, -1), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_splits: schedule splits -1 is out of range (want 0..16)");
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &plain) == AJ_OK);
    if (plain) {
        CHECK_STATUS(ctx, aj_op_set_kv_dtype(plain, AJ_DTYPE_F16), AJ_ERR_VERIFY);
        CHECK_ERROR(ctx, "aj_op_set_kv_dtype: kv_dtype = f16 differs from dtype = f32 on "
                         "layout = padded");
        aj_free(printed);
        printed = NULL;
        CHECK(aj_op_print(plain, &printed) == AJ_OK);
        CHECK(printed && !strstr(printed, "kv_dtype"));
    }
done:
    aj_free(printed);
    aj_op_destroy(plain);
    aj_op_destroy(parsed);
    aj_op_destroy(built);
}

/* The f8 KV dtypes: every code reads back through aj_convert, known
 * values, nearest-even rounding and saturation. */
static void test_f8_convert(void)
{
    static const struct { aj_dtype t; uint8_t code; float value; } known[] = {
        { AJ_DTYPE_F8E4M3, 0x7e, 448.0f }, { AJ_DTYPE_F8E4M3, 0x08, 0.015625f },
        { AJ_DTYPE_F8E4M3, 0x01, 0.001953125f }, { AJ_DTYPE_F8E4M3, 0xb8, -1.0f },
        { AJ_DTYPE_F8E5M2, 0x7b, 57344.0f }, { AJ_DTYPE_F8E5M2, 0x01, 1.52587890625e-05f },
        { AJ_DTYPE_F8E5M2, 0x3c, 1.0f },
    };
    static const struct { aj_dtype t; float in, out; } rounds[] = {
        { AJ_DTYPE_F8E4M3, 17.0f, 16.0f },     /* a tie goes to the even mantissa */
        { AJ_DTYPE_F8E4M3, 19.0f, 20.0f },
        { AJ_DTYPE_F8E4M3, 1e6f, 448.0f },     /* saturates */
        { AJ_DTYPE_F8E4M3, -INFINITY, -448.0f },
        { AJ_DTYPE_F8E5M2, 1e9f, 57344.0f },
        { AJ_DTYPE_F8E5M2, 5.0f, 5.0f },
    };
    for (int t = AJ_DTYPE_F8E4M3; t <= AJ_DTYPE_F8E5M2; t++) {
        for (int c = 0; c < 256; c++) {
            uint8_t code = (uint8_t)c, back = 0;
            float f = 0;
            CHECK(aj_convert(&code, (aj_dtype)t, &f, AJ_DTYPE_F32, 1) == AJ_OK);
            CHECK(aj_convert(&f, AJ_DTYPE_F32, &back, (aj_dtype)t, 1) == AJ_OK);
            if (isnan(f))
                continue;
            if (isinf(f))    /* e5m2's inf saturates on the way back */
                CHECK(back == (code & 0x80 ? 0xfb : 0x7b));
            else
                CHECK_MSG(back == code || (f == 0 && (back & 0x7f) == 0),
                          "%s code 0x%02x -> %g -> 0x%02x", aj_dtype_name((aj_dtype)t), c, f,
                          back);
        }
    }
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        float f = 0;
        CHECK(aj_convert(&known[i].code, known[i].t, &f, AJ_DTYPE_F32, 1) == AJ_OK);
        CHECK_MSG(f == known[i].value, "%s 0x%02x = %g, want %g", aj_dtype_name(known[i].t),
                  known[i].code, f, known[i].value);
    }
    for (size_t i = 0; i < sizeof rounds / sizeof rounds[0]; i++) {
        uint8_t code = 0;
        float f = 0;
        CHECK(aj_convert(&rounds[i].in, AJ_DTYPE_F32, &code, rounds[i].t, 1) == AJ_OK);
        CHECK(aj_convert(&code, rounds[i].t, &f, AJ_DTYPE_F32, 1) == AJ_OK);
        CHECK_MSG(f == rounds[i].out, "%s(%g) = %g, want %g", aj_dtype_name(rounds[i].t),
                  rounds[i].in, f, rounds[i].out);
    }
}

/* aj_convert's vector paths against its scalar loops, bit for bit: every
 * f16 / bf16 code, and f32 patterns -- a strided sweep of all 2^32 (an odd
 * stride, so every low bit pattern occurs), the specials (zeros,
 * infinities, NaNs with payloads, the f16 overflow, normal and subnormal
 * edges, bf16 ties) and their neighbours.  The buffers' lengths are not
 * multiples of a vector, and NaNs fall inside vector blocks. */
static void test_convert_paths(void)
{
    static const uint32_t specials[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
        0x7f800001, 0xff800001, 0x7fa00000, 0x7fffffff, 0x7fc01234, 0x7f802000,
        0x7f7fffff, 0x00000001, 0x007fffff, 0x00800000,
        0x477fe000, /* 65504, f16's largest */
        0x477ff000, /* 65520: rounds to f16 inf */
        0x387fc000, /* f16's subnormal edge, just below 2^-14 */
        0x38800000, /* 2^-14 */
        0x33800000, /* 2^-24, f16's least subnormal */
        0x33000000, /* 2^-25: a tie, to zero */
        0x33c00000, /* 3 * 2^-25: a tie, to 2 * 2^-24 */
        0x3f808000, 0x3f818000, /* bf16 ties, to even */
        0x3f801000, 0x3f803000, /* f16 ties, to even */
        0x3f800000, 0x40490fdb, 0xc0490fdb,
    };
    const size_t n_special = sizeof specials / sizeof specials[0];
    const uint32_t stride = 2654435761u;   /* odd: a sample of every residue */
    const size_t n_sweep = 1u << 20, n = 3 * n_special + n_sweep + 13;
    uint32_t *in = malloc(n * sizeof *in);
    uint16_t *half = malloc(n * sizeof *half), *want16 = malloc(n * sizeof *want16);
    float *back = malloc(n * sizeof *back), *want32 = malloc(n * sizeof *want32);
    CHECK(in && half && want16 && back && want32);
    if (!in || !half || !want16 || !back || !want32)
        goto done;
    size_t m = 0;
    for (size_t i = 0; i < n_special; i++)
        for (int d = -1; d <= 1; d++)
            in[m++] = specials[i] + (uint32_t)d;
    for (uint32_t u = 0x9e3779b9u; m < n; u += stride)
        in[m++] = u;

    const aj_convert_isa host = aj_convert_host_isa();
    printf("convert paths: host runs up to %d (0 scalar, 1 avx2, 2 avx512)\n", (int)host);
    for (int isa = AJ_CONVERT_SCALAR; isa < AJ_CONVERT_ISA_COUNT; isa++) {
        if (isa > (int)host) {
            printf("convert path %d: skipped, this host lacks it\n", isa);
            CHECK(aj_convert_with((aj_convert_isa)isa, in, AJ_DTYPE_F32, half, AJ_DTYPE_F16, 1) ==
                  AJ_ERR_UNSUPPORTED);
            continue;
        }
        for (int t = AJ_DTYPE_F16; t <= AJ_DTYPE_BF16; t++) {
            const aj_dtype dt = (aj_dtype)t;
            const float *f = (const float *)in;
            for (size_t i = 0; i < n; i++)   /* the scalar rule, element by element */
                want16[i] = dt == AJ_DTYPE_F16 ? aj_f32_to_f16(f[i]) : aj_f32_to_bf16(f[i]);
            CHECK(aj_convert_with((aj_convert_isa)isa, f, AJ_DTYPE_F32, half, dt, n) == AJ_OK);
            size_t bad = n;
            for (size_t i = 0; i < n && bad == n; i++)
                bad = half[i] == want16[i] ? bad : i;
            CHECK_MSG(bad == n, "path %d f32 -> %s: 0x%08x gives 0x%04x, want 0x%04x", isa,
                      aj_dtype_name(dt), in[bad % n], half[bad % n], want16[bad % n]);
            for (size_t i = 0; i < n; i++)   /* every code, then again from offset 3 */
                half[i] = (uint16_t)(i < 65536 ? i : i * 40503u);
            for (size_t i = 0; i < n; i++)
                want32[i] = dt == AJ_DTYPE_F16 ? aj_f16_to_f32(half[i]) : aj_bf16_to_f32(half[i]);
            CHECK(aj_convert_with((aj_convert_isa)isa, half + 3, dt, back, AJ_DTYPE_F32, n - 3) ==
                  AJ_OK);
            CHECK_MSG(memcmp(back, want32 + 3, (n - 3) * sizeof *back) == 0,
                      "path %d %s -> f32 differs from the scalar rule", isa, aj_dtype_name(dt));
        }
    }
done:
    free(in);
    free(half);
    free(want16);
    free(back);
    free(want32);
}

static void test_setter_errors(aj_ctx *ctx)
{
    aj_schedule bad_block = { .block_m = -16 };
    aj_schedule bad_stages = { .stages = 9 };
    aj_op *fwd = NULL, *bwd = NULL, *merge = NULL;
    aj_op_info info;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &fwd) == AJ_OK);
    CHECK(aj_op_create(ctx, AJ_KIND_BACKWARD, AJ_VARIANT_FLASH, &bwd) == AJ_OK);
    CHECK(aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_NONE, &merge) == AJ_OK);
    if (!fwd || !bwd || !merge)
        return;

    /* Out-of-range enums name the argument and the value. */
    CHECK_STATUS(ctx, aj_op_set_dtype(fwd, (aj_dtype)3), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dtype: dtype 3 is out of range (want 0..2)");
    CHECK_STATUS(ctx, aj_op_set_dtype(fwd, (aj_dtype)-1), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dtype: dtype -1 is out of range");
    CHECK_STATUS(ctx, aj_op_set_mask_causal(fwd, (aj_align)2), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_mask_causal: mask align 2 is out of range (want 0..1)");
    CHECK_STATUS(ctx, aj_op_set_mask_window(fwd, 1, 1, (aj_align)5),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_mask_window: mask align 5 is out of range");
    CHECK_STATUS(ctx, aj_op_set_bias(fwd, (aj_bias)2), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_bias: bias 2 is out of range (want 0..1)");
    CHECK_STATUS(ctx, aj_op_set_layout(fwd, (aj_layout)9), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_layout: layout 9 is out of range (want 0..2)");
    CHECK_STATUS(ctx, aj_op_set_target(fwd, AJ_TARGET_COUNT), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_target: target 7 is out of range (want 0..6)");

    /* Out-of-range values. */
    CHECK_STATUS(ctx, aj_op_set_head_dims(fwd, 0, 0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_head_dims: head_dim 0 is out of range (want 1..1024)");
    CHECK_STATUS(ctx, aj_op_set_head_dims(fwd, 64, 2000), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_head_dims: head_dim_v 2000 is out of range");
    CHECK_STATUS(ctx, aj_op_set_head_dims(fwd, 64, -8), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_head_dims: head_dim_v -8 is out of range");
    CHECK_STATUS(ctx, aj_op_set_mask_window(fwd, -1, 0, AJ_ALIGN_TOP_LEFT),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_mask_window: window left -1 is out of range "
                     "(want 0..2147483647)");
    CHECK_STATUS(ctx, aj_op_set_mask_window(fwd, 0, (int64_t)1 << 31,
                                            AJ_ALIGN_TOP_LEFT),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_mask_window: window right 2147483648 is out of range");
    CHECK_STATUS(ctx, aj_op_set_softcap(fwd, NAN), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_softcap: softcap nan is out of range");
    CHECK_STATUS(ctx, aj_op_set_softcap(fwd, INFINITY), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_softcap: softcap inf is out of range");
    CHECK_STATUS(ctx, aj_op_set_softcap(fwd, 0.0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_softcap: softcap 0.0 is out of range");
    CHECK_STATUS(ctx, aj_op_set_scale(fwd, -1.0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_scale: scale -1.0 is out of range (want default "
                     "or a finite number > 0)");
    CHECK_STATUS(ctx, aj_op_set_scale(fwd, NAN), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_scale: scale nan is out of range");
    CHECK_STATUS(ctx, aj_op_set_dropout(fwd, 1.0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dropout: dropout 1.0 is out of range (want 0 <= p < 1)");
    CHECK_STATUS(ctx, aj_op_set_dropout(fwd, NAN), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dropout: dropout nan is out of range");
    CHECK_STATUS(ctx, aj_op_set_schedule(fwd, &bad_block), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_schedule: schedule block_m -16 is out of range");
    CHECK_STATUS(ctx, aj_op_set_schedule(fwd, &bad_stages), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_schedule: schedule stages 9 is out of range");
    CHECK_STATUS(ctx, aj_op_set_schedule(fwd, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_schedule: schedule is NULL");

    /* Valid values that do not fit the op. */
    CHECK_STATUS(ctx, aj_op_set_bias(fwd, AJ_BIAS_ADD), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_bias: bias = add needs the efficient variant; "
                     "flash has no bias input");
    CHECK_STATUS(ctx, aj_op_set_deterministic(fwd, true), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_deterministic: deterministic = true applies only "
                     "to backward ops, not forward");
    CHECK_STATUS(ctx, aj_op_set_accumulate(bwd, true), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_accumulate: accumulate = true applies only to "
                     "forward ops, not backward");
    CHECK_STATUS(ctx, aj_op_set_accumulate(bwd, false), AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_mask_causal(merge, AJ_ALIGN_TOP_LEFT), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_mask_causal: mask does not apply to merge ops "
                     "(merge takes only dtype, head_dim_v and target)");
    CHECK_STATUS(ctx, aj_op_set_mask_none(merge), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_mask_none: mask does not apply to merge ops");
    CHECK_STATUS(ctx, aj_op_set_dropout(merge, 0.0), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_dropout: dropout does not apply to merge ops");
    CHECK_STATUS(ctx, aj_op_set_head_dims(merge, 64, 128), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_head_dims: head_dim 64 does not apply to merge "
                     "ops (pass 0 and give the dim as head_dim_v)");
    CHECK_STATUS(ctx, aj_op_set_head_dims(merge, 0, 0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_head_dims: head_dim_v 0 is out of range (want 1..1024)");

    /* Failing setters left every field as it was. */
    CHECK(aj_op_get_info(fwd, &info) == AJ_OK);
    CHECK(info.dtype == AJ_DTYPE_F32 && info.head_dim == 64 &&
          info.head_dim_v == 64 && info.mask == AJ_MASK_NONE &&
          info.score_mod == AJ_SCORE_MOD_NONE && info.scale_is_default &&
          info.dropout == 0.0 && info.bias == AJ_BIAS_NONE &&
          info.layout == AJ_LAYOUT_PADDED && !info.deterministic &&
          info.schedule.block_m == 0 && info.schedule.stages == 0 &&
          info.target == AJ_TARGET_ANY);
    CHECK(aj_op_get_info(merge, &info) == AJ_OK && info.head_dim_v == 64 &&
          info.mask == AJ_MASK_NONE);

    aj_op_destroy(fwd);
    aj_op_destroy(bwd);
    aj_op_destroy(merge);
}

/* The first failing setter's error is kept and returned by aj_op_verify. */
static void test_sticky(aj_ctx *ctx)
{
    aj_op *op = NULL, *copy = NULL;
    aj_op_info info;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    if (!op)
        return;
    CHECK_STATUS(ctx, aj_op_set_dropout(op, 1.5), AJ_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, aj_op_set_bias(op, AJ_BIAS_ADD), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_bias");
    /* Later setters still run. */
    CHECK_STATUS(ctx, aj_op_set_dtype(op, AJ_DTYPE_F16), AJ_OK);
    CHECK(aj_op_get_info(op, &info) == AJ_OK && info.dtype == AJ_DTYPE_F16);
    CHECK(strcmp(aj_last_error(ctx), "aj_op_set_bias: bias = add needs the "
                                     "efficient variant; flash has no bias input")
          == 0);

    /* verify returns the first error and re-records its message. */
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_ERR_INVALID_ARG);
    CHECK(strcmp(aj_last_error(ctx), "aj_op_set_dropout: dropout 1.5 is out of "
                                     "range (want 0 <= p < 1)") == 0);
    /* ... every time, and a clone carries it along. */
    CHECK(aj_op_set_layout(op, (aj_layout)4) == AJ_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dropout: dropout 1.5");
    CHECK(aj_op_clone(op, &copy) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_verify(copy), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dropout: dropout 1.5");
    aj_op_destroy(copy);
    aj_op_destroy(op);

    /* A verify failure that came from a fit rule keeps AJ_ERR_VERIFY. */
    CHECK(aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_NONE, &op) == AJ_OK);
    CHECK(aj_op_set_alibi(op) == AJ_ERR_VERIFY);
    CHECK(aj_op_set_dtype(op, AJ_DTYPE_BF16) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_alibi: score_mod does not apply to merge ops");
    aj_op_destroy(op);
}

/* ---------------------------------------------------------------- API */

static void test_null_args(aj_ctx *ctx)
{
    aj_schedule sched = { 0 };
    aj_op *op = NULL, *out = (aj_op *)&out;
    aj_op_info info;
    aj_target target;
    char hash[AJ_HASH_HEX_LEN + 1];
    char *text = NULL;

    /* No op, so no context: the status is all there is. */
    CHECK(aj_op_set_dtype(NULL, AJ_DTYPE_F16) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_head_dims(NULL, 64, 0) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_mask_none(NULL) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_mask_causal(NULL, AJ_ALIGN_TOP_LEFT) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_mask_window(NULL, 1, 1, AJ_ALIGN_TOP_LEFT) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_score_mod_none(NULL) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_softcap(NULL, 1.0) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_alibi(NULL) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_scale(NULL, 1.0) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_dropout(NULL, 0.1) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_bias(NULL, AJ_BIAS_NONE) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_layout(NULL, AJ_LAYOUT_PADDED) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_accumulate(NULL, false) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_deterministic(NULL, false) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_schedule(NULL, &sched) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_set_target(NULL, AJ_TARGET_ANY) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_verify(NULL) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_clone(NULL, &out) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_get_info(NULL, &info) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_print(NULL, &text) == AJ_ERR_INVALID_ARG && text == NULL);
    CHECK(aj_op_hash(NULL, hash) == AJ_ERR_INVALID_ARG);
    CHECK(aj_op_create(NULL, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &out) ==
          AJ_ERR_INVALID_ARG);
    CHECK(aj_op_parse(NULL, "x", 1, NULL, &out) == AJ_ERR_INVALID_ARG);
    CHECK(out == (aj_op *)&out);
    aj_op_destroy(NULL);
    aj_ctx_destroy(NULL);

    /* With a context, the message names the argument. */
    CHECK_STATUS(ctx, aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, NULL),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_create: out is NULL");
    CHECK_STATUS(ctx, aj_op_create(ctx, (aj_kind)9, AJ_VARIANT_FLASH, &out),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_create: kind 9 is out of range (want 0..2)");
    CHECK_STATUS(ctx, aj_op_create(ctx, AJ_KIND_FORWARD, (aj_variant)3, &out),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_create: variant 3 is out of range (want 0..2)");
    CHECK(out == (aj_op *)&out);
    CHECK_STATUS(ctx, aj_op_parse(ctx, NULL, 0, "n", &out), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_parse: text is NULL");
    CHECK_STATUS(ctx, aj_op_parse(ctx, "x", 1, "n", NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_parse: out is NULL");
    CHECK(out == (aj_op *)&out);

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_print(op, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_print: out is NULL");
    CHECK_STATUS(ctx, aj_op_hash(op, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_hash: out is NULL");
    CHECK_STATUS(ctx, aj_op_get_info(op, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_get_info: out is NULL");
    CHECK_STATUS(ctx, aj_op_clone(op, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_clone: out is NULL");
    /* Argument errors of these calls are not builder errors: not sticky. */
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_OK);
    aj_op_destroy(op);

    CHECK_STATUS(ctx, aj_target_from_name(ctx, NULL, &target), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_target_from_name: name is NULL");
    CHECK_STATUS(ctx, aj_target_from_name(ctx, "sm_90", NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_target_from_name: out is NULL");
    CHECK_STATUS(ctx, aj_target_from_name(ctx, "sm_75", &target),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_target_from_name: unknown target 'sm_75' (expected any, "
                     "sm_80, sm_89, sm_90, sm_90a, sim or cpu)");
    CHECK(aj_target_from_name(NULL, "SM_90", &target) == AJ_ERR_INVALID_ARG);
}

static void test_names(aj_ctx *ctx)
{
    static const char *const targets[] = { "any", "sm_80", "sm_90", "sm_90a",
                                           "sim", "cpu", "sm_89" };

    for (int t = 0; t < AJ_TARGET_COUNT; t++) {
        aj_target back = AJ_TARGET_COUNT;

        CHECK(strcmp(aj_target_name((aj_target)t), targets[t]) == 0);
        CHECK(aj_target_from_name(ctx, targets[t], &back) == AJ_OK &&
              back == (aj_target)t);
    }
    CHECK(strcmp(aj_kind_name(AJ_KIND_FORWARD), "forward") == 0);
    CHECK(strcmp(aj_kind_name(AJ_KIND_BACKWARD), "backward") == 0);
    CHECK(strcmp(aj_kind_name(AJ_KIND_MERGE), "merge") == 0);
    CHECK(strcmp(aj_variant_name(AJ_VARIANT_NONE), "none") == 0);
    CHECK(strcmp(aj_variant_name(AJ_VARIANT_FLASH), "flash") == 0);
    CHECK(strcmp(aj_variant_name(AJ_VARIANT_EFFICIENT), "efficient") == 0);
    CHECK(strcmp(aj_dtype_name(AJ_DTYPE_F16), "f16") == 0);
    CHECK(strcmp(aj_dtype_name(AJ_DTYPE_BF16), "bf16") == 0);
    CHECK(strcmp(aj_dtype_name(AJ_DTYPE_F32), "f32") == 0);
    CHECK(aj_kind_name(AJ_KIND_COUNT) == NULL);
    CHECK(aj_variant_name((aj_variant)-1) == NULL);
    CHECK(aj_dtype_name(AJ_DTYPE_COUNT) == NULL);
    CHECK(aj_target_name((aj_target)100) == NULL);
}

static void test_status_str(void)
{
    static const char *const names[] = {
        "AJ_OK", "AJ_ERR_INVALID_ARG", "AJ_ERR_PARSE", "AJ_ERR_VERIFY",
        "AJ_ERR_UNSUPPORTED", "AJ_ERR_CODEGEN", "AJ_ERR_NO_DEVICE", "AJ_ERR_IO",
        "AJ_ERR_OUT_OF_MEMORY", "AJ_ERR_INTERNAL", "AJ_ERR_KERNEL_FAULT", "AJ_ERR_COMM",
    };

    CHECK(sizeof names / sizeof names[0] == AJ_STATUS_COUNT);
    for (int s = 0; s < AJ_STATUS_COUNT; s++)
        CHECK_MSG(strcmp(aj_status_str((aj_status)s), names[s]) == 0,
                  "aj_status_str(%d) = %s", s, aj_status_str((aj_status)s));
    CHECK(strcmp(aj_status_str(AJ_STATUS_COUNT), "AJ_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(aj_status_str((aj_status)-3), "AJ_STATUS_UNKNOWN") == 0);
}

typedef struct log_record {
    int calls;
    aj_log_level level;
    char text[128];
} log_record;

static void record_log(void *user, aj_log_level level, const char *message)
{
    log_record *r = user;

    r->calls++;
    r->level = level;
    snprintf(r->text, sizeof r->text, "%s", message);
}

static void test_context(void)
{
    aj_ctx_config config = AJ_CTX_CONFIG_INIT;
    log_record rec = { 0 };
    aj_ctx *ctx = (aj_ctx *)&ctx, *other = NULL;
    const char *err;
    aj_op *op = NULL;

    CHECK(strcmp(aj_version_string(), "0.1.0") == 0);
    CHECK(aj_ctx_create(NULL, NULL) == AJ_ERR_INVALID_ARG);
    /* older callers pass a shorter struct (the first version ended before
     * cache_mode): accepted, with defaults for the rest; shorter still is
     * not a config */
    config.struct_size = offsetof(aj_ctx_config, cache_mode) - 1;
    CHECK(aj_ctx_create(&config, &ctx) == AJ_ERR_INVALID_ARG);
    config.struct_size = offsetof(aj_ctx_config, cache_mode);
    config.cache_mode = (aj_cache_mode)77;   /* beyond their struct: ignored */
    CHECK(aj_ctx_create(&config, &other) == AJ_OK && other != NULL);
    aj_ctx_destroy(other);
    other = NULL;
    config.cache_mode = AJ_CACHE_DEFAULT;
    config.struct_size = sizeof config;
    config.cache_mode = (aj_cache_mode)77;
    CHECK(aj_ctx_create(&config, &ctx) == AJ_ERR_INVALID_ARG);
    config.cache_mode = AJ_CACHE_DEFAULT;
    config.struct_size = 0;
    CHECK(aj_ctx_create(&config, &ctx) == AJ_ERR_INVALID_ARG);
    config.struct_size = sizeof config;
    config.log_level = (aj_log_level)4;
    CHECK(aj_ctx_create(&config, &ctx) == AJ_ERR_INVALID_ARG);
    CHECK(ctx == (aj_ctx *)&ctx);

    /* The log callback sees messages at or below its level, and only them. */
    config.log_level = AJ_LOG_INFO;
    config.log_fn = record_log;
    config.log_user = &rec;
    CHECK(aj_ctx_create(&config, &ctx) == AJ_OK);
    aj_log(ctx, AJ_LOG_DEBUG, "dropped %d", 1);
    CHECK(rec.calls == 0);
    aj_log(ctx, AJ_LOG_INFO, "kept %d", 2);
    CHECK(rec.calls == 1 && rec.level == AJ_LOG_INFO &&
          strcmp(rec.text, "kept 2") == 0);
    aj_log(ctx, AJ_LOG_ERROR, "%s", "also kept");
    CHECK(rec.calls == 2 && rec.level == AJ_LOG_ERROR &&
          strcmp(rec.text, "also kept") == 0);
    aj_log(NULL, AJ_LOG_ERROR, "no context");
    CHECK(rec.calls == 2);

    /* aj_last_error: "" until something fails; the text stays put through
     * successful calls and is replaced by the next failure. */
    CHECK(strcmp(aj_last_error(ctx), "") == 0);
    CHECK(strcmp(aj_last_error(NULL), "") == 0);
    CHECK(aj_op_parse(ctx, "bogus", 5, "a.aj", &op) == AJ_ERR_PARSE);
    err = aj_last_error(ctx);
    CHECK(strcmp(err, "a.aj:1:1: expected 'attention' to start the spec, "
                      "found 'bogus'") == 0);
    CHECK(aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_NONE, &op) == AJ_OK);
    CHECK(aj_op_verify(op) == AJ_OK);
    CHECK(aj_last_error(ctx) == err && strncmp(err, "a.aj:1:1:", 9) == 0);
    CHECK(aj_op_set_alibi(op) == AJ_ERR_VERIFY);
    CHECK(strncmp(err, "aj_op_set_alibi:", 16) == 0);

    /* Contexts do not share error text. */
    CHECK(aj_ctx_create(NULL, &other) == AJ_OK);
    CHECK(aj_op_parse(other, "", 0, "b.aj", &op) == AJ_ERR_PARSE);
    CHECK(strncmp(aj_last_error(other), "b.aj:1:1:", 9) == 0);
    CHECK(strncmp(aj_last_error(ctx), "aj_op_set_alibi:", 16) == 0);

    /* aj_fail re-recording the context's own text is safe. */
    CHECK(aj_fail(ctx, AJ_ERR_IO, "again: %s", aj_last_error(ctx)) == AJ_ERR_IO);
    CHECK(strncmp(aj_last_error(ctx), "again: aj_op_set_alibi:", 23) == 0);
    CHECK(aj_fail(NULL, AJ_ERR_IO, "nowhere") == AJ_ERR_IO);

    aj_op_destroy(op);
    aj_ctx_destroy(other);
    aj_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    aj_ctx *ctx = new_ctx();

    CHECK_MSG(argc >= 2, "usage: test_ir SPEC_DIR");
    test_status_str();
    test_context();
    test_names(ctx);
    test_valid_specs(ctx);
    if (argc >= 2)
        test_spec_dir(ctx, argv[1]);
    test_canonical_form(ctx);
    test_alibi_forms(ctx);
    test_known_hash(ctx);
    test_numbers(ctx);
    test_builder(ctx);
    test_defaults_and_clone(ctx);
    test_bad_specs(ctx);
    test_parse_limits(ctx);
    test_mutations(ctx);
    test_verifier_direct(ctx);
    test_setter_errors(ctx);
    test_paged(ctx);
    test_warpgroups(ctx);
    test_f8_convert();
    test_convert_paths();
    test_sticky(ctx);
    test_null_args(ctx);
    aj_ctx_destroy(ctx);
    return check_report();
}
