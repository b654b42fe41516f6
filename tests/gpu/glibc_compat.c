/*
 * glibc_compat.c -- lets attnjit-gpu start on glibc 2.31 (Ubuntu 20.04)
 * or newer although it is linked here against a newer glibc.
 *
 * A dynamic executable records, per glibc symbol, the version it was
 * linked against, and the loader refuses to start it where that version
 * is missing.  Linked against glibc 2.36, attnjit-gpu (LLVM and the C++
 * runtime linked in) asks for three kinds of newer symbol:
 *
 *   new functions    arc4random (2.36, std::random_device) is defined
 *                    here on getrandom (2.25); mallinfo2 (2.33, LLVM's
 *                    memory statistics) wraps mallinfo;
 *                    __libc_single_threaded (2.32, libstdc++) is defined
 *                    here as 0: "maybe threaded", always correct;
 *   moved functions  glibc 2.34 moved pthread_* and dl* into libc.so.6
 *                    under a new version; 2.33 made stat, fstat, lstat and
 *                    mknod real functions (before, __xstat & co.);
 *   the start-up     Scrt1.o of 2.34+ calls __libc_start_main@GLIBC_2.34
 *                    and leaves running the program's constructors to it.
 *
 * The link wraps every such name (-Wl,--wrap=NAME, tests/gpu/CMakeLists.txt):
 * calls go to __wrap_NAME below, which calls the GLIBC_2.2.5 version every
 * glibc still exports (in libpthread.so.0 and libdl.so.2 before 2.34: the
 * link names both, and they are stubs since).  __libc_start_main gets an
 * init function that runs the constructors, as glibc's own __libc_csu_init
 * did; glibc 2.34+ calls it and skips its own run of them, older ones have
 * no other, so both run the constructors once.  tests/gpu/check_bundle.sh
 * checks the result with objdump.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>

/* binds NAME_glibc_old to NAME@GLIBC_2.2.5 */
#define GLIBC_OLD(name) __asm__(".symver " #name "_glibc_old, " #name "@GLIBC_2.2.5")

/* ---------------------------------------------------------------- new functions */

uint32_t arc4random(void);
char __libc_single_threaded;

