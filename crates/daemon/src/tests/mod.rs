//! Tests of the daemon internals against real (temporary) stores.

mod digest_tests;
mod dir_tests;
mod map_tests;
mod par_tests;
mod perm_tests;
mod recovery_tests;
mod server_tests;
mod superpage_tests;

use crate::core::Core;
use crate::offline::mkfs::{mkfs, MkfsOptions};
use crate::store::shared::Shared;
use crate::util::{hex, random_bytes};
use cairn_area::StoreDir;
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::log::{self, Record};
use cairn_format::ROOT_INO;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A store in a temporary directory with its NVM file in /dev/shm (removed on drop).
pub(crate) struct TestStore {
    _dir: tempfile::TempDir,
    pub store: StoreDir,
    pub nvm: PathBuf,
}

impl TestStore {
    pub fn new(nvm_size: u64, log_size: u64, slots: u32) -> TestStore {
        Self::with_inodes(nvm_size, log_size, slots, 0)
    }

    pub fn with_inodes(nvm_size: u64, log_size: u64, slots: u32, inodes: u64) -> TestStore {
        Self::made(nvm_size, log_size, slots, inodes, 0)
    }

    /// A store of on-media format `version` (`MkfsOptions::format_version`).
    pub fn with_format(nvm_size: u64, log_size: u64, slots: u32, version: u32) -> TestStore {
        Self::made(nvm_size, log_size, slots, 0, version)
    }

    fn made(nvm_size: u64, log_size: u64, slots: u32, inodes: u64, version: u32) -> TestStore {
        let dir = tempfile::tempdir().unwrap();
        let nvm = PathBuf::from(format!(
            "/dev/shm/cairn-test-{}.nvm",
            hex(&random_bytes(8).unwrap())
        ));
        let store = StoreDir::new(dir.path().join("store"));
        mkfs(&MkfsOptions {
            store: store.path.clone(),
            nvm_path: Some(nvm.clone()),
            nvm_size,
            log_size,
            max_clients: slots,
            inodes,
            digest_threshold_pct: 30,
            force: false,
            trusted_gid: None,
            format_version: version,
            ..MkfsOptions::default()
        })
        .unwrap();
        TestStore {
            _dir: dir,
            store,
            nvm,
        }
    }

    /// 64 MiB tier, 4 MiB logs, 2 slots.
    pub fn small() -> TestStore {
        TestStore::new(64 << 20, 4 << 20, 2)
    }

    pub fn core(&self) -> Core {
        Core::open(&self.store).unwrap().0
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let _ = cairn_area::store::remove_nvm_files(&self.nvm);
    }
}

/// A client simulator writing transactions straight into a slot's ring.
pub(crate) struct LogWriter {
    pub slot: u32,
    pub tail: u64,
    pub seq: u64,
}

impl LogWriter {
    /// Register a fake client on `core` and start at its head.
    pub fn register(core: &mut Core) -> LogWriter {
        let r = core.register(std::process::id(), 0, 0, 1).unwrap();
        LogWriter {
            slot: r.slot,
            tail: r.head_lsn,
            seq: r.head_seq,
        }
    }

    /// Append one transaction (a wrap first if it does not fit in the lap).
    pub fn append(&mut self, sh: &Shared, recs: &[Record<'_>]) {
        let t = log::build_txn(0, recs);
        self.append_raw_len(sh, t.len());
        let t = log::build_txn(self.seq, recs);
        self.put(sh, &t);
    }

    /// Write a wrap transaction if `len` bytes do not fit in the rest of the lap.
    pub fn append_raw_len_pub(&mut self, sh: &Shared, len: usize) {
        self.append_raw_len(sh, len)
    }

    fn append_raw_len(&mut self, sh: &Shared, len: usize) {
        let ring = sh.layout.ring_bytes();
        let left = ring - self.tail % ring;
        assert!(len as u64 <= ring, "transaction too large");
        if (len as u64) > left {
            let mut w = vec![0u8; left as usize];
            log::seal_wrap(&mut w, self.seq);
            self.put(sh, &w);
        }
    }

    /// Write raw transaction bytes at the tail (the caller sealed them with `self.seq`).
    pub fn put(&mut self, sh: &Shared, t: &[u8]) {
        let ring = sh.layout.ring_bytes();
        let (log, roff) = sh.area.slot_ring(self.slot);
        let off = roff + (self.tail % ring) as usize;
        log.write(off, t).unwrap();
        self.tail += t.len() as u64;
        self.seq += 1;
    }
}

/// A `WRITE` record (mtime 77).
pub(crate) fn write<'a>(ino: u64, offset: u64, size: u64, data: &'a [u8]) -> Record<'a> {
    Record::Write {
        ino,
        offset,
        size,
        mtime: 77,
        data,
    }
}

