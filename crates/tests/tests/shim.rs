//! The LD_PRELOAD library (`cairn run`): real programs on the store through
//! `libcairn_preload.so`, descriptor semantics (placeholders, dup, fork, exec,
//! `O_CLOEXEC`), `mmap`, stdio, directory streams, locks, and kills mid-work.
//! Needs sqlite3, git, tar, python3, db_bench, redis and fio (scripts/setup.sh).

use cairn_tests::harness::{cairn_bin, daemon_pid, kill9, StoreSize};
use cairn_tests::shim::{compile_c, python, run_cmd, sh};
use cairn_tests::TestStore;
use std::io::BufRead;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn programs_through_the_shim_and_one_file_system_with_the_api() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.write("/from-api", b"written by the API").unwrap();
    assert_eq!(sh(&store, "cat /cairn/from-api"), "written by the API");
    sh(&store, "printf 'through the shim' > /cairn/from-shim");
    assert_eq!(fs.read("/from-shim").unwrap(), b"through the shim");

    // SQLite: 10,000 inserts with synchronous=FULL, integrity check, reopen and count.
    let mut sql = String::from(
        "PRAGMA synchronous=FULL; PRAGMA journal_mode=DELETE; \
         CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);\n",
    );
    for i in 0..10_000 {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'row {i}');\n"));
    }
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), &sql).unwrap();
    sh(
        &store,
        &format!("sqlite3 /cairn/db.sqlite < {}", script.path().display()),
    );
    assert_eq!(
        sh(
            &store,
            "sqlite3 /cairn/db.sqlite 'PRAGMA integrity_check; SELECT count(*) FROM t;'"
        ),
        "ok\n10000\n"
    );

    // git: init, add, commit, log, fsck, in a Cairn current directory.
    sh(
        &store,
        "cd /cairn && git init -q repo && cd repo && printf 'a\\n' > a && mkdir -p s \
         && printf 'b\\n' > s/b && git add -A \
         && git -c user.email=t@e -c user.name=t commit -qm first \
         && printf 'c\\n' >> a && git -c user.email=t@e -c user.name=t commit -qam second \
         && git fsck --strict 2>&1",
    );
    assert_eq!(
        sh(&store, "cd /cairn/repo && git log --format=%s"),
        "second\nfirst\n"
    );

    // tar: create from the host, extract on Cairn, compare checksums.
    let src = tempfile::tempdir().unwrap();
    for i in 0..50 {
        let d = src.path().join(format!("d{}", i % 5));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), vec![i as u8; i * 997]).unwrap();
    }
    std::os::unix::fs::symlink("d0/f0", src.path().join("link")).unwrap();
    sh(
        &store,
        &format!(
            "mkdir /cairn/x && tar cf - -C {} . | tar xf - -C /cairn/x",
            src.path().display()
        ),
    );
    let sums = "find . -type f -exec sha256sum {} + | sort";
    let host = Command::new("sh")
        .args(["-c", sums])
        .current_dir(src.path())
        .output()
        .unwrap();
    assert_eq!(
        sh(&store, &format!("cd /cairn/x && {sums}")),
        String::from_utf8_lossy(&host.stdout)
    );
    assert_eq!(sh(&store, "readlink /cairn/x/link"), "d0/f0\n");
    // ... and back out with tar, read by the host.
    let back = tempfile::tempdir().unwrap();
    sh(
        &store,
        &format!(
            "tar cf - -C /cairn/x . | tar xf - -C {}",
            back.path().display()
        ),
    );
    let back_sums = Command::new("sh")
        .args(["-c", sums])
        .current_dir(back.path())
        .output()
        .unwrap();
    assert_eq!(back_sums.stdout, host.stdout);

    // Python: files, directories, os.replace, a listing, walk, realpath, getcwd.
    let out = python(
        &store,
        "import os
os.makedirs('/cairn/py/a/b', exist_ok=True)
os.chdir('/cairn/py')
with open('a/tmp', 'w') as f:
    f.write('v1')
os.replace('a/tmp', 'a/final')
with open('a/final', 'a') as f:
    f.write('+v2')
os.rmdir('a/b')
os.symlink('a/final', 'ln')
print(open('ln').read(), sorted(os.listdir('a')), os.stat('a/final').st_size)
print(os.getcwd(), os.path.realpath('ln'), [sorted(f) for _, _, f in os.walk('/cairn/py')])
",
    );
    assert_eq!(
        out,
        "v1+v2 ['final'] 5\n/cairn/py /cairn/py/a/final [['ln'], ['final']]\n"
    );
    assert_eq!(fs.read("/py/a/final").unwrap(), b"v1+v2");
    assert!(fs.metadata("/db.sqlite").unwrap().len() > 100_000);
    assert!(fs.metadata("/repo/.git/HEAD").unwrap().is_file());
}

