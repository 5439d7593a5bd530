//! Digest: turn a client's committed log transactions into shared-area state.
//!
//! 1. Copy `[head, upto)` out of the client's ring into DRAM (the client cannot change
//!    the copy), verify every transaction and decode every record.
//! 2. Plan: fold the records per inode in order (last `INODE_SET` wins, `WRITE`s in an
//!    interval map, truncations cut it and lower the truncation point) and per
//!    (directory, name) (last `DIRENT_SET` wins); an inode created and freed inside the
//!    batch is dropped with all its records.
//! 3. Validate the plan against the shared area. Nothing is written before the whole batch
//!    is known to be valid: a malformed batch leaves the shared area untouched.
//! 4. Apply out of place (data, map nodes, buckets written and written back); any failure
//!    (`ENOSPC`) gives every new block back and publishes nothing.
//! 5. Fence, publish the inodes under their seqlocks, fence, persist the slot head (A/B)
//!    and `published_head`, retire the replaced blocks in the current epoch and advance it.
//!
//! Records are absolute post-state, so digesting a batch again after a crash anywhere
//! before step 5 persisted the head gives the same shared state.
//!
//! The steps are separate functions (`read_batch`, `plan_batch`, `apply_batch`,
//! `write_data`, `publish_batch`) so that `crate::digest::parallel` can run the reading and the
//! data copies of different slots' digests without the core lock; [`digest`] runs them
//! in a row.

pub(crate) mod parallel;

use crate::store::dirhash::{self, NameChange};
use crate::store::maptree;
use crate::store::shared::{Shared, Work};
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::log::{self, Record, Stop, KIND_COMMIT, KIND_WRAP, TXN_HEADER, TXN_MAGIC};
use cairn_format::slot::SlotHead;
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64, ROOT_INO};
use std::collections::{BTreeMap, HashMap};
use std::io;

/// How far to digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Exactly `[head, upto)`: the client claims every transaction in it is committed.
    Upto(u64),
    /// From the head for as long as transactions are valid (dead clients, shutdown).
    Committed,
}

/// What a successful digest did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub head_lsn: u64,
    pub head_seq: u64,
    /// Space credits the batch charged (`write_charge` of its `WRITE`s).
    pub charge: u64,
    pub txns: u64,
    pub records: u64,
    pub skipped: u64,
    pub log_bytes: u64,
    pub shared_bytes: u64,
    /// Inodes the batch created (their creator holds their write leases).
    pub created: Vec<u64>,
}

/// Why a digest did not happen.
#[derive(Debug)]
pub(crate) enum DigestError {
    /// The log is malformed: the client is refused, its log discarded up to
    /// `discard_lsn`, the shared area untouched.
    Malformed { msg: String, discard_lsn: u64 },
    /// The batch could not be applied (`ENOSPC`, `EIO`); the log stays authoritative.
    Failed(io::Error),
}

impl std::fmt::Display for DigestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DigestError::Malformed { msg, .. } => write!(f, "malformed log: {msg}"),
            DigestError::Failed(e) => write!(f, "digest failed: {e}"),
        }
    }
}

impl From<io::Error> for DigestError {
    fn from(e: io::Error) -> Self {
        DigestError::Failed(e)
    }
}

/// Plan-time failure: a bad batch or an I/O error reading the shared area.
enum PErr {
    Bad(String),
    Io(io::Error),
}

impl From<io::Error> for PErr {
    fn from(e: io::Error) -> Self {
        PErr::Io(e)
    }
}

/// Copy `len` log bytes from LSN `lsn` out of `slot`'s ring (linearised) into `buf`
/// (grown as needed, never shrunk); returns the `len` bytes.
pub(crate) fn copy_ring<'b>(
    sh: &cairn_area::Area,
    slot: u32,
    lsn: u64,
    len: usize,
    buf: &'b mut Vec<u8>,
) -> io::Result<&'b [u8]> {
    let ring = sh.layout().ring_bytes();
    let roff = sh.layout().ring_off(slot) as usize;
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let buf = &mut buf[..len];
    let start = (lsn % ring) as usize;
    let first = len.min(ring as usize - start);
    sh.map().read(roff + start, &mut buf[..first])?;
    if first < len {
        sh.map().read(roff, &mut buf[first..])?;
    }
    Ok(buf)
}

/// Estimated end of `slot`'s log: follows transaction headers (magic, sequence, length;
/// no checksum) from the head. For status reports only.
pub(crate) fn log_end_estimate(sh: &Shared, slot: u32) -> io::Result<u64> {
    let (h, _) = sh.slot_head(slot)?;
    let ring = sh.layout.ring_bytes();
    let roff = sh.layout.ring_off(slot) as usize;
    let (mut lsn, mut seq) = (h.head_lsn, h.head_seq);
    let mut hdr = [0u8; TXN_HEADER];
    while lsn - h.head_lsn < ring {
        sh.map().read(roff + (lsn % ring) as usize, &mut hdr)?;
        let u32at = |o: usize| u32::from_le_bytes(hdr[o..o + 4].try_into().unwrap());
        let kind = u16::from_le_bytes([hdr[6], hdr[7]]);
        let len = u32at(16) as u64;
        let lap_left = ring - lsn % ring;
        if u32at(0) != TXN_MAGIC
            || u64::from_le_bytes(hdr[8..16].try_into().unwrap()) != seq
            || len < 64
            || !len.is_multiple_of(64)
            || len > lap_left
        {
            break;
        }
        seq += 1;
        lsn += if kind == KIND_WRAP { lap_left } else { len };
    }
    Ok(lsn.min(h.head_lsn + ring))
}

