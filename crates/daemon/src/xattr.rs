//! Extended attributes: every inode's attributes in DRAM, made durable by an append-only
//! journal in the store directory (`DIR/xattrs`, `docs/FORMAT.md`). A change is one
//! appended record and an `fdatasync` before the answer; a start replays the journal (a
//! torn last record, from a crash mid-append, is cut off). Attributes belong to an inode
//! number *and generation*, so a reused inode number never shows the attributes of the
//! file that had it before; the journal is rewritten without them (and without removed
//! attributes) once it is twice the size of what is live.
//!
//! The rules (names, namespaces, sizes, permissions) are `cairn_format::xattr`.

use cairn_area::fs_err;
use cairn_format::xattr::{self, JournalRecord};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Journals smaller than this are never rewritten.
const COMPACT_MIN: u64 = 1 << 20;

type Attrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// Gives a journal file the store's ownership and mode (`crate::offline::mkfs::restrict`).
pub(crate) type Restrict = Box<dyn Fn(&Path) -> io::Result<()> + Send>;

pub(crate) struct Xattrs {
    path: PathBuf,
    uuid: [u8; 16],
    restrict: Restrict,
    file: File,
    /// Bytes in the journal.
    len: u64,
    /// Bytes a rewrite would leave ([`live_bytes`], kept up to date by each change).
    live: u64,
    map: HashMap<(u64, u64), Attrs>,
}

/// Bytes the journal needs for `map` (what a rewrite writes).
fn live_bytes(map: &HashMap<(u64, u64), Attrs>) -> u64 {
    let records = map.values().flatten();
    let n: usize = records
        .map(|(k, v)| xattr::record_len(k.len(), v.len()))
        .sum();
    (xattr::JOURNAL_HEADER + n) as u64
}

