//! CPython's own file-system test modules (its `test` package, shipped with the Python on
//! the machine), run with their temporary directory in the store, through the shim
//! (`python3 -m test --tempdir /cairn/… MODULES`) and on the FUSE mount. Each module
//! listed passes, as it does on tmpfs. Needs python3 with its `test` package
//! (scripts/setup.sh).

use cairn_tests::mount::Mount;
use cairn_tests::shim::sh;
use cairn_tests::TestStore;

/// The fourteen file-system modules. (`test_fcntl`'s test of 64-bit arguments asks a
/// Cairn directory for `F_NOTIFY` with `DN_MULTISHOT` and no event, which succeeds as on
/// Linux; a notification of events is refused: docs/SHIM.md.)
const MODULES: [&str; 14] = [
    "test_os",
    "test_shutil",
    "test_posix",
    "test_tempfile",
    "test_fileio",
    "test_glob",
    "test_pathlib",
    "test_io",
    "test_zipfile",
    "test_tarfile",
    "test_sqlite3",
    "test_mmap",
    "test_stat",
    "test_fcntl",
];

fn needs_the_test_package() {
    let has_tests = std::process::Command::new("python3")
        .args(["-c", "import test.support"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_tests,
        "python3's `test` package is missing (scripts/setup.sh)"
    );
}

#[test]
fn cpython_file_system_test_modules_pass_through_the_shim() {
    needs_the_test_package();
    let store = TestStore::new();
    store.fs().create_dir("/pytmp").unwrap();
    let out = sh(
        &store,
        &format!(
            "python3 -m test --tempdir /cairn/pytmp {} 2>&1; echo exit=$?",
            MODULES.join(" ")
        ),
    );
    assert!(
        out.contains("\nexit=0\n") && out.contains("Result: SUCCESS"),
        "{out}"
    );
}

#[test]
fn cpython_file_system_test_modules_pass_on_the_mount() {
    needs_the_test_package();
    let m = Mount::new();
    std::fs::create_dir(m.path("pytmp")).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-m", "test", "--tempdir"])
        .arg(m.path("pytmp"))
        .args(MODULES)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("Result: SUCCESS"),
        "{text}"
    );
    m.umount();
}
