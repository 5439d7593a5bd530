//! The FUSE mount (`cairn mount`): real programs on a mounted store, and one file system
//! shared with the API's clients. Needs /dev/fuse and fusermount3 (scripts/setup.sh
//! installs the fuse3 package), sqlite3, git, tar and python3.

use cairn_tests::mount::Mount;
use std::path::Path;
use std::process::Command;

/// Run `sh -c script` in `dir`; its stdout. Fails the test with stderr on failure.
fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn programs_on_the_mount_and_one_file_system_with_the_api() {
    let m = Mount::new();
    let root = m.dir();

    // The mount and an API client see each other's changes at once.
    let fs = m.store.fs();
    fs.write("/from-api", b"written by the API").unwrap();
    assert_eq!(
        std::fs::read(m.path("from-api")).unwrap(),
        b"written by the API"
    );
    std::fs::write(m.path("from-mount"), b"written through FUSE").unwrap();
    assert_eq!(fs.read("/from-mount").unwrap(), b"written through FUSE");
    std::fs::rename(m.path("from-mount"), m.path("renamed")).unwrap();
    assert!(!fs.exists("/from-mount") && fs.exists("/renamed"));

    // SQLite: 10,000 inserts with synchronous=FULL, integrity check, reopen and count.
    let mut sql = String::from(
        "PRAGMA synchronous=FULL; PRAGMA journal_mode=DELETE; \
         CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);\n",
    );
    for i in 0..10_000 {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'row {i}');\n"));
    }
    // The script lives in the test store's directory (removed with it).
    let script = m.store.path().join("fuse-test.sql");
    std::fs::write(&script, &sql).unwrap();
    sh(root, &format!("sqlite3 db.sqlite < {}", script.display()));
    assert_eq!(
        sh(
            root,
            "sqlite3 db.sqlite 'PRAGMA integrity_check; SELECT count(*) FROM t;'"
        ),
        "ok\n10000\n"
    );

    // git: init, add, commit, log, fsck.
    sh(
        root,
        "git init -q repo && cd repo && printf 'a\\n' > a && mkdir -p s && printf 'b\\n' > s/b \
         && git add -A && git -c user.email=t@e -c user.name=t commit -qm first \
         && printf 'c\\n' >> a && git -c user.email=t@e -c user.name=t commit -qam second \
         && git fsck --strict 2>&1",
    );
    assert_eq!(
        sh(&root.join("repo"), "git log --format=%s")
            .lines()
            .count(),
        2
    );

    // tar: create from the host, extract on the mount, compare checksums.
    let src = tempfile::tempdir().unwrap();
    for i in 0..50 {
        let d = src.path().join(format!("d{}", i % 5));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), vec![i as u8; i * 997]).unwrap();
    }
    std::os::unix::fs::symlink("d0/f0", src.path().join("link")).unwrap();
    sh(
        root,
        &format!(
            "mkdir x && tar cf - -C {} . | tar xf - -C x",
            src.path().display()
        ),
    );
    let sums = |dir: &Path| sh(dir, "find . -type f -exec sha256sum {} + | sort");
    assert_eq!(sums(src.path()), sums(&root.join("x")));
    assert_eq!(
        std::fs::read_link(root.join("x/link")).unwrap(),
        Path::new("d0/f0")
    );

    // Python: files, directories, os.replace, a listing.
    let out = sh(
        root,
        "python3 -c \"
import os
os.makedirs('py/a/b', exist_ok=True)
with open('py/a/tmp', 'w') as f:
    f.write('v1')
os.replace('py/a/tmp', 'py/a/final')
with open('py/a/final', 'a') as f:
    f.write('+v2')
os.rmdir('py/a/b')
print(open('py/a/final').read(), sorted(os.listdir('py/a')), os.stat('py/a/final').st_size)
\"",
    );
    assert_eq!(out, "v1+v2 ['final'] 5\n");

    // Unmount; everything is in the store.
    m.umount();
    assert_eq!(fs.read("/py/a/final").unwrap(), b"v1+v2");
    assert!(fs.metadata("/db.sqlite").unwrap().len() > 100_000);
    assert!(fs.metadata("/repo/.git/HEAD").unwrap().is_file());
}

/// Pid of the process serving the mount at `mp` (`cairn mount --foreground MP`).
fn mount_pid(mp: &Path) -> u32 {
    let want = mp.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "--foreground") && args.last() == Some(&want) {
            return pid;
        }
    }
    panic!("no mount process for {want}");
}

