/*
 * cpu.c -- the `cpu` target: native kernels for this machine's cores.
 *
 * The pipeline treats cpu like sim (host target machine, <entry>.entry
 * wrapper, object code loaded into an LLJIT), except that the kernel's
 * hidden argument is its work item.  What is cpu's own lives here: the
 * host's CPU as attnjit compiles for it (LLVM's name and features, less
 * what AJ_CPU_ISA masks), the vector width the templates size their
 * registers by, and the few C library functions the JIT-compiled code may
 * call.
 */
#define _GNU_SOURCE   /* syscall */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <llvm-c/TargetMachine.h>

#include "codegen/amx.h"
#include "codegen/codegen.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/*
 * AJ_CPU_ISA levels: the LLVM feature prefixes each one turns off, so that
 * the paths for older hosts can be run (and tested) on a newer one.  A
 * prefix covers every feature that implies the one it names (LLVM re-enables
 * a disabled feature when a later "+x" implies it).
 */
static const struct isa_level {
    const char *name;
    const char *masked[6];
} isa_levels[] = {
    {"native", {NULL}},
    {"avx512", {"avx512bf16", "avx512fp16", "amx-", "avx10", NULL}},
    {"avx2", {"avx512", "amx-", "avx10", "evex512", NULL}},
};

static const struct isa_level *isa_level(void)
{
    const char *env = getenv("AJ_CPU_ISA");
    if (!env || !*env)
        return &isa_levels[0];
    for (size_t i = 0; i < sizeof isa_levels / sizeof isa_levels[0]; i++)
        if (strcmp(env, isa_levels[i].name) == 0)
            return &isa_levels[i];
    return NULL;
}

/* AJ_CPU_AMX: auto (unset or empty too: AJ_AMX_NATIVE where the host can),
 * off, standin, native (AMX_FORCE_NATIVE: whether or not the host can);
 * -1 for another */
enum { AMX_FORCE_NATIVE = AJ_AMX_NATIVE + 1 };
static int amx_setting(void)
{
    const char *env = getenv("AJ_CPU_AMX");
    if (!env || !*env || strcmp(env, "auto") == 0)
        return AJ_AMX_NATIVE;
    if (strcmp(env, "off") == 0)
        return AJ_AMX_OFF;
    if (strcmp(env, "standin") == 0)
        return AJ_AMX_STANDIN;
    if (strcmp(env, "native") == 0)
        return AMX_FORCE_NATIVE;
    return -1;
}

/* AJ_CPU_BF16: 1 for standin, 0 for auto (unset or empty too), -1 for
 * another */
static int bf16_standin(void)
{
    const char *env = getenv("AJ_CPU_BF16");
    if (!env || !*env || strcmp(env, "auto") == 0)
        return 0;
    return strcmp(env, "standin") == 0 ? 1 : -1;
}

/* The host's name and CPUID features as LLVM reads them, once per process
 * (a hundred microseconds a call, and they do not change) */
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static char host_name[64], *host_feature_text;

static void host_read(void)
{
    char *name = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
    snprintf(host_name, sizeof host_name, "%s", name ? name : "");
    host_feature_text = strdup(features ? features : "");
    LLVMDisposeMessage(name);
    LLVMDisposeMessage(features);
}

static const char *host_features(void)
{
    pthread_once(&host_once, host_read);
    return host_feature_text ? host_feature_text : "";
}

const char *aj_host_cpu_name(void)
{
    pthread_once(&host_once, host_read);
    return host_name;
}

aj_status aj_host_cpu(aj_ctx *ctx, char **name, char **features)
{
    const struct isa_level *level = isa_level();
    *name = *features = NULL;
    if (!level)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "AJ_CPU_ISA = '%s': expected native, avx512 "
                       "or avx2", getenv("AJ_CPU_ISA"));
    if (amx_setting() < 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "AJ_CPU_AMX = '%s': expected auto, off, "
                       "standin or native", getenv("AJ_CPU_AMX"));
    if (bf16_standin() < 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "AJ_CPU_BF16 = '%s': expected auto or standin",
                       getenv("AJ_CPU_BF16"));
    char *out = strdup(host_features());
    if (!out)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    /* "+sse2,+avx512f,..." -> "-avx512f" for the masked ones, in place */
    for (char *p = out; *p;) {
        char *end = strchr(p, ',');
        for (int i = 0; level->masked[i] && *p == '+'; i++)
            if (strncmp(p + 1, level->masked[i], strlen(level->masked[i])) == 0)
                *p = '-';
        p = end ? end + 1 : p + strlen(p);
    }
    /* AJ_CPU_AMX=native on a host without AMX: code for one that has it */
    if (amx_setting() == AMX_FORCE_NATIVE) {
        static const char extra[] = ",+amx-tile,+amx-bf16,+amx-fp16";
        char *more = realloc(out, strlen(out) + sizeof extra);
        if (!more) {
            free(out);
            return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
        }
        out = strcat(more, extra);
    }
    *features = out;
    *name = LLVMCreateMessage(aj_host_cpu_name());
    return AJ_OK;
}

