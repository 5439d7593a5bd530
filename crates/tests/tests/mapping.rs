//! Shared writable mappings (`MAP_SHARED`) across processes: coherent at once, nothing
//! lost when a process dies, every path agreeing (`docs/ARCHITECTURE.md`, "Shared
//! mappings"). Real programs (SQLite in WAL mode, LMDB, C with atomics) through the shim,
//! the Rust API's `File::map_mut`, and the FUSE mount.
//! Needs python3 with sqlite3 and lmdb, cc, fuse3 (scripts/setup.sh).

use cairn_tests::harness::{cairn_bin, kill9};
use cairn_tests::shim::{compile_c, python, run_cmd};
use cairn_tests::TestStore;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A Python program kept on the host, run through the shim with arguments.
struct Script(tempfile::NamedTempFile);

impl Script {
    fn new(code: &str) -> Script {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), code).unwrap();
        Script(f)
    }
    fn spawn(&self, store: &TestStore, args: &str) -> Child {
        run_cmd(
            store,
            &format!("exec python3 {} {args}", self.0.path().display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    }
}

/// `cairn stop` on `store`; its stdout.
fn cairn_stop(store: &TestStore) -> String {
    cairn_tests::harness::output_ok(
        Command::new(cairn_bin())
            .args(["stop", "--store"])
            .arg(store.path()),
        "cairn stop",
    )
}

/// The next line a child printed (trimmed).
fn next_line(out: &mut impl BufRead) -> String {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line.trim().to_string()
}

/// Wait for `c`; its stdout (the test fails with stderr if it failed).
fn finish(c: Child, what: &str) -> String {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SQLITE_WRITER: &str = r#"
import sqlite3, sys
db, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = sqlite3.connect(db, timeout=120, isolation_level=None)
c.execute('PRAGMA journal_mode=WAL')
c.execute('CREATE TABLE IF NOT EXISTS t(tag TEXT, i INTEGER)')
for i in range(n):
    c.execute('BEGIN IMMEDIATE')
    c.execute('INSERT INTO t VALUES (?, ?)', (tag, i))
    c.execute('COMMIT')
    print(i, flush=True)
"#;

/// `PRAGMA integrity_check` and, per tag, the sorted distinct values of `i`.
fn sqlite_contents(
    store: &TestStore,
    db: &str,
) -> (String, std::collections::BTreeMap<String, Vec<i64>>) {
    let out = python(
        store,
        &format!(
            r#"import sqlite3
c = sqlite3.connect('{db}')
print(c.execute('PRAGMA integrity_check').fetchone()[0])
for tag, i in c.execute('SELECT tag, i FROM t ORDER BY tag, i'):
    print(tag, i)
"#
        ),
    );
    let mut lines = out.lines();
    let check = lines.next().unwrap_or_default().to_string();
    let mut rows: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for l in lines {
        let (t, i) = l.split_once(' ').unwrap();
        rows.entry(t.to_string())
            .or_default()
            .push(i.parse().unwrap());
    }
    (check, rows)
}

fn create_wal_db(store: &TestStore, db: &str) {
    python(
        store,
        &format!(
            "import sqlite3\nc = sqlite3.connect('{db}')\nc.execute('PRAGMA journal_mode=WAL')\n\
             c.execute('CREATE TABLE IF NOT EXISTS t(tag TEXT, i INTEGER)')\nc.close()\n"
        ),
    );
}

/// The issue's report: two (and four) processes committing into one WAL database; every
/// commit is there and the database is intact (the wal-index in `-shm` is a shared
/// mapping every connection reads and writes).
#[test]
fn sqlite_wal_writers_in_several_processes_lose_no_commit() {
    let store = TestStore::new();
    let script = Script::new(SQLITE_WRITER);
    for (procs, n) in [(2usize, 2000i64), (4, 600)] {
        let db = format!("/cairn/w{procs}.db");
        create_wal_db(&store, &db);
        let kids: Vec<Child> = (0..procs)
            .map(|p| script.spawn(&store, &format!("{db} p{p} {n}")))
            .collect();
        for (p, k) in kids.into_iter().enumerate() {
            finish(k, &format!("writer {p}"));
        }
        let (check, rows) = sqlite_contents(&store, &db);
        assert_eq!(check, "ok", "{procs} processes");
        for p in 0..procs {
            let got = rows.get(&format!("p{p}")).cloned().unwrap_or_default();
            assert_eq!(
                got,
                (0..n).collect::<Vec<_>>(),
                "{procs} processes, writer {p}"
            );
        }
    }
}

/// Writers killed with SIGKILL mid-run, three rounds on one database: every commit a
/// writer acknowledged (printed after `COMMIT` returned) is there, and the database is
/// intact.
#[test]
fn sqlite_wal_writers_killed_mid_run_lose_no_acknowledged_commit() {
    let store = TestStore::new();
    let script = Script::new(SQLITE_WRITER);
    let db = "/cairn/k.db";
    create_wal_db(&store, db);
    let mut acked: std::collections::BTreeMap<String, i64> = Default::default();
    for round in 0..3u64 {
        // Each writer's last acknowledged commit, followed by a thread on its stdout.
        let kids: Vec<(String, Child, std::thread::JoinHandle<i64>, Arc<AtomicI64>)> = (0..3)
            .map(|p| {
                let tag = format!("r{round}p{p}");
                let mut c = script.spawn(&store, &format!("{db} {tag} 1000000"));
                let last = Arc::new(AtomicI64::new(-1));
                let (l, out) = (last.clone(), c.stdout.take().unwrap());
                let t = std::thread::spawn(move || {
                    for line in BufReader::new(out).lines() {
                        if let Ok(i) = line.unwrap_or_default().trim().parse() {
                            l.store(i, Ordering::SeqCst);
                        }
                    }
                    l.load(Ordering::SeqCst)
                });
                (tag, c, t, last)
            })
            .collect();
        // Kill once every writer has committed a little (mid-commit, most likely).
        let deadline = Instant::now() + Duration::from_secs(60);
        while kids.iter().any(|k| k.3.load(Ordering::SeqCst) < 20) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50 + 100 * round));
        for (tag, mut c, t, _) in kids {
            kill9(c.id());
            let _ = c.wait();
            acked.insert(tag, t.join().unwrap());
        }
        let (check, rows) = sqlite_contents(&store, db);
        assert_eq!(check, "ok", "round {round}");
        for (tag, &last) in &acked {
            let got = rows.get(tag).cloned().unwrap_or_default();
            let want: Vec<i64> = (0..=last).collect();
            assert!(
                got.len() >= want.len() && got[..want.len()] == want[..],
                "round {round}, {tag}: acknowledged 0..={last}, found {} rows",
                got.len()
            );
        }
    }
    assert!(
        acked.values().all(|&l| l >= 20),
        "writers made progress before the kills: {acked:?}"
    );
}