#[test]
fn killed_programs_and_a_killed_mount_leave_a_consistent_store() {
    let m = Mount::new();
    let root = m.dir().to_path_buf();
    // SQLite killed with SIGKILL in the middle of committing transactions.
    sh(
        &root,
        "sqlite3 db 'PRAGMA journal_mode=DELETE; CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT)'",
    );
    let mut sql = String::from("PRAGMA synchronous=FULL;\n");
    for i in 0..200_000 {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'row {i}');\n"));
    }
    let script = m.store.path().join("fuse-kill.sql");
    std::fs::write(&script, &sql).unwrap();
    let mut child = Command::new("sqlite3")
        .arg(root.join("db"))
        .stdin(std::fs::File::open(&script).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let out = sh(
        &root,
        "sqlite3 db 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("ok"), "{out}");
    let rows: u64 = lines.next().unwrap().parse().unwrap();
    assert!(rows > 0 && rows < 200_000, "killed mid-way: {rows} rows");

    // The mount process itself killed while a program appends records and syncs each:
    // every record whose write returned is in the store after a remount.
    let writer = Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys
fd = os.open('log', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
n = 0
try:
    while n < 1000000:
        os.write(fd, b'%08d' % n + b'x' * 56)
        os.fsync(fd)
        n += 1
except OSError:
    pass
print(n)",
        )
        .current_dir(&root)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let pid = mount_pid(&root);
    let st = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(st.unwrap().success());
    let out = writer.wait_with_output().unwrap();
    let acked: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(acked > 0, "the writer wrote nothing before the kill");
    let _ = Command::new("fusermount3").arg("-u").arg(&root).output();
    // The store (through the API, as another client) has every acknowledged record,
    // whole and in order.
    let log = m.store.fs().read("/log").unwrap();
    assert!(
        log.len() >= acked * 64,
        "{} bytes for {acked} records",
        log.len()
    );
    for (i, r) in log.chunks(64).enumerate() {
        assert_eq!(r.len(), 64, "a torn record at {i}");
        assert_eq!(&r[..8], format!("{i:08}").as_bytes(), "record {i}");
    }
}

/// A Python process on the mount: runs `code`, which reads lines from stdin to go on.
fn python(dir: &Path, code: &str) -> std::process::Child {
    Command::new("python3")
        .arg("-c")
        .arg(code)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn line(c: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut s = String::new();
    std::io::BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut s)
        .unwrap();
    s.trim().to_string()
}

#[test]
fn posix_locks_on_the_mount_are_the_stores() {
    use std::io::Write;
    let m = Mount::new();
    let root = m.dir().to_path_buf();
    std::fs::write(m.path("lk"), b"x").unwrap();
    let take = "import fcntl, sys
f = open('lk', 'r+')
fcntl.lockf(f, fcntl.LOCK_EX)
print('locked', flush=True)
sys.stdin.readline()";
    let mut p = python(&root, take);
    assert_eq!(line(&mut p), "locked");
    // F_GETLK from another process on the mount names the holder.
    let getlk = "import fcntl, struct
f = open('lk', 'r+')
r = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0) + bytes(4))
t, _, start, length, pid = struct.unpack('hhqqi', r[:28])
print(t == fcntl.F_WRLCK, start, length, pid)";
    assert_eq!(
        sh(&root, &format!("python3 -c \"{getlk}\"")).trim(),
        format!("True 0 0 {}", p.id())
    );
    // Another process on the mount: refused without waiting.
    let try_lock = "import fcntl
f = open('lk', 'r+')
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print('got')
except OSError:
    print('busy')";
    assert_eq!(
        sh(&root, &format!("python3 -c \"{try_lock}\"")).trim(),
        "busy"
    );
    // An API client: the same lock table (the daemon's).
    let fs = m.store.fs();
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/lk")
        .unwrap();
    let e = f
        .lock(cairn::LockKind::Posix, cairn::LockType::Write, 0, 0, false)
        .unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EAGAIN, "{e}");
    // A waiter on the mount gets it when the holder lets go (by exiting).
    let mut w = python(
        &root,
        "import fcntl
f = open('lk', 'r+')
fcntl.lockf(f, fcntl.LOCK_EX)
print('got', flush=True)",
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    writeln!(p.stdin.as_mut().unwrap()).unwrap();
    p.wait().unwrap();
    assert_eq!(line(&mut w), "got");
    w.wait().unwrap();
    // Everyone closed the file: the API client gets it.
    f.lock(cairn::LockKind::Posix, cairn::LockType::Write, 0, 0, false)
        .unwrap();
}