#[test]
fn descriptors_fork_exec_mmap_stdio_and_directories() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"import os, select, subprocess, mmap, errno
d = '/cairn/t'
os.mkdir(d)
fd = os.open(d + '/f', os.O_RDWR | os.O_CREAT, 0o644)
# A real descriptor number: select and poll see it ready.
r, w, _ = select.select([fd], [fd], [], 0)
assert w == [fd], w
p = select.poll(); p.register(fd, select.POLLOUT); assert p.poll(0)
os.write(fd, b'hello')
# dup shares the description and its offset.
fd2 = os.dup(fd)
os.write(fd2, b' world')
assert os.lseek(fd, 0, os.SEEK_CUR) == 11
os.close(fd2)
# fork: the child writes through the inherited descriptor; the offset is shared.
pid = os.fork()
if pid == 0:
    os.write(fd, b'!child')
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
assert os.lseek(fd, 0, os.SEEK_CUR) == 17, os.lseek(fd, 0, os.SEEK_CUR)
os.lseek(fd, 0, 0)
assert os.read(fd, 100) == b'hello world!child'
# exec: a descriptor without O_CLOEXEC stays usable in the new program.
os.set_inheritable(fd, True)
subprocess.run(['sh', '-c', 'echo exec >&%d' % fd], pass_fds=[fd], check=True)
os.lseek(fd, 0, 0)
assert os.read(fd, 100) == b'hello world!childexec\n'
# ... and one with O_CLOEXEC is closed by exec.
cfd = os.open(d + '/f', os.O_RDONLY | os.O_CLOEXEC)
r = subprocess.run(['sh', '-c', 'cat <&%d' % cfd], close_fds=False, stderr=subprocess.DEVNULL)
assert r.returncode != 0
# Files created just before a fork are there for the child.
pid = os.fork()
if pid == 0:
    g = os.open(d + '/new', os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(g, b'from the child')
    os._exit(0)
os.waitpid(pid, 0)
assert open(d + '/new').read() == 'from the child'
# posix_spawn and system start programs inside the C library: prepared as for exec
# (the new file is digested, the descriptor named, the current directory passed on).
g = os.open(d + '/spawned', os.O_RDWR | os.O_CREAT, 0o644)
os.set_inheritable(g, True)
pid = os.posix_spawn('/bin/bash', ['bash', '-c', 'echo spawned >&%d' % g], dict(os.environ))
assert os.waitpid(pid, 0)[1] == 0
os.chdir(d)
assert os.system('echo system >> spawned') == 0
os.chdir('/')
os.lseek(g, 0, 0)
got = os.read(g, 100)
assert got == b'spawned\nsystem\n', got
os.close(g)
os.unlink(d + '/spawned')
# mmap: a shared mapping's changes reach the file at flush and at unmap.
with open(d + '/m', 'wb') as f:
    f.write(b'a' * 10000)
with open(d + '/m', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 10000)
    assert m[9999:] == b'a'
    m[0:5] = b'HELLO'
    m.flush()
    assert os.pread(f.fileno(), 5, 0) == b'HELLO'
    m[8192:8197] = b'TAIL!'
    m.close()
assert open(d + '/m', 'rb').read()[8192:8197] == b'TAIL!'
# A private mapping's changes do not.
with open(d + '/m', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    m[0:5] = b'-----'
    m.close()
assert open(d + '/m', 'rb').read(5) == b'HELLO'
# Directories: listing, scandir types, getdents through fd, rename, unlink, errors.
os.mkdir(d + '/sub')
names = sorted(e.name + ('/' if e.is_dir() else '') for e in os.scandir(d))
assert names == ['f', 'm', 'new', 'sub/'], names
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
assert sorted(os.listdir(dfd)) == ['f', 'm', 'new', 'sub']
os.rename('new', 'renamed', src_dir_fd=dfd, dst_dir_fd=dfd)
assert os.stat('renamed', dir_fd=dfd).st_size == 14
os.unlink('renamed', dir_fd=dfd)
try:
    os.rmdir(d)
except OSError as e:
    assert e.errno == errno.ENOTEMPTY
try:
    os.open(d + '/missing', os.O_RDONLY)
except OSError as e:
    assert e.errno == errno.ENOENT
try:
    os.link(d + '/f', '/tmp/cairn-cross-link-test')
except OSError as e:
    assert e.errno == errno.EXDEV
st = os.stat(d + '/f')
assert st.st_size == 22 and st.st_nlink == 1 and oct(st.st_mode) == '0o100644', st
os.truncate(d + '/f', 5)
assert open(d + '/f').read() == 'hello'
os.utime(d + '/f', (1000, 2000))
assert os.stat(d + '/f').st_mtime == 2000
os.chmod(d + '/f', 0o600)
assert os.stat(d + '/f').st_mode & 0o777 == 0o600
print('ok')
"#,
    );
    assert_eq!(out, "ok\n");

    // Shell redirections and stdio: builtins and external programs, both directions.
    let out = sh(
        &store,
        "cd /cairn/t && echo one > s && echo two >> s && cat s && sort -r < s \
         && ls / > /dev/null && ls /cairn/t > listing && cat listing \
         && bash -c 'echo builtin > b; printf \"%s\\n\" more >> b' && cat b \
         && awk '{ print toupper($0) > \"/cairn/t/awk\" }' s && cat awk",
    );
    assert_eq!(
        out,
        "one\ntwo\ntwo\none\nf\nlisting\nm\ns\nsub\nbuiltin\nmore\nONE\nTWO\n"
    );
    let fs = store.fs();
    assert_eq!(fs.read("/t/b").unwrap(), b"builtin\nmore\n");
}

#[test]
fn locks_through_the_shim_are_the_stores() {
    let store = TestStore::new();
    store.fs().write("/lockfile", b"x").unwrap();
    // A process holds a POSIX lock; another (through the shim) and an API client see it.
    let mut holder = run_cmd(
        &store,
        "python3 -c \"
import fcntl, sys
f = open('/cairn/lockfile', 'r+')
fcntl.lockf(f, fcntl.LOCK_EX)
print('locked', flush=True)
sys.stdin.readline()
\"",
    );
    let mut holder = holder
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let probe = "python3 -c \"
import fcntl
f = open('/cairn/lockfile', 'r+')
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print('got it')
except OSError:
    print('busy')
\"";
    assert_eq!(sh(&store, probe), "busy\n");
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&store.fs(), "/lockfile")
        .unwrap();
    let err = f
        .lock(cairn::LockKind::Posix, cairn::LockType::Write, 0, 0, false)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    assert_eq!(sh(&store, probe), "got it\n");
    // flock: exclusive between two shim processes.
    assert_eq!(
        sh(
            &store,
            "python3 -c \"
import fcntl, os
a = open('/cairn/lockfile'); fcntl.flock(a, fcntl.LOCK_EX)
pid = os.fork()
if pid == 0:
    b = open('/cairn/lockfile')
    try:
        fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB); os._exit(1)
    except OSError:
        os._exit(0)
print(os.waitpid(pid, 0)[1])
\""
        ),
        "0\n"
    );
}

