/*
 * test_cli_run.c -- `attnjit run` end to end: .npy tensors in, the kernel on
 * the sim device and on the cpu device, .npy results out, compared with the float64 reference
 * (forward, accumulate, bias, backward of both variants, merge, paged with
 * padded and packed queries, varlen forward and backward); then the
 * command's errors, each with its exit code and message.
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
#include "temp_dir.h"
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

/* x rounded to f16, as f32 (what a .npy holds) and as double (what the
 * reference reads). */
static void round_to_f16(double x, float *f, double *d)
{
    uint16_t h;
    float x32 = (float)x;
    aj_convert(&x32, AJ_DTYPE_F32, &h, AJ_DTYPE_F16, 1);
    aj_convert(&h, AJ_DTYPE_F16, f, AJ_DTYPE_F32, 1);
    *d = *f;
}

/* Random f32 values exactly representable in f16, in both forms. */
static void random_f16_values(float *f, double *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        round_to_f16(uniform(), &f[i], &d[i]);
}

/* DIR/PREFIXNAME.npy: the file of tensor NAME in the test that uses PREFIX */
static char *tensor_path(const char *prefix, const char *name)
{
    char file[128];
    snprintf(file, sizeof file, "%s%s.npy", prefix, name);
    return path(file);
}

static void write_tensor(const char *prefix, const char *name, const float *f, int rank,
                         const int64_t *shape)
{
    char err[512];
    CHECK_MSG(npy_write_f32(tensor_path(prefix, name), f, rank, shape, err, sizeof err) == NPY_OK,
              "%s: %s", name, err);
}

static void write_i32(const char *prefix, const char *name, const int32_t *data, int rank,
                      const int64_t *shape)
{
    char err[512];
    CHECK_MSG(npy_write_i32(tensor_path(prefix, name), data, rank, shape, err, sizeof err) ==
              NPY_OK, "%s: %s", name, err);
}

/* "run SPEC --device DEVICE --in q=F ... --out dq=F ... EXTRA" with each
 * name of the space-separated lists bound to its tensor_path(). */
static void run_command(char *args, size_t cap, const char *spec, const char *device,
                        const char *prefix, const char *ins, const char *outs,
                        const char *extra)
{
    snprintf(args, cap, "run '%s' --device %s %s", path(spec), device, extra);
    const char *lists[2] = {ins, outs};
    for (int l = 0; l < 2; l++)
        for (const char *s = lists[l]; *s;) {
            size_t n = strcspn(s, " ");
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)n, s);
            size_t len = strlen(args);
            snprintf(args + len, cap - len, " --%s %s='%s'", l ? "out" : "in", name,
                     tensor_path(prefix, name));
            s += n + (s[n] == ' ');
        }
}

/* A result file against the reference, norm-wise: max |got - ref| /
 * (atol + rtol max |ref|) over the finite references (<= 1 passes); an
 * infinite reference must come back exactly; a wrong shape or a NaN gives
 * infinity. */
static double result_error(const char *prefix, const char *name, const double *ref, int rank,
                           const int64_t *shape, double atol, double rtol)
{
    npy_array a;
    char err[512];
    if (npy_read_f32(tensor_path(prefix, name), &a, err, sizeof err) != NPY_OK) {
        CHECK_MSG(0, "%s: %s", name, err);
        return INFINITY;
    }
    int same = a.rank == rank;
    for (int i = 0; same && i < rank; i++)
        same = a.shape[i] == shape[i];
    double most = 0, worst = 0;
    for (size_t i = 0; same && i < a.count; i++)
        most = isinf(ref[i]) ? most : fmax(most, fabs(ref[i]));
    for (size_t i = 0; same && i < a.count; i++) {
        double e = isinf(ref[i]) ? (a.f32[i] == ref[i] ? 0 : INFINITY) : fabs(a.f32[i] - ref[i]);
        worst = e == e ? fmax(worst, e) : INFINITY;
    }
    npy_free(&a);
    return same ? worst / (atol + rtol * most) : INFINITY;
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

    ref_problem p = ref_problem_of(B, HQ, HKV, SQ, SK, D, D);
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
    ref_problem p = ref_problem_of(B, H, H, SQ, SK, D, D);
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
    p = ref_problem_of(B, H, H, SQ, SK, D, D);
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

/* f16 results against the float64 reference: test_sim_backward's pair */
static const double f16_atol = 1e-3, f16_rtol = 4e-3;

/* A backward through the CLI with GQA (4 query heads on 2 kv heads): the
 * reference forward's O (rounded to f16) and LSE (f32) with a random dO in,
 * dQ, dK, dV out, each against ref_backward.  The efficient variant adds a
 * bias broadcast over the batch and checks dBias (the sum over it); the
 * flash variant runs with the workspace run allocates. */
static void test_backward_matches_reference(const char *device, const char *variant)
{
    enum { B = 2, HQ = 4, HKV = 2, SQ = 24, SK = 40, D = 16 };
    enum { NQ = B * HQ * SQ * D, NK = B * HKV * SK * D, NB = HQ * SQ * SK };
    int with_bias = strcmp(variant, "efficient") == 0;
    const char *mask = with_bias ? "causal(bottom_right)" : "causal(top_left)";
    char spec[256];
    snprintf(spec, sizeof spec, "attention backward %s {\n  dtype = f16\n  head_dim = 16\n"
             "  mask = %s\n  bias = %s\n}\n", variant, mask, with_bias ? "add" : "none");
    write_text(path("bwd_case.aj"), spec);
    static float q[NQ], k[NK], v[NK], dout[NQ], o[NQ], lse[B * HQ * SQ], bias[NB];
    static double qd[NQ], kd[NK], vd[NK], dd[NQ], od[NQ], lsed[B * HQ * SQ], bd[NB];
    static double dq[NQ], dk[NK], dv[NK], dbias[NB];
    random_f16_values(q, qd, NQ);
    random_f16_values(k, kd, NK);
    random_f16_values(v, vd, NK);
    random_f16_values(dout, dd, NQ);
    random_f16_values(bias, bd, NB);
    ref_problem p = ref_problem_of(B, HQ, HKV, SQ, SK, D, D);
    p.mask = AJ_MASK_CAUSAL;
    p.align = with_bias ? AJ_ALIGN_BOTTOM_RIGHT : AJ_ALIGN_TOP_LEFT;
    p.q_offset = 5;
    p.kv_offset = 3;
    if (with_bias) {
        p.bias = bd;
        p.bias_shape[0] = 1, p.bias_shape[1] = HQ, p.bias_shape[2] = SQ, p.bias_shape[3] = SK;
    }
    ref_forward(&p, qd, kd, vd, od, lsed);
    for (size_t i = 0; i < NQ; i++)   /* O as the f16 forward gives it */
        round_to_f16(od[i], &o[i], &od[i]);
    for (size_t i = 0; i < B * HQ * SQ; i++) {
        lse[i] = (float)lsed[i];
        lsed[i] = lse[i];
    }
    ref_backward(&p, qd, kd, vd, od, lsed, dd, dq, dk, dv, with_bias ? dbias : NULL);

    int64_t qs[4] = {B, HQ, SQ, D}, ks[4] = {B, HKV, SK, D}, ls[3] = {B, HQ, SQ},
            bs[4] = {1, HQ, SQ, SK};
    write_tensor("b_", "q", q, 4, qs);
    write_tensor("b_", "k", k, 4, ks);
    write_tensor("b_", "v", v, 4, ks);
    write_tensor("b_", "o", o, 4, qs);
    write_tensor("b_", "lse", lse, 3, ls);
    write_tensor("b_", "do", dout, 4, qs);
    write_tensor("b_", "bias", bias, 4, bs);
    char args[4096], err[2048];
    run_command(args, sizeof args, "bwd_case.aj", device, "b_",
                with_bias ? "q k v o lse do bias" : "q k v o lse do",
                with_bias ? "dq dk dv dbias" : "dq dk dv", "--q-offset 5 --kv-offset 3");
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 0, "backward %s on %s exited %d: %s", variant, device, rc, err);
    CHECK_MSG(strstr(err, "compile ") && strstr(err, " ms, run "), "no summary: %s", err);
    double e_dq = result_error("b_", "dq", dq, 4, qs, f16_atol, f16_rtol);
    double e_dk = result_error("b_", "dk", dk, 4, ks, f16_atol, f16_rtol);
    double e_dv = result_error("b_", "dv", dv, 4, ks, f16_atol, f16_rtol);
    double e_db = with_bias ? result_error("b_", "dbias", dbias, 4, bs, f16_atol, f16_rtol) : 0;
    CHECK_MSG(e_dq <= 1 && e_dk <= 1 && e_dv <= 1 && e_db <= 1,
              "backward %s on %s: dq %.3g dk %.3g dv %.3g dbias %.3g x tolerance", variant,
              device, e_dq, e_dk, e_dv, e_db);
    printf("attnjit run backward %s on %s: dq %.3f dk %.3f dv %.3f dbias %.3f of tolerance\n",
           variant, device, e_dq, e_dk, e_dv, e_db);
}

