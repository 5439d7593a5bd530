//! Cross-process reclamation: blocks freed by a digest are reused only after every client
//! has left the epoch in which it could have read them, and a client that dies while
//! pinning an old epoch does not block reclamation forever.

use cairn_format::slot::client_page;
use cairn_tests::TestStore;
use std::time::{Duration, Instant};

fn used(store: &TestStore) -> u64 {
    cairn::daemon_status(Some(store.path())).unwrap().tiers[0].used_bytes
}

/// A process that registers, pins the current epoch in its client page (as a reader in
/// the middle of a long read would) and sleeps until killed.
fn spawn_pinner(store: &TestStore) -> std::process::Child {
    let exe = env!("CARGO_BIN_EXE_cairn-test-worker");
    let mut child = std::process::Command::new(exe)
        .args(["--pin-epoch"])
        .arg(store.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for "PINNED".
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "PINNED", "pinner said {line:?}");
    child
}

#[test]
fn a_dead_pinning_reader_does_not_block_reclamation() {
    let _ = client_page::READER_EPOCH;
    let store = TestStore::new();
    let fs = store.fs();
    let data = vec![7u8; 1 << 20];
    fs.write("/f", &data).unwrap();
    fs.digest().unwrap();
    let base = used(&store);
    let mut pinner = spawn_pinner(&store);
    // Overwrite the file many times: every digest retires the old copy, which cannot be
    // freed while the pinner holds an old epoch.
    for i in 0..20u8 {
        let f = cairn::OpenOptions::new()
            .write(true)
            .open(&fs, "/f")
            .unwrap();
        f.write_at(&vec![i; 1 << 20], 0).unwrap();
        drop(f);
        fs.digest().unwrap();
    }
    let pinned = used(&store);
    assert!(
        pinned >= base + (10 << 20),
        "retired blocks are kept while a reader pins an old epoch ({base} -> {pinned})"
    );
    pinner.kill().unwrap();
    pinner.wait().unwrap();
    // Once the dead reader's slot is released, the retired blocks are freed.
    let start = Instant::now();
    loop {
        let now = used(&store);
        if now <= base + (2 << 20) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "reclamation stuck at {now} bytes (base {base})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fs.read("/f").unwrap(), vec![19u8; 1 << 20]);
}

/// Temporary files (created and unlinked before a digest: SQLite's rollback journal)
/// give their inode numbers back: more of them than the store has inodes.
#[test]
fn temporary_files_give_their_inode_numbers_back() {
    let store = TestStore::with_size(cairn_tests::harness::StoreSize {
        inodes: Some(1024),
        ..Default::default()
    });
    let fs = store.fs();
    for i in 0..5000 {
        fs.write("/journal", format!("txn {i}")).unwrap();
        fs.remove_file("/journal").unwrap();
    }
    assert!(fs.status().unwrap().inodes.used <= 2);
}
