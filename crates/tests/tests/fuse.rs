//! The FUSE mount (`cairn mount`): real programs on a mounted store, and one file system
//! shared with the API's clients. Needs /dev/fuse and fusermount3 (scripts/setup.sh
//! installs the fuse3 package), sqlite3, git, tar and python3.

use cairn_tests::harness::cairn_bin;
use cairn_tests::TestStore;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted store; unmounted when dropped (also when a test fails).
struct Mount {
    store: TestStore,
    dir: tempfile::TempDir,
}

impl Mount {
    fn new() -> Mount {
        let store = TestStore::new();
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(cairn_bin())
            .arg("--store")
            .arg(store.path())
            .arg("mount")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cairn mount failed (is fuse3 installed? scripts/setup.sh): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount { store, dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn umount(&self) {
        let out = Command::new(cairn_bin())
            .arg("umount")
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cairn umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(self.dir.path())
            .output();
    }
}

/// Run `sh -c script` in `dir`; its stdout. Fails the test with stderr on failure.
fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn programs_on_the_mount_and_one_file_system_with_the_api() {
    let m = Mount::new();
    let root = m.dir.path();

    // The mount and an API client see each other's changes at once.
    let fs = m.store.fs();
    fs.write("/from-api", b"written by the API").unwrap();
    assert_eq!(
        std::fs::read(m.path("from-api")).unwrap(),
        b"written by the API"
    );
    std::fs::write(m.path("from-mount"), b"written through FUSE").unwrap();
    assert_eq!(fs.read("/from-mount").unwrap(), b"written through FUSE");
    std::fs::rename(m.path("from-mount"), m.path("renamed")).unwrap();
    assert!(!fs.exists("/from-mount") && fs.exists("/renamed"));

    // SQLite: 10,000 inserts with synchronous=FULL, integrity check, reopen and count.
    let mut sql = String::from(
        "PRAGMA synchronous=FULL; PRAGMA journal_mode=DELETE; \
         CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);\n",
    );
    for i in 0..10_000 {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'row {i}');\n"));
    }
    std::fs::write(std::env::temp_dir().join("cairn-fuse-test.sql"), &sql).unwrap();
    sh(
        root,
        &format!(
            "sqlite3 db.sqlite < {}",
            std::env::temp_dir().join("cairn-fuse-test.sql").display()
        ),
    );
    assert_eq!(
        sh(
            root,
            "sqlite3 db.sqlite 'PRAGMA integrity_check; SELECT count(*) FROM t;'"
        ),
        "ok\n10000\n"
    );

    // git: init, add, commit, log, fsck.
    sh(
        root,
        "git init -q repo && cd repo && printf 'a\\n' > a && mkdir -p s && printf 'b\\n' > s/b \
         && git add -A && git -c user.email=t@e -c user.name=t commit -qm first \
         && printf 'c\\n' >> a && git -c user.email=t@e -c user.name=t commit -qam second \
         && git fsck --strict 2>&1",
    );
    assert_eq!(
        sh(&root.join("repo"), "git log --format=%s")
            .lines()
            .count(),
        2
    );

    // tar: create from the host, extract on the mount, compare checksums.
    let src = tempfile::tempdir().unwrap();
    for i in 0..50 {
        let d = src.path().join(format!("d{}", i % 5));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), vec![i as u8; i * 997]).unwrap();
    }
    std::os::unix::fs::symlink("d0/f0", src.path().join("link")).unwrap();
    sh(
        root,
        &format!(
            "mkdir x && tar cf - -C {} . | tar xf - -C x",
            src.path().display()
        ),
    );
    let sums = |dir: &Path| sh(dir, "find . -type f -exec sha256sum {} + | sort");
    assert_eq!(sums(src.path()), sums(&root.join("x")));
    assert_eq!(
        std::fs::read_link(root.join("x/link")).unwrap(),
        Path::new("d0/f0")
    );

    // Python: files, directories, os.replace, a listing.
    let out = sh(
        root,
        "python3 -c \"
import os
os.makedirs('py/a/b', exist_ok=True)
with open('py/a/tmp', 'w') as f:
    f.write('v1')
os.replace('py/a/tmp', 'py/a/final')
with open('py/a/final', 'a') as f:
    f.write('+v2')
os.rmdir('py/a/b')
print(open('py/a/final').read(), sorted(os.listdir('py/a')), os.stat('py/a/final').st_size)
\"",
    );
    assert_eq!(out, "v1+v2 ['final'] 5\n");

    // Unmount; everything is in the store.
    m.umount();
    assert_eq!(fs.read("/py/a/final").unwrap(), b"v1+v2");
    assert!(fs.metadata("/db.sqlite").unwrap().len() > 100_000);
    assert!(fs.metadata("/repo/.git/HEAD").unwrap().is_file());
}
