//! The trust domain and the digest's permission checks (crate::perm), with hand-built
//! logs of a non-root client (uid 1000, gid 1000, no supplementary groups).

use super::*;
use crate::core::Core;
use crate::digest::{digest, DigestError, Mode, Outcome};
use crate::perm::Cred;
use cairn_format::slot::SlotHead;

const U: u32 = 1000;

// Inodes of the base tree, made by root.
const ROOTDIR: u64 = 10; // /rootdir   0755 root
const RF: u64 = 11; //      /rf        0644 root, "secret"
const PUB: u64 = 12; //     /pub       0777 root
const STICKY: u64 = 13; //  /sticky    1777 root
const SROOT: u64 = 14; //   /sticky/rootfile 0644 root
const HOME: u64 = 15; //    /home      0755 uid 1000
const MINE: u64 = 16; //    /home/mine 0644 uid 1000
const SG: u64 = 17; //      /sg        2777 root, gid 500
const RW: u64 = 18; //      /rw        0666 root

fn a(kind: Kind, perm: u32, uid: u32, gid: u32, nlink: u64, parent: u64) -> Attrs {
    Attrs {
        kind,
        perm,
        uid,
        gid,
        nlink,
        size: 0,
        atime: 1,
        mtime: 2,
        ctime: 3,
        btime: 4,
        parent,
        rdev: 0,
    }
}

fn set(ino: u64, attrs: Attrs) -> Record<'static> {
    Record::InodeSet {
        ino,
        generation: 1,
        attrs,
    }
}

fn ent<'n>(dir: u64, name: &'n [u8], ino: u64, kind: Kind) -> Record<'n> {
    Record::DirentSet {
        dir,
        name,
        ino,
        kind,
    }
}

/// The base tree's attributes of `ino` (what root logged).
fn base(ino: u64) -> Attrs {
    match ino {
        ROOTDIR => a(Kind::Dir, 0o755, 0, 0, 2, ROOT_INO),
        RF => Attrs {
            size: 6,
            ctime: 2, // its WRITE set mtime = ctime = 2
            ..a(Kind::File, 0o644, 0, 0, 1, 0)
        },
        PUB => a(Kind::Dir, 0o777, 0, 0, 2, ROOT_INO),
        STICKY => a(Kind::Dir, 0o1777, 0, 0, 2, ROOT_INO),
        SROOT => a(Kind::File, 0o644, 0, 0, 1, 0),
        HOME => a(Kind::Dir, 0o755, U, U, 2, ROOT_INO),
        MINE => a(Kind::File, 0o644, U, U, 1, 0),
        SG => a(Kind::Dir, 0o2777, 0, 500, 2, ROOT_INO),
        RW => a(Kind::File, 0o666, 0, 0, 1, 0),
        _ => unreachable!(),
    }
}

/// A store with the base tree, and a registered client of uid 1000 (trusted through
/// `trusted_gid = 1000`): its writer and inode batch.
struct World {
    _ts: TestStore,
    core: Core,
    user: LogWriter,
    inos: Vec<u64>,
}

fn world() -> World {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut root = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let r = ROOT_INO;
    let mut recs = Vec::new();
    for (ino, dir, name) in [
        (ROOTDIR, r, &b"rootdir"[..]),
        (RF, r, b"rf"),
        (PUB, r, b"pub"),
        (STICKY, r, b"sticky"),
        (SROOT, STICKY, b"rootfile"),
        (HOME, r, b"home"),
        (MINE, HOME, b"mine"),
        (SG, r, b"sg"),
        (RW, r, b"rw"),
    ] {
        let at = base(ino);
        recs.push(set(ino, at));
        recs.push(ent(dir, name, ino, at.kind));
    }
    recs.push(Record::Write {
        ino: RF,
        offset: 0,
        size: 6,
        mtime: 2,
        data: b"secret",
    });
    root.append(sh, &recs);
    digest(sh, root.slot, Mode::Upto(root.tail)).unwrap();
    core.release(root.slot, None).unwrap();
    // The client of uid 1000.
    core.cfg.trusted_gid = Some(U);
    let reg = core.register(std::process::id(), U, U, 2).unwrap();
    // Its exact credentials (the test process's own supplementary groups are root's).
    core.sh.creds.insert(
        reg.slot,
        Cred {
            uid: U,
            gid: U,
            groups: vec![],
        },
    );
    let user = LogWriter {
        slot: reg.slot,
        tail: reg.head_lsn,
        seq: reg.head_seq,
    };
    World {
        _ts: ts,
        core,
        user,
        inos: reg.inodes,
    }
}