/* A merge through the CLI against ref_merge, with rows where one side or
 * both are empty (lse = -inf, o holding garbage). */
static void test_merge_matches_reference(const char *device)
{
    enum { B = 2, H = 3, S = 20, DV = 16, ROWS = B * H * S, N = ROWS * DV };
    write_text(path("merge.aj"), "attention merge {\n  dtype = f16\n  head_dim_v = 16\n}\n");
    static float o1[N], o2[N], lse1[ROWS], lse2[ROWS];
    static double o1d[N], o2d[N], lse1d[ROWS], lse2d[ROWS], o[N], lse[ROWS];
    random_f16_values(o1, o1d, N);
    random_f16_values(o2, o2d, N);
    for (int r = 0; r < ROWS; r++) {
        lse1[r] = r % 7 == 0 || r % 5 == 0 ? -INFINITY : (float)(4 * uniform());
        lse2[r] = r % 7 == 0 || r % 3 == 0 ? -INFINITY : (float)(4 * uniform());
        lse1d[r] = lse1[r];
        lse2d[r] = lse2[r];
    }
    ref_merge(ROWS, DV, o1d, lse1d, o2d, lse2d, o, lse);
    int64_t os[4] = {B, H, S, DV}, ls[3] = {B, H, S};
    write_tensor("m_", "o1", o1, 4, os);
    write_tensor("m_", "o2", o2, 4, os);
    write_tensor("m_", "lse1", lse1, 3, ls);
    write_tensor("m_", "lse2", lse2, 3, ls);
    char args[4096], err[2048];
    run_command(args, sizeof args, "merge.aj", device, "m_", "o1 lse1 o2 lse2", "o lse", "");
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 0, "merge on %s exited %d: %s", device, rc, err);
    CHECK_MSG(strstr(err, "compile ") && strstr(err, " ms, run "), "no summary: %s", err);
    double e_o = result_error("m_", "o", o, 4, os, f16_atol, f16_rtol);
    double e_lse = result_error("m_", "lse", lse, 3, ls, 1e-5, 1e-5);
    CHECK_MSG(e_o <= 1 && e_lse <= 1, "merge on %s: o %.3g lse %.3g x tolerance", device, e_o,
              e_lse);
    printf("attnjit run merge on %s: o %.3f lse %.3f of tolerance\n", device, e_o, e_lse);
}

