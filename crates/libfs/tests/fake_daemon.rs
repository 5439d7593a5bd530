//! LibFS against a minimal in-process stand-in for `cairnd` that never digests: it
//! formats a small NVM file, registers the client, hands out inodes and credits, and at
//! `Goodbye` checks that the client's log holds only valid, decodable transactions up
//! to its tail. Everything the client reads therefore comes from its overlay (plus the
//! empty root directory of the shared area), which is what these tests exercise.

use cairn::{File, Fs, OpenOptions, Permissions};
use cairn_area::errno_of;
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::log::{records, scan, Record, Stop, KIND_COMMIT};
use cairn_format::superblock::{encode_state, Layout, Params, Superblock};
use cairn_format::BLOCK_SIZE_U64;
use cairn_proto::{recv, send, Registration, Request, Response, StatusReport};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const RING: u64 = 1 << 20;
const TOTAL: u64 = 16 << 20;

struct Fake {
    dir: tempfile::TempDir,
    nvm: PathBuf,
    layout: Layout,
    /// Transactions validated at Goodbye (`u64::MAX` until then).
    validated: Arc<AtomicU64>,
    problems: Arc<Mutex<Vec<String>>>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.nvm);
    }
}

fn start() -> Fake {
    start_with(RING, TOTAL)
}

fn start_with(ring_bytes: u64, total: u64) -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let nvm = PathBuf::from(format!(
        "/dev/shm/cairn-libfs-fake-{}-{}.nvm",
        std::process::id(),
        dir.path().file_name().unwrap().to_string_lossy()
    ));
    let layout = Layout::compute(Params {
        total_bytes: total,
        nslots: 2,
        log_bytes: ring_bytes,
        inode_count: 1024,
    })
    .unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&nvm)
        .unwrap();
    f.set_len(total).unwrap();
    let sb = Superblock {
        layout,
        uuid: [1; 16],
        created_ns: 1,
    };
    f.write_all_at(&sb.encode(), 0).unwrap();
    f.write_all_at(&encode_state(false), BLOCK_SIZE_U64)
        .unwrap();
    let root = Inode {
        attrs: Attrs {
            kind: Kind::Dir,
            perm: 0o755,
            nlink: 2,
            parent: 1,
            ..Default::default()
        },
        generation: 1,
        ..Default::default()
    };
    f.write_all_at(&root.encode(), layout.inode_off(1)).unwrap();
    std::fs::create_dir(dir.path().join("slots")).unwrap();
    std::fs::write(dir.path().join("slots/0.lock"), b"").unwrap();

    let listener = UnixListener::bind(dir.path().join("cairnd.sock")).unwrap();
    let validated = Arc::new(AtomicU64::new(u64::MAX));
    let problems = Arc::new(Mutex::new(Vec::new()));
    let (v2, p2, nvm2) = (validated.clone(), problems.clone(), nvm.clone());
    std::thread::spawn(move || {
        let next_ino = AtomicU64::new(2);
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            while let Ok(req) = recv::<Request>(&mut c) {
                let batch = |n: u64| -> Vec<u64> {
                    let s = next_ino.fetch_add(n, Ordering::SeqCst);
                    (s..s + n).collect()
                };
                let resp = match req {
                    Request::Register { .. } => {
                        let (uid, gid) = cairn_media::sys::ids();
                        Response::Registered(Registration {
                            slot: 0,
                            slot_gen: 1,
                            head_lsn: 0,
                            head_seq: 1,
                            nvm_path: nvm2.to_string_lossy().into_owned(),
                            digest_threshold_pct: 90,
                            inodes: batch(64),
                            credits: 1 << 20,
                            uid,
                            gid,
                        })
                    }
                    Request::Inodes { count } => Response::Inodes(batch(count as u64)),
                    Request::Credits { blocks } => Response::Credits { granted: blocks },
                    Request::Digest { wait: false, .. } => continue,
                    Request::Digest { .. } => Response::Error {
                        errno: libc::ENOSPC,
                        message: "the fake daemon never digests".into(),
                    },
                    Request::Status => Response::Status(StatusReport {
                        store: "fake".into(),
                        tiers: vec![],
                        inodes: Default::default(),
                        clients: vec![],
                        digest: Default::default(),
                    }),
                    Request::Goodbye { tail_lsn } => {
                        let mut ring = vec![0u8; tail_lsn as usize];
                        let f = std::fs::File::open(&nvm2).unwrap();
                        f.read_exact_at(&mut ring, layout.ring_off(0)).unwrap();
                        let s = scan(&ring, 0, 1, ring_bytes);
                        let mut bad = Vec::new();
                        if s.end_lsn != tail_lsn || !matches!(s.stop, Stop::End) {
                            bad.push(format!("scan stopped at {}: {:?}", s.end_lsn, s.stop));
                        }
                        for t in &s.txns {
                            if t.kind == KIND_COMMIT {
                                let b = &ring[t.lsn as usize..t.lsn as usize + t.len];
                                match records(b, t.nrec) {
                                    Ok(recs) => {
                                        if recs
                                            .iter()
                                            .any(|r| matches!(r, Record::InodeSet { ino: 0, .. }))
                                        {
                                            bad.push("INODE_SET of inode 0".into());
                                        }
                                    }
                                    Err(e) => bad.push(format!("txn at {}: {e}", t.lsn)),
                                }
                            }
                        }
                        p2.lock().unwrap().extend(bad);
                        v2.store(s.txns.len() as u64, Ordering::SeqCst);
                        Response::Ok
                    }
                    other => Response::Error {
                        errno: libc::ENOSYS,
                        message: format!("fake daemon: {other:?}"),
                    },
                };
                if send(&mut c, &resp).is_err() {
                    break;
                }
            }
        }
    });
    Fake {
        dir,
        nvm,
        layout,
        validated,
        problems,
    }
}

