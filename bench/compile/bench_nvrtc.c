/*
 * bench_nvrtc.c -- attnjit's IR-to-PTX time beside NVRTC's CUDA-C-to-PTX
 * time for the same kernel, measured in the same run.
 *
 *   bench_nvrtc [--repeat N] [--target sm_80|sm_90] [--csv FILE] [--cu FILE]
 *
 * For each case (dtype x head dim x mask) attnjit compiles the efficient
 * forward op from IR text (parse, verify, build, optimise, PTX; cache
 * bypassed), and NVRTC compiles efficient_fwd.cu -- the same algorithm and
 * tiling written in CUDA C, specialised by -D to the tile sizes attnjit's
 * kernel reports -- to PTX for the same architecture.  Each is run once to
 * warm up (LLVM's target set-up, NVRTC's built-in headers) and then N
 * times; medians are reported with the ratio NVRTC / attnjit.
 *
 * NVRTC comes from the CUDA toolkit (libnvrtc.so.13 or .12), loaded with
 * dlopen: where it is absent the program says so and exits with 77.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnjit/attnjit.h"
#include "spec_compile.h"
#include "timing.h"

#ifndef AJB_DEFAULT_CU
#define AJB_DEFAULT_CU "efficient_fwd.cu"
#endif

/* ---------------------------------------------------------------- NVRTC */

typedef int nvrtc_result;   /* nvrtcResult: 0 is NVRTC_SUCCESS */
typedef struct nvrtc_program_s *nvrtc_program;

#define AJB_NVRTC_SYMBOLS(X)                                                              \
    X(nvrtcVersion, nvrtc_result, (int *major, int *minor))                               \
    X(nvrtcGetErrorString, const char *, (nvrtc_result result))                           \
    X(nvrtcCreateProgram, nvrtc_result,                                                    \
      (nvrtc_program * prog, const char *src, const char *name, int num_headers,           \
       const char *const *headers, const char *const *include_names))                      \
    X(nvrtcCompileProgram, nvrtc_result,                                                   \
      (nvrtc_program prog, int num_options, const char *const *options))                   \
    X(nvrtcGetPTXSize, nvrtc_result, (nvrtc_program prog, size_t *size))                   \
    X(nvrtcGetPTX, nvrtc_result, (nvrtc_program prog, char *ptx))                          \
    X(nvrtcGetProgramLogSize, nvrtc_result, (nvrtc_program prog, size_t *size))            \
    X(nvrtcGetProgramLog, nvrtc_result, (nvrtc_program prog, char *log))                   \
    X(nvrtcDestroyProgram, nvrtc_result, (nvrtc_program * prog))

static struct {
#define AJB_FIELD(name, ret, args) ret(*name) args;
    AJB_NVRTC_SYMBOLS(AJB_FIELD)
#undef AJB_FIELD
} nvrtc;

