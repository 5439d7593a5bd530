//! DRAM allocation state of the lower tiers (SSD, HDD, remote): which blocks hold live data
//! (set from the copy until the epoch after the block was replaced), the live count of
//! every segment, and the segment being written. A lower tier is written only in whole
//! segments: a migration or cleaning round takes one free segment, fills it sequentially
//! with one write, and never writes it again until every block of it is dead and it was
//! trimmed. The moves between tiers are `migrate` (rounds), `select` (which blocks),
//! `copy` (the data and the map switch) and `recency` (what is cold, what is hot); the
//! storage of a lower tier is a `cairn_area::TierDevice`, and `remote` opens, sweeps and
//! reports the remote one.

mod copy;
pub(crate) mod migrate;
pub(crate) mod recency;
pub(crate) mod remote;
mod select;

use crate::store::alloc::Bitmap;
use cairn_format::superblock::TierGeom;

/// One lower tier's allocation state.
#[derive(Debug, Clone)]
pub(crate) struct TierAlloc {
    /// 1 = SSD, 2 = HDD, 3 = remote.
    pub num: u8,
    pub geom: TierGeom,
    live: Bitmap,
    seg_live: Vec<u32>,
    /// Per segment: live blocks already replaced, waiting for their epoch.
    seg_pending: Vec<u32>,
    /// Segments taken by a round in flight (not free even while they hold nothing live).
    busy: Vec<bool>,
    /// Where the next free-segment search starts (segments are used in turn).
    cursor: u64,
    /// Segments that became empty and were not trimmed yet.
    pub to_trim: Vec<u64>,
}

impl TierAlloc {
    /// Every segment free.
    pub(crate) fn new(num: u8, geom: TierGeom) -> TierAlloc {
        TierAlloc {
            num,
            geom,
            live: Bitmap::new(geom.blocks()),
            seg_live: vec![0; geom.segments as usize],
            seg_pending: vec![0; geom.segments as usize],
            busy: vec![false; geom.segments as usize],
            cursor: 1,
            to_trim: Vec::new(),
        }
    }

    /// From a saved bitmap of live blocks.
    pub(crate) fn from_bitmap(num: u8, geom: TierGeom, live: Bitmap) -> TierAlloc {
        let mut t = TierAlloc::new(num, geom);
        for b in geom.segment_blocks..geom.blocks() {
            if live.get(b) {
                t.mark_used(b);
            }
        }
        t
    }

    pub(crate) fn bitmap(&self) -> &Bitmap {
        &self.live
    }

    /// Whether block `b` holds live data.
    pub(crate) fn is_used(&self, b: u64) -> bool {
        b < self.live.len() && self.live.get(b)
    }

    /// Blocks that can hold data.
    pub(crate) fn capacity(&self) -> u64 {
        self.geom.data_blocks()
    }

    /// Live blocks (data, and replaced blocks waiting for their epoch).
    pub(crate) fn live_count(&self) -> u64 {
        self.seg_live.iter().map(|&n| n as u64).sum()
    }

    /// Data segments (all but the header).
    pub(crate) fn data_segments(&self) -> u64 {
        self.geom.segments - 1
    }

    fn seg_free(&self, s: u64) -> bool {
        s >= 1 && self.seg_live[s as usize] == 0 && !self.busy[s as usize]
    }

    /// Segments holding nothing and not being written.
    pub(crate) fn free_segments(&self) -> u64 {
        (1..self.geom.segments)
            .filter(|&s| self.seg_free(s))
            .count() as u64
    }

    /// Blocks of segments in use (holding something or being written): what the
    /// watermarks compare, since space is given out in whole segments.
    pub(crate) fn used_blocks(&self) -> u64 {
        (self.data_segments() - self.free_segments()) * self.geom.segment_blocks
    }

    /// Whether segment `s` holds live blocks or a round is writing it.
    pub(crate) fn in_use(&self, s: u64) -> bool {
        self.seg_live(s) > 0 || self.busy.get(s as usize).is_some_and(|&b| b)
    }

