//! DRAM allocators of the shared area: a bitmap over the data region (next-fit, so
//! consecutive allocations form sequential runs) and a bitmap over the inode table with
//! per-client reservations.
//!
//! The data region is also seen as 2 MiB chunks (512 blocks aligned to 2 MiB within the
//! NVM file; the partial chunks at its ends are never whole). A whole chunk with no block
//! in use is a free superpage extent ([`BlockAlloc::alloc_extent`]). 4 KiB allocations
//! keep free extents whole where they can: they take blocks of chunks already in use
//! first and break into an empty chunk only when no other block is free.

use std::collections::HashMap;

/// A fixed-size bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bitmap {
    words: Vec<u64>,
    len: u64,
}

impl Bitmap {
    /// `len` clear bits.
    pub(crate) fn new(len: u64) -> Bitmap {
        Bitmap {
            words: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }

    /// Number of bits.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn get(&self, i: u64) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub(crate) fn set(&mut self, i: u64) {
        self.words[(i / 64) as usize] |= 1 << (i % 64);
    }

    pub(crate) fn clear(&mut self, i: u64) {
        self.words[(i / 64) as usize] &= !(1 << (i % 64));
    }

    /// Number of set bits.
    pub(crate) fn count_ones(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// First clear bit at or after `start`, wrapping around once.
    pub(crate) fn find_clear_from(&self, start: u64) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let start = if start >= self.len { 0 } else { start };
        let nwords = self.words.len();
        let first = (start / 64) as usize;
        for k in 0..=nwords {
            let wi = (first + k) % nwords;
            let mut w = self.words[wi];
            if k == 0 {
                // Ignore bits below `start` in the first word.
                w |= (1u64 << (start % 64)) - 1;
            }
            if k == nwords {
                // Second visit of the first word: only the bits below `start`.
                w = self.words[wi] | !((1u64 << (start % 64)) - 1);
            }
            if w != u64::MAX {
                let i = wi as u64 * 64 + (!w).trailing_zeros() as u64;
                if i < self.len {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Last clear bit at or before `start`, wrapping around once (to the end).
    pub(crate) fn find_clear_before(&self, start: u64) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let start = start.min(self.len - 1);
        let nwords = self.words.len();
        let first = (start / 64) as usize;
        // Bits above `start` in its word are ignored on the first visit, bits at or
        // below it on the second.
        let above = if start % 64 == 63 {
            0
        } else {
            !0u64 << (start % 64 + 1)
        };
        for k in 0..=nwords {
            let wi = (first + nwords - k % nwords) % nwords;
            let mut w = self.words[wi];
            if k == 0 {
                w |= above;
            }
            if k == nwords {
                w |= !above;
            }
            if wi == nwords - 1 && !self.len.is_multiple_of(64) {
                // Bits past `len` are not blocks.
                w |= !0u64 << (self.len % 64);
            }
            if w != u64::MAX {
                return Some(wi as u64 * 64 + 63 - (!w).leading_zeros() as u64);
            }
        }
        None
    }

    /// Bytes, bit `i` = byte `i / 8`, bit `i % 8` (LSB first).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let n = self.len.div_ceil(8) as usize;
        let mut out = Vec::with_capacity(n);
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.truncate(n);
        out
    }

    /// The inverse of `to_bytes` (bits beyond `len` are ignored).
    pub(crate) fn from_bytes(b: &[u8], len: u64) -> Bitmap {
        let mut m = Bitmap::new(len);
        for (i, w) in m.words.iter_mut().enumerate() {
            let mut x = [0u8; 8];
            let s = i * 8;
            let e = (s + 8).min(b.len());
            if s < e {
                x[..e - s].copy_from_slice(&b[s..e]);
            }
            *w = u64::from_le_bytes(x);
        }
        if !len.is_multiple_of(64) {
            if let Some(last) = m.words.last_mut() {
                *last &= (1u64 << (len % 64)) - 1;
            }
        }
        m
    }
}

/// Blocks of a chunk (a superpage extent).
const CHUNK: u64 = cairn_format::map::HUGE_BLOCKS;

/// The data-block allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockAlloc {
    map: Bitmap,
    data_start: u64,
    free: u64,
    cursor: u64,
    /// The first whole chunk (absolute block number / 512).
    first_chunk: u64,
    /// Blocks in use in each whole chunk.
    chunk_used: Vec<u16>,
    /// Whole chunks with no block in use.
    free_extents: u64,
    /// Where the search for a free extent resumes (chunk index).
    extent_cursor: usize,
    /// Where the downward search for a metadata block resumes (bitmap index).
    meta_cursor: u64,
    /// Whether each whole chunk in use was started by a metadata allocation (DRAM only:
    /// after a start every chunk counts as data until it empties).
    chunk_meta: Vec<bool>,
}

impl BlockAlloc {
    /// All `data_blocks` blocks from `data_start` free.
    pub(crate) fn new(data_start: u64, data_blocks: u64) -> BlockAlloc {
        BlockAlloc::from_bitmap(data_start, Bitmap::new(data_blocks))
    }

