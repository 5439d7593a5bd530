//! The overlay, as one owned type: what this client wrote that the shared area does not
//! have yet (attributes, data ranges pointing into the log, directory entries), per
//! inode, each change tagged with the LSN just past the transaction that made it. Reads
//! look here first; when the daemon's published head passes a tag, the change is in the
//! shared area and [`Overlay::digested_up_to`] drops it.
//!
//! Invariant (asserted when changes are added): every data range and directory entry of
//! an inode carries a tag no larger than the inode's own (the tag of its latest change),
//! so an entry whose tag the head passed has nothing left to say.
//!
//! Written ranges are indexed lazily: a write appends its range to a list, and the
//! interval map is brought up to date (the list replayed, oldest first) by the first
//! read that needs it. A client that writes and does not read back before the daemon
//! digests (a log of commits, a segment's redo) never pays for the index's cache misses;
//! the list is bounded by the log, since every entry is a record the daemon has not
//! digested yet.

use crate::extents::{Extents, Src};
use cairn_format::inode::{Attrs, Kind};
use std::cell::{Ref, RefCell};
use std::collections::HashMap;

/// A hasher for inode-number keys (multiplicative; inode numbers are not adversarial).
#[derive(Default, Clone, Copy)]
pub struct InoHasher(u64);

impl std::hash::Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by inode number.
pub type InoMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<InoHasher>>;

/// An overlay directory entry: `(ino, kind)` or `None` (removed), and its tag.
pub(crate) type DirOv = (Option<(u64, Kind)>, u64);

/// The undigested state of one inode.
pub(crate) struct InodeOv {
    pub(crate) gen: u64,
    pub(crate) attrs: Attrs,
    /// Tag (LSN just past the transaction) of the latest change of this inode. Every
    /// data range and directory entry below carries a tag no larger than this one.
    pub(crate) tag: u64,
    /// The written ranges (see [`Ranges`]).
    ranges: RefCell<Ranges>,
    /// Directory entries: name → (ino, kind), `None` for a removed name.
    pub(crate) dir: HashMap<Vec<u8>, DirOv>,
}

/// A written range not indexed yet: `[start, end)`, its source and tag.
#[derive(Clone, Copy)]
struct Pending {
    start: u64,
    end: u64,
    src: Src,
    tag: u64,
}

/// An inode's written ranges: the interval map, and the writes made since it was last
/// brought up to date (oldest first: replayed in order, a later write wins).
#[derive(Default)]
struct Ranges {
    ext: Extents,
    pending: Vec<Pending>,
}

impl Ranges {
    fn settle(&mut self) {
        for p in self.pending.drain(..) {
            self.ext.insert(p.start, p.end, p.src, p.tag);
        }
    }

    fn is_empty(&self) -> bool {
        self.ext.is_empty() && self.pending.is_empty()
    }

    fn clear(&mut self) {
        self.ext.clear();
        self.pending.clear();
    }

    /// How many ranges it holds without allocating (the larger of its two parts).
    fn room(&self) -> usize {
        self.ext.capacity().max(self.pending.capacity())
    }

    fn prune(&mut self, head: u64) {
        self.ext.prune(head);
        self.pending.retain(|p| p.tag > head);
    }
}

impl InodeOv {
    /// `[start, end)` of the file reads from `src` since the change tagged `tag` (made
    /// after the inode's own latest change was recorded, or by it). Indexed at the next
    /// read ([`InodeOv::extents`]).
    pub(crate) fn write(&mut self, start: u64, end: u64, src: Src, tag: u64) {
        debug_assert!(
            tag <= self.tag,
            "a range tagged {tag} on an inode tagged {}",
            self.tag
        );
        if start < end {
            let r = self.ranges.get_mut();
            r.pending.push(Pending {
                start,
                end,
                src,
                tag,
            });
        }
    }

    /// Whether any written range is undigested.
    pub(crate) fn has_data(&self) -> bool {
        !self.ranges.borrow().is_empty()
    }