#[test]
fn rocksdb_redis_and_fio_through_the_shim() {
    let store = TestStore::new();
    let out = sh(
        &store,
        "db_bench --benchmarks=fillrandom,fillseq,readrandom --num=2000 --sync=1 \
         --value_size=100 --threads=1 --db=/cairn/rdb 2>&1",
    );
    let rr = out
        .lines()
        .find(|l| l.starts_with("readrandom"))
        .unwrap_or_else(|| panic!("no readrandom line: {out}"));
    assert!(rr.contains("(2000 of 2000 found)"), "{rr}");

    // Redis with appendfsync always: SETs, a restart, the keys are still there.
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("r.sock");
    sh(&store, "mkdir /cairn/redis");
    let start = || {
        let c = run_cmd(
            &store,
            &format!(
                "exec redis-server --port 0 --unixsocket {} --dir /cairn/redis \
                 --appendonly yes --appendfsync always --save ''",
                sock.display()
            ),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    };
    let cli = |args: &str| {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("redis-cli -s {} {args}", sock.display()))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let mut server = start();
    let bench = Command::new("redis-benchmark")
        .arg("-s")
        .arg(&sock)
        .args(["-t", "set", "-n", "2000", "-r", "1000", "-q"])
        .output()
        .unwrap();
    assert!(bench.status.success());
    for i in 0..100 {
        cli(&format!("set key{i} value{i}"));
    }
    cli("shutdown nosave");
    server.wait().unwrap();
    let _ = std::fs::remove_file(&sock);
    let mut server = start();
    assert_eq!(cli("get key42").trim(), "value42");
    assert_eq!(cli("get key99").trim(), "value99");
    cli("shutdown nosave");
    server.wait().unwrap();

    // fio: random 4 KiB writes with an fsync after each, then verification.
    sh(
        &store,
        "mkdir /cairn/fio && fio --name=rw --directory=/cairn/fio --rw=randwrite --bs=4k \
         --size=4m --ioengine=psync --fsync=1 --verify=crc32c --do_verify=1 \
         --verify_fatal=1 --output=/dev/null",
    );
}

/// Pids of the processes running `python3` with `marker` in their command line.
fn pids_of(marker: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(marker) && cmd.starts_with(b"python3") {
                v.push(pid);
            }
        }
    }
    v
}

#[test]
fn killed_programs_and_a_killed_daemon_lose_nothing_committed() {
    let store = TestStore::new();
    // SQLite killed with SIGKILL in the middle of committing transactions.
    sh(
        &store,
        "sqlite3 /cairn/db 'PRAGMA journal_mode=DELETE; CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT)'",
    );
    let mut sql = String::from("PRAGMA synchronous=FULL;\n");
    for i in 0..400_000 {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'row {i}');\n"));
    }
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), &sql).unwrap();
    let mut child = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .args(["run", "--", "sqlite3", "/cairn/db"])
        .stdin(std::fs::File::open(script.path()).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let out = sh(
        &store,
        "sqlite3 /cairn/db 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("ok"), "{out}");
    let rows: u64 = lines.next().unwrap().parse().unwrap();
    assert!(rows > 0 && rows < 400_000, "killed mid-way: {rows} rows");

    // An appender that syncs each record and reports it; the daemon is killed twice
    // under it (LibFS restarts it), then the appender itself. Every reported record is
    // in the store, whole and in order.
    let marker = format!("appender-{}", std::process::id());
    let mut writer = run_cmd(
        &store,
        &format!(
            "exec python3 -c \"
import os, sys, time
fd = os.open('/cairn/log', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
n = 0
while n < 100000:
    os.write(fd, b'%08d' % n + b'x' * 56)
    os.fsync(fd)
    print(n, flush=True)
    n += 1
    time.sleep(0.00005)
\" {marker}"
        ),
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let stdout = writer.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut last = None;
        for l in std::io::BufReader::new(stdout).lines() {
            match l {
                Ok(l) => last = l.trim().parse::<usize>().ok(),
                Err(_) => break,
            }
        }
        last
    });
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(700));
        if let Some(pid) = daemon_pid(store.path()) {
            kill9(pid);
        }
    }
    std::thread::sleep(Duration::from_millis(700));
    for pid in pids_of(&marker) {
        kill9(pid);
    }
    let _ = writer.wait();
    let acked = reader
        .join()
        .unwrap()
        .expect("the appender acknowledged nothing");
    let log = store.fs().read("/log").unwrap();
    assert!(
        log.len() >= (acked + 1) * 64,
        "{} bytes for {} records",
        log.len(),
        acked + 1
    );
    for (i, r) in log.chunks(64).enumerate() {
        assert_eq!(r.len(), 64, "a torn record at {i}");
        assert_eq!(&r[..8], format!("{i:08}").as_bytes(), "record {i}");
    }
}