    /// From a saved bitmap.
    pub(crate) fn from_bitmap(data_start: u64, map: Bitmap) -> BlockAlloc {
        let free = map.len() - map.count_ones();
        let first_chunk = data_start.div_ceil(CHUNK);
        let end_chunk = (data_start + map.len()) / CHUNK;
        let mut a = BlockAlloc {
            map,
            data_start,
            free,
            cursor: 0,
            first_chunk,
            chunk_used: vec![0; end_chunk.saturating_sub(first_chunk) as usize],
            free_extents: 0,
            extent_cursor: 0,
            meta_cursor: u64::MAX,
            chunk_meta: Vec::new(),
        };
        for c in 0..a.chunk_used.len() {
            let first = (first_chunk + c as u64) * CHUNK - data_start;
            a.chunk_used[c] = (first..first + CHUNK).filter(|&i| a.map.get(i)).count() as u16;
        }
        a.free_extents = a.chunk_used.iter().filter(|&&u| u == 0).count() as u64;
        a.chunk_meta = vec![false; a.chunk_used.len()];
        a
    }

    /// The whole chunk holding bitmap index `i`, if any.
    fn chunk_of(&self, i: u64) -> Option<usize> {
        let c = ((self.data_start + i) / CHUNK).checked_sub(self.first_chunk)? as usize;
        (c < self.chunk_used.len()).then_some(c)
    }

    /// Account for bit `i` set (`used`) or cleared.
    fn count(&mut self, i: u64, used: bool) {
        if let Some(c) = self.chunk_of(i) {
            let u = &mut self.chunk_used[c];
            if used {
                if *u == 0 {
                    self.free_extents -= 1;
                }
                *u += 1;
            } else {
                *u -= 1;
                if *u == 0 {
                    self.free_extents += 1;
                }
            }
        }
    }

    /// Free superpage extents (whole chunks with no block in use).
    pub(crate) fn free_extents(&self) -> u64 {
        self.free_extents
    }

    /// Whole chunks of the data region (the superpage extents it could hold).
    pub(crate) fn extent_capacity(&self) -> u64 {
        self.chunk_used.len() as u64
    }

    /// Blocks in use in each whole chunk, by chunk (first block of each:
    /// [`BlockAlloc::chunk_first`]).
    pub(crate) fn chunk_usage(&self) -> &[u16] {
        &self.chunk_used
    }

    /// The first block of whole chunk `c`.
    pub(crate) fn chunk_first(&self, c: usize) -> u64 {
        (self.first_chunk + c as u64) * CHUNK
    }

    /// A free superpage extent, taken whole: its first block (a multiple of 512), or
    /// `None` when no whole chunk is free.
    pub(crate) fn alloc_extent(&mut self) -> Option<u64> {
        let n = self.chunk_used.len();
        if self.free_extents == 0 || n == 0 {
            return None;
        }
        let c = (0..n)
            .map(|k| (self.extent_cursor + k) % n)
            .find(|&c| self.chunk_used[c] == 0)?;
        let first = self.chunk_first(c);
        for b in first..first + CHUNK {
            self.map.set(b - self.data_start);
        }
        self.chunk_used[c] = CHUNK as u16;
        self.chunk_meta[c] = false;
        self.free_extents -= 1;
        self.free -= CHUNK;
        self.extent_cursor = (c + 1) % n;
        Some(first)
    }

