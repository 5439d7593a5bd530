//! POSIX conformance measured against Linux itself: `scripts/conformance.py` (error
//! paths, open flags, which calls change which times, permissions as other users in
//! sticky and setgid directories, `*at` calls) prints a transcript on a host directory,
//! through `cairn run` and on `cairn mount`; the transcripts must be equal, except for
//! the differences listed in docs/ARCHITECTURE.md ("Limits") and in `KNOWN` here. Needs
//! root (the users 1000 and 1001 are played by child processes) and python3.

use cairn_tests::harness::cairn_bin;
use cairn_tests::mount::Mount;
use cairn_tests::TestStore;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/conformance.py");
/// The store's trusted group: the test users get it as a supplementary group, so that
/// they may use the store through LibFS (the trust domain), where their permissions are
/// then checked like any user's.
const GROUP: u32 = 4243;
/// Checks whose answer on Cairn differs from Linux, on purpose and documented: an
/// extended attribute change does not update `ctime` (ARCHITECTURE.md, "Limits").
const KNOWN: &[(&str, &str)] = &[("times setxattr (file)", "-")];

fn transcript(out: std::process::Output, what: &str) -> Vec<String> {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Every line of `got` equals Linux's, or is a known difference.
fn compare(linux: &[String], got: &[String], what: &str) {
    assert_eq!(linux.len(), got.len(), "{what}: {got:#?}");
    let mut bad = Vec::new();
    for (l, g) in linux.iter().zip(got) {
        let known = KNOWN
            .iter()
            .any(|(check, answer)| g.starts_with(check) && g.ends_with(answer));
        if l != g && !known {
            bad.push(format!("Linux: {l}\n  {what}: {g}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what} differs from Linux:\n{}",
        bad.join("\n")
    );
}

#[test]
fn cairn_answers_as_linux_does() {
    if cairn_media::sys::ids().0 != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let linux = transcript(
        Command::new("python3")
            .arg(SCRIPT)
            .arg(host.path())
            .env("CONFORMANCE_GROUPS", GROUP.to_string())
            .output()
            .unwrap(),
        "the host",
    );
    assert!(linux.len() > 60, "{linux:#?}");
    let store = TestStore::with_trusted_group(GROUP);
    let shim = transcript(
        Command::new(cairn_bin())
            .arg("--store")
            .arg(store.path())
            .args(["run", "--", "sh", "-c"])
            .arg(format!("mkdir /cairn/shim && python3 {SCRIPT} /cairn/shim"))
            .env("CONFORMANCE_GROUPS", GROUP.to_string())
            .output()
            .unwrap(),
        "cairn run",
    );
    compare(&linux, &shim, "cairn run");
    let m = Mount::of(store, &[]);
    std::fs::create_dir(m.path("mount")).unwrap();
    let mount = transcript(
        Command::new("python3")
            .arg(SCRIPT)
            .arg(m.path("mount"))
            .env("CONFORMANCE_GROUPS", GROUP.to_string())
            .output()
            .unwrap(),
        "cairn mount",
    );
    compare(&linux, &mount, "cairn mount");
}
