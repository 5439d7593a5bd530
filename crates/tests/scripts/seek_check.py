"""SEEK_DATA and SEEK_HOLE on a sparse file under the directory argv[1] (on Cairn
through `cairn run` or the FUSE mount). Prints `ok`; any difference is an assertion."""
import errno
import os
import sys

MIB = 1 << 20
p = os.path.join(sys.argv[1], 'sparse-seek')
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.pwrite(fd, b'a' * 10, 0)
os.pwrite(fd, b'b' * 4096, MIB)
os.pwrite(fd, b'c' * 100, 3 * MIB + 50)
size = 3 * MIB + 150


def seek(off, whence):
    try:
        return os.lseek(fd, off, whence)
    except OSError as e:
        return errno.errorcode[e.errno]


D, H = os.SEEK_DATA, os.SEEK_HOLE
got = [seek(0, D), seek(0, H), seek(4096, D), seek(MIB, H), seek(MIB + 4096, D),
       seek(3 * MIB, H), seek(size, D), seek(size, H)]
want = [0, 4096, MIB, MIB + 4096, 3 * MIB, size, 'ENXIO', 'ENXIO']
assert got == want, (got, want)
# The position moved to the last answer that succeeded.
assert os.lseek(fd, 0, os.SEEK_CUR) == size
os.close(fd)
print('ok')