static void test_run_errors(void)
{
    static const struct {
        const char *args;
        int code;
        const char *needle;
    } cases[] = {
        {"run OP --device sim --in q=Q --in v=V --out o=O", 1,
         "attnjit: a forward op needs --in k=FILE (B, Hkv, Sk, D)\n"},
        {"run OP --device gpu --in q=Q --in k=K --in v=V --out o=O", 1,
         "--device takes sim, cpu or cuda"},
        {"run OP --in q=Q --in k=K --in v=V --out o=O", 1, "run needs --device"},
        {"run OP --device sim --in q=Q --in k=K --in v=V", 1,
         "attnjit: run needs at least one --out: a forward op gives o, lse\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in q=Q --out o=O", 1,
         "q given twice"},
        {"run OP --device sim --in x=Q --in k=K --in v=V --out o=O", 1,
         "attnjit: unknown tensor 'x': not one of run's (q, k, v, alibi_slopes, bias, o, lse, "
         "o_acc, do, dq, dk, dv, dbias, o1, lse1, o2, lse2, k_cache, v_cache, block_table, "
         "seqlens_k, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k) nor a side tensor "
         "the op declares\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out x=O", 1,
         "attnjit: unknown tensor 'x' (run's outputs: o, lse, o_acc, dq, dk, dv, dbias)\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out q=O", 1,
         "attnjit: 'q' is an input of forward ops, not an output\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o=O --q-offset ten", 1,
         "--q-offset takes an integer"},
        {"run OP --device sim --in q=Q --in k=K32 --in v=V --out o=O", 2, "k.shape[3] = 32"},
        {"run OP --device sim --in q=Q --in k=TRUNC --in v=V --out o=O", 2, "truncated"},
        {"run OP --device sim --in q=Q --in k=MISSING --in v=V --out o=O", 2, "k:"},
        {"run OP --device sim --in q=Q3 --in k=K --in v=V --out o=O", 2,
         "has 3 dimensions, want 4 (B, Hq, Sq, D)\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o=/nonexistent/dir/o.npy", 2,
         "cannot open for writing"},
        {"run BWD --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --in do=Q "
         "--out dq=O", 2, "AJ_ERR_UNSUPPORTED"},
        {"run ALIBI --device sim --in q=Q --in k=K --in v=V --out o=O", 1,
         "attnjit: a forward op with alibi needs --in alibi_slopes=FILE (Hq)\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in alibi_slopes=S --out o=O", 1,
         "attnjit: --in alibi_slopes given, but the op has no alibi\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in bias=Q --out o=O", 1,
         "attnjit: --in bias given, but the op has no bias\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in o_acc=Q --out o=O", 1,
         "attnjit: 'o_acc' is an input of accumulating forward ops; this spec is a forward "
         "op\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o_acc=O", 1,
         "attnjit: 'o_acc' is an output of accumulating forward ops; this spec is a forward "
         "op\n"},
        {"run ACC --device sim --in q=Q --in k=K --in v=V --out o=O", 1,
         "attnjit: 'o' is an output of forward and merge ops; this spec is an accumulating "
         "forward op (accumulate = true)\n"},
        {"run ACC --device sim --in q=Q --in k=K --in v=V --out o_acc=O", 1,
         "attnjit: an accumulating forward op (accumulate = true) needs --in lse=FILE "
         "(B, Hq, Sq)\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --out o=O --seed -3", 1,
         "--seed takes a non-negative integer"},
        /* the tensors of the other kinds, given to a forward */
        {"run OP --device sim --in q=Q --in k=K --in v=V --out dq=O", 1,
         "attnjit: 'dq' is an output of backward ops; this spec is a forward op\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in o=Q --out o=O", 1,
         "attnjit: 'o' is an output of forward ops, not an input (it is an input of backward "
         "ops)\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in lse=L --out o=O", 1,
         "attnjit: 'lse' is an output of forward ops, not an input (it is an input of "
         "accumulating forward and backward ops)\n"},
        {"run OP --device sim --in q=Q --in k=K --in v=V --in o2=Q --out o=O", 1,
         "attnjit: 'o2' is an input of merge ops; this spec is a forward op\n"},
        /* backward */
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --out dq=O", 1,
         "attnjit: a backward op needs --in do=FILE (B, Hq, Sq, Dv)\n"},
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --in do=Q", 1,
         "attnjit: run needs at least one --out: a backward op gives dq, dk, dv\n"},
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --in do=Q "
         "--out o=O", 1,
         "attnjit: 'o' is an input of backward ops, not an output (it is an output of forward "
         "and merge ops)\n"},
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --in do=Q "
         "--in o1=Q --out dq=O", 1,
         "attnjit: 'o1' is an input of merge ops; this spec is a backward op\n"},
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --in do=Q "
         "--out dbias=O", 1, "attnjit: --out dbias given, but the op has no bias\n"},
        {"run BWDE --device sim --in q=Q --in k=K --in v=V --in o=Q --in lse=L --in do=D9 "
         "--out dq=O", 2,
         "attnjit: aj_backward: do.shape[2] = 9, want 8 (q's length) [AJ_ERR_INVALID_ARG]\n"},
        /* merge */
        {"run MERGE --device sim --in q=Q --in o1=Q --in lse1=L --in o2=Q --in lse2=L "
         "--out o=O", 1,
         "attnjit: 'q' is an input of forward and backward ops; this spec is a merge op\n"},
        {"run MERGE --device sim --in o1=Q --in lse1=L --in o2=Q --out o=O", 1,
         "attnjit: a merge op needs --in lse2=FILE (B, H, S)\n"},
        {"run MERGE --device sim --in o1=Q --in lse1=L --in o2=Q --in lse2=L --out dq=O", 1,
         "attnjit: 'dq' is an output of backward ops; this spec is a merge op\n"},
        {"run MERGE --device sim --in o1=Q --in lse1=L --in o2=Q --in lse2=L", 1,
         "attnjit: run needs at least one --out: a merge op gives o, lse\n"},
        {"run MERGE --device sim --in o1=Q --in lse1=Q --in o2=Q --in lse2=L --out o=O", 2,
         "has 4 dimensions, want 3 (B, H, S)\n"},
        {"run MERGE --device sim --in o1=Q --in lse1=L --in o2=D9 --in lse2=L --out o=O", 2,
         "attnjit: aj_merge: o2.shape[2] = 9, want 8 (o1's length) [AJ_ERR_INVALID_ARG]\n"},
    };
    /* the files the cases name */
    char err[2048];
    write_text(path("bwd.aj"), "attention backward flash {\n dtype = f32\n head_dim = 16\n}\n");
    write_text(path("bwde.aj"), "attention backward efficient {\n dtype = f16\n head_dim = 16\n}\n");
    write_text(path("alibi.aj"), "attention forward efficient {\n dtype = f16\n head_dim = 16\n"
                                 " score_mod = alibi\n}\n");
    write_text(path("op16.aj"), "attention forward efficient {\n dtype = f16\n head_dim = 16\n}\n");
    write_text(path("merge16.aj"), "attention merge {\n dtype = f16\n head_dim_v = 16\n}\n");
    write_text(path("acc16.aj"), "attention forward efficient {\n dtype = f16\n head_dim = 16\n"
                                 " accumulate = true\n}\n");
    static float zeros[2 * 2 * 8 * 32];
    int64_t s16[4] = {1, 2, 8, 16}, s32[4] = {1, 2, 8, 32}, s3[3] = {2, 8, 16}, sh[1] = {2},
            s9[4] = {1, 2, 9, 16}, sl[3] = {1, 2, 8};
    npy_write_f32(path("q16.npy"), zeros, 4, s16, err, sizeof err);
    npy_write_f32(path("k32.npy"), zeros, 4, s32, err, sizeof err);
    npy_write_f32(path("q3.npy"), zeros, 3, s3, err, sizeof err);
    npy_write_f32(path("s.npy"), zeros, 1, sh, err, sizeof err);
    npy_write_f32(path("d9.npy"), zeros, 4, s9, err, sizeof err);
    npy_write_f32(path("l3.npy"), zeros, 3, sl, err, sizeof err);
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
            else if (strcmp(word, "MERGE") == 0) sub = path("merge16.aj");
            else if (strcmp(word, "Q") == 0 || strcmp(word, "K") == 0 || strcmp(word, "V") == 0)
                sub = path("q16.npy");
            else if (strcmp(word, "K32") == 0) sub = path("k32.npy");
            else if (strcmp(word, "Q3") == 0) sub = path("q3.npy");
            else if (strcmp(word, "S") == 0) sub = path("s.npy");
            else if (strcmp(word, "D9") == 0) sub = path("d9.npy");
            else if (strcmp(word, "L") == 0) sub = path("l3.npy");
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

