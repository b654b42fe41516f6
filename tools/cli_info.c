/*
 * cli_info.c -- `attnjit info`: versions, targets, and which optional
 * pieces (CUDA driver, NCCL, MPI, ptxas) this machine has.  Everything is
 * probed at run time; nothing here is needed to build attnjit.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

typedef int (*int_out_fn)(int *);

enum version_style { VERSION_NONE, VERSION_CUDA, VERSION_NCCL };

/* dlopen a library; if `version_sym` resolves, call it for a version:
 * cuDriverGetVersion gives 12040 for 12.4, ncclGetVersion 22005 for 2.20.5. */
static void probe_library(const char *label, const char *soname,
                          const char *version_sym, enum version_style style)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("%-12s not found (%s)\n", label, soname);
        return;
    }
    int v = 0;
    void *sym = version_sym ? dlsym(h, version_sym) : NULL;
    if (sym) {
        int_out_fn fn;
        memcpy(&fn, &sym, sizeof fn);
        if (fn(&v) != 0)
            v = 0;
    }
    if (v > 0 && style == VERSION_CUDA)
        printf("%-12s found (%s, version %d.%d)\n", label, soname, v / 1000, v % 1000 / 10);
    else if (v > 0 && style == VERSION_NCCL)
        printf("%-12s found (%s, version %d.%d.%d)\n", label, soname, v / 10000,
               v % 10000 / 100, v % 100);
    else
        printf("%-12s found (%s)\n", label, soname);
    dlclose(h);
}

/* The first executable `name` on PATH, else in `fallback_dir`. */
static int find_program(const char *name, const char *fallback_dir, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:%s", path ? path : "", fallback_dir);
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/%s", d, name);
        if (access(out, X_OK) == 0)
            return 1;
    }
    return 0;
}

static void probe_ptxas(void)
{
    char path[1024];
    if (!find_program("ptxas", "/usr/local/cuda/bin", path, sizeof path)) {
        printf("%-12s not found (PATH, /usr/local/cuda/bin)\n", "ptxas");
        return;
    }
    char cmd[1100], line[256] = "", last[256] = "";
    snprintf(cmd, sizeof cmd, "'%s' --version 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    while (p && fgets(line, sizeof line, p))
        if (strstr(line, "release"))
            snprintf(last, sizeof last, "%s", line);
    if (p)
        pclose(p);
    last[strcspn(last, "\n")] = '\0';
    printf("%-12s found (%s%s%s)\n", "ptxas", path, last[0] ? "; " : "", last);
}

/* The cpu device: the host CPU's name and the threads a launch uses (the
 * line is left out only if memory for the device runs out). */
static void probe_cpu(void)
{
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    if (aj_ctx_create(NULL, &ctx) == AJ_OK && aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) == AJ_OK)
        printf("%-12s %s, %d threads\n", "cpu device", aj_device_name(dev),
               aj_device_workers(dev));
    else if (ctx)
        printf("%-12s not opened: %s\n", "cpu device", aj_last_error(ctx));
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    /* the paths the cpu kernels take here, each line indented under it */
    char text[1024];
    aj_cpu_describe(text, sizeof text);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        printf("  cpu %s\n", line);
}

int cli_info(void)
{
    printf("attnjit      %s\n", aj_version_string());
    printf("LLVM         %s\n", aj_llvm_version());
    printf("targets     ");
    for (int t = AJ_TARGET_SM_80; t < AJ_TARGET_COUNT; t++) {
        const char *ptx = aj_ptx_version((aj_target)t);
        printf(" %s", aj_target_name((aj_target)t));
        if (ptx)
            printf(" (PTX %s)", ptx);
    }
    printf("\n");
    probe_library("CUDA driver", "libcuda.so.1", "cuDriverGetVersion", VERSION_CUDA);
    probe_library("NCCL", "libnccl.so.2", "ncclGetVersion", VERSION_NCCL);
    probe_library("MPI", "libmpi.so.40", NULL, VERSION_NONE);
    probe_ptxas();
    probe_cpu();
    return CLI_EXIT_OK;
}
