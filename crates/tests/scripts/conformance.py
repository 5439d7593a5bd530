"""POSIX conformance checks on a directory (argv[1], empty, writable by root), printed as a
transcript: one line per check with its outcome (OK, an errno name, or what changed).
Run it on a host directory and on Cairn (through `cairn run` and on `cairn mount`) and
compare the transcripts: every difference is a divergence from Linux. Needs root (it
checks permissions as uid/gid 1000 and 1001 in child processes).

Covered: error paths (ENAMETOOLONG, ELOOP, ENOTEMPTY, EISDIR, ENOTDIR, EEXIST, EINVAL,
ENOENT, EBUSY, EXDEV; EMLINK takes 65,000 links: crates/libfs/tests/api.rs checks it), open flag combinations, which calls change atime/mtime/ctime of the file and
of its directory, permission checks as other users (read, write, create, remove, chmod,
chown, sticky and setgid directories), and *at calls with directory descriptors.
"""
import errno
import os
import stat
import sys
import time

root = sys.argv[1]
out = []


def p(*parts):
    return os.path.join(root, *parts)


def res(f):
    try:
        r = f()
        return "OK" if r is None or isinstance(r, int) else f"OK {r}"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def check(name, f):
    out.append(f"{name}: {res(f)}")


def touch(path, mode=0o644):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, mode))


# ---- error paths ----------------------------------------------------------------------
os.mkdir(p("d"))
touch(p("d", "f"))
os.symlink("loop2", p("loop1"))
os.symlink("loop1", p("loop2"))
os.symlink("missing", p("dangling"))
check("name of 255 bytes", lambda: touch(p("n" * 255)))
check("name of 256 bytes", lambda: touch(p("n" * 256)))
check("path over PATH_MAX", lambda: os.stat(root + "/" + "a/" * 2100))
check("symlink loop", lambda: os.stat(p("loop1")))
check("lstat of a loop", lambda: os.lstat(p("loop1")) and None)
check("dangling symlink", lambda: os.stat(p("dangling")))
check("rmdir non-empty", lambda: os.rmdir(p("d")))
check("rmdir a file", lambda: os.rmdir(p("d", "f")))
check("unlink a directory", lambda: os.unlink(p("d")))
check("open a directory for writing", lambda: os.open(p("d"), os.O_WRONLY))
check("path through a file", lambda: os.stat(p("d", "f", "x")))
check("mkdir existing", lambda: os.mkdir(p("d")))
check("mkdir with a trailing slash", lambda: os.mkdir(p("e") + "/"))
check("rename a directory into itself", lambda: os.rename(p("d"), p("d", "sub")))
check("rename a directory over a file", lambda: os.rename(p("e"), p("d", "f")))
check("rename a file over a directory", lambda: os.rename(p("d", "f"), p("e")))
check("link to a directory", lambda: os.link(p("d"), p("dl")))
check("readlink of a file", lambda: os.readlink(p("d", "f")))
check("symlink over existing", lambda: os.symlink("x", p("d", "f")))
check("truncate a directory", lambda: os.truncate(p("d"), 0))
check("negative truncate", lambda: os.truncate(p("d", "f"), -1))
check("rename . ", lambda: os.rename(p("d", "."), p("z")))
other_fs = f"/dev/shm/cairn-conformance-{os.getpid()}"
check("rename to another file system", lambda: os.rename(p("d", "f"), other_fs))
check("link to another file system", lambda: os.link(p("d", "f"), other_fs))

# ---- open flags -----------------------------------------------------------------------
os.symlink("d/f", p("lf"))
touch(p("g"))
with open(p("g"), "w") as fh:
    fh.write("content")
flags = {
    "O_CREAT|O_EXCL existing": (p("g"), os.O_WRONLY | os.O_CREAT | os.O_EXCL),
    "O_CREAT|O_EXCL on a symlink": (p("lf"), os.O_WRONLY | os.O_CREAT | os.O_EXCL),
    "O_NOFOLLOW on a symlink": (p("lf"), os.O_RDONLY | os.O_NOFOLLOW),
    "O_DIRECTORY on a file": (p("g"), os.O_RDONLY | os.O_DIRECTORY),
    "O_DIRECTORY on a directory": (p("d"), os.O_RDONLY | os.O_DIRECTORY),
    "O_CREAT on a directory": (p("d"), os.O_RDONLY | os.O_CREAT),
    "O_RDWR on a directory": (p("d"), os.O_RDWR),
    "O_CREAT with a trailing slash": (p("new") + "/", os.O_WRONLY | os.O_CREAT),
    "O_PATH on a file": (p("g"), os.O_PATH),
    "O_NOFOLLOW|O_PATH on a symlink": (p("lf"), os.O_PATH | os.O_NOFOLLOW),
}
for name, (path, fl) in flags.items():
    def opener(path=path, fl=fl):
        fd = os.open(path, fl, 0o644)
        os.close(fd)
    check(f"open {name}", opener)