#[test]
fn run_reports_what_is_wrong() {
    let store = TestStore::new();
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .args(["run", "--prefix", "relative", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prefix"));
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .args(["run", "--", "/no/such/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    // Executing a program stored on Cairn is refused with a message.
    store.fs().write("/prog", b"#!/bin/sh\necho hi\n").unwrap();
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .args(["run", "--", "python3", "-c"])
        .arg("import os\ntry:\n    os.execv('/cairn/prog', ['prog'])\nexcept OSError as e:\n    print(e.errno)")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        libc::EACCES.to_string()
    );
}

/// Model-based: random sequences of POSIX calls (open with many flag sets, read, write,
/// pread, pwrite, lseek, ftruncate, fstat, stat, lstat, mkdir, rmdir, unlink, rename,
/// link, symlink, readlink, listdir, truncate, chmod, access, dup, fsync) applied by one
/// process running under the library to a host directory (Linux, the reference) and to
/// a Cairn directory; every outcome and errno, and the whole trees (kinds, sizes, modes,
/// link counts, contents, link targets) every 50 calls, must agree
/// (`crates/tests/scripts/shim_model.py`).
#[test]
fn random_call_sequences_match_linux() {
    let store = TestStore::new();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/shim_model.py");
    for seed in 1..=8 {
        let reference = tempfile::tempdir().unwrap();
        let out = sh(
            &store,
            &format!(
                "mkdir /cairn/m{seed} && python3 {script} {seed} 800 {} /cairn/m{seed}",
                reference.path().display()
            ),
        );
        assert_eq!(out, "ok 800\n", "seed {seed}");
    }
}

/// A private `mmap` of digested data maps the NVM tier file in place (read-only and
/// writable); a forked child gets copies; a private mapping's writes stay private.
#[test]
fn mmap_maps_digested_data_in_place() {
    let store = TestStore::new();
    let fs = store.fs();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    fs.write("/r.bin", &data).unwrap();
    fs.digest().unwrap();
    let expect = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(expect.path(), &data).unwrap();
    let nvm = std::fs::read_to_string(store.path().join("cairn.toml"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("nvm_path = \"")
                .map(|v| v.trim_end_matches('"').to_string())
        })
        .expect("nvm_path in cairn.toml");
    let out = python(
        &store,
        &format!(
            r#"import mmap, os
data = open('{expect}', 'rb').read()
def in_place():
    return [l for l in open('/proc/self/maps') if l.rstrip().endswith('{nvm}') and ' r--p ' in l]
f = open('/cairn/r.bin', 'rb')
m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
assert m[:] == data
assert len(in_place()) == 1, in_place()
lo, hi = (int(x, 16) for x in in_place()[0].split()[0].split('-'))
assert hi - lo == 24 * 4096, hi - lo  # the whole pages; the last partial one is a copy
pid = os.fork()
if pid == 0:
    ok = m[:] == data and not in_place()
    os._exit(0 if ok else 1)
assert os.waitpid(pid, 0)[1] == 0
m.close()
assert not in_place()
p = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
p[0:4] = b'XXXX'
assert p[4:] == data[4:]
p.close()
assert open('/cairn/r.bin', 'rb').read() == data
print('ok')
"#,
            expect = expect.path().display(),
        ),
    );
    assert_eq!(out, "ok\n");
}

/// A (private) mapping in place pins its blocks: another client rewriting the file and filling
/// the store cannot make the mapping show anything but what was mapped (the store runs
/// out of space rather than reuse them), and space comes back once it is unmapped.
#[test]
fn a_mapping_in_place_keeps_its_blocks() {
    let store = TestStore::with_size(cairn_tests::harness::StoreSize {
        nvm: "48M",
        log: "1M",
        clients: 4,
        inodes: Some(1024),
        tiers: None,
    });
    let fs = store.fs();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i / 4096) as u8 ^ 0x5a).collect();
    fs.write("/r.bin", &data).unwrap();
    fs.digest().unwrap();
    let expect = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(expect.path(), &data).unwrap();
    let mut mapper = run_cmd(
        &store,
        &format!(
            "exec python3 -c \"
import mmap, sys
data = open('{}', 'rb').read()
f = open('/cairn/r.bin', 'rb')
m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
print('mapped', flush=True)
sys.stdin.readline()
print('same' if m[:] == data else 'changed', flush=True)
m.close()
sys.stdin.readline()
\"",
            expect.path().display()
        ),
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = std::io::BufReader::new(mapper.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "mapped");
    // Rewrite the file over and over: far more than the store holds, so freed blocks
    // would be reused if the mapping did not hold them.
    let other: Vec<u8> = vec![0xee; 4 << 20];
    let mut full = false;
    for _ in 0..40 {
        match fs.write("/r.bin", &other).and_then(|()| fs.digest()) {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(cairn_area::errno_of(&e), libc::ENOSPC, "{e}");
                full = true;
                break;
            }
        }
    }
    assert!(
        full,
        "the store never filled up: the mapping pinned nothing"
    );
    let mut stdin = mapper.stdin.take().unwrap();
    use std::io::Write as _;
    writeln!(stdin).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "same");
    writeln!(stdin).unwrap();
    drop(stdin);
    assert!(mapper.wait().unwrap().success());
    // Unmapped (and gone): the space comes back.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match fs.write("/r.bin", &other).and_then(|()| fs.digest()) {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                assert_eq!(cairn_area::errno_of(&e), libc::ENOSPC, "{e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no space came back: {e}"),
        }
    }
}

