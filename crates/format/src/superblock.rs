//! Superblock (block 0, and its copy in the last block), daemon state (block 1) and the
//! layout of the NVM tier.

use crate::{align_up, bad, crc, le, Result, BLOCK_SIZE, BLOCK_SIZE_U64};

/// Magic at the start of the superblock.
pub const SB_MAGIC: &[u8; 8] = b"CAIRNSB\0";
/// Magic at the start of the daemon state block.
pub const STATE_MAGIC: &[u8; 8] = b"CAIRNST\0";
/// Current format version (2: lower tiers; 3: special files, inode kinds 4–7; 4: a copy
/// of the superblock in the tier's last block; 5: superpage extents; 6: a remote tier;
/// 7: each log slot in a file of its own). Every older version is still read.
pub const FORMAT_VERSION: u32 = 7;
/// The first version whose log slots (client page and ring) are files of their own
/// (`Layout::slot_files`), outside the NVM file: the kernel then lets a client write its
/// own log and nothing else.
pub const VERSION_SLOT_FILES: u32 = 7;
/// The first version that may have a remote tier (its geometry after the HDD's).
pub const VERSION_REMOTE: u32 = 6;
/// The first version whose file maps may hold superpage extents
/// (`crate::map::HUGE_FLAG`).
pub const VERSION_SUPERPAGES: u32 = 5;
/// The last version without a copy of the superblock.
const VERSION_NO_COPY: u32 = 3;
/// Bytes of a version-1 superblock covered by its checksum (the crc sits right after).
const SB_CRC_OFF_V1: usize = 144;
/// Bytes of a version-2 superblock covered by its checksum.
const SB_CRC_OFF: usize = 256;
/// Where the lower tiers' geometry sits in a version-2 superblock.
const SB_TIERS_OFF: usize = 144;

/// Offsets of the 8-byte fields in the daemon state block (block 1). Each is written
/// with one aligned 8-byte store, so none can be torn; the block has no checksum.
pub mod state {
    /// 1 after a clean stop, 0 while a daemon runs or after a crash.
    pub const CLEAN: usize = 8;
    /// Global epoch for reclamation (clients read it).
    pub const EPOCH: usize = 16;
    /// Number of daemon starts.
    pub const MOUNTS: usize = 24;
    /// Time of the last clean stop, ns since the Unix epoch.
    pub const LAST_CLEAN_NS: usize = 32;
    /// Digest counters (see `cairn status`), updated after every digest.
    pub const RECORDS_DIGESTED: usize = 40;
    pub const RECORDS_SKIPPED: usize = 48;
    pub const LOG_BYTES_WRITTEN: usize = 56;
    pub const SHARED_BYTES_WRITTEN: usize = 64;
    pub const DIGESTS: usize = 72;
    /// Migration and cleaning counters: per tier (NVM, SSD, HDD) three u64, bytes
    /// migrated down out of the tier, bytes migrated up into it, bytes cleaned in it.
    pub const TRAFFIC: usize = 80;
    /// Superpage counters (format version 5; zero before): promotions, demotions,
    /// bytes promoted (copied into extents), bytes compacted, extents placed by digests.
    pub const SUPERPAGES: usize = 152;
    /// The remote tier's three traffic counters (format version 6), as [`TRAFFIC`]'s.
    pub const TRAFFIC_REMOTE: usize = 192;

    /// Where the traffic counters of tier `t` (0 = NVM .. 3 = remote) start.
    pub const fn traffic(t: usize) -> usize {
        if t < 3 {
            TRAFFIC + 24 * t
        } else {
            TRAFFIC_REMOTE
        }
    }
}

/// Number of lower tiers a store can have (SSD, HDD, remote).
pub const LOWER_TIERS: usize = 3;

/// The geometry of a lower tier (SSD, HDD or remote): storage written only in whole
/// segments. Tier block `b` lives at byte `b * 4096` of the device (of the tier's
/// address space, for the remote tier); segment 0 holds the tier's header
/// (`crate::tier`) and is never used for data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierGeom {
    /// Segments on the device, the header segment included (0: no such tier).
    pub segments: u64,
    /// Blocks per segment.
    pub segment_blocks: u64,
}

/// Smallest and largest segment, in blocks (64 KiB .. 4 GiB).
pub const MIN_SEGMENT_BLOCKS: u64 = 16;
pub const MAX_SEGMENT_BLOCKS: u64 = 1 << 20;
/// Fewest segments of a lower tier: the header, one reserved for cleaning, one to use.
pub const MIN_SEGMENTS: u64 = 3;