void aj_host_cpu_id(char *out, size_t cap)
{
    char *name = NULL, *features = NULL;
    if (aj_host_cpu(NULL, &name, &features) != AJ_OK) {
        snprintf(out, cap, "cpu ?");
        return;
    }
    static const char *const pairs[] = {"off", "native", "standin"};
    snprintf(out, cap, "cpu %s %016llx amx-%s-%s bf16-%s", name,
             (unsigned long long)XXH3_64bits(features, strlen(features)),
             aj_amx_mode_name(aj_cpu_amx_mode(AJ_DTYPE_BF16, NULL, 0)),
             aj_amx_mode_name(aj_cpu_amx_mode(AJ_DTYPE_F16, NULL, 0)),
             pairs[aj_cpu_bf16_pairs()]);
    LLVMDisposeMessage(name);
    free(features);
}

/* Whether a feature string ("+a,-b,...") enables f */
static int features_enable(const char *features, const char *f)
{
    size_t n = strlen(f);
    for (const char *p = features; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n + 1 && p[0] == '+' && memcmp(p + 1, f, n) == 0)
            return 1;
        p = end ? end + 1 : p + len;
    }
    return 0;
}

int aj_cpu_has_feature(const char *f)
{
    char *name = NULL, *features = NULL;
    if (aj_host_cpu(NULL, &name, &features) != AJ_OK)
        return 0;
    int found = features_enable(features, f);
    LLVMDisposeMessage(name);
    free(features);
    return found;
}

/* Whether the host's CPUID enables f, whatever AJ_CPU_ISA masks */
static int host_enables(const char *f)
{
    return features_enable(host_features(), f);
}

/* 16 floats with AVX-512 -- and under the AMX stand-in (AJ_CPU_AMX=
 * standin) or vdpbf16ps's (AJ_CPU_BF16=standin) on any AVX host: each
 * stands in for a host whose kernels are 16 wide (their paths ask for
 * it), so the stand-in's kernels are those, LLVM splitting each vector in
 * two where the host has no AVX-512. */
int aj_cpu_vector_width(void)
{
    if (aj_cpu_has_feature("avx512f"))
        return 16;
    if (!aj_cpu_has_feature("avx"))
        return 4;
    return amx_setting() == AJ_AMX_STANDIN || bf16_standin() == 1 ? 16 : 8;
}

aj_bf16_pairs aj_cpu_bf16_pairs(void)
{
    if (bf16_standin() == 1)
        return aj_cpu_has_feature("avx") ? AJ_BF16_PAIRS_STANDIN : AJ_BF16_PAIRS_OFF;
    return aj_cpu_has_feature("avx512bf16") ? AJ_BF16_PAIRS_NATIVE : AJ_BF16_PAIRS_OFF;
}

/* The tile data is an XSAVE component the OS enables per process on
 * request (Linux: arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
 * asked once, its answer kept. */
#define AJ_ARCH_REQ_XCOMP_PERM 0x1023
#define AJ_XFEATURE_XTILEDATA 18
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_perm_errno;

static void amx_request(void)
{
#if defined(__x86_64__) && defined(SYS_arch_prctl)
    amx_perm_errno = syscall(SYS_arch_prctl, AJ_ARCH_REQ_XCOMP_PERM, AJ_XFEATURE_XTILEDATA) == 0
                         ? 0 : errno;
#else
    amx_perm_errno = ENOSYS;
#endif
}

/* The feature of products of dtype: amx-bf16, amx-fp16, or NULL */
static const char *amx_product_feature(aj_dtype dtype)
{
    return dtype == AJ_DTYPE_BF16 ? "amx-bf16" : dtype == AJ_DTYPE_F16 ? "amx-fp16" : NULL;
}

