"""O_TMPFILE in the directory argv[1]/tdir: an unnamed file, named later through
/proc/self/fd with linkat(AT_SYMLINK_FOLLOW); O_EXCL ones never get a name; Linux's
errors. Prints what it sees: the same on the host and through `cairn run`."""
import os, errno, stat, ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
def link(src, dst):
    if libc.linkat(-100, src.encode(), -100, dst.encode(), 0x400) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))

d = sys.argv[1] + '/tdir'
os.makedirs(d, exist_ok=True)
fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o640)
os.write(fd, b'unnamed data')
st = os.fstat(fd); print('nlink', st.st_nlink, oct(stat.S_IMODE(st.st_mode)), stat.S_ISREG(st.st_mode))
print(sorted(os.listdir(d)))
link(f'/proc/self/fd/{fd}', d + '/named')
print(sorted(os.listdir(d)), open(d + '/named').read(), os.fstat(fd).st_nlink)
os.close(fd)
print(open(d + '/named').read())
# Named with AT_EMPTY_PATH.
fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o644)
os.write(fd, b'second')
r = libc.linkat(fd, b'', -100, (d + '/second').encode(), 0x1000)
print('empty path', r, open(d + '/second').read())
os.close(fd)
# Not linked: gone at close. O_EXCL: not linkable.
fd = os.open(d, os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
os.write(fd, b'x' * 100000)
try:
    link(f'/proc/self/fd/{fd}', d + '/nope')
except OSError as e:
    print('excl', errno.errorcode[e.errno])
os.close(fd)
try:
    os.open(d, os.O_TMPFILE | os.O_RDONLY)
except OSError as e:
    print('rdonly', errno.errorcode[e.errno])
try:
    os.open(d + '/named', os.O_TMPFILE | os.O_RDWR)
except OSError as e:
    print('notdir', errno.errorcode[e.errno])
print(sorted(os.listdir(d)))
