/* The bodies of execl, execle and execlp for libcairn_preload.so.
 *
 * They are variadic, which stable Rust cannot define, so they live here (the exported
 * symbols are one-jump naked functions in abi_proc.rs): each gathers its arguments into
 * an array on the stack (no allocation: exec may follow vfork, or run in a signal
 * handler) and calls execve/execvp, which resolve to the library's own interposed
 * versions (the preloaded library comes first in symbol lookup), so exec is prepared
 * exactly as for the other exec calls (see abi_proc.rs).
 */
#include <stdarg.h>
#include <stddef.h>

/* Declared here, not from <unistd.h>: glibc marks arg0 nonnull there, which would let
 * the compiler drop the check for an empty argument list. */
int execve(const char *path, char *const argv[], char *const envp[]);
int execvp(const char *file, char *const argv[]);
extern char **environ;

/* Entries argv needs for arg0 and the arguments `ap` (a copy, used up) holds up to and
 * including the terminating NULL. */
static size_t count_args(const char *arg0, va_list ap)
{
    size_t n = 1;
    if (arg0 != NULL) {
        n++;
        while (va_arg(ap, const char *) != NULL)
            n++;
    }
    return n;
}

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

/* In a function whose last named parameter is arg0: declare `argv` (on the stack) with
 * the arguments, and `ap` positioned after their NULL; the caller ends `ap`. */
#define GATHER_ARGS(argv, ap)                                                              \
    va_list ap, count_;                                                                    \
    va_start(ap, arg0);                                                                    \
    va_copy(count_, ap);                                                                   \
    const char *argv[count_args(arg0, count_)];                                            \
    va_end(count_);                                                                        \
    fill_args(argv, arg0, &ap)

__attribute__((visibility("hidden"))) int cairn_execl(const char *path, const char *arg0, ...)
{
    GATHER_ARGS(argv, ap);
    va_end(ap);
    return execve(path, (char *const *)argv, environ);
}

__attribute__((visibility("hidden"))) int cairn_execle(const char *path, const char *arg0, ...)
{
    GATHER_ARGS(argv, ap);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}

__attribute__((visibility("hidden"))) int cairn_execlp(const char *file, const char *arg0, ...)
{
    GATHER_ARGS(argv, ap);
    va_end(ap);
    return execvp(file, (char *const *)argv);
}