impl World {
    fn log(&mut self, recs: &[Record<'_>]) {
        self.user.append(&self.core.sh, recs);
    }

    fn digest(&mut self) -> Result<Outcome, DigestError> {
        digest(
            &mut self.core.sh,
            self.user.slot,
            Mode::Upto(self.user.tail),
        )
    }

    /// The batch logged so far is refused and nothing changed; the message.
    fn refused(&mut self) -> String {
        let before = snapshot(&self.core.sh);
        let used = used_blocks(&self.core.sh);
        let (h, _) = self.core.sh.slot_head(self.user.slot).unwrap();
        let e = self.digest().unwrap_err();
        assert_eq!(snapshot(&self.core.sh), before, "shared area untouched");
        assert_eq!(used_blocks(&self.core.sh), used);
        assert_eq!(self.core.sh.slot_head(self.user.slot).unwrap().0, h);
        match e {
            DigestError::Malformed { msg, .. } => msg,
            DigestError::Failed(e) => panic!("expected a refusal, got {e}"),
        }
    }

    fn lookup(&self, dir: u64, name: &str) -> Option<u64> {
        let d = self.core.sh.area.read_inode(dir).unwrap();
        self.core
            .sh
            .area
            .dir_lookup(&d, name.as_bytes())
            .unwrap()
            .map(|x| x.0)
    }

    fn attrs(&self, ino: u64) -> Attrs {
        self.core.sh.area.read_inode(ino).unwrap().attrs
    }
}

/// Each forbidden batch is refused with the right errno named, the area untouched.
#[test]
fn forbidden_operations_are_refused() {
    type Build = Box<dyn Fn(&World) -> Vec<Record<'static>>>;
    let n = |w: &World| w.inos[0];
    let cases: Vec<(&str, &str, Build)> = vec![
        (
            "create in a root-owned 0755 directory",
            "EACCES",
            Box::new(move |w| {
                vec![
                    set(n(w), a(Kind::File, 0o644, U, U, 1, 0)),
                    ent(ROOTDIR, b"x", n(w), Kind::File),
                ]
            }),
        ),
        (
            "mknod of a device node by a non-root user",
            "EPERM",
            Box::new(move |w| {
                vec![
                    set(
                        n(w),
                        Attrs {
                            rdev: 0x103,
                            ..a(Kind::CharDev, 0o666, U, U, 1, 0)
                        },
                    ),
                    ent(HOME, b"null", n(w), Kind::CharDev),
                ]
            }),
        ),
        (
            "chmod of root's file",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    RF,
                    Attrs {
                        perm: 0o666,
                        ..base(RF)
                    },
                )]
            }),
        ),
        (
            "write to root's 0644 file",
            "EACCES",
            Box::new(|_| {
                vec![Record::Write {
                    ino: RF,
                    offset: 0,
                    size: 6,
                    mtime: 9,
                    data: b"pwned!",
                }]
            }),
        ),
        (
            "truncate of root's file",
            "EACCES",
            Box::new(|_| {
                vec![set(
                    RF,
                    Attrs {
                        size: 0,
                        ..base(RF)
                    },
                )]
            }),
        ),
        (
            "mtime of root's file",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    RF,
                    Attrs {
                        mtime: 99,
                        ..base(RF)
                    },
                )]
            }),
        ),
        (
            "chown of its own file to root",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    MINE,
                    Attrs {
                        uid: 0,
                        ..base(MINE)
                    },
                )]
            }),
        ),
        (
            "chgrp of its own file to a group it is not in",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    MINE,
                    Attrs {
                        gid: 500,
                        ..base(MINE)
                    },
                )]
            }),
        ),
        (
            "chgrp and setgid of its own file to a group it is not in",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    MINE,
                    Attrs {
                        perm: 0o2644,
                        gid: 500,
                        ..base(MINE)
                    },
                )]
            }),
        ),
        (
            "create an inode owned by root",
            "EPERM",
            Box::new(move |w| {
                vec![
                    set(n(w), a(Kind::File, 0o644, 0, 0, 1, 0)),
                    ent(PUB, b"x", n(w), Kind::File),
                ]
            }),
        ),
        (
            "create with a group it is not in (no setgid parent)",
            "EPERM",
            Box::new(move |w| {
                vec![
                    set(n(w), a(Kind::File, 0o644, U, 500, 1, 0)),
                    ent(PUB, b"x", n(w), Kind::File),
                ]
            }),
        ),
        (
            "remove root's entry from a sticky directory",
            "EPERM",
            Box::new(|_| vec![ent(STICKY, b"rootfile", 0, Kind::Free)]),
        ),
        (
            "raise the link count of root's file without an entry",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    RF,
                    Attrs {
                        nlink: 5,
                        ..base(RF)
                    },
                )]
            }),
        ),
        (
            "free root's file without removing its entry",
            "EPERM",
            Box::new(|_| {
                vec![set(
                    RF,
                    Attrs {
                        nlink: 0,
                        ..base(RF)
                    },
                )]
            }),
        ),
        (
            "link root's file without raising its link count",
            "EPERM",
            Box::new(|_| vec![ent(HOME, b"hard", RF, Kind::File)]),
        ),
        (
            "a second entry for a directory",
            "EPERM",
            Box::new(|_| {
                vec![
                    ent(HOME, b"alias", ROOTDIR, Kind::Dir),
                    set(
                        HOME,
                        Attrs {
                            nlink: 3,
                            ..base(HOME)
                        },
                    ),
                ]
            }),
        ),
        (
            "remove an entry of root's 0755 directory",
            "EACCES",
            Box::new(|_| {
                vec![
                    ent(ROOT_INO, b"rf", 0, Kind::Free),
                    set(
                        RF,
                        Attrs {
                            nlink: 0,
                            ..base(RF)
                        },
                    ),
                ]
            }),
        ),
        (
            "move a root-owned directory it cannot write to another directory",
            "EACCES",
            Box::new(|_| {
                vec![
                    set(
                        ROOTDIR,
                        Attrs {
                            parent: PUB,
                            ..base(ROOTDIR)
                        },
                    ),
                    ent(PUB, b"moved", ROOTDIR, Kind::Dir),
                    ent(ROOT_INO, b"rootdir", 0, Kind::Free),
                ]
            }),
        ),
    ];
    for (what, errno, build) in cases {
        let mut w = world();
        // A permitted transaction first: the whole batch is refused anyway.
        w.log(&[Record::Write {
            ino: MINE,
            offset: 0,
            size: 2,
            mtime: 5,
            data: b"ok",
        }]);
        let recs = build(&w);
        w.log(&recs);
        let msg = w.refused();
        assert!(msg.contains(errno), "{what}: {msg}");
        assert!(msg.contains("uid 1000"), "{what}: {msg}");
    }
}

