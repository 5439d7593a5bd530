//! Calls on Cairn descriptors that the kernel cannot serve by itself, through the shim:
//! copies between descriptors (`copy_file_range`, `sendfile`, `splice`), `ioctl`, and the
//! times of a symbolic link itself. Compared with what Linux does on the host.
//! Needs python3 (scripts/setup.sh).

use cairn_tests::shim::python;
use cairn_tests::TestStore;

/// `copy_file_range` between two Cairn files and between Cairn and the host, with
/// positions and explicit offsets; Linux's errors for overlapping ranges, flags and an
/// `O_APPEND` destination.
#[test]
fn copy_file_range_with_a_cairn_side() {
    let store = TestStore::new();
    let host = tempfile::tempdir().unwrap();
    let out = python(
        &store,
        &format!(
            r#"import errno, os
host = '{host}'
data = bytes(range(256)) * 4000 + b'tail'
open('/cairn/src', 'wb').write(data)
a = os.open('/cairn/src', os.O_RDONLY)
b = os.open('/cairn/dst', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
# Explicit offsets: the positions stay.
assert os.copy_file_range(a, b, len(data), 0, 0) == len(data)
assert open('/cairn/dst', 'rb').read() == data
assert os.lseek(a, 0, os.SEEK_CUR) == 0 and os.lseek(b, 0, os.SEEK_CUR) == 0
# Positions: used and moved.
os.lseek(a, 100, os.SEEK_SET)
h = os.open(host + '/copy', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
assert os.copy_file_range(a, h, 1000) == 1000 and os.lseek(a, 0, os.SEEK_CUR) == 1100
os.close(h)
assert open(host + '/copy', 'rb').read() == data[100:1100]
# Host to Cairn; past the end of the source: what is there.
h = os.open(host + '/copy', os.O_RDONLY)
c = os.open('/cairn/fromhost', os.O_WRONLY | os.O_CREAT)
assert os.copy_file_range(h, c, 5000) == 1000
assert os.copy_file_range(h, c, 5000) == 0
assert open('/cairn/fromhost', 'rb').read() == data[100:1100]
def fails(f, want):
    try:
        f()
    except OSError as e:
        assert e.errno == want, (e, want)
        return
    raise AssertionError('no error, expected ' + errno.errorcode[want])
r = os.open('/cairn/dst', os.O_RDWR)
fails(lambda: os.copy_file_range(r, r, 100, 0, 50), errno.EINVAL)
assert os.copy_file_range(r, r, 100, 0, 100) == 100
ap = os.open('/cairn/dst', os.O_WRONLY | os.O_APPEND)
fails(lambda: os.copy_file_range(a, ap, 10), errno.EBADF)
fails(lambda: os.copy_file_range(b, a, 10), errno.EBADF)
print('ok')
"#,
            host = host.path().display()
        ),
    );
    assert_eq!(out, "ok\n");
    let fs = store.fs();
    assert_eq!(fs.read("/dst").unwrap().len(), 256 * 4000 + 4);
}

/// A server sending a Cairn file over a socket with `socket.sendfile` (the kernel's
/// `sendfile` path), `os.sendfile` with an offset into a pipe, and `splice` from a Cairn
/// file into a pipe and from a pipe into a Cairn file.
#[test]
fn sendfile_and_splice_with_a_cairn_side() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"import errno, os, socket, threading
data = os.urandom(3 << 20)
open('/cairn/served', 'wb').write(data)
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(1)
def serve():
    c, _ = srv.accept()
    with open('/cairn/served', 'rb') as f:
        c.sendfile(f)
    c.close()
t = threading.Thread(target=serve)
t.start()
cl = socket.create_connection(srv.getsockname())
got = bytearray()
while True:
    b = cl.recv(1 << 16)
    if not b:
        break
    got.extend(b)
t.join()
assert bytes(got) == data, len(got)
a = os.open('/cairn/served', os.O_RDONLY)
rp, wp = os.pipe()
assert os.sendfile(wp, a, 10, 20) == 20 and os.read(rp, 20) == data[10:30]
assert os.lseek(a, 0, os.SEEK_CUR) == 0
assert os.sendfile(wp, a, None, 7) == 7 and os.read(rp, 7) == data[:7]
assert os.lseek(a, 0, os.SEEK_CUR) == 7
assert os.splice(a, wp, 30, offset_src=5) == 30 and os.read(rp, 30) == data[5:35]
c = os.open('/cairn/spliced', os.O_WRONLY | os.O_CREAT)
os.write(wp, b'from a pipe')
assert os.splice(rp, c, 11) == 11
assert open('/cairn/spliced', 'rb').read() == b'from a pipe'
try:
    os.splice(a, c, 10)
    raise AssertionError('splice without a pipe')
except OSError as e:
    assert e.errno == errno.EINVAL, e
print('ok')
"#,
    );
    assert_eq!(out, "ok\n");
}

