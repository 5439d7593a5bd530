//! Advisory locks across processes: POSIX record locks, OFD locks and flock, the kernel's
//! on the inodes' lock files. Worker processes (`cairn-lock-worker`) contend for locks;
//! blocked waiters are granted promptly when the holder unlocks or is SIGKILLed; deadlocks
//! give EDEADLK; closing any handle drops the process's POSIX locks but not other
//! handles' OFD/flock locks; locks outlive a daemon restart, and lock files their inodes
//! do not.

use cairn::{FlockOp, LockInfo, LockKind, LockType, OpenOptions};
use cairn_tests::harness::kill9;
use cairn_tests::TestStore;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long an answer may take when it is expected at once.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a request must stay unanswered to count as blocked.
const BLOCKED: Duration = Duration::from_millis(400);

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pid: u32,
}

impl Worker {
    fn start(store: &TestStore) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-lock-worker"))
            .arg(store.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start cairn-lock-worker");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let mut w = Worker {
            child,
            stdin,
            lines,
            pid,
        };
        assert_eq!(w.ask("pid"), pid.to_string());
        w
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The answer to the last command, waiting at most `t`.
    fn answer(&mut self, t: Duration) -> Option<String> {
        match self.lines.recv_timeout(t) {
            Ok(l) => Some(l),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("worker {} died", self.pid),
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.answer(PROMPT)
            .unwrap_or_else(|| panic!("no answer to `{cmd}` within {PROMPT:?}"))
    }

    fn ok(&mut self, cmd: &str) {
        assert_eq!(self.ask(cmd), "OK", "`{cmd}`");
    }

    /// Send a command that must block: no answer within `BLOCKED`.
    fn blocks(&mut self, cmd: &str) {
        self.send(cmd);
        if let Some(a) = self.answer(BLOCKED) {
            panic!("`{cmd}` should block but answered {a}");
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn err(errno: i32) -> String {
    format!("ERR {errno}")
}

fn prepare(store: &TestStore) {
    let fs = store.fs();
    fs.write("/f", b"0123456789").unwrap();
    fs.write("/g", b"x").unwrap();
}

#[test]
fn posix_and_ofd_contention_and_getlk() {
    let store = TestStore::new();
    prepare(&store);
    let mut a = Worker::start(&store);
    let mut b = Worker::start(&store);
    a.ok("open 1 /f rw");
    b.ok("open 1 /f rw");
    a.ok("lock 1 posix w 0 10 0");
    assert_eq!(b.ask("lock 1 posix r 5 1 0"), err(libc::EAGAIN));
    assert_eq!(b.ask("lock 1 ofd w 9 5 0"), err(libc::EAGAIN));
    assert_eq!(
        b.ask("getlk 1 posix r 0 0"),
        format!("LOCK w 0 10 {}", a.pid)
    );
    // The holder sees no conflict with its own lock.
    assert_eq!(a.ask("getlk 1 posix w 0 0"), "NONE");
    // Outside the range: fine, for both kinds.
    b.ok("lock 1 posix r 10 5 0");
    b.ok("lock 1 ofd r 15 0 0");
    // Read locks share.
    a.ok("lock 1 posix r 10 1 0");
    // An OFD lock is reported with pid -1; it conflicts with POSIX locks of its own
    // process.
    assert_eq!(a.ask("getlk 1 posix w 20 1"), "LOCK r 15 0 -1");
    b.ok("open 2 /f rw");
    assert_eq!(b.ask("lock 2 ofd w 12 1 0"), err(libc::EAGAIN));
    // Downgrade a part of a's write lock: b can read-lock there but not write.
    a.ok("lock 1 posix r 0 5 0");
    b.ok("lock 1 posix r 2 1 0");
    assert_eq!(b.ask("lock 1 posix w 7 1 0"), err(libc::EAGAIN));
    assert_eq!(
        b.ask("getlk 1 posix w 3 5"),
        format!("LOCK r 0 5 {}", a.pid)
    );
    // Unlock a hole in a's locks.
    a.ok("unlock 1 posix 6 2");
    b.ok("lock 1 posix w 6 2 0");
    assert_eq!(b.ask("lock 1 posix w 8 1 0"), err(libc::EAGAIN));
    // Other inodes are independent.
    a.ok("open 3 /g rw");
    b.ok("open 3 /g rw");
    a.ok("lock 3 posix w 0 0 0");
    assert_eq!(b.ask("lock 3 ofd r 0 0 0"), err(libc::EAGAIN));
    a.ok("unlock 3 posix 0 0");
    b.ok("lock 3 ofd w 0 0 0");
}

#[test]
fn access_modes_ranges_and_timeouts() {
    let store = TestStore::new();
    prepare(&store);
    let fs = store.fs();
    let ro = OpenOptions::new().read(true).open(&fs, "/f").unwrap();
    let wo = OpenOptions::new().write(true).open(&fs, "/f").unwrap();
    let errno = |r: std::io::Result<()>| cairn_area::errno_of(&r.unwrap_err());
    assert_eq!(
        errno(ro.lock(LockKind::Posix, LockType::Write, 0, 1, false)),
        libc::EBADF
    );
    assert_eq!(
        errno(wo.lock(LockKind::Ofd, LockType::Read, 0, 1, false)),
        libc::EBADF
    );
    ro.lock(LockKind::Posix, LockType::Read, 0, 1, false)
        .unwrap();
    wo.lock(LockKind::Ofd, LockType::Write, 5, 1, false)
        .unwrap();
    // flock does not care about the access mode.
    ro.flock(FlockOp::Exclusive, true).unwrap();
    ro.flock(FlockOp::Unlock, true).unwrap();
    let big = i64::MAX as u64;
    assert_eq!(
        errno(ro.lock(LockKind::Posix, LockType::Read, big + 1, 1, false)),
        libc::EINVAL
    );
    assert_eq!(
        errno(ro.lock(LockKind::Posix, LockType::Read, 2, big, false)),
        libc::EOVERFLOW
    );
    assert!(ro.get_lock(LockKind::Posix, LockType::Read, 1, big).is_ok());
    ro.lock(LockKind::Posix, LockType::Read, big, 1, false)
        .unwrap();
    assert_eq!(
        cairn_area::errno_of(
            &ro.get_lock(LockKind::Posix, LockType::Read, big + 5, 0)
                .unwrap_err()
        ),
        libc::EINVAL
    );
    // Another process: the OFD write lock conflicts; a timed wait gives up.
    let mut b = Worker::start(&store);
    b.ok("open 1 /f rw");
    let t = Instant::now();
    assert_eq!(
        b.ask("locktimeout 1 posix r 0 10 300"),
        err(libc::ETIMEDOUT)
    );
    assert!(t.elapsed() >= Duration::from_millis(300));
    // This process's POSIX read lock at 0 conflicts with an OFD write lock of its own.
    assert_eq!(
        ro.get_lock(LockKind::Ofd, LockType::Write, 0, 0).unwrap(),
        Some(LockInfo {
            typ: LockType::Read,
            start: 0,
            len: 1,
            pid: std::process::id() as i32
        })
    );
    assert_eq!(
        ro.get_lock(LockKind::Posix, LockType::Read, 0, 0).unwrap(),
        Some(LockInfo {
            typ: LockType::Write,
            start: 5,
            len: 1,
            pid: -1
        })
    );
    // The timed-out request left nothing behind.
    b.ok("lock 1 posix r 0 5 0");
}

#[test]
fn blocked_waiter_granted_on_unlock_and_on_kill() {
    let store = TestStore::new();
    prepare(&store);
    let mut a = Worker::start(&store);
    let mut b = Worker::start(&store);
    let mut c = Worker::start(&store);
    for w in [&mut a, &mut b, &mut c] {
        w.ok("open 1 /f rw");
    }
    // POSIX: granted when the holder unlocks.
    a.ok("lock 1 posix w 0 0 0");
    b.blocks("lock 1 posix w 100 1 1");
    // While b waits, other clients are served: status, writes and digests.
    let fs = store.fs();
    let t = Instant::now();
    fs.write("/h", b"during the wait").unwrap();
    fs.digest().unwrap();
    assert!(fs.status().unwrap().clients.len() >= 3);
    assert_eq!(
        c.ask("getlk 1 posix r 0 1"),
        format!("LOCK w 0 0 {}", a.pid)
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    a.ok("unlock 1 posix 0 50");
    assert!(b.answer(BLOCKED).is_none(), "granted too early");
    let t = Instant::now();
    a.ok("unlock 1 posix 50 0");
    assert_eq!(b.answer(PROMPT).as_deref(), Some("OK"));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    b.ok("unlock 1 posix 0 0");

    // POSIX, OFD and flock waiters: granted when the holder is SIGKILLed.
    a.ok("lock 1 posix w 0 10 0");
    a.ok("open 2 /f rw");
    a.ok("lock 2 ofd w 20 10 0");
    a.ok("flock 2 ex 1");
    b.ok("open 2 /f rw");
    c.ok("open 2 /f r");
    b.blocks("lock 1 posix r 5 1 1");
    c.blocks("flock 2 sh 0");
    let mut d = Worker::start(&store);
    d.ok("open 1 /f rw");
    d.blocks("lock 1 ofd w 25 1 1");
    let t = Instant::now();
    kill9(a.pid);
    for (name, w) in [("posix", &mut b), ("flock", &mut c), ("ofd", &mut d)] {
        assert_eq!(w.answer(PROMPT).as_deref(), Some("OK"), "{name} waiter");
    }
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn deadlock_between_two_processes() {
    let store = TestStore::new();
    prepare(&store);
    let mut a = Worker::start(&store);
    let mut b = Worker::start(&store);
    a.ok("open 1 /f rw");
    b.ok("open 1 /f rw");
    a.ok("lock 1 posix w 0 1 0");
    b.ok("lock 1 posix w 1 1 0");
    a.blocks("lock 1 posix w 1 1 1");
    assert_eq!(b.ask("lock 1 posix w 0 1 1"), err(libc::EDEADLK));
    // b gives up its byte: a proceeds.
    b.ok("unlock 1 posix 1 1");
    assert_eq!(a.answer(PROMPT).as_deref(), Some("OK"));
    // OFD waits are not deadlock-checked (as on Linux): b waits until a unlocks.
    b.ok("lock 1 ofd w 5 1 0");
    a.blocks("lock 1 posix w 5 1 1");
    b.blocks("lock 1 ofd w 0 1 1");
    // A real deadlock nobody detects; killing a breaks it.
    kill9(a.pid);
    assert_eq!(b.answer(PROMPT).as_deref(), Some("OK"));
}

#[test]
fn closing_any_handle_drops_posix_locks_only() {
    let store = TestStore::new();
    prepare(&store);
    let mut a = Worker::start(&store);
    let mut b = Worker::start(&store);
    a.ok("open 1 /f rw");
    a.ok("open 2 /f r");
    a.ok("open 3 /f rw");
    a.ok("lock 1 posix w 0 10 0");
    a.ok("lock 1 ofd w 20 10 0");
    a.ok("flock 3 ex 1");
    b.ok("open 1 /f rw");
    assert_eq!(b.ask("lock 1 posix w 0 1 0"), err(libc::EAGAIN));
    // Closing handle 2 (never locked) drops a's POSIX locks on /f ...
    a.ok("close 2");
    b.ok("lock 1 posix w 0 1 0");
    // ... but not handle 1's OFD lock nor handle 3's flock.
    assert_eq!(b.ask("lock 1 posix w 25 1 0"), err(libc::EAGAIN));
    assert_eq!(b.ask("flock 1 sh 1"), err(libc::EWOULDBLOCK));
    // Closing handle 1 drops its OFD lock; closing 3 its flock.
    a.ok("close 1");
    b.ok("lock 1 posix w 25 1 0");
    assert_eq!(b.ask("flock 1 sh 1"), err(libc::EWOULDBLOCK));
    a.ok("close 3");
    b.ok("flock 1 sh 1");
}

#[test]
fn flock_contention_conversion_and_independence() {
    let store = TestStore::new();
    prepare(&store);
    let mut a = Worker::start(&store);
    let mut b = Worker::start(&store);
    a.ok("open 1 /f r");
    b.ok("open 1 /f r");
    b.ok("open 2 /f rw");
    a.ok("flock 1 sh 1");
    b.ok("flock 1 sh 1");
    assert_eq!(b.ask("flock 2 ex 1"), err(libc::EWOULDBLOCK));
    // flock and record locks are independent.
    b.ok("lock 2 posix w 0 0 0");
    b.ok("unlock 2 posix 0 0");
    // Conversion: b's shared lock to exclusive waits for a's shared lock.
    b.blocks("flock 1 ex 0");
    let t = Instant::now();
    a.ok("flock 1 un 0");
    assert_eq!(b.answer(PROMPT).as_deref(), Some("OK"));
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(a.ask("flock 1 sh 1"), err(libc::EWOULDBLOCK));
    // Downgrade: a can share again.
    b.ok("flock 1 sh 1");
    a.ok("flock 1 sh 1");
    // Two handles of one process are different flock owners.
    assert_eq!(b.ask("flock 2 ex 1"), err(libc::EWOULDBLOCK));
    // A process that exits normally releases everything.
    b.ok("flock 1 un 0");
    a.ok("flock 1 un 0");
    a.ok("flock 1 ex 1");
    a.send("exit");
    let deadline = Instant::now() + PROMPT;
    loop {
        let r = b.ask("flock 2 ex 1");
        if r == "OK" {
            break;
        }
        assert_eq!(r, err(libc::EWOULDBLOCK));
        assert!(Instant::now() < deadline, "a's flock outlived a");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn locks_survive_a_daemon_restart_and_lock_files_go_with_their_inodes() {
    let store = TestStore::new();
    prepare(&store);
    let fs = store.fs();
    fs.write("/doomed", b"x").unwrap();
    let lock_file = |path: &str| {
        let m = fs.metadata(path).unwrap();
        let p = cairn_area::host::lock_file_path(&fs.uuid(), m.ino(), m.generation());
        (p, m.ino())
    };
    let ((f_lock, _), (doomed_lock, doomed)) = (lock_file("/f"), lock_file("/doomed"));
    let mut a = Worker::start(&store);
    let mut b = Worker::start(&store);
    a.ok("open 1 /f rw");
    a.ok("lock 1 posix w 0 0 0");
    a.ok("flock 1 ex 1");
    a.ok("open 2 /doomed rw");
    a.ok("flock 2 ex 1");
    assert!(f_lock.exists() && doomed_lock.exists());
    // The daemon stops (and starts again for the next request): the locks are the
    // kernel's, so they hold on. (A worker's session may start the next daemon at once:
    // the old one is gone, there may be a new one.)
    let before = store.daemon_pid();
    drop(fs);
    store.stop();
    // The daemon frees its lock (which `stop` waits for) a moment before its process
    // is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = store.daemon_pid();
    while after == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        after = store.daemon_pid();
    }
    assert!(
        before.is_some() && after != before,
        "{before:?}, then {after:?}"
    );
    b.ok("open 1 /f rw");
    assert_eq!(b.ask("lock 1 posix w 5 1 0"), err(libc::EAGAIN));
    assert_eq!(b.ask("flock 1 sh 1"), err(libc::EWOULDBLOCK));
    a.ok("unlock 1 posix 0 0");
    b.ok("lock 1 posix w 5 1 0");
    // A lock file stays while its inode lives (open, even unlinked) and goes once the
    // inode is freed; the daemon removes it at its next sweep (a clean stop is one).
    let fs = store.fs();
    fs.remove_file("/doomed").unwrap();
    fs.digest().unwrap();
    drop(fs);
    store.stop();
    assert!(doomed_lock.exists(), "the unlinked file is still open");
    a.ok("close 2");
    // The daemon frees the orphan at once, or when every client came back after the
    // restart (its restart gate).
    let fs = store.fs();
    let t = Instant::now();
    while fs.metadata_ino(doomed).is_ok() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "inode {doomed} never freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(fs);
    store.stop();
    assert!(
        !doomed_lock.exists(),
        "{} outlived its inode",
        doomed_lock.display()
    );
    assert!(f_lock.exists(), "the live file's lock file was removed");
    assert_eq!(b.ask("flock 1 sh 1"), err(libc::EWOULDBLOCK));
}

/// The lock file of a file created, locked and removed before its log was digested (as
/// SQLite does with its journal) goes too: its inode never reached the shared area, and
/// once the number is no longer reserved for a client, nothing can lock that file again.
#[test]
fn lock_files_of_files_that_never_reached_the_shared_area_go() {
    let store = TestStore::new();
    prepare(&store);
    let fs = store.fs();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "/journal")
        .unwrap();
    f.flock(FlockOp::Exclusive, true).unwrap();
    let m = f.metadata().unwrap();
    let lock = cairn_area::host::lock_file_path(&fs.uuid(), m.ino(), m.generation());
    assert!(lock.exists(), "{}", lock.display());
    drop(f);
    fs.remove_file("/journal").unwrap();
    // This client goes (its log is digested: the file was created and removed within
    // one batch), then a clean stop sweeps.
    drop(fs);
    store.stop();
    assert!(!lock.exists(), "{} outlived its file", lock.display());
}
