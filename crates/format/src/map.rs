//! File maps: a radix tree of 4 KiB nodes, 512 little-endian u64 entries each, like a
//! page table. An entry is 0 (hole) or the absolute block number of the child node (inner
//! levels) or of the data block (level 1). A tree of height `h` maps file blocks
//! `0 .. 512^h`. Nodes are never modified once published: the daemon copies a node,
//! changes the copy and switches the parent (ultimately the inode's root) to it.
//! Bits 56..63 of an entry are flags. Bits 60..61 of a *leaf* entry of a regular file's
//! map name the tier holding the data block (0 = NVM, 1 = SSD, 2 = HDD; the block number
//! is then the tier's own block number, `entry_block`). Map nodes, directory buckets and
//! symlink data always live in NVM. Bit 56 of a *level-2* entry of a regular file's map
//! (format version 5) marks a superpage extent: the entry names the first of 512
//! consecutive NVM blocks, 2 MiB aligned within the NVM file, that hold the 512 file
//! blocks the entry covers, in order (`huge_entry`). The other flag bits must be 0.

use crate::BLOCK_SIZE_U64;

/// Entries per node.
pub const FANOUT: u64 = 512;
/// log2(FANOUT).
pub const FANOUT_SHIFT: u32 = 9;
/// Tallest tree: 512^4 blocks of 4 KiB = 2^48 bytes.
pub const MAX_HEIGHT: u8 = 4;
/// Reserved flag bits of an entry.
pub const ENTRY_FLAGS: u64 = 0xff << 56;

/// Bit of a level-2 entry that marks a superpage extent (`huge_entry`).
pub const HUGE_FLAG: u64 = 1 << 56;
/// Blocks of a superpage extent (2 MiB).
pub const HUGE_BLOCKS: u64 = FANOUT;
/// Bytes of a superpage extent.
pub const HUGE_BYTES: u64 = HUGE_BLOCKS * BLOCK_SIZE_U64;

/// The level-2 entry for the superpage extent whose first NVM block is `first` (a
/// multiple of [`HUGE_BLOCKS`]).
pub fn huge_entry(first: u64) -> u64 {
    debug_assert!(first.is_multiple_of(HUGE_BLOCKS) && first & ENTRY_FLAGS == 0);
    HUGE_FLAG | first
}

/// Whether a level-2 entry names a superpage extent.
pub fn is_huge(e: u64) -> bool {
    e & HUGE_FLAG != 0
}

/// The first NVM block of the superpage extent a huge entry names.
pub fn huge_first(e: u64) -> u64 {
    e & !ENTRY_FLAGS
}

/// The tier bits of a leaf entry.
pub const TIER_SHIFT: u32 = 60;
pub const TIER_BITS: u64 = 3 << TIER_SHIFT;
/// Tier numbers.
pub const TIER_NVM: u8 = 0;
pub const TIER_SSD: u8 = 1;
pub const TIER_HDD: u8 = 2;
/// The remote tier (format version 6): segments as objects of a Ceph RADOS pool, below
/// every local tier.
pub const TIER_REMOTE: u8 = 3;
/// Number of tiers, NVM included.
pub const TIERS: usize = 4;
/// Names of the tiers, by number.
pub const TIER_NAMES: [&str; TIERS] = ["nvm", "ssd", "hdd", "remote"];

/// The tier of a leaf entry.
pub fn entry_tier(e: u64) -> u8 {
    ((e & TIER_BITS) >> TIER_SHIFT) as u8
}

/// The block number of a leaf entry within its tier.
pub fn entry_block(e: u64) -> u64 {
    e & !ENTRY_FLAGS
}

/// The leaf entry for block `blk` of tier `tier`.
pub fn tier_entry(tier: u8, blk: u64) -> u64 {
    debug_assert!(tier <= TIER_REMOTE && blk & ENTRY_FLAGS == 0);
    ((tier as u64) << TIER_SHIFT) | blk
}

/// Smallest height whose tree covers file blocks `0..nblocks` (0 for an empty file).
pub fn height_for_blocks(nblocks: u64) -> u8 {
    let mut h = 0u8;
    let mut cover = 1u64;
    while cover < nblocks {
        h += 1;
        cover = cover.saturating_mul(FANOUT);
    }
    // A single block needs a height-1 tree (root = a leaf node).
    if nblocks >= 1 && h == 0 {
        1
    } else {
        h
    }
}

/// Number of file blocks a tree of height `h` covers.
pub fn coverage(h: u8) -> u64 {
    1u64 << (FANOUT_SHIFT * h as u32)
}

/// Index within the node at `level` (1 = leaf level) for file block `fblk`.
pub fn index_at(fblk: u64, level: u8) -> usize {
    ((fblk >> (FANOUT_SHIFT * (level as u32 - 1))) & (FANOUT - 1)) as usize
}

/// File blocks needed to hold `size` bytes.
pub fn blocks_for_size(size: u64) -> u64 {
    size.div_ceil(BLOCK_SIZE_U64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heights() {
        assert_eq!(height_for_blocks(0), 0);
        assert_eq!(height_for_blocks(1), 1);
        assert_eq!(height_for_blocks(512), 1);
        assert_eq!(height_for_blocks(513), 2);
        assert_eq!(height_for_blocks(512 * 512), 2);
        assert_eq!(height_for_blocks(512 * 512 + 1), 3);
        assert_eq!(height_for_blocks(coverage(4)), 4);
        assert_eq!(index_at(513, 1), 1);
        assert_eq!(index_at(513, 2), 1);
        assert_eq!(index_at(512 * 512 * 3 + 7, 3), 3);
    }

    #[test]
    fn tier_entries() {
        for t in [TIER_NVM, TIER_SSD, TIER_HDD] {
            let e = tier_entry(t, 123_456);
            assert_eq!((entry_tier(e), entry_block(e)), (t, 123_456));
        }
        assert_eq!(tier_entry(TIER_NVM, 77), 77);
    }

    #[test]
    fn huge_entries() {
        let e = huge_entry(512 * 9);
        assert!(is_huge(e) && !is_huge(512 * 9));
        assert_eq!(huge_first(e), 512 * 9);
        assert_eq!(entry_tier(e), TIER_NVM);
        assert_eq!(HUGE_BYTES, 2 << 20);
    }
}