/* Whether this process can run tile products of dtype; why not in `why` */
static int amx_runnable(aj_dtype dtype, char *why, size_t cap)
{
    const char *product = amx_product_feature(dtype);
    if (!product) {
        snprintf(why, cap, "no tile products of %s", aj_dtype_name(dtype));
        return 0;
    }
    /* from CPUID itself: aj_host_cpu's features gain AMX under
     * AJ_CPU_AMX=native */
    if (!host_enables("amx-tile") || !host_enables(product)) {
        snprintf(why, cap, "CPUID reports no amx-tile and %s (or the OS has not enabled "
                 "their state in XCR0)", product);
        return 0;
    }
    if (isa_level() != &isa_levels[0]) {   /* every other level masks amx- */
        snprintf(why, cap, "AJ_CPU_ISA=%s masks amx-tile and %s", getenv("AJ_CPU_ISA"),
                 product);
        return 0;
    }
    pthread_once(&amx_once, amx_request);
    if (amx_perm_errno) {
        snprintf(why, cap, "the OS refused the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM): %s)",
                 strerror(amx_perm_errno));
        return 0;
    }
    snprintf(why, cap, "CPUID reports amx-tile and %s; the OS granted the tile data", product);
    return 1;
}

aj_amx_mode aj_cpu_amx_mode(aj_dtype dtype, char *why, size_t cap)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        cap = sizeof scratch;
    }
    if (!amx_product_feature(dtype)) {
        snprintf(why, cap, "no tile products of %s", aj_dtype_name(dtype));
        return AJ_AMX_OFF;
    }
    switch (amx_setting()) {
    case AJ_AMX_STANDIN:
        snprintf(why, cap, "the stand-in, as AJ_CPU_AMX=standin asks");
        return AJ_AMX_STANDIN;
    case AJ_AMX_OFF:
        snprintf(why, cap, "AJ_CPU_AMX=off");
        return AJ_AMX_OFF;
    case AJ_AMX_NATIVE:
        return amx_runnable(dtype, why, cap) ? AJ_AMX_NATIVE : AJ_AMX_OFF;
    case AMX_FORCE_NATIVE: {
        char host[160];
        if (amx_runnable(dtype, host, sizeof host))
            snprintf(why, cap, "%s", host);
        else
            snprintf(why, cap, "AJ_CPU_AMX=native, for another host: %s, so its kernels "
                     "compile here but do not run", host);
        return AJ_AMX_NATIVE;
    }
    default:
        snprintf(why, cap, "AJ_CPU_AMX = '%s' is not a setting", getenv("AJ_CPU_AMX"));
        return AJ_AMX_OFF;
    }
}

aj_status aj_cpu_amx_check_runnable(aj_ctx *ctx)
{
    char why[200];
    if (amx_setting() != AMX_FORCE_NATIVE || (amx_runnable(AJ_DTYPE_BF16, why, sizeof why) &&
                                              amx_runnable(AJ_DTYPE_F16, why, sizeof why)))
        return AJ_OK;
    return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "AJ_CPU_AMX=native: this host cannot run tile "
                   "instructions (%s); unset it or use auto, off or standin", why);
}

/* The features that choose a cpu path, in the order aj_cpu_describe lists
 * them */
static const char *const path_features[] = {
    "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512bf16", "avx512fp16",
    "amx-tile", "amx-bf16", "amx-fp16",
};