impl Fake {
    fn path(&self) -> &Path {
        self.dir.path()
    }
    /// Check the log the client left behind.
    fn check_log(&self) {
        for _ in 0..200 {
            if self.validated.load(Ordering::SeqCst) != u64::MAX {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let n = self.validated.load(Ordering::SeqCst);
        assert!(n != u64::MAX && n > 0, "no goodbye seen");
        let p = self.problems.lock().unwrap();
        assert!(p.is_empty(), "malformed log: {p:?}");
        let _ = self.layout;
    }
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    errno_of(&r.expect_err("expected an error"))
}

#[test]
fn namespace_operations_in_the_overlay() {
    let fk = start();
    let fs = Fs::open(fk.path()).unwrap();
    fs.create_dir("/a").unwrap();
    fs.create_dir_all("/a/b/c").unwrap();
    fs.create_dir_all("/a/b/c").unwrap();
    assert_eq!(fs.metadata("/").unwrap().nlink(), 3);
    assert_eq!(fs.metadata("/a").unwrap().nlink(), 3);
    fs.write("/a/f", b"hello").unwrap();
    assert_eq!(fs.read("/a/f").unwrap(), b"hello");
    assert_eq!(fs.read("a/./b/../f").unwrap(), b"hello");
    assert_eq!(fs.read("/../../a/f").unwrap(), b"hello");
    assert_eq!(errno(fs.create_dir("/a")), libc::EEXIST);
    assert_eq!(errno(fs.read("/a/nope")), libc::ENOENT);
    assert_eq!(errno(fs.read("/a/f/x")), libc::ENOTDIR);
    assert_eq!(errno(fs.metadata("/a/f/")), libc::ENOTDIR);
    assert_eq!(errno(fs.read("/a")), libc::EISDIR);
    assert_eq!(errno(fs.remove_file("/a/b")), libc::EISDIR);
    assert_eq!(errno(fs.remove_dir("/a/f")), libc::ENOTDIR);
    assert_eq!(errno(fs.remove_dir("/a")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.remove_dir("/")), libc::EBUSY);
    assert_eq!(errno(fs.rename("/a", "/a/b/c/d")), libc::EINVAL);
    fs.rename("/a", "/a").unwrap();
    assert_eq!(
        errno(fs.create_dir(format!("/{}", "y".repeat(256)))),
        libc::ENAMETOOLONG
    );
    let mut names: Vec<String> = fs
        .read_dir("/a")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "f"]);
    let e = fs
        .read_dir("/a")
        .unwrap()
        .find(|e| e.as_ref().unwrap().file_name() == "b");
    let e = e.unwrap().unwrap();
    assert!(e.file_type().unwrap().is_dir());
    assert_eq!(e.path(), PathBuf::from("/a/b"));
    assert!(e.metadata().unwrap().is_dir());
    drop(e); // entries keep the client alive, like open files

