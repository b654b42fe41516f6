/*
 * spec_dir.h -- walks the *.aj spec files of a directory (the example
 * specs the tests parse, compile and run).  Header-only.
 */
#ifndef AJ_TESTS_SPEC_DIR_H
#define AJ_TESTS_SPEC_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Calls fn(name, path, text, len, user) for every *.aj file of dir with
 * its contents (NUL-terminated); returns how many, or -1 when dir cannot
 * be opened.  A file that cannot be read counts, with text NULL. */
static int spec_dir_each(const char *dir,
                         void (*fn)(const char *name, const char *path, const char *text,
                                    size_t len, void *user),
                         void *user)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int files = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 3, ".aj") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        char *text = NULL;
        size_t len = 0;
        if (f && fseek(f, 0, SEEK_END) == 0) {
            long size = ftell(f);
            rewind(f);
            text = size >= 0 ? malloc((size_t)size + 1) : NULL;
            len = text ? fread(text, 1, (size_t)size, f) : 0;
            if (text)
                text[len] = '\0';
        }
        if (f)
            fclose(f);
        fn(e->d_name, path, text, len, user);
        free(text);
        files++;
    }
    closedir(d);
    return files;
}

/* The folder of the examples/specs/scores specs: $AJ_SCORE_EXAMPLES, else
 * examples/specs/scores of the working directory. */
static inline const char *score_examples_dir(void)
{
    const char *dir = getenv("AJ_SCORE_EXAMPLES");
    return dir ? dir : "examples/specs/scores";
}

#endif /* AJ_TESTS_SPEC_DIR_H */
