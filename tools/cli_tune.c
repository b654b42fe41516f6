/*
 * cli_tune.c -- `attnjit tune`: tune an op's schedule on a device, show the
 * ranking, keep the best in the tuning database.
 *
 *   attnjit tune SPEC --device sim|cpu|cuda [--budget-s N] [--csv FILE]
 *       [--batch N] [--heads N] [--heads-kv N] [--seq N] [--seq-k N]
 *       [--warmup N] [--repeats N] [--workers N] [--no-persist]
 *       [--wgmma yes|no]
 *
 * Progress goes to stderr: a bar redrawn in place on a terminal, one plain
 * line per candidate otherwise (logs, CI).  The ranked table goes to
 * stdout; --csv writes every candidate, pruned ones with their reason.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

typedef struct tune_args {
    const char *spec, *csv;
    aj_device_kind device;
    int workers;
    aj_tune_options options;
} tune_args;

/* Reads a count in lo..hi; 0 on success. */
static int count_arg(const char *flag, const char *v, long lo, long hi, int32_t *out)
{
    char *end;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || n < lo || n > hi) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s takes %ld..%ld, not '%%s'", flag, lo, hi);
        cli_usage(msg, v ? v : "");
        return 1;
    }
    *out = (int32_t)n;
    return 0;
}

static int parse_args(int argc, char **argv, tune_args *t)
{
    memset(t, 0, sizeof *t);
    t->options = (aj_tune_options)AJ_TUNE_OPTIONS_INIT;
    t->device = AJ_DEVICE_KIND_COUNT;
    static const struct {
        const char *flag;
        size_t offset;
        long lo, hi;
    } counts[] = {
        {"--batch", offsetof(aj_tune_options, batch), 1, 65535},
        {"--heads", offsetof(aj_tune_options, heads_q), 1, 65535},
        {"--heads-kv", offsetof(aj_tune_options, heads_kv), 1, 65535},
        {"--seq", offsetof(aj_tune_options, seq_q), 1, 1 << 24},
        {"--seq-k", offsetof(aj_tune_options, seq_k), 1, 1 << 24},
        {"--warmup", offsetof(aj_tune_options, warmup), 1, 1000},
        {"--repeats", offsetof(aj_tune_options, repeats), 1, 1000},
    };
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t c = 0;
        while (c < sizeof counts / sizeof counts[0] && strcmp(a, counts[c].flag) != 0)
            c++;
        if (c < sizeof counts / sizeof counts[0]) {
            int32_t *field = (int32_t *)((char *)&t->options + counts[c].offset);
            if (count_arg(a, v, counts[c].lo, counts[c].hi, field))
                return CLI_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--device") == 0 && v) {
            if (cli_device_kind(v, &t->device) != CLI_EXIT_OK)
                return CLI_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--budget-s") == 0 && v) {
            char *end;
            double b = strtod(v, &end);
            if (*end || !(b > 0 && b <= 1e6))
                return cli_usage("--budget-s takes seconds > 0, not '%s'", v);
            t->options.budget_s = b;
            i++;
        } else if (strcmp(a, "--workers") == 0 && v) {
            int32_t w;
            if (count_arg(a, v, 0, 1024, &w))
                return CLI_EXIT_USAGE;
            t->workers = w;
            i++;
        } else if (strcmp(a, "--csv") == 0 && v) {
            t->csv = v;
            i++;
        } else if (strcmp(a, "--no-persist") == 0) {
            t->options.no_persist = true;
        } else if (strcmp(a, "--wgmma") == 0 && v) {
            if (strcmp(v, "yes") != 0 && strcmp(v, "no") != 0)
                return cli_usage("--wgmma takes yes or no, not '%s'", v);
            t->options.wgmma = strcmp(v, "yes") == 0;
            i++;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_usage("tune: unknown or incomplete option '%s'", a);
        } else if (!t->spec) {
            t->spec = a;
        } else {
            return cli_usage("tune takes one SPEC; '%s' is a second", a);
        }
    }
    if (!t->spec)
        return cli_usage("tune needs a SPEC%s", "");
    if (t->device == AJ_DEVICE_KIND_COUNT)
        return cli_usage("tune needs --device (sim, cpu or cuda)%s", "");
    return CLI_EXIT_OK;
}

