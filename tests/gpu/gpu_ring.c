/*
 * gpu_ring.c -- attnjit-gpu's `ring` subcommand (bundle.h): the ring
 * forward over a one-rank NCCL communicator on GPU 0, against aj_forward
 * of the same op on the same inputs.
 *
 *   attnjit-gpu ring [--out FILE]
 *
 * One rank needs no MPI to share NCCL's unique id: the communicator comes
 * from ncclCommInitRank here and reaches the ring as the caller's
 * (aj_comm_config.nccl_comm).  NCCL is the library $AJ_NCCL_LIBRARY names,
 * else libnccl.so.2 (build-gpu/run.sh finds the one inside torch's package
 * when the loader does not).  --out writes the result as a JSON object.
 * Exit status: 0 if the ring agrees with aj_forward, 1 if not or a call
 * failed, 77 without a GPU or NCCL.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "bundle.h"

typedef struct { char internal[128]; } nccl_unique_id;   /* nccl.h's ncclUniqueId */
typedef int (*nccl_get_unique_id_fn)(nccl_unique_id *id);
typedef int (*nccl_comm_init_rank_fn)(void **comm, int nranks, nccl_unique_id id, int rank);
typedef int (*nccl_comm_destroy_fn)(void *comm);

enum { B = 1, H = 4, S = 1024, D = 64 };

