/*
 * temp_dir.h -- a scratch directory of a test or benchmark: made from a
 * mkdtemp template, removed with everything in it.  Header-only.
 */
#ifndef AJ_TESTS_TEMP_DIR_H
#define AJ_TESTS_TEMP_DIR_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* Makes the directory of tmpl ("...XXXXXX", rewritten in place with its
 * name); false, after perror's line, when it cannot. */
static inline bool temp_dir_make(char *tmpl)
{
    if (mkdtemp(tmpl))
        return true;
    perror("mkdtemp");
    return false;
}

/* Removes dir and what it holds; false, after a line on stderr, when it
 * cannot. */
static inline bool temp_dir_remove(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) == 0)
        return true;
    fprintf(stderr, "could not remove %s\n", dir);
    return false;
}

/* Makes the directory of tmpl, runs tests (NULL-terminated) in order and
 * removes it; false when it cannot be made (nothing runs then). */
static inline bool temp_dir_run(char *tmpl, void (*const *tests)(void))
{
    if (!temp_dir_make(tmpl))
        return false;
    for (int i = 0; tests[i]; i++)
        tests[i]();
    temp_dir_remove(tmpl);
    return true;
}

#endif /* AJ_TESTS_TEMP_DIR_H */