/* Progress: a redrawn bar on a terminal, plain lines elsewhere. */
static void show_progress(void *user, int32_t done, int32_t total, const char *what)
{
    int tty = *(int *)user;
    if (!tty) {
        fprintf(stderr, "tune: [%d/%d] %s\n", done, total, what);
        return;
    }
    enum { WIDTH = 30 };
    int filled = total > 0 ? (int)((long)WIDTH * done / total) : 0;
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r\033[K[%s] %d/%d %.60s", bar, done, total, what);
    if (done == total && total > 0)
        fputc('\n', stderr);
    fflush(stderr);
}

static void print_table(const aj_tune_result *r, int32_t n)
{
    double base = 0;
    for (int32_t i = 0; i < n; i++)
        if (r[i].is_default && r[i].timed)
            base = r[i].median_ms;
    int threads = 0, wgmma = 0;   /* cpu: the thread count is tuned too */
    for (int32_t i = 0; i < n; i++) {
        threads |= r[i].workers > 0;
        wgmma |= r[i].warpgroups > 0;
    }
    printf("| rank |%s block_m | block_n | %s | median (ms) | min (ms) | vs default |\n",
           wgmma ? " kernel |" : "", threads ? "threads" : "warps | stages");
    printf("|---:|%s---:|---:|---:|%s---:|---:|---:|\n", wgmma ? "---|" : "",
           threads ? "" : "---:|");
    int32_t pruned = 0, untimed = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!r[i].timed) {
            pruned += r[i].status != AJ_OK;
            untimed += r[i].status == AJ_OK;
            continue;
        }
        char vs[32] = "";
        if (base > 0)
            snprintf(vs, sizeof vs, "%.2fx", base / r[i].median_ms);
        char middle[32];
        if (threads)
            snprintf(middle, sizeof middle, "%d", r[i].workers);
        else
            snprintf(middle, sizeof middle, "%d | %d", r[i].schedule.warps,
                     r[i].schedule.stages);
        char kernel[48] = "";
        if (wgmma && r[i].warpgroups)
            snprintf(kernel, sizeof kernel, " wgmma x%d%s |", r[i].warpgroups,
                     r[i].producer ? " + producer" : "");
        else if (wgmma)
            snprintf(kernel, sizeof kernel, " mma.sync |");
        printf("| %d |%s %d | %d | %s | %.3f | %.3f | %s%s |\n", i + 1, kernel,
               r[i].schedule.block_m, r[i].schedule.block_n, middle, r[i].median_ms, r[i].min_ms,
               vs, r[i].is_default ? " (default)" : "");
    }
    if (untimed)
        printf("\n%d candidates not timed: the budget ran out\n", untimed);
    if (pruned) {
        printf("\n%d candidates pruned, for example:\n", pruned);
        int shown = 0;
        for (int32_t i = 0; i < n && shown < 3; i++)
            if (r[i].status != AJ_OK) {
                printf("  block_m %d, block_n %d, warps %d, stages %d%s: %s\n",
                       r[i].requested.block_m, r[i].requested.block_n, r[i].requested.warps,
                       r[i].requested.stages, r[i].warpgroups ? ", wgmma" : "", r[i].message);
                shown++;
            }
    }
}

static int write_csv(const char *path, const aj_tune_result *r, int32_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "attnjit: cannot write '%s': %s\n", path, strerror(errno));
        return CLI_EXIT_INPUT;
    }
    fprintf(f, "rank,block_m,block_n,warps,stages,workers,timed,median_ms,min_ms,default,"
               "status,message,warpgroups,producer\n");
    for (int32_t i = 0; i < n; i++) {
        const aj_schedule *s = r[i].timed ? &r[i].schedule : &r[i].requested;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", r[i].message);
        for (char *c = msg; *c; c++)
            if (*c == '"')
                *c = '\'';
        fprintf(f, "%d,%d,%d,%d,%d,%d,%d,%.6f,%.6f,%d,%s,\"%s\",%d,%d\n", i + 1, s->block_m,
                s->block_n, s->warps, s->stages, r[i].workers, r[i].timed, r[i].median_ms,
                r[i].min_ms, r[i].is_default, aj_status_str(r[i].status), msg, r[i].warpgroups,
                r[i].producer);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "attnjit: cannot write '%s'\n", path);
        return CLI_EXIT_INPUT;
    }
    return CLI_EXIT_OK;
}

int cli_tune(aj_ctx *ctx, int argc, char **argv)
{
    tune_args t;
    int rc = parse_args(argc, argv, &t);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_op *op = NULL;
    rc = cli_load_op(ctx, t.spec, &op);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_device *dev = NULL;
    aj_tune_result *results = NULL;
    int32_t n = 0;
    int tty = isatty(STDERR_FILENO);
    t.options.progress = show_progress;
    t.options.progress_user = &tty;
    aj_status st = aj_device_open(ctx, t.device, 0, &dev);
    if (st == AJ_OK)
        st = aj_device_set_workers(dev, t.workers);
    if (st == AJ_OK)
        st = aj_tune(ctx, dev, op, &t.options, &results, &n);
    if (st != AJ_OK) {
        rc = cli_report(ctx, st);
    } else {
        printf("%s on %s\n\n", t.spec, aj_device_name(dev));
        print_table(results, n);
        if (!t.options.no_persist)
            printf("\nthe best schedule is recorded: compiles of this spec for this device "
                   "(aj_compile_options.device) use it\n");
        if (t.csv)
            rc = write_csv(t.csv, results, n);
    }
    aj_free(results);
    aj_device_close(dev);
    aj_op_destroy(op);
    return rc;
}