/* Runs spec_file on cpu and sim with inputs `ins` of `prefix` (and
 * `extra` arguments) and checks its packed o [T, Hq, D] (shape qs) and
 * lse [Hq, T] (ls) against the reference's. */
static void check_packed_forward(const char *what, const char *spec_file, const char *prefix,
                                 const char *ins, const char *extra, const double *o,
                                 const double *lse, const int64_t qs[3], const int64_t ls[2])
{
    static const char *const devices[2] = {"cpu", "sim"};
    char err[4096], args[4096];
    for (int d = 0; d < 2; d++) {
        run_command(args, sizeof args, spec_file, devices[d], prefix, ins, "o lse", extra);
        int rc = run_cli(args, err, sizeof err);
        CHECK_MSG(rc == 0, "%s on %s exited %d: %s", what, devices[d], rc, err);
        double e_o = result_error(prefix, "o", o, 3, qs, f16_atol, f16_rtol);
        double e_lse = result_error(prefix, "lse", lse, 2, ls, 1e-4, 1e-5);
        CHECK_MSG(e_o <= 1 && e_lse <= 1, "%s on %s: o %.3g lse %.3g x tolerance", what,
                  devices[d], e_o, e_lse);
        printf("attnjit run %s on %s: o %.3f lse %.3f of tolerance\n", what, devices[d], e_o,
               e_lse);
    }
}

/* layout = varlen through the CLI on cpu and sim: three packed documents
 * (one of a single query and key), causal bottom_right, GQA 2:1, against
 * the reference, and its backward on cpu; then a missing offsets file, a padded q, offsets that do
 * not end at T and offsets of another batch. */
static void test_varlen(void)
{
    enum { B = 3, HQ = 4, HKV = 2, D = 16, T = 13, TK = 20 };
    const int32_t cu_q[B + 1] = {0, 5, 6, T}, cu_k[B + 1] = {0, 7, 8, TK},
                  short_q[B + 1] = {0, 5, 6, T - 1}, two_k[3] = {0, 7, TK};
    const int64_t qs[3] = {T, HQ, D}, ks[3] = {TK, HKV, D}, ls[2] = {HQ, T}, cs[1] = {B + 1},
                  q4[4] = {1, HQ, T, D}, c3[1] = {3};
    static float qf[T * HQ * D], kf[TK * HKV * D], vf[TK * HKV * D];
    static double q[T * HQ * D], k[TK * HKV * D], v[TK * HKV * D], o[T * HQ * D], lse[HQ * T];
    random_f16_values(qf, q, T * HQ * D);
    random_f16_values(kf, k, TK * HKV * D);
    random_f16_values(vf, v, TK * HKV * D);
    write_tensor("v_", "q", qf, 3, qs);
    write_tensor("v_", "k", kf, 3, ks);
    write_tensor("v_", "v", vf, 3, ks);
    write_tensor("v_", "q4", qf, 4, q4);
    char err[4096], args[4096];
    write_i32("v_", "cu_seqlens_q", cu_q, 1, cs);
    write_i32("v_", "cu_seqlens_k", cu_k, 1, cs);
    write_i32("v_", "short", short_q, 1, cs);
    write_i32("v_", "two", two_k, 1, c3);
    write_text(path("varlen.aj"), "attention forward flash {\n dtype = f16\n head_dim = 16\n"
                                  " mask = causal(bottom_right)\n layout = varlen\n}\n");
    ref_problem p = {.B = B, .Hq = HQ, .Hkv = HKV, .D = D, .Dv = D, .cu_q = cu_q, .cu_k = cu_k,
                     .mask = AJ_MASK_CAUSAL, .align = AJ_ALIGN_BOTTOM_RIGHT};
    ref_forward(&p, q, k, v, o, lse);
    check_packed_forward("varlen", "varlen.aj", "v_", "q k v cu_seqlens_q cu_seqlens_k", "", o,
                         lse, qs, ls);
    /* the backward on cpu, from the forward's o (f16) and lse (f32) */
    static float of[T * HQ * D], lf[HQ * T], dof[T * HQ * D];
    static double dout[T * HQ * D], dq[T * HQ * D], dk[TK * HKV * D], dv[TK * HKV * D];
    for (size_t i = 0; i < T * HQ * D; i++)
        round_to_f16(o[i], &of[i], &o[i]);
    for (size_t i = 0; i < HQ * T; i++)
        lse[i] = lf[i] = (float)lse[i];
    random_f16_values(dof, dout, T * HQ * D);
    write_tensor("v_", "o", of, 3, qs);
    write_tensor("v_", "lse", lf, 2, ls);
    write_tensor("v_", "do", dof, 3, qs);
    ref_backward(&p, q, k, v, o, lse, dout, dq, dk, dv, NULL);
    write_text(path("varlen_bwd.aj"), "attention backward flash {\n dtype = f16\n head_dim = 16\n"
                                      " mask = causal(bottom_right)\n layout = varlen\n}\n");
    run_command(args, sizeof args, "varlen_bwd.aj", "cpu", "v_", "q k v o lse do cu_seqlens_q "
                "cu_seqlens_k", "dq dk dv", "");
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 0, "varlen backward exited %d: %s", rc, err);
    double e_dq = result_error("v_", "dq", dq, 3, qs, f16_atol, f16_rtol);
    double e_dk = result_error("v_", "dk", dk, 3, ks, f16_atol, f16_rtol);
    double e_dv = result_error("v_", "dv", dv, 3, ks, f16_atol, f16_rtol);
    CHECK_MSG(e_dq <= 1 && e_dk <= 1 && e_dv <= 1,
              "varlen backward: dq %.3g dk %.3g dv %.3g x tolerance", e_dq, e_dk, e_dv);
    printf("attnjit run varlen backward on cpu: dq %.3f dk %.3f dv %.3f of tolerance\n", e_dq,
           e_dk, e_dv);
    static const struct {
        const char *ins, *extra;
        int code;
        const char *needle;
    } bad[] = {
        {"q k v cu_seqlens_k", "", 1,
         "attnjit: a forward op with varlen layout needs --in cu_seqlens_q=FILE (B + 1)\n"},
        {"k v cu_seqlens_q cu_seqlens_k", "--in q=V_q4.npy", 2,
         "has 4 dimensions, want 3 (T, Hq, D)\n"},
        {"q k v cu_seqlens_k", "--in cu_seqlens_q=V_short.npy", 2,
         "cu_seqlens_q[3] is not Tq (q's tokens)"},
        {"q k v cu_seqlens_q", "--in cu_seqlens_k=V_two.npy", 2,
         "attnjit: cu_seqlens_k has 3 entries, but cu_seqlens_q's 4 entries make batch 3 "
         "(B + 1)\n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[512];
        snprintf(extra, sizeof extra, "%s", bad[i].extra);
        char *at = strstr(extra, "V_");
        if (at) {   /* V_name.npy: this test's file */
            char file[64];
            snprintf(file, sizeof file, "v_%s", at + 2);
            snprintf(at, sizeof extra - (size_t)(at - extra), "'%s'", path(file));
        }
        run_command(args, sizeof args, "varlen.aj", "cpu", "v_", bad[i].ins, "o", extra);
        rc = run_cli(args, err, sizeof err);
        CHECK_MSG(rc == bad[i].code && strstr(err, bad[i].needle),
                  "varlen case %zu: exit %d (want %d): %s", i, rc, bad[i].code, err);
    }
}