/// `ioctl` on Cairn descriptors gives ext4's answers where Cairn has them, `EOPNOTSUPP`
/// for reflinks and `ENOTTY` for the rest; the same program on a host file checks that
/// the answers are Linux's.
#[test]
fn ioctl_answers() {
    let store = TestStore::new();
    let host = tempfile::tempdir().unwrap();
    let script = r#"import array, errno, fcntl, os, struct, sys, termios
path = sys.argv[1]
open(path, 'wb').write(b'x' * 1000)
fd = os.open(path, os.O_RDWR)
os.lseek(fd, 100, os.SEEK_SET)
b = array.array('i', [0])
fcntl.ioctl(fd, termios.FIONREAD, b)
print('FIONREAD', b[0])
b = array.array('i', [0])
fcntl.ioctl(fd, 2, b)  # FIGETBSZ
print('FIGETBSZ', b[0])
def err(req, arg):
    try:
        fcntl.ioctl(fd, req, arg)
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
print('TCGETS', err(termios.TCGETS, bytes(64)))
print('FIOCLEX', err(termios.FIOCLEX, 0), bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC))
print('isatty', os.isatty(fd))
"#;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    let run = |path: &str| {
        cairn_tests::shim::sh(&store, &format!("python3 {} {path}", file.path().display()))
    };
    let on_cairn = run("/cairn/io");
    let on_host = run(&host.path().join("io").display().to_string());
    assert_eq!(on_cairn, on_host);
    assert!(on_cairn.contains("FIONREAD 900\n"), "{on_cairn}");
    // Cairn's own answers (ext4's differ: it has inode flags and reflinks fail with
    // EOPNOTSUPP, as here, or EXDEV).
    let out = python(
        &store,
        r#"import errno, fcntl, os, struct
fd = os.open('/cairn/io', os.O_RDWR)
b = bytearray(4)
fcntl.ioctl(fd, 0x80086601, b)  # FS_IOC_GETFLAGS
assert struct.unpack('i', b)[0] == 0
fcntl.ioctl(fd, 0x40086602, struct.pack('i', 0))  # FS_IOC_SETFLAGS, no flags
for req, arg in [(0x40086602, struct.pack('i', 0x10)), (0x40049409, 0)]:  # SETFLAGS, FICLONE
    try:
        fcntl.ioctl(fd, req, arg)
        raise AssertionError(hex(req))
    except OSError as e:
        assert e.errno == errno.EOPNOTSUPP, (hex(req), e)
print('ok')
"#,
    );
    assert_eq!(out, "ok\n");
}

/// `utimensat(AT_SYMLINK_NOFOLLOW)` sets a symbolic link's own times, not its
/// target's; the API's `set_symlink_times` likewise.
#[test]
fn times_of_a_symlink_itself() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"import os
open('/cairn/target', 'w').write('x')
os.symlink('target', '/cairn/link')
before = os.stat('/cairn/target').st_mtime_ns
os.utime('/cairn/link', ns=(1_000_000_000, 2_000_000_000), follow_symlinks=False)
l = os.lstat('/cairn/link')
assert (l.st_atime_ns, l.st_mtime_ns) == (1_000_000_000, 2_000_000_000), l
assert os.stat('/cairn/target').st_mtime_ns == before
print('ok')
"#,
    );
    assert_eq!(out, "ok\n");
    let fs = store.fs();
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(5);
    fs.set_symlink_times("/link", None, Some(t)).unwrap();
    assert_eq!(fs.symlink_metadata("/link").unwrap().modified(), t);
    assert_ne!(fs.metadata("/link").unwrap().modified(), t);
}