impl TierGeom {
    /// Whether the store has this tier.
    pub fn present(&self) -> bool {
        self.segments > 0
    }
    /// Blocks on the device (the header segment included).
    pub fn blocks(&self) -> u64 {
        self.segments * self.segment_blocks
    }
    /// Blocks that can hold data (every segment but the header).
    pub fn data_blocks(&self) -> u64 {
        self.blocks().saturating_sub(self.segment_blocks)
    }
    /// Whether tier block `b` may hold data.
    pub fn block_valid(&self, b: u64) -> bool {
        self.present() && b >= self.segment_blocks && b < self.blocks()
    }
    /// The segment holding tier block `b`.
    pub fn segment_of(&self, b: u64) -> u64 {
        b / self.segment_blocks
    }
    /// Bytes of a segment.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_blocks * BLOCK_SIZE_U64
    }
    fn check(&self, name: &str) -> Result<()> {
        if !self.present() {
            return Ok(());
        }
        if !(MIN_SEGMENT_BLOCKS..=MAX_SEGMENT_BLOCKS).contains(&self.segment_blocks) {
            return bad(format!(
                "{name} tier: the segment size must be between 64 KiB and 4 GiB"
            ));
        }
        if self.segments < MIN_SEGMENTS || self.segments > 1 << 32 {
            return bad(format!(
                "{name} tier: {} segments of {} KiB; at least {MIN_SEGMENTS} are needed \
                 (one for the header, one reserved for cleaning, one for data)",
                self.segments,
                self.segment_blocks * 4
            ));
        }
        Ok(())
    }
}

/// Parameters chosen at mkfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub total_bytes: u64,
    pub nslots: u32,
    pub log_bytes: u64,
    pub inode_count: u64,
    /// SSD, HDD and remote (absent: `segments == 0`).
    pub tiers: [TierGeom; LOWER_TIERS],
}

/// Where every region lives, in blocks. Derived from `Params` by `Layout::compute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub total_blocks: u64,
    pub nslots: u32,
    pub slot_table_start: u64,
    pub alloc_start: u64,
    pub alloc_blocks: u64,
    /// The lower tiers' segment tables (`crate::tier::SEG_ENTRY_BYTES` per segment, one
    /// table per present tier, SSD first); 0 blocks without lower tiers.
    pub seg_table_start: u64,
    pub seg_table_blocks: u64,
    pub log_start: u64,
    /// Ring blocks per slot (the client page is one more block in front of the ring).
    pub log_blocks: u64,
    pub inode_start: u64,
    pub inode_count: u64,
    pub data_start: u64,
    pub data_blocks: u64,
    /// SSD, HDD and remote geometry.
    pub tiers: [TierGeom; LOWER_TIERS],
    /// The block holding a copy of the superblock, the last of the tier, right after the
    /// data region (0: none, a store of format version 3 or older).
    pub sb_copy: u64,
    /// Each slot's client page and ring are a file of their own of
    /// [`Layout::slot_file_bytes`] (format version 7): the NVM file has no log region
    /// (`inode_start == log_start`). Otherwise they sit in the NVM file at
    /// [`Layout::client_page_off`].
    pub slot_files: bool,
}

/// Bytes of one slot-table entry.
pub const SLOT_ENTRY_BYTES: u64 = 128;
/// Bytes of one inode.
pub const INODE_BYTES: u64 = 256;

impl Layout {
    /// Compute the layout of a new store (with a copy of the superblock), or explain why
    /// the parameters do not fit.
    pub fn compute(p: Params) -> Result<Layout> {
        Layout::compute_for(p, FORMAT_VERSION)
    }

