/*
 * leak_check.h -- LeakSanitizer under MPI.
 *
 * OpenMPI unloads its plugins in MPI_Finalize, so leaks LSan finds at exit
 * inside them have no module name to suppress.  MPI programs therefore
 * check for leaks just before MPI_Finalize, while every library is still
 * loaded (and MPI's own allocations still reachable), and ctest turns the
 * exit-time check off (LSAN_OPTIONS=leak_check_at_exit=0).  In builds
 * without the sanitizer this does nothing.
 */
#ifndef AJ_TESTS_RING_LEAK_CHECK_H
#define AJ_TESTS_RING_LEAK_CHECK_H

#if defined(__SANITIZE_ADDRESS__)
int __lsan_do_recoverable_leak_check(void);
/* 1 if LSan reported leaks (it has printed them). */
static inline int leak_check_before_finalize(void)
{
    return __lsan_do_recoverable_leak_check() != 0;
}
#else
static inline int leak_check_before_finalize(void)
{
    return 0;
}
#endif

#endif /* AJ_TESTS_RING_LEAK_CHECK_H */