    /// The first free bit at or after `from` (or, `!forward`, at or before it; one lap)
    /// whose chunk `ok` accepts (`None`: a block outside the whole chunks), if any.
    /// A chunk refused is skipped whole.
    fn search(
        &self,
        from: u64,
        forward: bool,
        ok: &dyn Fn(&Self, Option<usize>) -> bool,
    ) -> Option<u64> {
        let len = self.map.len();
        let mut pos = from.min(len.saturating_sub(1));
        let mut travelled = 0u64;
        while travelled <= len {
            let i = if forward {
                self.map.find_clear_from(pos)?
            } else {
                self.map.find_clear_before(pos)?
            };
            travelled += 1 + match (forward, i >= pos) {
                (true, true) => i - pos,
                (true, false) => len - pos + i,
                (false, false) | (false, true) if i <= pos => pos - i,
                (false, _) => pos + len - i,
            };
            let c = self.chunk_of(i);
            if ok(self, c) {
                return Some(i);
            }
            // Past this chunk (or block).
            let (lo, hi) = match c {
                Some(c) => {
                    let lo = self.chunk_first(c) - self.data_start;
                    (lo, lo + CHUNK)
                }
                None => (i, i + 1),
            };
            if forward {
                travelled += hi - 1 - i;
                pos = if hi >= len { 0 } else { hi };
            } else {
                travelled += i - lo;
                pos = if lo == 0 { len - 1 } else { lo - 1 };
            }
        }
        None
    }

    /// Take a free block for data (`!meta`: upwards from the data cursor) or metadata
    /// (downwards from the metadata cursor): first in a chunk of the same kind already in
    /// use (or outside the whole chunks), else in an empty chunk (which takes that kind:
    /// a free extent is broken only when needed), else anywhere.
    fn take(&mut self, meta: bool) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        let forward = !meta;
        let from = if meta { self.meta_cursor } else { self.cursor };
        let i = self
            .search(from, forward, &|a, c| {
                c.is_none_or(|c| a.chunk_used[c] > 0 && a.chunk_meta[c] == meta)
            })
            .or_else(|| {
                self.search(from, forward, &|a, c| {
                    c.is_some_and(|c| a.chunk_used[c] == 0)
                })
            })
            .or_else(|| {
                if forward {
                    self.map.find_clear_from(from)
                } else {
                    self.map.find_clear_before(from)
                }
            })?;
        debug_assert!(!self.map.get(i), "block {i} handed out twice");
        if let Some(c) = self.chunk_of(i) {
            if self.chunk_used[c] == 0 {
                self.chunk_meta[c] = meta;
            }
        }
        self.map.set(i);
        self.count(i, true);
        self.free -= 1;
        if meta {
            self.meta_cursor = i.checked_sub(1).unwrap_or(u64::MAX);
        } else {
            self.cursor = i + 1;
        }
        Some(self.data_start + i)
    }

    /// A block for metadata (map nodes, directory buckets): taken from the end of the
    /// data region downwards, in chunks of its own ([`BlockAlloc::take`]), so that the
    /// chunks holding file data stay movable by compaction (`crate::superpage::compact`).
    pub(crate) fn alloc_meta(&mut self) -> Option<u64> {
        self.take(true)
    }

    pub(crate) fn bitmap(&self) -> &Bitmap {
        &self.map
    }

    /// Blocks in the data region.
    pub(crate) fn capacity(&self) -> u64 {
        self.map.len()
    }

    /// Free blocks.
    pub(crate) fn free_count(&self) -> u64 {
        self.free
    }

    /// Break the free count (tests of the checks).
    #[cfg(test)]
    pub(crate) fn skew_free_count_for_test(&mut self) {
        self.free += 1;
    }