    /// The layout of a store of format `version`: with a copy of the superblock from
    /// version 4 on, with the logs in files of their own from version 7 on.
    pub fn compute_for(p: Params, version: u32) -> Result<Layout> {
        let sb_copy = version > VERSION_NO_COPY;
        let slot_files = version >= VERSION_SLOT_FILES;
        if p.nslots == 0 || p.nslots > 4096 {
            return bad("slots must be between 1 and 4096");
        }
        if p.log_bytes < 64 * 1024 || !p.log_bytes.is_multiple_of(BLOCK_SIZE_U64) {
            return bad("log size must be a multiple of 4 KiB and at least 64 KiB");
        }
        if p.inode_count < 16 {
            return bad("at least 16 inodes are needed");
        }
        p.tiers[0].check("SSD")?;
        p.tiers[1].check("HDD")?;
        p.tiers[2].check("remote")?;
        if p.tiers[1].present() && !p.tiers[0].present() {
            return bad("an HDD tier needs an SSD tier above it");
        }
        let total_blocks = p.total_bytes / BLOCK_SIZE_U64;
        let slot_table_start = 2;
        let slot_table_blocks =
            align_up(p.nslots as u64 * SLOT_ENTRY_BYTES, BLOCK_SIZE_U64) / BLOCK_SIZE_U64;
        let log_blocks = p.log_bytes / BLOCK_SIZE_U64;
        let alloc_start = slot_table_start + slot_table_blocks;
        // The allocation state covers data blocks + inodes + lower-tier blocks; size it
        // for an upper bound on data blocks (all blocks), then fix the data region.
        let tier_bytes: u64 = p.tiers.iter().map(|t| t.blocks().div_ceil(8)).sum();
        // (The data region is smaller than `total_blocks` by far more than the two bytes
        // rounding each bitmap to a byte can add.)
        let bitmap_bytes = (total_blocks + p.inode_count).div_ceil(8) + tier_bytes;
        let alloc_blocks = 1 + align_up(bitmap_bytes, BLOCK_SIZE_U64) / BLOCK_SIZE_U64;
        let seg_table_start = alloc_start + alloc_blocks;
        let seg_table_blocks: u64 = p
            .tiers
            .iter()
            .map(|t| align_up(t.segments * crate::tier::SEG_ENTRY_BYTES, BLOCK_SIZE_U64))
            .sum::<u64>()
            / BLOCK_SIZE_U64;
        let log_start = seg_table_start + seg_table_blocks;
        let log_region = if slot_files {
            0
        } else {
            p.nslots as u64 * (1 + log_blocks)
        };
        let inode_start = log_start + log_region;
        let inode_blocks = align_up(p.inode_count * INODE_BYTES, BLOCK_SIZE_U64) / BLOCK_SIZE_U64;
        let data_start = inode_start + inode_blocks;
        let copy = sb_copy as u64;
        if data_start + 64 + copy > total_blocks {
            return bad(format!(
                "the NVM tier is too small: logs and inodes need {} MiB, have {} MiB",
                ((data_start + 64 + copy) * BLOCK_SIZE_U64) >> 20,
                p.total_bytes >> 20
            ));
        }
        Ok(Layout {
            total_blocks,
            nslots: p.nslots,
            slot_table_start,
            alloc_start,
            alloc_blocks,
            seg_table_start,
            seg_table_blocks,
            log_start,
            log_blocks,
            inode_start,
            inode_count: p.inode_count,
            data_start,
            data_blocks: total_blocks - data_start - copy,
            tiers: p.tiers,
            sb_copy: if sb_copy { total_blocks - 1 } else { 0 },
            slot_files,
        })
    }

    /// Byte offset of the segment-table entry of segment `seg` of lower tier `tier`
    /// (1 = SSD, 2 = HDD, 3 = remote; caller checks both).
    pub fn seg_entry_off(&self, tier: u8, seg: u64) -> u64 {
        let mut off = self.seg_table_start * BLOCK_SIZE_U64;
        for t in &self.tiers[..(tier as usize - 1)] {
            off += align_up(t.segments * crate::tier::SEG_ENTRY_BYTES, BLOCK_SIZE_U64);
        }
        off + seg * crate::tier::SEG_ENTRY_BYTES
    }

    /// The geometry of lower tier `tier` (1 = SSD, 2 = HDD, 3 = remote), if the store
    /// has it.
    pub fn tier(&self, tier: u8) -> Option<&TierGeom> {
        match tier {
            1..=3 => Some(&self.tiers[tier as usize - 1]).filter(|t| t.present()),
            _ => None,
        }
    }

    /// The tier data of tier `tier` migrates down to: the next one the store has.
    pub fn below(&self, tier: u8) -> Option<u8> {
        (tier + 1..=LOWER_TIERS as u8).find(|&t| self.tier(t).is_some())
    }

    /// The tier data of lower tier `tier` is promoted to: the nearest one above it the
    /// store has, NVM (0) at last.
    pub fn above(&self, tier: u8) -> Option<u8> {
        (0..tier).rev().find(|&t| t == 0 || self.tier(t).is_some())
    }

