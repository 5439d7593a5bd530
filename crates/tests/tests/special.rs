//! Special files (FIFOs, Unix-domain sockets, device nodes) through the API, the shim,
//! the mount and a mix of the two, each with two processes. Needs python3 and the fuse3
//! package (scripts/setup.sh). Runs as root (device nodes), like the rest of the suite.

use cairn_tests::mount::Mount;
use cairn_tests::shim::{python, run_cmd};
use cairn_tests::TestStore;
use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::process::{Command, Stdio};

fn errno(e: &std::io::Error) -> i32 {
    cairn_area::errno_of(e)
}

/// Start `script` through the shim and wait for its first line of output.
fn spawn_and_read_line(
    store: &TestStore,
    script: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
    String,
) {
    let mut child = run_cmd(store, script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    (child, out, line)
}

/// Every special type is an inode: created, listed with its type, renamed, linked,
/// chmod'ed, chown'ed and removed like a file; kept across a daemon restart; bad types
/// and device numbers refused; opened through `open_special` with a FIFO's semantics.
#[test]
fn special_files_through_the_api() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.mkfifo("/fifo", 0o640).unwrap();
    fs.mknod("/sock", libc::S_IFSOCK | 0o755, 0).unwrap();
    fs.mknod("/null", libc::S_IFCHR | 0o666, cairn::makedev(1, 3))
        .unwrap();
    fs.mknod("/blk", libc::S_IFBLK | 0o600, cairn::makedev(7, 0x1_0001))
        .unwrap();
    fs.mknod("/plain", 0o644, 0).unwrap();
    let check = |fs: &cairn::Fs| {
        let m = fs.metadata("/fifo").unwrap();
        assert!(m.file_type().is_fifo() && m.mode() == libc::S_IFIFO | 0o640);
        assert!(fs.metadata("/sock").unwrap().file_type().is_socket());
        let n = fs.metadata("/null").unwrap();
        assert!(n.file_type().is_char_device());
        assert_eq!(cairn::major_minor(n.rdev()), (1, 3));
        let b = fs.metadata("/blk").unwrap();
        assert!(b.file_type().is_block_device());
        assert_eq!(cairn::major_minor(b.rdev()), (7, 0x1_0001));
        assert!(fs.metadata("/plain").unwrap().is_file());
        let mut types: Vec<(String, u8)> = fs
            .read_dir("/")
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.file_type().unwrap().dirent_type(),
                )
            })
            .collect();
        types.sort();
        assert_eq!(
            types
                .iter()
                .filter(|(n, _)| n != "plain")
                .map(|(_, t)| *t)
                .collect::<Vec<_>>(),
            vec![libc::DT_BLK, libc::DT_FIFO, libc::DT_CHR, libc::DT_SOCK]
        );
    };
    check(&fs);
    // Namespace operations as on files.
    fs.hard_link("/fifo", "/fifo2").unwrap();
    assert_eq!(fs.metadata("/fifo").unwrap().nlink(), 2);
    fs.rename("/fifo2", "/fifo3").unwrap();
    fs.set_permissions("/fifo3", cairn::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(fs.metadata("/fifo").unwrap().mode() & 0o7777, 0o600);
    fs.set_owner("/null", Some(12), Some(34)).unwrap();
    assert_eq!(fs.metadata("/null").unwrap().uid(), 12);
    fs.remove_file("/fifo3").unwrap();
    assert_eq!(fs.metadata("/fifo").unwrap().nlink(), 1);
    // Errors.
    let e = fs.mknod("/d", libc::S_IFDIR | 0o755, 0).unwrap_err();
    assert_eq!(errno(&e), libc::EPERM);
    let e = fs.mknod("/l", libc::S_IFLNK | 0o777, 0).unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL);
    let e = fs.mknod("/x", 0o170000 | 0o644, 0).unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL);
    let e = fs
        .mknod("/big", libc::S_IFCHR | 0o600, cairn::makedev(5000, 1))
        .unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL);
    let e = fs.mknod("/fifo", libc::S_IFIFO | 0o600, 0).unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST);
    // A `File` cannot be opened on them; `open_special` of a socket or a file is refused.
    let e = cairn::File::open(&fs, "/fifo").unwrap_err();
    assert_eq!(errno(&e), libc::ENXIO);
    let e = fs.open_special("/sock", libc::O_RDONLY).unwrap_err();
    assert_eq!(errno(&e), libc::ENXIO);
    let e = fs.open_special("/plain", libc::O_RDONLY).unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL);
    let e = fs.socket_address("/fifo").unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
    // The FIFO's semantics: a writer and a reader meet in one pipe.
    let writer = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let fd = fs.open_special("/fifo", libc::O_WRONLY).unwrap();
            std::fs::File::from(fd)
                .write_all(b"through the fifo")
                .unwrap();
        });
        let fd = fs.open_special("/fifo", libc::O_RDONLY).unwrap();
        let mut got = String::new();
        std::fs::File::from(fd).read_to_string(&mut got).unwrap();
        w.join().unwrap();
        got
    });
    assert_eq!(writer, "through the fifo");
    // A device: /dev/null's numbers open /dev/null.
    let mut null = std::fs::File::from(fs.open_special("/null", libc::O_RDWR).unwrap());
    null.write_all(b"gone").unwrap();
    let mut buf = Vec::new();
    assert_eq!(null.read_to_end(&mut buf).unwrap(), 0);
    assert!(!cairn::rendezvous_files(store.path()).unwrap().is_empty());
    // Unlinking the FIFO removes its rendezvous.
    fs.remove_file("/fifo").unwrap();
    assert!(cairn::rendezvous_files(store.path()).unwrap().is_empty());
    fs.mkfifo("/fifo", 0o640).unwrap();
    // Across a daemon restart (digested and recovered like any inode).
    drop(null);
    drop(fs);
    store.stop();
    check(&store.fs());
}

