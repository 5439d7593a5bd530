//! cairn-kv's C interface (`libcairn_kv.so`, `include/cairn/kv.h`): its example program,
//! several processes at once on one pool, with the CLI and a process killed among them.

use cairn_tests::harness::{cairn_bin, compile_c_against};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A pool file in /dev/shm, removed at drop.
struct Pool(PathBuf);

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn c_programs_share_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tool = compile_c_against(
        &root.join("crates/kv-capi/examples/kvtool.c"),
        &dir.path().join("kvtool"),
        "kv-capi",
        "cairn_kv",
    );
    let name = format!("cairn-kv-test-capi-{}", std::process::id());
    let pool = Pool(PathBuf::from(format!("/dev/shm/{name}.pool")));
    let run = |args: &[&str]| {
        let o = Command::new(&tool).arg(&name).args(args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    // Three writers at once, one of them killed part way.
    let spawn = |op: &str, prefix: &str, n: &str| {
        Command::new(&tool)
            .args([name.as_str(), op, prefix, n])
            .spawn()
            .unwrap()
    };
    let mut victim = spawn("churn", "z", "1000");
    let (mut a, mut b) = (spawn("fill", "a", "20000"), spawn("fill", "b", "20000"));
    std::thread::sleep(std::time::Duration::from_millis(300));
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    for p in ["a", "b"] {
        let (code, out, err) = run(&["check", p, "20000"]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(out, "ok 20000\n");
    }
    // The killed writer's keys are there.
    assert!(run(&["get", "z999"]).1.starts_with("round "));
    // The CLI opens the same pool shared; errors come back with errno.
    assert_eq!(run(&["put", "k", "from C"]).0, Some(0));
    let o = Command::new(cairn_bin())
        .args(["kv", "get", "k", "--pool"])
        .arg(&pool.0)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "from C");
    let (code, _, err) = run(&["get", "missing"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no such key (errno 2)"), "{err}");
    let (code, _, err) = run(&["put", "", "v"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("errno 22"), "{err}");
    assert_eq!(run(&["del", "k"]).0, Some(0));
    assert_eq!(run(&["del", "k"]).0, Some(1), "already gone");
}
