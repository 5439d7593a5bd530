//! Load: 32 processes × 1,000 operations at once, mixing private files (each process in
//! its own directory, checked against a reference replay) and shared ones (`O_APPEND`
//! records to one log file, new entries in one directory). Bounded in time; no errors, no
//! lost or torn data.

use cairn_tests::harness::StoreSize;
use cairn_tests::snapshot::diff;
use cairn_tests::{apply, gen_ops, snapshot, CairnFs, FsOps, HostFs, TestStore};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const PROCS: u32 = 32;
const OPS: usize = 1000;
const RECORD: usize = 32;

#[test]
fn thirty_two_processes_share_a_store() {
    let store = TestStore::with_size(StoreSize {
        nvm: "1G",
        log: "1M",
        clients: 40,
        inodes: None,
        tiers: None,
    });
    {
        let fs = store.fs();
        fs.create_dir_all("/shared/d").unwrap();
        fs.write("/shared/log", b"").unwrap();
    }
    let start = Instant::now();
    let children: Vec<_> = (0..PROCS)
        .map(|id| {
            std::process::Command::new(env!("CARGO_BIN_EXE_cairn-test-worker"))
                .arg("--load")
                .arg(store.path())
                .args([id.to_string(), OPS.to_string()])
                .spawn()
                .unwrap()
        })
        .collect();
    for (id, mut c) in children.into_iter().enumerate() {
        let st = c.wait().unwrap();
        assert!(st.success(), "worker {id} failed: {st}");
    }
    let took = start.elapsed();
    // 4-8 s on 2 cores since write leases are held 200 µs; before, some runs took ~11
    // minutes with the daemon CPU-bound (never explained: see ARCHITECTURE.md, Limits).
    // The bound catches hangs and livelocks without failing CI should that come back.
    assert!(took < Duration::from_secs(900), "the load took {took:?}");
    eprintln!("{PROCS} processes x {OPS} operations in {took:?}");

    let fs = store.fs();
    // Shared log: every record of every process, whole, each process's in order.
    let log = fs.read("/shared/log").unwrap();
    let per_proc = OPS / 5;
    assert_eq!(
        log.len(),
        PROCS as usize * per_proc * RECORD,
        "records lost or duplicated"
    );
    let mut next = vec![0usize; PROCS as usize];
    for rec in log.chunks(RECORD) {
        let s = std::str::from_utf8(rec).expect("a torn record");
        let id: usize = s[1..3]
            .parse()
            .unwrap_or_else(|_| panic!("torn record {s:?}"));
        let seq: usize = s[5..10]
            .parse()
            .unwrap_or_else(|_| panic!("torn record {s:?}"));
        assert_eq!(seq, next[id], "process {id}'s records out of order");
        next[id] += 1;
    }
    // Shared directory: every entry.
    let names: BTreeSet<String> = fs
        .read_dir("/shared/d")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), PROCS as usize * per_proc);
    // Private directories: each equals its reference replay.
    for id in 0..PROCS {
        let prefix = format!("/p{id}");
        let dir = tempfile::Builder::new()
            .prefix("cairn-ref-")
            .tempdir_in("/dev/shm")
            .unwrap();
        let host = HostFs {
            root: dir.path().to_path_buf(),
        };
        host.mkdir(&prefix).unwrap();
        for (i, op) in gen_ops(id as u64, OPS, &prefix).iter().enumerate() {
            if i % 5 != 4 {
                apply(&host, op);
            }
        }
        let want = snapshot(&host, &prefix).unwrap();
        let got = snapshot(&CairnFs { fs: &fs }, &prefix).unwrap();
        assert!(
            got == want,
            "process {id}'s files differ:\n{}",
            diff(&got, &want)
        );
    }
}