/* Loads NVRTC; NULL on success, else why not. */
static const char *nvrtc_load(void)
{
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return "libnvrtc.so (CUDA toolkit) not found";
#define AJB_RESOLVE(name, ret, args)                                                      \
    *(void **)&nvrtc.name = dlsym(lib, #name);                                             \
    if (!nvrtc.name)                                                                       \
        return "libnvrtc lacks " #name;
    AJB_NVRTC_SYMBOLS(AJB_RESOLVE)
#undef AJB_RESOLVE
    return NULL;
}

/* ---------------------------------------------------------------- timing */

/* ---------------------------------------------------------------- cases */

typedef struct bench_case {
    const char *dtype;
    int d;
    int causal;
} bench_case;

static const bench_case cases[] = {
    {"bf16", 128, 1}, {"bf16", 128, 0}, {"f16", 64, 1}, {"f16", 64, 0}, {"f32", 64, 1},
};

static int dtype_code(const char *dtype)
{
    return !strcmp(dtype, "f16") ? 0 : !strcmp(dtype, "bf16") ? 1 : 2;
}

static void spec_text(const bench_case *c, char *buf, size_t size)
{
    snprintf(buf, size, "attention forward efficient {\n  dtype = %s\n  head_dim = %d\n"
             "  mask = %s\n}\n", c->dtype, c->d, c->causal ? "causal(top_left)" : "none");
}

/* One attnjit compile, IR text to PTX; ms, or -1 with a message. */
static double attnjit_once(aj_ctx *ctx, const char *text, aj_target target,
                           aj_launch_info *info, size_t *ptx_size)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.bypass_cache = true;
    aj_kernel *k = NULL;
    double t0 = now_ms();
    aj_status st = spec_compile(ctx, text, "bench", &opt, &k);
    double ms = now_ms() - t0;
    if (st != AJ_OK) {
        fprintf(stderr, "bench_nvrtc: attnjit: %s\n", aj_last_error(ctx));
        return -1;
    }
    if (info)
        aj_kernel_launch_info(k, info);
    if (ptx_size)
        aj_kernel_code(k, ptx_size);
    aj_kernel_destroy(k);
    return ms;
}

/* One NVRTC compile of the CUDA C twin to PTX; ms, or -1 with a message. */
static double nvrtc_once(const char *src, int ndefs, const char *const *defs, size_t *ptx_size)
{
    double t0 = now_ms();
    nvrtc_program prog = NULL;
    nvrtc_result r = nvrtc.nvrtcCreateProgram(&prog, src, "efficient_fwd.cu", 0, NULL, NULL);
    if (r == 0)
        r = nvrtc.nvrtcCompileProgram(prog, ndefs, defs);
    size_t size = 0;
    char *ptx = NULL;
    if (r == 0)
        r = nvrtc.nvrtcGetPTXSize(prog, &size);
    if (r == 0 && (ptx = malloc(size)) != NULL)
        r = nvrtc.nvrtcGetPTX(prog, ptx);
    double ms = now_ms() - t0;
    if (r != 0) {
        size_t log_size = 0;
        fprintf(stderr, "bench_nvrtc: NVRTC: %s\n", nvrtc.nvrtcGetErrorString(r));
        if (prog && nvrtc.nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 1) {
            char *log = malloc(log_size);
            if (log && nvrtc.nvrtcGetProgramLog(prog, log) == 0)
                fprintf(stderr, "%s\n", log);
            free(log);
        }
        ms = -1;
    }
    if (ptx_size)
        *ptx_size = size;
    free(ptx);
    nvrtc.nvrtcDestroyProgram(&prog);
    return ms;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf) {
        buf[fread(buf, 1, (size_t)n, f)] = 0;
    }
    fclose(f);
    return buf;
}

/* Lanes per row group, by the efficient forward's rule. */
static int row_group_lanes(int bn, int dv)
{
    int g = 16;
    while (g > 1 && (bn % g != 0 || dv % (4 * g) != 0))
        g /= 2;
    return g;
}

