/*
 * test_cli_run.c -- `attnjit run` end to end: .npy tensors in, the kernel on
 * the sim device and on the cpu device, .npy results out, compared with the float64 reference;
 * then the command's errors, each with its exit code and message.
 *
 *   test_cli_run ATTNJIT_BINARY
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ref.h"
#include "tools/npy.h"

static const char *aj;
static char dir[] = "/tmp/aj_cli_run_XXXXXX";

static char *path(const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* Runs attnjit with `args`; returns its exit code, stderr in `err`. */
static int run_cli(const char *args, char *err, size_t cap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s'", aj, args, path("stderr.txt"));
    int status = system(cmd);
    FILE *f = fopen(path("stderr.txt"), "r");
    size_t n = f ? fread(err, 1, cap - 1, f) : 0;
    err[n] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void write_text(const char *p, const char *text)
{
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static uint64_t rng = 7;
static double uniform(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

/* Random f32 values exactly representable in f16, in both forms. */
static void random_f16_values(float *f, double *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        float x = (float)uniform();
        aj_convert(&x, AJ_DTYPE_F32, &h, AJ_DTYPE_F16, 1);
        aj_convert(&h, AJ_DTYPE_F16, &f[i], AJ_DTYPE_F32, 1);
        d[i] = f[i];
    }
}

static void test_run_matches_reference(const char *device)
{
    enum { B = 2, HQ = 4, HKV = 2, SQ = 33, SK = 50, D = 64 };
    write_text(path("op.aj"), "attention forward efficient {\n  dtype = f16\n  head_dim = 64\n"
                              "  mask = causal(bottom_right)\n}\n");
    static float q[B * HQ * SQ * D], k[B * HKV * SK * D], v[B * HKV * SK * D];
    static double qd[B * HQ * SQ * D], kd[B * HKV * SK * D], vd[B * HKV * SK * D];
    static double o_ref[B * HQ * SQ * D], lse_ref[B * HQ * SQ];
    random_f16_values(q, qd, sizeof q / sizeof q[0]);
    random_f16_values(k, kd, sizeof k / sizeof k[0]);
    random_f16_values(v, vd, sizeof v / sizeof v[0]);
    char err[2048];
    int64_t qs[4] = {B, HQ, SQ, D}, ks[4] = {B, HKV, SK, D};
    CHECK(npy_write_f32(path("q.npy"), q, 4, qs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("k.npy"), k, 4, ks, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("v.npy"), v, 4, ks, err, sizeof err) == NPY_OK);

    char args[2048];
    snprintf(args, sizeof args, "run '%s' --device %s --in q='%s' --in k='%s' --in v='%s' "
             "--out o='%s' --out lse='%s' --q-offset 100 --kv-offset 90 --workers 2",
             path("op.aj"), device, path("q.npy"), path("k.npy"), path("v.npy"), path("o.npy"),
             path("lse.npy"));
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 0, "attnjit run exited %d: %s", rc, err);
    CHECK_MSG(strstr(err, strcmp(device, "sim") == 0 ? "emulated thread-instructions"
                                                     : "compile") != NULL,
              "no summary: %s", err);

    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.Hq = HQ;
    p.Hkv = HKV;
    p.Sq = SQ;
    p.Sk = SK;
    p.D = D;
    p.Dv = D;
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    p.q_offset = 100;
    p.kv_offset = 90;
    ref_forward(&p, qd, kd, vd, o_ref, lse_ref);

    npy_array o, lse;
    CHECK(npy_read_f32(path("o.npy"), &o, err, sizeof err) == NPY_OK);
    CHECK(npy_read_f32(path("lse.npy"), &lse, err, sizeof err) == NPY_OK);
    CHECK(o.rank == 4 && o.shape[0] == B && o.shape[1] == HQ && o.shape[2] == SQ &&
          o.shape[3] == D);
    CHECK(lse.rank == 3 && lse.shape[2] == SQ);
    double worst_o = 0, worst_lse = 0;
    int empty_ok = 1, empty_rows = 0;
    for (size_t i = 0; o.f32 && i < o.count; i++)
        worst_o = fmax(worst_o, fabs(o.f32[i] - o_ref[i]) / (1e-3 + 2e-3 * fabs(o_ref[i])));
    for (size_t i = 0; lse.f32 && i < lse.count; i++) {
        if (isinf(lse_ref[i])) {
            empty_rows++;
            empty_ok &= isinf(lse.f32[i]) && lse.f32[i] < 0;
        } else {
            worst_lse = fmax(worst_lse, fabs(lse.f32[i] - lse_ref[i]) /
                                            (1e-4 + 1e-5 * fabs(lse_ref[i])));
        }
    }
    /* bottom_right with these offsets: q_pos + 17 - 10 >= kv_pos, so rows
     * see keys; the check is that every number agrees */
    CHECK_MSG(worst_o <= 1.0, "O error %.3g x tolerance", worst_o);
    CHECK_MSG(worst_lse <= 1.0, "LSE error %.3g x tolerance", worst_lse);
    CHECK(empty_ok);
    printf("attnjit run on %s: O %.3f, LSE %.3f of tolerance, %d empty rows\n", device,
           worst_o, worst_lse, empty_rows);
    npy_free(&o);
    npy_free(&lse);
}

/* Two accumulate runs over the two halves of the keys, from an empty
 * prior, equal the reference over all keys; a bias file broadcast over
 * batch and heads is added to every score. */
static void test_accumulate_and_bias(void)
{
    enum { B = 1, H = 2, SQ = 24, SK = 40, D = 16, HALF = SK / 2 };
    static float q[B * H * SQ * D], k[B * H * SK * D], v[B * H * SK * D], bias[SQ * SK];
    static float k1[B * H * HALF * D], k2[B * H * HALF * D], v1[B * H * HALF * D],
        v2[B * H * HALF * D], prior_o[B * H * SQ * D], prior_lse[B * H * SQ];
    static double qd[B * H * SQ * D], kd[B * H * SK * D], vd[B * H * SK * D], bd[SQ * SK];
    static double o_ref[B * H * SQ * D], lse_ref[B * H * SQ];
    random_f16_values(q, qd, sizeof q / sizeof q[0]);
    random_f16_values(k, kd, sizeof k / sizeof k[0]);
    random_f16_values(v, vd, sizeof v / sizeof v[0]);
    random_f16_values(bias, bd, sizeof bias / sizeof bias[0]);
    for (int h = 0; h < H; h++)   /* key halves, per head */
        for (int j = 0; j < SK; j++)
            for (int x = 0; x < D; x++) {
                float *kk = j < HALF ? k1 : k2, *vv = j < HALF ? v1 : v2;
                size_t at = ((size_t)h * HALF + (size_t)(j % HALF)) * D + (size_t)x;
                kk[at] = k[((size_t)h * SK + (size_t)j) * D + (size_t)x];
                vv[at] = v[((size_t)h * SK + (size_t)j) * D + (size_t)x];
            }
    for (size_t i = 0; i < sizeof prior_lse / sizeof prior_lse[0]; i++)
        prior_lse[i] = -INFINITY;
    char err[2048], args[4096];
    int64_t qs[4] = {B, H, SQ, D}, hs[4] = {B, H, HALF, D}, ls[3] = {B, H, SQ},
            bs[4] = {1, 1, SQ, SK};
    CHECK(npy_write_f32(path("aq.npy"), q, 4, qs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("ak1.npy"), k1, 4, hs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("ak2.npy"), k2, 4, hs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("av1.npy"), v1, 4, hs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("av2.npy"), v2, 4, hs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("ao0.npy"), prior_o, 4, qs, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("al0.npy"), prior_lse, 3, ls, err, sizeof err) == NPY_OK);
    write_text(path("acc.aj"), "attention forward efficient {\n  dtype = f16\n  head_dim = 16\n"
                               "  mask = causal(bottom_right)\n  accumulate = true\n}\n");
    /* keys 0..19 at kv_offset 0, then keys 20..39 at kv_offset 20 */
    for (int part = 0; part < 2; part++) {
        snprintf(args, sizeof args, "run '%s' --device sim --in q='%s' --in k='%s' --in v='%s' "
                 "--in o_acc='%s' --in lse='%s' --out o_acc='%s' --out lse='%s' "
                 "--kv-offset %d --sq-total %d --sk-total %d", path("acc.aj"), path("aq.npy"),
                 path(part ? "ak2.npy" : "ak1.npy"), path(part ? "av2.npy" : "av1.npy"),
                 path(part ? "ao1.npy" : "ao0.npy"), path(part ? "al1.npy" : "al0.npy"),
                 path(part ? "ao2.npy" : "ao1.npy"), path(part ? "al2.npy" : "al1.npy"),
                 part * HALF, SQ, SK);
        int rc = run_cli(args, err, sizeof err);
        CHECK_MSG(rc == 0, "accumulate part %d exited %d: %s", part, rc, err);
    }
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.Hq = H, p.Hkv = H, p.Sq = SQ, p.Sk = SK, p.D = D, p.Dv = D;
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    ref_forward(&p, qd, kd, vd, o_ref, lse_ref);
    npy_array o, l;
    CHECK(npy_read_f32(path("ao2.npy"), &o, err, sizeof err) == NPY_OK);
    CHECK(npy_read_f32(path("al2.npy"), &l, err, sizeof err) == NPY_OK);
    double worst = 0;
    for (size_t i = 0; o.f32 && i < o.count; i++)
        worst = fmax(worst, fabs(o.f32[i] - o_ref[i]) / (1e-4 + 1e-4 * fabs(o_ref[i])));
    for (size_t i = 0; l.f32 && i < l.count; i++)
        worst = fmax(worst, fabs(l.f32[i] - lse_ref[i]) / (1e-4 + 1e-5 * fabs(lse_ref[i])));
    CHECK_MSG(worst <= 1.0, "accumulated result off by %.3g x tolerance", worst);
    npy_free(&o);
    npy_free(&l);

    /* bias (1, 1, Sq, Sk), no mask, all keys in one run */
    write_text(path("bias.aj"), "attention forward efficient {\n  dtype = f16\n  head_dim = 16\n"
                                "  bias = add\n}\n");
    int64_t ks[4] = {B, H, SK, D};
    CHECK(npy_write_f32(path("ak.npy"), k, 4, ks, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("av.npy"), v, 4, ks, err, sizeof err) == NPY_OK);
    CHECK(npy_write_f32(path("ab.npy"), bias, 4, bs, err, sizeof err) == NPY_OK);
    snprintf(args, sizeof args, "run '%s' --device sim --in q='%s' --in k='%s' --in v='%s' "
             "--in bias='%s' --out lse='%s'", path("bias.aj"), path("aq.npy"), path("ak.npy"),
             path("av.npy"), path("ab.npy"), path("blse.npy"));
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 0, "bias run exited %d: %s", rc, err);
    memset(&p, 0, sizeof p);
    p.B = B, p.Hq = H, p.Hkv = H, p.Sq = SQ, p.Sk = SK, p.D = D, p.Dv = D;
    p.bias = bd;
    p.bias_shape[0] = 1, p.bias_shape[1] = 1, p.bias_shape[2] = SQ, p.bias_shape[3] = SK;
    ref_forward(&p, qd, kd, vd, o_ref, lse_ref);
    CHECK(npy_read_f32(path("blse.npy"), &l, err, sizeof err) == NPY_OK);
    worst = 0;
    for (size_t i = 0; l.f32 && i < l.count; i++)
        worst = fmax(worst, fabs(l.f32[i] - lse_ref[i]) / (1e-4 + 1e-5 * fabs(lse_ref[i])));
    CHECK_MSG(worst <= 1.0, "biased LSE off by %.3g x tolerance", worst);
    npy_free(&l);
}