/// `execl`, `execle` and `execlp` (variadic: C in the library) prepare exec like
/// `execve`: a descriptor opened since the last fork, of a file created and not yet
/// digested, works in the new program; arguments past the registers arrive; `execle`'s
/// environment is the one given.
#[test]
fn variadic_execs_are_prepared_like_execve() {
    let store = TestStore::new();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("execs.c");
    let bin = dir.path().join("execs");
    std::fs::write(
        &src,
        r#"#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
static void child(int which) {
    char path[64], script[128];
    snprintf(path, sizeof path, "/cairn/out%d", which);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0 || write(fd, "before ", 7) != 7) _exit(100);
    snprintf(script, sizeof script, "echo \"$FOO\" \"$@\" >&%d", fd);
    if (which == 0) {
        execl("/bin/sh", "sh", "-c", script, "x", "1", "2", "3", "4", "5", "6", "7", (char *)0);
    } else if (which == 1) {
        /* The environment, with FOO changed (Cairn's own variables stay). */
        char *env[256];
        int n = 0;
        for (char **e = environ; *e && n < 254; e++)
            if (strncmp(*e, "FOO=", 4) != 0) env[n++] = *e;
        env[n++] = "FOO=from-execle";
        env[n] = NULL;
        execle("/bin/sh", "sh", "-c", script, "x", "a", (char *)0, env);
    } else {
        execlp("sh", "sh", "-c", script, "x", "p", (char *)0);
    }
    _exit(101);
}
int main(void) {
    for (int i = 0; i < 3; i++) {
        pid_t p = fork();
        if (p == 0) child(i);
        int st;
        if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "child %d: status %d\n", i, st);
            return 1;
        }
    }
    return 0;
}
"#,
    )
    .unwrap();
    compile_c(&src, &bin);
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .arg("run")
        .arg("--")
        .arg(&bin)
        .env("FOO", "inherited")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fs = store.fs();
    let read = |p: &str| String::from_utf8(fs.read(p).unwrap()).unwrap();
    assert_eq!(read("/out0"), "before inherited 1 2 3 4 5 6 7\n");
    assert_eq!(read("/out1"), "before from-execle a\n");
    assert_eq!(read("/out2"), "before inherited p\n");
}

/// Extended attributes through the library (`scripts/xattr_check.py`, then `cp
/// --preserve=xattr` from the host), seen by an API client and kept across a killed
/// daemon.
#[test]
fn extended_attributes_through_the_shim() {
    let store = TestStore::new();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/xattr_check.py");
    assert_eq!(sh(&store, &format!("python3 {script} /cairn")), "ok\n");
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::write(&src, b"host data").unwrap();
    // A host path: the library passes the call to the C library.
    python(
        &store,
        &format!(
            "import os; os.setxattr('{}', 'user.origin', b'host')",
            src.display()
        ),
    );
    sh(
        &store,
        &format!("cp --preserve=xattr {} /cairn/copied", src.display()),
    );
    let check = |fs: &cairn::Fs| {
        assert_eq!(fs.get_xattr("/xf", b"user.a", true).unwrap(), b"22");
        assert_eq!(
            fs.list_xattr("/xf", true).unwrap(),
            vec![b"user.a".to_vec(), b"user.empty".to_vec()]
        );
        assert_eq!(fs.get_xattr("/xd", b"user.dir", true).unwrap(), b"d");
        assert_eq!(
            fs.get_xattr("/copied", b"user.origin", true).unwrap(),
            b"host"
        );
        assert_eq!(fs.read("/copied").unwrap(), b"host data");
    };
    check(&store.fs());
    // Durable when acknowledged: a killed daemon's successor has them.
    kill9(daemon_pid(store.path()).expect("daemon running"));
    check(&store.fs());
}

/// `scandir` and `glob` read directories inside the C library: the library gives them
/// Cairn's (a sorted, filtered listing; a pattern across host and Cairn paths).
#[test]
fn scandir_and_glob_see_cairn_directories() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.create_dir("/g").unwrap();
    for n in ["b.txt", "a.txt", "c.log", ".hidden"] {
        fs.write(format!("/g/{n}"), b"x").unwrap();
    }
    fs.create_dir("/g/sub").unwrap();
    fs.write("/g/sub/d.txt", b"x").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, bin) = (dir.path().join("sg.c"), dir.path().join("sg"));
    std::fs::write(
        &src,
        r#"#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int txt(const struct dirent *e) { return strstr(e->d_name, ".txt") != NULL; }
int main(int argc, char **argv) {
    struct dirent **list;
    int n = scandir("/cairn/g", &list, txt, alphasort);
    if (n < 0) { perror("scandir"); return 1; }
    for (int i = 0; i < n; i++) { printf("scandir %s\n", list[i]->d_name); free(list[i]); }
    free(list);
    n = scandir("/cairn/g", &list, NULL, alphasort);
    printf("scandir all %d\n", n);
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
    if (scandir("/cairn/none", &list, NULL, NULL) >= 0) return 2;
    printf("scandir missing: %s\n", strerror(errno));
    glob_t g;
    char pat[4096];
    snprintf(pat, sizeof pat, "{/cairn/g/*.txt,/cairn/g/*/*.txt,%s/*.host}", argv[1]);
    int r = glob(pat, GLOB_BRACE | GLOB_MARK, NULL, &g);
    if (r != 0) { printf("glob %d\n", r); return 3; }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *p = g.gl_pathv[i];
        printf("glob %s\n", strncmp(p, argv[1], strlen(argv[1])) ? p : p + strlen(argv[1]));
    }
    globfree(&g);
    r = glob("/cairn/g/s*", GLOB_MARK | GLOB_ONLYDIR, NULL, &g);
    printf("onlydir %d %s\n", r, r == 0 ? g.gl_pathv[0] : "-");
    globfree(&g);
    return 0;
}
"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("x.host"), b"h").unwrap();
    compile_c(&src, &bin);
    let out = sh(
        &store,
        &format!("{} {} 2>&1", bin.display(), dir.path().display()),
    );
    assert_eq!(
        out,
        "scandir a.txt\nscandir b.txt\nscandir all 7\n\
         scandir missing: No such file or directory\n\
         glob /cairn/g/a.txt\nglob /cairn/g/b.txt\nglob /cairn/g/sub/d.txt\nglob /x.host\n\
         onlydir 0 /cairn/g/sub/\n"
    );
}

