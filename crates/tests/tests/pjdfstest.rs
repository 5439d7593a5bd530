//! The POSIX conformance suite pjdfstest (its Rust version, 398 test cases of `chmod`,
//! `chown`, `link`, `mkdir`, `mkfifo`, `mknod`, `open`, `rename`, `rmdir`, `symlink`,
//! `truncate`, `unlink`, `utimensat`, `posix_fallocate` and their errors, some as other
//! users), run as root on tmpfs, through the shim and on the FUSE mount. Every case that
//! passes on tmpfs passes on the mount, and through the shim except those in
//! `SHIM_KNOWN` (docs/SHIM.md, "Limits"). `scripts/setup.sh` installs the suite
//! (`cargo install pjdfstest`); without it the test fails.

use cairn_tests::harness::cairn_bin;
use cairn_tests::mount::Mount;
use cairn_tests::TestStore;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Cases that cannot pass through the shim, with why: a program run from the store
/// runs from a copy in memory, so the store's file is not busy (`ETXTBSY`); the kernel
/// cannot mount on a directory it does not see (`EBUSY` of a mount point).
const SHIM_KNOWN: &[&str] = &["rmdir::ebusy"];

/// The suite's settings: the features Linux has, a nap longer than tmpfs's time
/// granularity, and two users that exist on Debian for its user-switching cases.
const CONFIG: &str = r#"[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#;

fn suite() -> PathBuf {
    if let Some(p) = std::env::var_os("CAIRN_PJDFSTEST") {
        return p.into();
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(home.map(|h| h.join("bin")))
        .map(|d| d.join("pjdfstest"))
        .find(|p| p.is_file());
    found.expect("pjdfstest is missing: scripts/setup.sh installs it (cargo install pjdfstest)")
}

/// Each case's outcome (`ok`, `FAILED`, `skipped`) from the suite's output; the whole
/// output when it did not get to its summary (a crash).
fn outcomes(out: std::process::Output, what: &str) -> BTreeMap<String, String> {
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("\nSummary: "),
        "{what}: the suite did not finish ({}):\n{text}",
        out.status
    );
    let mut r = BTreeMap::new();
    for l in text.lines() {
        let mut w = l.split_whitespace();
        if let (Some(name), Some(res), None) = (w.next(), w.next(), w.next()) {
            if name.contains("::") && ["ok", "FAILED", "skipped"].contains(&res) {
                r.insert(name.to_string(), res.to_string());
            }
        }
    }
    r
}

/// Run the suite in `dir` (`wrap`: the command line before it, for the shim).
fn run(dir: &str, wrap: &[&str], config: &Path, what: &str) -> BTreeMap<String, String> {
    let bin = suite();
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let out = cmd
        .arg("-c")
        .arg(config)
        .args(["-p", dir])
        .current_dir("/")
        .output()
        .unwrap();
    outcomes(out, what)
}

/// The cases that pass on `base` but not in `got`, `known` aside.
fn regressions(
    base: &BTreeMap<String, String>,
    got: &BTreeMap<String, String>,
    known: &[&str],
) -> Vec<String> {
    base.iter()
        .filter(|(_, r)| *r == "ok")
        .filter(|(n, _)| got.get(*n).map(String::as_str) != Some("ok"))
        .filter(|(n, _)| !known.contains(&n.as_str()))
        .map(|(n, _)| format!("{n}: {}", got.get(n).map_or("missing", String::as_str)))
        .collect()
}

#[test]
fn pjdfstest_passes_through_the_shim_and_on_the_mount_as_on_tmpfs() {
    if cairn_media::sys::ids().0 != 0 {
        eprintln!("skipped: needs root (the suite switches users)");
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("cairn-test-pjd-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let config = work.path().join("pjdfstest.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tmpfs = work.path().join("tmpfs");
    std::fs::create_dir(&tmpfs).unwrap();
    let base = run(tmpfs.to_str().unwrap(), &[], &config, "tmpfs");
    let passed = base.values().filter(|r| *r == "ok").count();
    assert!(passed > 350, "tmpfs passes only {passed} cases: {base:?}");

    let m = Mount::new();
    std::fs::create_dir(m.path("pjd")).unwrap();
    let mount = run(m.path("pjd").to_str().unwrap(), &[], &config, "mount");
    m.umount();
    m.store.fsck_clean();
    let bad = regressions(&base, &mount, &[]);
    assert!(bad.is_empty(), "on the mount, not as on tmpfs: {bad:#?}");

    let store = TestStore::new();
    store.fs().create_dir("/pjd").unwrap();
    let cairn = cairn_bin();
    let wrap = [
        cairn.to_str().unwrap(),
        "--store",
        store.path().to_str().unwrap(),
        "run",
        "--",
    ];
    let shim = run("/cairn/pjd", &wrap, &config, "shim");
    let bad = regressions(&base, &shim, SHIM_KNOWN);
    assert!(
        bad.is_empty(),
        "through the shim, not as on tmpfs: {bad:#?}"
    );
    let ran = shim.values().filter(|r| *r != "skipped").count();
    let ok = shim.values().filter(|r| *r == "ok").count();
    eprintln!(
        "pjdfstest: tmpfs {passed} passed; mount {} passed; shim {ok} of {ran} run passed",
        mount.values().filter(|r| *r == "ok").count()
    );
    assert!(ok * 100 >= ran * 99, "shim: {ok} of {ran}");
    store.fsck_clean();
}
