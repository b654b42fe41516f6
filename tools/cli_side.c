/*
 * cli_side.c -- side tensors on the command line (`run` and `ring`):
 * --in NAME=FILE for a name the command does not know is one of the op's
 * side tensors (tensors = (...)), read from an i32 or float .npy of the
 * declared rank (an f16 or bf16 tensor's values rounded to its dtype, via
 * f32).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/dtype.h"
#include "ir/expr.h"
#include "tools/cli.h"
#include "tools/npy.h"

static int names(const cli_side_opts *s, int i, const char *name)
{
    return strlen(name) == s->len[i] && strncmp(name, s->name[i], s->len[i]) == 0;
}

int cli_side_add(cli_side_opts *s, const char *cmd, const char *flag, const char *arg)
{
    const char *eq = strchr(arg, '=');
    size_t len = (size_t)(eq - arg);
    for (int i = 0; i < s->n; i++)
        if (s->len[i] == len && strncmp(s->name[i], arg, len) == 0) {
            fprintf(stderr, "attnjit: %s %.*s given twice\n", flag, (int)len, arg);
            return CLI_EXIT_USAGE;
        }
    if (s->n == AJ_OP_TENSORS_MAX)
        return cli_usage("%s takes at most 8 (AJ_OP_TENSORS_MAX) side tensors", cmd);
    s->name[s->n] = arg;
    s->len[s->n] = len;
    s->file[s->n++] = eq + 1;
    return CLI_EXIT_OK;
}

int cli_side_check(const aj_op_info *info, const cli_side_opts *s, const char *cmd,
                   const char *const *known, int nknown)
{
    for (int i = 0; i < s->n; i++) {
        int declared = 0;
        for (int d = 0; d < info->num_tensors; d++)
            declared |= names(s, i, info->tensors[d].name);
        if (declared)
            continue;
        fprintf(stderr, "attnjit: unknown tensor '%.*s': not one of %s's (", (int)s->len[i],
                s->name[i], cmd);
        for (int t = 0; t < nknown; t++)
            fprintf(stderr, "%s%s", t ? ", " : "", known[t]);
        fprintf(stderr, ") nor a side tensor the op declares");
        for (int d = 0; d < info->num_tensors; d++)
            fprintf(stderr, "%s%s", d ? ", " : " (", info->tensors[d].name);
        fprintf(stderr, "%s\n", info->num_tensors ? ")" : "");
        return CLI_EXIT_USAGE;
    }
    for (int d = 0; d < info->num_tensors; d++) {
        int given = 0;
        for (int i = 0; i < s->n; i++)
            given |= names(s, i, info->tensors[d].name);
        if (!given) {
            fprintf(stderr, "attnjit: the op declares tensors = (%s: %s[%d] ...); give --in "
                    "%s=FILE\n", info->tensors[d].name,
                    aj_side_dtype_name(info->tensors[d].dtype), info->tensors[d].rank,
                    info->tensors[d].name);
            return CLI_EXIT_USAGE;
        }
    }
    return CLI_EXIT_OK;
}

/* An f32 array's values rounded to nearest even into *out, a new buffer
 * of f16 or bf16: CLI_EXIT_OK, or the exit of the error it reports (out
 * of memory; a finite value past the dtype's range, element `e`). */
static int narrow(const npy_array *a, const aj_side_decl *decl, void **out)
{
    uint16_t *h = malloc((a->count ? a->count : 1) * sizeof *h);
    if (!h) {
        fprintf(stderr, "attnjit: %s: out of memory\n", decl->name);
        return CLI_EXIT_INTERNAL;
    }
    for (size_t e = 0; e < a->count; e++) {
        float x = a->f32[e], back;
        h[e] = decl->dtype == AJ_SIDE_F16 ? aj_f32_to_f16(x) : aj_f32_to_bf16(x);
        back = decl->dtype == AJ_SIDE_F16 ? aj_f16_to_f32(h[e]) : aj_bf16_to_f32(h[e]);
        if (isinf(back) && isfinite(x)) {
            fprintf(stderr, "attnjit: %s (%s): element %zu, %g, is past the dtype's range\n",
                    decl->name, aj_side_dtype_name(decl->dtype), e, (double)x);
            free(h);
            return CLI_EXIT_INPUT;
        }
    }
    *out = h;
    return CLI_EXIT_OK;
}