    /// The free count kept, and the one the bitmap gives (a scan: for checks).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.free, self.map.len() - self.map.count_ones())
    }

    /// Next free block for file data after the previous allocation (sequential runs),
    /// in chunks of data ([`BlockAlloc::take`]), `None` when full.
    pub(crate) fn alloc(&mut self) -> Option<u64> {
        self.take(false)
    }

    fn index(&self, blk: u64) -> Option<u64> {
        blk.checked_sub(self.data_start)
            .filter(|&i| i < self.map.len())
    }

    /// Whether `blk` is allocated.
    pub(crate) fn is_used(&self, blk: u64) -> bool {
        self.index(blk).is_some_and(|i| self.map.get(i))
    }

    /// Free `blk`; false if it was not allocated (or is outside the region).
    pub(crate) fn free(&mut self, blk: u64) -> bool {
        match self.index(blk) {
            Some(i) if self.map.get(i) => {
                self.map.clear(i);
                self.count(i, false);
                self.free += 1;
                true
            }
            _ => false,
        }
    }

    /// Mark `blk` allocated (rebuild); false if it already was or is outside the region.
    pub(crate) fn mark_used(&mut self, blk: u64) -> bool {
        match self.index(blk) {
            Some(i) if !self.map.get(i) => {
                self.map.set(i);
                self.count(i, true);
                self.free -= 1;
                true
            }
            _ => false,
        }
    }
}

/// The inode allocator: which inode numbers are live in the shared area, and which free
/// ones are reserved for which client (log slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InodeAlloc {
    map: Bitmap,
    reserved: HashMap<u64, u32>,
    cursor: u64,
}

impl InodeAlloc {
    /// Inode 0 (never used) and the root (1) in use.
    pub(crate) fn new(count: u64) -> InodeAlloc {
        let mut map = Bitmap::new(count);
        map.set(0);
        map.set(cairn_format::ROOT_INO);
        InodeAlloc::from_bitmap(map)
    }

    pub(crate) fn from_bitmap(mut map: Bitmap) -> InodeAlloc {
        if map.len() > 0 {
            map.set(0);
        }
        InodeAlloc {
            map,
            reserved: HashMap::new(),
            cursor: 2,
        }
    }

    pub(crate) fn bitmap(&self) -> &Bitmap {
        &self.map
    }

    /// Usable inode numbers (1 ..= count - 1).
    pub(crate) fn capacity(&self) -> u64 {
        self.map.len().saturating_sub(1)
    }

    /// Live inodes (the root included).
    pub(crate) fn used_count(&self) -> u64 {
        self.map.count_ones().saturating_sub(1)
    }

    pub(crate) fn is_used(&self, ino: u64) -> bool {
        self.map.get(ino)
    }

    pub(crate) fn mark_used(&mut self, ino: u64) {
        if ino < self.map.len() {
            self.map.set(ino);
            self.reserved.remove(&ino);
        }
    }

    pub(crate) fn mark_free(&mut self, ino: u64) {
        if ino > cairn_format::ROOT_INO && ino < self.map.len() {
            self.map.clear(ino);
        }
    }

    /// The slot that holds a reservation on `ino`.
    pub(crate) fn reserved_by(&self, ino: u64) -> Option<u32> {
        self.reserved.get(&ino).copied()
    }

    /// Give up `slot`'s reservation of `ino` (a number it used and freed unpublished).
    pub(crate) fn unreserve(&mut self, slot: u32, ino: u64) {
        if self.reserved.get(&ino) == Some(&slot) {
            self.reserved.remove(&ino);
        }
    }

    /// Reserve `ino` for `slot` if it is free and unreserved.
    pub(crate) fn reserve_one(&mut self, slot: u32, ino: u64) -> bool {
        if ino <= cairn_format::ROOT_INO || ino >= self.map.len() || self.map.get(ino) {
            return false;
        }
        match self.reserved.get(&ino) {
            Some(&s) => s == slot,
            None => {
                self.reserved.insert(ino, slot);
                true
            }
        }
    }

