/* The bodies of execl, execle and execlp for libcairn_preload.so.
 *
 * They are variadic, which stable Rust cannot define, so they live here (the exported
 * symbols are one-jump naked functions in abi_proc.rs): each gathers
 * its arguments into an array on the stack (no allocation: exec may follow vfork, or
 * run in a signal handler) and calls execve/execvp, which resolve to the library's own
 * interposed versions (the preloaded library comes first in symbol lookup), so exec
 * is prepared exactly as for the other exec calls (see abi_proc.rs).
 */
#include <stdarg.h>
#include <stddef.h>

/* Declared here, not from <unistd.h>: glibc marks arg0 nonnull there, which would let
 * the compiler drop the check for an empty argument list. */
int execve(const char *path, char *const argv[], char *const envp[]);
int execvp(const char *file, char *const argv[]);
extern char **environ;

/* The number of arguments from arg0 up to and including the terminating NULL. */
#define COUNT_ARGS(arg0, last, n)                                                       \
    do {                                                                                 \
        va_list c_;                                                                      \
        va_start(c_, last);                                                              \
        n = 1;                                                                           \
        if (arg0 != NULL)                                                                \
            while (va_arg(c_, const char *) != NULL)                                     \
                n++;                                                                     \
        va_end(c_);                                                                      \
        n++;                                                                             \
    } while (0)

/* argv[0] = arg0, then the variadic arguments up to and including NULL; *ap is left
 * just after that NULL (where execle's envp is). */
static void fill_args(const char **argv, const char *arg0, va_list *ap)
{
    size_t i = 0;
    argv[i++] = arg0;
    if (arg0 == NULL)
        return;
    const char *a;
    do {
        a = va_arg(*ap, const char *);
        argv[i++] = a;
    } while (a != NULL);
}

__attribute__((visibility("hidden"))) int cairn_execl(const char *path, const char *arg0, ...)
{
    size_t n;
    COUNT_ARGS(arg0, arg0, n);
    const char *argv[n];
    va_list ap;
    va_start(ap, arg0);
    fill_args(argv, arg0, &ap);
    va_end(ap);
    return execve(path, (char *const *)argv, environ);
}

__attribute__((visibility("hidden"))) int cairn_execle(const char *path, const char *arg0, ...)
{
    size_t n;
    COUNT_ARGS(arg0, arg0, n);
    const char *argv[n];
    va_list ap;
    va_start(ap, arg0);
    fill_args(argv, arg0, &ap);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}

__attribute__((visibility("hidden"))) int cairn_execlp(const char *file, const char *arg0, ...)
{
    size_t n;
    COUNT_ARGS(arg0, arg0, n);
    const char *argv[n];
    va_list ap;
    va_start(ap, arg0);
    fill_args(argv, arg0, &ap);
    va_end(ap);
    return execvp(file, (char *const *)argv);
}