/// A contiguous range of pending file data, borrowed from the batch copy.
#[derive(Debug, Clone, Copy)]
struct Piece<'a> {
    end: u64,
    data: &'a [u8],
    rec: usize,
}

/// Pending writes of one file: non-overlapping ranges, later writes win.
#[derive(Debug, Default)]
struct Intervals<'a> {
    map: BTreeMap<u64, Piece<'a>>,
}

impl<'a> Intervals<'a> {
    fn insert(&mut self, start: u64, data: &'a [u8], rec: usize) {
        let end = start + data.len() as u64;
        self.remove(start, end);
        self.map.insert(start, Piece { end, data, rec });
    }

    /// Drop `[start, end)` (splitting the pieces across its ends).
    fn remove(&mut self, start: u64, end: u64) {
        let over: Vec<u64> = self
            .map
            .range(..end)
            .rev()
            .take_while(|(_, p)| p.end > start)
            .map(|(k, _)| *k)
            .collect();
        for k in over {
            let p = self.map.remove(&k).unwrap();
            if k < start {
                self.map.insert(
                    k,
                    Piece {
                        end: start,
                        data: &p.data[..(start - k) as usize],
                        rec: p.rec,
                    },
                );
            }
            if p.end > end {
                self.map.insert(
                    end,
                    Piece {
                        end: p.end,
                        data: &p.data[(end - k) as usize..],
                        rec: p.rec,
                    },
                );
            }
        }
    }

    /// Drop everything at or beyond `at`.
    fn cut(&mut self, at: u64) {
        drop(self.map.split_off(&at));
        if let Some((&k, p)) = self.map.range_mut(..at).next_back() {
            if p.end > at {
                p.data = &p.data[..(at - k) as usize];
                p.end = at;
            }
        }
    }

    fn clear(&mut self) {
        self.map.clear();
    }

    /// Pieces overlapping `[s, e)`, in order.
    fn overlapping(&self, s: u64, e: u64) -> impl Iterator<Item = (u64, &Piece<'a>)> {
        let mut v: Vec<(u64, &Piece<'a>)> = self
            .map
            .range(..e)
            .rev()
            .take_while(|(_, p)| p.end > s)
            .map(|(k, p)| (*k, p))
            .collect();
        v.reverse();
        v.into_iter()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Free in the shared area and not (yet) created by the batch.
    Free,
    Live,
    /// Freed by the batch (`nlink = 0`).
    Freed,
}

/// The folded effect of a batch on one inode.
struct InodePlan<'a> {
    base: Inode,
    base_live: bool,
    life: Life,
    /// Became live inside the batch (from free): a new generation, no old content.
    created: bool,
    attrs: Attrs,
    /// Last `INODE_SET`.
    set_rec: Option<usize>,
    /// Last record that set attributes without surviving data otherwise (an empty
    /// `WRITE` after the last `INODE_SET`).
    attr_rec: Option<usize>,
    pending: Intervals<'a>,
    /// Whole file blocks `[start, end)` punched by the batch: their old content is
    /// dropped (a later write of the batch starts from zeros).
    holes: Vec<(u64, u64)>,
    cur_size: u64,
    /// Smallest size seen: old content at and beyond it is dropped.
    keep: Option<u64>,
    /// A record that makes no sense unless the inode ends up free.
    bad: Option<String>,
}

impl InodePlan<'_> {
    fn new(base: Inode) -> Self {
        let live = base.attrs.kind != Kind::Free;
        InodePlan {
            base,
            base_live: live,
            life: if live { Life::Live } else { Life::Free },
            created: false,
            attrs: base.attrs,
            set_rec: None,
            attr_rec: None,
            pending: Intervals::default(),
            holes: Vec::new(),
            cur_size: base.attrs.size,
            keep: None,
            bad: None,
        }
    }

    fn truncate(&mut self, size: u64) {
        if size < self.cur_size {
            self.pending.cut(size);
            self.keep = Some(self.keep.map_or(size, |k| k.min(size)));
        }
    }

    /// `PUNCH` of `[off, off + len)` (record `rec`): pending writes there are dropped,
    /// whole blocks become holes, partial blocks at the ends are overwritten with zeros.
    fn punch(&mut self, off: u64, len: u64, rec: usize) {
        let end = off.saturating_add(len).min(self.cur_size);
        if off >= end {
            return;
        }
        self.pending.remove(off, end);
        let (first, last) = (off.div_ceil(BLOCK_SIZE_U64), end / BLOCK_SIZE_U64);
        let mut zero = |s: u64, e: u64| {
            debug_assert!(e - s <= BLOCK_SIZE_U64);
            self.pending.insert(s, &ZEROS[..(e - s) as usize], rec);
        };
        if first > last {
            zero(off, end); // inside one block
            return;
        }
        if off < first * BLOCK_SIZE_U64 {
            zero(off, first * BLOCK_SIZE_U64);
        }
        if last * BLOCK_SIZE_U64 < end {
            zero(last * BLOCK_SIZE_U64, end);
        }
        if first < last {
            self.holes.push((first, last));
        }
    }

    fn in_hole(&self, fb: u64) -> bool {
        self.holes.iter().any(|&(s, e)| s <= fb && fb < e)
    }

    /// Forget the data of the batch (the inode was freed or created anew).
    fn clear_data(&mut self) {
        self.pending.clear();
        self.holes.clear();
    }
}

/// The zeros a `PUNCH` writes into the partial blocks at its ends.
static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

struct Plan<'a> {
    /// The slot whose log is digested.
    slot: u32,
    inodes: BTreeMap<u64, InodePlan<'a>>,
    dirents: BTreeMap<(u64, &'a [u8]), (u64, Kind, usize)>,
    nrec: usize,
    charge: u64,
}

