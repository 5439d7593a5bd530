//! Crash tests: SIGKILL a client at random points, and the daemon in the middle of
//! digests, then check that the store holds exactly the acknowledged operations, in
//! order (a call that returned but was killed before it could print its `ACK` may be
//! there too: it was committed).
//!
//! A write is atomic when it fits in one transaction (a quarter of the log ring); larger
//! writes are split and a crash may keep a prefix of their pieces (docs/ARCHITECTURE.md).
//! The generated writes are at most 70,000 bytes, so the logs here are at least 512 KiB.
//!
//! `CAIRN_CRASH_RUNS` scales the number of runs (default: 200 client kills, 40 daemon
//! kill runs).

use cairn_tests::harness::{kill9, StoreSize};
use cairn_tests::snapshot::diff;
use cairn_tests::{apply, gen_ops, snapshot, CairnFs, FsOps, HostFs, Snapshot, TestStore};
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn runs(default: usize) -> usize {
    let scale: f64 = std::env::var("CAIRN_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200.0)
        / 200.0;
    ((default as f64 * scale).ceil() as usize).max(1)
}

/// A running worker and what it has acknowledged.
struct Worker {
    child: std::process::Child,
    acked: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn spawn(store: &TestStore, seed: u64, n: usize, prefix: &str) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-test-worker"))
            .arg(store.path())
            .args([seed.to_string(), n.to_string(), prefix.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn worker");
        let acked = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let out = child.stdout.take().unwrap();
        let (a, d) = (acked.clone(), done.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Some(i) = line.strip_prefix("ACK ") {
                    a.store(i.parse::<usize>().unwrap() + 1, Ordering::SeqCst);
                } else if line == "DONE" {
                    d.store(true, Ordering::SeqCst);
                }
            }
        });
        Worker {
            child,
            acked,
            done,
            reader: Some(reader),
        }
    }

    /// Wait until at least `k` operations are acknowledged (or the worker finished).
    fn wait_acked(&mut self, k: usize) {
        let start = Instant::now();
        while self.acked.load(Ordering::SeqCst) < k && !self.done.load(Ordering::SeqCst) {
            if let Ok(Some(st)) = self.child.try_wait() {
                // Read everything it printed before judging.
                if let Some(r) = self.reader.take() {
                    r.join().unwrap();
                }
                if self.done.load(Ordering::SeqCst) {
                    return;
                }
                panic!(
                    "worker exited early with {st} after {} acks",
                    self.acked.load(Ordering::SeqCst)
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "worker stalled at {} acks",
                self.acked.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// SIGKILL the worker; return how many operations it acknowledged.
    fn kill(mut self) -> usize {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        self.acked.load(Ordering::SeqCst)
    }
}

fn reference(seed: u64, n: usize, prefix: &str, k: usize) -> Snapshot {
    let dir = tempfile::Builder::new()
        .prefix("cairn-ref-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let host = HostFs {
        root: dir.path().to_path_buf(),
    };
    host.mkdir(prefix).unwrap();
    for op in gen_ops(seed, n, prefix).iter().take(k) {
        apply(&host, op);
    }
    snapshot(&host, prefix).unwrap()
}

/// The store must equal the reference after `acked` or `acked + 1` operations.
fn verify(store: &TestStore, seed: u64, n: usize, prefix: &str, acked: usize) {
    let fs = store.fs();
    let got = snapshot(&CairnFs { fs: &fs }, prefix).unwrap();
    let want = reference(seed, n, prefix, acked);
    if got == want {
        return;
    }
    if acked < n && got == reference(seed, n, prefix, acked + 1) {
        return;
    }
    panic!(
        "seed {seed}: store is not the state after the {acked} acknowledged operations:\n{}",
        diff(&got, &want)
    );
}

fn make_prefix(store: &TestStore, prefix: &str) {
    let fs = store.fs();
    fs.create_dir(prefix).unwrap();
}

#[test]
fn client_sigkill_loses_nothing_acknowledged() {
    let store = TestStore::with_size(StoreSize {
        log: "512K",
        ..StoreSize::default()
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC4A5);
    let n = 250;
    for run in 0..runs(200) {
        let seed = rng.gen::<u64>();
        let prefix = format!("/c{run}");
        make_prefix(&store, &prefix);
        let mut w = Worker::spawn(&store, seed, n, &prefix);
        let target = rng.gen_range(0..n);
        w.wait_acked(target);
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..300)));
        let acked = w.kill();
        verify(&store, seed, n, &prefix, acked);
    }
}

#[test]
fn daemon_sigkill_during_digests_loses_nothing() {
    // A 512 KiB log makes the worker ask for a digest every ~30 operations, so the daemon
    // is often killed in the middle of one; the worker re-attaches to a new daemon.
    let store = TestStore::with_size(StoreSize {
        log: "512K",
        ..StoreSize::default()
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xDAE0);
    let n = 400;
    for run in 0..runs(40) {
        let seed = rng.gen::<u64>();
        let prefix = format!("/k{run}");
        make_prefix(&store, &prefix);
        let mut w = Worker::spawn(&store, seed, n, &prefix);
        let mut at = 0;
        for _ in 0..rng.gen_range(1..=3) {
            at = rng.gen_range(at..n);
            w.wait_acked(at);
            if let Some(pid) = store.daemon_pid() {
                kill9(pid);
            }
        }
        let end = rng.gen_range(at..=n);
        w.wait_acked(end);
        let acked = w.kill();
        verify(&store, seed, n, &prefix, acked);
    }
}