/// All of file `ino` as published.
pub(crate) fn read_all(sh: &Shared, ino: u64) -> Vec<u8> {
    let i = sh.area.read_inode(ino).unwrap();
    let mut b = vec![0u8; i.attrs.size as usize];
    sh.area.read_file(&i, 0, &mut b).unwrap();
    b
}

pub(crate) fn attrs(kind: Kind, size: u64, nlink: u64, parent: u64) -> Attrs {
    Attrs {
        kind,
        perm: if kind == Kind::Dir { 0o755 } else { 0o644 },
        uid: 1000,
        gid: 1000,
        nlink,
        size,
        atime: 1,
        mtime: 2,
        ctime: 3,
        btime: 4,
        parent,
        rdev: 0,
    }
}

pub(crate) fn create_file<'a>(ino: u64, dir: u64, name: &'a [u8]) -> Vec<Record<'a>> {
    vec![
        Record::InodeSet {
            ino,
            generation: 1,
            attrs: attrs(Kind::File, 0, 1, 0),
        },
        Record::DirentSet {
            dir,
            name,
            ino,
            kind: Kind::File,
        },
    ]
}

pub(crate) fn mkdir<'a>(ino: u64, parent: u64, name: &'a [u8]) -> Vec<Record<'a>> {
    vec![
        Record::InodeSet {
            ino,
            generation: 1,
            attrs: attrs(Kind::Dir, 0, 2, parent),
        },
        Record::DirentSet {
            dir: parent,
            name,
            ino,
            kind: Kind::Dir,
        },
    ]
}

/// Logical content of the tree: path -> (inode number, generation, attrs, data).
pub(crate) type Snapshot = BTreeMap<String, (u64, u64, Attrs, Vec<u8>)>;

pub(crate) fn snapshot(sh: &Shared) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![(String::from("/"), ROOT_INO)];
    while let Some((path, ino)) = stack.pop() {
        let i: Inode = sh.area.read_inode(ino).unwrap();
        let data = if i.attrs.kind == Kind::Dir {
            let mut names: Vec<_> = sh
                .area
                .dir_list(&i)
                .unwrap()
                .into_iter()
                .map(|e| (String::from_utf8(e.name).unwrap(), e.ino))
                .collect();
            names.sort();
            for (n, c) in &names {
                stack.push((
                    format!("{}{}{}", path, if path == "/" { "" } else { "/" }, n),
                    *c,
                ));
            }
            Vec::new()
        } else {
            let mut b = vec![0u8; i.attrs.size as usize];
            assert_eq!(sh.area.read_file(&i, 0, &mut b).unwrap(), b.len());
            b
        };
        // Directory size/blocks are daemon-managed; keep the client-visible attributes.
        out.insert(path, (ino, i.generation, i.attrs, data));
    }
    out
}

/// Free every retired block now (no readers in these tests).
pub(crate) fn reclaim_all(sh: &mut Shared) {
    sh.reclaim(&[], true);
}

/// Data blocks in use.
pub(crate) fn used_blocks(sh: &Shared) -> u64 {
    sh.blocks.capacity() - sh.blocks.free_count()
}
