//! CPython's own file-system test modules (its `test` package, shipped with the Python on
//! the machine), run through the shim with their temporary directory in the store:
//! `python3 -m test --tempdir /cairn/… MODULES`. Each module listed passes, as it does on
//! tmpfs. Needs python3 with its `test` package (scripts/setup.sh).

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

#[test]
fn cpython_file_system_test_modules_pass_through_the_shim() {
    let has_tests = std::process::Command::new("python3")
        .args(["-c", "import test.support"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_tests,
        "python3's `test` package is missing (scripts/setup.sh)"
    );
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
