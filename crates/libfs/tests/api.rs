//! Integration tests of the `cairn` API against a real daemon.
//!
//! They need the `cairn` binary (crates/cli) next to the test binary's directory
//! (`target/<profile>/cairn`, built by `cargo build -p cairn-cli`) or `$CAIRN_BIN`. When it
//! is missing the tests fail with a message saying how to build it.

use cairn::{File, Fs, OpenOptions, Permissions};
use cairn_area::errno_of;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The `cairn` binary (the daemon is started from it).
fn cairn_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("CAIRN_BIN") {
        return PathBuf::from(b);
    }
    // target/<profile>/deps/<test> -> target/<profile>/cairn
    let exe = std::env::current_exe().unwrap();
    let c = exe.parent().unwrap().parent().unwrap().join("cairn");
    assert!(
        c.is_file(),
        "no `cairn` binary at {}: build it with `cargo build -p cairn-cli` (same profile) or set CAIRN_BIN",
        c.display()
    );
    std::env::set_var("CAIRN_BIN", &c);
    c
}

/// A temporary store with a small NVM file on /dev/shm; stops its daemon when dropped.
struct Store {
    dir: tempfile::TempDir,
    nvm: PathBuf,
}

static N: AtomicU32 = AtomicU32::new(0);

impl Store {
    fn new(extra: &[&str]) -> Store {
        let bin = cairn_bin();
        let dir = tempfile::tempdir().unwrap();
        let nvm = PathBuf::from(format!(
            "/dev/shm/cairn-libfs-test-{}-{}.nvm",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let out = Command::new(&bin)
            .arg("mkfs")
            .arg("--store")
            .arg(dir.path())
            .arg("--nvm-size")
            .arg("128M")
            .arg("--nvm-path")
            .arg(&nvm)
            .args(["--max-clients", "4"])
            .args(if extra.contains(&"--log-size") {
                &[][..]
            } else {
                &["--log-size", "4M"][..]
            })
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mkfs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Store { dir, nvm }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn fs(&self) -> Fs {
        Fs::open(self.path()).expect("open store")
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = cairn::daemon_shutdown(Some(self.dir.path()));
        let _ = cairn_area::store::remove_nvm_files(&self.nvm);
    }
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    errno_of(&r.expect_err("expected an error"))
}

#[test]
fn files_directories_and_errors() {
    let s = Store::new(&[]);
    let fs = s.fs();
    fs.create_dir("/a").unwrap();
    fs.create_dir_all("/a/b/c").unwrap();
    assert_eq!(fs.metadata("/a").unwrap().nlink(), 3);
    assert_eq!(fs.metadata("/a/b/c").unwrap().nlink(), 2);
    fs.write("/a/f", b"hello").unwrap();
    assert_eq!(fs.read("/a/f").unwrap(), b"hello");
    assert_eq!(fs.read("a/./b/../f").unwrap(), b"hello");
    assert_eq!(errno(fs.create_dir("/a")), libc::EEXIST);
    assert_eq!(errno(fs.read("/a/nope")), libc::ENOENT);
    assert_eq!(errno(fs.read("/a/f/x")), libc::ENOTDIR);
    assert_eq!(errno(fs.remove_file("/a/b")), libc::EISDIR);
    assert_eq!(errno(fs.remove_dir("/a")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.rename("/a", "/a/b/c/d")), libc::EINVAL);
    assert_eq!(
        errno(fs.create_dir(format!("/{}", "y".repeat(300)))),
        libc::ENAMETOOLONG
    );
    let names: Vec<String> = {
        let mut v: Vec<_> = fs
            .read_dir("/a")
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names, ["b", "f"]);

    // Rename: a file over a file, a directory to another parent.
    fs.write("/a/g", b"gee").unwrap();
    fs.rename("/a/g", "/a/f").unwrap();
    assert_eq!(fs.read("/a/f").unwrap(), b"gee");
    assert!(!fs.exists("/a/g"));
    fs.rename("/a/b/c", "/c").unwrap();
    assert_eq!(fs.metadata("/a/b").unwrap().nlink(), 2);
    assert_eq!(fs.metadata("/").unwrap().nlink(), 4);
    assert_eq!(errno(fs.rename("/a/f", "/c")), libc::EISDIR);

    // Links.
    fs.hard_link("/a/f", "/a/h").unwrap();
    assert_eq!(fs.metadata("/a/f").unwrap().nlink(), 2);
    fs.symlink("/a/f", "/s").unwrap();
    fs.symlink("s", "/s2").unwrap();
    assert_eq!(fs.read("/s2").unwrap(), b"gee");
    assert_eq!(fs.read_link("/s2").unwrap(), PathBuf::from("s"));
    assert!(fs.symlink_metadata("/s").unwrap().is_symlink());
    fs.symlink("/loop1", "/loop2").unwrap();
    fs.symlink("/loop2", "/loop1").unwrap();
    assert_eq!(errno(fs.read("/loop1")), libc::ELOOP);
    fs.remove_file("/a/f").unwrap();
    assert_eq!(fs.metadata("/a/h").unwrap().nlink(), 1);
    assert_eq!(errno(fs.read("/s")), libc::ENOENT);

    // Permissions and times.
    fs.set_permissions("/a/h", Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(fs.metadata("/a/h").unwrap().permissions().mode(), 0o600);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    fs.set_times("/a/h", None, Some(t)).unwrap();
    assert_eq!(fs.metadata("/a/h").unwrap().modified(), t);

    // Everything survives a digest and a new client.
    fs.digest().unwrap();
    assert_eq!(fs.read("/a/h").unwrap(), b"gee");
    drop(fs);
    let fs = s.fs();
    assert_eq!(fs.read("/a/h").unwrap(), b"gee");
    assert_eq!(
        fs.read("/s2").unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    assert!(fs.metadata("/c").unwrap().is_dir());
    fs.remove_dir_all("/a").unwrap();
    assert!(!fs.exists("/a"));
}

#[test]
fn file_io_truncate_and_handles() {
    let s = Store::new(&[]);
    let fs = s.fs();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "/f")
        .unwrap();
    f.write_all(&[1u8; 10000]).unwrap();
    f.set_len(100).unwrap();
    f.set_len(5000).unwrap();
    let mut buf = vec![9u8; 6000];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 5000);
    assert!(buf[..100].iter().all(|&b| b == 1));
    assert!(buf[100..5000].iter().all(|&b| b == 0));
    fs.digest().unwrap();
    let mut buf2 = vec![9u8; 6000];
    assert_eq!(f.read_at(&mut buf2, 0).unwrap(), 5000);
    assert_eq!(buf, buf2);
    f.seek(SeekFrom::Start(4999)).unwrap();
    f.write_all(b"xyz").unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5002);
    // Append handle.
    let mut a = OpenOptions::new().append(true).open(&fs, "/f").unwrap();
    a.write_all(b"END").unwrap();
    assert_eq!(&fs.read("/f").unwrap()[4999..], b"xyzEND");
    // Read-only handle refuses writes.
    let r = File::open(&fs, "/f").unwrap();
    assert_eq!(errno(r.write_at(b"x", 0)), libc::EBADF);
    let mut all = Vec::new();
    (&r).read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 5005);
    // Unlinked while open: readable and writable until closed.
    fs.remove_file("/f").unwrap();
    assert!(!fs.exists("/f"));
    assert_eq!(r.metadata().unwrap().nlink(), 0);
    f.write_at(b"still", 0).unwrap();
    let mut five = [0u8; 5];
    r.read_at(&mut five, 0).unwrap();
    assert_eq!(&five, b"still");
    drop((f, a, r));
    assert_eq!(
        errno(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&fs, "/")
        ),
        libc::EEXIST
    );
}