#[test]
fn permitted_operations_digest() {
    let mut w = world();
    let (f, d, g, sgf, sgd) = (w.inos[0], w.inos[1], w.inos[2], w.inos[3], w.inos[4]);
    // Create in a world-writable directory; parent times change.
    w.log(&[
        set(f, a(Kind::File, 0o600, U, U, 1, 0)),
        ent(PUB, b"f", f, Kind::File),
        set(
            PUB,
            Attrs {
                mtime: 50,
                ctime: 50,
                ..base(PUB)
            },
        ),
    ]);
    // mkdir in its own directory, then a file inside it in the same batch.
    w.log(&[
        set(d, a(Kind::Dir, 0o755, U, U, 2, HOME)),
        ent(HOME, b"d", d, Kind::Dir),
        set(
            HOME,
            Attrs {
                nlink: 3,
                ..base(HOME)
            },
        ),
    ]);
    w.log(&[
        set(g, a(Kind::File, 0o444, U, U, 1, 0)),
        ent(d, b"g", g, Kind::File),
    ]);
    // Writing its own read-only file (created 0444: allowed to the owner), writing a
    // world-writable root file, chmod of its own file.
    w.log(&[Record::Write {
        ino: g,
        offset: 0,
        size: 3,
        mtime: 60,
        data: b"abc",
    }]);
    w.log(&[Record::Write {
        ino: RW,
        offset: 0,
        size: 2,
        mtime: 61,
        data: b"rw",
    }]);
    w.log(&[set(
        MINE,
        Attrs {
            perm: 0o600,
            ctime: 62,
            ..base(MINE)
        },
    )]);
    // The setgid directory's group is inherited (and its setgid bit by a subdirectory).
    w.log(&[
        set(sgf, a(Kind::File, 0o644, U, 500, 1, 0)),
        ent(SG, b"f", sgf, Kind::File),
    ]);
    w.log(&[
        set(sgd, a(Kind::Dir, 0o2755, U, 500, 2, SG)),
        ent(SG, b"d", sgd, Kind::Dir),
        set(
            SG,
            Attrs {
                nlink: 3,
                ..base(SG)
            },
        ),
    ]);
    // Link root's file into its directory (link count and ctime follow the entry).
    w.log(&[
        set(
            RF,
            Attrs {
                nlink: 2,
                ctime: 70,
                ..base(RF)
            },
        ),
        ent(HOME, b"hard", RF, Kind::File),
    ]);
    // Remove its own entry from the sticky directory? It has none: remove the hard link
    // it made instead, then unlink its file (link count to 0 with the entry).
    w.log(&[
        ent(HOME, b"hard", 0, Kind::Free),
        set(
            RF,
            Attrs {
                nlink: 1,
                ctime: 71,
                ..base(RF)
            },
        ),
    ]);
    w.log(&[
        ent(HOME, b"mine", 0, Kind::Free),
        set(
            MINE,
            Attrs {
                nlink: 0,
                ..base(MINE)
            },
        ),
    ]);
    let o = w.digest().unwrap();
    assert_eq!(o.head_lsn, w.user.tail);
    assert_eq!(w.lookup(PUB, "f"), Some(f));
    assert_eq!(w.lookup(d, "g"), Some(g));
    assert_eq!(w.lookup(SG, "f"), Some(sgf));
    assert_eq!(w.attrs(sgf).gid, 500);
    assert_eq!(w.lookup(HOME, "hard"), None);
    assert_eq!(w.lookup(HOME, "mine"), None);
    assert_eq!(w.attrs(RF).nlink, 1);
    assert_eq!(w.attrs(g).size, 3);
    assert_eq!(w.attrs(HOME).nlink, 3);
    // rmdir of its directory after removing its file; rename within its directory.
    w.log(&[
        ent(d, b"g", 0, Kind::Free),
        set(
            g,
            Attrs {
                nlink: 0,
                ..a(Kind::File, 0o444, U, U, 1, 0)
            },
        ),
    ]);
    w.log(&[
        ent(HOME, b"d", 0, Kind::Free),
        set(
            d,
            Attrs {
                nlink: 0,
                ..a(Kind::Dir, 0o755, U, U, 2, HOME)
            },
        ),
        set(
            HOME,
            Attrs {
                nlink: 2,
                ..base(HOME)
            },
        ),
    ]);
    w.log(&[
        ent(PUB, b"f2", f, Kind::File),
        ent(PUB, b"f", 0, Kind::Free),
    ]);
    w.digest().unwrap();
    assert_eq!(w.lookup(HOME, "d"), None);
    assert_eq!(w.attrs(HOME).nlink, 2);
    assert_eq!(w.lookup(PUB, "f2"), Some(f));
}