#[test]
fn flock_on_the_mount_is_the_stores() {
    use std::io::Write;
    let m = Mount::new();
    let root = m.dir().to_path_buf();
    std::fs::write(m.path("fl"), b"x").unwrap();
    let mut p = python(
        &root,
        "import fcntl, sys
f = open('fl', 'r')
fcntl.flock(f, fcntl.LOCK_EX)
print('locked', flush=True)
sys.stdin.readline()",
    );
    assert_eq!(line(&mut p), "locked");
    let try_flock = |how: &str| {
        let code = format!(
            "import fcntl
f = open('fl', 'r')
try:
    fcntl.flock(f, fcntl.{how} | fcntl.LOCK_NB)
    print('got')
except BlockingIOError:
    print('busy')"
        );
        sh(&root, &format!("python3 -c \"{code}\""))
            .trim()
            .to_string()
    };
    // Another process on the mount is refused, for a shared lock too.
    assert_eq!(try_flock("LOCK_EX"), "busy");
    assert_eq!(try_flock("LOCK_SH"), "busy");
    // An API client: the same lock table (the daemon's), not the kernel's.
    let fs = m.store.fs();
    let f = cairn::OpenOptions::new()
        .read(true)
        .open(&fs, "/fl")
        .unwrap();
    let e = f.flock(cairn::FlockOp::Shared, true).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EWOULDBLOCK, "{e}");
    // flock and POSIX locks are independent, as on Linux.
    let g = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/fl")
        .unwrap();
    g.lock(cairn::LockKind::Posix, cairn::LockType::Write, 0, 0, false)
        .unwrap();
    g.unlock(cairn::LockKind::Posix, 0, 0).unwrap();
    // A waiter on the mount gets the lock when the holder exits (its file closes).
    let mut w = python(
        &root,
        "import fcntl, sys
f = open('fl', 'r')
fcntl.flock(f, fcntl.LOCK_SH)
print('got', flush=True)
sys.stdin.readline()",
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    writeln!(p.stdin.as_mut().unwrap()).unwrap();
    p.wait().unwrap();
    assert_eq!(line(&mut w), "got");
    // Shared with the waiter's lock: granted; exclusive: refused.
    f.flock(cairn::FlockOp::Shared, true).unwrap();
    assert_eq!(try_flock("LOCK_EX"), "busy");
    writeln!(w.stdin.as_mut().unwrap()).unwrap();
    w.wait().unwrap();
    // The API client's shared lock still keeps an exclusive one out; unlocked, it does not.
    assert_eq!(try_flock("LOCK_EX"), "busy");
    f.flock(cairn::FlockOp::Unlock, true).unwrap();
    assert_eq!(try_flock("LOCK_EX"), "got");
    // flock(LOCK_UN) through the mount lets the API client in at once.
    let mut q = python(
        &root,
        "import fcntl, sys
f = open('fl', 'r')
fcntl.flock(f, fcntl.LOCK_EX)
print('locked', flush=True)
sys.stdin.readline()
fcntl.flock(f, fcntl.LOCK_UN)
print('unlocked', flush=True)
sys.stdin.readline()",
    );
    assert_eq!(line(&mut q), "locked");
    assert!(f.flock(cairn::FlockOp::Exclusive, true).is_err());
    writeln!(q.stdin.as_mut().unwrap()).unwrap();
    assert_eq!(line(&mut q), "unlocked");
    f.flock(cairn::FlockOp::Exclusive, true).unwrap();
    writeln!(q.stdin.as_mut().unwrap()).unwrap();
    q.wait().unwrap();
}

#[test]
fn rocksdb_redis_and_fio_on_the_mount() {
    let m = Mount::new();
    let root = m.dir().to_path_buf();
    // RocksDB: fillrandom, then fillseq (each fill starts a new database) and
    // readrandom, with synced writes: every key is found.
    let out = sh(
        &root,
        "db_bench --benchmarks=fillrandom,fillseq,readrandom --num=2000 --sync=1 \
         --value_size=100 --threads=1 --db=rdb 2>&1",
    );
    let rr = out
        .lines()
        .find(|l| l.starts_with("readrandom"))
        .unwrap_or_else(|| panic!("no readrandom line: {out}"));
    assert!(rr.contains("(2000 of 2000 found)"), "{rr}");

    // Redis with appendfsync always: SETs, a restart, the keys are still there.
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("r.sock");
    let start = || {
        let c = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&sock)
            .arg("--dir")
            .arg(root.join("redis"))
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !sock.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        c
    };
    std::fs::create_dir(root.join("redis")).unwrap();
    let mut server = start();
    let cli = |args: &str| sh(&root, &format!("redis-cli -s {} {args}", sock.display()));
    sh(
        &root,
        &format!(
            "redis-benchmark -s {} -t set -n 2000 -r 1000 -q >/dev/null",
            sock.display()
        ),
    );
    for i in 0..100 {
        cli(&format!("set key{i} value{i}"));
    }
    let _ = Command::new("redis-cli")
        .arg("-s")
        .arg(&sock)
        .args(["shutdown", "nosave"])
        .output();
    server.wait().unwrap();
    let _ = std::fs::remove_file(&sock);
    let mut server = start();
    assert_eq!(cli("get key42").trim(), "value42");
    assert_eq!(cli("get key99").trim(), "value99");
    let _ = Command::new("redis-cli")
        .arg("-s")
        .arg(&sock)
        .args(["shutdown", "nosave"])
        .output();
    server.wait().unwrap();

    // fio: random 4 KiB writes with an fsync after each, then verification.
    sh(
        &root,
        "fio --name=rw --directory=. --rw=randwrite --bs=4k --size=4m --ioengine=psync \
         --fsync=1 --verify=crc32c --do_verify=1 --verify_fatal=1 --output=/dev/null",
    );
}