impl<'a> Plan<'a> {
    fn get(&mut self, sh: &Shared, ino: u64) -> Result<&mut InodePlan<'a>, PErr> {
        if !sh.layout.ino_valid(ino) {
            return Err(PErr::Bad(format!("inode number {ino} out of range")));
        }
        if let std::collections::btree_map::Entry::Vacant(v) = self.inodes.entry(ino) {
            v.insert(InodePlan::new(sh.inode(ino)?));
        }
        Ok(self.inodes.get_mut(&ino).unwrap())
    }

    fn fold(&mut self, sh: &Shared, idx: usize, rec: Record<'a>) -> Result<(), PErr> {
        match rec {
            Record::InodeSet { ino, attrs, .. } => {
                let me = self.slot;
                let pinned = sh.keep_unlinked
                    || sh
                        .pins
                        .get(&ino)
                        .is_some_and(|s| s.iter().any(|&c| c != me));
                let mine = sh.pinned_by(ino, me);
                let p = self.get(sh, ino)?;
                if attrs.kind == Kind::Free {
                    return Err(PErr::Bad(format!(
                        "INODE_SET of inode {ino} with kind free"
                    )));
                }
                // Unlinked while another client has it open: kept (an orphan with
                // `nlink = 0`) until the last pin goes. So is an unnamed file
                // (`O_TMPFILE`) its creator pinned: created with `nlink = 0`, or
                // changed while still unnamed.
                let unnamed = attrs.nlink == 0 && attrs.kind == Kind::File && mine;
                let keep = attrs.nlink == 0
                    && p.life == Life::Live
                    && matches!(attrs.kind, Kind::File | Kind::Symlink)
                    && (pinned || (unnamed && p.attrs.nlink == 0));
                let keep = keep || (unnamed && p.life != Life::Live);
                if attrs.nlink == 0 && !keep {
                    p.life = Life::Freed;
                    p.clear_data();
                    p.attrs = attrs;
                } else if p.life != Life::Live {
                    p.life = Life::Live;
                    p.created = true;
                    p.clear_data();
                    p.keep = None;
                    p.attrs = attrs;
                    p.cur_size = attrs.size;
                } else {
                    if attrs.kind != p.attrs.kind {
                        return Err(PErr::Bad(format!(
                            "INODE_SET changes the kind of inode {ino} from {:?} to {:?}",
                            p.attrs.kind, attrs.kind
                        )));
                    }
                    if attrs.rdev != p.attrs.rdev {
                        return Err(PErr::Bad(format!(
                            "INODE_SET changes the device number of inode {ino}"
                        )));
                    }
                    if attrs.kind != Kind::Dir {
                        p.truncate(attrs.size);
                    }
                    p.cur_size = attrs.size;
                    p.attrs = attrs;
                }
                p.set_rec = Some(idx);
                p.attr_rec = None;
            }
            Record::Write {
                ino,
                offset,
                size,
                mtime,
                data,
            } => {
                self.charge += log::write_charge(offset, data.len() as u64);
                let p = self.get(sh, ino)?;
                if p.life != Life::Live {
                    p.bad
                        .get_or_insert_with(|| format!("WRITE to free inode {ino}"));
                    return Ok(());
                }
                if !matches!(p.attrs.kind, Kind::File | Kind::Symlink) {
                    p.bad.get_or_insert_with(|| {
                        format!("WRITE to inode {ino}, a {:?}", p.attrs.kind)
                    });
                    return Ok(());
                }
                p.truncate(size);
                p.cur_size = size;
                p.attrs.size = size;
                p.attrs.mtime = mtime;
                p.attrs.ctime = mtime;
                if data.is_empty() {
                    p.attr_rec = Some(idx);
                } else {
                    p.pending.insert(offset, data, idx);
                    p.attr_rec = None;
                }
            }
            Record::Punch {
                ino,
                offset,
                len,
                mtime,
            } => {
                self.charge += log::punch_charge(offset, len);
                let p = self.get(sh, ino)?;
                if p.life != Life::Live || p.attrs.kind != Kind::File {
                    let what = if p.life == Life::Live {
                        format!("a {:?}", p.attrs.kind)
                    } else {
                        "free".into()
                    };
                    p.bad
                        .get_or_insert_with(|| format!("PUNCH of inode {ino}, {what}"));
                    return Ok(());
                }
                p.punch(offset, len, idx);
                p.attrs.mtime = mtime;
                p.attrs.ctime = mtime;
                p.attr_rec = Some(idx);
            }
            Record::DirentSet {
                dir,
                name,
                ino,
                kind,
            } => {
                if !sh.layout.ino_valid(dir) {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET in directory {dir}: out of range"
                    )));
                }
                if ino != 0 && !sh.layout.ino_valid(ino) {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET names inode {ino}: out of range"
                    )));
                }
                self.dirents.insert((dir, name), (ino, kind, idx));
            }
        }
        Ok(())
    }
}

/// The validated, applicable form of a plan.
struct Checked<'p> {
    dir_changes: HashMap<u64, Vec<NameChange<'p>>>,
    survivors: Vec<bool>,
}