/// `nftw` and `ftw` walk Cairn trees as glibc walks host trees: the same program on a
/// copy of the tree in each gives the same visits (sorted: the order is each directory
/// listing's own), then removes the tree depth first.
#[test]
fn nftw_and_ftw_walk_cairn_trees_as_glibc_walks_host_ones() {
    let store = TestStore::new();
    let dir = tempfile::tempdir().unwrap();
    let (src, bin) = (dir.path().join("walk.c"), dir.path().join("walk"));
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <string.h>
static size_t root;
static const char *kind(int t) {
    switch (t) {
    case FTW_F: return "F"; case FTW_D: return "D"; case FTW_DNR: return "DNR";
    case FTW_NS: return "NS"; case FTW_SL: return "SL"; case FTW_DP: return "DP";
    case FTW_SLN: return "SLN"; default: return "?";
    }
}
static int show(const char *p, const struct stat *st, int t, struct FTW *f) {
    printf("nftw %s %s level %d name %s size %lld\n", kind(t), p + root, f->level, p + f->base,
           t == FTW_F ? (long long)st->st_size : -1LL);
    return 0;
}
static int skip(const char *p, const struct stat *st, int t, struct FTW *f) {
    printf("skip %s %s\n", kind(t), p + root);
    return strcmp(p + f->base, "sub") == 0 ? FTW_SKIP_SUBTREE : FTW_CONTINUE;
}
static int old(const char *p, const struct stat *st, int t) {
    printf("ftw %s %s\n", kind(t), p + root);
    return 0;
}
static int rm(const char *p, const struct stat *st, int t, struct FTW *f) {
    return remove(p) == 0 ? 0 : (perror(p), 1);
}
int main(int argc, char **argv) {
    root = strlen(argv[1]);
    if (nftw(argv[1], show, 4, FTW_PHYS) != 0) return 1;
    if (nftw(argv[1], show, 4, FTW_DEPTH) != 0) return 2;
    if (nftw(argv[1], skip, 4, FTW_ACTIONRETVAL) != 0) return 3;
    if (ftw(argv[1], old, 4) != 0) return 4;
    printf("missing %d\n", nftw("/cairn/none/x", show, 4, 0));
    if (nftw(argv[1], rm, 4, FTW_DEPTH | FTW_PHYS) != 0) return 5;
    return 0;
}
"#,
    )
    .unwrap();
    compile_c(&src, &bin);
    let host = dir.path().join("w");
    let tree = "mkdir -p {0}/sub {0}/empty && printf abc > {0}/a.txt && printf hello > \
                {0}/sub/b.txt && ln -s ../a.txt {0}/sub/link && ln -s nowhere {0}/dangling";
    let run = |root: &str| {
        let out = sh(
            &store,
            &format!("{} && {} {root}", tree.replace("{0}", root), bin.display()),
        );
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    };
    let on_host = run(&host.display().to_string());
    let on_cairn = run("/cairn/w");
    assert_eq!(on_cairn, on_host);
    assert!(
        on_cairn.contains("nftw SLN /dangling level 1 name dangling"),
        "{on_cairn}"
    );
    assert!(
        on_cairn.contains("nftw F /sub/link level 2 name link size 3"),
        "{on_cairn}"
    );
    assert!(!on_cairn.contains("skip F /sub/b.txt"), "{on_cairn}");
    // The depth-first walk removed the whole tree.
    assert!(store.fs().metadata("/w").is_err());
    assert!(!host.exists());
}