fn record(ino: u64, generation: u64, name: &[u8], value: Option<&[u8]>) -> JournalRecord {
    JournalRecord {
        ino,
        generation,
        name: name.to_vec(),
        value: value.map(<[u8]>::to_vec),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What a journal's bytes hold.
pub(crate) struct Replayed {
    /// The store it belongs to.
    pub uuid: [u8; 16],
    /// The attributes after its whole records, by (inode, generation); no empty sets.
    pub map: HashMap<(u64, u64), Attrs>,
    /// Bytes of the header and the whole records (a torn record may follow).
    pub whole: usize,
}

/// Replay a journal's bytes (no I/O): what a start does, and what `fsck` and the
/// power-failure checks read.
pub(crate) fn replay(bytes: &[u8]) -> Result<Replayed, cairn_format::FormatError> {
    let uuid = xattr::journal_uuid(bytes)?;
    let mut map: HashMap<(u64, u64), Attrs> = HashMap::new();
    let mut off = xattr::JOURNAL_HEADER;
    while let Some((r, n)) = JournalRecord::decode(&bytes[off..]) {
        let attrs = map.entry((r.ino, r.generation)).or_default();
        match r.value {
            Some(v) => {
                attrs.insert(r.name, v);
            }
            None => {
                attrs.remove(&r.name);
            }
        }
        off += n;
    }
    map.retain(|_, a| !a.is_empty());
    Ok(Replayed {
        uuid,
        map,
        whole: off,
    })
}

impl Xattrs {
    /// Open (or create) the journal at `path` for the store with uuid `uuid` and replay
    /// it. A journal of another store (left by an older `mkfs` at this path) is moved
    /// aside to `PATH.old`; `note` reports that and a cut-off torn record. A new journal
    /// file gets its ownership and mode from `restrict`.
    pub(crate) fn open(
        path: &Path,
        uuid: [u8; 16],
        restrict: Restrict,
        note: &dyn Fn(String),
    ) -> io::Result<Xattrs> {
        let mut bytes = Vec::new();
        match File::open(path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut map: HashMap<(u64, u64), Attrs> = HashMap::new();
        let mut len = 0u64;
        if !bytes.is_empty() {
            match replay(&bytes) {
                Ok(r) if r.uuid == uuid => {
                    if r.whole < bytes.len() {
                        note(format!(
                            "{}: {} bytes after the last whole record cut off (a change \
                             torn by a crash, never acknowledged)",
                            path.display(),
                            bytes.len() - r.whole
                        ));
                    }
                    map = r.map;
                    len = r.whole as u64;
                }
                r => {
                    let old = path.with_extension("old");
                    note(format!(
                        "{}: {}; moved to {}",
                        path.display(),
                        match r {
                            Ok(_) => "the journal of another store".to_string(),
                            Err(e) => e.to_string(),
                        },
                        old.display()
                    ));
                    std::fs::rename(path, &old)?;
                }
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        if len == 0 {
            restrict(path)?;
            file.set_len(0)?;
            file.write_all_at(&xattr::journal_header(&uuid), 0)?;
            len = xattr::JOURNAL_HEADER as u64;
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                sync_dir(dir)?;
            }
        } else if file.metadata()?.len() != len {
            file.set_len(len)?;
            file.sync_all()?;
        }
        Ok(Xattrs {
            path: path.to_path_buf(),
            uuid,
            restrict,
            file,
            len,
            live: live_bytes(&map),
            map,
        })
    }

    /// The attributes of `(ino, generation)`.
    pub(crate) fn of(&self, ino: u64, generation: u64) -> Option<&Attrs> {
        self.map.get(&(ino, generation))
    }

    /// Set (`Some`) or remove (`None`) attribute `name` of `(ino, generation)`, durably,
    /// with `setxattr`'s `flags` and the size limits. `live(ino, generation)`: whether an
    /// inode still exists (for a rewrite of the journal, which drops the others); the
    /// inodes such a rewrite dropped are returned.
    pub(crate) fn change(
        &mut self,
        ino: u64,
        generation: u64,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
        live: &dyn Fn(u64, u64) -> bool,
    ) -> io::Result<Vec<(u64, u64)>> {
        if flags & !(xattr::XATTR_CREATE | xattr::XATTR_REPLACE) != 0 {
            return Err(fs_err(libc::EINVAL, "setxattr: unknown flags"));
        }
        let attrs = self.map.get(&(ino, generation));
        let old = attrs.and_then(|a| a.get(name));
        match value {
            None if old.is_none() => {
                return Err(fs_err(libc::ENODATA, "removexattr: no such attribute"));
            }
            Some(_) if flags & xattr::XATTR_CREATE != 0 && old.is_some() => {
                return Err(fs_err(
                    libc::EEXIST,
                    "setxattr: the attribute exists (XATTR_CREATE)",
                ));
            }
            Some(_) if flags & xattr::XATTR_REPLACE != 0 && old.is_none() => {
                return Err(fs_err(
                    libc::ENODATA,
                    "setxattr: no such attribute to replace (XATTR_REPLACE)",
                ));
            }
            Some(v) => {
                if v.len() > xattr::VALUE_MAX {
                    return Err(fs_err(libc::E2BIG, "setxattr: value larger than 64 KiB"));
                }
                let used: usize = attrs
                    .map(|a| a.iter().map(|(n, v)| xattr::cost(n, v)).sum())
                    .unwrap_or(0);
                let names: usize = attrs
                    .map(|a| a.keys().map(|n| n.len() + 1).sum())
                    .unwrap_or(0);
                let freed = old.map_or(0, |o| xattr::cost(name, o));
                let new_name = if old.is_some() { 0 } else { name.len() + 1 };
                if used - freed + xattr::cost(name, v) > xattr::INODE_MAX
                    || names + new_name > xattr::LIST_MAX
                {
                    return Err(fs_err(
                        libc::ENOSPC,
                        format!(
                            "setxattr: an inode holds at most {} bytes of attribute names \
                             and values",
                            xattr::INODE_MAX
                        ),
                    ));
                }
            }
            None => {}
        }
        let rec = record(ino, generation, name, value).encode();
        cairn_media::file::write_all_at(&self.file, &rec, self.len)?;
        cairn_media::file::sync_data(&self.file)?;
        self.len += rec.len() as u64;
        let attrs = self.map.entry((ino, generation)).or_default();
        let old = match value {
            Some(v) => attrs.insert(name.to_vec(), v.to_vec()),
            None => attrs.remove(name),
        };
        if attrs.is_empty() {
            self.map.remove(&(ino, generation));
        }
        let size = |v: &[u8]| xattr::record_len(name.len(), v.len()) as u64;
        self.live = self.live + value.map_or(0, size) - old.as_deref().map_or(0, size);
        if self.len > COMPACT_MIN && self.len > 2 * self.live {
            return self.compact(live);
        }
        Ok(Vec::new())
    }

    /// Every inode with attributes.
    pub(crate) fn inodes(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.keys().copied()
    }

    /// Rewrite the journal with only the live attributes of inodes that still exist:
    /// into `PATH.tmp`, synced, then renamed over the journal (a crash leaves one or the
    /// other, both complete). Returns the inodes dropped.
    pub(crate) fn compact(
        &mut self,
        live: &dyn Fn(u64, u64) -> bool,
    ) -> io::Result<Vec<(u64, u64)>> {
        let dropped: Vec<(u64, u64)> = self
            .map
            .keys()
            .copied()
            .filter(|&(i, g)| !live(i, g))
            .collect();
        for k in &dropped {
            self.map.remove(k);
        }
        let tmp = self.path.with_extension("tmp");
        let mut out = Vec::with_capacity(live_bytes(&self.map) as usize);
        out.extend_from_slice(&xattr::journal_header(&self.uuid));
        let mut keys: Vec<_> = self.map.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            for (name, value) in &self.map[&k] {
                out.extend_from_slice(&record(k.0, k.1, name, Some(value)).encode());
            }
        }
        let mut f = File::create(&tmp)?;
        (self.restrict)(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
        }
        self.file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        self.len = out.len() as u64;
        self.live = self.len;
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(p: &Path) -> Xattrs {
        Xattrs::open(p, [1; 16], Box::new(|_| Ok(())), &|_| {}).unwrap()
    }

    #[test]
    fn changes_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("xattrs");
        let all = |_: u64, _: u64| true;
        let mut x = open(&p);
        x.change(5, 1, b"user.a", Some(b"1"), 0, &all).unwrap();
        x.change(5, 1, b"user.b", Some(b"2"), 0, &all).unwrap();
        x.change(5, 1, b"user.a", None, 0, &all).unwrap();
        x.change(6, 1, b"user.a", Some(b""), 0, &all).unwrap();
        let e = x.change(5, 1, b"user.b", Some(b"3"), xattr::XATTR_CREATE, &all);
        assert_eq!(cairn_area::errno_of(&e.unwrap_err()), libc::EEXIST);
        let e = x.change(5, 1, b"user.c", Some(b"3"), xattr::XATTR_REPLACE, &all);
        assert_eq!(cairn_area::errno_of(&e.unwrap_err()), libc::ENODATA);
        let e = x.change(5, 1, b"user.zz", None, 0, &all);
        assert_eq!(cairn_area::errno_of(&e.unwrap_err()), libc::ENODATA);
        drop(x);
        // A torn append after the last whole record.
        let good = std::fs::metadata(&p).unwrap().len();
        let torn = record(7, 1, b"user.t", Some(b"torn")).encode();
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&torn[..torn.len() - 2], good).unwrap();
        let notes = std::cell::RefCell::new(Vec::new());
        let x = Xattrs::open(&p, [1; 16], Box::new(|_| Ok(())), &|n| {
            notes.borrow_mut().push(n)
        })
        .unwrap();
        assert_eq!(notes.borrow().len(), 1);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), good);
        let five: Vec<_> = x.of(5, 1).unwrap().iter().collect();
        assert_eq!(five, vec![(&b"user.b".to_vec(), &b"2".to_vec())]);
        assert_eq!(x.of(6, 1).unwrap()[&b"user.a".to_vec()], b"");
        assert!(x.of(7, 1).is_none() && x.of(5, 2).is_none());
        // Another store's journal is moved aside, not used.
        drop(x);
        let x = Xattrs::open(&p, [2; 16], Box::new(|_| Ok(())), &|_| {}).unwrap();
        assert!(x.of(5, 1).is_none());
        assert!(p.with_extension("old").exists());
    }

    #[test]
    fn limits_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("xattrs");
        let all = |_: u64, _: u64| true;
        let mut x = open(&p);
        let big = vec![7u8; xattr::VALUE_MAX];
        x.change(1, 1, b"user.big", Some(&big), 0, &all).unwrap();
        let e = x
            .change(1, 1, b"user.big2", Some(&big), 0, &all)
            .unwrap_err();
        assert_eq!(cairn_area::errno_of(&e), libc::ENOSPC);
        let e = x.change(
            1,
            1,
            b"user.huge",
            Some(&[0; xattr::VALUE_MAX + 1]),
            0,
            &all,
        );
        assert_eq!(cairn_area::errno_of(&e.unwrap_err()), libc::E2BIG);
        // Rewriting one value many times grows the journal; it is rewritten, and an
        // inode that no longer exists (generation 1 of inode 2) is dropped then.
        x.change(2, 1, b"user.gone", Some(b"x"), 0, &all).unwrap();
        let live = |ino: u64, _: u64| ino != 2;
        for i in 0..40u8 {
            let v = vec![i; 60_000];
            x.change(1, 1, b"user.big", Some(&v), 0, &live).unwrap();
        }
        let len = std::fs::metadata(&p).unwrap().len();
        // 2.4 MB were appended in all.
        assert!(
            len <= COMPACT_MIN + 61_000,
            "journal not rewritten: {len} bytes"
        );
        assert!(x.of(2, 1).is_none());
        assert_eq!(x.live, live_bytes(&x.map));
        drop(x);
        let x = open(&p);
        assert_eq!(
            x.of(1, 1).unwrap()[&b"user.big".to_vec()],
            vec![39u8; 60_000]
        );
        assert!(x.of(2, 1).is_none());
    }
}