#[test]
fn an_open_file_unlinked_is_freed_at_its_last_close() {
    let mut w = world();
    // Unlink while open: the entry goes, the link count stays (LibFS), ...
    w.log(&[ent(HOME, b"mine", 0, Kind::Free)]);
    w.digest().unwrap();
    assert_eq!(w.attrs(MINE).nlink, 1);
    // ... and the last close frees it in a transaction of its own: the owner may.
    w.log(&[set(
        MINE,
        Attrs {
            nlink: 0,
            ..base(MINE)
        },
    )]);
    w.digest().unwrap();
    assert_eq!(w.attrs(MINE).kind, Kind::Free);
}

#[test]
fn replaying_a_checked_batch_passes_the_checks_again() {
    let mut w = world();
    let (d, f) = (w.inos[0], w.inos[1]);
    let (h0, _) = w.core.sh.slot_head(w.user.slot).unwrap();
    // Create a directory, a file in it, then make the directory read-only.
    w.log(&[
        set(d, a(Kind::Dir, 0o755, U, U, 2, HOME)),
        ent(HOME, b"d", d, Kind::Dir),
        set(
            HOME,
            Attrs {
                nlink: 3,
                ..base(HOME)
            },
        ),
    ]);
    w.log(&[
        set(f, a(Kind::File, 0o644, U, U, 1, 0)),
        ent(d, b"f", f, Kind::File),
    ]);
    w.log(&[set(d, a(Kind::Dir, 0o555, U, U, 2, HOME))]);
    w.digest().unwrap();
    let snap = snapshot(&w.core.sh);
    // A crash before the head was persisted: the batch is digested again.
    w.core
        .sh
        .rewind_slot_head(w.user.slot, SlotHead { active: true, ..h0 })
        .unwrap();
    w.digest().unwrap();
    assert_eq!(snapshot(&w.core.sh), snap);
}

