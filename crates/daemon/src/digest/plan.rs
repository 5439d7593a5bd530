//! The plan of a batch: records folded per inode (last `INODE_SET` wins, `WRITE`s in an
//! interval map that truncations cut and punches clear) and per (directory, name) (last
//! `DIRENT_SET` wins).

use super::PErr;
use crate::store::shared::Shared;
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::log::{self, Record};
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use std::collections::BTreeMap;

/// A contiguous range of pending file data, borrowed from the batch copy.
/// The zeros a `PUNCH` writes into the partial blocks at its ends.
pub(super) static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

#[derive(Debug, Clone, Copy)]
pub(super) struct Piece<'a> {
    pub(super) end: u64,
    pub(super) data: &'a [u8],
    pub(super) rec: usize,
}

/// Pending writes of one file: non-overlapping ranges, later writes win.
///
/// Writes are logged first and resolved into the map in one pass ([`Intervals::settle`],
/// at the end of planning, or before a truncation or punch changes the map): a batch of
/// tens of thousands of small writes spent most of its planning in one map search and
/// insert per write, with the core lock held.
#[derive(Debug, Default)]
pub(super) struct Intervals<'a> {
    map: BTreeMap<u64, Piece<'a>>,
    /// Writes not in `map` yet, in log order: `(start, data, record)`.
    log: Vec<(u64, &'a [u8], usize)>,
}

impl<'a> Intervals<'a> {
    pub(super) fn insert(&mut self, start: u64, data: &'a [u8], rec: usize) {
        debug_assert!(!data.is_empty());
        self.log.push((start, data, rec));
    }

    /// Put one write into the map over what it overlaps.
    fn put(&mut self, start: u64, data: &'a [u8], rec: usize) {
        let end = start + data.len() as u64;
        self.remove(start, end);
        self.map.insert(start, Piece { end, data, rec });
    }

    /// Resolve the logged writes into the map. Into an empty map (the usual case: no
    /// truncation or punch settled it earlier in the batch), sorted by start: a write
    /// that a later one at the same start covers whole is dropped (a batch of commits
    /// rewrites one commit-sequence word thousands of times), those that overlap no
    /// other go in by position, all at once, and the rest one by one in log order, a
    /// later write winning. Into a map already holding pieces, every write is put in
    /// log order.
    pub(super) fn settle(&mut self) {
        if self.log.is_empty() {
            return;
        }
        let mut log = std::mem::take(&mut self.log);
        if !self.map.is_empty() {
            for (start, data, rec) in log {
                self.put(start, data, rec);
            }
            return;
        }
        // By start, then log order (the keys are distinct: an unstable sort, in place).
        log.sort_unstable_by_key(|w| (w.0, w.2));
        let mut kept = Vec::with_capacity(log.len());
        for same_start in log.chunk_by(|a, b| a.0 == b.0) {
            let mut longest = 0;
            for w in same_start.iter().rev() {
                if w.1.len() > longest {
                    longest = w.1.len();
                    kept.push(*w);
                }
            }
        }
        let end = |w: &(u64, &[u8], usize)| w.0 + w.1.len() as u64;
        let (mut by_pos, mut rest) = (Vec::with_capacity(kept.len()), Vec::new());
        let mut reach = 0;
        for (i, w) in kept.iter().enumerate() {
            // Alone: no earlier write reaches past its start, the next starts at or
            // after its end.
            let alone = w.0 >= reach && kept.get(i + 1).is_none_or(|n| n.0 >= end(w));
            reach = reach.max(end(w));
            if alone {
                let (end, data, rec) = (end(w), w.1, w.2);
                by_pos.push((w.0, Piece { end, data, rec }));
            } else {
                rest.push(*w);
            }
        }
        // Sorted and distinct keys: built in one pass.
        self.map = by_pos.into_iter().collect();
        rest.sort_by_key(|w| w.2);
        for (start, data, rec) in rest {
            self.put(start, data, rec);
        }
    }