fn validate<'p>(sh: &Shared, slot: u32, plan: &mut Plan<'p>) -> Result<Checked<'p>, PErr> {
    let mut survivors = vec![false; plan.nrec];
    for (&ino, p) in &plan.inodes {
        match p.life {
            Life::Live => {
                if let Some(b) = &p.bad {
                    return Err(PErr::Bad(b.clone()));
                }
                if p.created {
                    if let Some(s) = sh.inodes.reserved_by(ino) {
                        if s != slot {
                            return Err(PErr::Bad(format!(
                                "inode {ino} is reserved by the client of slot {s}"
                            )));
                        }
                    }
                }
                if ino == ROOT_INO && (p.created || p.attrs.kind != Kind::Dir) {
                    return Err(PErr::Bad("the root directory cannot be replaced".into()));
                }
                if let Some(r) = p.set_rec {
                    survivors[r] = true;
                }
                if let Some(r) = p.attr_rec {
                    survivors[r] = true;
                }
                for piece in p.pending.map.values() {
                    survivors[piece.rec] = true;
                }
            }
            Life::Free if p.bad.is_some() => {
                // Never live in this batch (a `Freed` one may be a replay: tolerated).
                return Err(PErr::Bad(p.bad.clone().unwrap_or_default()));
            }
            _ => {
                if ino == ROOT_INO {
                    return Err(PErr::Bad("the root directory cannot be freed".into()));
                }
                if p.base_live {
                    if let Some(r) = p.set_rec {
                        survivors[r] = true;
                    }
                }
            }
        }
    }
    let mut others: HashMap<u64, Inode> = HashMap::new();
    let mut base_of = |ino: u64| -> io::Result<Inode> {
        if let Some(i) = others.get(&ino) {
            return Ok(*i);
        }
        let i = sh.inode(ino)?;
        others.insert(ino, i);
        Ok(i)
    };
    let mut dir_changes: HashMap<u64, Vec<NameChange<'p>>> = HashMap::new();
    let mut freed_dirs: HashMap<u64, Vec<NameChange<'p>>> = HashMap::new();
    let mut touched_dirs: Vec<u64> = Vec::new();
    for (&(dir, name), &(ino, kind, idx)) in &plan.dirents {
        let change = NameChange { name, ino, kind };
        match plan.inodes.get(&dir) {
            Some(p) if p.life == Life::Live => {
                if p.attrs.kind != Kind::Dir {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET in inode {dir}, not a directory"
                    )));
                }
            }
            Some(p) => {
                if p.base_live && p.base.attrs.kind == Kind::Dir {
                    freed_dirs.entry(dir).or_default().push(change);
                }
                continue;
            }
            None => {
                let b = base_of(dir)?;
                if b.attrs.kind != Kind::Dir {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET in inode {dir}, a {:?}, not a directory",
                        b.attrs.kind
                    )));
                }
                touched_dirs.push(dir);
            }
        }
        if ino != 0 {
            let target = match plan.inodes.get(&ino) {
                Some(p) if p.life == Life::Live => Some(p.attrs.kind),
                Some(_) => None,
                None => Some(base_of(ino)?.attrs.kind).filter(|k| *k != Kind::Free),
            };
            match target {
                None => {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET names inode {ino}, which is free"
                    )))
                }
                Some(k) if k != kind => {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET names inode {ino} as a {kind:?}, it is a {k:?}"
                    )))
                }
                _ => {}
            }
        }
        survivors[idx] = true;
        dir_changes.entry(dir).or_default().push(change);
    }
    // A directory freed by the batch must end up empty.
    for (&ino, p) in &plan.inodes {
        if p.life != Life::Live && p.base_live && p.base.attrs.kind == Kind::Dir {
            let mut n = p.base.dir_entries as i64;
            for c in freed_dirs.get(&ino).map(|v| &v[..]).unwrap_or(&[]) {
                let had = sh.area.dir_lookup(&p.base, c.name)?.is_some();
                n += (c.ino != 0) as i64 - had as i64;
            }
            if n != 0 {
                return Err(PErr::Bad(format!(
                    "directory {ino} is freed with {n} entries left"
                )));
            }
        }
    }
    for dir in touched_dirs {
        if let std::collections::btree_map::Entry::Vacant(v) = plan.inodes.entry(dir) {
            v.insert(InodePlan::new(base_of(dir)?));
        }
    }
    Ok(Checked {
        dir_changes,
        survivors,
    })
}

/// Retire every block an inode owns (map nodes, data blocks, bucket chains).
fn retire_all(sh: &Shared, w: &mut Work, inode: &Inode) -> io::Result<()> {
    w.retired
        .extend(crate::store::recovery::owned_blocks(sh, inode)?);
    Ok(())
}

