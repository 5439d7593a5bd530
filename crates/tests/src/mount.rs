//! A store mounted with `cairn mount` for the duration of a test.

use crate::harness::{cairn_bin, output_ok};
use crate::TestStore;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted store; unmounted (lazily) when dropped, also when a test fails.
pub struct Mount {
    pub store: TestStore,
    dir: tempfile::TempDir,
}

impl Mount {
    /// A new store, mounted.
    pub fn new() -> Mount {
        Mount::of(TestStore::new(), &[])
    }

    /// A new store mounted with these extra `cairn mount` options.
    pub fn with(options: &[&str]) -> Mount {
        Mount::of(TestStore::new(), options)
    }

    /// Mount `store` with these extra `cairn mount` options.
    pub fn of(store: TestStore, options: &[&str]) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        output_ok(
            Command::new(cairn_bin())
                .arg("--store")
                .arg(store.path())
                .arg("mount")
                .args(options)
                .arg(dir.path()),
            "cairn mount failed (is fuse3 installed? scripts/setup.sh)",
        );
        Mount { store, dir }
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `p` under the mount point.
    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Unmount with `cairn umount` (the test fails if that fails).
    pub fn umount(&self) {
        output_ok(
            Command::new(cairn_bin()).arg("umount").arg(self.dir.path()),
            "cairn umount",
        );
    }
}

impl Default for Mount {
    fn default() -> Mount {
        Mount::new()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazily: a program a failed test left running may still use it.
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(self.dir.path())
            .output();
    }
}
