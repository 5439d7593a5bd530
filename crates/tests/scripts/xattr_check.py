"""Extended attributes as a program sees them, under the directory argv[1] (on Cairn
through `cairn run` or the FUSE mount). Prints `ok`; any difference is an assertion."""
import ctypes
import errno
import os
import sys

root = sys.argv[1]
p = os.path.join(root, 'xf')


def err(f, *a, **k):
    try:
        f(*a, **k)
    except OSError as e:
        return e.errno
    raise AssertionError(f'{f.__name__}{a} succeeded')


with open(p, 'w') as f:
    f.write('data')
os.setxattr(p, 'user.a', b'1')
os.setxattr(p, 'user.big', b'x' * 65536)
os.setxattr(p, 'user.empty', b'')
assert os.getxattr(p, 'user.a') == b'1'
assert os.getxattr(p, 'user.big') == b'x' * 65536
assert os.getxattr(p, 'user.empty') == b''
assert sorted(os.listxattr(p)) == ['user.a', 'user.big', 'user.empty'], os.listxattr(p)

assert err(os.setxattr, p, 'user.a', b'2', os.XATTR_CREATE) == errno.EEXIST
assert err(os.setxattr, p, 'user.none', b'2', os.XATTR_REPLACE) == errno.ENODATA
assert err(os.getxattr, p, 'user.none') == errno.ENODATA
assert err(os.removexattr, p, 'user.none') == errno.ENODATA
assert err(os.setxattr, p, 'user.huge', b'x' * 65537) == errno.E2BIG
assert err(os.setxattr, p, 'other.name', b'') == errno.EOPNOTSUPP
os.setxattr(p, 'user.a', b'22')
assert os.getxattr(p, 'user.a') == b'22'
os.removexattr(p, 'user.big')
assert sorted(os.listxattr(p)) == ['user.a', 'user.empty']

# Calls on a descriptor.
fd = os.open(p, os.O_RDONLY)
os.setxattr(fd, 'user.fd', b'f')
assert os.getxattr(fd, 'user.fd') == b'f'
assert 'user.fd' in os.listxattr(fd)
os.removexattr(fd, 'user.fd')
os.close(fd)

# Symlinks are followed unless told not to; their own user. attributes are refused.
link = os.path.join(root, 'xl')
os.symlink('xf', link)
assert os.getxattr(link, 'user.a') == b'22'
assert err(os.setxattr, link, 'user.z', b'', follow_symlinks=False) == errno.EPERM
assert err(os.getxattr, link, 'user.a', follow_symlinks=False) == errno.ENODATA
assert os.listxattr(link, follow_symlinks=False) == []

# Directories have them too; hard links share them; a rename keeps them.
d = os.path.join(root, 'xd')
os.mkdir(d)
os.setxattr(d, 'user.dir', b'd')
assert os.listxattr(d) == ['user.dir']
h = os.path.join(root, 'xh')
os.link(p, h)
assert os.getxattr(h, 'user.a') == b'22'
moved = os.path.join(d, 'moved')
os.rename(h, moved)
assert os.getxattr(moved, 'user.a') == b'22'

# A new file under an old file's name starts with none.
q = os.path.join(root, 'xq')
open(q, 'w').close()
os.setxattr(q, 'user.old', b'o')
os.unlink(q)
open(q, 'w').close()
assert os.listxattr(q) == []

# The C library's buffer protocol: a size query, then ERANGE for a short buffer.
libc = ctypes.CDLL(None, use_errno=True)
libc.getxattr.restype = ctypes.c_ssize_t
libc.listxattr.restype = ctypes.c_ssize_t
assert libc.getxattr(p.encode(), b'user.a', None, ctypes.c_size_t(0)) == 2
buf = ctypes.create_string_buffer(1)
assert libc.getxattr(p.encode(), b'user.a', buf, ctypes.c_size_t(1)) == -1
assert ctypes.get_errno() == errno.ERANGE
assert libc.listxattr(p.encode(), None, ctypes.c_size_t(0)) == len(b'user.a\0user.empty\0')
print('ok')