uint32_t arc4random(void)
{
    uint32_t v = 0;
    while (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        ;
    return v;
}

struct mallinfo mallinfo_glibc_old(void);
GLIBC_OLD(mallinfo);
struct mallinfo2 __wrap_mallinfo2(void);

struct mallinfo2 __wrap_mallinfo2(void)
{
    struct mallinfo m = mallinfo_glibc_old();
    struct mallinfo2 r = {
        .arena = (size_t)(unsigned)m.arena, .ordblks = (size_t)(unsigned)m.ordblks,
        .smblks = (size_t)(unsigned)m.smblks, .hblks = (size_t)(unsigned)m.hblks,
        .hblkhd = (size_t)(unsigned)m.hblkhd, .usmblks = (size_t)(unsigned)m.usmblks,
        .fsmblks = (size_t)(unsigned)m.fsmblks, .uordblks = (size_t)(unsigned)m.uordblks,
        .fordblks = (size_t)(unsigned)m.fordblks, .keepcost = (size_t)(unsigned)m.keepcost,
    };
    return r;
}

/* ---------------------------------------------------------------- moved functions */

#define WRAP(ret, name, params, args)          \
    ret name##_glibc_old params;               \
    GLIBC_OLD(name);                           \
    ret __wrap_##name params;                  \
    ret __wrap_##name params { return name##_glibc_old args; }

WRAP(int, pthread_create, (pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg),
     (t, a, fn, arg))
WRAP(int, pthread_detach, (pthread_t t), (t))
WRAP(int, pthread_join, (pthread_t t, void **ret), (t, ret))
WRAP(int, pthread_once, (pthread_once_t *once, void (*fn)(void)), (once, fn))
WRAP(int, pthread_rwlock_rdlock, (pthread_rwlock_t *l), (l))
WRAP(int, pthread_rwlock_wrlock, (pthread_rwlock_t *l), (l))
WRAP(int, pthread_rwlock_unlock, (pthread_rwlock_t *l), (l))
WRAP(int, pthread_attr_setstacksize, (pthread_attr_t *a, size_t bytes), (a, bytes))
WRAP(int, pthread_attr_getstack, (const pthread_attr_t *a, void **addr, size_t *bytes),
     (a, addr, bytes))
WRAP(int, pthread_getattr_np, (pthread_t t, pthread_attr_t *a), (t, a))   /* 2.32 */
WRAP(int, pthread_sigmask, (int how, const sigset_t *set, sigset_t *old), (how, set, old))
WRAP(void *, dlopen, (const char *file, int mode), (file, mode))
WRAP(int, dlclose, (void *handle), (handle))
WRAP(char *, dlerror, (void), ())
WRAP(void *, dlsym, (void *handle, const char *name), (handle, name))
#undef WRAP

/* stat & co. before 2.33: __xstat(_STAT_VER, ..), _STAT_VER = 1 and
 * _MKNOD_VER = 0 on x86-64 */
#define XSTAT(name, xname, arg_t, st_t)                                    \
    int xname##_glibc_old(int ver, arg_t arg, st_t *buf);                 \
    GLIBC_OLD(xname);                                                      \
    int __wrap_##name(arg_t arg, st_t *buf);                               \
    int __wrap_##name(arg_t arg, st_t *buf) { return xname##_glibc_old(1, arg, buf); }
XSTAT(stat, __xstat, const char *, struct stat)
XSTAT(stat64, __xstat64, const char *, struct stat64)
XSTAT(lstat, __lxstat, const char *, struct stat)
XSTAT(lstat64, __lxstat64, const char *, struct stat64)
XSTAT(fstat, __fxstat, int, struct stat)
XSTAT(fstat64, __fxstat64, int, struct stat64)
#undef XSTAT

int __xmknod_glibc_old(int ver, const char *path, mode_t mode, dev_t *dev);
GLIBC_OLD(__xmknod);
int __wrap_mknod(const char *path, mode_t mode, dev_t dev);

int __wrap_mknod(const char *path, mode_t mode, dev_t dev)
{
    return __xmknod_glibc_old(0, path, mode, &dev);
}

/* ---------------------------------------------------------------- start-up */

typedef void (*init_fn)(int argc, char **argv, char **envp);
typedef int (*main_fn)(int argc, char **argv, char **envp);

/* the linker's bounds of the program's constructor tables, and crti.o's _init */
extern init_fn __preinit_array_start[] __attribute__((visibility("hidden")));
extern init_fn __preinit_array_end[] __attribute__((visibility("hidden")));
extern init_fn __init_array_start[] __attribute__((visibility("hidden")));
extern init_fn __init_array_end[] __attribute__((visibility("hidden")));
void _init(void);

static void run_constructors(int argc, char **argv, char **envp)
{
    for (init_fn *f = __preinit_array_start; f < __preinit_array_end; f++)
        (*f)(argc, argv, envp);
    _init();
    for (init_fn *f = __init_array_start; f < __init_array_end; f++)
        (*f)(argc, argv, envp);
}

int __libc_start_main_glibc_old(main_fn main, int argc, char **argv, init_fn init,
                                void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
GLIBC_OLD(__libc_start_main);
int __wrap___libc_start_main(main_fn main, int argc, char **argv, init_fn init,
                             void (*fini)(void), void (*rtld_fini)(void), void *stack_end);

/* Scrt1.o passes no init and no fini (the executable's destructors run
 * from the loader's _dl_fini in every glibc since 2.26) */
int __wrap___libc_start_main(main_fn main, int argc, char **argv, init_fn init,
                             void (*fini)(void), void (*rtld_fini)(void), void *stack_end)
{
    return __libc_start_main_glibc_old(main, argc, argv, run_constructors, NULL, rtld_fini,
                                       stack_end);
}