#[test]
fn renameat2_modes_and_fallocate_on_the_mount() {
    let m = Mount::new();
    let root = m.dir().to_path_buf();
    std::fs::write(m.path("a"), b"A").unwrap();
    std::fs::write(m.path("b"), b"B").unwrap();
    let out = sh(
        &root,
        "python3 -c \"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, NOREPLACE, EXCHANGE = -100, 1, 2
def r2(a, b, f):
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), f) == 0:
        return 'ok'
    return os.strerror(ctypes.get_errno())
print(r2('a', 'b', NOREPLACE), r2('a', 'c', NOREPLACE), r2('c', 'b', EXCHANGE))
print(open('c').read(), open('b').read())
\"",
    );
    assert_eq!(out, "File exists ok ok\nB A\n");
    // Modes are the caller's (its umask, not the mount's).
    assert_eq!(
        sh(
            &root,
            "(umask 0; touch m0; mkdir d0); (umask 027; touch m1; mkdir d1); \
             stat -c %a m0 d0 m1 d1"
        ),
        "666\n777\n640\n750\n"
    );
    // fallocate(1): mode 0 extends the size, KEEP_SIZE keeps it, a punched hole reads
    // as zeros (scripts/fallocate_check.py checks the rest), collapsing is refused.
    sh(&root, "fallocate -l 100000 fa && fallocate -n -l 300000 fa");
    assert_eq!(std::fs::metadata(m.path("fa")).unwrap().len(), 100000);
    std::fs::write(m.path("fa"), vec![7u8; 8192]).unwrap();
    sh(&root, "fallocate -p -o 0 -l 4096 fa");
    let back = std::fs::read(m.path("fa")).unwrap();
    assert!(
        back.len() == 8192
            && back[..4096].iter().all(|&b| b == 0)
            && back[4096..].iter().all(|&b| b == 7)
    );
    let collapse = Command::new("fallocate")
        .args(["-c", "-o", "0", "-l", "4096"])
        .arg(m.path("fa"))
        .output()
        .unwrap();
    assert!(!collapse.status.success());
}

/// Extended attributes on the mount (`scripts/xattr_check.py`), shared with API clients,
/// with the kernel checking other users' access.
#[test]
fn extended_attributes_on_the_mount() {
    use std::os::unix::fs::PermissionsExt;
    let m = Mount::new();
    let root = m.dir().to_path_buf();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/xattr_check.py");
    assert_eq!(
        sh(&root, &format!("python3 {script} {}", root.display())),
        "ok\n"
    );
    let fs = m.store.fs();
    assert_eq!(fs.get_xattr("/xf", b"user.a", true).unwrap(), b"22");
    // Set through the API, seen on the mount.
    fs.set_xattr("/xf", b"trusted.t", b"root only", 0, true)
        .unwrap();
    fs.set_xattr("/xf", b"user.api", b"from the API", 0, true)
        .unwrap();
    let get = format!(
        "python3 -c \"import os; print(os.getxattr('{}', 'user.api').decode())\"",
        m.path("xf").display()
    );
    assert_eq!(sh(&root, &get).trim(), "from the API");
    // Another user (the system Python: a per-user one may be out of its reach): reads a
    // readable file's user. attributes, does not see trusted. ones, may not change a file
    // it cannot write.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = |code: &str| {
        sh(
            &root,
            &format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 -c \"{code}\""
            ),
        )
    };
    let code = format!(
        "import errno, os
p = '{}'
print(sorted(os.listxattr(p)))
print(os.getxattr(p, 'user.a').decode())
try:
    os.setxattr(p, 'user.a', b'x')
except OSError as e:
    print(errno.errorcode[e.errno])",
        m.path("xf").display()
    );
    assert_eq!(
        nobody(&code),
        "['user.a', 'user.api', 'user.empty']\n22\nEACCES\n"
    );
    assert_eq!(
        fs.list_xattr("/xf", true).unwrap(),
        vec![
            b"trusted.t".to_vec(),
            b"user.a".to_vec(),
            b"user.api".to_vec(),
            b"user.empty".to_vec()
        ]
    );
}