#[test]
fn big_writes_wrap_the_log() {
    let s = Store::new(&["--log-size", "1M"]);
    let fs = s.fs();
    let f = File::create(&fs, "/big").unwrap();
    let chunk: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    for i in 0..20u64 {
        f.write_at(&chunk, i * chunk.len() as u64).unwrap();
    }
    let all = fs.read("/big").unwrap();
    assert_eq!(all.len(), 20 * chunk.len());
    for c in all.chunks(chunk.len()) {
        assert_eq!(c, &chunk[..]);
    }
    // Many small transactions around the ring, with files created and removed.
    for i in 0..3000 {
        let p = format!("/s{}", i % 50);
        fs.write(&p, format!("{i}")).unwrap();
    }
    assert_eq!(fs.read("/s49").unwrap(), b"2999");
}

#[test]
fn threads_see_each_other() {
    let s = Store::new(&[]);
    let fs = s.fs();
    fs.create_dir("/t").unwrap();
    std::thread::scope(|sc| {
        for t in 0..4 {
            let fs = &fs;
            sc.spawn(move || {
                for i in 0..200 {
                    fs.write(format!("/t/{t}-{i}"), format!("{t}:{i}")).unwrap();
                }
            });
        }
    });
    assert_eq!(fs.read_dir("/t").unwrap().count(), 800);
    assert_eq!(fs.read("/t/3-199").unwrap(), b"3:199");
}