/* An array of bytes as numpy's np.save writes a uint8 one (format 1.0). */
static void write_u8(const char *p, const uint8_t *data, int rank, const int64_t *shape)
{
    char dict[128], dims[96] = "";
    for (int i = 0; i < rank; i++) {
        size_t n = strlen(dims);
        snprintf(dims + n, sizeof dims - n, "%lld,%s", (long long)shape[i],
                 rank > 1 && i < rank - 1 ? " " : "");
    }
    if (rank > 1)
        dims[strlen(dims) - 1] = '\0';
    int len = snprintf(dict, sizeof dict, "{'descr': '|u1', 'fortran_order': False, "
                       "'shape': (%s), }", dims);
    int total = (10 + len + 1 + 63) / 64 * 64;
    FILE *f = fopen(p, "wb");
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                              (unsigned char)((total - 10) & 0xff),
                              (unsigned char)((total - 10) >> 8)};
    fwrite(head, 1, 10, f);
    fputs(dict, f);
    for (int i = 10 + len; i < total - 1; i++)
        fputc(' ', f);
    fputc('\n', f);
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)shape[i];
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Chunked prefill through the CLI on cpu and sim: the paged op of test_paged (its
 * f16 caches in pg, its problem in p) with q_layout = varlen, packed
 * queries of 3, 0 and 1 tokens (the last of each sequence), against the
 * reference. */
static void check_chunked_prefill(const ref_paged *pg, const ref_problem *padded)
{
    enum { B = 3, HQ = 4, D = 16, T = 4 };
    const int32_t cu_q[B + 1] = {0, 3, 3, T};
    const int64_t qs[3] = {T, HQ, D}, ls[2] = {HQ, T}, cs[1] = {B + 1};
    float qf[T * HQ * D];
    double q[T * HQ * D], o[T * HQ * D], lse[HQ * T];
    random_f16_values(qf, q, T * HQ * D);
    write_tensor("c_", "q", qf, 3, qs);
    write_i32("c_", "cu_seqlens_q", cu_q, 1, cs);
    write_text(path("chunked.aj"), "attention forward flash {\n dtype = f16\n head_dim = 16\n"
                                   " mask = causal(bottom_right)\n layout = paged\n"
                                   " q_layout = varlen\n}\n");
    ref_problem p = *padded;
    p.cu_q = cu_q;
    ref_paged_forward(&p, pg, q, o, lse);
    /* the caches and tables are test_paged's (p_ files), the queries ours */
    char extra[1024] = "";
    static const char *const shared[] = {"k_cache", "v_cache", "block_table", "seqlens_k"};
    for (int i = 0; i < 4; i++) {
        size_t len = strlen(extra);
        snprintf(extra + len, sizeof extra - len, " --in %s='%s'", shared[i],
                 tensor_path("p_", shared[i]));
    }
    check_packed_forward("chunked prefill", "chunked.aj", "c_", "q cu_seqlens_q", extra, o, lse,
                         qs, ls);
}

/* layout = paged through the CLI on cpu and sim: f16 and f8e4m3 caches
 * (the codes as a uint8 .npy, with k_scale and v_scale), shuffled pages, a
 * causal decode of Sq = 2, GQA 2:1, a sequence of length 0, against the
 * reference. */