const COUNTER_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 1; }
    long n = atol(argv[2]);
    unsigned long *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    printf("mapped\n"); fflush(stdout);
    for (long i = 0; i < n; i++) __atomic_fetch_add(&p[0], 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&p[1], 1, __ATOMIC_SEQ_CST);
    if (munmap(p, 4096) != 0) { perror("munmap"); return 1; }
    return 0;
}
"#;

/// Two processes increment one counter in a mapped file with atomic instructions: the
/// sum is exact, in the mapping and in the file afterwards.
#[test]
fn atomic_counters_in_one_mapping_from_two_processes() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.write("/counter", vec![0u8; 4096]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("counter.c");
    std::fs::write(&src, COUNTER_C).unwrap();
    let bin = dir.path().join("counter");
    compile_c(&src, &bin);
    const N: u64 = 2_000_000;
    let kids: Vec<Child> = (0..2)
        .map(|_| {
            run_cmd(
                &store,
                &format!("exec {} /cairn/counter {N}", bin.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for k in kids {
        finish(k, "counter");
    }
    let data = fs.read("/counter").unwrap();
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!((word(0), word(1)), (2 * N, 2));
    drop(fs);
    assert!(cairn::map_object_files(store.path()).unwrap().is_empty());
}

/// A process stores into a mapping and is killed with SIGKILL before `msync`: the
/// stores are in the file (for readers through the API, another mapping, and after
/// `cairn stop` in the store itself); also when the daemon is killed too.
#[test]
fn stores_survive_sigkill_before_msync() {
    let store = TestStore::new();
    let fs = store.fs();
    let size = 1usize << 20;
    let pattern: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let pat = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(pat.path(), &pattern).unwrap();
    for kill_daemon in [false, true] {
        fs.write("/s.bin", vec![0u8; size]).unwrap();
        let script = Script::new(&format!(
            r#"import mmap, os, sys
m = mmap.mmap(os.open('/cairn/s.bin', os.O_RDWR), {size})
m[:] = open('{}', 'rb').read()
print('stored', flush=True)
sys.stdin.readline()
"#,
            pat.path().display()
        ));
        let mut c = script.spawn(&store, "");
        assert_eq!(
            next_line(&mut BufReader::new(c.stdout.take().unwrap())),
            "stored"
        );
        kill9(c.id());
        let _ = c.wait();
        if kill_daemon {
            kill9(store.daemon_pid().expect("daemon"));
        }
        assert!(fs.read("/s.bin").unwrap() == pattern, "read after the kill");
        let again = python(
            &store,
            &format!(
                "import mmap, os\nm = mmap.mmap(os.open('/cairn/s.bin', os.O_RDONLY), 0, prot=mmap.PROT_READ)\n\
                 print(m[:] == open('{}', 'rb').read())\n",
                pat.path().display()
            ),
        );
        assert_eq!(again, "True\n", "another mapping");
    }
    drop(fs);
    cairn_stop(&store);
    assert!(cairn::map_object_files(store.path()).unwrap().is_empty());
    // Into the store itself: `cairn stop` wrote the object back.
    assert!(store.fs().read("/s.bin").unwrap() == pattern);
}

/// Killed before `msync`, then `cairn stop`: the stores are written back into the store.
#[test]
fn cairn_stop_writes_back_what_a_killed_mapper_stored() {
    let store = TestStore::new();
    store.fs().write("/k.bin", vec![0u8; 8192]).unwrap();
    let script = Script::new(
        "import mmap, os, sys\nm = mmap.mmap(os.open('/cairn/k.bin', os.O_RDWR), 8192)\n\
         m[100:105] = b'kept!'\nprint('stored', flush=True)\nsys.stdin.readline()\n",
    );
    let mut c = script.spawn(&store, "");
    assert_eq!(
        next_line(&mut BufReader::new(c.stdout.take().unwrap())),
        "stored"
    );
    kill9(c.id());
    let _ = c.wait();
    assert_eq!(cairn::map_object_files(store.path()).unwrap().len(), 1);
    let out = cairn_stop(&store);
    assert!(out.contains("wrote back 1"), "{out}");
    assert!(cairn::map_object_files(store.path()).unwrap().is_empty());
    assert_eq!(&store.fs().read("/k.bin").unwrap()[100..105], b"kept!");
}

/// LMDB (the Python package): two writer processes and a reader on one environment
/// (data file mapped read-only and written with `pwrite`; lock file mapped shared).
#[test]
fn lmdb_two_writers_and_a_reader() {
    let store = TestStore::new();
    store.fs().create_dir("/lm").unwrap();
    let script = Script::new(
        r#"import lmdb, sys, time
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = lmdb.open(path, map_size=64 << 20)
if tag == 'reader':
    last, deadline = 0, time.time() + 120
    while last < n and time.time() < deadline:
        with env.begin() as t:
            c = t.stat()['entries']
            assert c >= last, (c, last)
            last = c
            for k, v in t.cursor():
                assert v == k + b'!', (k, v)
    print(last, flush=True)
else:
    for i in range(n):
        with env.begin(write=True) as t:
            k = ('%s-%06d' % (tag, i)).encode()
            t.put(k, k + b'!')
"#,
    );
    let n = 1500;
    let a = script.spawn(&store, &format!("/cairn/lm a {n}"));
    let r = script.spawn(&store, &format!("/cairn/lm reader {}", 2 * n));
    let b = script.spawn(&store, &format!("/cairn/lm b {n}"));
    finish(a, "writer a");
    finish(b, "writer b");
    assert_eq!(finish(r, "reader").trim(), (2 * n).to_string());
    let out = python(
        &store,
        "import lmdb\nenv = lmdb.open('/cairn/lm')\nt = env.begin()\n\
         kv = list(t.cursor())\nprint(len(kv), all(v == k + b'!' for k, v in kv))\n",
    );
    assert_eq!(out, format!("{} True\n", 2 * n));
}

/// `write` through a descriptor, `ftruncate`, `fork`, an unlink by another process and
/// another process's mapping of the same range all agree.
#[test]
fn writes_truncation_fork_and_unlink_agree_with_mappings() {
    let store = TestStore::new();
    store.fs().write("/i.bin", vec![b'.'; 3 * 4096]).unwrap();
    let out = python(
        &store,
        &(LIBC_PY.to_string()
            + r#"import mmap, os, signal, subprocess, sys
LIBC = """{LIBC}"""
def other(code):
    # Another process (a client of its own) through the shim.
    return subprocess.run([sys.executable, '-c', 'import mmap, os\n' + code],
                          capture_output=True, text=True)
fd = os.open('/cairn/i.bin', os.O_RDWR)
m = mmap.mmap(fd, 3 * 4096)
# A write through a descriptor in another process is in this mapping at once.
r = other("fd = os.open('/cairn/i.bin', os.O_RDWR); os.pwrite(fd, b'written', 10)")
assert r.returncode == 0, r.stderr
assert m[10:17] == b'written', m[10:17]
# Stores here are what another process reads at once (before any msync).
m[20:26] = b'stored'
r = other("print(os.pread(os.open('/cairn/i.bin', os.O_RDONLY), 6, 20).decode())")
assert r.stdout.strip() == 'stored', (r.stdout, r.stderr)
# fork: the child's stores are in the parent's mapping and the other way round.
pid = os.fork()
if pid == 0:
    m[30:35] = b'child'
    os._exit(0)
os.waitpid(pid, 0)
assert m[30:35] == b'child'
# Truncated by another process: a page past the new end faults (SIGBUS), as on Linux.
r = other("os.ftruncate(os.open('/cairn/i.bin', os.O_RDWR), 4096)")
assert r.returncode == 0, r.stderr
assert os.fstat(fd).st_size == 4096
r = other(LIBC + "p = mmap_(3 * 4096, os.open('/cairn/i.bin', os.O_RDWR))\nctypes.memset(p + 2 * 4096, 1, 1)")
assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)
assert m[10:17] == b'written'
# Extended again: the cut range reads as zeros.
os.ftruncate(fd, 3 * 4096)
assert m[4096:2 * 4096] == bytes(4096)
# Unlinked by another process while mapped: the mapping and the descriptor stay valid.
r = other("os.unlink('/cairn/i.bin')")
assert r.returncode == 0, r.stderr
m[40:47] = b'orphan!'
m.flush()
assert os.pread(fd, 7, 40) == b'orphan!'
m.close()
os.close(fd)
assert not os.path.exists('/cairn/i.bin')
print('ok')
"#)
            .replace("{LIBC}", LIBC_PY),
    );
    assert_eq!(out, "ok\n");
    assert!(cairn::map_object_files(store.path()).unwrap().is_empty());
}

/// The Rust API's `File::map_mut` and a process mapping the file through the shim see
/// each other's stores at once; `flush` makes them visible to `read`; atomics work
/// across the two.
#[test]
fn map_mut_and_a_shim_process_share_a_mapping() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.write("/api.bin", vec![0u8; 8192]).unwrap();
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/api.bin")
        .unwrap();
    let m = f.map_mut(0, 8192).unwrap();
    m.write(0, b"from the api").unwrap();
    let script = Script::new(
        r#"import mmap, os, sys, time
m = mmap.mmap(os.open('/cairn/api.bin', os.O_RDWR), 8192)
print(m[0:12].decode(), flush=True)
m[4096:4104] = b'from shm'
print('stored', flush=True)
sys.stdin.readline()
print(m[100:104].decode(), flush=True)
"#,
    );
    let mut c = script.spawn(&store, "");
    let mut out = BufReader::new(c.stdout.take().unwrap());
    assert_eq!(next_line(&mut out), "from the api");
    assert_eq!(next_line(&mut out), "stored");
    let mut b = [0u8; 8];
    m.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"from shm");
    m.write(100, b"last").unwrap();
    c.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    assert_eq!(next_line(&mut out), "last");
    finish(c, "shim mapper");
    for _ in 0..1000 {
        m.fetch_add_u64(16, 3).unwrap();
    }
    m.flush().unwrap();
    let data = fs.read("/api.bin").unwrap();
    assert_eq!(&data[0..12], b"from the api");
    assert_eq!(&data[4096..4104], b"from shm");
    assert_eq!(u64::from_le_bytes(data[16..24].try_into().unwrap()), 3000);
    drop(m);
    assert!(cairn::map_object_files(store.path()).unwrap().is_empty());
    assert_eq!(&fs.read("/api.bin").unwrap()[100..104], b"last");
    // The handle must allow writing.
    let ro = cairn::File::open(&fs, "/api.bin").unwrap();
    let e = ro.map_mut(0, 4096).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EACCES);
}

/// Python's `mmap` refuses a length past the end of the file: the C library's, which
/// the shim interposes, through ctypes. `mmap_(len, fd, flags)`: the address or `None`.
const LIBC_PY: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
def mmap_(length, fd, flags=1):
    p = libc.mmap(None, length, 3, flags, fd, 0)
    return None if p in (None, 2**64 - 1) else p
"#;

/// Bad input: `MAP_SYNC` (not a DAX file: `EOPNOTSUPP`), a mapping past the end of the
/// file (`SIGBUS` past the last page), and a store that fills up while dirty pages wait:
/// `msync` fails with `ENOSPC`, the stores stay visible, nothing acknowledged is lost,
/// and the daemon keeps serving.
#[test]
fn bad_mappings_and_a_full_store() {
    let store = TestStore::with_size(cairn_tests::harness::StoreSize {
        nvm: "48M",
        log: "1M",
        clients: 4,
        inodes: Some(1024),
        tiers: None,
    });
    let fs = store.fs();
    fs.write("/keep", b"acknowledged").unwrap();
    fs.write("/small", vec![7u8; 100]).unwrap();
    let out = python(
        &store,
        &(LIBC_PY.to_string()
            + r#"import errno, mmap, os, signal, subprocess, sys
fd = os.open('/cairn/small', os.O_RDWR)
assert mmap_(4096, fd, flags=0x03 | 0x80000) is None  # MAP_SHARED_VALIDATE | MAP_SYNC
assert ctypes.get_errno() == errno.EOPNOTSUPP, ctypes.get_errno()
p = mmap_(3 * 4096, fd)
assert ctypes.string_at(p, 4096) == bytes([7]) * 100 + bytes(3996)
r = subprocess.run([sys.executable, '-c', """{LIBC}
import os
p = mmap_(3 * 4096, os.open('/cairn/small', os.O_RDWR))
ctypes.memset(p + 8192, 1, 1)"""])
assert r.returncode == -signal.SIGBUS, r.returncode
assert libc.munmap(ctypes.c_void_p(p), 3 * 4096) == 0
# Far more than the store holds, mapped and dirtied.
big = os.open('/cairn/big', os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(big, 96 << 20)
b = mmap.mmap(big, 96 << 20)
for off in range(0, 96 << 20, 4096):
    b[off:off + 8] = b'dirty!!!'
try:
    b.flush()
    print('msync succeeded')
except OSError as e:
    assert e.errno == errno.ENOSPC, e
assert b[(95 << 20):(95 << 20) + 8] == b'dirty!!!'
print(os.pread(os.open('/cairn/keep', os.O_RDONLY), 12, 0).decode())
print('ok')
"#)
        .replace("{LIBC}", LIBC_PY),
    );
    assert_eq!(out, "acknowledged\nok\n");
    assert_eq!(fs.read("/keep").unwrap(), b"acknowledged");
    fs.create_dir("/after").unwrap();
    assert!(store.daemon_pid().is_some());
}

/// A process on the FUSE mount and a process through the shim share one file through
/// mappings: the mount serves the shim's stores (through a new open: the kernel caches
/// the mount's pages), and the mount's written-back stores are in the shim's mapping at
/// once.
#[test]
fn the_mount_and_the_shim_share_a_mapped_file() {
    let store = TestStore::new();
    store.fs().write("/mf.bin", vec![0u8; 8192]).unwrap();
    let m = cairn_tests::mount::Mount::of(store, &[]);
    let store = &m.store;
    let script = Script::new(
        r#"import mmap, os, sys
m = mmap.mmap(os.open('/cairn/mf.bin', os.O_RDWR), 8192)
m[0:4] = b'shim'
m.flush()
m[200:206] = b'unsync'
print('flushed', flush=True)
sys.stdin.readline()
print(m[4096:4101].decode(), flush=True)
"#,
    );
    let mut c = script.spawn(store, "");
    let mut out = BufReader::new(c.stdout.take().unwrap());
    assert_eq!(next_line(&mut out), "flushed");
    let on_mount = m.path("mf.bin");
    // The mount serves the mapped file's current bytes, even those not written back.
    let bytes = std::fs::read(&on_mount).unwrap();
    assert_eq!(
        (&bytes[0..4], &bytes[200..206]),
        (&b"shim"[..], &b"unsync"[..])
    );
    let r = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import mmap, os\nm = mmap.mmap(os.open('{}', os.O_RDWR), 8192)\n\
             assert m[0:4] == b'shim', m[0:4]\nm[4096:4101] = b'mount'\nm.flush()\nm.close()\n",
            on_mount.display()
        ))
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    c.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    assert_eq!(next_line(&mut out), "mount");
    finish(c, "shim mapper");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cairn::map_object_files(store.path()).unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let data = store.fs().read("/mf.bin").unwrap();
    assert_eq!(
        (&data[0..4], &data[4096..4101]),
        (&b"shim"[..], &b"mount"[..])
    );
}

/// `msync` and `fsync` write mapped stores back into the store: after the mapper and the
/// daemon are killed and the map object is lost too (host memory, as at a power
/// failure; NVM keeps what was written back), the stores written back are there and the
/// one never written back is not. `munmap` of a mapping never fails for the write-back.
#[test]
fn msync_and_fsync_make_stores_durable() {
    let store = TestStore::new();
    store.fs().write("/d.bin", vec![0u8; 3 * 4096]).unwrap();
    let script = Script::new(
        r#"import mmap, os, sys
fd = os.open('/cairn/d.bin', os.O_RDWR)
m = mmap.mmap(fd, 3 * 4096)
m[0:6] = b'msync!'
m.flush()
m[4096:4102] = b'fsync!'
os.fsync(fd)
m[8192:8198] = b'unsync'
print('ready', flush=True)
sys.stdin.readline()
"#,
    );
    let mut c = script.spawn(&store, "");
    assert_eq!(
        next_line(&mut BufReader::new(c.stdout.take().unwrap())),
        "ready"
    );
    kill9(c.id());
    let _ = c.wait();
    kill9(store.daemon_pid().expect("daemon"));
    let objects = cairn::map_object_files(store.path()).unwrap();
    assert_eq!(objects.len(), 1, "{objects:?}");
    for o in objects {
        std::fs::remove_file(o).unwrap();
    }
    let data = store.fs().read("/d.bin").unwrap();
    assert_eq!(&data[0..6], b"msync!");
    assert_eq!(&data[4096..4102], b"fsync!");
    assert_eq!(
        &data[8192..8198],
        &[0u8; 6],
        "never written back, lost with the object"
    );
}