    /// The written ranges, indexed. (Writes need `&mut self`, so while a `Ref` this
    /// returned lives, nothing is pending and no second call settles: the `RefCell` is
    /// only ever borrowed mutably with no `Ref` alive.)
    pub(crate) fn extents(&self) -> Ref<'_, Extents> {
        if !self.ranges.borrow().pending.is_empty() {
            self.ranges.borrow_mut().settle();
        }
        Ref::map(self.ranges.borrow(), |r| &r.ext)
    }

    /// Directory entry `name` is `e` (`None`: removed) since the change tagged `tag`,
    /// which is the directory's latest change.
    pub(crate) fn dirent(&mut self, name: Vec<u8>, e: Option<(u64, Kind)>, tag: u64) {
        debug_assert!(
            tag >= self.tag,
            "an entry tagged {tag} before the directory's latest change {}",
            self.tag
        );
        self.dir.insert(name, (e, tag));
        self.tag = tag;
    }
}

/// Ranges of dropped overlay entries kept for reuse, at most this many...
const SPARE_EXTENTS: usize = 32;
/// ... and only those indexing at most this many ranges (larger ones give their memory
/// back).
const SPARE_EXTENTS_MAX_RANGES: usize = 1 << 16;

/// The overlay (see the module documentation).
pub(crate) struct Overlay {
    inodes: InoMap<InodeOv>,
    /// Emptied interval maps for new entries.
    spare: Vec<Ranges>,
}

impl Overlay {
    pub(crate) fn new() -> Overlay {
        Overlay {
            inodes: InoMap::default(),
            spare: Vec::with_capacity(SPARE_EXTENTS),
        }
    }

    pub(crate) fn get(&self, ino: u64) -> Option<&InodeOv> {
        self.inodes.get(&ino)
    }

    pub(crate) fn get_mut(&mut self, ino: u64) -> Option<&mut InodeOv> {
        self.inodes.get_mut(&ino)
    }

    /// The entry of `ino` for a change tagged `tag`, created at generation `gen` with
    /// `attrs` if the overlay does not know the inode (with an interval map from the
    /// spares: the write path then does not allocate).
    fn entry(&mut self, ino: u64, gen: u64, attrs: Attrs, tag: u64) -> &mut InodeOv {
        let spare = &mut self.spare;
        let o = self.inodes.entry(ino).or_insert_with(|| {
            // The largest spare: which was recycled last depends on the order entries are
            // dropped in, and a smaller one taken for a busy file would have to grow.
            let largest = (0..spare.len()).max_by_key(|&i| spare[i].room());
            InodeOv {
                gen,
                attrs,
                tag,
                ranges: RefCell::new(largest.map(|i| spare.swap_remove(i)).unwrap_or_default()),
                dir: HashMap::new(),
            }
        });
        debug_assert!(
            tag >= o.tag,
            "inode {ino}: a change tagged {tag} after one tagged {}",
            o.tag
        );
        o
    }

    /// The entry of `ino` after a metadata change tagged `tag` left it at generation
    /// `gen` with `attrs`. An inode whose last link went (`nlink == 0`) has no data or
    /// entries left to show.
    pub(crate) fn set(&mut self, ino: u64, gen: u64, attrs: Attrs, tag: u64) -> &mut InodeOv {
        let o = self.entry(ino, gen, attrs, tag);
        o.gen = gen;
        o.attrs = attrs;
        o.tag = tag;
        if attrs.nlink == 0 {
            o.ranges.get_mut().clear();
            o.dir.clear();
        }
        o
    }

    /// The entry of `ino` after a write tagged `tag` left it with `attrs` (size, times;
    /// created at generation `gen` if the overlay did not know the inode); the caller
    /// adds the written ranges ([`InodeOv::write`]).
    pub(crate) fn written(&mut self, ino: u64, gen: u64, attrs: Attrs, tag: u64) -> &mut InodeOv {
        let o = self.entry(ino, gen, attrs, tag);
        o.attrs = attrs;
        o.tag = tag;
        o
    }