/* a BHSD bf16 tensor, or the BHS f32 LSE (d = 0) */
static aj_tensor tensor(void *p, int d)
{
    if (!d)
        return (aj_tensor){p, AJ_DTYPE_F32, 3, {B, H, S, 0}, {(int64_t)H * S, S, 1, 0}};
    return (aj_tensor){p, AJ_DTYPE_BF16, 4, {B, H, S, d}, {(int64_t)H * S * d, S * d, d, 1}};
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = isinf(a[i]) && a[i] == b[i] ? 0 : fabs((double)a[i] - b[i]);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

int gpu_ring_main(int argc, char **argv)
{
    const char *out = argc == 3 && strcmp(argv[1], "--out") == 0 ? argv[2] : NULL;
    if (argc != 1 && !out) {
        fprintf(stderr, "usage: attnjit-gpu ring [--out FILE]\n");
        return 2;
    }
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_mode = AJ_CACHE_MEMORY;
    aj_ctx_create(&cfg, &ctx);
    if (aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev) != AJ_OK) {
        printf("SKIP ring: %s\n", aj_last_error(ctx));
        aj_ctx_destroy(ctx);
        return 77;
    }
    const char *lib = getenv("AJ_NCCL_LIBRARY");
    void *nccl = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    nccl_get_unique_id_fn get_id = NULL;
    nccl_comm_init_rank_fn init_rank = NULL;
    nccl_comm_destroy_fn destroy = NULL;
    if (nccl) {
        void *p = dlsym(nccl, "ncclGetUniqueId");
        memcpy(&get_id, &p, sizeof p);
        p = dlsym(nccl, "ncclCommInitRank");
        memcpy(&init_rank, &p, sizeof p);
        p = dlsym(nccl, "ncclCommDestroy");
        memcpy(&destroy, &p, sizeof p);
    }
    if (!get_id || !init_rank || !destroy) {
        printf("SKIP ring: NCCL (%s) cannot be loaded: %s\n", lib ? lib : "libnccl.so.2",
               nccl ? "it lacks ncclCommInitRank" : dlerror());
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
        return 77;
    }

    const size_t n = (size_t)B * H * S * D, rows = (size_t)B * H * S;
    uint16_t *host = malloc(3 * n * 2), *o16 = malloc(2 * n * 2);
    float *o = malloc(2 * n * 4), *lse = malloc(2 * rows * 4);
    void *q = NULL, *k = NULL, *v = NULL, *o_ring = NULL, *o_ref = NULL, *l_ring = NULL,
         *l_ref = NULL, *comm_nccl = NULL;
    aj_comm *comm = NULL;
    aj_op *op = NULL;
    aj_kernel *kernel = NULL;
    aj_ring_stats stats;
    memset(&stats, 0, sizeof stats);
    aj_status st = host && o16 && o && lse ? AJ_OK : AJ_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; st == AJ_OK && i < 3 * n; i++) {
        float x = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        aj_convert(&x, AJ_DTYPE_F32, &host[i], AJ_DTYPE_BF16, 1);
    }
    void **bufs[] = {&q, &k, &v, &o_ring, &o_ref};
    for (int i = 0; i < 5 && st == AJ_OK; i++)
        st = aj_device_alloc(dev, n * 2, bufs[i]);
    if (st == AJ_OK) st = aj_device_alloc(dev, rows * 4, &l_ring);
    if (st == AJ_OK) st = aj_device_alloc(dev, rows * 4, &l_ref);
    if (st == AJ_OK) st = aj_device_copy_to(dev, q, host, n * 2);
    if (st == AJ_OK) st = aj_device_copy_to(dev, k, host + n, n * 2);
    if (st == AJ_OK) st = aj_device_copy_to(dev, v, host + 2 * n, n * 2);
    static const char spec[] =
        "attention forward flash { dtype = bf16 head_dim = 64 mask = causal(top_left) }";
    if (st == AJ_OK) st = aj_op_parse(ctx, spec, strlen(spec), "ring", &op);

    nccl_unique_id id;
    int nr = get_id(&id);
    if (nr == 0)
        nr = init_rank(&comm_nccl, 1, id, 0);
    char why[128] = "";
    if (st == AJ_OK && nr != 0) {
        snprintf(why, sizeof why, "ncclCommInitRank (1 rank) failed with ncclResult %d", nr);
        st = AJ_ERR_COMM;
    }
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    cc.kind = AJ_COMM_NCCL;
    cc.nccl_comm = comm_nccl;
    cc.timeout_s = 60;
    if (st == AJ_OK) st = aj_comm_create(ctx, dev, &cc, &comm);
    aj_ring_fwd_args ra = AJ_RING_FWD_ARGS_INIT;
    ra.q = tensor(q, D), ra.k = tensor(k, D), ra.v = tensor(v, D);
    ra.o = tensor(o_ring, D), ra.lse = tensor(l_ring, 0);
    if (st == AJ_OK) st = aj_ring_forward(ctx, dev, comm, op, &ra, &stats);

    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (st == AJ_OK) st = aj_compile(ctx, op, &opt, &kernel);
    aj_fwd_args fa = AJ_FWD_ARGS_INIT;
    fa.q = ra.q, fa.k = ra.k, fa.v = ra.v, fa.o = tensor(o_ref, D), fa.lse = tensor(l_ref, 0);
    if (st == AJ_OK) st = aj_forward(ctx, dev, kernel, &fa);
    if (st == AJ_OK) st = aj_device_synchronize(dev, NULL);
    if (st == AJ_OK) st = aj_device_copy_from(dev, o16, o_ring, n * 2);
    if (st == AJ_OK) st = aj_device_copy_from(dev, o16 + n, o_ref, n * 2);
    if (st == AJ_OK) st = aj_device_copy_from(dev, lse, l_ring, rows * 4);
    if (st == AJ_OK) st = aj_device_copy_from(dev, lse + rows, l_ref, rows * 4);
    double err_o = INFINITY, err_lse = INFINITY;
    if (st == AJ_OK) {
        aj_convert(o16, AJ_DTYPE_BF16, o, AJ_DTYPE_F32, 2 * n);
        err_o = max_diff(o, o + n, n);
        err_lse = max_diff(lse, lse + rows, rows);
    }
    /* the ring's kernels accumulate (f32 partials, one rounding to bf16);
     * aj_forward rounds once too: they differ by at most a bf16 step */
    int ok = st == AJ_OK && err_o <= 1.0 / 128 && err_lse <= 1e-4;
    printf("ring (1 rank, NCCL) %s B%d H%d S%d d%d causal: %s; max |O ring - O| %.3g, "
           "max |LSE ring - LSE| %.3g; %d launches, %.3f s\n", aj_device_name(dev), B, H, S, D,
           st == AJ_OK ? (ok ? "ok" : "WRONG") : *why ? why : aj_last_error(ctx), err_o, err_lse,
           stats.launches, stats.total_s);
    FILE *f = out ? fopen(out, "w") : NULL;
    if (f) {
        fprintf(f, "{\"ring\": {\"ok\": %s, \"status\": \"%s\", \"max_diff_o\": %.6g, "
                "\"max_diff_lse\": %.6g, \"launches\": %d, \"total_s\": %.4f}}\n",
                ok ? "true" : "false", aj_status_str(st), err_o, err_lse, stats.launches,
                stats.total_s);
        fclose(f);
    }
    aj_comm_destroy(comm);
    if (comm_nccl)
        destroy(comm_nccl);
    for (int i = 0; i < 5; i++)
        aj_device_free(dev, *bufs[i]);
    aj_device_free(dev, l_ring);
    aj_device_free(dev, l_ref);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    free(host), free(o16), free(o), free(lse);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