check("O_TRUNC|O_RDONLY truncates", lambda: (os.close(os.open(p("g"), os.O_RDONLY | os.O_TRUNC)), os.stat(p("g")).st_size)[1])

# ---- timestamps -----------------------------------------------------------------------
def times(path):
    st = os.lstat(path)
    return (st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns)


def changed(before, after):
    return "".join(n for n, a, b in zip("amc", before, after) if a != b) or "-"


def timed(name, f, *paths):
    """Which times of each path changed; a path may be (before, after) for a rename."""
    paths = [x if isinstance(x, tuple) else (x, x) for x in paths]
    before = [times(b) for b, _ in paths]
    time.sleep(0.02)
    f()
    after = [times(a) for _, a in paths]
    out.append(f"times {name}: " + " ".join(changed(b, a) for b, a in zip(before, after)))


os.mkdir(p("t"))
touch(p("t", "a"))
timed("create (dir)", lambda: touch(p("t", "b")), p("t"))
timed("write (file)", lambda: open(p("t", "a"), "a").write("x"), p("t", "a"))
timed("truncate (file)", lambda: os.truncate(p("t", "a"), 0), p("t", "a"))
timed("chmod (file)", lambda: os.chmod(p("t", "a"), 0o600), p("t", "a"))
timed("chown (file)", lambda: os.chown(p("t", "a"), 0, 0), p("t", "a"))
timed("link (file, dir)", lambda: os.link(p("t", "a"), p("t", "a2")), p("t", "a"), p("t"))
timed("unlink one link (file, dir)", lambda: os.unlink(p("t", "a2")), p("t", "a"), p("t"))
timed("rename (file, dir)", lambda: os.rename(p("t", "b"), p("t", "c")), (p("t", "b"), p("t", "c")), p("t"))
timed("utime (file)", lambda: os.utime(p("t", "a"), (1, 2)), p("t", "a"))
timed("mkdir (dir)", lambda: os.mkdir(p("t", "s")), p("t"))
timed("symlink (dir)", lambda: os.symlink("a", p("t", "l")), p("t"))
timed("setxattr (file)", lambda: os.setxattr(p("t", "a"), "user.k", b"v"), p("t", "a"))

# ---- *at calls with directory descriptors ---------------------------------------------
dfd = os.open(p("t"), os.O_RDONLY | os.O_DIRECTORY)
pfd = os.open(p("t"), os.O_PATH | os.O_DIRECTORY)
ffd = os.open(p("t", "a"), os.O_RDONLY)
check("stat at a dir fd", lambda: os.stat("a", dir_fd=dfd).st_size)
check("stat at an O_PATH dir fd", lambda: os.stat("a", dir_fd=pfd).st_size)
check("stat at a file fd", lambda: os.stat("a", dir_fd=ffd) and None)
check("mkdir at a dir fd", lambda: os.mkdir("m", dir_fd=dfd))
check("unlink at an O_PATH dir fd", lambda: os.unlink("c", dir_fd=pfd))
check("rename between dir fds", lambda: os.rename("l", "l2", src_dir_fd=dfd, dst_dir_fd=pfd))
check("open .. at a dir fd", lambda: os.close(os.open("..", os.O_RDONLY, dir_fd=dfd)))
check("readlink at a dir fd", lambda: os.readlink("l2", dir_fd=dfd))
check("stat empty path, no flag", lambda: os.stat("", dir_fd=dfd) and None)
for fd in (dfd, pfd, ffd):
    os.close(fd)

# ---- permissions as other users -------------------------------------------------------
for d, mode in (("perm", 0o755), ("sticky", 0o1777), ("sgid", 0o2777), ("open", 0o777)):
    os.mkdir(p(d))
    os.chmod(p(d), mode)  # not the umask's
touch(p("perm", "secret"), 0o600)
touch(p("perm", "public"), 0o644)
os.chmod(p("perm", "public"), 0o644)
os.chown(p("sgid"), 0, 4242)
os.chmod(p("sgid"), 0o2777)


