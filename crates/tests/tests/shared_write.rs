//! Shared-write mode (ARCHITECTURE.md, "Shared-write mode") under daemon kills: two
//! processes append records to one file while the daemon is killed (SIGKILL) twice.
//! Every append a process counted (its write returned) must be in the file exactly once,
//! whole, in that process's order: a `Commit` the killed daemon sealed is not applied
//! again, one it did not seal is run again by the client.

use cairn_tests::harness::StoreSize;
use cairn_tests::harness::{cairn_bin, daemon_pid, kill9};
use cairn_tests::TestStore;
use std::time::{Duration, Instant};

const REC: usize = 1024;

/// The record `cairn bench share-worker --mode append` writes (bench/share.rs).
fn record(id: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; REC];
    let mut x = ((id << 40) ^ seq) | 1;
    for chunk in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b
}

/// Now, in nanoseconds since the Unix epoch (as the records carry it).
fn now_ns() -> u128 {
    cairn_area::time::now_ns() as u128
}

#[test]
fn appends_survive_daemon_kills_exactly_once() {
    // Every 1 KiB append digested on its own rewrites a 4 KiB block: room for that.
    let store = TestStore::with_size(StoreSize {
        nvm: "1G",
        ..StoreSize::default()
    });
    store.set_config("shared_write", "true");
    store.fs().create_dir("/w").unwrap();
    let start = now_ns() + 300_000_000;
    let stop = start + 3_000_000_000;
    let workers: Vec<_> = (0..2)
        .map(|id| {
            std::process::Command::new(cairn_bin())
                .arg("--store")
                .arg(store.path())
                .args(["bench", "share-worker", "--mode", "append"])
                .args(["--system", "cairn", "--dir", "/w", "--id", &id.to_string()])
                .args(["--start-ns", &start.to_string()])
                .args(["--stop-ns", &stop.to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Kill the daemon 1 s and 2 s into the run (the clients start a new one); just
    // before, note how many commits it applied.
    let mut commits = Vec::new();
    for k in 1..=2u64 {
        let at = start + k as u128 * 1_000_000_000;
        std::thread::sleep(Duration::from_nanos(at.saturating_sub(now_ns()) as u64));
        commits.push(store.fs().status().unwrap().sharing.commits);
        let pid = daemon_pid(store.path()).expect("a daemon runs");
        kill9(pid);
        let deadline = Instant::now() + Duration::from_secs(5);
        while daemon_pid(store.path()) == Some(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let mut counts = Vec::new();
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "append worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "<count> <ns when it stopped>".
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        counts.push(
            text.split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        );
    }
    let fs = store.fs();
    let log = fs.read("/w/log").unwrap();
    assert_eq!(log.len() % REC, 0, "a torn record");
    let mut next = [0u64; 2];
    for (i, r) in log.chunks(REC).enumerate() {
        let seq = u64::from_le_bytes(r[..8].try_into().unwrap());
        let id = u64::from_le_bytes(r[8..16].try_into().unwrap());
        assert!(id < 2, "record {i}: writer {id}");
        assert_eq!(
            seq, next[id as usize],
            "record {i}: writer {id} out of order"
        );
        assert!(r == record(id, seq), "record {i} is corrupt");
        next[id as usize] += 1;
    }
    assert_eq!(next.to_vec(), counts, "appends lost or applied twice");
    assert!(counts.iter().all(|&c| c > 0));
    // The first kill hit the mode at work (after it the writers may stay on leases).
    assert!(commits[0] > 0, "commits before the kills: {commits:?}");
}
