/*
 * forked.h -- a check run in a child process forked from the test, as a
 * pre-forking server forks its workers.  Header-only.
 */
#ifndef AJ_TESTS_FORKED_H
#define AJ_TESTS_FORKED_H

#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Forks once the process's threads are idle and runs check(arg) in the
 * child, which exits 0 where it returns nonzero and is killed by an
 * alarm after alarm_s seconds; "" when the child exited 0, else what went
 * wrong.  The pause before the fork lets threads the test started settle:
 * a thread still starting when fork() comes (under GCC 12's ASan, inside
 * its allocator, which does not guard fork as glibc's malloc does) would
 * leave the child a lock nobody holds. */
static inline const char *in_forked_child(int (*check)(void *), void *arg, unsigned alarm_s)
{
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        alarm(alarm_s);
        _exit(check(arg) ? 0 : 1);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child)
        return "could not be forked or waited for";
    if (WIFSIGNALED(status))
        return "hung (killed by its alarm)";
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : "failed its check";
}

#endif /* AJ_TESTS_FORKED_H */
