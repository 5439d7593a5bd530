/* File system calls made through syscall(2) instead of the C library's wrappers, in a
 * directory given as argv[1]. Prints one line per step: what it returned (and errno's
 * name on failure), with nothing that differs between file systems (no inode numbers,
 * no times, no device numbers), so that a run on the host and one on Cairn through the
 * shim can be compared line by line. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *ename(int e) {
    switch (e) {
    case ENOENT: return "ENOENT";
    case EEXIST: return "EEXIST";
    case ENOTEMPTY: return "ENOTEMPTY";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EBADF: return "EBADF";
    case EINVAL: return "EINVAL";
    case EAGAIN: return "EAGAIN";
    case EXDEV: return "EXDEV";
    case ELOOP: return "ELOOP";
    case ERANGE: return "ERANGE";
    case ENODATA: return "ENODATA";
    case EACCES: return "EACCES";
    default: return "other";
    }
}

#define R(what, expr)                                                              \
    do {                                                                           \
        errno = 0;                                                                 \
        long r_ = (long)(expr);                                                    \
        if (r_ < 0)                                                                \
            printf("%s -1 %s\n", what, ename(errno));                              \
        else                                                                       \
            printf("%s %ld\n", what, r_);                                          \
    } while (0)

static char P[4096];
static const char *at(const char *name) {
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", P, name);
    return buf[k];
}

static void show_stat(const char *what, long r, struct stat *st) {
    if (r < 0)
        printf("%s -1 %s\n", what, ename(errno));
    else
        printf("%s size=%ld mode=%o nlink=%ld\n", what, (long)st->st_size,
               st->st_mode, (long)st->st_nlink);
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    snprintf(P, sizeof P, "%s", argv[1]);
    struct stat st;
    char buf[256];

    /* Create, write, read, seek. */
    int fd = syscall(SYS_openat, AT_FDCWD, at("f"), O_RDWR | O_CREAT | O_EXCL, 0640);
    printf("openat %s\n", fd >= 0 ? "ok" : ename(errno));
    R("openat excl", syscall(SYS_openat, AT_FDCWD, at("f"), O_RDWR | O_CREAT | O_EXCL, 0640));
    R("write", syscall(SYS_write, fd, "hello world", 11));
    R("pwrite64", syscall(SYS_pwrite64, fd, "HELLO", 5, 0));
    struct iovec iov[2] = {{"-ab", 3}, {"cd-", 3}};
    R("writev", syscall(SYS_writev, fd, iov, 2));
    R("pwritev2", syscall(SYS_pwritev2, fd, iov, 1, 20, 0, 0));
    R("lseek", syscall(SYS_lseek, fd, 0, SEEK_SET));
    memset(buf, 0, sizeof buf);
    R("read", syscall(SYS_read, fd, buf, 100));
    printf("data %s|%s\n", buf, buf + 18);
    memset(buf, 0, sizeof buf);
    R("pread64", syscall(SYS_pread64, fd, buf, 5, 6));
    printf("data %s\n", buf);
    char a[4] = {0}, b[4] = {0};
    struct iovec riov[2] = {{a, 3}, {b, 3}};
    R("preadv", syscall(SYS_preadv, fd, riov, 2, 11, 0));
    printf("data %s %s\n", a, b);
    R("fstat", syscall(SYS_fstat, fd, &st));
    show_stat("fstat", 0, &st);
    R("ftruncate", syscall(SYS_ftruncate, fd, 8));
    show_stat("stat", syscall(SYS_stat, at("f"), &st), &st);
    R("fallocate", syscall(SYS_fallocate, fd, 0, 0, 10000));
    show_stat("newfstatat", syscall(SYS_newfstatat, AT_FDCWD, at("f"), &st, 0), &st);
    struct statx sx;
    long r = syscall(SYS_statx, AT_FDCWD, at("f"), 0, STATX_BASIC_STATS, &sx);
    printf("statx %ld size=%lld mode=%o\n", r, (long long)sx.stx_size, sx.stx_mode);
    R("truncate", syscall(SYS_truncate, at("f"), 6));
    R("fsync", syscall(SYS_fsync, fd));
    R("fdatasync", syscall(SYS_fdatasync, fd));

    /* Descriptors. */
    int d = syscall(SYS_dup, fd);
    printf("dup %s\n", d >= 0 ? "ok" : ename(errno));
    R("dup3", syscall(SYS_dup3, fd, d, O_CLOEXEC) == d);
    R("fcntl getfl", syscall(SYS_fcntl, d, F_GETFL) & O_ACCMODE);
    R("fcntl getfd", syscall(SYS_fcntl, d, F_GETFD));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    R("fcntl setlk", syscall(SYS_fcntl, fd, F_SETLK, &fl));
    R("flock", syscall(SYS_flock, d, LOCK_EX | LOCK_NB));
    R("lseek shared", syscall(SYS_lseek, d, 0, SEEK_CUR) == syscall(SYS_lseek, fd, 0, SEEK_CUR));
    R("close dup", syscall(SYS_close, d));
    R("close again", syscall(SYS_close, d));

    /* Copies (fsx calls copy_file_range this way). */
    int g = syscall(SYS_openat, AT_FDCWD, at("g"), O_RDWR | O_CREAT | O_TRUNC, 0600);
    loff_t in = 0, out = 2;
    R("copy_file_range", syscall(SYS_copy_file_range, fd, &in, g, &out, 6, 0));
    printf("offsets %ld %ld\n", (long)in, (long)out);
    off_t so = 1;
    R("sendfile", syscall(SYS_sendfile, g, fd, &so, 3));
    memset(buf, 0, sizeof buf);
    R("pread g", syscall(SYS_pread64, g, buf, 100, 0));
    for (int i = 0; i < 11; i++)
        if (!buf[i])
            buf[i] = '0';
    printf("data %s\n", buf);

    /* A mapping of the file. */
    char *m = (char *)syscall(SYS_mmap, 0, 4096, PROT_READ, MAP_SHARED, fd, 0);
    printf("mmap %s %.6s\n", m == MAP_FAILED ? ename(errno) : "ok", m == MAP_FAILED ? "" : m);
    if (m != MAP_FAILED)
        R("munmap", syscall(SYS_munmap, m, 4096));
    R("close", syscall(SYS_close, fd));
    R("close g", syscall(SYS_close, g));

    /* Names. */
    R("mkdir", syscall(SYS_mkdir, at("d"), 0755));
    R("mkdir again", syscall(SYS_mkdir, at("d"), 0755));
    R("mkdirat", syscall(SYS_mkdirat, AT_FDCWD, at("d/e"), 0700));
    R("rename", syscall(SYS_rename, at("g"), at("d/g")));
    R("renameat2 noreplace", syscall(SYS_renameat2, AT_FDCWD, at("f"), AT_FDCWD, at("d/g"), RENAME_NOREPLACE));
    R("link", syscall(SYS_link, at("f"), at("d/f2")));
    R("linkat", syscall(SYS_linkat, AT_FDCWD, at("f"), AT_FDCWD, at("f3"), 0));
    show_stat("lstat", syscall(SYS_lstat, at("f"), &st), &st);
    R("symlink", syscall(SYS_symlink, "d/g", at("s")));
    R("symlinkat", syscall(SYS_symlinkat, "nowhere", AT_FDCWD, at("dangling")));
    memset(buf, 0, sizeof buf);
    R("readlink", syscall(SYS_readlink, at("s"), buf, sizeof buf));
    printf("target %s\n", buf);
    R("readlinkat", syscall(SYS_readlinkat, AT_FDCWD, at("dangling"), buf, 3));
    show_stat("stat through link", syscall(SYS_stat, at("s"), &st), &st);
    R("stat dangling", syscall(SYS_stat, at("dangling"), &st));
    R("chmod", syscall(SYS_chmod, at("f"), 0604));
    R("fchmodat", syscall(SYS_fchmodat, AT_FDCWD, at("d/g"), 0711));
    show_stat("stat chmod", syscall(SYS_stat, at("f"), &st), &st);
    R("access", syscall(SYS_access, at("f"), R_OK));
    R("access missing", syscall(SYS_access, at("missing"), F_OK));
    R("faccessat", syscall(SYS_faccessat, AT_FDCWD, at("d"), X_OK));
    R("faccessat2", syscall(SYS_faccessat2, AT_FDCWD, at("dangling"), F_OK, AT_SYMLINK_NOFOLLOW));
    struct timespec ts[2] = {{1000000, 0}, {2000000, 5}};
    R("utimensat", syscall(SYS_utimensat, AT_FDCWD, at("f"), ts, 0));
    syscall(SYS_stat, at("f"), &st);
    printf("mtime %ld.%ld\n", (long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    R("rmdir nonempty", syscall(SYS_rmdir, at("d")));
    R("unlink", syscall(SYS_unlink, at("f3")));
    R("unlinkat dir", syscall(SYS_unlinkat, AT_FDCWD, at("d/e"), AT_REMOVEDIR));
    R("unlink missing", syscall(SYS_unlink, at("f3")));

    /* Directory listing. */
    int dfd = syscall(SYS_openat, AT_FDCWD, at("d"), O_RDONLY | O_DIRECTORY);
    char dents[4096];
    long n = syscall(SYS_getdents64, dfd, dents, sizeof dents);
    char names[16][64];
    int k = 0;
    for (long off = 0; off < n && k < 16;) {
        struct dirent64 *de = (struct dirent64 *)(dents + off);
        snprintf(names[k++], 64, "%s", de->d_name);
        off += de->d_reclen;
    }
    qsort(names, k, 64, (int (*)(const void *, const void *))strcmp);
    printf("getdents64");
    for (int i = 0; i < k; i++)
        printf(" %s", names[i]);
    printf("\n");

    /* The current directory. */
    R("fchdir", syscall(SYS_fchdir, dfd));
    int h = syscall(SYS_open, "g", O_RDONLY);
    printf("open relative %s\n", h >= 0 ? "ok" : ename(errno));
    syscall(SYS_close, h);
    char cwd[4096];
    long len = syscall(SYS_getcwd, cwd, sizeof cwd);
    printf("getcwd %s\n", len == (long)strlen(cwd) + 1 && len > 2 && !strcmp(cwd + len - 3, "/d") ? "ok" : "wrong");
    R("chdir", syscall(SYS_chdir, P));
    R("close dir", syscall(SYS_close, dfd));
    R("unlink f", syscall(SYS_unlink, at("f")));
    return 0;
}