    /// Live blocks of segment `s` (those waiting for their epoch included).
    pub(crate) fn seg_live(&self, s: u64) -> u64 {
        self.seg_live.get(s as usize).map_or(0, |&n| n as u64)
    }

    /// Live blocks of segment `s` that are still in use (not replaced).
    pub(crate) fn seg_in_use(&self, s: u64) -> u64 {
        let pending = self.seg_pending.get(s as usize).map_or(0, |&n| n as u64);
        self.seg_live(s).saturating_sub(pending)
    }

    /// Block `b` was replaced: it is freed after its epoch.
    pub(crate) fn retire(&mut self, b: u64) {
        if self.geom.block_valid(b) && self.live.get(b) {
            self.seg_pending[self.geom.segment_of(b) as usize] += 1;
        }
    }

    /// Take a free segment for a round, keeping `reserve` free ones back.
    pub(crate) fn take_segment(&mut self, reserve: u64) -> Option<u64> {
        if self.free_segments() <= reserve {
            return None;
        }
        let n = self.geom.segments;
        let s = (0..n)
            .map(|k| 1 + (self.cursor - 1 + k) % (n - 1))
            .find(|&s| self.seg_free(s))?;
        self.busy[s as usize] = true;
        self.cursor = s % (n - 1) + 1;
        Some(s)
    }

    /// The round that took `s` is over (its blocks that were published are live).
    pub(crate) fn release_segment(&mut self, s: u64) {
        self.busy[s as usize] = false;
        if self.seg_live[s as usize] == 0 {
            // Nothing of it was published: its bytes are garbage; trim them.
            self.to_trim.push(s);
        }
    }

    /// Mark `b` live (a published copy, or the rebuild); false if it already was or is
    /// not a data block of this tier.
    pub(crate) fn mark_used(&mut self, b: u64) -> bool {
        if !self.geom.block_valid(b) || self.live.get(b) {
            return false;
        }
        self.live.set(b);
        self.seg_live[self.geom.segment_of(b) as usize] += 1;
        true
    }

    /// Free `b` (its epoch passed); false if it was not live. A segment left empty is
    /// queued for trimming.
    pub(crate) fn free(&mut self, b: u64) -> bool {
        if !self.geom.block_valid(b) || !self.live.get(b) {
            return false;
        }
        self.live.clear(b);
        let s = self.geom.segment_of(b);
        self.seg_live[s as usize] -= 1;
        let p = &mut self.seg_pending[s as usize];
        *p = p.saturating_sub(1);
        if self.seg_live[s as usize] == 0 && !self.busy[s as usize] {
            self.to_trim.push(s);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_taken_in_turn_and_freed_when_empty() {
        let g = TierGeom {
            segments: 4,
            segment_blocks: 16,
        };
        let mut t = TierAlloc::new(1, g);
        assert_eq!((t.capacity(), t.free_segments()), (48, 3));
        let s = t.take_segment(1).unwrap();
        assert_eq!(s, 1);
        assert!(t.mark_used(16) && t.mark_used(17) && !t.mark_used(17));
        assert!(!t.mark_used(3), "the header segment holds no data");
        t.release_segment(s);
        assert_eq!(
            (t.free_segments(), t.live_count(), t.used_blocks()),
            (2, 2, 16)
        );
        assert_eq!(t.take_segment(1), Some(2));
        assert_eq!(t.take_segment(1), None, "one segment stays reserved");
        assert_eq!(t.take_segment(0), Some(3));
        t.release_segment(2);
        t.release_segment(3);
        assert_eq!(t.to_trim, vec![2, 3]);
        t.to_trim.clear();
        t.retire(16);
        assert_eq!((t.seg_live(1), t.seg_in_use(1)), (2, 1));
        assert!(t.free(16));
        assert_eq!((t.seg_live(1), t.seg_in_use(1)), (1, 1));
        assert!(!t.free(16));
        assert!(t.to_trim.is_empty());
        assert!(t.free(17));
        assert_eq!(t.to_trim, vec![1]);
        let again = TierAlloc::from_bitmap(1, g, t.bitmap().clone());
        assert_eq!(again.live_count(), 0);
        assert_eq!(t.take_segment(0), Some(1), "the cursor wrapped around");
    }
}