static void test_paged(void)
{
    enum { B = 3, HQ = 4, HKV = 2, SQ = 2, D = 16, PS = 4, MAXP = 5, NP = 12 };
    const int32_t lens[B] = {17, 0, 9};
    int32_t table[B * MAXP] = {0};
    int next = NP - 1;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < (lens[b] + PS - 1) / PS; n++)
            table[b * MAXP + n] = next--;   /* descending: never contiguous */
    const int64_t qs[4] = {B, HQ, SQ, D}, cs[4] = {NP, PS, HKV, D}, ts[2] = {B, MAXP},
                  ls[1] = {B}, one[1] = {1};
    size_t nq = B * HQ * SQ * D, nc = NP * PS * HKV * D;
    float *qf = malloc(nq * sizeof *qf), *cf[2] = {malloc(nc * 4), malloc(nc * 4)};
    double *q = malloc(nq * sizeof *q), *cache[2] = {malloc(nc * 8), malloc(nc * 8)};
    double *o = malloc(nq * sizeof *o), *lse = malloc(B * HQ * SQ * sizeof *lse);
    uint8_t *codes = malloc(nc);
    random_f16_values(qf, q, nq);
    write_tensor("p_", "q", qf, 4, qs);
    char err[4096], args[4096];
    write_i32("p_", "block_table", table, 2, ts);
    write_i32("p_", "seqlens_k", lens, 1, ls);
    for (int f8 = 0; f8 < 2; f8++) {
        const char *kv = f8 ? "f8e4m3" : "f16";
        const float scales[2] = {f8 ? 0.0625f : 1.0f, f8 ? 0.125f : 1.0f};
        char spec[256];
        snprintf(spec, sizeof spec, "attention forward flash {\n dtype = f16\n head_dim = %d\n"
                 " mask = causal(bottom_right)\n layout = paged\n kv_dtype = %s\n}\n", D, kv);
        write_text(path("paged.aj"), spec);
        for (int t = 0; t < 2; t++) {
            const char *name = t ? "v_cache" : "k_cache";
            if (!f8) {
                random_f16_values(cf[t], cache[t], nc);
                write_tensor("p_", name, cf[t], 4, cs);
                continue;
            }
            for (size_t i = 0; i < nc; i++) {
                float x = (float)(uniform() * 12.0);
                aj_convert(&x, AJ_DTYPE_F32, &codes[i], AJ_DTYPE_F8E4M3, 1);
                aj_convert(&codes[i], AJ_DTYPE_F8E4M3, &x, AJ_DTYPE_F32, 1);
                cache[t][i] = x;
            }
            write_u8(tensor_path("p_", name), codes, 4, cs);
            write_tensor("p_", t ? "v_scale" : "k_scale", &scales[t], 1, one);
        }
        ref_problem p = {.B = B, .Hq = HQ, .Hkv = HKV, .D = D, .Dv = D, .Sq = SQ,
                         .mask = AJ_MASK_CAUSAL, .align = AJ_ALIGN_BOTTOM_RIGHT};
        ref_paged pg = {NP, PS, MAXP, cache[0], cache[1], table, lens, scales[0], scales[1]};
        ref_paged_forward(&p, &pg, q, o, lse);
        static const char *const devices[2] = {"cpu", "sim"};
        for (int d = 0; d < 2; d++) {
            run_command(args, sizeof args, "paged.aj", devices[d], "p_",
                        f8 ? "q k_cache v_cache block_table seqlens_k k_scale v_scale"
                           : "q k_cache v_cache block_table seqlens_k", "o lse", "");
            int rc = run_cli(args, err, sizeof err);
            CHECK_MSG(rc == 0, "paged %s on %s exited %d: %s", kv, devices[d], rc, err);
            double e_o = result_error("p_", "o", o, 4, qs, f16_atol, f16_rtol);
            double e_lse = result_error("p_", "lse", lse, 3, qs, 1e-4, 1e-5);
            CHECK_MSG(e_o <= 1 && e_lse <= 1, "paged %s on %s: o %.3g lse %.3g x tolerance",
                      kv, devices[d], e_o, e_lse);
            printf("attnjit run paged (%s cache) on %s: o %.3f lse %.3f of tolerance\n", kv,
                   devices[d], e_o, e_lse);
        }
        if (!f8)
            check_chunked_prefill(&pg, &p);
    }
    /* a padded tensor given to a paged op, and a missing scale */
    run_command(args, sizeof args, "paged.aj", "cpu", "p_",
                "q k_cache v_cache block_table seqlens_k k_scale", "o", "");
    CHECK(run_cli(args, err, sizeof err) == 1);
    CHECK_MSG(strstr(err, "attnjit: a forward op with f8 kv_dtype needs --in v_scale=FILE "
                          "(1 or Hkv)"),
              "%s", err);
    run_command(args, sizeof args, "paged.aj", "cpu", "p_",
                "q k_cache v_cache block_table seqlens_k k_scale v_scale k", "o", "");
    CHECK(run_cli(args, err, sizeof err) == 1);
    CHECK_MSG(strstr(err, "attnjit: --in k given, but the op's kernel does not take it"), "%s",
              err);
    free(qf);
    free(q);
    free(o);
    free(lse);
    free(codes);
    for (int t = 0; t < 2; t++) {
        free(cf[t]);
        free(cache[t]);
    }
}

/* The stand-in libcuda's log of the run that had FAKE_CUDA_LOG=prefix (it
 * writes PREFIX.PID at exit). */
/*
 * FP8 inputs through the CLI (docs/ir.md "FP8 inputs"): q, k and v as
 * f8e4m3 codes in uint8 .npy files with q_scale (one), k_scale (per KV
 * head) and v_scale, a causal forward with GQA 2:1, against the reference
 * of the dequantised values: the efficient variant on cpu and sim (f32
 * products), the flash one on sim (the FP8 tensor-core kernel, whose P in
 * e4m3 may add 2^-4 of sum_j w_j |v_j| <= 2^-4 max |v|); then a missing
 * q_scale and a code past 255.
 */
