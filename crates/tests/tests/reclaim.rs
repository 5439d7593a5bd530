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

/// A process killed while it has a file open whose last name it removed itself leaves
/// nothing behind: the file's blocks and inode are freed once its client is recovered,
/// and fsck finds the store clean (no inode with a link and no name).
#[test]
fn a_process_killed_with_its_unlinked_file_open_leaves_nothing_behind() {
    use std::io::BufRead;
    let store = TestStore::new();
    let inodes = |s: &TestStore| cairn::daemon_status(Some(s.path())).unwrap().inodes.used;
    let (used0, inodes0) = (used(&store), inodes(&store));
    let script = r#"exec python3 -c '
import os, sys, time
fd = os.open("/cairn/scratch", os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b"x" * (4 << 20))
os.unlink("/cairn/scratch")
os.write(fd, b"y" * (1 << 20))
os.lseek(fd, 0, 0)
assert os.read(fd, 1) == b"x"
print("READY", flush=True)
time.sleep(600)
'"#;
    let mut child = cairn_tests::shim::run_cmd(&store, script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    assert!(store.fs().metadata("/scratch").is_err(), "the name is gone");
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while used(&store) > used0 + (256 << 10) || inodes(&store) > inodes0 {
        assert!(
            Instant::now() < deadline,
            "the dead process's unlinked file was not freed: {} bytes, {} inodes in use",
            used(&store),
            inodes(&store)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    store.fsck_clean();
}