#[test]
fn recovery_after_a_restart_checks_with_the_recorded_credentials() {
    let mut w = world();
    let f = w.inos[0];
    w.log(&[
        set(f, a(Kind::File, 0o644, U, U, 1, 0)),
        ent(HOME, b"ok", f, Kind::File),
    ]);
    w.log(&[Record::Write {
        ino: RF,
        offset: 0,
        size: 6,
        mtime: 9,
        data: b"pwned!",
    }]);
    let before = snapshot(&w.core.sh);
    // The daemon dies; the client too (nobody holds its slot lock). A new daemon
    // recovers the log with the uid and gid recorded in the slot-table entry.
    let World {
        _ts: ts,
        core,
        user,
        ..
    } = w;
    drop(core);
    let core = ts.core();
    assert!(core.sh.creds.is_empty());
    assert_eq!(snapshot(&core.sh), before, "refused: nothing applied");
    let (h, _) = core.sh.slot_head(user.slot).unwrap();
    assert!(
        !h.active && h.head_lsn >= user.tail,
        "log discarded, slot released"
    );
    assert_eq!(core.sh.area.read_inode(RF).unwrap().attrs.size, 6);
    let mut b = [0u8; 6];
    let i = core.sh.area.read_inode(RF).unwrap();
    core.sh.area.read_file(&i, 0, &mut b).unwrap();
    assert_eq!(&b, b"secret");
    drop(core);
    // The same log without the forbidden write is recovered.
    let mut w = world();
    let f = w.inos[0];
    w.log(&[
        set(f, a(Kind::File, 0o644, U, U, 1, 0)),
        ent(HOME, b"ok", f, Kind::File),
    ]);
    let World {
        _ts: ts,
        core,
        user,
        ..
    } = w;
    drop(core);
    let core = ts.core();
    let (h, _) = core.sh.slot_head(user.slot).unwrap();
    assert_eq!(h.head_lsn, user.tail);
    let d = core.sh.area.read_inode(HOME).unwrap();
    assert_eq!(
        core.sh.area.dir_lookup(&d, b"ok").unwrap().map(|x| x.0),
        Some(f)
    );
}