    /// Forget `ino` (its lease went: what the overlay said may be stale).
    pub(crate) fn forget(&mut self, ino: u64) {
        if let Some(o) = self.inodes.remove(&ino) {
            recycle(&mut self.spare, o);
        }
    }

    /// Forget everything (every lease went).
    pub(crate) fn clear(&mut self) {
        self.inodes.clear();
    }

    /// The daemon published everything up to `head`: drop the changes it passed, and
    /// the entries left with none.
    pub(crate) fn digested_up_to(&mut self, head: u64) {
        for (_, o) in self.inodes.extract_if(|_, o| o.tag <= head) {
            recycle(&mut self.spare, o);
        }
        for o in self.inodes.values_mut() {
            o.ranges.get_mut().prune(head);
            o.dir.retain(|_, e| e.1 > head);
        }
    }
}

/// Keep `o`'s ranges' room for reuse (emptied) in `spare`, within the limits above. Room
/// that never held a range (a directory's) is not kept: it would save nothing, and,
/// taken next by a busy file, it would have to grow.
fn recycle(spare: &mut Vec<Ranges>, o: InodeOv) {
    let mut r = o.ranges.into_inner();
    if spare.len() < SPARE_EXTENTS && r.room() > 0 && r.room() <= SPARE_EXTENTS_MAX_RANGES {
        r.clear();
        spare.push(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(nlink: u64) -> Attrs {
        Attrs {
            kind: Kind::File,
            nlink,
            ..Attrs::default()
        }
    }

    fn pieces(o: &InodeOv, end: u64) -> Vec<(u64, u64, Option<Src>)> {
        o.extents()
            .segments(0, end)
            .map(|s| (s.start, s.end, s.src))
            .collect()
    }

    #[test]
    fn writes_are_indexed_in_order_at_the_first_read() {
        let mut ov = Overlay::new();
        let o = ov.written(5, 1, file(1), 10);
        o.write(0, 8, Src::Log(100), 10);
        o.write(4, 12, Src::Log(200), 10);
        assert!(o.has_data());
        // The later write wins where they overlap.
        assert_eq!(
            pieces(o, 16),
            vec![
                (0, 4, Some(Src::Log(100))),
                (4, 12, Some(Src::Log(200))),
                (12, 16, None)
            ]
        );
        // Indexed once: writes after a read go on top.
        let o = ov.written(5, 1, file(1), 20);
        o.write(2, 6, Src::Zero, 20);
        assert_eq!(
            pieces(o, 12),
            vec![
                (0, 2, Some(Src::Log(100))),
                (2, 6, Some(Src::Zero)),
                (6, 12, Some(Src::Log(202)))
            ]
        );
    }

    #[test]
    fn a_digest_drops_pending_writes_it_passed() {
        let mut ov = Overlay::new();
        ov.written(5, 1, file(1), 10).write(0, 8, Src::Log(100), 10);
        let o = ov.written(5, 1, file(1), 20);
        o.write(16, 24, Src::Log(300), 20);
        ov.digested_up_to(10);
        let o = ov.get(5).expect("the write tagged 20 is not digested");
        assert_eq!(
            pieces(o, 24),
            vec![(0, 16, None), (16, 24, Some(Src::Log(300)))]
        );
        ov.digested_up_to(20);
        assert!(ov.get(5).is_none());
    }

    #[test]
    fn the_last_link_gone_drops_pending_writes() {
        let mut ov = Overlay::new();
        ov.written(5, 1, file(1), 10).write(0, 8, Src::Log(100), 10);
        let o = ov.set(5, 1, file(0), 11);
        assert!(!o.has_data());
        assert_eq!(pieces(o, 8), vec![(0, 8, None)]);
    }
}
