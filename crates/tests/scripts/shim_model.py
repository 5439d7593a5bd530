"""Random POSIX call sequences, applied to a host directory (the reference: Linux) and
to a directory under /cairn (Cairn through the LD_PRELOAD library), in one process
running under the library. Every outcome (return value or errno) and every observable
(data, sizes, kinds, modes, listings, offsets) must agree.

Usage: shim_model.py SEED STEPS REFERENCE_DIR CAIRN_DIR
"""
import errno
import os
import random
import stat
import sys

seed, steps = int(sys.argv[1]), int(sys.argv[2])
roots = [sys.argv[3], sys.argv[4]]
rnd = random.Random(seed)
NAMES = ["a", "b", "c", "d", "d/e", "d/f", "g", "g/h", "d/x/y"]
FLAGS = [
    os.O_RDONLY,
    os.O_WRONLY | os.O_CREAT,
    os.O_RDWR | os.O_CREAT,
    os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    os.O_RDWR | os.O_CREAT | os.O_EXCL,
    os.O_RDONLY | os.O_DIRECTORY,
    os.O_RDWR | os.O_APPEND,
    os.O_RDONLY | os.O_NOFOLLOW,
    os.O_RDONLY | os.O_CREAT,
    os.O_WRONLY | os.O_DIRECTORY,
]
handles = [dict(), dict()]  # handle id -> descriptor, per side
dir_handles = set()  # handles of directories (their offsets are each system's own)
next_handle = 0


def run(f):
    try:
        return ("ok", f())
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, e.errno))


def kind(m):
    return "dir" if stat.S_ISDIR(m) else "link" if stat.S_ISLNK(m) else "file"


def describe(st):
    k = kind(st.st_mode)
    # Directory sizes and link counts are the file system's own business.
    if k == "file":
        return (k, st.st_size, oct(st.st_mode & 0o7777), st.st_nlink)
    if k == "link":
        return (k, st.st_size)
    return (k, oct(st.st_mode & 0o7777))


def xattrs(p):
    """The user. attributes of p itself (a host may keep others)."""
    names = sorted(n for n in os.listxattr(p, follow_symlinks=False) if n.startswith("user."))
    return [(n, os.getxattr(p, n, follow_symlinks=False)) for n in names]


def tree(root):
    out = []
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = f.read()
            elif stat.S_ISLNK(st.st_mode):
                data = os.readlink(p)
            out.append((os.path.normpath(os.path.join(rel, name)), describe(st), data,
                        xattrs(p)))
        dirs.sort()
    return sorted(out)


def data():
    return bytes([rnd.randrange(256)]) * rnd.choice([1, 7, 100, 4096, 5000])