    /// The pieces by start (settled: [`Intervals::settle`] ran since the last insert).
    pub(super) fn pieces(&self) -> &BTreeMap<u64, Piece<'a>> {
        assert!(
            self.log.is_empty(),
            "pending writes read before they were settled"
        );
        &self.map
    }

    /// Drop `[start, end)` (splitting the pieces across its ends).
    pub(super) fn remove(&mut self, start: u64, end: u64) {
        self.settle();
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
    pub(super) fn cut(&mut self, at: u64) {
        self.settle();
        drop(self.map.split_off(&at));
        if let Some((&k, p)) = self.map.range_mut(..at).next_back() {
            if p.end > at {
                p.data = &p.data[..(at - k) as usize];
                p.end = at;
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.map.clear();
        self.log.clear();
    }

    /// Pieces overlapping `[s, e)`, in order: the one starting before `s` that reaches
    /// into it (pieces never overlap: at most one), then those starting inside it. (The
    /// digest cuts all pieces at block boundaries in one pass instead; checked builds
    /// compare its cut with this per block.)
    pub(super) fn overlapping(&self, s: u64, e: u64) -> impl Iterator<Item = (u64, &Piece<'a>)> {
        let map = self.pieces();
        let first = map.range(..s).next_back().filter(|(_, p)| p.end > s);
        first
            .into_iter()
            .chain(map.range(s..e.max(s)))
            .map(|(k, p)| (*k, p))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    /// Free in the shared area and not (yet) created by the batch.
    Free,
    Live,
    /// Freed by the batch (`nlink = 0`).
    Freed,
}

/// The folded effect of a batch on one inode.
pub(super) struct InodePlan<'a> {
    pub(super) base: Inode,
    pub(super) base_live: bool,
    pub(super) life: Life,
    /// Became live inside the batch (from free): a new generation, no old content.
    pub(super) created: bool,
    pub(super) attrs: Attrs,
    /// Last `INODE_SET`.
    pub(super) set_rec: Option<usize>,
    /// Last record that set attributes without surviving data otherwise (an empty
    /// `WRITE` after the last `INODE_SET`).
    pub(super) attr_rec: Option<usize>,
    pub(super) pending: Intervals<'a>,
    /// Whole file blocks `[start, end)` punched by the batch: their old content is
    /// dropped (a later write of the batch starts from zeros).
    pub(super) holes: Vec<(u64, u64)>,
    pub(super) cur_size: u64,
    /// Smallest size seen: old content at and beyond it is dropped.
    pub(super) keep: Option<u64>,
    /// A record that makes no sense unless the inode ends up free.
    pub(super) bad: Option<String>,
}

impl InodePlan<'_> {
    pub(super) fn new(base: Inode) -> Self {
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

    pub(super) fn truncate(&mut self, size: u64) {
        if size < self.cur_size {
            self.pending.cut(size);
            self.keep = Some(self.keep.map_or(size, |k| k.min(size)));
        }
    }

    /// `PUNCH` of `[off, off + len)` (record `rec`): pending writes there are dropped,
    /// whole blocks become holes, partial blocks at the ends are overwritten with zeros.
    pub(super) fn punch(&mut self, off: u64, len: u64, rec: usize) {
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

    pub(super) fn in_hole(&self, fb: u64) -> bool {
        self.holes.iter().any(|&(s, e)| s <= fb && fb < e)
    }

    /// Forget the data of the batch (the inode was freed or created anew).
    pub(super) fn clear_data(&mut self) {
        self.pending.clear();
        self.holes.clear();
    }
}

pub(super) struct Plan<'a> {
    /// The slot whose log is digested.
    pub(super) slot: u32,
    pub(super) inodes: BTreeMap<u64, InodePlan<'a>>,
    pub(super) dirents: BTreeMap<(u64, &'a [u8]), (u64, Kind, usize)>,
    pub(super) nrec: usize,
    pub(super) charge: u64,
}

impl<'a> Plan<'a> {
    pub(super) fn get(&mut self, sh: &Shared, ino: u64) -> Result<&mut InodePlan<'a>, PErr> {
        if !sh.layout.ino_valid(ino) {
            return Err(PErr::Bad(format!("inode number {ino} out of range")));
        }
        if let std::collections::btree_map::Entry::Vacant(v) = self.inodes.entry(ino) {
            v.insert(InodePlan::new(sh.inode(ino)?));
        }
        Ok(self.inodes.get_mut(&ino).unwrap())
    }

    pub(super) fn fold(&mut self, sh: &Shared, idx: usize, rec: Record<'a>) -> Result<(), PErr> {
        match rec {
            Record::InodeSet { ino, attrs, .. } => self.fold_inode_set(sh, idx, ino, attrs),
            Record::Write {
                ino,
                offset,
                size,
                mtime,
                data,
            } => self.fold_write(sh, idx, ino, offset, size, mtime, data),
            Record::Punch {
                ino,
                offset,
                len,
                mtime,
            } => self.fold_punch(sh, idx, ino, offset, len, mtime),
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
                Ok(())
            }
        }
    }

    /// `INODE_SET`: a new inode, new attributes, or (`nlink = 0`) freed unless a pin
    /// (a client has it open) or its own unnamed file keeps it.
    fn fold_inode_set(
        &mut self,
        sh: &Shared,
        idx: usize,
        ino: u64,
        attrs: Attrs,
    ) -> Result<(), PErr> {
        let me = self.slot;
        let pinned = sh.keep_unlinked || sh.pins.get(&ino).is_some_and(|s| !s.is_empty());
        let mine = sh.pinned_by(ino, me);
        let p = self.get(sh, ino)?;
        if attrs.kind == Kind::Free {
            return Err(PErr::Bad(format!(
                "INODE_SET of inode {ino} with kind free"
            )));
        }
        // Unlinked while a client (this one or another) has it open: kept (an
        // orphan with `nlink = 0`) until the last pin goes. So is an unnamed file
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
        Ok(())
    }

    /// `WRITE`: data into the interval map (an empty one sets only size and times).
    #[allow(clippy::too_many_arguments)]
    fn fold_write(
        &mut self,
        sh: &Shared,
        idx: usize,
        ino: u64,
        offset: u64,
        size: u64,
        mtime: i64,
        data: &'a [u8],
    ) -> Result<(), PErr> {
        self.charge += log::write_charge(offset, data.len() as u64);
        let p = self.get(sh, ino)?;
        if p.life != Life::Live {
            p.bad
                .get_or_insert_with(|| format!("WRITE to free inode {ino}"));
            return Ok(());
        }
        if !matches!(p.attrs.kind, Kind::File | Kind::Symlink) {
            p.bad
                .get_or_insert_with(|| format!("WRITE to inode {ino}, a {:?}", p.attrs.kind));
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
        Ok(())
    }

    /// `PUNCH`: a hole in a regular file.
    fn fold_punch(
        &mut self,
        sh: &Shared,
        idx: usize,
        ino: u64,
        offset: u64,
        len: u64,
        mtime: i64,
    ) -> Result<(), PErr> {
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SPAN: u64 = 96;

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, u64),
        Remove(u64, u64),
        Cut(u64),
        Settle,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..SPAN, 1..24u64).prop_map(|(s, l)| Op::Write(s, l)),
            1 => (0..SPAN, 1..24u64).prop_map(|(s, l)| Op::Remove(s, l)),
            1 => (0..SPAN).prop_map(Op::Cut),
            1 => Just(Op::Settle),
        ]
    }

    proptest! {
        /// Any sequence of writes, removals, cuts and settles leaves the pieces a byte
        /// model says: each byte from the last write over it, unless removed or cut
        /// since; pieces never overlap.
        #[test]
        fn settled_pieces_match_a_byte_model(ops in proptest::collection::vec(op(), 1..60)) {
            // Each write's bytes are its record number, so a byte names its writer.
            let bytes: Vec<Vec<u8>> = (0..ops.len()).map(|i| vec![i as u8; 24]).collect();
            let mut iv = Intervals::default();
            let mut model: Vec<Option<usize>> = vec![None; (SPAN + 24) as usize];
            for (rec, o) in ops.iter().enumerate() {
                match *o {
                    Op::Write(s, l) => {
                        iv.insert(s, &bytes[rec][..l as usize], rec);
                        for b in s..s + l {
                            model[b as usize] = Some(rec);
                        }
                    }
                    Op::Remove(s, l) => {
                        iv.remove(s, s + l);
                        for b in s..s + l {
                            model[b as usize] = None;
                        }
                    }
                    Op::Cut(at) => {
                        iv.cut(at);
                        for m in &mut model[at as usize..] {
                            *m = None;
                        }
                    }
                    Op::Settle => iv.settle(),
                }
            }
            iv.settle();
            let mut got: Vec<Option<usize>> = vec![None; model.len()];
            let mut last_end = 0;
            for (&s, p) in iv.pieces() {
                prop_assert!(s >= last_end, "pieces overlap at {s}");
                prop_assert_eq!(p.data.len() as u64, p.end - s);
                for (i, &d) in p.data.iter().enumerate() {
                    prop_assert_eq!(d as usize, p.rec, "a piece's bytes are its record's");
                    got[s as usize + i] = Some(p.rec);
                }
                last_end = p.end;
            }
            prop_assert_eq!(got, model);
            // `overlapping` is the pieces that meet the range, in order.
            for s in (0..SPAN).step_by(7) {
                for e in [s, s + 1, s + 9, s + 40] {
                    let want: Vec<u64> = (iv.pieces().iter())
                        .filter(|(&k, p)| k < e && p.end > s)
                        .map(|(&k, _)| k)
                        .collect();
                    let got: Vec<u64> = iv.overlapping(s, e).map(|(k, _)| k).collect();
                    prop_assert_eq!(got, want, "overlapping({}, {})", s, e);
                }
            }
        }
    }
}
