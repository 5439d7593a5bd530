//! The randomized file-operation exerciser (`scripts/fsx.py`: reads, writes, truncations,
//! mmap reads and writes, fallocate modes, copy_file_range, fsync, close and reopen, each
//! checked against an in-memory copy of the file) through the FUSE mount and through
//! `cairn run`: 100,000 operations each by default. `CAIRN_FSX_OPS` and `CAIRN_FSX_SEED`
//! change the count and the seed (long runs: `CAIRN_FSX_OPS=1000000`). Needs python3.

use cairn_tests::harness::cairn_bin;
use cairn_tests::mount::Mount;
use cairn_tests::TestStore;
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fsx.py");

fn ops_and_seed() -> (String, String) {
    let ops = std::env::var("CAIRN_FSX_OPS").unwrap_or_else(|_| "100000".into());
    let seed = std::env::var("CAIRN_FSX_SEED").unwrap_or_else(|_| "13".into());
    (ops, seed)
}

fn check(out: std::process::Output, ops: &str, where_: &str) {
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("ok {ops}\n"),
        "{where_}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exerciser_through_the_mount() {
    let (ops, seed) = ops_and_seed();
    let m = Mount::new();
    let out = Command::new("python3")
        .arg(SCRIPT)
        .arg(m.path("fsx"))
        .args([&ops, &seed])
        .output()
        .unwrap();
    check(out, &ops, "mount");
    drop(m);
}

#[test]
fn exerciser_through_cairn_run() {
    let (ops, seed) = ops_and_seed();
    let store = TestStore::new();
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .args(["run", "--", "python3", SCRIPT, "/cairn/fsx", &ops, &seed])
        .output()
        .unwrap();
    check(out, &ops, "cairn run");
}