    /// Whether `e` is a valid leaf entry of a file map: an NVM data block, or a data
    /// block of a lower tier the store has (`crate::map::entry_tier`).
    pub fn leaf_valid(&self, e: u64) -> bool {
        use crate::map::{entry_block, entry_tier, ENTRY_FLAGS, TIER_BITS};
        if e & ENTRY_FLAGS & !TIER_BITS != 0 {
            return false;
        }
        match entry_tier(e) {
            0 => self.data_block_valid(e),
            t => self.tier(t).is_some_and(|g| g.block_valid(entry_block(e))),
        }
    }

    /// Bytes of the saved allocation bitmaps: NVM data blocks, inodes, then each lower
    /// tier's blocks, each bitmap starting on a byte.
    pub fn alloc_bitmap_bytes(&self) -> usize {
        let t: u64 = self.tiers.iter().map(|t| t.blocks().div_ceil(8)).sum();
        (self.data_blocks.div_ceil(8) + self.inode_count.div_ceil(8) + t) as usize
    }

    /// Byte offset of the slot-table entry of `slot`.
    pub fn slot_entry_off(&self, slot: u32) -> u64 {
        self.slot_table_start * BLOCK_SIZE_U64 + slot as u64 * SLOT_ENTRY_BYTES
    }
    /// Byte offset of the client page of `slot` in the file that holds it: the slot's
    /// own file (0) with [`Layout::slot_files`], else the NVM file.
    pub fn client_page_off(&self, slot: u32) -> u64 {
        if self.slot_files {
            return 0;
        }
        (self.log_start + slot as u64 * (1 + self.log_blocks)) * BLOCK_SIZE_U64
    }
    /// Byte offset of the ring of `slot` in the file that holds it (as
    /// [`Layout::client_page_off`]).
    pub fn ring_off(&self, slot: u32) -> u64 {
        self.client_page_off(slot) + BLOCK_SIZE_U64
    }
    /// Bytes of a slot's client page and ring: the size of its file with
    /// [`Layout::slot_files`].
    pub fn slot_file_bytes(&self) -> u64 {
        BLOCK_SIZE_U64 + self.ring_bytes()
    }
    /// Bytes in a ring.
    pub fn ring_bytes(&self) -> u64 {
        self.log_blocks * BLOCK_SIZE_U64
    }
    /// Byte offset of inode `ino` (caller checks `ino_valid`).
    pub fn inode_off(&self, ino: u64) -> u64 {
        self.inode_start * BLOCK_SIZE_U64 + ino * INODE_BYTES
    }
    /// Space credits (data blocks) one client gets at a time: a quarter of the data
    /// blocks divided among the slots, at least 16. On a small store this keeps one
    /// client from holding all the space the others need.
    pub fn credit_share(&self) -> u64 {
        (self.data_blocks / (4 * self.nslots.max(1) as u64)).max(16)
    }
    /// Inode numbers run from 1 (root) to `inode_count - 1`; 0 is never used.
    pub fn ino_valid(&self, ino: u64) -> bool {
        ino >= 1 && ino < self.inode_count
    }
    /// Whether `e` is a valid superpage entry of a level-2 map node: the flag, no other
    /// flag, a first block aligned to 2 MiB within the NVM file, all 512 blocks in the
    /// data region.
    pub fn huge_valid(&self, e: u64) -> bool {
        use crate::map::{huge_first, ENTRY_FLAGS, HUGE_BLOCKS, HUGE_FLAG};
        let first = huge_first(e);
        e & ENTRY_FLAGS == HUGE_FLAG
            && first.is_multiple_of(HUGE_BLOCKS)
            && self.data_block_valid(first)
            && self.data_block_valid(first + HUGE_BLOCKS - 1)
    }
    /// The first and one past the last block of the data region's 2 MiB-aligned extents
    /// (equal when it holds none).
    pub fn huge_range(&self) -> (u64, u64) {
        use crate::map::HUGE_BLOCKS;
        let end = self.data_start + self.data_blocks;
        let first = self.data_start.next_multiple_of(HUGE_BLOCKS);
        let last = end / HUGE_BLOCKS * HUGE_BLOCKS;
        (first.min(last), last)
    }
    /// Whether `blk` is a block of the data region.
    pub fn data_block_valid(&self, blk: u64) -> bool {
        blk >= self.data_start && blk < self.data_start + self.data_blocks
    }
    /// Byte offset of block `blk`.
    pub fn block_off(blk: u64) -> u64 {
        blk * BLOCK_SIZE_U64
    }
}

/// The superblock: immutable after mkfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The format version the store was made with (`FORMAT_VERSION` at mkfs; older
    /// stores keep theirs: 1 to 3 have no copy of the superblock, `layout.sb_copy == 0`).
    pub version: u32,
    pub layout: Layout,
    pub uuid: [u8; 16],
    pub created_ns: i64,
}