    // Rename over a file; a directory to another parent; rename replacing an empty dir.
    fs.write("/a/g", b"gee").unwrap();
    fs.rename("/a/g", "/a/f").unwrap();
    assert_eq!(fs.read("/a/f").unwrap(), b"gee");
    assert!(!fs.exists("/a/g"));
    fs.rename("/a/b/c", "/c").unwrap();
    assert_eq!(fs.metadata("/a/b").unwrap().nlink(), 2);
    assert_eq!(fs.metadata("/").unwrap().nlink(), 4);
    assert_eq!(fs.metadata("/c/..").unwrap().ino(), 1);
    assert_eq!(errno(fs.rename("/a/f", "/c")), libc::EISDIR);
    assert_eq!(errno(fs.rename("/c", "/a/f")), libc::ENOTDIR);
    fs.create_dir("/e").unwrap();
    fs.rename("/c", "/e").unwrap();
    assert!(!fs.exists("/c"));
    assert_eq!(fs.metadata("/").unwrap().nlink(), 4);
    fs.create_dir("/e/x").unwrap();
    fs.create_dir("/z").unwrap();
    assert_eq!(errno(fs.rename("/z", "/e")), libc::ENOTEMPTY);

    // Links.
    fs.hard_link("/a/f", "/a/h").unwrap();
    assert_eq!(fs.metadata("/a/f").unwrap().nlink(), 2);
    assert_eq!(errno(fs.hard_link("/a", "/a2")), libc::EPERM);
    fs.symlink("/a/f", "/s").unwrap();
    fs.symlink("s", "/s2").unwrap();
    fs.symlink("../a", "/e/up").unwrap();
    assert_eq!(fs.read("/s2").unwrap(), b"gee");
    assert_eq!(fs.read("/e/up/h").unwrap(), b"gee");
    assert_eq!(fs.read_link("/s2").unwrap(), PathBuf::from("s"));
    assert!(fs.symlink_metadata("/s").unwrap().is_symlink());
    assert_eq!(fs.symlink_metadata("/s").unwrap().len(), 4);
    assert!(fs.metadata("/s").unwrap().is_file());
    assert_eq!(errno(fs.read_link("/a/f")), libc::EINVAL);
    fs.symlink("/loop1", "/loop2").unwrap();
    fs.symlink("/loop2", "/loop1").unwrap();
    assert_eq!(errno(fs.read("/loop1")), libc::ELOOP);
    // Creating through a dangling symlink creates its target.
    fs.symlink("/made", "/dangling").unwrap();
    fs.write("/dangling", b"m").unwrap();
    assert_eq!(fs.read("/made").unwrap(), b"m");
    assert_eq!(
        errno(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&fs, "/dangling")
        ),
        libc::EEXIST
    );
    fs.remove_file("/a/f").unwrap();
    assert_eq!(fs.metadata("/a/h").unwrap().nlink(), 1);
    assert_eq!(errno(fs.read("/s")), libc::ENOENT);
    fs.remove_file("/s").unwrap();
    assert!(fs.symlink_metadata("/s").is_err());

    // Permissions and times.
    fs.set_permissions("/a/h", Permissions::from_mode(0o600))
        .unwrap();
    let m = fs.metadata("/a/h").unwrap();
    assert_eq!(m.permissions().mode(), 0o600);
    assert_eq!(m.mode(), 0o100600);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    fs.set_times("/a/h", None, Some(t)).unwrap();
    assert_eq!(fs.metadata("/a/h").unwrap().modified(), t);
    assert!(fs.metadata("/a/h").unwrap().changed() > t);

    fs.remove_dir_all("/a").unwrap();
    assert!(!fs.exists("/a"));
    assert!(!fs.exists("/a/h"));
    assert_eq!(fs.metadata("/").unwrap().nlink(), 4); // "/", e, z: 2 + 2
    drop(fs);
    fk.check_log();
}