/// Write a file's pending data out of place and update its map.
#[allow(clippy::too_many_arguments)]
fn apply_file<'a>(
    sh: &mut Shared,
    ino: u64,
    w: &mut Work,
    old: &Inode,
    new: &mut Inode,
    plan: &InodePlan<'a>,
    keep: Option<u64>,
    data: &mut Vec<DataWrite<'a>>,
) -> io::Result<()> {
    let pending = &plan.pending;
    let base_size = old.attrs.size;
    let t = keep.filter(|&t| t < base_size);
    let keep_blocks = t.map_or(u64::MAX, |t| t.div_ceil(BLOCK_SIZE_U64));
    let mut touched: Vec<u64> = Vec::new();
    for (&s, p) in &pending.map {
        for b in s / BLOCK_SIZE_U64..=(p.end - 1) / BLOCK_SIZE_U64 {
            if touched.last() != Some(&b) {
                touched.push(b);
            }
        }
    }
    if let Some(t) = t {
        let tb = t / BLOCK_SIZE_U64;
        if t % BLOCK_SIZE_U64 != 0 && sh.area.block_of(old, tb)?.is_some() {
            if let Err(pos) = touched.binary_search(&tb) {
                touched.insert(pos, tb);
            }
        }
    }
    if touched.is_empty() && t.is_none() && plan.holes.is_empty() {
        return Ok(());
    }
    let mut chunk = u64::MAX;
    for &b in &touched {
        if b / sh.recency.grain(0) != chunk {
            chunk = b / sh.recency.grain(0);
            sh.recency.touch(0, ino, b, b);
        }
    }
    // Old content is kept below the truncation point (beyond the old size it is zero).
    let limit = t.unwrap_or(u64::MAX);
    let mut changes = Vec::with_capacity(touched.len());
    let mut buf = vec![0u8; BLOCK_SIZE];
    for fb in touched {
        let bs = fb * BLOCK_SIZE_U64;
        let be = bs + BLOCK_SIZE_U64;
        let covered: u64 = pending
            .overlapping(bs, be)
            .map(|(k, p)| p.end.min(be) - k.max(bs))
            .sum();
        if covered < BLOCK_SIZE_U64 {
            match sh.area.block_of(old, fb)? {
                Some(ob) if bs < limit && !plan.in_hole(fb) => {
                    sh.area.read_leaf(ob, &mut buf)?;
                    if limit < be {
                        buf[(limit - bs) as usize..].fill(0);
                    }
                }
                _ => buf.fill(0),
            }
        }
        let base = (covered < BLOCK_SIZE_U64).then(|| buf.clone());
        let mut pieces = Vec::new();
        for (k, p) in pending.overlapping(bs, be) {
            let s = k.max(bs);
            let e = p.end.min(be);
            let d: &'a [u8] = p.data;
            pieces.push(((s - bs) as usize, &d[(s - k) as usize..(e - k) as usize]));
        }
        // The block's content is written later (`write_data`), possibly without the core
        // lock (`crate::digest::parallel`); it is unreachable until the inode is published.
        let nb = sh.alloc_block(w)?;
        w.bytes += BLOCK_SIZE_U64;
        data.push(DataWrite {
            blk: nb,
            base,
            pieces,
        });
        changes.push((fb, nb));
    }
    // Punched blocks the batch did not write again: holes in the map.
    let rewritten = changes.len();
    for &(s, e) in &plan.holes {
        let mut b = s;
        while let Some(d) = sh.area.next_block(old, b, e.min(keep_blocks), true)? {
            if changes[..rewritten]
                .binary_search_by_key(&d, |c| c.0)
                .is_err()
            {
                changes.push((d, 0));
            }
            b = d + 1;
        }
    }
    if changes.len() > rewritten {
        changes.sort_unstable_by_key(|c| c.0);
        changes.dedup_by_key(|c| c.0);
    }
    let r = maptree::update(
        sh,
        w,
        old.map_root,
        old.map_height,
        &changes,
        keep_blocks,
        true,
    )?;
    new.map_root = r.root;
    new.map_height = r.height;
    new.blocks = (old.blocks as i64 + r.delta).max(0) as u64;
    Ok(())
}

pub(crate) enum Effect {
    Created,
    Updated,
    Freed,
}

/// A new data block of a digest: its old content (`None`: zeros) overlaid with pieces of
/// the batch (offset in the block, bytes). Written with non-temporal stores by
/// [`write_data`] before the publishing fence.
pub(crate) struct DataWrite<'a> {
    blk: u64,
    base: Option<Vec<u8>>,
    pieces: Vec<(usize, &'a [u8])>,
}

/// Write the new data blocks of a digest (no fence: the publish fence orders them, and
/// must run on the same thread).
pub(crate) fn write_data(map: &cairn_media::Mapping, data: &[DataWrite<'_>]) -> io::Result<()> {
    let mut buf = vec![0u8; BLOCK_SIZE];
    for d in data {
        let off = (d.blk * BLOCK_SIZE_U64) as usize;
        if let (None, [(0, whole)]) = (&d.base, &d.pieces[..]) {
            if whole.len() == BLOCK_SIZE {
                map.write_nt(off, whole)?;
                continue;
            }
        }
        match &d.base {
            Some(b) => buf.copy_from_slice(b),
            None => buf.fill(0),
        }
        for &(o, p) in &d.pieces {
            buf[o..o + p.len()].copy_from_slice(p);
        }
        map.write_nt(off, &buf)?;
    }
    Ok(())
}

/// Where a batch ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub head: SlotHead,
    pub end: u64,
    pub end_seq: u64,
    pub txns: u64,
}

/// A batch copied out of a ring, verified and decoded (step 1).
pub(crate) struct Batch<'b> {
    pub span: Span,
    pub recs: Vec<Record<'b>>,
    pub txn_ends: Vec<usize>,
}