#[test]
fn only_the_trust_domain_registers() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let me = cairn_media::sys::ids().0;
    let stranger = if me == 4321 { 4322 } else { 4321 };
    let e = core
        .register(std::process::id(), stranger, stranger, 1)
        .unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EACCES);
    let m = e.to_string();
    assert!(
        m.contains(&format!("uid {stranger} is not in the trust domain")),
        "{m}"
    );
    assert!(m.contains(&format!("owner uid {me}, group none")), "{m}");
    assert!(m.contains("cairn mount"), "{m}");
    // A member of the trusted group is admitted; its uid and gid are recorded.
    core.cfg.trusted_gid = Some(777);
    let r = core.register(std::process::id(), stranger, 777, 1).unwrap();
    let c = crate::perm::slot_cred(&core.sh, r.slot).unwrap();
    assert_eq!((c.uid, c.gid), (stranger, 777));
    core.sh.creds.clear();
    let c = crate::perm::slot_cred(&core.sh, r.slot).unwrap();
    assert_eq!(
        (c.uid, c.gid),
        (stranger, 777),
        "persisted in the slot entry"
    );
    // The owner and root always are.
    core.cfg.trusted_gid = None;
    core.register(std::process::id(), me, 12345, 2).unwrap();
}

#[test]
fn mkfs_gives_the_trust_domain_exactly_the_files_it_needs() {
    use std::os::unix::fs::MetadataExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    let gid = |p: &std::path::Path| std::fs::metadata(p).unwrap().gid();
    let ts = TestStore::small();
    let s = &ts.store;
    assert_eq!(mode(&ts.nvm), 0o600);
    // The logs: the daemon's alone, whatever the trusted group (it hands each client a
    // descriptor of its own).
    let cfg = s.load_config().unwrap();
    let logs = cairn_area::store::nvm_files(&ts.nvm);
    assert_eq!(logs.len(), 1 + cfg.max_clients as usize);
    for p in &logs[1..] {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    assert_eq!(mode(&s.slot_lock_path(0)), 0o600);
    assert_eq!(mode(&s.daemon_lock_path()), 0o600);
    assert_eq!(mode(&s.slots_dir()), 0o700);
    assert_eq!(mode(&s.path), 0o755);
    let cfg = s.load_config().unwrap();
    assert_eq!(cfg.owner_uid, Some(cairn_media::sys::ids().0));
    assert_eq!(cfg.trusted_gid, None);
    if cairn_media::sys::ids().0 != 0 {
        return; // giving files to an arbitrary group needs root
    }
    let d = tempfile::tempdir().unwrap();
    let nvm = PathBuf::from(format!(
        "/dev/shm/cairn-test-{}.nvm",
        hex(&random_bytes(8).unwrap())
    ));
    let st = StoreDir::new(d.path().join("g"));
    let cfg = mkfs(&MkfsOptions {
        nvm_path: Some(nvm.clone()),
        nvm_size: 16 << 20,
        log_size: 1 << 20,
        max_clients: 2,
        trusted_gid: Some(4242),
        ..MkfsOptions::new(&st.path)
    })
    .unwrap();
    assert_eq!(cfg.trusted_gid, Some(4242));
    assert_eq!(st.load_config().unwrap().trusted_gid, Some(4242));
    // The group reads the NVM file and writes none of it; it takes slot locks, reads
    // the daemon's log, and changes nothing in the store directory.
    assert_eq!((mode(&nvm), gid(&nvm)), (0o640, 4242));
    assert_eq!(
        (mode(&st.slot_lock_path(1)), gid(&st.slot_lock_path(1))),
        (0o660, 4242)
    );
    assert_eq!(
        (mode(&st.daemon_log_path()), gid(&st.daemon_log_path())),
        (0o640, 4242)
    );
    assert_eq!(mode(&st.daemon_lock_path()), 0o600);
    for p in &cairn_area::store::nvm_files(&nvm)[1..] {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    assert_eq!((mode(&st.slots_dir()), gid(&st.slots_dir())), (0o750, 4242));
    assert_eq!((mode(&st.path), gid(&st.path)), (0o755, 4242));
    let _ = cairn_area::store::remove_nvm_files(&nvm);
}

/// A crash between publishing a directory (new entry) and the linked file (new link
/// count) leaves a half-applied batch; after an unclean start its replay must pass the
/// checks (the link-count rule cannot hold on half-applied state) and complete it.
#[test]
fn a_half_applied_batch_replays_after_an_unclean_start() {
    let mut w = world();
    let (h0, _) = w.core.sh.slot_head(w.user.slot).unwrap();
    let mine_before = w.core.sh.inode(MINE).unwrap();
    w.log(&[
        ent(HOME, b"mine2", MINE, Kind::File),
        set(
            MINE,
            Attrs {
                nlink: 2,
                ..base(MINE)
            },
        ),
    ]);
    w.digest().unwrap();
    let snap = snapshot(&w.core.sh);
    // The crash: the file's inode was not published yet, nor the head.
    w.core.sh.write_inode(MINE, &mine_before).unwrap();
    w.core
        .sh
        .rewind_slot_head(w.user.slot, SlotHead { active: true, ..h0 })
        .unwrap();
    let World {
        _ts: ts,
        core,
        user,
        ..
    } = w;
    drop(core);
    let core = ts.core(); // unclean start: recovers the dead client's log
    let (h, _) = core.sh.slot_head(user.slot).unwrap();
    assert_eq!(h.head_lsn, user.tail, "the log was digested, not discarded");
    assert_eq!(core.sh.area.read_inode(MINE).unwrap().attrs.nlink, 2);
    assert_eq!(snapshot(&core.sh), snap);
}

/// An unnamed file (`O_TMPFILE`): created with `nlink = 0` under its creator's pin, kept
/// by the digest, linked later; its creation is checked like any other (a non-root
/// client cannot make a root-owned one to link later).
#[test]
fn unnamed_files_are_kept_while_pinned_and_checked_at_creation() {
    let mut w = world();
    let (f, g) = (w.inos[0], w.inos[1]);
    let slot = w.user.slot;
    w.core.pin(slot, f);
    w.log(&[set(f, a(Kind::File, 0o600, U, U, 0, 0))]);
    w.digest().unwrap();
    let i = w.core.sh.area.read_inode(f).unwrap();
    assert_eq!(
        (i.attrs.kind, i.attrs.nlink),
        (Kind::File, 0),
        "kept unnamed"
    );
    w.log(&[Record::Write {
        ino: f,
        offset: 0,
        size: 2,
        mtime: 9,
        data: b"hi",
    }]);
    w.log(&[
        set(
            f,
            Attrs {
                size: 2,
                mtime: 9,
                ctime: 9,
                ..a(Kind::File, 0o600, U, U, 1, 0)
            },
        ),
        ent(HOME, b"named", f, Kind::File),
    ]);
    w.digest().unwrap();
    assert_eq!(w.lookup(HOME, "named"), Some(f));
    assert_eq!(w.attrs(f).nlink, 1);
    // Unpinned after being named: it stays.
    w.core.unpin(slot, Some(f)).unwrap();
    assert_eq!(w.attrs(f).kind, Kind::File);
    // A root-owned unnamed file from uid 1000 is refused.
    w.core.pin(slot, g);
    w.log(&[set(g, a(Kind::File, 0o4755, 0, 0, 0, 0))]);
    let msg = w.refused();
    assert!(
        msg.contains("EPERM") && msg.contains("may not create"),
        "{msg}"
    );
}

#[test]
fn a_process_credentials_are_read_from_the_kernel() {
    let me = crate::perm::cred_now(std::process::id()).unwrap();
    assert_eq!((me.uid, me.gid), cairn_media::sys::ids());
    // A pid no process has (above the kernel's limit): gone.
    let e = crate::perm::cred_now(u32::MAX - 1).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::ESRCH);
}
