//! Superblock (block 0), daemon state (block 1) and the layout of the NVM tier.

use crate::{align_up, bad, crc, le, Result, BLOCK_SIZE, BLOCK_SIZE_U64};

/// Magic at the start of the superblock.
pub const SB_MAGIC: &[u8; 8] = b"CAIRNSB\0";
/// Magic at the start of the daemon state block.
pub const STATE_MAGIC: &[u8; 8] = b"CAIRNST\0";
/// Current format version.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the superblock covered by its checksum (the crc sits right after).
const SB_CRC_OFF: usize = 144;

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
}

/// Parameters chosen at mkfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub total_bytes: u64,
    pub nslots: u32,
    pub log_bytes: u64,
    pub inode_count: u64,
}

/// Where every region lives, in blocks. Derived from `Params` by `Layout::compute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub total_blocks: u64,
    pub nslots: u32,
    pub slot_table_start: u64,
    pub alloc_start: u64,
    pub alloc_blocks: u64,
    pub log_start: u64,
    /// Ring blocks per slot (the client page is one more block in front of the ring).
    pub log_blocks: u64,
    pub inode_start: u64,
    pub inode_count: u64,
    pub data_start: u64,
    pub data_blocks: u64,
}

/// Bytes of one slot-table entry.
pub const SLOT_ENTRY_BYTES: u64 = 128;
/// Bytes of one inode.
pub const INODE_BYTES: u64 = 256;

impl Layout {
    /// Compute a layout, or explain why the parameters do not fit.
    pub fn compute(p: Params) -> Result<Layout> {
        if p.nslots == 0 || p.nslots > 4096 {
            return bad("slots must be between 1 and 4096");
        }
        if p.log_bytes < 64 * 1024 || !p.log_bytes.is_multiple_of(BLOCK_SIZE_U64) {
            return bad("log size must be a multiple of 4 KiB and at least 64 KiB");
        }
        if p.inode_count < 16 {
            return bad("at least 16 inodes are needed");
        }
        let total_blocks = p.total_bytes / BLOCK_SIZE_U64;
        let slot_table_start = 2;
        let slot_table_blocks =
            align_up(p.nslots as u64 * SLOT_ENTRY_BYTES, BLOCK_SIZE_U64) / BLOCK_SIZE_U64;
        let log_blocks = p.log_bytes / BLOCK_SIZE_U64;
        let alloc_start = slot_table_start + slot_table_blocks;
        // The allocation state covers data blocks + inodes; size it for an upper bound
        // on data blocks (all blocks), then fix the data region.
        let bitmap_bits = total_blocks + p.inode_count;
        let alloc_blocks = 1 + align_up(bitmap_bits.div_ceil(8), BLOCK_SIZE_U64) / BLOCK_SIZE_U64;
        let log_start = alloc_start + alloc_blocks;
        let inode_start = log_start + p.nslots as u64 * (1 + log_blocks);
        let inode_blocks = align_up(p.inode_count * INODE_BYTES, BLOCK_SIZE_U64) / BLOCK_SIZE_U64;
        let data_start = inode_start + inode_blocks;
        if data_start + 64 > total_blocks {
            return bad(format!(
                "the NVM tier is too small: logs and inodes need {} MiB, have {} MiB",
                ((data_start + 64) * BLOCK_SIZE_U64) >> 20,
                p.total_bytes >> 20
            ));
        }
        Ok(Layout {
            total_blocks,
            nslots: p.nslots,
            slot_table_start,
            alloc_start,
            alloc_blocks,
            log_start,
            log_blocks,
            inode_start,
            inode_count: p.inode_count,
            data_start,
            data_blocks: total_blocks - data_start,
        })
    }

    /// Byte offset of the slot-table entry of `slot`.
    pub fn slot_entry_off(&self, slot: u32) -> u64 {
        self.slot_table_start * BLOCK_SIZE_U64 + slot as u64 * SLOT_ENTRY_BYTES
    }
    /// Byte offset of the client page of `slot`.
    pub fn client_page_off(&self, slot: u32) -> u64 {
        (self.log_start + slot as u64 * (1 + self.log_blocks)) * BLOCK_SIZE_U64
    }
    /// Byte offset of the ring of `slot`.
    pub fn ring_off(&self, slot: u32) -> u64 {
        self.client_page_off(slot) + BLOCK_SIZE_U64
    }
    /// Bytes in a ring.
    pub fn ring_bytes(&self) -> u64 {
        self.log_blocks * BLOCK_SIZE_U64
    }
    /// Byte offset of inode `ino` (caller checks `ino_valid`).
    pub fn inode_off(&self, ino: u64) -> u64 {
        self.inode_start * BLOCK_SIZE_U64 + ino * INODE_BYTES
    }
    /// Inode numbers run from 1 (root) to `inode_count - 1`; 0 is never used.
    pub fn ino_valid(&self, ino: u64) -> bool {
        ino >= 1 && ino < self.inode_count
    }
    /// Whether `blk` is a block of the data region.
    pub fn data_block_valid(&self, blk: u64) -> bool {
        blk >= self.data_start && blk < self.total_blocks
    }
    /// Byte offset of block `blk`.
    pub fn block_off(blk: u64) -> u64 {
        blk * BLOCK_SIZE_U64
    }
}

/// The superblock: immutable after mkfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub layout: Layout,
    pub uuid: [u8; 16],
    pub created_ns: i64,
}

impl Superblock {
    /// Encode into one block.
    pub fn encode(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut b = vec![0u8; BLOCK_SIZE];
        b[0..8].copy_from_slice(SB_MAGIC);
        le::put_u32(&mut b, 8, FORMAT_VERSION);
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
        if v != FORMAT_VERSION {
            return bad(format!("superblock: unsupported format version {v}"));
        }
        if crc(&b[..SB_CRC_OFF]) != le::u32(b, SB_CRC_OFF) {
            return bad("superblock: checksum mismatch");
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
            log_start: le::u64(b, 56),
            log_blocks: le::u64(b, 64),
            inode_start: le::u64(b, 72),
            inode_count: le::u64(b, 80),
            data_start: le::u64(b, 88),
            data_blocks: le::u64(b, 96),
        };
        // The layout must be exactly the one its parameters give.
        let expect = Layout::compute(Params {
            total_bytes: layout.total_blocks.saturating_mul(BLOCK_SIZE_U64),
            nslots: layout.nslots,
            log_bytes: layout.log_blocks.saturating_mul(BLOCK_SIZE_U64),
            inode_count: layout.inode_count,
        })?;
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
            layout,
            uuid,
            created_ns: le::i64(b, 120),
        })
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
        }
    }

    #[test]
    fn layout_regions_are_disjoint_and_ordered() {
        let l = Layout::compute(params()).unwrap();
        assert!(l.slot_table_start < l.alloc_start);
        assert!(l.alloc_start + l.alloc_blocks <= l.log_start);
        assert_eq!(
            l.ring_off(3) + l.ring_bytes(),
            l.inode_start * BLOCK_SIZE_U64
        );
        assert!(l.inode_off(l.inode_count) <= l.data_start * BLOCK_SIZE_U64);
        assert_eq!(l.data_start + l.data_blocks, l.total_blocks);
    }

    #[test]
    fn superblock_roundtrip_and_corruption() {
        let sb = Superblock {
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
    fn too_small_tier_is_refused() {
        let mut p = params();
        p.total_bytes = 4 << 20;
        assert!(Layout::compute(p).is_err());
    }
}