/// Step 1: copy `slot`'s batch from `head` into `scratch`, verify and decode it. Reads
/// only the slot's ring (no shared state): runs without the core lock in parallel
/// digests. `Ok(None)`: nothing to digest.
pub(crate) fn read_batch<'b>(
    area: &cairn_area::Area,
    slot: u32,
    head: SlotHead,
    mode: Mode,
    scratch: &'b mut Vec<u8>,
) -> Result<Option<Batch<'b>>, DigestError> {
    let ring = area.layout().ring_bytes();
    let (h0, s0) = (head.head_lsn, head.head_seq);
    let len = match mode {
        Mode::Upto(u) if u <= h0 => {
            // Already digested (e.g. by a shutdown that digested a live client's log).
            return Ok(None);
        }
        Mode::Upto(u) => {
            if u - h0 > ring || u % log::TXN_ALIGN != 0 {
                let discard = u.clamp(h0, h0 + ring);
                return Err(DigestError::Malformed {
                    msg: format!(
                        "digest up to lsn {u} is outside [head {h0}, head + ring {}] or unaligned",
                        h0 + ring
                    ),
                    discard_lsn: cairn_format::align_up(discard, log::TXN_ALIGN),
                });
            }
            (u - h0) as usize
        }
        Mode::Committed => ring as usize,
    };
    let buf: &'b [u8] = copy_ring(area, slot, h0, len, scratch)?;
    let s = log::scan(buf, h0, s0, ring);
    let mut txns = s.txns;
    let (mut end, mut end_seq) = (s.end_lsn, s.end_seq);
    match mode {
        Mode::Upto(u) => {
            let bad = |msg: String| DigestError::Malformed {
                msg,
                discard_lsn: u,
            };
            if let Stop::Invalid { lsn, why } = &s.stop {
                return Err(bad(format!("transaction at lsn {lsn}: {why}")));
            }
            if let Some(t) = txns.last() {
                if t.kind == KIND_WRAP && (t.lsn / ring + 1) * ring != u {
                    return Err(bad(format!(
                        "digest range ends at {u}, inside the wrap at lsn {}",
                        t.lsn
                    )));
                }
            }
            end = u;
        }
        Mode::Committed => {
            if let Some(t) = txns.last().cloned() {
                if t.kind == KIND_WRAP && (t.lsn / ring + 1) * ring > h0 + ring {
                    txns.pop();
                    end = t.lsn;
                    end_seq = t.seq;
                }
            }
        }
    }
    let malformed = |msg: String| DigestError::Malformed {
        msg,
        discard_lsn: end,
    };
    if txns.is_empty() {
        return Ok(None);
    }
    // Decode.
    let mut recs: Vec<Record<'b>> = Vec::new();
    let mut txn_ends: Vec<usize> = Vec::new();
    for t in txns.iter().filter(|t| t.kind == KIND_COMMIT) {
        let off = (t.lsn - h0) as usize;
        let r = log::records(&buf[off..off + t.len], t.nrec)
            .map_err(|e| malformed(format!("transaction at lsn {}: {}", t.lsn, e.0)))?;
        recs.extend(r);
        txn_ends.push(recs.len());
    }
    Ok(Some(Batch {
        span: Span {
            head,
            end,
            end_seq,
            txns: txns.len() as u64,
        },
        recs,
        txn_ends,
    }))
}

/// A permission-checked, validated plan (steps 2 and 3).
pub(crate) struct Planned<'b> {
    plan: Plan<'b>,
    checked: Checked<'b>,
}

impl Planned<'_> {
    /// Every inode the batch publishes (or plans and leaves free).
    pub(crate) fn inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.plan.inodes.keys().copied()
    }
}

/// Steps 2 and 3: check the batch against the client's permissions, fold it into a plan
/// and validate the plan against the shared area. Reads the shared area only (through
/// [`Shared::inode`], so a parallel digest can record its read set).
pub(crate) fn plan_batch<'b>(
    sh: &Shared,
    slot: u32,
    b: &Batch<'b>,
) -> Result<Planned<'b>, DigestError> {
    let malformed = |msg: String| DigestError::Malformed {
        msg,
        discard_lsn: b.span.end,
    };
    // Permissions of the slot's client (crate::perm).
    let cred = crate::perm::slot_cred(sh, slot)?;
    let replay = sh.replaying.contains(&slot);
    crate::perm::check_batch(sh, slot, &cred, &b.recs, &b.txn_ends, replay).map_err(
        |e| match e {
            crate::perm::Denial::Denied(m) => malformed(m),
            crate::perm::Denial::Io(e) => DigestError::Failed(e),
        },
    )?;
    // Plan and validate.
    let mut plan = Plan {
        slot,
        inodes: BTreeMap::new(),
        dirents: BTreeMap::new(),
        nrec: b.recs.len(),
        charge: 0,
    };
    let perr = |e: PErr| match e {
        PErr::Bad(m) => malformed(m),
        PErr::Io(e) => DigestError::Failed(e),
    };
    for (i, r) in b.recs.iter().cloned().enumerate() {
        plan.fold(sh, i, r).map_err(perr)?;
    }
    let checked = validate(sh, slot, &mut plan).map_err(perr)?;
    Ok(Planned { plan, checked })
}

/// What step 4 produced: blocks allocated and retired, map nodes and buckets written
/// and written back, the new data blocks still to write, the inodes to publish.
pub(crate) struct Applied<'b> {
    pub w: Work,
    pub data: Vec<DataWrite<'b>>,
    publish: Vec<(u64, Inode, Effect)>,
    noops: u64,
}