static void test_fp8_inputs(void)
{
    enum { B = 1, HQ = 4, HKV = 2, SQ = 21, SK = 29, D = 64 };
    const int64_t qs[4] = {B, HQ, SQ, D}, ks[4] = {B, HKV, SK, D}, one[1] = {1},
                  kv_heads[1] = {HKV};
    const size_t n[3] = {B * HQ * SQ * D, B * HKV * SK * D, B * HKV * SK * D};
    const char *const names[3] = {"q", "k", "v"};
    const float q_scale = 0.25f, k_scale[HKV] = {0.5f, 0.125f}, v_scale = 2.0f;
    double *x[3], *o = malloc(n[0] * sizeof *o), *lse = malloc(B * HQ * SQ * sizeof *lse);
    uint8_t *codes = malloc(n[1] > n[0] ? n[1] : n[0]);
    for (int t = 0; t < 3; t++) {
        x[t] = malloc(n[t] * sizeof *x[t]);
        for (size_t i = 0; i < n[t]; i++) {
            float f = (float)(uniform() * 16.0 - 8.0);
            aj_convert(&f, AJ_DTYPE_F32, &codes[i], AJ_DTYPE_F8E4M3, 1);
            aj_convert(&codes[i], AJ_DTYPE_F8E4M3, &f, AJ_DTYPE_F32, 1);
            /* the dequantised value: k's scale is its KV head's */
            double s = t == 0 ? q_scale : t == 2 ? v_scale : k_scale[i / (SK * D) % HKV];
            x[t][i] = f * s;
        }
        write_u8(tensor_path("f8_", names[t]), codes, 4, t ? ks : qs);
    }
    write_tensor("f8_", "q_scale", &q_scale, 1, one);
    write_tensor("f8_", "k_scale", k_scale, 1, kv_heads);
    write_tensor("f8_", "v_scale", &v_scale, 1, one);
    ref_problem p = {.B = B, .Hq = HQ, .Hkv = HKV, .D = D, .Dv = D, .Sq = SQ, .Sk = SK,
                     .mask = AJ_MASK_CAUSAL, .align = AJ_ALIGN_BOTTOM_RIGHT};
    ref_forward(&p, x[0], x[1], x[2], o, lse);
    double v_most = 0;
    for (size_t i = 0; i < n[2]; i++)
        v_most = fmax(v_most, fabs(x[2][i]));
    static const struct {
        const char *variant, *device;
    } runs[] = {{"efficient", "cpu"}, {"efficient", "sim"}, {"flash", "sim"}};
    char err[4096], args[4096], spec[256];
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        snprintf(spec, sizeof spec, "attention forward %s {\n dtype = f16\n head_dim = %d\n"
                 " q_dtype = f8e4m3\n kv_dtype = f8e4m3\n mask = causal(bottom_right)\n}\n",
                 runs[r].variant, D);
        write_text(path("fp8.aj"), spec);
        run_command(args, sizeof args, "fp8.aj", runs[r].device, "f8_",
                    "q k v q_scale k_scale v_scale", "o lse", "");
        int rc = run_cli(args, err, sizeof err);
        CHECK_MSG(rc == 0, "fp8 %s on %s exited %d: %s", runs[r].variant, runs[r].device, rc,
                  err);
        int p8 = strcmp(runs[r].variant, "flash") == 0 && strcmp(runs[r].device, "sim") == 0;
        double e_o = result_error("f8_", "o", o, 4, qs, f16_atol + (p8 ? 0x1p-4 * v_most : 0),
                                  f16_rtol);
        double e_lse = result_error("f8_", "lse", lse, 3, qs, 1e-4, 1e-5);
        CHECK_MSG(e_o <= 1 && e_lse <= 1, "fp8 %s on %s: o %.3g lse %.3g x tolerance",
                  runs[r].variant, runs[r].device, e_o, e_lse);
        printf("attnjit run fp8 %s on %s: o %.3f lse %.3f of tolerance\n", runs[r].variant,
               runs[r].device, e_o, e_lse);
    }
    run_command(args, sizeof args, "fp8.aj", "cpu", "f8_", "q k v k_scale v_scale", "o", "");
    CHECK(run_cli(args, err, sizeof err) == 1);
    CHECK_MSG(strstr(err, "attnjit: a forward op with f8 q_dtype needs --in q_scale=FILE "
                          "(1 or Hq)"), "%s", err);
    const int64_t big_shape[4] = {1, 1, 1, 1};
    const int32_t big[1] = {300};
    write_i32("f8_", "big", big, 4, big_shape);
    snprintf(args, sizeof args, "run '%s' --device cpu --in q='%s' --in k='%s' --in v='%s' "
             "--in q_scale='%s' --in k_scale='%s' --in v_scale='%s' --out o='%s'",
             path("fp8.aj"), tensor_path("f8_", "big"), tensor_path("f8_", "k"),
             tensor_path("f8_", "v"), tensor_path("f8_", "q_scale"),
             tensor_path("f8_", "k_scale"), tensor_path("f8_", "v_scale"),
             tensor_path("f8_", "o"));
    CHECK(run_cli(args, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "attnjit: q: element 0 is 300; f8e4m3 elements come as byte codes "
                          "(uint8)"), "%s", err);
    for (int t = 0; t < 3; t++)
        free(x[t]);
    free(o);
    free(lse);
    free(codes);
}

/*
 * The tensor-core kernel's P in e4m3 where P is small: one key scores
 * 8.3125 above 1999 others (P = e^-8.3125, about 2^-12 each, a third of
 * the row's weight), V 0 at that key and 1 at the others, so O = 0.33 is
 * made of small P alone.  e4m3's subnormals would round such P to 0 (O =
 * 0); the kernel scales P by 2^8 first (docs/ir.md "FP8 inputs").  Exact
 * codes: q = 8 in dim 0, k = 8 (key 0) or -0.3125, d 64, scale 1/8.
 */
static void test_fp8_small_p(void)
{
    enum { SQ = 16, SK = 2000, D = 64 };
    const int64_t qs[4] = {1, 1, SQ, D}, ks[4] = {1, 1, SK, D}, one[1] = {1};
    static uint8_t codes[SK * D];
    static double q[SQ * D], k[SK * D], v[SK * D], o[SQ * D], lse[SQ];
    const float unit = 1.0f;
    for (int i = 0; i < SQ * D; i++)
        q[i] = i % D == 0 ? 8.0 : 0.0;
    for (int i = 0; i < SK * D; i++) {
        k[i] = i % D ? 0.0 : i == 0 ? 8.0 : -0.3125;
        v[i] = i < D ? 0.0 : 1.0;
    }
    const double *x[3] = {q, k, v};
    const char *const names[3] = {"q", "k", "v"};
    for (int t = 0; t < 3; t++) {
        int n = t ? SK * D : SQ * D;
        for (int i = 0; i < n; i++) {
            float f = (float)x[t][i];
            aj_convert(&f, AJ_DTYPE_F32, &codes[i], AJ_DTYPE_F8E4M3, 1);
        }
        write_u8(tensor_path("sp_", names[t]), codes, 4, t ? ks : qs);
        write_tensor("sp_", t == 0 ? "q_scale" : t == 1 ? "k_scale" : "v_scale", &unit, 1, one);
    }
    ref_problem p = {.B = 1, .Hq = 1, .Hkv = 1, .D = D, .Dv = D, .Sq = SQ, .Sk = SK};
    ref_forward(&p, q, k, v, o, lse);
    write_text(path("small_p.aj"), "attention forward flash {\n dtype = f16\n head_dim = 64\n"
                                   " q_dtype = f8e4m3\n kv_dtype = f8e4m3\n}\n");
    char err[4096], args[4096];
    run_command(args, sizeof args, "small_p.aj", "sim", "sp_", "q k v q_scale k_scale v_scale",
                "o", "");
    int rc = run_cli(args, err, sizeof err);
    CHECK_MSG(rc == 0, "small P exited %d: %s", rc, err);
    /* P's rounding: 2^-4 of sum_j w_j |v_j| = 2^-4 O */
    double e_o = result_error("sp_", "o", o, 4, qs, f16_atol + 0x1p-4 * o[1], f16_rtol);
    CHECK_MSG(o[1] > 0.3 && e_o <= 1, "small P: o %.3g x tolerance (want %.4f)", e_o, o[1]);
    printf("attnjit run fp8 flash on sim, small P (O = %.4f): o %.3f of tolerance\n", o[1], e_o);
}

