//! The overlay, as one owned type: what this client wrote that the shared area does not
//! have yet (attributes, data ranges pointing into the log, directory entries), per
//! inode, each change tagged with the LSN just past the transaction that made it. Reads
//! look here first; when the daemon's published head passes a tag, the change is in the
//! shared area and [`Overlay::digested_up_to`] drops it.
//!
//! Invariant (asserted when changes are added): every data range and directory entry of
//! an inode carries a tag no larger than the inode's own (the tag of its latest change),
//! so an entry whose tag the head passed has nothing left to say.

use crate::extents::{Extents, Src};
use cairn_format::inode::{Attrs, Kind};
use std::collections::HashMap;

/// A hasher for inode-number keys (multiplicative; inode numbers are not adversarial).
#[derive(Default, Clone, Copy)]
pub(crate) struct InoHasher(u64);

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
pub(crate) type InoMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<InoHasher>>;

/// An overlay directory entry: `(ino, kind)` or `None` (removed), and its tag.
pub(crate) type DirOv = (Option<(u64, Kind)>, u64);

/// The undigested state of one inode.
pub(crate) struct InodeOv {
    pub(crate) gen: u64,
    pub(crate) attrs: Attrs,
    /// Tag (LSN just past the transaction) of the latest change of this inode. Every
    /// data range and directory entry below carries a tag no larger than this one.
    pub(crate) tag: u64,
    pub(crate) ext: Extents,
    /// Directory entries: name → (ino, kind), `None` for a removed name.
    pub(crate) dir: HashMap<Vec<u8>, DirOv>,
}

impl InodeOv {
    /// `[start, end)` of the file reads from `src` since the change tagged `tag` (made
    /// after the inode's own latest change was recorded, or by it).
    pub(crate) fn write(&mut self, start: u64, end: u64, src: Src, tag: u64) {
        debug_assert!(
            tag <= self.tag,
            "a range tagged {tag} on an inode tagged {}",
            self.tag
        );
        self.ext.insert(start, end, src, tag);
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

/// Interval maps of dropped overlay entries kept for reuse, at most this many...
const SPARE_EXTENTS: usize = 32;
/// ... and only those indexing at most this many ranges (larger ones give their memory
/// back).
const SPARE_EXTENTS_MAX_RANGES: usize = 1 << 16;

/// The overlay (see the module documentation).
pub(crate) struct Overlay {
    inodes: InoMap<InodeOv>,
    /// Emptied interval maps for new entries.
    spare: Vec<Extents>,
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
            let largest = (0..spare.len()).max_by_key(|&i| spare[i].capacity());
            InodeOv {
                gen,
                attrs,
                tag,
                ext: largest.map(|i| spare.swap_remove(i)).unwrap_or_default(),
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
            o.ext.clear();
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
            o.ext.prune(head);
            o.dir.retain(|_, e| e.1 > head);
        }
    }
}

/// Keep `o`'s interval map for reuse (emptied) in `spare`, within the limits above. A
/// map that never held a range (a directory's) is not kept: it would save nothing, and,
/// taken next by a busy file, it would have to grow.
fn recycle(spare: &mut Vec<Extents>, o: InodeOv) {
    let mut ext = o.ext;
    if spare.len() < SPARE_EXTENTS
        && ext.capacity() > 0
        && ext.capacity() <= SPARE_EXTENTS_MAX_RANGES
    {
        ext.clear();
        spare.push(ext);
    }
}
