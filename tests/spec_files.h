/*
 * spec_files.h -- the .aj spec files of a folder, each read whole, for the
 * tests that run every example (test_ptx, test_score, test_sim_flash_bwd).
 *
 * Header-only with a static function.
 */
#ifndef AJ_TESTS_SPEC_FILES_H
#define AJ_TESTS_SPEC_FILES_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>

typedef void (*spec_file_fn)(const char *name, const char *text, size_t len, void *user);

/* Calls fn with the file name and text (up to 4095 bytes, NUL-terminated)
 * of every NAME.aj in dir, in the folder's order; returns how many, or -1
 * when dir cannot be opened. */
static int spec_files_each(const char *dir, spec_file_fn fn, void *user)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int seen = 0;
    for (struct dirent *ent; (ent = readdir(d));) {
        size_t n = strlen(ent->d_name);
        if (n < 4 || strcmp(ent->d_name + n - 3, ".aj") != 0)
            continue;
        char path[1024], text[4096];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        FILE *f = fopen(path, "rb");
        size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (f)
            fclose(f);
        text[len] = '\0';
        fn(ent->d_name, text, len, user);
        seen++;
    }
    closedir(d);
    return seen;
}

#endif /* AJ_TESTS_SPEC_FILES_H */
