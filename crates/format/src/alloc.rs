//! Allocation state: written by the daemon at a clean stop, read at the next start
//! (after an unclean stop it is rebuilt by walking every reachable inode instead).
//!
//! Header block: magic "CAIRNAL\0", version u32, reserved u32, data_blocks u64,
//! inode_count u64, crc u32 (covers the header's first 32 bytes and both bitmaps), then
//! from the next block on: the data-block bitmap (bit i = data block `data_start + i` in
//! use) followed directly by the inode bitmap (bit i = inode i in use).

use crate::{bad, crc, le, Result, BLOCK_SIZE};

pub const ALLOC_MAGIC: &[u8; 8] = b"CAIRNAL\0";
pub const ALLOC_VERSION: u32 = 1;

/// Encode the header for the given bitmaps.
pub fn encode_header(data_blocks: u64, inode_count: u64, bitmaps: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    b[..8].copy_from_slice(ALLOC_MAGIC);
    le::put_u32(&mut b, 8, ALLOC_VERSION);
    le::put_u64(&mut b, 16, data_blocks);
    le::put_u64(&mut b, 24, inode_count);
    let c = crate::crc_append(crc(&b[..32]), bitmaps);
    le::put_u32(&mut b, 32, c);
    b
}

/// Bytes of the two bitmaps.
pub fn bitmap_bytes(data_blocks: u64, inode_count: u64) -> usize {
    (data_blocks.div_ceil(8) + inode_count.div_ceil(8)) as usize
}

/// Check a header against the bitmaps that follow it.
pub fn check(header: &[u8], data_blocks: u64, inode_count: u64, bitmaps: &[u8]) -> Result<()> {
    if header.len() < 64 || &header[..8] != ALLOC_MAGIC || le::u32(header, 8) != ALLOC_VERSION {
        return bad("allocation state: bad magic or version");
    }
    if le::u64(header, 16) != data_blocks || le::u64(header, 24) != inode_count {
        return bad("allocation state: sizes do not match the layout");
    }
    if crate::crc_append(crc(&header[..32]), bitmaps) != le::u32(header, 32) {
        return bad("allocation state: checksum mismatch");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_detects_bitmap_change() {
        let mut bm = vec![0u8; super::bitmap_bytes(100, 20)];
        bm[3] = 0xff;
        let h = super::encode_header(100, 20, &bm);
        assert!(super::check(&h, 100, 20, &bm).is_ok());
        bm[4] = 1;
        assert!(super::check(&h, 100, 20, &bm).is_err());
    }
}
