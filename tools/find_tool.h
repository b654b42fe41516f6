/*
 * find_tool.h -- where one of NVIDIA's tools is (ptxas, nvdisasm): the
 * path in environment variable `env` if set, else the first `name` on
 * PATH, else /usr/local/cuda/bin/`name`.  Header-only: the CLI's audit and
 * the tests' and benches' ptxas runner (tests/lib/ptxas_util.h) share it.
 */
#ifndef AJ_TOOLS_FIND_TOOL_H
#define AJ_TOOLS_FIND_TOOL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 with the tool's path in out, else 0 (out holds the last path tried). */
static inline int aj_find_tool(const char *env, const char *name, char *out, size_t cap)
{
    const char *given = getenv(env);
    if (given && *given) {
        snprintf(out, cap, "%s", given);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/local/cuda/bin", path ? path : "");
    char *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/%s", d, name);
        if (access(out, X_OK) == 0)
            return 1;
    }
    return 0;
}

#endif /* AJ_TOOLS_FIND_TOOL_H */
