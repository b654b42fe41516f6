/*
 * bench_flash_resources.c -- what the flash kernels ask of a GPU, per kind,
 * dtype and head dim at the default schedule: registers and spill bytes
 * (ptxas -v), static and dynamic shared memory, PTX instructions, CTA size
 * and grid rule, for sm_80 and sm_90.
 *
 *   bench_flash_resources [--csv FILE]     (default: flash_resources.csv)
 *
 * It walks the kinds (forward, backward): a kind whose template does not
 * exist yet prints "not available: <message>" and is skipped, so a new
 * flash template shows up here without a change.  Each kernel of a
 * multi-stage module gets its own row.  Without ptxas it skips with the
 * reason.  Prints a markdown table; writes the same rows as CSV.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "ptxas_util.h"

static const aj_kind kinds[] = {AJ_KIND_FORWARD, AJ_KIND_BACKWARD};
static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16};
static const int dims[][2] = {{32, 32}, {64, 64}, {96, 96}, {128, 128},
                              {192, 192}, {256, 256}, {192, 128}};
static const aj_target targets[] = {AJ_TARGET_SM_80, AJ_TARGET_SM_90};

/* Where `text` names the entry, as before + entry + after (NULL: nowhere). */
static const char *find_entry(const char *text, const char *before, const char *entry,
                              const char *after)
{
    char marker[256];
    snprintf(marker, sizeof marker, "%s%s%s", before, entry, after);
    return strstr(text, marker);
}

/* Instruction lines of entry `entry` in PTX text: the lines of its body
 * that end in ';' and are not directives ('.'), labels or comments. */
static int count_instructions(const char *ptx, const char *entry)
{
    const char *at = find_entry(ptx, ".entry ", entry, "(");
    const char *body = at ? strstr(at, "\n{") : NULL;
    if (!body)
        return -1;
    int n = 0;
    for (const char *line = body + 2; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > 0 && line[0] == '}')
            break;
        const char *p = line;
        while (p < line + len && (*p == ' ' || *p == '\t'))
            p++;
        int directive = *p == '.' || *p == '/' || *p == '$' || *p == '{' || *p == '}';
        if (!directive && len > 0 && memchr(p, ';', (size_t)(line + len - p)))
            n++;
        if (!end)
            break;
        line = end + 1;
    }
    return n;
}

/* Static shared memory of one entry from ptxas -v ("N bytes smem"; absent: 0). */
static int static_smem(const char *log, const char *entry)
{
    const char *at = find_entry(log, "entry function '", entry, "'");
    if (!at)
        return -1;
    const char *next = strstr(at + 1, "Compiling entry function");
    const char *smem = strstr(at, "bytes smem");
    if (!smem || (next && smem > next))
        return 0;
    char section[512];
    size_t n = (size_t)(smem - at) + strlen("bytes smem");
    if (n >= sizeof section)
        n = sizeof section - 1;
    memcpy(section, at, n);
    section[n] = '\0';
    return ptxas_field(section, "bytes smem");
}

