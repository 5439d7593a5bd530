//! Leases across real processes (PROTOCOL.md, "Leases"): two worker processes
//! (`cairn-share-worker`) driven over pipes take turns; whatever one acknowledged, the
//! other must see when its next call starts, also when the holder is stopped, killed,
//! or the daemon is killed and restarted.

use cairn_tests::harness::{daemon_pid, kill9};
use cairn_tests::TestStore;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    name: &'static str,
}

impl Worker {
    fn start(store: &TestStore, name: &'static str) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-share-worker"))
            .arg(store.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the share worker");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut w = Worker {
            child,
            stdin,
            stdout,
            name,
        };
        // The worker registers before reading its first command.
        assert!(w.call("pid").starts_with("ok "), "{name} did not start");
        w
    }

    /// Send one command and return the answer line.
    fn call(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write to worker");
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from worker");
        assert!(
            !line.is_empty(),
            "{}: worker died during `{cmd}`",
            self.name
        );
        line.trim_end_matches('\n').to_string()
    }

    /// A command that must succeed; its result.
    fn ok(&mut self, cmd: &str) -> String {
        let a = self.call(cmd);
        match a.strip_prefix("ok") {
            Some(r) => r.trim_start().to_string(),
            None => panic!("{}: `{cmd}` failed: {a}", self.name),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill {sig} {pid}");
}

/// One direction of the visibility rounds: `w` changes, `r` must see it.
fn round(w: &mut Worker, r: &mut Worker, i: usize) {
    let f = format!("/v/f{}", i % 3);
    // File data and size.
    let text = format!("{}-round-{i}-{}", w.name, "x".repeat(i % 50));
    w.ok(&format!("write {f} {text}"));
    assert_eq!(r.ok(&format!("read {f}")), text, "round {i}: data");
    assert_eq!(
        r.ok(&format!("len {f}")),
        text.len().to_string(),
        "round {i}: size"
    );
    w.ok(&format!("append {f} +{i}"));
    assert_eq!(
        r.ok(&format!("read {f}")),
        format!("{text}+{i}"),
        "round {i}: append"
    );
    w.ok(&format!("pwrite {f} 0 P"));
    assert!(
        r.ok(&format!("read {f}")).starts_with('P'),
        "round {i}: overwrite"
    );
    // Attributes.
    let mode = format!("{:o}", 0o600 + (i % 8) * 0o10);
    w.ok(&format!("chmod {f} {mode}"));
    assert_eq!(r.ok(&format!("mode {f}")), mode, "round {i}: mode");
    // Directory entries: create, rename, unlink.
    let n = format!("/v/d/n{i}");
    w.ok(&format!("create {n}"));
    assert!(
        r.ok("ls /v/d").split(',').any(|x| x == format!("n{i}")),
        "round {i}: create"
    );
    w.ok(&format!("rename {n} /v/d/m{i}"));
    let ls = r.ok("ls /v/d");
    assert!(
        !ls.split(',').any(|x| x == format!("n{i}")),
        "round {i}: rename (old) {ls}"
    );
    assert!(
        ls.split(',').any(|x| x == format!("m{i}")),
        "round {i}: rename (new) {ls}"
    );
    w.ok(&format!("unlink /v/d/m{i}"));
    assert_eq!(
        r.ok(&format!("exists /v/d/m{i}")),
        "false",
        "round {i}: unlink"
    );
    // A directory made by one is usable by the other at once.
    w.ok(&format!("mkdir /v/d/s{i}"));
    r.ok(&format!("write /v/d/s{i}/inner {i}"));
    assert_eq!(w.ok(&format!("read /v/d/s{i}/inner")), i.to_string());
    r.ok(&format!("unlink /v/d/s{i}/inner"));
    w.ok(&format!("rmdir /v/d/s{i}"));
    assert_eq!(r.ok(&format!("exists /v/d/s{i}")), "false");
}

#[test]
fn visibility_both_directions_many_rounds() {
    let store = TestStore::new();
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /v");
    a.ok("mkdir /v/d");
    for i in 0..40 {
        if i % 2 == 0 {
            round(&mut a, &mut b, i);
        } else {
            round(&mut b, &mut a, i);
        }
    }
    assert_eq!(a.ok("ls /v/d"), "");
    assert_eq!(b.ok("ls /v/d"), "");
}

#[test]
fn revocation_digests_the_holders_log() {
    let store = TestStore::new();
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /r");
    // Many small acknowledged writes: they stay in A's log (far below the digest
    // threshold), A stays alive and never digests on its own.
    let mut want = String::new();
    for i in 0..200 {
        let t = format!("<{i}>");
        a.ok(&format!("append /r/log {t}"));
        want.push_str(&t);
    }
    let status = cairn::daemon_status(Some(store.path())).unwrap();
    let a_client = status
        .clients
        .iter()
        .find(|c| c.pid == a.pid())
        .expect("A is a client");
    assert!(
        a_client.log_used_bytes > 0,
        "A's writes are still in its log"
    );
    assert_eq!(b.ok("read /r/log"), want);
    assert_eq!(b.ok("len /r/log"), want.len().to_string());
    // And back: B's write is seen by A, which then writes again.
    b.ok("append /r/log !");
    assert_eq!(a.ok("read /r/log"), format!("{want}!"));
    a.ok("append /r/log ?");
    assert_eq!(b.ok("read /r/log"), format!("{want}!?"));
}

#[test]
fn stopped_holder_expires_and_recovers() {
    let store = TestStore::new();
    store.set_config("lease_timeout_ms", "300");
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /s");
    a.ok("write /s/f committed-by-A");
    assert_eq!(a.ok("read /s/f"), "committed-by-A");
    signal(a.pid(), "-STOP");
    let t = Instant::now();
    let got = b.ok("read /s/f");
    let waited = t.elapsed();
    assert_eq!(got, "committed-by-A");
    assert!(
        waited < Duration::from_secs(5),
        "B waited {waited:?} for a stopped holder (expiry is 300 ms)"
    );
    // B writes while A is stopped.
    b.ok("append /s/f +B");
    signal(a.pid(), "-CONT");
    // A notices that its leases were taken away and sees B's write.
    assert_eq!(a.ok("read /s/f"), "committed-by-A+B");
    a.ok("append /s/f +A");
    assert_eq!(b.ok("read /s/f"), "committed-by-A+B+A");
    // Both keep working normally.
    for i in 0..10 {
        a.ok(&format!("write /s/g a{i}"));
        assert_eq!(b.ok("read /s/g"), format!("a{i}"));
        b.ok(&format!("write /s/g b{i}"));
        assert_eq!(a.ok("read /s/g"), format!("b{i}"));
    }
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    assert!(
        log.contains("did not answer a lease revocation"),
        "the daemon expired A's leases"
    );
}

#[test]
fn killed_holder_does_not_block_and_loses_nothing() {
    let store = TestStore::new();
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /k");
    let mut want = String::new();
    for i in 0..50 {
        let t = format!("[{i}]");
        a.ok(&format!("append /k/f {t}"));
        want.push_str(&t);
    }
    a.ok("create /k/new");
    kill9(a.pid());
    let _ = a.child.wait();
    let t = Instant::now();
    assert_eq!(b.ok("read /k/f"), want);
    assert_eq!(b.ok("ls /k"), "f,new");
    let waited = t.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "B waited {waited:?} for a dead holder"
    );
    b.ok("append /k/f done");
    assert_eq!(b.ok("read /k/f"), format!("{want}done"));
}

#[test]
fn daemon_killed_while_sharing() {
    let store = TestStore::new();
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /d");
    a.ok("write /d/f v0");
    assert_eq!(b.ok("read /d/f"), "v0");
    // Undigested, acknowledged writes in both logs, leases held by both.
    a.ok("write /d/a from-A");
    b.ok("write /d/b from-B");
    let pid = daemon_pid(store.path()).expect("a daemon runs");
    kill9(pid);
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon_pid(store.path()) == Some(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The next calls start a new daemon; both clients re-attach.
    assert_eq!(b.ok("read /d/a"), "from-A");
    assert_eq!(a.ok("read /d/b"), "from-B");
    assert_eq!(a.ok("read /d/f"), "v0");
    assert_ne!(daemon_pid(store.path()), Some(pid), "a new daemon serves");
    // Leases stay exclusive: strict alternation on one file and one directory.
    for i in 0..20 {
        a.ok(&format!("append /d/f ,a{i}"));
        b.ok(&format!("append /d/f ,b{i}"));
        a.ok(&format!("create /d/x{i}"));
        b.ok(&format!("rename /d/x{i} /d/y{i}"));
    }
    let mut want = "v0".to_string();
    for i in 0..20 {
        want.push_str(&format!(",a{i},b{i}"));
    }
    assert_eq!(a.ok("read /d/f"), want);
    assert_eq!(b.ok("read /d/f"), want);
    let ls = a.ok("ls /d");
    for i in 0..20 {
        assert!(ls.split(',').any(|x| x == format!("y{i}")), "y{i} in {ls}");
        assert!(!ls.split(',').any(|x| x == format!("x{i}")), "x{i} in {ls}");
    }
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    assert!(
        log.matches("client re-attached").count() >= 2,
        "both re-attached"
    );
}

/// Inodes in use, from the daemon.
fn inodes_used(store: &TestStore) -> u64 {
    store.fs().status().unwrap().inodes.used
}

/// Wait until `f` holds (the daemon frees unlinked files asynchronously to the test).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unlinked_while_open_in_another_process() {
    let store = TestStore::new();
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /u");
    a.ok("write /u/f hello");
    b.ok("hold /u/f");
    let before = inodes_used(&store);
    a.ok("unlink /u/f");
    assert_eq!(a.ok("exists /u/f"), "false");
    assert_eq!(a.ok("ls /u"), "");
    // B still reads and writes it; A can no longer name it.
    assert_eq!(b.ok("hread /u/f"), "hello");
    b.ok("happend /u/f , world");
    assert_eq!(b.ok("hread /u/f"), "hello, world");
    a.ok("write /u/f new file");
    assert_eq!(b.ok("hread /u/f"), "hello, world");
    assert_eq!(b.ok("read /u/f"), "new file");
    // Kept until the last close, then freed.
    assert_eq!(
        inodes_used(&store),
        before + 1,
        "the unlinked file and the new one"
    );
    b.ok("release /u/f");
    eventually("the unlinked file is freed at its last close", || {
        inodes_used(&store) == before
    });
}

#[test]
fn unlinked_while_open_survives_a_daemon_kill_and_goes_with_its_holder() {
    let store = TestStore::new();
    let mut a = Worker::start(&store, "A");
    let mut b = Worker::start(&store, "B");
    a.ok("mkdir /u");
    a.ok("write /u/f kept");
    b.ok("hold /u/f");
    let before = inodes_used(&store);
    a.ok("unlink /u/f");
    // The daemon dies with the file unlinked but open: the next one keeps it for B.
    let pid = daemon_pid(store.path()).expect("a daemon runs");
    kill9(pid);
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon_pid(store.path()) == Some(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.ok("hread /u/f"), "kept");
    assert_eq!(a.ok("exists /u/f"), "false");
    b.ok("happend /u/f !");
    assert_eq!(b.ok("hread /u/f"), "kept!");
    assert_eq!(inodes_used(&store), before);
    // Its holder dies: the daemon frees it once it recovered the holder's log.
    kill9(b.pid());
    drop(b);
    eventually("the unlinked file is freed when its holder dies", || {
        inodes_used(&store) == before - 1
    });
}
