"""A root process that drops to another user and goes on using files in a directory
given as argv[1]: what it may and may not do must be what Linux allows the new user.
Prints one line per step (the result or the errno's name), nothing that differs between
file systems, so that a run on the host and one through the shim compare line by line."""
import errno
import mmap
import os
import sys

d = sys.argv[1]
p = lambda *n: os.path.join(d, *n)


def step(what, f):
    try:
        r = f()
        print(what, 'ok' if r is None else r)
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, e.errno))


# As root: a tree with owners and modes.
os.mkdir(p('open'), 0o777)
os.chmod(p('open'), 0o777)
os.mkdir(p('closed'), 0o700)
os.mkdir(p('sticky'), 0o777)
os.chmod(p('sticky'), 0o1777)
with open(p('rootfile'), 'w') as f:
    f.write('root data')
os.chmod(p('rootfile'), 0o644)
with open(p('secret'), 'w') as f:
    f.write('secret')
os.chmod(p('secret'), 0o600)
with open(p('sticky', 'roots'), 'w') as f:
    f.write('x')
held = open(p('secret'))  # opened as root: stays usable, as on Linux
os.chmod(d, 0o755)

os.setgroups([])
os.setgid(65534)
os.setuid(65534)
print('ids', os.getuid(), os.geteuid(), os.getgid(), os.getgroups())

step('read rootfile', lambda: open(p('rootfile')).read())
step('read secret', lambda: open(p('secret')).read())
step('read held', lambda: held.read())
step('write rootfile', lambda: open(p('rootfile'), 'a').write('y'))
step('create in top', lambda: open(p('new'), 'w').close())
step('create in open', lambda: open(p('open', 'mine'), 'w').write('mine'))
step('stat mine', lambda: (os.stat(p('open', 'mine')).st_uid, os.stat(p('open', 'mine')).st_gid))
step('list closed', lambda: os.listdir(p('closed')))
step('mkdir in closed', lambda: os.mkdir(p('closed', 'x')))
step('chmod rootfile', lambda: os.chmod(p('rootfile'), 0o666))
step('chmod mine', lambda: os.chmod(p('open', 'mine'), 0o600))
step('chown mine', lambda: os.chown(p('open', 'mine'), 0, 0))
step('unlink sticky roots', lambda: os.unlink(p('sticky', 'roots')))
step('create in sticky', lambda: open(p('sticky', 'nobodys'), 'w').close())
step('unlink sticky nobodys', lambda: os.unlink(p('sticky', 'nobodys')))
step('rename rootfile', lambda: os.rename(p('rootfile'), p('open', 'stolen')))
step('utime rootfile', lambda: os.utime(p('rootfile'), (1, 1)))
step('utime now mine', lambda: os.utime(p('open', 'mine')))
step('access secret', lambda: os.access(p('secret'), os.R_OK))


def map_shared(path):
    with open(path, 'w+b') as f:
        f.write(b'\0' * 4096)
        f.flush()
        m = mmap.mmap(f.fileno(), 4096, mmap.MAP_SHARED)
        m[0:6] = b'mapped'
        m.flush()
        m.close()
    return open(path, 'rb').read(6)


def map_read(path):
    with open(path, 'rb') as f:
        m = mmap.mmap(f.fileno(), 4, mmap.MAP_SHARED, mmap.PROT_READ)
        r = m[:4]
        m.close()
        return r


step('map shared mapped', lambda: map_shared(p('open', 'mapped')))
step('map rootfile read-only', lambda: map_read(p('rootfile')))
step('setuid back', lambda: os.setuid(0))