static void test_run_errors(void)
{
    static const struct {
        const char *args;
        int code;
        const char *needle;
    } cases[] = {
        {"run OP --device sim --in q=Q --in v=V --out o=O", 1, "run needs --in k=FILE"},
        {"run OP --device gpu --in q=Q --in k=K --in v=V --out o=O", 1,
         "--device takes sim, cpu or cuda"},
        {"run OP --in q=Q --in k=K --in v=V --out o=O", 1, "run needs --device"},
        {"run OP --device sim --in q=Q --in k=K --in v=V", 1, "at least one --out"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in q=Q --out o=O", 1,
         "q given twice"},
        {"run OP --device sim --in x=Q --in k=K --in v=V --out o=O", 1, "unknown tensor 'x'"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out q=O", 1, "is an input"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o=O --q-offset ten", 1,
         "--q-offset takes an integer"},
        {"run OP --device sim --in q=Q --in k=K32 --in v=V --out o=O", 2, "k.shape[3] = 32"},
        {"run OP --device sim --in q=Q --in k=TRUNC --in v=V --out o=O", 2, "truncated"},
        {"run OP --device sim --in q=Q --in k=MISSING --in v=V --out o=O", 2, "k:"},
        {"run OP --device sim --in q=Q3 --in k=K --in v=V --out o=O", 2, "has 3 dimensions"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o=/nonexistent/dir/o.npy", 2,
         "cannot open for writing"},
        {"run BWD --device sim --in q=Q --in k=K --in v=V --out o=O", 2, "AJ_ERR_UNSUPPORTED"},
        /* run is a forward: a backward kernel is refused at launch */
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --out o=O", 2,
         "computes a backward op"},
        {"run ALIBI --device sim --in q=Q --in k=K --in v=V --out o=O", 1,
         "give --in alibi_slopes"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in alibi_slopes=S --out o=O", 1,
         "has no alibi"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in bias=Q --out o=O", 1,
         "the op has no bias"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in o_acc=Q --out o=O", 1,
         "does not accumulate"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o_acc=O", 1,
         "only ops with accumulate = true write one"},
        {"run ACC --device sim --in q=Q --in k=K --in v=V --out o=O", 1,
         "give the prior result"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o=O --seed -3", 1,
         "--seed takes a non-negative integer"},
    };
    /* the files the cases name */
    char err[2048];
    write_text(path("bwd.aj"), "attention backward flash {\n dtype = f32\n head_dim = 16\n}\n");
    write_text(path("bwde.aj"), "attention backward efficient {\n dtype = f16\n head_dim = 16\n}\n");
    write_text(path("alibi.aj"), "attention forward efficient {\n dtype = f16\n head_dim = 16\n"
                                 " score_mod = alibi\n}\n");
    write_text(path("op16.aj"), "attention forward efficient {\n dtype = f16\n head_dim = 16\n}\n");
    write_text(path("acc16.aj"), "attention forward efficient {\n dtype = f16\n head_dim = 16\n"
                                 " accumulate = true\n}\n");
    static float zeros[2 * 2 * 8 * 32];
    int64_t s16[4] = {1, 2, 8, 16}, s32[4] = {1, 2, 8, 32}, s3[3] = {2, 8, 16}, sh[1] = {2};
    npy_write_f32(path("q16.npy"), zeros, 4, s16, err, sizeof err);
    npy_write_f32(path("k32.npy"), zeros, 4, s32, err, sizeof err);
    npy_write_f32(path("q3.npy"), zeros, 3, s3, err, sizeof err);
    npy_write_f32(path("s.npy"), zeros, 1, sh, err, sizeof err);
    FILE *f = fopen(path("trunc.npy"), "w");
    fputs("\x93NUMPY\x01", f);
    fclose(f);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* expand the short names */
        char args[2048] = "", word[512];
        const char *s = cases[i].args;
        while (*s) {
            size_t n = strcspn(s, " =");
            snprintf(word, sizeof word, "%.*s", (int)n, s);
            const char *sub = word;
            if (strcmp(word, "OP") == 0) sub = path("op16.aj");
            else if (strcmp(word, "BWD") == 0) sub = path("bwd.aj");
            else if (strcmp(word, "BWDE") == 0) sub = path("bwde.aj");
            else if (strcmp(word, "ALIBI") == 0) sub = path("alibi.aj");
            else if (strcmp(word, "ACC") == 0) sub = path("acc16.aj");
            else if (strcmp(word, "Q") == 0 || strcmp(word, "K") == 0 || strcmp(word, "V") == 0)
                sub = path("q16.npy");
            else if (strcmp(word, "K32") == 0) sub = path("k32.npy");
            else if (strcmp(word, "Q3") == 0) sub = path("q3.npy");
            else if (strcmp(word, "S") == 0) sub = path("s.npy");
            else if (strcmp(word, "TRUNC") == 0) sub = path("trunc.npy");
            else if (strcmp(word, "MISSING") == 0) sub = path("missing.npy");
            else if (strcmp(word, "O") == 0) sub = path("out.npy");
            strncat(args, sub, sizeof args - strlen(args) - 1);
            s += n;
            if (*s) {
                char sep[2] = {*s++, 0};
                strncat(args, sep, sizeof args - strlen(args) - 1);
            }
        }
        int rc = run_cli(args, err, sizeof err);
        CHECK_MSG(rc == cases[i].code, "case %zu '%s': exit %d, want %d: %s", i, cases[i].args,
                  rc, cases[i].code, err);
        CHECK_MSG(strstr(err, cases[i].needle) != NULL, "case %zu '%s': stderr lacks '%s': %s",
                  i, cases[i].args, cases[i].needle, err);
    }
    /* cuda: "no GPU found" where the driver is absent, a clear refusal where present */
    snprintf(err, sizeof err, "run '%s' --device cuda --in q='%s' --in k='%s' --in v='%s' "
             "--out o='%s'", path("op16.aj"), path("q16.npy"), path("q16.npy"), path("q16.npy"),
             path("out.npy"));
    char args[2048];
    snprintf(args, sizeof args, "%s", err);
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 2, "cuda: exit %d: %s", rc, err);
    CHECK_MSG(strstr(err, "no GPU found") || strstr(err, "use the sim device"), "cuda: %s", err);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_cli_run ATTNJIT\n");
        return 2;
    }
    aj = argv[1];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_run_matches_reference("sim");
    test_run_matches_reference("cpu");
    test_accumulate_and_bias();
    test_run_errors();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_report();
}