#[test]
fn file_io_truncation_and_open_handles() {
    let fk = start();
    let fs = Fs::open(fk.path()).unwrap();
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
    f.seek(std::io::SeekFrom::Start(4999)).unwrap();
    f.write_all(b"xyz").unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5002);
    // Holes read as zeros.
    f.write_at(b"far", 100_000).unwrap();
    let mut hole = vec![9u8; 10];
    f.read_at(&mut hole, 50_000).unwrap();
    assert_eq!(hole, [0u8; 10]);
    f.set_len(5002).unwrap();
    let mut a = OpenOptions::new().append(true).open(&fs, "/f").unwrap();
    a.write_all(b"END").unwrap();
    a.write_at(b"!", 0).unwrap(); // append handles always write at the end
    assert_eq!(&fs.read("/f").unwrap()[4999..], b"xyzEND!");
    let r = File::open(&fs, "/f").unwrap();
    assert_eq!(errno(r.write_at(b"x", 0)), libc::EBADF);
    assert_eq!(errno(r.set_len(0)), libc::EINVAL);
    let mut all = Vec::new();
    (&r).read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 5006);
    // Unlinked while open: the data lives until the last close.
    fs.remove_file("/f").unwrap();
    assert!(!fs.exists("/f"));
    assert_eq!(r.metadata().unwrap().nlink(), 0);
    f.write_at(b"still", 0).unwrap();
    let mut five = [0u8; 5];
    r.read_at(&mut five, 0).unwrap();
    assert_eq!(&five, b"still");
    drop((f, a, r));
    // Truncating open of an existing file.
    fs.write("/g", vec![5u8; 3000]).unwrap();
    fs.write("/g", b"ab").unwrap();
    assert_eq!(fs.read("/g").unwrap(), b"ab");
    assert_eq!(errno(File::open(&fs, "/nope")), libc::ENOENT);
    assert_eq!(
        errno(OpenOptions::new().write(true).open(&fs, "/")),
        libc::EISDIR
    );
    assert_eq!(errno(OpenOptions::new().open(&fs, "/g")), libc::EINVAL);
    // A large write is split into several transactions (each <= ring / 4).
    let big: Vec<u8> = (0..700_000u32).map(|i| (i % 253) as u8).collect();
    fs.write("/big", &big).unwrap();
    assert_eq!(fs.read("/big").unwrap(), big);
    assert_eq!(fs.status().unwrap().store, "fake");
    drop(fs);
    fk.check_log();
}

#[test]
fn threads_share_one_client() {
    let fk = start();
    let fs = Fs::open(fk.path()).unwrap();
    fs.create_dir("/t").unwrap();
    std::thread::scope(|sc| {
        for t in 0..4 {
            let fs = &fs;
            sc.spawn(move || {
                for i in 0..50 {
                    fs.write(format!("/t/{t}-{i}"), format!("{t}:{i}")).unwrap();
                    assert_eq!(
                        fs.read(format!("/t/{t}-{i}")).unwrap(),
                        format!("{t}:{i}").as_bytes()
                    );
                }
            });
        }
    });
    assert_eq!(fs.read_dir("/t").unwrap().count(), 200);
    assert_eq!(fs.read("/t/3-49").unwrap(), b"3:49");
    drop(fs);
    fk.check_log();
}