for step in range(steps):
    op = rnd.choice(
        ["open"] * 4 + ["close", "write", "write", "pwrite", "read", "pread", "lseek",
         "ftruncate", "fstat", "stat", "lstat", "mkdir", "rmdir", "unlink", "rename",
         "link", "symlink", "readlink", "listdir", "truncate", "chmod", "access", "dup",
         "fsync", "setxattr", "setxattr", "getxattr", "listxattr", "removexattr",
         "fsetxattr", "fgetxattr"]
    )
    p, q = rnd.choice(NAMES), rnd.choice(NAMES)
    h = rnd.choice(sorted(handles[0])) if handles[0] else None
    args = dict(
        flags=rnd.choice(FLAGS),
        mode=rnd.choice([0o644, 0o600, 0o755]),
        data=data(),
        off=rnd.choice([0, 1, 100, 4095, 4096, 9000]),
        n=rnd.choice([0, 1, 10, 4096, 10000]),
        whence=rnd.choice([os.SEEK_SET, os.SEEK_CUR, os.SEEK_END]),
        # Relative targets that stay inside the root wherever the link is made (a
        # target above the root would name different files on the two sides).
        target=rnd.choice(["a", "d", "nowhere", "d/../a", "b"]),
        amode=rnd.choice([os.F_OK, os.R_OK, os.W_OK, os.X_OK]),
        xname=rnd.choice(["user.a", "user.b", "trusted.t", "other.x"]),
        xflags=rnd.choice([0, 0, os.XATTR_CREATE, os.XATTR_REPLACE]),
        follow=rnd.choice([True, True, False]),
    )
    outs = []
    for side, root in enumerate(roots):
        P, Q = os.path.join(root, p), os.path.join(root, q)
        fd = handles[side].get(h)
        a = args
        f = {
            "open": lambda: os.open(P, a["flags"], a["mode"]),
            "close": lambda: os.close(fd),
            "write": lambda: os.write(fd, a["data"]),
            "pwrite": lambda: os.pwrite(fd, a["data"], a["off"]),
            "read": lambda: os.read(fd, a["n"]),
            "pread": lambda: os.pread(fd, a["n"], a["off"]),
            "lseek": lambda: os.lseek(fd, a["off"], a["whence"]),
            "ftruncate": lambda: os.ftruncate(fd, a["off"]),
            "fstat": lambda: describe(os.fstat(fd)),
            "stat": lambda: describe(os.stat(P)),
            "lstat": lambda: describe(os.lstat(P)),
            "mkdir": lambda: os.mkdir(P, a["mode"]),
            "rmdir": lambda: os.rmdir(P),
            "unlink": lambda: os.unlink(P),
            "rename": lambda: os.rename(P, Q),
            "link": lambda: os.link(P, Q),
            "symlink": lambda: os.symlink(a["target"], P),
            "readlink": lambda: os.readlink(P),
            "listdir": lambda: sorted(os.listdir(P)),
            "truncate": lambda: os.truncate(P, a["off"]),
            "chmod": lambda: os.chmod(P, a["mode"]),
            "access": lambda: os.access(P, a["amode"]),
            "dup": lambda: os.dup(fd),
            "fsync": lambda: os.fsync(fd),
            "setxattr": lambda: os.setxattr(P, a["xname"], a["data"][:200], a["xflags"],
                                            follow_symlinks=a["follow"]),
            "getxattr": lambda: os.getxattr(P, a["xname"], follow_symlinks=a["follow"]),
            "listxattr": lambda: sorted(os.listxattr(P, follow_symlinks=a["follow"])),
            "removexattr": lambda: os.removexattr(P, a["xname"],
                                                  follow_symlinks=a["follow"]),
            "fsetxattr": lambda: os.setxattr(fd, a["xname"], a["data"][:200], a["xflags"]),
            "fgetxattr": lambda: os.getxattr(fd, a["xname"]),
        }[op]
        if fd is None and op in ("close", "write", "pwrite", "read", "pread", "lseek",
                                 "ftruncate", "fstat", "dup", "fsync", "fsetxattr",
                                 "fgetxattr"):
            outs.append(("skip",))
            continue
        if h in dir_handles and op == "lseek" and a["whence"] != os.SEEK_SET:
            outs.append(("skip",))
            continue
        if h in dir_handles and op in ("fsetxattr", "fgetxattr"):
            # A directory removed while open loses its attributes at once on Cairn
            # (SHIM.md, "Limits"); Linux keeps them until the last close.
            outs.append(("skip",))
            continue
        r = run(f)
        if op == "close" and r[0] == "ok":
            del handles[side][h]
        if op in ("open", "dup") and r[0] == "ok":
            handles[side][next_handle] = r[1]
            if stat.S_ISDIR(os.fstat(r[1]).st_mode):
                dir_handles.add(next_handle)
            r = ("ok", "handle")
        outs.append(r)
    if op in ("open", "dup") and outs[0] == ("ok", "handle"):
        next_handle += 1
    if outs[0] != outs[1]:
        print(f"step {step}: {op}({p!r}, {q!r}, handle {h}, {args['flags']:#o}, off "
              f"{args['off']}, whence {args['whence']}): linux {outs[0]} cairn {outs[1]}")
        sys.exit(1)
    if step % 50 == 49 or step == steps - 1:
        t0, t1 = tree(roots[0]), tree(roots[1])
        if t0 != t1:
            print(f"after step {step}: trees differ:\nlinux {t0}\ncairn {t1}")
            sys.exit(1)
print("ok", steps)