#[test]
fn daemon_restart_reattaches() {
    let s = Store::new(&[]);
    let fs = s.fs();
    fs.write("/before", b"1").unwrap();
    cairn::daemon_shutdown(Some(s.path())).unwrap();
    // The next request that needs the daemon restarts it and re-attaches.
    fs.write("/after", b"2").unwrap();
    fs.digest().unwrap();
    assert_eq!(fs.read("/before").unwrap(), b"1");
    assert_eq!(fs.read("/after").unwrap(), b"2");
    drop(fs);
    let fs = s.fs();
    assert_eq!(fs.read("/after").unwrap(), b"2");
}

/// A file takes at most `LINK_MAX` (65,000, as ext4) names; one more link is `EMLINK`,
/// and removing one makes room again.
#[test]
fn hard_links_stop_at_link_max() {
    let s = Store::new(&[]);
    let fs = s.fs();
    fs.write("/f", b"x").unwrap();
    for d in 0..65 {
        fs.create_dir(format!("/d{d}")).unwrap();
        for i in 0..1000 {
            if d == 0 && i == 0 {
                continue;
            }
            fs.hard_link("/f", format!("/d{d}/{i}")).unwrap();
        }
    }
    assert_eq!(fs.metadata("/f").unwrap().nlink(), cairn_format::LINK_MAX);
    assert_eq!(errno(fs.hard_link("/f", "/one-more")), libc::EMLINK);
    fs.remove_file("/d7/7").unwrap();
    fs.hard_link("/f", "/one-more").unwrap();
    assert_eq!(fs.metadata("/one-more").unwrap().nlink(), 65_000);
}

#[test]
fn a_link_root_sends_links_out_of_the_store_to_the_host() {
    let s = Store::new(&[]);
    let fs = s.fs();
    fs.create_dir("/d").unwrap();
    fs.write("/d/target", b"inside").unwrap();
    fs.symlink("/mnt/c/d/target", "/d/in").unwrap();
    fs.symlink("/etc/hosts", "/d/out").unwrap();
    fs.symlink("../..", "/d/up").unwrap();
    // Without a root, absolute targets start at the store's root.
    assert_eq!(errno(fs.read("/d/in")), libc::ENOENT);
    assert_eq!(errno(fs.read("/d/out")), libc::ENOENT);
    fs.set_link_root(Some(Path::new("/mnt/c"))).unwrap();
    assert_eq!(fs.read("/d/in").unwrap(), b"inside");
    let elsewhere = |r: std::io::Result<Vec<u8>>| {
        let e = r.expect_err("leaves the store");
        assert_eq!(errno_of(&e), libc::EXDEV);
        String::from_utf8(cairn_area::error::elsewhere_path(&e).unwrap().to_vec()).unwrap()
    };
    assert_eq!(elsewhere(fs.read("/d/out")), "/etc/hosts");
    assert_eq!(elsewhere(fs.read("/d/up/x/")), "/mnt/x/");
    assert_eq!(elsewhere(fs.read("/..")), "/mnt");
    // Not following the last link: the link itself.
    assert_eq!(fs.read_link("/d/out").unwrap(), Path::new("/etc/hosts"));
    assert!(fs
        .symlink_metadata("/d/up")
        .unwrap()
        .file_type()
        .is_symlink());
    // A rename or hard link through a link out of the store is cross-device.
    assert_eq!(errno(fs.rename("/d/target", "/d/up/t")), libc::EXDEV);
    assert_eq!(
        errno(fs.set_link_root(Some(Path::new("rel")))),
        libc::EINVAL
    );
    fs.set_link_root(None).unwrap();
    assert_eq!(errno(fs.read("/d/in")), libc::ENOENT);
}