int cli_side_load(const aj_op_info *info, const cli_side_opts *s, cli_side_buffers *side)
{
    memset(side, 0, sizeof *side);
    for (int d = 0; d < info->num_tensors; d++) {
        const aj_side_decl *decl = &info->tensors[d];
        const char *path = NULL;
        for (int i = 0; i < s->n && !path; i++)
            if (names(s, i, decl->name))
                path = s->file[i];
        npy_array a;
        char err[512];
        npy_status ns = decl->dtype == AJ_SIDE_I32 ? npy_read_i32(path, &a, err, sizeof err)
                                                   : npy_read_f32(path, &a, err, sizeof err);
        if (ns != NPY_OK) {
            fprintf(stderr, "attnjit: %s (%s[%d]): %s\n", decl->name,
                    aj_side_dtype_name(decl->dtype), decl->rank, err);
            return ns == NPY_ERR_OUT_OF_MEMORY ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
        }
        if (a.rank != decl->rank) {
            fprintf(stderr, "attnjit: %s: %s has %d dimensions; the op declares %s: %s[%d]\n",
                    decl->name, path, a.rank, decl->name, aj_side_dtype_name(decl->dtype),
                    decl->rank);
            npy_free(&a);
            return CLI_EXIT_INPUT;
        }
        /* the data itself, taken over from the array (16-bit: rounded) */
        void *data = decl->dtype == AJ_SIDE_I32 ? (void *)a.i32 : (void *)a.f32;
        bool narrowed = aj_side_dtype_bytes(decl->dtype) == 2;
        int rc = narrowed ? narrow(&a, decl, &data) : CLI_EXIT_OK;
        if (rc != CLI_EXIT_OK) {
            npy_free(&a);
            return rc;
        }
        cli_side_set(side, decl, a.shape, data);
        if (narrowed)
            npy_free(&a);
    }
    return CLI_EXIT_OK;
}

void cli_side_set(cli_side_buffers *side, const aj_side_decl *decl, const int64_t *shape,
                  void *data)
{
    aj_side_tensor *t = &side->t[side->n];
    *t = (aj_side_tensor){decl->name, data, decl->dtype, decl->rank, {0}, {0}};
    int64_t stride = 1;
    for (int k = decl->rank - 1; k >= 0; k--) {
        t->shape[k] = shape[k];
        t->strides[k] = stride;
        stride *= shape[k];
    }
    side->mem[side->n++] = data;
}

size_t cli_side_bytes(const aj_side_tensor *t)
{
    size_t n = (size_t)aj_side_dtype_bytes(t->dtype);
    for (int k = 0; k < t->rank; k++)
        n *= (size_t)t->shape[k];
    return n;
}

aj_status cli_side_to_device(aj_device *dev, const cli_side_buffers *side,
                             aj_side_tensor *on_device)
{
    aj_status st = AJ_OK;
    for (int i = 0; i < side->n; i++) {
        on_device[i] = side->t[i];
        on_device[i].data = NULL;
    }
    for (int i = 0; i < side->n && st == AJ_OK; i++) {
        void *p = NULL;
        st = aj_device_alloc(dev, cli_side_bytes(&side->t[i]), &p);
        if (st == AJ_OK)
            st = aj_device_copy_to(dev, p, side->t[i].data, cli_side_bytes(&side->t[i]));
        on_device[i].data = p;
    }
    return st;
}

void cli_side_free(aj_device *dev, cli_side_buffers *side, aj_side_tensor *on_device)
{
    for (int i = 0; i < side->n; i++) {
        if (on_device && on_device[i].data)
            aj_device_free(dev, (void *)on_device[i].data);
        free(side->mem[i]);
    }
    side->n = 0;
}