static const char *driver_log(const char *prefix)
{
    static char log[1 << 20];
    char cmd[1400], file[700];
    snprintf(cmd, sizeof cmd, "cat '%s'.* > '%s.txt'", prefix, prefix);
    CHECK(system(cmd) == 0);
    snprintf(file, sizeof file, "%s.txt", prefix);
    FILE *f = fopen(file, "r");
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = '\0';
    if (f)
        fclose(f);
    return log;
}

/* Every line of `log` that starts with `call` names a stream other than
 * the legacy default (stream=0); at least one such line. */
static void check_own_stream(const char *log, const char *call, const char *what)
{
    int lines = 0;
    for (const char *l = log; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (strncmp(l, call, strlen(call)) != 0)
            continue;
        lines++;
        const char *s = strstr(l, "stream=");
        CHECK_MSG(s && s < strchr(l, '\n') && atoi(s + 7) != 0, "%s: %.*s", what,
                  (int)strcspn(l, "\n"), l);
    }
    CHECK_MSG(lines > 0, "%s: no %s in the driver log:\n%s", what, call, log);
}

/* `attnjit run --device cuda` on the stand-in libcuda (FAKE_CUDA_MODE=gpu:
 * it runs no kernel, so the numbers are not checked; it logs each driver
 * call with its stream): the launches, the timing events and the wait go
 * to a stream of the run's own -- never the legacy default stream, never
 * a whole-context cuCtxSynchronize -- and the time comes from events,
 * through cuEventElapsedTime_v2 (CUDA 13's name for it), not the v1 entry
 * point. */
static void test_run_cuda_streams(void)
{
    enum { B = 1, H = 2, S = 64, D = 64, N = B * H * S * D };
    static float q[N], lse[B * H * S];
    const int64_t qs[4] = {B, H, S, D}, ls[3] = {B, H, S};
    const char *names[] = {"q", "k", "v", "o", "do"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        write_tensor("g_", names[i], q, 4, qs);
    write_tensor("g_", "lse", lse, 3, ls);
    const char *specs[2] = {"attention forward flash { dtype = f16 head_dim = 64 }\n",
                            "attention backward flash { dtype = f16 head_dim = 64 }\n"};
    const char *ins[2] = {"q k v", "q k v o lse do"}, *outs[2] = {"o lse", "dq dk dv"};
    for (int i = 0; i < 2; i++) {
        write_text(path("gpu.aj"), specs[i]);
        char prefix[600], args[4096], err[4096];
        snprintf(prefix, sizeof prefix, "%s", path(i ? "cuda_bwd" : "cuda_fwd"));
        setenv("FAKE_CUDA_LOG", prefix, 1);
        run_command(args, sizeof args, "gpu.aj", "cuda", "g_", ins[i], outs[i], "");
        int rc = run_cli(args, err, sizeof err);
        unsetenv("FAKE_CUDA_LOG");
        const char *what = i ? "run backward on cuda" : "run forward on cuda";
        CHECK_MSG(rc == 0, "%s: exit %d: %s", what, rc, err);
        const char *log = driver_log(prefix);
        check_own_stream(log, "LaunchKernel", what);
        check_own_stream(log, "EventRecord", what);
        check_own_stream(log, "StreamSynchronize", what);
        CHECK_MSG(strstr(log, "EventElapsedTime_v2") && !strstr(log, "EventElapsedTime v1"),
                  "%s: the time is not from cuEventElapsedTime_v2:\n%s", what, log);
        CHECK_MSG(!strstr(log, "CtxSynchronize") && !strstr(log, "FAULT"),
                  "%s: a context synchronisation or a fault:\n%s", what, log);
        printf("attnjit run %s: launches, events and the wait on the run's own stream\n",
               what + 4);
    }
}

/* `attnjit tune --device cuda` on the stand-in: every candidate's launch
 * and its timing events on the tuner's own stream, no context
 * synchronisation (the stand-in's events all measure 1 ms). */
static void test_tune_cuda_streams(void)
{
    write_text(path("gpu.aj"), "attention forward flash { dtype = f16 head_dim = 64 }\n");
    char args[2048], err[1 << 16], prefix[600];
    snprintf(prefix, sizeof prefix, "%s", path("cuda_tune"));
    setenv("FAKE_CUDA_LOG", prefix, 1);
    snprintf(args, sizeof args, "tune '%s' --device cuda --seq 64 --batch 1 --heads 1 "
             "--repeats 1 --warmup 1 --no-persist", path("gpu.aj"));
    int rc = run_cli(args, err, sizeof err);
    unsetenv("FAKE_CUDA_LOG");
    CHECK_MSG(rc == 0, "tune on cuda: exit %d: %s", rc, err);
    const char *log = driver_log(prefix);
    check_own_stream(log, "LaunchKernel", "tune on cuda");
    check_own_stream(log, "EventRecord", "tune on cuda");
    CHECK_MSG(!strstr(log, "CtxSynchronize") && !strstr(log, "FAULT"),
              "tune on cuda: a context synchronisation or a fault");
    printf("attnjit tune on cuda: launches and events on the tuner's own stream\n");
}

/* Everything on the sim and cpu devices (the cuda mode runs its own). */
static void test_local_devices(void)
{
    test_run_matches_reference("sim");
    test_run_matches_reference("cpu");
    test_accumulate_and_bias();
    for (int d = 0; d < 2; d++) {
        const char *device = d ? "cpu" : "sim";
        test_backward_matches_reference(device, "efficient");
        test_backward_matches_reference(device, "flash");
        test_merge_matches_reference(device);
    }
    test_run_errors();
    test_paged();
    test_varlen();
    test_fp8_inputs();
    test_fp8_small_p();
}

int main(int argc, char **argv)
{
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "cuda") == 0)) {
        fprintf(stderr, "usage: test_cli_run ATTNJIT [cuda]\n");
        return 2;
    }
    aj = argv[1];
    if (!temp_dir_make(dir))
        return 2;
    if (argc == 3) {
        test_run_cuda_streams();
        test_tune_cuda_streams();
    } else {
        test_local_devices();
    }
    temp_dir_remove(dir);
    return check_report();
}
