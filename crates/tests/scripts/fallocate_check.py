"""fallocate(2) on a directory (argv[1]) checked against an in-memory copy of the file:
punched holes and zeroed ranges read as zeros, SEEK_HOLE finds them, sizes and errors
are Linux's. Prints 'ok'. Run on the host (ext4, tmpfs), through `cairn run` and on
`cairn mount`; the same answers everywhere."""
import ctypes, errno, os, sys

libc = ctypes.CDLL(None, use_errno=True)
KEEP, PUNCH, ZERO = 1, 2, 16


def fallocate(fd, mode, off, n):
    r = libc.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(n))
    return 0 if r == 0 else ctypes.get_errno()


base = sys.argv[1]
path = os.path.join(base, 'falloc')
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
model = bytearray(bytes(range(1, 256)) * 300)  # 76,500 bytes: 19 blocks and a tail
os.write(fd, model)


def punch(off, n, mode=PUNCH | KEEP):
    assert fallocate(fd, mode, off, n) == 0, (mode, off, n)
    end = min(off + n, len(model))
    if off < end:
        model[off:end] = bytes(end - off)


def zero(off, n, keep):
    assert fallocate(fd, ZERO | (KEEP if keep else 0), off, n) == 0, (off, n)
    end = off + n
    if not keep and end > len(model):
        model.extend(bytes(end - len(model)))
    end = min(end, len(model))
    if off < end:
        model[off:end] = bytes(end - off)


def check(when):
    got = os.pread(fd, len(model) + 100, 0)
    assert os.fstat(fd).st_size == len(model), (when, os.fstat(fd).st_size, len(model))
    if got != bytes(model):
        at = next(i for i, (a, b) in enumerate(zip(got, model)) if a != b)
        raise AssertionError(f'{when}: contents differ at {at}')


punch(4096, 3 * 4096)           # whole blocks 1..4
check('whole blocks')
assert os.lseek(fd, 0, os.SEEK_HOLE) == 4096
assert os.lseek(fd, 4096, os.SEEK_DATA) == 4 * 4096
punch(100, 50)                  # inside block 0
punch(5 * 4096 - 7, 4096 + 20)  # across partial blocks 4, 5, 6
punch(70000, 100000)            # past the end: the size stays
check('partial blocks')
zero(30000, 9000, keep=True)
zero(76000, 10000, keep=False)  # grows the file
zero(90000, 5000, keep=True)    # past the end, size kept
check('zero range')
os.write(fd, b'')
os.pwrite(fd, b'rewritten', 2 * 4096 + 5)  # into a punched block
model[2 * 4096 + 5:2 * 4096 + 14] = b'rewritten'
check('write into a hole')
# Errors, as Linux gives them.
assert fallocate(fd, PUNCH, 0, 10) == errno.EOPNOTSUPP       # PUNCH needs KEEP_SIZE
assert fallocate(fd, PUNCH | KEEP, -1, 10) == errno.EINVAL
assert fallocate(fd, PUNCH | KEEP, 0, 0) == errno.EINVAL
ro = os.open(path, os.O_RDONLY)
assert fallocate(ro, PUNCH | KEEP, 0, 10) == errno.EBADF
os.close(ro)
os.close(fd)
fd = os.open(path, os.O_RDONLY)
check('reopened')
print('ok')