impl Superblock {
    /// Whether file maps may hold superpage extents (format version 5 and later).
    pub fn superpages(&self) -> bool {
        self.version >= VERSION_SUPERPAGES
    }

    /// Encode into one block.
    pub fn encode(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut b = vec![0u8; BLOCK_SIZE];
        b[0..8].copy_from_slice(SB_MAGIC);
        debug_assert_eq!(self.version > VERSION_NO_COPY, l.sb_copy != 0);
        debug_assert!(self.version >= VERSION_REMOTE || !l.tiers[2].present());
        le::put_u32(&mut b, 8, self.version);
        le::put_u32(&mut b, 12, BLOCK_SIZE as u32);
        le::put_u64(&mut b, 16, l.total_blocks);
        le::put_u32(&mut b, 24, l.nslots);
        le::put_u64(&mut b, 32, l.slot_table_start);
        le::put_u64(&mut b, 40, l.alloc_start);
        le::put_u64(&mut b, 48, l.alloc_blocks);
        le::put_u64(&mut b, 56, l.log_start);
        le::put_u64(&mut b, 64, l.log_blocks);
        le::put_u64(&mut b, 72, l.inode_start);
        le::put_u64(&mut b, 80, l.inode_count);
        le::put_u64(&mut b, 88, l.data_start);
        le::put_u64(&mut b, 96, l.data_blocks);
        b[104..120].copy_from_slice(&self.uuid);
        le::put_i64(&mut b, 120, self.created_ns);
        le::put_u64(&mut b, 128, crate::ROOT_INO);
        for (i, t) in l.tiers.iter().enumerate() {
            le::put_u64(&mut b, SB_TIERS_OFF + 16 * i, t.segments);
            le::put_u64(&mut b, SB_TIERS_OFF + 16 * i + 8, t.segment_blocks);
        }
        let c = crc(&b[..SB_CRC_OFF]);
        le::put_u32(&mut b, SB_CRC_OFF, c);
        b
    }

    /// Decode and validate a superblock; `file_len` is the size of the NVM file.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Superblock> {
        if b.len() < BLOCK_SIZE {
            return bad("superblock: short read");
        }
        if &b[0..8] != SB_MAGIC {
            return bad("superblock: bad magic (not a Cairn NVM tier)");
        }
        let v = le::u32(b, 8);
        let crc_off = match v {
            1 => SB_CRC_OFF_V1,
            2..=FORMAT_VERSION => SB_CRC_OFF,
            _ => return bad(format!("superblock: unsupported format version {v}")),
        };
        if crc(&b[..crc_off]) != le::u32(b, crc_off) {
            return bad("superblock: checksum mismatch");
        }
        let mut tiers = [TierGeom::default(); LOWER_TIERS];
        // Version 2 added the SSD and HDD, version 6 the remote tier.
        let known = match v {
            1 => 0,
            2..VERSION_REMOTE => 2,
            _ => LOWER_TIERS,
        };
        {
            for (i, t) in tiers.iter_mut().enumerate().take(known) {
                t.segments = le::u64(b, SB_TIERS_OFF + 16 * i);
                t.segment_blocks = le::u64(b, SB_TIERS_OFF + 16 * i + 8);
            }
        }
        if le::u32(b, 12) as usize != BLOCK_SIZE {
            return bad("superblock: unsupported block size");
        }
        let layout = Layout {
            total_blocks: le::u64(b, 16),
            nslots: le::u32(b, 24),
            slot_table_start: le::u64(b, 32),
            alloc_start: le::u64(b, 40),
            alloc_blocks: le::u64(b, 48),
            seg_table_start: 0,
            seg_table_blocks: 0,
            log_start: le::u64(b, 56),
            log_blocks: le::u64(b, 64),
            inode_start: le::u64(b, 72),
            inode_count: le::u64(b, 80),
            data_start: le::u64(b, 88),
            data_blocks: le::u64(b, 96),
            tiers,
            sb_copy: 0,
            slot_files: v >= VERSION_SLOT_FILES,
        };
        // The layout must be exactly the one its parameters give.
        let expect = Layout::compute_for(
            Params {
                total_bytes: layout.total_blocks.saturating_mul(BLOCK_SIZE_U64),
                nslots: layout.nslots,
                log_bytes: layout.log_blocks.saturating_mul(BLOCK_SIZE_U64),
                inode_count: layout.inode_count,
                tiers,
            },
            v,
        )?;
        let layout = Layout {
            seg_table_start: expect.seg_table_start,
            seg_table_blocks: expect.seg_table_blocks,
            sb_copy: expect.sb_copy,
            ..layout
        };
        if expect != layout {
            return bad("superblock: inconsistent layout");
        }
        if layout.total_blocks.saturating_mul(BLOCK_SIZE_U64) > file_len {
            return bad(format!(
                "superblock: the NVM file is {file_len} bytes, the layout needs {}",
                layout.total_blocks * BLOCK_SIZE_U64
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[104..120]);
        Ok(Superblock {
            version: v,
            layout,
            uuid,
            created_ns: le::i64(b, 120),
        })
    }
}

/// The format version a superblock block says it has, if it has the magic (decoded or
/// not: a store of a newer version is told apart from a damaged one).
pub fn stored_version(b: &[u8]) -> Option<u32> {
    (b.len() >= 12 && &b[0..8] == SB_MAGIC).then(|| le::u32(b, 8))
}

/// The block where a store of format version 4 or later keeps the copy of its
/// superblock, found from the NVM file's length alone (for when block 0 is damaged): the
/// file's last whole block ([`Superblock::decode_copy`] checks what it holds).
pub fn copy_block_of(file_len: u64) -> u64 {
    (file_len / BLOCK_SIZE_U64).saturating_sub(1)
}

impl Superblock {
    /// Decode the copy of the superblock read from block [`copy_block_of`]`(file_len)`
    /// (for when block 0 is damaged): it is the store's only if it decodes and its layout
    /// names that block as its copy.
    pub fn decode_copy(b: &[u8], file_len: u64) -> Result<Superblock> {
        let at = copy_block_of(file_len);
        let sb = Superblock::decode(b, file_len)?;
        if sb.layout.sb_copy != at {
            return bad(format!(
                "block {at} holds no copy of this store's superblock"
            ));
        }
        Ok(sb)
    }
}

/// Encode a fresh daemon state block.
pub fn encode_state(clean: bool) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    b[0..8].copy_from_slice(STATE_MAGIC);
    le::put_u64(&mut b, state::CLEAN, clean as u64);
    le::put_u64(&mut b, state::EPOCH, 1);
    b
}

