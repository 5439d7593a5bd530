//! The trust domain and the daemon's permission checks, with processes of other users
//! (`CommandExt::uid/gid`; these tests need root, as in CI, and are skipped otherwise).
//!
//! * A process outside the trust domain is refused with a clear error naming the
//!   mediated path (`cairn ls` prints it) and cannot open the NVM file.
//! * A non-root member of the trusted group works through LibFS.
//! * A hand-rolled malicious client in the trust domain (uid 1000) logs operations it has
//!   no permission for: each is refused and the shared area is untouched, while its
//!   permitted operations digest. The malicious client is this test binary re-run as uid
//!   1000 (`malicious_client_child`, a no-op unless `CAIRN_TRUST_CHILD` is set).

use cairn::Permissions;
use cairn_format::inode::{Attrs, Kind};
use cairn_format::log::{self, Record};
use cairn_proto::{Request, Response};
use cairn_tests::harness::cairn_bin;
use cairn_tests::raw::RawClient;
use cairn_tests::TestStore;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const USER: u32 = 1000;
const GROUP: u32 = 4242;

fn is_root() -> bool {
    cairn_media::sys::ids().0 == 0
}

/// A store made by root with `--trusted-group 4242`.
fn group_store() -> TestStore {
    TestStore::with_trusted_group(GROUP)
}

fn cairn_as(store: &Path, uid: u32, gid: u32, args: &[&str]) -> std::process::Output {
    Command::new(cairn_bin())
        .arg("--store")
        .arg(store)
        .args(args)
        .uid(uid)
        .gid(gid)
        .env_remove("XDG_DATA_HOME")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap()
}