size_t aj_cpu_describe(char *buf, size_t cap)
{
    char *name = NULL, *features = NULL;
    char text[1024], why[2][200];
    size_t n = 0;
#define PUT(...) (n += (size_t)snprintf(text + n, n < sizeof text ? sizeof text - n : 0, \
                                        __VA_ARGS__))
    aj_ctx *ctx = NULL;
    aj_ctx_create(NULL, &ctx);
    if (aj_host_cpu(ctx, &name, &features) != AJ_OK) {
        PUT("features    none: %s\n", ctx ? aj_last_error(ctx) : "out of memory");
    } else {
        PUT("features   ");
        int missing = 0;
        for (size_t i = 0; i < sizeof path_features / sizeof path_features[0]; i++)
            if (features_enable(features, path_features[i]))
                PUT(" %s", path_features[i]);
            else
                missing++;
        if (missing) {
            PUT("; not");
            for (size_t i = 0; i < sizeof path_features / sizeof path_features[0]; i++)
                if (!features_enable(features, path_features[i]))
                    PUT(" %s", path_features[i]);
        }
        const char *isa = getenv("AJ_CPU_ISA");
        PUT(" (CPUID%s%s%s%s; LLVM names the CPU %s)\n", isa && *isa ? ", AJ_CPU_ISA=" : "",
            isa && *isa ? isa : "", isa && *isa ? " masking" : "",
            amx_setting() == AMX_FORCE_NATIVE &&
                    !(host_enables("amx-tile") && host_enables("amx-bf16") &&
                      host_enables("amx-fp16"))
                ? ", AJ_CPU_AMX=native adding amx-tile, amx-bf16 and amx-fp16" : "",
            name);
        int w = aj_cpu_vector_width();
        PUT("vectors     %d floats (%s)\n", w,
            w == 16 ? (aj_cpu_has_feature("avx512f") ? "avx512f"
                                                     : "a stand-in's, split for avx")
            : w == 8 ? "avx, no avx512f" : "no avx");
        aj_bf16_pairs dp = aj_cpu_bf16_pairs();
        /* per 16-bit dtype: the path, then the AMX line with its reason */
        static const struct {
            aj_dtype dtype;
            const char *label, *amx_label;
        } halves[2] = {{AJ_DTYPE_BF16, "bf16       ", "AMX bf16   "},
                       {AJ_DTYPE_F16, "f16        ", "AMX f16    "}};
        aj_amx_mode amx[2];
        for (int i = 0; i < 2; i++) {
            amx[i] = aj_cpu_amx_mode(halves[i].dtype, why[i], sizeof why[i]);
            const char *vec = w != 16                           ? "widened to f32 (no avx512f)"
                              : halves[i].dtype == AJ_DTYPE_F16 ? "widened to f32"
                              : dp == AJ_BF16_PAIRS_NATIVE ? "pairs by vdpbf16ps (avx512bf16)"
                              : dp == AJ_BF16_PAIRS_STANDIN
                                  ? "pairs by a stand-in of vdpbf16ps (AJ_CPU_BF16=standin)"
                                  : "widened to f32 (no avx512bf16)";
            if (amx[i] != AJ_AMX_OFF && w == 16)
                PUT("%s forward and backward on AMX tiles where head dims and block_m are "
                    "multiples of 32, else %s\n", halves[i].label, vec);
            else
                PUT("%s %s\n", halves[i].label, vec);
        }
        for (int i = 0; i < 2; i++)
            PUT("%s %s: %s\n", halves[i].amx_label, aj_amx_mode_name(amx[i]), why[i]);
    }
#undef PUT
    aj_ctx_destroy(ctx);
    LLVMDisposeMessage(name);
    free(features);
    if (n >= sizeof text)
        n = sizeof text - 1;
    if (buf && cap) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    return n;
}

/* Wrappers with plain C types, so the table holds function pointers. */
static float cpu_exp2f(float x) { return exp2f(x); }
static float cpu_log2f(float x) { return log2f(x); }
static float cpu_rintf(float x) { return rintf(x); }
static float cpu_floorf(float x) { return floorf(x); }
static float cpu_fmaf(float a, float b, float c) { return fmaf(a, b, c); }
static float cpu_fmaxf(float a, float b) { return fmaxf(a, b); }
static float cpu_fminf(float a, float b) { return fminf(a, b); }

const aj_host_symbol *aj_cpu_symbols(size_t *count)
{
    static const aj_host_symbol symbols[] = {
        {"exp2f", (void *)cpu_exp2f},   {"log2f", (void *)cpu_log2f},
        {"rintf", (void *)cpu_rintf},   {"floorf", (void *)cpu_floorf},
        {"fmaf", (void *)cpu_fmaf},     {"fmaxf", (void *)cpu_fmaxf},
        {"fminf", (void *)cpu_fminf},
        /* the AMX stand-in (amx.h) */
        {"aj_amx_standin_ldtilecfg", (void *)aj_amx_standin_ldtilecfg},
        {"aj_amx_standin_tilerelease", (void *)aj_amx_standin_tilerelease},
        {"aj_amx_standin_tilezero", (void *)aj_amx_standin_tilezero},
        {"aj_amx_standin_tileloadd", (void *)aj_amx_standin_tileloadd},
        {"aj_amx_standin_tilestored", (void *)aj_amx_standin_tilestored},
        {"aj_amx_standin_tdpbf16ps", (void *)aj_amx_standin_tdpbf16ps},
        {"aj_amx_standin_tdpfp16ps", (void *)aj_amx_standin_tdpfp16ps},
    };
    *count = sizeof symbols / sizeof symbols[0];
    return symbols;
}