/// Programs stored on Cairn run through the shim: `#!` scripts (with an interpreter
/// argument, relative paths, an interpreter that is itself a script on Cairn), an ELF
/// binary, a search of a `PATH` holding a Cairn directory (by a shell and by Python),
/// `posix_spawn` and `posix_spawnp` of each kind,
/// and Linux's errors: no execute permission or a directory `EACCES`, neither a script
/// nor a binary `ENOEXEC` (a shell then runs it itself).
#[test]
fn programs_stored_on_cairn_run() {
    let store = TestStore::new();
    let out = cairn_tests::shim::sh(
        &store,
        r#"set -e
mkdir -p /cairn/bin
printf '#!/bin/sh\necho "sh script: $0 $*"\n' > /cairn/bin/hello
printf '#!/usr/bin/env python3\nimport sys; print("py script", sys.argv[1:])\n' > /cairn/bin/pyhello
printf '#!/bin/sh -u\necho "interp: $*"\n' > /cairn/bin/interp
printf '#!/cairn/bin/interp -x\nbody\n' > /cairn/bin/user
printf 'echo "no shebang: $1"\n' > /cairn/bin/plain
cp /bin/echo /cairn/bin/myecho
chmod +x /cairn/bin/hello /cairn/bin/pyhello /cairn/bin/interp /cairn/bin/user /cairn/bin/plain /cairn/bin/myecho
printf 'data\n' > /cairn/bin/noexec
/cairn/bin/hello a b
/cairn/bin/pyhello x y
/cairn/bin/myecho "an ELF from Cairn"
/cairn/bin/user arg
cd /cairn/bin && ./hello relative
PATH=/cairn/bin:$PATH hello via-path
PATH=/cairn/bin:$PATH plain run-by-the-shell
PATH=/cairn/bin:$PATH python3 -c "
import errno, os, subprocess
print(subprocess.run(['pyhello', 'from subprocess'], capture_output=True, text=True).stdout.strip())
for p in ['/cairn/bin/noexec', '/cairn/bin', '/cairn/bin/plain']:
    try:
        os.execv(p, ['x'])
    except OSError as e:
        print(p, errno.errorcode[e.errno])
for p, a in [('/cairn/bin/hello', ['hello', 'spawned']), ('/cairn/bin/myecho', ['myecho', 'spawned ELF']), ('/cairn/bin/user', ['user', 'spawned'])]:
    print(os.waitpid(os.posix_spawn(p, a, os.environ), 0)[1])
print(os.waitpid(os.posix_spawnp('pyhello', ['pyhello', 'by posix_spawnp'], os.environ), 0)[1])
try:
    os.posix_spawn('/cairn/bin/noexec', ['x'], os.environ)
except OSError as e:
    print('spawn noexec', errno.errorcode[e.errno])
"
"#,
    );
    assert_eq!(
        out,
        "sh script: /cairn/bin/hello a b\n\
         py script ['x', 'y']\n\
         an ELF from Cairn\n\
         interp: -x /cairn/bin/user arg\n\
         sh script: ./hello relative\n\
         sh script: /cairn/bin/hello via-path\n\
         no shebang: run-by-the-shell\n\
         py script ['from subprocess']\n\
         /cairn/bin/noexec EACCES\n\
         /cairn/bin EACCES\n\
         /cairn/bin/plain ENOEXEC\n\
         sh script: /cairn/bin/hello spawned\n0\n\
         spawned ELF\n0\n\
         interp: -x /cairn/bin/user spawned\n0\n\
         py script ['by posix_spawnp']\n0\n\
         spawn noexec EACCES\n"
    );
}