/// Step 4: apply out of place (allocation, map nodes, directory buckets; data blocks are
/// only allocated: see [`write_data`]). On failure every allocated block is given back.
pub(crate) fn apply_batch<'b>(
    sh: &mut Shared,
    pl: &Planned<'b>,
) -> Result<Applied<'b>, DigestError> {
    let (plan, checked) = (&pl.plan, &pl.checked);
    let mut w = Work::default();
    let mut data = Vec::new();
    let mut publish: Vec<(u64, Inode, Effect)> = Vec::new();
    let mut noops = 0u64;
    let applied = (|| -> io::Result<()> {
        for (&ino, p) in &plan.inodes {
            match p.life {
                Life::Live => {
                    let fresh = p.created;
                    if fresh && p.base_live {
                        retire_all(sh, &mut w, &p.base)?;
                    }
                    let old = if fresh { Inode::default() } else { p.base };
                    let mut new = Inode {
                        attrs: p.attrs,
                        generation: if fresh {
                            p.base.generation + 1
                        } else {
                            p.base.generation
                        },
                        ..old
                    };
                    match p.attrs.kind {
                        Kind::Dir => {
                            new.attrs.size = old.attrs.size;
                            if let Some(ch) = checked.dir_changes.get(&ino) {
                                noops += dirhash::apply(sh, &mut w, &old, &mut new, ch)?;
                            }
                        }
                        _ => {
                            let keep = if fresh { None } else { p.keep };
                            apply_file(sh, ino, &mut w, &old, &mut new, p, keep, &mut data)?;
                        }
                    }
                    publish.push((
                        ino,
                        new,
                        if fresh {
                            Effect::Created
                        } else {
                            Effect::Updated
                        },
                    ));
                }
                _ if p.base_live => {
                    retire_all(sh, &mut w, &p.base)?;
                    let free = Inode {
                        generation: p.base.generation,
                        ..Default::default()
                    };
                    publish.push((ino, free, Effect::Freed));
                }
                _ => {}
            }
        }
        Ok(())
    })();
    if let Err(e) = applied {
        sh.rollback(&w);
        return Err(DigestError::Failed(e));
    }
    Ok(Applied {
        w,
        data,
        publish,
        noops,
    })
}

/// Step 5: fence, publish the inodes, persist the slot head, retire, advance the epoch,
/// count. Every block of `a` (including its data blocks) must be written and written
/// back by the calling thread before.
pub(crate) fn publish_batch(
    sh: &mut Shared,
    slot: u32,
    span: Span,
    pl: &Planned<'_>,
    a: Applied<'_>,
) -> Result<Outcome, DigestError> {
    let Applied {
        mut w,
        publish,
        noops,
        ..
    } = a;
    let (plan, checked) = (&pl.plan, &pl.checked);
    let Span {
        head,
        end,
        end_seq,
        txns,
    } = span;
    cairn_media::fence();
    for (ino, inode, _) in &publish {
        sh.write_inode(*ino, inode)?;
        w.bytes += cairn_format::inode::INODE_BYTES as u64;
    }
    cairn_media::fence();
    for (ino, _, eff) in &publish {
        match eff {
            Effect::Created => sh.inodes.mark_used(*ino),
            Effect::Freed => sh.inodes.mark_free(*ino),
            Effect::Updated => {}
        }
    }
    // Inodes the batch both created and freed (a temporary file) never reach the area:
    // their numbers go back to the free pool.
    for (&ino, p) in &plan.inodes {
        if p.created && !p.base_live && !matches!(p.life, Life::Live) {
            sh.inodes.unreserve(slot, ino);
        }
    }
    // Persist the head, retire, advance the epoch, count.
    sh.set_slot_head(
        slot,
        SlotHead {
            head_lsn: end,
            head_seq: end_seq,
            ..head
        },
    )?;
    let (head_lsn, head_seq) = (end, end_seq);
    sh.retire_and_advance(std::mem::take(&mut w.retired))?;
    let records = plan.nrec as u64;
    let skipped = checked.survivors.iter().filter(|s| !**s).count() as u64 + noops;
    let out = Outcome {
        head_lsn,
        head_seq,
        charge: plan.charge,
        txns,
        records,
        skipped,
        log_bytes: end - head.head_lsn,
        shared_bytes: w.bytes,
        created: publish
            .iter()
            .filter(|p| matches!(p.2, Effect::Created))
            .map(|p| p.0)
            .collect(),
    };
    // The half-applied batch a crash may have left is behind the head now; once every
    // such slot is past it, inodes still unnamed are garbage.
    if sh.replaying.remove(&slot) && sh.replaying.is_empty() {
        crate::store::recovery::free_unreachable(sh)?;
    }
    let c = &mut sh.counters;
    c.records_digested += records;
    c.records_skipped += skipped;
    c.log_bytes_written += out.log_bytes;
    c.shared_bytes_written += out.shared_bytes;
    c.digests += 1;
    sh.persist_counters()?;
    Ok(out)
}

/// Digest `slot`'s log (see the module documentation).
pub(crate) fn digest(sh: &mut Shared, slot: u32, mode: Mode) -> Result<Outcome, DigestError> {
    // The batch is copied into a buffer kept across digests: a fresh multi-megabyte
    // allocation per digest made the kernel fault in and zero every page of it.
    let mut scratch = std::mem::take(&mut sh.scratch);
    let r = digest_with(sh, slot, mode, &mut scratch);
    sh.scratch = scratch;
    r
}

fn digest_with(
    sh: &mut Shared,
    slot: u32,
    mode: Mode,
    scratch: &mut Vec<u8>,
) -> Result<Outcome, DigestError> {
    if slot >= sh.layout.nslots {
        return Err(DigestError::Failed(crate::util::einval(format!(
            "slot {slot} out of range"
        ))));
    }
    let (head, _) = sh.slot_head(slot)?;
    let area = sh.area.clone();
    let Some(b) = read_batch(&area, slot, head, mode, scratch)? else {
        return Ok(Outcome {
            head_lsn: head.head_lsn,
            head_seq: head.head_seq,
            ..Default::default()
        });
    };
    let pl = plan_batch(sh, slot, &b)?;
    let a = apply_batch(sh, &pl)?;
    if let Err(e) = write_data(area.map(), &a.data) {
        sh.rollback(&a.w);
        return Err(DigestError::Failed(e));
    }
    publish_batch(sh, slot, b.span, &pl, a)
}

