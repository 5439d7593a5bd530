//! Running programs through the shim (`cairn run`) in tests.

use crate::harness::cairn_bin;
use crate::TestStore;
use std::process::Command;

/// `cairn run -- sh -c script` on `store`: the command.
pub fn run_cmd(store: &TestStore, script: &str) -> Command {
    let mut c = Command::new(cairn_bin());
    c.arg("--store")
        .arg(store.path())
        .args(["run", "--", "sh", "-c", script]);
    c
}

/// Run `script` through the shim; its stdout. Fails the test with stderr on failure.
pub fn sh(store: &TestStore, script: &str) -> String {
    let out = run_cmd(store, script).output().unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compile the C program `src` into `bin` (the tests' own small programs; with
/// POSIX threads).
pub fn compile_c(src: &std::path::Path, bin: &std::path::Path) {
    let cc = Command::new("cc")
        .args(["-O2", "-pthread"])
        .arg("-o")
        .arg(bin)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
}

/// Run a Python program through the shim; its stdout.
pub fn python(store: &TestStore, code: &str) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), code).unwrap();
    sh(store, &format!("python3 {}", file.path().display()))
}