/// Run test `name` of this binary as uid `USER` in group `GROUP` (a member of the trusted
/// group) with `env`; its output, once it succeeded.
fn member_child(name: &str, env: &[(&str, String)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .uid(USER)
        .gid(GROUP)
        .output()
        .unwrap();
    let child =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: {child}");
    child
}

#[test]
fn untrusted_users_are_refused_with_the_mediated_path() {
    if !is_root() {
        eprintln!("skipped: needs root to run processes as another uid");
        return;
    }
    let store = TestStore::new();
    {
        let fs = store.fs(); // starts the daemon (as root)
        fs.write("/hello", b"hi").unwrap();
    }
    let out = cairn_as(store.path(), USER, USER, &["ls", "/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ls as uid {USER} must fail: {err}");
    assert!(
        err.contains("uid 1000 is not in the trust domain of store"),
        "{err}"
    );
    assert!(err.contains("owner uid 0, group none"), "{err}");
    assert!(err.contains("cairn mount"), "{err}");
    assert!(!out.stdout.windows(5).any(|w| w == b"hello"));
    // Nor can it map the NVM file or take a slot lock itself.
    let cfg = cairn_area::StoreDir::new(store.path())
        .load_config()
        .unwrap();
    for p in [
        cfg.nvm_path.clone(),
        cairn_area::StoreDir::new(store.path()).slot_lock_path(0),
    ] {
        let out = Command::new("cat")
            .arg(&p)
            .uid(USER)
            .gid(USER)
            .stdout(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "uid {USER} opened {}", p.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    }
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    assert!(log.contains("registration refused"), "{log}");
    // Root still works.
    assert_eq!(store.fs().read("/hello").unwrap(), b"hi");
}

#[test]
fn a_trusted_group_member_works() {
    if !is_root() {
        eprintln!("skipped: needs root to run processes as another uid");
        return;
    }
    let store = group_store();
    {
        let fs = store.fs();
        fs.write("/rootfile", b"root's").unwrap();
        fs.create_dir("/shared").unwrap();
        fs.set_permissions("/shared", Permissions::from_mode(0o777))
            .unwrap();
    }
    let out = cairn_as(store.path(), USER, GROUP, &["mkdir", "/shared/d"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cairn_as(store.path(), USER, GROUP, &["cat", "/rootfile"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"root's");
    // LibFS itself refuses what the user may not do (EACCES before anything is logged).
    let out = cairn_as(store.path(), USER, GROUP, &["mkdir", "/nope"]);
    assert!(!out.status.success());
    // Every kind of change through the real LibFS, as a non-root client: each call is
    // its own process, so each one's log is digested (and checked) when it exits.
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::write(&src, b"user data").unwrap();
    std::fs::set_permissions(
        host.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let src = src.to_str().unwrap();
    for args in [
        &["put", src, "/shared/f"][..],
        &["put", src, "/shared/f"], // overwrite: truncate + write
        &["mkdir", "-p", "/shared/d/e/f"],
        &["mv", "/shared/f", "/shared/d/e/g"],
        &["ln", "/shared/d/e/g", "/shared/h"],
        &["ln", "-s", "/shared/h", "/shared/sym"],
        &["ln", "/rootfile", "/shared/rootlink"],
        &["mv", "/shared/d/e/f", "/shared/moved"],
        &["rm", "/shared/h", "/shared/rootlink"],
        &["rm", "-r", "/shared/d/e"],
        &["put", src, "/shared/last"],
    ] {
        let out = cairn_as(store.path(), USER, GROUP, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let fs = store.fs();
    let m = fs.metadata("/shared/d").unwrap();
    assert!(m.is_dir());
    assert_eq!((m.uid(), m.gid()), (USER, GROUP));
    assert!(!fs.exists("/nope"));
    assert!(!fs.exists("/shared/d/e"));
    assert!(fs.metadata("/shared/moved").unwrap().is_dir());
    assert_eq!(fs.read("/shared/last").unwrap(), b"user data");
    assert_eq!(fs.metadata("/rootfile").unwrap().nlink(), 1);
    assert_eq!(fs.metadata("/shared").unwrap().nlink(), 4);
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    assert!(!log.contains("malformed"), "{log}");
    // A user outside the group (and not the owner) is refused.
    let out = cairn_as(store.path(), USER, USER, &["ls", "/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("owner uid 0, group 4242"), "{err}");
}

#[test]
fn a_malicious_trusted_client_cannot_exceed_its_permissions() {
    if !is_root() {
        eprintln!("skipped: needs root to run processes as another uid");
        return;
    }
    let store = group_store();
    let fs = store.fs();
    fs.create_dir("/locked").unwrap(); // 0755 root
    fs.write("/rootfile", b"root's data").unwrap(); // 0644 root
    fs.create_dir("/shared").unwrap();
    fs.set_permissions("/shared", Permissions::from_mode(0o777))
        .unwrap();
    let locked = fs.metadata("/locked").unwrap().ino();
    let shared = fs.metadata("/shared").unwrap().ino();
    let rootfile_meta = fs.metadata("/rootfile").unwrap();
    drop(fs);
    let child = member_child(
        "malicious_client_child",
        &[
            ("CAIRN_TRUST_CHILD", store.path().display().to_string()),
            ("LOCKED_INO", locked.to_string()),
            ("ROOTFILE_INO", rootfile_meta.ino().to_string()),
            ("SHARED_INO", shared.to_string()),
        ],
    );
    assert!(child.contains("ALL CASES CHECKED"), "{child}");
    // The shared area is untouched by every refused batch ...
    let fs = store.fs();
    assert_eq!(fs.read("/rootfile").unwrap(), b"root's data");
    let m = fs.metadata("/rootfile").unwrap();
    assert_eq!(m.permissions().mode(), 0o644);
    assert_eq!(m.mtime_ns(), rootfile_meta.mtime_ns());
    assert!(fs.read_dir("/locked").unwrap().next().is_none());
    // ... and the permitted one digested.
    assert_eq!(fs.read("/shared/ok").unwrap(), b"fine");
    let m = fs.metadata("/shared/ok").unwrap();
    assert_eq!((m.uid(), m.gid()), (USER, GROUP));
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    assert!(log.contains("permission denied (EACCES)"), "{log}");
    assert!(log.contains("operation not permitted (EPERM)"), "{log}");
}

/// The malicious client (runs only as the child of the test above).
#[test]
fn malicious_client_child() {
    let Some(store) = std::env::var_os("CAIRN_TRUST_CHILD") else {
        return;
    };
    let store = Path::new(&store);
    let env = |k: &str| std::env::var(k).unwrap().parse::<u64>().unwrap();
    let (locked, rootfile, shared) = (env("LOCKED_INO"), env("ROOTFILE_INO"), env("SHARED_INO"));
    assert_eq!(cairn_media::sys::ids(), (USER, GROUP));
    let mine = |kind: Kind| Attrs {
        kind,
        perm: 0o644,
        uid: USER,
        gid: GROUP,
        nlink: 1,
        atime: 5,
        mtime: 5,
        ctime: 5,
        btime: 5,
        ..Default::default()
    };
    type Case = (&'static str, &'static str);
    let forbidden: [Case; 3] = [
        ("create in root's 0755 directory", "EACCES"),
        ("chmod of root's file", "EPERM"),
        ("write to root's 0644 file", "EACCES"),
    ];
    for (i, (what, errno)) in forbidden.iter().enumerate() {
        let mut c = RawClient::connect(store);
        let root_attrs = c.area.read_inode(rootfile).unwrap().attrs;
        let new = c.reg.inodes[0];
        let recs: Vec<Record<'_>> = match i {
            0 => vec![
                Record::InodeSet {
                    ino: new,
                    generation: 1,
                    attrs: mine(Kind::File),
                },
                Record::DirentSet {
                    dir: locked,
                    name: b"evil",
                    ino: new,
                    kind: Kind::File,
                },
            ],
            1 => vec![Record::InodeSet {
                ino: rootfile,
                generation: c.area.read_inode(rootfile).unwrap().generation,
                attrs: Attrs {
                    perm: 0o666,
                    ..root_attrs
                },
            }],
            _ => vec![Record::Write {
                ino: rootfile,
                offset: 0,
                size: root_attrs.size,
                mtime: 77,
                data: b"pwned",
            }],
        };
        match c.log_and_digest(&recs) {
            Response::Error { errno: e, message } => {
                assert_eq!(e, libc::EBADMSG, "{what}: {message}");
                assert!(message.contains(errno), "{what}: {message}");
                println!("refused as expected: {what}: {message}");
            }
            r => panic!("{what}: expected a refusal, got {r:?}"),
        }
    }
    // Its permitted operations digest: create and write a file in a 0777 directory.
    let mut c = RawClient::connect(store);
    let new = c.reg.inodes[0];
    let recs = [
        Record::InodeSet {
            ino: new,
            generation: 1,
            attrs: mine(Kind::File),
        },
        Record::DirentSet {
            dir: shared,
            name: b"ok",
            ino: new,
            kind: Kind::File,
        },
        Record::Write {
            ino: new,
            offset: 0,
            size: 4,
            mtime: 6,
            data: b"fine",
        },
    ];
    match c.log_and_digest(&recs) {
        Response::Digested { .. } => {}
        r => panic!("permitted batch: {r:?}"),
    }
    let tail = c.reg.head_lsn + log::build_txn(0, &recs).len() as u64;
    let _ = cairn_proto::send(&mut c.sock, &Request::Goodbye { tail_lsn: tail });
    let _ = cairn_proto::recv::<Response>(&mut c.sock);
    println!("ALL CASES CHECKED");
}

/// The kernel keeps a client to its own log: a member of the trusted group gets, from the
/// daemon, the NVM file read-only and its own slot's log file read-write, and cannot
/// write anything else of the store by any path it has (its mappings, `/proc/self/mem`,
/// reopening its descriptors, opening the files by name). The member is this test
/// binary re-run as uid 1000 (`isolation_child`).
#[test]
fn a_client_writes_its_own_log_and_nothing_else() {
    if !is_root() {
        eprintln!("skipped: needs root to run processes as another uid");
        return;
    }
    let store = group_store();
    let fs = store.fs();
    fs.write("/rootfile", b"root's data").unwrap();
    drop(fs);
    let child = member_child(
        "isolation_child",
        &[("CAIRN_ISOLATION_CHILD", store.path().display().to_string())],
    );
    assert!(child.contains("EVERY PATH REFUSED"), "{child}");
    // The store is unharmed, and checks clean.
    assert_eq!(store.fs().read("/rootfile").unwrap(), b"root's data");
    store.stop();
    let rep = cairn_daemon::fsck(store.path(), &Default::default()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    // A member cannot start the daemon (it could not open the NVM file for writing),
    // and is told so at once, not after the start timeout.
    let t = std::time::Instant::now();
    let out = cairn_as(store.path(), USER, GROUP, &["ls", "/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot start one"), "{err}");
    assert!(
        err.contains("owner (uid 0) or root may run its daemon"),
        "{err}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
}

/// The isolated client (runs only as the child of the test above).
#[test]
fn isolation_child() {
    use std::os::fd::AsRawFd;
    let Some(store) = std::env::var_os("CAIRN_ISOLATION_CHILD") else {
        return;
    };
    let store = Path::new(&store);
    assert_eq!(cairn_media::sys::ids(), (USER, GROUP));
    let cfg = cairn_area::StoreDir::new(store).load_config().unwrap();
    let c = RawClient::connect(store);
    let l = *c.area.layout();
    assert!(l.slot_files && l.nslots >= 2);
    let refused = |what: &str, r: std::io::Result<std::fs::File>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
        Err(e) => panic!("{what}: {e}, not EACCES"),
        Ok(_) => panic!("{what} was opened for writing"),
    };
    let rw = |p: &Path| std::fs::OpenOptions::new().write(true).open(p);
    // Its own log: written through its mapping.
    c.log.store_u64(4096, 0x1234).unwrap();
    assert_eq!(c.log.load_u64(4096).unwrap(), 0x1234);
    // The NVM file: the descriptor is read-only, a writable mapping of it is refused,
    // and neither it nor its /proc/self/fd link nor the file's name opens for writing.
    let flags = rustix::fs::fcntl_getfl(&c.nvm).unwrap();
    assert_eq!(
        flags & rustix::fs::OFlags::RWMODE,
        rustix::fs::OFlags::RDONLY
    );
    match cairn_media::Mapping::new(&c.nvm, 0, 4096, true, false) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}"),
        Ok(_) => panic!("the NVM file was mapped writable"),
    }
    refused("the NVM file", rw(&cfg.nvm_path));
    let fd_link = format!("/proc/self/fd/{}", c.nvm.as_raw_fd());
    refused("the NVM file's descriptor", rw(Path::new(&fd_link)));
    // Its read-only mapping of the shared area: even the kernel's own debugging path to
    // its memory (what a debugger pokes with) refuses to write it.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let nvm_name = cfg.nvm_path.to_string_lossy().into_owned();
    let line = maps
        .lines()
        .find(|l| l.ends_with(nvm_name.as_str()))
        .expect("the NVM file is mapped");
    assert!(line.contains(" r--s "), "{line}");
    let at = u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .unwrap();
    let mut before = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut before, at).unwrap();
    assert!(
        std::os::unix::fs::FileExt::write_at(&mem, b"clobber!", at).is_err(),
        "/proc/self/mem wrote the shared area"
    );
    // Every log file, its own included, by name: read or write.
    for slot in 0..l.nslots {
        let p = cfg.slot_log_path(slot);
        refused(&format!("log file {slot}"), rw(&p));
        refused(&format!("log file {slot} (read)"), std::fs::File::open(&p));
    }
    // The daemon's state in the store directory: its files, its lock (which a member
    // could otherwise hold to keep every daemon from starting), and the directory
    // itself (no file made, renamed or removed in it).
    let sd = cairn_area::StoreDir::new(store);
    for p in [sd.config_path(), sd.xattr_path(), sd.daemon_log_path()] {
        if p.exists() {
            refused(&p.display().to_string(), rw(&p));
        }
    }
    refused(
        "the daemon's lock",
        std::fs::File::open(sd.daemon_lock_path()),
    );
    refused(
        "a new file in the store directory",
        std::fs::File::create(store.join("planted")),
    );
    let renamed = std::fs::rename(sd.config_path(), store.join("moved"));
    assert_eq!(
        renamed.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::PermissionDenied),
        "cairn.toml renamed"
    );
    let removed = std::fs::remove_file(sd.slot_lock_path(1));
    assert_eq!(
        removed.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::PermissionDenied),
        "a slot lock removed"
    );
    println!("EVERY PATH REFUSED");
}

/// Anyone may create files in the host's shared memory, where the store's host objects
/// live. A map object planted there by a user outside the trust domain (here: owned by
/// `nobody`, writable by all) for a file it may not write is not trusted: a writer that
/// is granted the file's lease does not write its bytes back into the file, and mapping
/// the file shared fails with `EACCES` naming the object, instead of sharing it.
#[test]
fn a_planted_map_object_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let store = TestStore::new();
    let fs = store.fs();
    fs.write("/victim", vec![b'o'; 4096]).unwrap();
    let m = fs.metadata("/victim").unwrap();
    let uuid = cairn_area::host::store_uuid(store.path()).unwrap();
    let planted = cairn_area::host::object_path(&uuid, "map", m.ino(), m.generation());
    drop(fs);
    std::fs::write(&planted, vec![b'X'; 4096]).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = cairn_tests::shim::python(
        &store,
        r#"
import mmap, os
fd = os.open('/cairn/victim', os.O_RDWR)
os.pwrite(fd, b'Y', 0)
try:
    mmap.mmap(fd, 4096, mmap.MAP_SHARED)
    print('mapped')
except OSError as e:
    print('mmap', e.errno)
os.close(fd)
"#,
    );
    // `cairn stop` leaves it as it is instead of failing on it.
    let stop = cairn_as(store.path(), 0, 0, &["stop"]);
    assert!(stop.status.success(), "{stop:?}");
    assert_eq!(std::fs::read(&planted).unwrap(), vec![b'X'; 4096]);
    let _ = std::fs::remove_file(&planted);
    assert_eq!(out, format!("mmap {}\n", libc::EACCES));
    let mut want = vec![b'o'; 4096];
    want[0] = b'Y';
    assert!(
        store.fs().read("/victim").unwrap() == want,
        "the planted bytes got in"
    );
    store.fsck_clean();
}

/// The daemon alone makes map objects (mode 0600, its own) and hands out descriptors to
/// them after checking the client's permission, so the kernel keeps a member of the
/// trusted group from writing the map object of a file it may only read: it cannot
/// open the object by name, the descriptor it gets is read-only even when it asks for
/// one it may write, and a writable mapping of that descriptor is refused. Root's
/// mapping of the file and the file itself are unharmed; a file the member may write
/// gets it a read-write descriptor.
#[test]
fn a_member_cannot_write_the_map_object_of_a_file_it_may_only_read() {
    use std::os::unix::fs::MetadataExt;
    if !is_root() {
        eprintln!("skipped: needs root to run processes as another uid");
        return;
    }
    let store = group_store();
    let fs = store.fs();
    fs.write("/readable", vec![b'o'; 4096]).unwrap();
    fs.write("/writable", vec![b'w'; 4096]).unwrap();
    fs.set_permissions("/writable", Permissions::from_mode(0o666))
        .unwrap();
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/readable")
        .unwrap();
    let m = f.map_mut(0, 4096).unwrap();
    m.write(0, b"root").unwrap();
    let ino = fs.metadata("/readable").unwrap().ino();
    let uuid = cairn_area::host::store_uuid(store.path()).unwrap();
    let gen = fs.metadata("/readable").unwrap().generation();
    let object = cairn_area::host::object_path(&uuid, "map", ino, gen);
    let meta = std::fs::metadata(&object).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
    let child = member_child(
        "map_object_child",
        &[
            ("CAIRN_MAPOBJ_CHILD", store.path().display().to_string()),
            ("CAIRN_MAPOBJ_PATH", object.display().to_string()),
        ],
    );
    assert!(child.contains("MAP OBJECT REFUSED"), "{child}");
    let mut b = [0u8; 8];
    m.read(0, &mut b).unwrap();
    assert_eq!(&b, b"rootoooo");
    drop(m);
    drop(f);
    let mut want = vec![b'o'; 4096];
    want[..4].copy_from_slice(b"root");
    assert!(fs.read("/readable").unwrap() == want);
    assert!(!object.exists(), "the last unmap removes the object");
    drop(fs);
    store.fsck_clean();
}

/// The member of the test above.
#[test]
fn map_object_child() {
    use std::os::unix::fs::FileExt;
    let Some(store) = std::env::var_os("CAIRN_MAPOBJ_CHILD") else {
        return;
    };
    let object = std::env::var_os("CAIRN_MAPOBJ_PATH").unwrap();
    assert_eq!(cairn_media::sys::ids(), (USER, GROUP));
    // By name: neither for writing nor for reading.
    for write in [true, false] {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(&object)
        {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied),
            Ok(_) => panic!("opened the map object by name"),
        }
    }
    let fs = cairn::Fs::open(&store).unwrap();
    let e = cairn::OpenOptions::new()
        .write(true)
        .open(&fs, "/readable")
        .unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EACCES, "{e}");
    let f = cairn::OpenOptions::new()
        .read(true)
        .open(&fs, "/readable")
        .unwrap();
    let obj = f.map_object().unwrap();
    assert!(!obj.writable());
    let mut b = [0u8; 8];
    obj.file().read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"rootoooo", "it reads root's stores");
    assert_eq!(
        obj.file().write_at(b"X", 0).unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
    match cairn_media::Mapping::new(obj.file(), 0, 4096, true, false) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}"),
        Ok(_) => panic!("the map object was mapped writable"),
    }
    f.map_release(obj).unwrap();
    // A file it may write: read-write.
    let w = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/writable")
        .unwrap();
    let obj = w.map_object().unwrap();
    assert!(obj.writable());
    obj.file().write_all_at(b"member", 0).unwrap();
    w.map_sync(&obj, 0, 4096).unwrap();
    w.map_release(obj).unwrap();
    assert_eq!(&fs.read("/writable").unwrap()[..8], b"memberww");
    // Asked for by hand: the daemon does not take the client's word that it may write.
    let mut c = RawClient::connect(Path::new(&store));
    let ino = fs.metadata("/readable").unwrap().ino();
    let gen = fs.metadata("/readable").unwrap().generation();
    cairn_proto::send(&mut c.sock, &Request::Lease { ino, write: false }).unwrap();
    assert!(matches!(
        cairn_proto::recv(&mut c.sock).unwrap(),
        Response::Leased { .. }
    ));
    let req = Request::MapObject {
        ino,
        gen,
        write: true,
        create: false,
        tail_lsn: c.reg.head_lsn,
    };
    cairn_proto::send(&mut c.sock, &req).unwrap();
    match cairn_proto::recv(&mut c.sock).unwrap() {
        Response::MapObject { writable: false } => {}
        r => panic!("{r:?}"),
    }
    let fd = cairn_proto::recv_fds(&c.sock, 1).unwrap().pop().unwrap();
    let flags = rustix::fs::fcntl_getfl(&fd).unwrap();
    assert_eq!(
        flags & rustix::fs::OFlags::RWMODE,
        rustix::fs::OFlags::RDONLY
    );
    println!("MAP OBJECT REFUSED");
}