def as_user(uid, gid, name, f):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            # Supplementary groups from CONFORMANCE_GROUPS (a store's trusted group,
            # so that the users may use it through the LD_PRELOAD library).
            extra = os.environ.get("CONFORMANCE_GROUPS", "")
            os.setgroups([int(g) for g in extra.split(",") if g])
            os.setgid(gid)
            os.setuid(uid)
            msg = res(f)
        except BaseException as e:  # noqa
            msg = f"crash {e!r}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    msg = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    out.append(f"uid {uid}: {name}: {msg}")


as_user(1000, 1000, "read a 0600 root file", lambda: open(p("perm", "secret")).read())
as_user(1000, 1000, "read a 0644 root file", lambda: open(p("perm", "public")).read())
as_user(1000, 1000, "write a 0644 root file", lambda: open(p("perm", "public"), "w").write("x"))
as_user(1000, 1000, "create in a 0755 root dir", lambda: touch(p("perm", "mine")))
as_user(1000, 1000, "unlink in a 0755 root dir", lambda: os.unlink(p("perm", "public")))
as_user(1000, 1000, "chmod a root file", lambda: os.chmod(p("perm", "public"), 0o666))
as_user(1000, 1000, "chown a root file", lambda: os.chown(p("perm", "public"), 1000, 1000))
as_user(1000, 1000, "create in the sticky dir", lambda: touch(p("sticky", "u1000")))
as_user(1001, 1001, "unlink another's file in the sticky dir", lambda: os.unlink(p("sticky", "u1000")))
as_user(1001, 1001, "rename another's file in the sticky dir", lambda: os.rename(p("sticky", "u1000"), p("sticky", "x")))
as_user(1000, 1000, "unlink own file in the sticky dir", lambda: os.unlink(p("sticky", "u1000")))
as_user(1000, 1000, "gid of a file in a setgid dir", lambda: (touch(p("sgid", "f")), os.stat(p("sgid", "f")).st_gid)[1])
as_user(1000, 1000, "mode of a dir in a setgid dir", lambda: (os.mkdir(p("sgid", "sub")), oct(os.stat(p("sgid", "sub")).st_mode & 0o7777))[1])
as_user(1000, 1000, "chmod own file setgid, other group", lambda: (touch(p("open", "sg")), os.chmod(p("open", "sg"), 0o2755), oct(os.stat(p("open", "sg")).st_mode & 0o7777))[2])
as_user(1000, 1000, "chgrp own file to a group not in", lambda: os.chown(p("open", "sg"), -1, 4242))
as_user(1000, 1000, "utime of a root file to now", lambda: os.utime(p("perm", "public")))
as_user(1000, 1000, "access W of a root file", lambda: os.access(p("perm", "public"), os.W_OK) and None or "denied")
# A write or truncate by an unprivileged writer clears setuid, and setgid of a
# group-executable file (Linux's file_remove_privs); root's writes keep them.
for name, mode in (("suid-gx", 0o6777), ("suid-nogx", 0o6767), ("suid-trunc", 0o6777), ("suid-root", 0o6777)):
    touch(p("open", name))
    os.chmod(p("open", name), mode)
as_user(1000, 1000, "mode after writing a 06777 root file", lambda: (open(p("open", "suid-gx"), "r+").write("x"), oct(os.stat(p("open", "suid-gx")).st_mode & 0o7777))[1])
as_user(1000, 1000, "mode after writing a 06767 root file", lambda: (open(p("open", "suid-nogx"), "r+").write("x"), oct(os.stat(p("open", "suid-nogx")).st_mode & 0o7777))[1])
as_user(1000, 1000, "mode after truncating a 06777 root file", lambda: (os.truncate(p("open", "suid-trunc"), 3), oct(os.stat(p("open", "suid-trunc")).st_mode & 0o7777))[1])
open(p("open", "suid-root"), "r+").write("x")
check("mode after root writes a 06777 file", lambda: oct(os.stat(p("open", "suid-root")).st_mode & 0o7777))
os.chmod(p("t"), 0o700)
as_user(1000, 1000, "stat through a 0700 root dir", lambda: os.stat(p("t", "a")) and None)
as_user(1000, 1000, "list a 0700 root dir", lambda: os.listdir(p("t")) and None)
os.chmod(p("t"), 0o755)

print("\n".join(out))