/// nginx (`sendfile on`, one process) serves files stored on Cairn through the shim: a
/// page, a 5 MiB file byte for byte, and a range of it.
#[test]
fn nginx_serves_files_from_the_store() {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nginx is not installed (scripts/setup.sh installs nginx-light)");
    let store = TestStore::new();
    let fs = store.fs();
    fs.create_dir("/www").unwrap();
    fs.write("/www/index.html", b"hello from cairn\n").unwrap();
    let big: Vec<u8> = (0..5u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs.write("/www/big.bin", &big).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::write(
        dir.path().join("nginx.conf"),
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log stderr warn;\n\
             pid {d}/nginx.pid;\nevents {{ worker_connections 64; }}\nhttp {{\n  sendfile on;\n\
             access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n\
             scgi_temp_path {d}/scgi;\n  server {{ listen 127.0.0.1:{port}; root /cairn/www; }}\n}}\n"
        ),
    )
    .unwrap();
    let mut server =
        cairn_tests::shim::run_cmd(&store, &format!("exec {nginx} -c {d}/nginx.conf -p {d}"))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _k = Kill(&mut server);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "nginx did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let get = |path: &str, range: Option<&str>| -> Vec<u8> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let range = range.map_or(String::new(), |r| format!("Range: bytes={r}\r\n"));
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n{range}\r\n").unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).unwrap();
        let head = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("headers")
            + 4;
        let status = String::from_utf8_lossy(&resp[..resp.len().min(12)]).into_owned();
        assert!(
            status.contains(" 200") || status.contains(" 206"),
            "{status}"
        );
        resp.split_off(head)
    };
    assert_eq!(get("/index.html", None), b"hello from cairn\n");
    assert!(
        get("/big.bin", None) == big,
        "5 MiB file served byte for byte"
    );
    assert_eq!(get("/big.bin", Some("1000-1999")), &big[1000..2000]);
}

