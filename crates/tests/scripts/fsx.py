"""A randomized file-operation exerciser in the spirit of fsx: random reads, writes,
truncations, mmap reads and writes, fallocate modes, copy_file_range, fsync, and close
and reopen, on one file, each checked against an in-memory copy of the file. Half of
the reads, writes, truncations, fallocates, copies and fsyncs are made through
syscall(2) instead of the C library's wrappers (x86-64 system call numbers), as
programs that bypass the wrappers do. Every read
(pread, mmap) must return the copy's bytes, every size must be the copy's, and the whole
file is compared every 500 operations and at the end.

Usage: fsx.py FILE OPERATIONS SEED. Prints 'ok N' (N operations) or exits non-zero with
the failing operation and the last operations before it.
"""
import ctypes
import mmap
import os
import random
import sys

path, total, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
libc.syscall.restype = ctypes.c_long
SYS = {"pread64": 17, "pwrite64": 18, "fsync": 74, "ftruncate": 77, "fallocate": 285,
       "copy_file_range": 326}
L = ctypes.c_long


def raw(name, *args):
    """syscall(2) with long arguments; the result, or a failure naming the errno."""
    r = libc.syscall(L(SYS[name]), *[L(a) if isinstance(a, int) else a for a in args])
    if r < 0:
        fail(f"syscall({name}): errno {ctypes.get_errno()}")
    return r
KEEP, PUNCH, ZERO = 1, 2, 16
MAX = 1 << 20  # the file stays below 1 MiB
model = bytearray()
history = []


def fail(msg):
    print(f"FAIL after {len(history)} operations: {msg}", file=sys.stderr)
    for h in history[-15:]:
        print("  " + h, file=sys.stderr)
    sys.exit(1)


def reopen(fd):
    if fd is not None:
        os.close(fd)
    return os.open(path, os.O_RDWR)


def check_range(fd, off, n, what):
    if rnd.random() < 0.5:
        buf = ctypes.create_string_buffer(n)
        done = raw("pread64", fd, buf, n, off)
        got = buf.raw[:done]
    else:
        got = os.pread(fd, n, off)
    want = bytes(model[off:off + n])
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        fail(f"{what}: bytes differ at {off + at} (got {len(got)} bytes, want {len(want)})")


def check_size(fd, what):
    size = os.fstat(fd).st_size
    if size != len(model):
        fail(f"{what}: size {size}, want {len(model)}")


def data(n):
    b = rnd.randrange(256)
    return bytes((b + i * 7) & 0xFF for i in range(n)) if n < 64 else os.urandom(n)


fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
for step in range(total):
    op = rnd.choices(
        ["read", "write", "truncate", "mapread", "mapwrite", "falloc", "copy", "fsync", "reopen"],
        [20, 25, 6, 8, 8, 8, 6, 3, 3],
    )[0]
    size = len(model)
    off = rnd.randrange(0, MAX)
    n = rnd.choice([1, 7, 512, 4096, 5000, rnd.randrange(1, 70000)])
    n = min(n, MAX - off)
    if op == "read":
        history.append(f"pread {off} {n}")
        check_range(fd, off, n, "pread")
    elif op == "write":
        if n == 0:
            continue
        buf = data(n)
        if rnd.random() < 0.5:
            history.append(f"syscall pwrite64 {off} {n}")
            done = raw("pwrite64", fd, ctypes.c_char_p(buf), n, off)
        else:
            history.append(f"pwrite {off} {n}")
            done = os.pwrite(fd, buf, off)
        if done != n:
            fail("short write")
        if off > size:
            model.extend(bytes(off - size))
        model[off:off + n] = buf
    elif op == "truncate":
        to = rnd.choice([0, rnd.randrange(0, MAX), size // 2, size + rnd.randrange(1, 9000)])
        to = min(to, MAX)
        if rnd.random() < 0.5:
            history.append(f"syscall ftruncate {to}")
            raw("ftruncate", fd, to)
        else:
            history.append(f"ftruncate {to}")
            os.ftruncate(fd, to)
        if to < size:
            del model[to:]
        else:
            model.extend(bytes(to - size))
    elif op in ("mapread", "mapwrite"):
        if size == 0:
            continue
        start = rnd.randrange(0, size) & ~(mmap.PAGESIZE - 1)
        length = min(size - start, rnd.randrange(1, 300000))
        m = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        a = rnd.randrange(0, length)
        b = min(length, a + rnd.randrange(1, 20000))
        if op == "mapread":
            history.append(f"mmap read {start + a} {b - a}")
            if m[a:b] != bytes(model[start + a:start + b]):
                fail(f"mmap read {start + a} {b - a}: bytes differ")
        else:
            history.append(f"mmap write {start + a} {b - a}")
            buf = data(b - a)
            m[a:b] = buf
            model[start + a:start + b] = buf
            m.flush()
        m.close()
        if op == "mapwrite":
            check_range(fd, start + a, b - a, "pread after an mmap write")
    elif op == "falloc":
        mode = rnd.choice([0, KEEP, PUNCH | KEEP, ZERO, ZERO | KEEP])
        if n == 0:
            continue
        if rnd.random() < 0.5:
            history.append(f"syscall fallocate {mode} {off} {n}")
            raw("fallocate", fd, mode, off, n)
        else:
            history.append(f"fallocate {mode} {off} {n}")
            if libc.fallocate(fd, mode, off, n) != 0:
                fail(f"fallocate {mode} {off} {n}: errno {ctypes.get_errno()}")
        end = off + n
        if mode in (PUNCH | KEEP, ZERO, ZERO | KEEP):
            e = min(end, size)
            if off < e:
                model[off:e] = bytes(e - off)
        if mode in (0, ZERO) and end > len(model):
            model.extend(bytes(end - len(model)))
    elif op == "copy":
        if size == 0:
            continue
        src = rnd.randrange(0, size)
        cnt = min(size - src, rnd.randrange(1, 50000))
        dst = rnd.randrange(0, MAX - cnt)
        if not (dst + cnt <= src or src + cnt <= dst):
            continue  # overlapping ranges of one file are EINVAL
        if rnd.random() < 0.5:
            history.append(f"syscall copy_file_range {src} -> {dst} {cnt}")
            s_off, d_off = ctypes.c_long(src), ctypes.c_long(dst)
            done = raw("copy_file_range", fd, ctypes.byref(s_off), fd, ctypes.byref(d_off), cnt, 0)
        else:
            history.append(f"copy_file_range {src} -> {dst} {cnt}")
            done = os.copy_file_range(fd, fd, cnt, src, dst)
        if done != cnt:
            fail(f"copy_file_range copied {done} of {cnt}")
        chunk = bytes(model[src:src + cnt])
        if dst > len(model):
            model.extend(bytes(dst - len(model)))
        model[dst:dst + cnt] = chunk
    elif op == "fsync":
        if rnd.random() < 0.5:
            history.append("syscall fsync")
            raw("fsync", fd)
        else:
            history.append("fsync")
            os.fsync(fd)
    else:
        history.append("close and reopen")
        fd = reopen(fd)
    check_size(fd, history[-1] if history else op)
    if step % 500 == 499:
        check_range(fd, 0, MAX, "whole file")
fd = reopen(fd)
check_size(fd, "end")
check_range(fd, 0, MAX, "whole file at the end")
print(f"ok {total}")