    /// Reserve up to `count` free inode numbers for `slot`.
    pub(crate) fn reserve(&mut self, slot: u32, count: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let len = self.map.len();
        let mut pos = self.cursor;
        let mut scanned = 0u64;
        while (out.len() as u64) < count && scanned < len {
            let Some(i) = self.map.find_clear_from(pos) else {
                break;
            };
            // Distance travelled (with wrap-around) bounds the search to one lap.
            scanned += if i >= pos {
                i - pos + 1
            } else {
                len - pos + i + 1
            };
            pos = i + 1;
            if i > cairn_format::ROOT_INO && !self.reserved.contains_key(&i) {
                self.reserved.insert(i, slot);
                out.push(i);
            }
        }
        self.cursor = pos;
        out
    }

    /// Drop every reservation of `slot`.
    pub(crate) fn release_slot(&mut self, slot: u32) {
        self.reserved.retain(|_, s| *s != slot);
    }

    /// Reservations held by `slot`.
    #[cfg(test)]
    pub(crate) fn reserved_count(&self, slot: u32) -> usize {
        self.reserved.values().filter(|&&s| s == slot).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_find_and_bytes() {
        let mut m = Bitmap::new(130);
        for i in 0..130 {
            if i != 5 && i != 129 {
                m.set(i);
            }
        }
        assert_eq!(m.find_clear_from(0), Some(5));
        assert_eq!(m.find_clear_from(6), Some(129));
        assert_eq!(m.find_clear_from(129), Some(129));
        m.set(129);
        assert_eq!(m.find_clear_from(100), Some(5), "wraps around");
        m.set(5);
        assert_eq!(m.find_clear_from(7), None);
        let b = m.to_bytes();
        assert_eq!(b.len(), 17);
        assert_eq!(Bitmap::from_bytes(&b, 130), m);
        assert_eq!(m.count_ones(), 130);
        let mut m = Bitmap::new(130);
        for i in 0..130 {
            if i != 5 && i != 70 {
                m.set(i);
            }
        }
        assert_eq!(m.find_clear_before(129), Some(70));
        assert_eq!(m.find_clear_before(70), Some(70));
        assert_eq!(m.find_clear_before(69), Some(5));
        assert_eq!(m.find_clear_before(4), Some(70), "wraps around to the end");
        assert_eq!(m.find_clear_before(u64::MAX), Some(70));
        m.set(5);
        m.set(70);
        assert_eq!(m.find_clear_before(100), None);
    }

    #[test]
    fn block_alloc_is_sequential_and_counts() {
        let mut a = BlockAlloc::new(1000, 200);
        let run: Vec<u64> = (0..10).map(|_| a.alloc().unwrap()).collect();
        assert_eq!(run, (1000..1010).collect::<Vec<_>>());
        assert_eq!(a.free_count(), 190);
        assert!(a.free(1003));
        assert!(!a.free(1003), "double free is refused");
        assert!(!a.free(5), "outside the region");
        // Next-fit: continues after the last allocation, not at the hole.
        assert_eq!(a.alloc(), Some(1010));
        while a.alloc().is_some() {}
        assert_eq!(a.free_count(), 0);
        assert!(a.free(1100));
        assert_eq!(a.alloc(), Some(1100));
        assert_eq!(a.alloc(), None);
        let b = BlockAlloc::from_bitmap(1000, a.bitmap().clone());
        assert_eq!(b.free_count(), 0);
        assert!(b.is_used(1003));
    }

    #[test]
    fn extents_are_aligned_whole_chunks_kept_whole_by_small_allocations() {
        // Data region 1000..1000+3000: whole chunks at 1024, 1536, 2048, 2560, 3072,
        // 3584 (6); blocks 1000..1024 and 3584+512=4096 > 4000, so 3584 is not whole:
        // 5 whole chunks (1024..3584).
        let mut a = BlockAlloc::new(1000, 3000);
        assert_eq!(a.extent_capacity(), 5);
        assert_eq!(a.free_extents(), 5);
        // Small allocations take the unaligned head (1000..1024) first, then the tail
        // beyond the last whole chunk, before breaking into a whole one.
        let small: Vec<u64> = (0..24).map(|_| a.alloc().unwrap()).collect();
        assert_eq!(small, (1000..1024).collect::<Vec<_>>());
        assert_eq!(a.alloc(), Some(3584), "the tail, not an empty chunk");
        assert_eq!(a.free_extents(), 5);
        let e = a.alloc_extent().unwrap();
        assert_eq!(e % 512, 0);
        assert!((1024..3584).contains(&e));
        assert_eq!(a.free_extents(), 4);
        assert!((0..512).all(|k| a.is_used(e + k)));
        // Freeing one block of the extent makes the chunk partial; freeing all makes it
        // a free extent again.
        assert!(a.free(e + 7));
        assert_eq!(a.free_extents(), 4);
        // The freed block is taken before any empty chunk.
        let tail_left = 4000 - 3585;
        for _ in 0..tail_left {
            a.alloc().unwrap();
        }
        assert_eq!(a.alloc(), Some(e + 7));
        for k in 0..512 {
            assert!(a.free(e + k));
        }
        assert_eq!(a.free_extents(), 5);
        // The counts survive a round trip through the bitmap.
        let b = BlockAlloc::from_bitmap(1000, a.bitmap().clone());
        assert_eq!(
            (b.free_extents(), b.free_count()),
            (a.free_extents(), a.free_count())
        );
        assert_eq!(b.chunk_usage(), a.chunk_usage());
        // When only empty chunks have room, small allocations break into them.
        let mut c = BlockAlloc::new(1024, 1024);
        assert_eq!(c.alloc(), Some(1024));
        assert_eq!(c.free_extents(), 1);
        while c.alloc_extent().is_some() {}
        assert_eq!(c.free_extents(), 0);
        assert_eq!(c.free_count(), 511);
    }

    #[test]
    fn metadata_and_data_keep_to_chunks_of_their_own() {
        // Four whole chunks, no edges.
        let mut a = BlockAlloc::new(1024, 4 * 512);
        let d: Vec<u64> = (0..10).map(|_| a.alloc().unwrap()).collect();
        let m: Vec<u64> = (0..10).map(|_| a.alloc_meta().unwrap()).collect();
        assert_eq!(d, (1024..1034).collect::<Vec<_>>());
        assert_eq!(
            m,
            (3062..3072).rev().collect::<Vec<_>>(),
            "from the top down"
        );
        assert_eq!(a.free_extents(), 2);
        // Data fills its chunk, then breaks a new one: never the metadata's.
        for _ in 0..600 {
            let b = a.alloc().unwrap();
            assert!(b < 2560, "data block {b} in the metadata chunk");
        }
        // Metadata fills its chunk, then takes the last empty one, then what is left.
        for _ in 0..502 {
            assert!(a.alloc_meta().unwrap() >= 2560);
        }
        assert_eq!(a.free_extents(), 1);
        assert!(a.alloc_meta().unwrap() < 2560);
        assert_eq!(a.free_extents(), 0);
        assert!((2560..3072).all(|b| a.is_used(b)));
    }

    #[test]
    fn inode_reservations() {
        let mut a = InodeAlloc::new(100);
        let r1 = a.reserve(0, 10);
        assert_eq!(r1, (2..12).collect::<Vec<_>>());
        let r2 = a.reserve(1, 5);
        assert!(r2.iter().all(|i| !r1.contains(i)));
        assert_eq!(a.reserved_by(3), Some(0));
        assert!(!a.reserve_one(1, 3));
        a.mark_used(3);
        assert_eq!(a.reserved_by(3), None);
        a.release_slot(0);
        assert_eq!(a.reserved_count(0), 0);
        assert_eq!(a.reserved_count(1), 5);
        // Exhaustion: 98 usable numbers beyond the root.
        let all = a.reserve(2, 1000);
        assert_eq!(all.len(), 98 - 1 - 5);
        assert_eq!(a.used_count(), 2);
        assert_eq!(a.capacity(), 99);
    }
}