/* The rows of one kind; returns the number of kernels that failed. */
static int bench_kind(aj_ctx *ctx, const char *ptxas, FILE *csv, aj_kind kind_id)
{
    const char *kind = aj_kind_name(kind_id);
    int failures = 0;
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++)
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (size_t a = 0; a < sizeof targets / sizeof targets[0]; a++) {
                char spec[256];
                snprintf(spec, sizeof spec, "attention %s flash { dtype = %s head_dim = %d "
                         "head_dim_v = %d }", kind, aj_dtype_name(dtypes[t]), dims[d][0],
                         dims[d][1]);
                aj_op *op = NULL;
                aj_kernel *kr = NULL;
                aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
                opt.target = targets[a];
                aj_status st = aj_op_parse(ctx, spec, strlen(spec), "bench", &op);
                if (st == AJ_OK)
                    st = aj_compile(ctx, op, &opt, &kr);
                aj_op_destroy(op);
                if (st == AJ_ERR_UNSUPPORTED && t == 0 && d == 0 && a == 0) {
                    /* the kind itself: no flash template for it yet */
                    printf("\n%s flash: not available: %s\n\n", kind, aj_last_error(ctx));
                    return 0;
                }
                if (st != AJ_OK) {
                    printf("| %s | | %s | %d/%d | %s | %s: %s |\n", kind,
                           aj_dtype_name(dtypes[t]), dims[d][0], dims[d][1],
                           aj_target_name(targets[a]), aj_status_str(st), aj_last_error(ctx));
                    failures++;
                    continue;
                }
                size_t len;
                const char *ptx = aj_kernel_code(kr, &len);
                const char *arch = aj_target_name(targets[a]);
                ptxas_result all;
                ptxas_run(ptxas, arch, ptx, len, &all);
                for (int s = 0; s < aj_kernel_num_stages(kr); s++) {
                    const char *entry = aj_kernel_stage_entry(kr, s);
                    aj_launch_info li;
                    aj_kernel_stage_info(kr, s, &li);
                    ptxas_result r;
                    if (all.exit_code != 0 || ptxas_entry(&all, entry, &r) != 0) {
                        printf("| %s | %d | %s | %d/%d | %s | ptxas failed: %.200s |\n", kind,
                               s, aj_dtype_name(dtypes[t]), dims[d][0], dims[d][1], arch,
                               all.log);
                        failures++;
                        continue;
                    }
                    char grid[64];
                    snprintf(grid, sizeof grid, "%s/%d x %s x %s",
                             aj_extent_name(li.grid[0].extent), li.grid[0].per_block,
                             aj_extent_name(li.grid[1].extent), aj_extent_name(li.grid[2].extent));
                    int smem_static = static_smem(all.log, entry);
                    int insts = count_instructions(ptx, entry);
                    const aj_schedule *sc = &li.schedule;
                    printf("| %s | %d | %s | %d/%d | %s | %d, %d, %d, %d | %d | %s | %d | "
                           "%d/%d | %d + %d | %d |\n", kind, s, aj_dtype_name(dtypes[t]),
                           dims[d][0], dims[d][1], arch, sc->block_m, sc->block_n, sc->warps,
                           sc->stages, li.block[0], grid, r.registers, r.spill_stores,
                           r.spill_loads, smem_static, li.dynamic_smem, insts);
                    fprintf(csv, "%s,%d,%s,%d,%d,%s,%d,%d,%d,%d,%d,%s,%d,%d,%d,%d,%d,%d\n",
                            kind, s, aj_dtype_name(dtypes[t]), dims[d][0], dims[d][1], arch,
                            sc->block_m, sc->block_n, sc->warps, sc->stages, li.block[0],
                            grid, r.registers, r.spill_stores, r.spill_loads, smem_static,
                            li.dynamic_smem, insts);
                }
                aj_kernel_destroy(kr);
            }
    return failures;
}

int main(int argc, char **argv)
{
    const char *csv_path = "flash_resources.csv";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv_path = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--csv FILE]\n", argv[0]);
            return 1;
        }
    }
    char ptxas[1024];
    if (!ptxas_find(ptxas, sizeof ptxas)) {
        printf("SKIP: ptxas not found on PATH or in /usr/local/cuda/bin; registers and "
               "spills need it\n");
        return 0;
    }
    aj_ctx *ctx = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK)
        return 1;
    FILE *csv = fopen(csv_path, "w");
    if (!csv) {
        fprintf(stderr, "cannot open %s for writing\n", csv_path);
        aj_ctx_destroy(ctx);
        return 1;
    }
    fprintf(csv, "kind,stage,dtype,head_dim,head_dim_v,target,block_m,block_n,warps,stages,"
                 "threads,grid,registers,spill_stores,spill_loads,static_smem,dynamic_smem,"
                 "ptx_instructions\n");
    printf("| kind | stage | dtype | D/Dv | target | schedule (m, n, warps, stages) | threads "
           "| grid | regs | spill st/ld (B) | smem static + dynamic (B) | PTX insts |\n");
    printf("|---|---|---|---|---|---|---:|---|---:|---:|---:|---:|\n");
    int failures = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        failures += bench_kind(ctx, ptxas, csv, kinds[k]);
    fclose(csv);
    printf("\nCSV: %s\n", csv_path);
    aj_ctx_destroy(ctx);
    return failures ? 1 : 0;
}
