//! Lower tiers (SSD, HDD): the header in block 0 of each tier device, and the entries of
//! the segment tables kept in NVM.
//!
//! Tier header (block 0 of the device; the rest of segment 0 is unused): magic
//! "CAIRNTR\0", version u32, tier u32 (1 = SSD, 2 = HDD), store uuid [16], segments u64,
//! segment_blocks u64, crc32c u32 of the 48 bytes before it.
//!
//! Segment-table entry (16 bytes per segment, in NVM): `gen` u64, the number of times the
//! segment was written (clients key cached blocks by it), and `written_ns` u64, when it
//! was last written (ns since the Unix epoch; the age used by cleaning).

use crate::superblock::TierGeom;
use crate::{bad, crc, le, Result, BLOCK_SIZE};

pub const TIER_MAGIC: &[u8; 8] = b"CAIRNTR\0";
pub const TIER_VERSION: u32 = 1;
const CRC_OFF: usize = 48;
/// Bytes of one segment-table entry.
pub const SEG_ENTRY_BYTES: u64 = 16;
/// Offsets in a segment-table entry.
pub const SEG_GEN: u64 = 0;
pub const SEG_WRITTEN_NS: u64 = 8;

/// Encode the header of lower tier `tier` of the store `uuid`.
pub fn encode_header(tier: u8, uuid: &[u8; 16], g: &TierGeom) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    b[..8].copy_from_slice(TIER_MAGIC);
    le::put_u32(&mut b, 8, TIER_VERSION);
    le::put_u32(&mut b, 12, tier as u32);
    b[16..32].copy_from_slice(uuid);
    le::put_u64(&mut b, 32, g.segments);
    le::put_u64(&mut b, 40, g.segment_blocks);
    let c = crc(&b[..CRC_OFF]);
    le::put_u32(&mut b, CRC_OFF, c);
    b
}

/// Check that `b` is the header of tier `tier` of store `uuid` with geometry `g`.
pub fn check_header(b: &[u8], tier: u8, uuid: &[u8; 16], g: &TierGeom) -> Result<()> {
    if b.len() < 64 || &b[..8] != TIER_MAGIC {
        return bad("not a Cairn tier (bad magic)");
    }
    if le::u32(b, 8) != TIER_VERSION {
        return bad(format!("unsupported tier version {}", le::u32(b, 8)));
    }
    if crc(&b[..CRC_OFF]) != le::u32(b, CRC_OFF) {
        return bad("tier header checksum mismatch");
    }
    if le::u32(b, 12) != tier as u32 || &b[16..32] != uuid {
        return bad("the tier belongs to another store or is another tier of this one");
    }
    if le::u64(b, 32) != g.segments || le::u64(b, 40) != g.segment_blocks {
        return bad("the tier's geometry does not match the superblock");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_mismatch() {
        let g = TierGeom {
            segments: 10,
            segment_blocks: 256,
        };
        let h = encode_header(1, &[3; 16], &g);
        assert!(check_header(&h, 1, &[3; 16], &g).is_ok());
        assert!(check_header(&h, 2, &[3; 16], &g).is_err());
        assert!(check_header(&h, 1, &[4; 16], &g).is_err());
        let g2 = TierGeom { segments: 11, ..g };
        assert!(check_header(&h, 1, &[3; 16], &g2).is_err());
        let mut c = h.clone();
        c[33] ^= 1;
        assert!(check_header(&c, 1, &[3; 16], &g).is_err());
    }
}