/// A path argument in memory the program cannot read is `EFAULT`, as the kernel answers,
/// on host and Cairn calls alike; never a crash of the program. Also after the page that
/// held a good path is unmapped (the library forgets what it knew readable).
#[test]
fn unreadable_path_arguments_are_efault() {
    let store = TestStore::new();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("efault.c");
    let bin = dir.path().join("efault");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define CHECK(call) do { errno = 0; long r = (long)(call); \
    printf("%s %ld %s\n", #call, r, r == -1 ? strerrorname_np(errno) : "-"); } while (0)
int main(void) {
    const char *bad = (const char *)16;
    struct stat st;
    CHECK(open(bad, O_RDONLY));
    CHECK(stat(bad, &st));
    CHECK(mkdir(bad, 0755));
    CHECK(rename("/cairn/x", bad));
    CHECK(unlink(bad));
    char *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    strcpy(page, "/cairn/f");
    CHECK(open(page, O_CREAT | O_WRONLY, 0644) >= 0);
    CHECK(stat(page, &st));
    munmap(page, 4096);
    CHECK(stat(page, &st));
    /* The string runs into an unreadable page: EFAULT, unless PATH_MAX bytes came
       first (ENAMETOOLONG), as the kernel reads it. */
    char *two = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(two, 'a', 4096);
    munmap(two + 4096, 4096);
    CHECK(stat(two + 100, &st));
    CHECK(stat(two, &st));
    return 0;
}
"#,
    )
    .unwrap();
    cairn_tests::shim::compile_c(&src, &bin);
    let out = cairn_tests::shim::sh(&store, &bin.display().to_string());
    assert_eq!(
        out,
        "open(bad, O_RDONLY) -1 EFAULT\n\
         stat(bad, &st) -1 EFAULT\n\
         mkdir(bad, 0755) -1 EFAULT\n\
         rename(\"/cairn/x\", bad) -1 EFAULT\n\
         unlink(bad) -1 EFAULT\n\
         open(page, O_CREAT | O_WRONLY, 0644) >= 0 1 -\n\
         stat(page, &st) 0 -\n\
         stat(page, &st) -1 EFAULT\n\
         stat(two + 100, &st) -1 EFAULT\n\
         stat(two, &st) -1 ENAMETOOLONG\n"
    );
}

/// `O_TMPFILE` through the shim and on the mount answers as on the host file system
/// (`scripts/tmpfile_check.py`: named through `/proc/self/fd` and `AT_EMPTY_PATH`,
/// `O_EXCL`, errors); an unnamed file is freed when its last descriptor closes, and when
/// its process is killed; through the API it is a `File` that `link` names.
#[test]
fn unnamed_files_with_o_tmpfile() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/tmpfile_check.py");
    let host = tempfile::tempdir().unwrap();
    let want = std::process::Command::new("python3")
        .arg(script)
        .arg(host.path())
        .output()
        .unwrap();
    assert!(want.status.success());
    let store = TestStore::new();
    let used = || {
        cairn::daemon_status(Some(store.path()))
            .unwrap()
            .inodes
            .used
    };
    let got = cairn_tests::shim::sh(&store, &format!("python3 {script} /cairn"));
    assert_eq!(got, String::from_utf8_lossy(&want.stdout));
    // The same on the mount (in its own directory; the store's counts below are the
    // shim's run's, the mount's unnamed files being gone when it returns).
    {
        let m = cairn_tests::mount::Mount::of(TestStore::new(), &[]);
        let out = std::process::Command::new("python3")
            .arg(script)
            .arg(m.dir())
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&want.stdout),
            "on the mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Root, /tdir, named, second: the two unnamed ones that got no name are gone.
    assert_eq!(used(), 4);
    // A process holding a large unnamed file is killed: the daemon frees it.
    let mut c = cairn_tests::shim::run_cmd(
        &store,
        "exec python3 -c \"import os, sys, time\nfd = os.open('/cairn', os.O_TMPFILE | os.O_RDWR)\nos.write(fd, b'x' * (8 << 20))\nprint('ready', flush=True)\ntime.sleep(60)\"",
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(c.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "ready\n");
    assert_eq!(used(), 5);
    c.kill().unwrap();
    c.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while used() != 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(used(), 4, "the killed process's unnamed file is freed");
    // The API.
    let fs = store.fs();
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .tmpfile(&fs, "/tdir", true)
        .unwrap();
    f.write_at(b"api", 0).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.link("/tdir/from-api").unwrap();
    assert_eq!(fs.read("/tdir/from-api").unwrap(), b"api");
    let e = f.link("/tdir/from-api").unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EEXIST);
    let g = cairn::OpenOptions::new()
        .write(true)
        .tmpfile(&fs, "/tdir", false)
        .unwrap();
    assert_eq!(
        cairn_area::errno_of(&g.link("/x").unwrap_err()),
        libc::ENOENT
    );
    let e = cairn::OpenOptions::new()
        .write(true)
        .tmpfile(&fs, "/tdir/from-api", true)
        .unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::ENOTDIR);
    drop((f, g));
    assert_eq!(used(), 5);
}

/// File system calls made through `syscall(2)` rather than the C library's wrappers
/// (`scripts/raw_syscalls.c`: data, descriptors, copies, a mapping, names, links,
/// permissions, times, a listing, the current directory) answer on Cairn through the
/// shim exactly as the kernel answers on the host.
#[test]
fn raw_system_calls_answer_as_on_the_host() {
    let store = TestStore::new();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/raw_syscalls.c");
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("raw_syscalls");
    cairn_tests::shim::compile_c(std::path::Path::new(src), &bin);
    let host = tempfile::tempdir().unwrap();
    let want = std::process::Command::new(&bin)
        .arg(host.path())
        .output()
        .unwrap();
    assert!(want.status.success(), "{want:?}");
    let want = String::from_utf8(want.stdout).unwrap();
    assert!(want.contains("copy_file_range 6\n"), "{want}");
    store.fs().create_dir("/raw").unwrap();
    let got = cairn_tests::shim::sh(&store, &format!("{} /cairn/raw", bin.display()));
    for (w, g) in want.lines().zip(got.lines()) {
        assert_eq!(g, w, "through the shim vs on the host");
    }
    assert_eq!(got.lines().count(), want.lines().count(), "{got}");
}