/// What the committed, undigested transactions of `slot` hold (after a daemon restart):
/// the inode numbers they create (`INODE_SET` with `nlink > 0`) that are free in the
/// shared area, reserved for it so that no other client gets them before its log is
/// digested; and the space they charged (the credits their `WRITE`s used), which stays
/// promised until digested.
/// How many committed transactions `slot`'s log holds past its head (not digested yet).
pub(crate) fn pending_commits(sh: &Shared, slot: u32) -> io::Result<usize> {
    let (head, _) = sh.slot_head(slot)?;
    let ring = sh.layout.ring_bytes();
    let mut scratch = Vec::new();
    let buf = copy_ring(&sh.area, slot, head.head_lsn, ring as usize, &mut scratch)?;
    let s = log::scan(buf, head.head_lsn, head.head_seq, ring);
    Ok(s.txns.iter().filter(|t| t.kind == KIND_COMMIT).count())
}

pub(crate) fn logged(sh: &Shared, slot: u32) -> io::Result<(Vec<u64>, u64)> {
    let (head, _) = sh.slot_head(slot)?;
    let ring = sh.layout.ring_bytes();
    let mut scratch = Vec::new();
    let buf = copy_ring(&sh.area, slot, head.head_lsn, ring as usize, &mut scratch)?;
    let s = log::scan(buf, head.head_lsn, head.head_seq, ring);
    let mut out = Vec::new();
    let mut charge = 0;
    for t in s.txns.iter().filter(|t| t.kind == KIND_COMMIT) {
        let off = (t.lsn - head.head_lsn) as usize;
        let Ok(recs) = log::records(&buf[off..off + t.len], t.nrec) else {
            break;
        };
        for r in recs {
            match r {
                Record::InodeSet { ino, attrs, .. }
                    if attrs.nlink > 0 && sh.layout.ino_valid(ino) && !sh.inodes.is_used(ino) =>
                {
                    out.push(ino);
                }
                r => charge += r.charge(),
            }
        }
    }
    Ok((out, charge))
}

/// Check the unsealed transaction a client asks the daemon to `Commit` (shared-write
/// mode): `len` bytes at `lsn` of `slot`'s ring, at or after the head, within one lap
/// and the ring's free space, with a zero magic and otherwise a valid commit
/// transaction with sequence `seq`. Returns the inodes it writes (`INODE_SET` and
/// `WRITE` inodes, `DIRENT_SET` directories), sorted and without duplicates.
pub(crate) fn unsealed_writes(
    sh: &Shared,
    slot: u32,
    lsn: u64,
    len: u32,
    seq: u64,
) -> io::Result<Vec<u64>> {
    let bad = |m: String| -> io::Result<Vec<u64>> {
        Err(crate::util::einval(format!("commit at LSN {lsn}: {m}")))
    };
    let ring = sh.layout.ring_bytes();
    let (head, _) = sh.slot_head(slot)?;
    let len64 = len as u64;
    if lsn < head.head_lsn || lsn + len64 > head.head_lsn + ring || len64 > ring / 4 {
        return bad(format!(
            "outside the log's free space (head {}, {len} bytes)",
            head.head_lsn
        ));
    }
    let mut buf = Vec::new();
    let txn = copy_ring(&sh.area, slot, lsn, len as usize, &mut buf)?;
    if txn.len() < TXN_HEADER || txn[..4] != [0; 4] {
        return bad("not an unsealed transaction".into());
    }
    let mut txn = txn.to_vec();
    txn[..4].copy_from_slice(&TXN_MAGIC.to_le_bytes());
    let s = log::scan(&txn, lsn, seq, ring);
    match (&s.stop, s.txns.as_slice()) {
        (Stop::End, [t]) if t.kind == KIND_COMMIT && t.len == len as usize => {
            let recs =
                log::records(&txn, t.nrec).map_err(|e| crate::util::einval(e.to_string()))?;
            let mut inos: Vec<u64> = recs
                .iter()
                .map(|r| match r {
                    Record::InodeSet { ino, .. }
                    | Record::Write { ino, .. }
                    | Record::Punch { ino, .. } => *ino,
                    Record::DirentSet { dir, .. } => *dir,
                })
                .collect();
            inos.sort_unstable();
            inos.dedup();
            Ok(inos)
        }
        (Stop::Invalid { why, .. }, _) => bad(why.clone()),
        _ => bad("not one commit transaction of the given length".into()),
    }
}

/// Seal the transaction at `lsn` of `slot`'s ring (checked by [`unsealed_writes`]):
/// write its magic and make it durable. From here the transaction is committed.
pub(crate) fn seal(sh: &Shared, slot: u32, lsn: u64) -> io::Result<()> {
    let off = sh.layout.ring_off(slot) as usize + (lsn % sh.layout.ring_bytes()) as usize;
    sh.area.map().write(off, &TXN_MAGIC.to_le_bytes())?;
    sh.area.map().persist(off, 4)
}

/// Free inode `ino` if it is an orphan: a file or symlink with `nlink = 0` that an
/// unlink kept because another client had it open (`Shared::pins`). Its blocks are
/// retired (reused once no reader can see them). Returns whether it was freed.
pub(crate) fn free_orphan(sh: &mut Shared, ino: u64) -> io::Result<bool> {
    let inode = sh.inode(ino)?;
    if inode.attrs.nlink != 0 || !matches!(inode.attrs.kind, Kind::File | Kind::Symlink) {
        return Ok(false);
    }
    let mut w = Work::default();
    retire_all(sh, &mut w, &inode)?;
    let free = Inode {
        generation: inode.generation,
        ..Default::default()
    };
    cairn_media::fence();
    sh.write_inode(ino, &free)?;
    cairn_media::fence();
    sh.inodes.mark_free(ino);
    sh.retire_and_advance(w.retired)?;
    Ok(true)
}