/// A FIFO in the store between two processes through the shim, either opening first.
#[test]
fn fifo_between_processes_through_the_shim() {
    let store = TestStore::new();
    python(&store, "import os\nos.mkfifo('/cairn/pipe', 0o600)\n");
    for reader_first in [true, false] {
        let reader = run_cmd(&store, "cat /cairn/pipe")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        if reader_first {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let w = run_cmd(
            &store,
            "for i in 1 2 3; do echo line $i; done > /cairn/pipe",
        )
        .status()
        .unwrap();
        assert!(w.success());
        let out = reader.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "line 1\nline 2\nline 3\n"
        );
    }
    // O_NONBLOCK: a writer without a reader gets ENXIO, as on Linux; stat says FIFO.
    let out = python(
        &store,
        r#"import errno, os, stat
try:
    os.open('/cairn/pipe', os.O_WRONLY | os.O_NONBLOCK)
    print('opened')
except OSError as e:
    print(errno.errorcode[e.errno])
print(stat.S_ISFIFO(os.stat('/cairn/pipe').st_mode), stat.S_ISFIFO(os.lstat('/cairn/pipe').st_mode))
print(sorted((e.name, e.is_file(), e.is_dir()) for e in os.scandir('/cairn')))
"#,
    );
    assert_eq!(out, "ENXIO\nTrue True\n[('pipe', False, False)]\n");
}

/// A socket bound at a Cairn path: a server process and client processes through the
/// shim (stream and datagram); the errors Linux gives.
#[test]
fn socket_server_and_client_through_the_shim() {
    let store = TestStore::new();
    let (mut server, mut out, mut line) = spawn_and_read_line(
        &store,
        r#"exec python3 -c '
import os, socket, stat, sys
s = socket.socket(socket.AF_UNIX)
s.bind("/cairn/srv")
s.listen()
d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
d.bind("/cairn/dgram")
print(stat.S_ISSOCK(os.stat("/cairn/srv").st_mode), flush=True)
for _ in range(2):
    c, _ = s.accept()
    c.sendall(c.recv(100).upper())
    c.close()
print(d.recv(100).decode(), flush=True)
'"#,
    );
    assert_eq!(line, "True\n");
    for _ in 0..2 {
        let got = python(
            &store,
            r#"import socket
c = socket.socket(socket.AF_UNIX)
c.connect('/cairn/srv')
c.sendall(b'hello')
print(c.recv(100).decode())
"#,
        );
        assert_eq!(got, "HELLO\n");
    }
    python(
        &store,
        "import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'datagram', '/cairn/dgram')\n",
    );
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "datagram\n");
    assert!(server.wait().unwrap().success());
    let errs = python(
        &store,
        r#"import errno, os, socket
def err(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
open('/cairn/file', 'w').close()
s = socket.socket(socket.AF_UNIX)
print(err(lambda: s.bind('/cairn/srv')), err(lambda: s.connect('/cairn/file')),
      err(lambda: s.connect('/cairn/missing')), err(lambda: open('/cairn/srv')))
os.unlink('/cairn/srv')
print(err(lambda: socket.socket(socket.AF_UNIX).connect('/cairn/srv')))
"#,
    );
    assert_eq!(errs, "EADDRINUSE ECONNREFUSED ENOENT ENXIO\nENOENT\n");
}