/// A program whose threads all start with a file call of the store at the same moment
/// gets one client (one registration, one log slot), not one per thread: on a store
/// with two slots, sixteen threads that start while the daemon is slow to answer
/// (stopped for a moment) all succeed, and the daemon registered the program once.
#[test]
fn threads_starting_together_share_one_client() {
    let store = TestStore::with_size(cairn_tests::harness::StoreSize {
        clients: 2,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("threads.c");
    let bin = dir.path().join("threads");
    std::fs::write(
        &src,
        r#"
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static pthread_barrier_t start;
static void *one(void *arg) {
    char path[64];
    snprintf(path, sizeof path, "/cairn/t%ld", (long)arg);
    pthread_barrier_wait(&start);
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) { perror(path); return (void *)1; }
    if (write(fd, path, 9) != 9 || close(fd) != 0) { perror(path); return (void *)1; }
    return 0;
}
int main(void) {
    pthread_t t[16];
    pthread_barrier_init(&start, 0, 16);
    for (long i = 0; i < 16; i++) pthread_create(&t[i], 0, one, (void *)i);
    int bad = 0;
    for (int i = 0; i < 16; i++) { void *r; pthread_join(t[i], &r); bad += r != 0; }
    printf("%d failed\n", bad);
    return bad != 0;
}
"#,
    )
    .unwrap();
    compile_c(&src, &bin);
    let fs = store.fs();
    let daemon = store.daemon_pid().expect("the daemon runs");
    let signal = |s: &str| {
        let st = Command::new("kill")
            .args([s, &daemon.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    };
    // The daemon stopped, every thread's first call waits for the client to open.
    signal("-STOP");
    // Loaded straight (`cairn run` would wait for the daemon itself first).
    let lib = cairn_bin().with_file_name("libcairn_preload.so");
    let child = Command::new(&bin)
        .env("LD_PRELOAD", &lib)
        .env("CAIRN_STORE", store.path())
        .env("CAIRN_PREFIX", "/cairn")
        .env("CAIRN_BIN", cairn_bin())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    signal("-CONT");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0 failed\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One besides this test's own.
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    let me = format!("(pid {},", std::process::id());
    let registered = log
        .lines()
        .filter(|l| l.contains("client registered") && !l.contains(&me))
        .count();
    assert_eq!(registered, 1, "registrations:\n{log}");
    for i in 0..16 {
        assert_eq!(
            fs.read(format!("/t{i}")).unwrap(),
            format!("/cairn/t{i}").as_bytes()[..9]
        );
    }
}

/// Symbolic links resolve as the kernel resolves them, with the store at `/cairn`: an
/// absolute target under the prefix is inside the store, one elsewhere (and `..` at the
/// store's root) is the host's; `os.walk`, `shutil` and `pathlib` follow them.
#[test]
fn absolute_symlinks_and_dot_dot_lead_where_the_kernel_would() {
    let store = TestStore::new();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("outside"), b"host data").unwrap();
    std::fs::create_dir(host.path().join("hostdir")).unwrap();
    let out = python(
        &store,
        &format!(
            r#"
import os, shutil, pathlib
os.makedirs('/cairn/d/sub')
with open('/cairn/d/target', 'w') as f: f.write('store data')
os.symlink('/cairn/d/target', '/cairn/d/abs')
os.symlink('/cairn/d/sub', '/cairn/d/absdir')
os.symlink('/cairn', '/cairn/root')
os.symlink('{h}/outside', '/cairn/d/out')
os.symlink('{h}/hostdir', '/cairn/d/outdir')
os.symlink('../../..{h}/outside', '/cairn/d/up')
print(open('/cairn/d/abs').read())
print(os.path.exists('/cairn/d/absdir/'), os.path.isdir('/cairn/root/d/sub'))
print(open('/cairn/d/out').read(), open('/cairn/d/up').read())
with open('/cairn/d/outdir/new', 'w') as f: f.write('made through a link')
print(sorted(os.listdir('/cairn/d/outdir')), os.stat('/cairn/d/out').st_size)
print(os.path.realpath('/cairn/d/abs'), open('/cairn/../{hr}/outside').read())
shutil.copy('/cairn/d/abs', '/cairn/d/copy')
shutil.copytree('/cairn/d', '/cairn/tree', symlinks=True)
print(os.readlink('/cairn/tree/abs'), open('/cairn/tree/copy').read())
print(sorted(p.name for p in pathlib.Path('/cairn/d').iterdir() if p.is_file()))
walked = sorted(r for r, _, _ in os.walk('/cairn/d', followlinks=True))
print(len(walked), '/cairn/d/absdir' in walked)
shutil.rmtree('/cairn/tree')
os.chdir('/cairn/d/outdir'); print(open('new').read())
import subprocess
os.symlink('/bin/echo', '/cairn/echo')
print(subprocess.run(['/cairn/echo', 'ran'], capture_output=True).stdout.decode().strip())
"#,
            h = host.path().display(),
            hr = host.path().display().to_string().trim_start_matches('/'),
        ),
    );
    assert_eq!(
        out,
        "store data\nTrue True\nhost data host data\n['new'] 9\n\
         /cairn/d/target host data\n/cairn/d/target store data\n\
         ['abs', 'copy', 'out', 'target', 'up']\n4 True\nmade through a link\nran\n",
        "through the shim"
    );
    assert_eq!(
        std::fs::read_to_string(host.path().join("hostdir/new")).unwrap(),
        "made through a link"
    );
    // The API's view is unchanged: the store is the whole namespace there.
    let fs = store.fs();
    assert_eq!(
        fs.read_link("/d/abs").unwrap(),
        std::path::Path::new("/cairn/d/target")
    );
    assert!(fs.read("/d/abs").is_err(), "no /cairn inside the store");
}

/// A root process that drops to another user (`setgroups`, `setgid`, `setuid`) goes on
/// with exactly what Linux allows that user (`scripts/drop_privileges.py`, run on the
/// host and through the shim, compared line by line), keeping what it opened before.
#[test]
fn a_process_that_drops_privileges_gets_the_new_users_rights() {
    if cairn_media::sys::ids().0 != 0 {
        eprintln!("skipped: needs root (to drop privileges)");
        return;
    }
    let store = TestStore::new();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/drop_privileges.py");
    let host = tempfile::tempdir().unwrap();
    let want = Command::new("python3")
        .arg(script)
        .arg(host.path())
        .output()
        .unwrap();
    assert!(want.status.success(), "{want:?}");
    let want = String::from_utf8(want.stdout).unwrap();
    assert!(
        want.contains("read secret EACCES\n") && want.contains("read held secret\n"),
        "{want}"
    );
    store.fs().create_dir("/drop").unwrap();
    let got = sh(&store, &format!("python3 {script} /cairn/drop"));
    for (w, g) in want.lines().zip(got.lines()) {
        assert_eq!(g, w, "through the shim vs on the host");
    }
    assert_eq!(got.lines().count(), want.lines().count(), "{got}");
    // The daemon checked the nobody's records with nobody's credentials: they are in.
    let fs = store.fs();
    assert_eq!(fs.read("/drop/open/mine").unwrap(), b"mine");
    assert_eq!(fs.metadata("/drop/open/mine").unwrap().uid(), 65534);
}

/// A program that closes descriptors wholesale (`close_range`, as a `subprocess` child
/// does between `fork` and `exec`) closes the library's own too: the library publishes
/// its log and steps aside first, and the next call works through a new client.
#[test]
fn closing_every_descriptor_leaves_the_store_usable() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"
import os, subprocess
os.makedirs('/cairn/cr/dist')
with open('/cairn/cr/dist/a', 'w') as f: f.write('hi')
# The child enters the Cairn directory, closes everything it inherited, runs tar.
r = subprocess.run(['tar', '-cf', 'a.tar', 'dist'], cwd='/cairn/cr', stdout=subprocess.DEVNULL)
print('tar', r.returncode, os.path.getsize('/cairn/cr/a.tar') > 0)
fd = os.open('/cairn/cr/before', os.O_WRONLY | os.O_CREAT)
os.write(fd, b'written before')
os.closerange(3, 1 << 20)
with open('/cairn/cr/after', 'w') as f: f.write('written after')
print(open('/cairn/cr/before').read(), '/', open('/cairn/cr/after').read())
"#,
    );
    assert_eq!(out, "tar 0 True\nwritten before / written after\n");
    let fs = store.fs();
    assert_eq!(fs.read("/cr/before").unwrap(), b"written before");
}