int main(int argc, char **argv)
{
    int repeat = 11;
    const char *target_name = "sm_90", *csv_path = NULL, *cu_path = AJB_DEFAULT_CU;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--target") && i + 1 < argc)
            target_name = argv[++i];
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else if (!strcmp(argv[i], "--cu") && i + 1 < argc)
            cu_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_nvrtc [--repeat N] [--target sm_80|sm_90] "
                    "[--csv FILE] [--cu FILE]\n");
            return 2;
        }
    }
    if (repeat < 1 || repeat > 1000) {
        fprintf(stderr, "bench_nvrtc: --repeat must be 1..1000\n");
        return 2;
    }
    const char *why = nvrtc_load();
    if (why) {
        printf("bench_nvrtc: skipped: %s\n", why);
        return 77;
    }
    char *src = read_all(cu_path);
    if (!src) {
        fprintf(stderr, "bench_nvrtc: cannot read %s\n", cu_path);
        return 1;
    }
    aj_ctx *ctx = NULL;
    aj_target target;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK ||
        aj_target_from_name(ctx, target_name, &target) != AJ_OK) {
        fprintf(stderr, "bench_nvrtc: bad target %s\n", target_name);
        return 2;
    }
    int major = 0, minor = 0;
    nvrtc.nvrtcVersion(&major, &minor);
    printf("attnjit %s (LLVM %s) vs NVRTC %d.%d, target %s, median of %d after one "
           "warm-up\n\n", aj_version_string(), aj_llvm_version(), major, minor, target_name,
           repeat);
    printf("| kernel | tiles (m x n, warps) | attnjit IR->PTX (ms) | NVRTC CUDA C->PTX (ms) "
           "| NVRTC / attnjit | PTX bytes attnjit / NVRTC |\n");
    printf("|---|---|---:|---:|---:|---|\n");
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv, "kernel,block_m,block_n,warps,attnjit_ms,nvrtc_ms,ratio,attnjit_ptx_bytes,"
                     "nvrtc_ptx_bytes\n");
    double *ta = calloc((size_t)repeat, sizeof *ta), *tn = calloc((size_t)repeat, sizeof *tn);
    int failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const bench_case *bc = &cases[c];
        char text[256];
        spec_text(bc, text, sizeof text);
        aj_launch_info info;
        size_t ptx_a = 0, ptx_n = 0;
        if (attnjit_once(ctx, text, target, &info, &ptx_a) < 0) {
            failed = 1;
            continue;
        }
        char defs[12][48];
        const char *opts[12];
        int n = 0;
        snprintf(defs[n++], 48, "--gpu-architecture=compute_%s", target_name + 3);
        snprintf(defs[n++], 48, "-DAJB_D=%d", bc->d);
        snprintf(defs[n++], 48, "-DAJB_DV=%d", bc->d);
        snprintf(defs[n++], 48, "-DAJB_DTYPE=%d", dtype_code(bc->dtype));
        snprintf(defs[n++], 48, "-DAJB_CAUSAL=%d", bc->causal);
        snprintf(defs[n++], 48, "-DAJB_BM=%d", info.schedule.block_m);
        snprintf(defs[n++], 48, "-DAJB_BN=%d", info.schedule.block_n);
        snprintf(defs[n++], 48, "-DAJB_WARPS=%d", info.schedule.warps);
        snprintf(defs[n++], 48, "-DAJB_G=%d",
                 row_group_lanes(info.schedule.block_n, bc->d));
        for (int i = 0; i < n; i++)
            opts[i] = defs[i];
        if (nvrtc_once(src, n, opts, &ptx_n) < 0) {
            failed = 1;
            continue;
        }
        for (int r = 0; r < repeat; r++) {
            ta[r] = attnjit_once(ctx, text, target, NULL, NULL);
            tn[r] = nvrtc_once(src, n, opts, NULL);
        }
        double ma = median(ta, repeat), mn = median(tn, repeat);
        char label[64];
        snprintf(label, sizeof label, "%s d%d %s", bc->dtype, bc->d,
                 bc->causal ? "causal" : "none");
        printf("| %s | %d x %d, %d | %.1f | %.1f | %.1fx | %zu / %zu |\n", label,
               info.schedule.block_m, info.schedule.block_n, info.schedule.warps, ma, mn,
               mn / ma, ptx_a, ptx_n);
        if (csv)
            fprintf(csv, "%s,%d,%d,%d,%.3f,%.3f,%.3f,%zu,%zu\n", label, info.schedule.block_m,
                    info.schedule.block_n, info.schedule.warps, ma, mn, mn / ma, ptx_a, ptx_n);
        fflush(stdout);
    }
    if (csv)
        fclose(csv);
    free(ta);
    free(tn);
    free(src);
    aj_ctx_destroy(ctx);
    return failed;
}