/// With attributes cached (`--attr-timeout`), listings carry each entry's attributes
/// (readdirplus): `ls -ln` shows the sizes, modes and kinds the API wrote.
#[test]
fn listings_with_attributes_on_a_caching_mount() {
    let m = Mount::with(&["--attr-timeout", "5"]);
    let fs = m.store.fs();
    fs.create_dir("/d").unwrap();
    for (i, n) in ["a", "b", "c"].iter().enumerate() {
        fs.write(format!("/d/{n}"), vec![b'x'; 1000 * (i + 1)])
            .unwrap();
    }
    fs.create_dir("/d/sub").unwrap();
    fs.symlink("a", "/d/l").unwrap();
    let d = m.path("d");
    let out = sh(
        &d,
        "ls -ln | tail -n +2 | awk '{print substr($1,1,1), $5, $NF}'",
    );
    let dir_size = fs.metadata("/d/sub").unwrap().len();
    assert_eq!(
        out,
        format!("- 1000 a\n- 2000 b\n- 3000 c\nl 1 a\nd {dir_size} sub\n")
    );
}

/// The mount caches names and attributes (default `cairn mount`), yet a program on it
/// sees what other clients change at once: an open descriptor reads the new bytes and
/// size an API client wrote, `stat` shows a new mode and owner, and names another client
/// renames, removes or creates (also after a lookup cached the name as missing) follow
/// within the moment the mount takes to drop them; and API clients see the mount's
/// writes at once.
#[test]
fn cached_attributes_and_names_follow_other_clients() {
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
    let m = Mount::new();
    let fs = m.store.fs();
    fs.write("/f", vec![b'a'; 4096]).unwrap();
    let p = m.path("f");
    let f = std::fs::File::open(&p).unwrap();
    let mut buf = [0u8; 4];
    // Cache the attributes and the page.
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!((&buf, f.metadata().unwrap().len()), (b"aaaa", 4096));
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 4096);
    for round in 0..20u8 {
        // Another client writes in place and appends.
        let g = cairn::OpenOptions::new()
            .write(true)
            .open(&fs, "/f")
            .unwrap();
        g.write_at(&[b'b' + round % 20; 4], 0).unwrap();
        g.write_at(b"tail", 4096 + 4 * round as u64).unwrap();
        drop(g);
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [b'b' + round % 20; 4], "round {round}: the new bytes");
        let len = 4100 + 4 * round as u64;
        assert_eq!(f.metadata().unwrap().len(), len, "round {round}: fstat");
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            len,
            "round {round}: stat"
        );
    }
    fs.set_permissions("/f", cairn::Permissions::from_mode(0o600))
        .unwrap();
    fs.set_owner("/f", Some(123), Some(456)).unwrap();
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(
        (md.permissions().mode() & 0o7777, md.uid(), md.gid()),
        (0o600, 123, 456)
    );
    // Names: gone, moved, created after being looked up missing.
    let eventually = |what: &str, cond: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !cond() {
            assert!(
                t.elapsed().as_secs() < 2,
                "{what}: not seen through the mount"
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    };
    assert!(!m.path("new").exists());
    fs.write("/new", b"n").unwrap();
    eventually("a new name", &|| m.path("new").exists());
    fs.rename("/f", "/g").unwrap();
    eventually("a renamed name", &|| !p.exists() && m.path("g").exists());
    fs.remove_file("/new").unwrap();
    eventually("a removed name", &|| !m.path("new").exists());
    // The mount's writes, seen by an API client at once; a name the mount created,
    // renamed by the API.
    std::fs::write(m.path("fromfuse"), b"written on the mount").unwrap();
    assert_eq!(fs.read("/fromfuse").unwrap(), b"written on the mount");
    fs.rename("/fromfuse", "/moved").unwrap();
    eventually("a name the mount created, renamed", &|| {
        !m.path("fromfuse").exists() && m.path("moved").exists()
    });
    drop((f, fs));
    m.umount();
}