/// Check the daemon state block's magic.
pub fn check_state(b: &[u8]) -> Result<()> {
    if b.len() < 64 || &b[0..8] != STATE_MAGIC {
        return bad("daemon state block: bad magic");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            total_bytes: 64 << 20,
            nslots: 4,
            log_bytes: 1 << 20,
            inode_count: 1024,
            tiers: [TierGeom::default(); LOWER_TIERS],
        }
    }

    #[test]
    fn layout_regions_are_disjoint_and_ordered() {
        let l = Layout::compute(params()).unwrap();
        assert!(l.slot_table_start < l.alloc_start);
        assert!(l.alloc_start + l.alloc_blocks <= l.log_start);
        // The logs are files of their own: no log region in the NVM file.
        assert!(l.slot_files);
        assert_eq!(l.inode_start, l.log_start);
        assert_eq!(l.ring_off(3), BLOCK_SIZE_U64);
        assert_eq!(l.slot_file_bytes(), BLOCK_SIZE_U64 + (1 << 20));
        // Before version 7 they followed one another in the NVM file, before the inodes.
        let v6 = Layout::compute_for(params(), 6).unwrap();
        assert!(!v6.slot_files);
        assert_eq!(
            v6.ring_off(3) + v6.ring_bytes(),
            v6.inode_start * BLOCK_SIZE_U64
        );
        assert_eq!(v6.data_blocks + 4 * (1 + 256), l.data_blocks);
        assert!(l.inode_off(l.inode_count) <= l.data_start * BLOCK_SIZE_U64);
        // The data region ends where the superblock's copy (the last block) begins.
        assert_eq!(l.data_start + l.data_blocks + 1, l.total_blocks);
        assert_eq!(l.sb_copy, l.total_blocks - 1);
        assert_eq!(copy_block_of(l.total_blocks * BLOCK_SIZE_U64), l.sb_copy);
        assert!(l.data_block_valid(l.sb_copy - 1));
        assert!(!l.data_block_valid(l.sb_copy));
    }

    #[test]
    fn superblock_roundtrip_and_corruption() {
        let sb = Superblock {
            version: FORMAT_VERSION,
            layout: Layout::compute(params()).unwrap(),
            uuid: [7; 16],
            created_ns: 42,
        };
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b, 64 << 20).unwrap(), sb);
        assert!(Superblock::decode(&b, 1 << 20).is_err(), "file too short");
        for i in [0usize, 9, 20, 100, 130, 144] {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(Superblock::decode(&c, 64 << 20).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn lower_tiers_roundtrip_and_v1_layouts_are_unchanged() {
        let v1 = Layout::compute_for(params(), 1).unwrap();
        assert_eq!(v1.seg_table_blocks, 0);
        assert_eq!(v1.sb_copy, 0);
        assert_eq!(v1.data_start + v1.data_blocks, v1.total_blocks);
        // A version-1 superblock (crc at 144, no tier fields) still decodes.
        let sb = Superblock {
            version: 1,
            layout: v1,
            uuid: [1; 16],
            created_ns: 5,
        };
        let mut b = sb.encode();
        le::put_u32(&mut b, 8, 1);
        b[SB_CRC_OFF_V1..].fill(0);
        let c = crc(&b[..SB_CRC_OFF_V1]);
        le::put_u32(&mut b, SB_CRC_OFF_V1, c);
        assert_eq!(Superblock::decode(&b, 64 << 20).unwrap(), sb);
        // A version-2 superblock (the layout of version 3, before special files) too;
        // an unknown version does not.
        let mut b2 = Superblock { version: 3, ..sb }.encode();
        for (v, ok) in [(2, true), (3, true), (5, false)] {
            le::put_u32(&mut b2, 8, v);
            let c = crc(&b2[..SB_CRC_OFF]);
            le::put_u32(&mut b2, SB_CRC_OFF, c);
            assert_eq!(Superblock::decode(&b2, 64 << 20).is_ok(), ok, "version {v}");
        }
        // Version 4 requires the copy in the layout: a version-3 layout stamped 4 (one
        // data block too many) does not decode.
        le::put_u32(&mut b2, 8, 4);
        let c = crc(&b2[..SB_CRC_OFF]);
        le::put_u32(&mut b2, SB_CRC_OFF, c);
        assert!(Superblock::decode(&b2, 64 << 20).is_err());
        let v4 = Superblock {
            version: 4,
            layout: Layout::compute_for(params(), 4).unwrap(),
            ..sb
        };
        let b4 = v4.encode();
        assert_eq!(le::u32(&b4, 8), 4);
        assert_eq!(Superblock::decode(&b4, 64 << 20).unwrap(), v4);
        assert!(!v4.superpages());
        let v5 = Superblock { version: 5, ..v4 };
        assert!(v5.superpages());
        assert_eq!(Superblock::decode(&v5.encode(), 64 << 20).unwrap(), v5);
        // Version 7 requires the logs outside: a version-6 layout stamped 7 does not
        // decode, the layout of version 7 does.
        let mut b7 = Superblock { version: 6, ..v4 }.encode();
        le::put_u32(&mut b7, 8, 7);
        let c = crc(&b7[..SB_CRC_OFF]);
        le::put_u32(&mut b7, SB_CRC_OFF, c);
        assert!(Superblock::decode(&b7, 64 << 20).is_err());
        let v7 = Superblock {
            version: FORMAT_VERSION,
            layout: Layout::compute(params()).unwrap(),
            ..v4
        };
        assert_eq!(Superblock::decode(&v7.encode(), 64 << 20).unwrap(), v7);
        // The copy is the store's only where its layout puts it: the last block.
        assert_eq!(Superblock::decode_copy(&b4, 64 << 20).unwrap(), v4);
        assert!(Superblock::decode_copy(&b4, 128 << 20).is_err());
        assert!(
            Superblock::decode_copy(&b2, 64 << 20).is_err(),
            "no copy before v4"
        );

        let mut p = params();
        p.tiers[0] = TierGeom {
            segments: 40,
            segment_blocks: 256,
        };
        p.tiers[1] = TierGeom {
            segments: 8,
            segment_blocks: 1024,
        };
        let l = Layout::compute(p).unwrap();
        assert!(l.seg_table_blocks >= 1);
        assert_eq!(l.seg_table_start, l.alloc_start + l.alloc_blocks);
        assert_eq!(l.log_start, l.seg_table_start + l.seg_table_blocks);
        assert!(l.seg_entry_off(2, 7) < l.log_start * BLOCK_SIZE_U64);
        assert!(l.seg_entry_off(2, 0) >= l.seg_entry_off(1, 39) + 16);
        let sb = Superblock {
            version: FORMAT_VERSION,
            layout: l,
            uuid: [2; 16],
            created_ns: 6,
        };
        assert_eq!(Superblock::decode(&sb.encode(), 64 << 20).unwrap(), sb);
        // Leaf entries: NVM blocks of the data region, lower-tier blocks outside the
        // header segment.
        use crate::map::tier_entry;
        assert!(l.leaf_valid(l.data_start));
        assert!(!l.leaf_valid(1));
        assert!(!l.leaf_valid(tier_entry(1, 255)));
        assert!(l.leaf_valid(tier_entry(1, 256)));
        assert!(!l.leaf_valid(tier_entry(1, 40 * 256)));
        assert!(l.leaf_valid(tier_entry(2, 8 * 1024 - 1)));
        // This store has no tier 3 (remote).
        assert!(!l.leaf_valid(tier_entry(3, 2000)));
        assert!(!l.leaf_valid(l.data_start | 1 << 56));
        // An HDD without an SSD, tiny segments and too few segments are refused.
        let mut q = p;
        q.tiers[0] = TierGeom::default();
        assert!(Layout::compute(q).is_err());
        q = p;
        q.tiers[0].segment_blocks = 8;
        assert!(Layout::compute(q).is_err());
        q = p;
        q.tiers[1].segments = 2;
        assert!(Layout::compute(q).is_err());

        // A remote tier, below the local ones or alone below NVM (version 6).
        let remote = TierGeom {
            segments: 64,
            segment_blocks: 2048,
        };
        assert_eq!(
            (l.below(0), l.below(1), l.below(2)),
            (Some(1), Some(2), None)
        );
        assert_eq!((l.above(2), l.above(1)), (Some(1), Some(0)));
        for local in [0, 2] {
            let mut r = p;
            r.tiers[2] = remote;
            if local == 0 {
                r.tiers = [TierGeom::default(), TierGeom::default(), remote];
            }
            let l = Layout::compute(r).unwrap();
            let last_local = (local > 0).then_some(local as u8);
            assert_eq!(l.below(last_local.unwrap_or(0)), Some(3));
            assert_eq!(l.above(3), Some(last_local.unwrap_or(0)));
            assert_eq!(l.below(3), None);
            assert!(l.leaf_valid(tier_entry(3, 2048)));
            assert!(!l.leaf_valid(tier_entry(3, 2047)), "the header segment");
            assert!(l.seg_entry_off(3, 63) < l.log_start * BLOCK_SIZE_U64);
            let sb = Superblock {
                version: FORMAT_VERSION,
                layout: l,
                uuid: [2; 16],
                created_ns: 6,
            };
            let mut b = sb.encode();
            assert_eq!(Superblock::decode(&b, 64 << 20).unwrap(), sb);
            // Read as version 5, the remote tier's fields are not there: the layout
            // no longer matches its parameters.
            le::put_u32(&mut b, 8, 5);
            let c = crc(&b[..SB_CRC_OFF]);
            le::put_u32(&mut b, SB_CRC_OFF, c);
            assert!(Superblock::decode(&b, 64 << 20).is_err());
        }
    }

    #[test]
    fn superpage_entries_are_aligned_extents_of_the_data_region() {
        use crate::map::{huge_entry, HUGE_BLOCKS};
        let l = Layout::compute(params()).unwrap();
        let (first, end) = l.huge_range();
        assert!(first >= l.data_start && first % HUGE_BLOCKS == 0 && end % HUGE_BLOCKS == 0);
        assert!(end <= l.data_start + l.data_blocks && end > first);
        assert!(l.huge_valid(huge_entry(first)));
        assert!(l.huge_valid(huge_entry(end - HUGE_BLOCKS)));
        assert!(!l.huge_valid(huge_entry(end)), "past the data region");
        assert!(!l.huge_valid(first), "no flag");
        assert!(!l.huge_valid(huge_entry(first) + 1), "unaligned");
        assert!(!l.huge_valid(huge_entry(first) | 1 << 60), "a tier bit");
        if first >= HUGE_BLOCKS {
            assert!(
                !l.huge_valid(huge_entry(first - HUGE_BLOCKS)),
                "before the data region"
            );
        }
    }

    #[test]
    fn too_small_tier_is_refused() {
        let mut p = params();
        p.total_bytes = 256 << 10;
        assert!(Layout::compute(p).is_err());
        // The logs count only where they sit in the NVM file.
        p.total_bytes = 4 << 20;
        assert!(Layout::compute_for(p, 6).is_err());
        assert!(Layout::compute(p).is_ok());
    }
}