/// Device nodes through the shim open the host devices their numbers name.
#[test]
fn device_nodes_through_the_shim() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"import errno, os, stat
os.mknod('/cairn/null', 0o666 | stat.S_IFCHR, os.makedev(1, 3))
os.mknod('/cairn/zero', 0o666 | stat.S_IFCHR, os.makedev(1, 5))
st = os.stat('/cairn/null')
print(stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev))
with open('/cairn/null', 'w') as f:
    f.write('x' * 1000)
print(repr(open('/cairn/null').read()), open('/cairn/zero', 'rb').read(4))
try:
    os.mknod('/cairn/bad', 0o600 | stat.S_IFCHR, os.makedev(4095, 1048575))
    open('/cairn/bad')
except OSError as e:
    print(errno.errorcode[e.errno])
try:
    os.mkfifo('/cairn/null')
except OSError as e:
    print(errno.errorcode[e.errno])
"#,
    );
    assert_eq!(out, "True 1 3\n'' b'\\x00\\x00\\x00\\x00'\nENXIO\nEEXIST\n");
    // `ls -l` shows the numbers, through the shim.
    let ls = cairn_tests::shim::sh(&store, "ls -l /cairn/null");
    assert!(ls.starts_with("crw-"), "{ls}");
    assert!(ls.contains("1, 3"), "{ls}");
}

/// On a mounted store the kernel serves special files; processes through the shim meet
/// the mount's processes in the same pipe and socket.
#[test]
fn special_files_through_the_mount_and_mixed() {
    let m = Mount::new();
    let mp = m.dir().to_path_buf();
    // Made through the mount; seen through the API with the right types.
    let st = Command::new("sh")
        .arg("-c")
        .arg("mkfifo f && mknod z c 1 5 && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"s0\")'")
        .current_dir(&mp)
        .status()
        .unwrap();
    assert!(st.success());
    let fs = m.store.fs();
    assert!(fs.metadata("/f").unwrap().file_type().is_fifo());
    assert!(fs.metadata("/s0").unwrap().file_type().is_socket());
    assert_eq!(
        cairn::major_minor(fs.metadata("/z").unwrap().rdev()),
        (1, 5)
    );
    let ft = std::fs::metadata(mp.join("f")).unwrap().file_type();
    assert!(ft.is_fifo());
    let mut zero = [1u8; 8];
    std::fs::File::open(mp.join("z"))
        .unwrap()
        .read_exact(&mut zero)
        .unwrap();
    assert_eq!(zero, [0; 8]);
    // The API makes one, the mount lists it.
    fs.mkfifo("/api-fifo", 0o644).unwrap();
    assert!(std::fs::metadata(mp.join("api-fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    // A FIFO: the reader on the mount, the writer through the shim; then the reverse.
    for (reader, writer) in [
        (
            format!("cat {}/f", mp.display()),
            "echo mixed > /cairn/f".to_string(),
        ),
        (
            "cat /cairn/f".to_string(),
            format!("echo mixed > {}/f", mp.display()),
        ),
    ] {
        let r = run_cmd(&m.store, &reader)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(run_cmd(&m.store, &writer).status().unwrap().success());
        let out = r.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "mixed\n",
            "{reader} / {writer}"
        );
    }
    // A socket: a server bound through the shim, a client on the mount (no shim).
    let (mut server, _out, line) = spawn_and_read_line(
        &m.store,
        r#"exec python3 -c '
import socket
s = socket.socket(socket.AF_UNIX)
s.bind("/cairn/mixsock")
s.listen()
print("ready", flush=True)
c, _ = s.accept()
c.sendall(c.recv(10) + b"!")
'"#,
    );
    assert_eq!(line, "ready\n");
    let mut c = std::os::unix::net::UnixStream::connect(mp.join("mixsock")).unwrap();
    c.write_all(b"mount").unwrap();
    let mut got = String::new();
    c.read_to_string(&mut got).unwrap();
    assert_eq!(got, "mount!");
    assert!(server.wait().unwrap().success());
    drop(fs);
    m.umount();
}