/// A program that closes every descriptor it did not open one by one (`close` in a loop,
/// as daemons written before `closefrom` do), or `dup2`s over them, closes the library's
/// own too: each time the library publishes its log and steps aside first, and the next
/// call works through a new client. Nothing of the library ever writes to a descriptor
/// the program reuses (its own files stay empty), and the store is consistent.
#[test]
fn closing_the_library_descriptors_one_by_one_leaves_the_store_usable() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"
import os
fd = os.open('/cairn/before', os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b'before')
def close_others():
    for n in range(3, 1024):
        if n != fd:
            try: os.close(n)
            except OSError: pass
close_others()
hosts = [os.open('/tmp/cairn-test-host-%d-%d' % (os.getpid(), i),
                 os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600) for i in range(8)]
for i in range(300):
    with open('/cairn/f%d' % i, 'wb') as f: f.write(b'z' * 65536)
    os.fsync(fd)
# dup2 of a host file over every other descriptor.
for n in range(3, 64):
    if n != fd and n not in hosts:
        os.dup2(hosts[0], n)
for i in range(300, 400):
    with open('/cairn/f%d' % i, 'wb') as f: f.write(b'z' * 65536)
os.write(fd, b'+after')
sizes = [os.fstat(h).st_size for h in hosts]
for i in range(8): os.unlink('/tmp/cairn-test-host-%d-%d' % (os.getpid(), i))
print(sizes, len(os.listdir('/cairn')), open('/cairn/before').read())
"#,
    );
    assert_eq!(out, "[0, 0, 0, 0, 0, 0, 0, 0] 401 before+after\n");
    let fs = store.fs();
    assert_eq!(fs.read("/f399").unwrap().len(), 65536);
    drop(fs);
    store.fsck_clean();
}

/// `posix_spawn` with a file action that opens a Cairn path (relative to a Cairn working
/// directory): the new program's descriptor is that Cairn file.
#[test]
fn posix_spawn_opens_cairn_files_for_the_child() {
    let store = TestStore::new();
    let out = python(
        &store,
        r#"
import os
os.makedirs('/cairn/sp')
os.chdir('/cairn/sp')
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
pid = os.posix_spawn('/bin/echo', ['echo', 'spawned'], os.environ,
                     file_actions=[(os.POSIX_SPAWN_OPEN, 1, 'out.txt', flags, 0o640)])
print(os.waitpid(pid, 0)[1], open('/cairn/sp/out.txt').read().strip(),
      oct(os.stat('out.txt').st_mode & 0o777))
"#,
    );
    assert_eq!(out, "0 spawned 0o640\n");
}

/// `F_NOTIFY` on Cairn files: asking for no event (`DN_MULTISHOT` alone, or 0) succeeds,
/// as on Linux, where it removes the descriptor's notification; events on a file are
/// `ENOTDIR`, as on Linux; on a directory they are refused with `EINVAL` (directory
/// change notification is not supported: docs/SHIM.md).
#[test]
fn f_notify_without_events_succeeds_and_with_events_is_refused() {
    let store = TestStore::new();
    store.fs().create_dir("/d").unwrap();
    store.fs().write("/d/f", b"x").unwrap();
    let out = sh(
        &store,
        "python3 -c \"
import errno, fcntl, os
d = os.open('/cairn/d', os.O_RDONLY)
f = os.open('/cairn/d/f', os.O_RDONLY)
def call(fd, flags):
    try:
        return fcntl.fcntl(fd, fcntl.F_NOTIFY, flags)
    except OSError as e:
        return errno.errorcode[e.errno]
print(call(d, fcntl.DN_MULTISHOT), call(d, 0), call(f, fcntl.DN_MULTISHOT),
      call(d, fcntl.DN_CREATE), call(f, fcntl.DN_CREATE))
\"",
    );
    assert_eq!(out, "0 0 0 EINVAL ENOTDIR\n");
}

/// `cairn bench mail` in miniature, on a store the mailboxes would outgrow in the seconds
/// asked for: each run stops at the mails the free space holds (Cairn's at least: it is
/// the fastest to get there) and the report says so; a store too small for a useful run
/// is refused with a clear error; nothing is left in /dev/shm.
#[test]
fn the_mail_benchmark_stops_at_what_the_store_holds() {
    let s = TestStore::with_size(StoreSize {
        nvm: "128M",
        ..StoreSize::default()
    });
    let mail = |extra: &[&str]| {
        Command::new(cairn_bin())
            .arg("--store")
            .arg(s.path())
            .args(["bench", "mail", "--json", "--threads", "2"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = mail(&["--files", "200", "--seconds", "60"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["max_mails"].as_u64().unwrap() >= 4096, "{v}");
    assert!(v["capped_runs"].as_u64().unwrap() >= 1, "{v}");
    for r in v["results"].as_array().unwrap() {
        assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        v["results"][0]["digest"]["records"].as_u64().unwrap() > 0,
        "{v}"
    );
    let o = mail(&["--files", "100000", "--seconds", "1"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("use a larger store"), "{err}");
    let left = cairn_tests::harness::shm_leftovers("cairn-bench-mail-");
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}
