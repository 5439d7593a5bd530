//! The record model the operations see.

use bytemuck::{Pod, Zeroable};
use cairn_area::fs_err;
use std::io;

/// SAM flag bits (SAM specification, section 1.4).
pub mod flag {
    pub const PAIRED: u16 = 0x1;
    pub const PROPER_PAIR: u16 = 0x2;
    pub const UNMAPPED: u16 = 0x4;
    pub const MATE_UNMAPPED: u16 = 0x8;
    pub const REVERSE: u16 = 0x10;
    pub const MATE_REVERSE: u16 = 0x20;
    pub const READ1: u16 = 0x40;
    pub const READ2: u16 = 0x80;
    pub const SECONDARY: u16 = 0x100;
    pub const QC_FAIL: u16 = 0x200;
    pub const DUPLICATE: u16 = 0x400;
    pub const SUPPLEMENTARY: u16 = 0x800;
}

/// The fixed fields of one alignment, as it is kept in a segment (64 bytes, one per
/// read, in an array): positions are 0-based, -1 for none; `end` is the reference end
/// (exclusive) computed from the CIGAR as samtools does (`pos + 1` for an unmapped read
/// or one without CIGAR). `name` and `data` are addresses in the segment: the read name
/// (without its NUL), and the BAM encoding of its CIGAR, sequence, qualities and
/// optional fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable, Default)]
#[repr(C)]
pub struct Core {
    pub ref_id: i32,
    pub pos: i32,
    pub end: i32,
    pub mate_ref_id: i32,
    pub mate_pos: i32,
    pub tlen: i32,
    pub flag: u16,
    pub mapq: u8,
    pub name_len: u8,
    pub l_seq: u32,
    pub n_cigar: u16,
    pub _pad: u16,
    pub data_len: u32,
    pub name: u64,
    pub data: u64,
    pub _pad2: u64,
}

const _: () = assert!(std::mem::size_of::<Core>() == 64);

/// A record as the operations see it, wherever it lives.
#[derive(Debug, Clone, Copy)]
pub struct Rec<'a> {
    pub core: Core,
    pub name: &'a [u8],
}

impl Rec<'_> {
    pub fn flag(&self) -> u16 {
        self.core.flag
    }
}

/// A reference sequence of the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub name: String,
    pub len: u64,
}

/// The reference sequences named by `@SQ` lines of SAM header text, in order.
pub fn references(header: &str) -> io::Result<Vec<Reference>> {
    let mut refs = Vec::new();
    for (i, line) in header.lines().enumerate() {
        if !line.starts_with("@SQ") {
            continue;
        }
        let (mut name, mut len) = (None, None);
        for f in line.split('\t').skip(1) {
            if let Some(v) = f.strip_prefix("SN:") {
                name = Some(v.to_string());
            } else if let Some(v) = f.strip_prefix("LN:") {
                len = v.parse::<u64>().ok();
            }
        }
        match (name, len) {
            (Some(name), Some(len)) => refs.push(Reference { name, len }),
            _ => {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("header line {}: @SQ without SN: and a numeric LN:", i + 1),
                ))
            }
        }
    }
    Ok(refs)
}

/// The reference length a BAM-encoded CIGAR (ops as little-endian u32) covers.
pub fn cigar_ref_len(cigar: &[u8]) -> u32 {
    let mut n = 0u32;
    for op in cigar.chunks_exact(4) {
        let v = u32::from_le_bytes([op[0], op[1], op[2], op[3]]);
        // M, D, N, =, X consume the reference.
        if matches!(v & 0xf, 0 | 2 | 3 | 7 | 8) {
            n = n.saturating_add(v >> 4);
        }
    }
    n
}

/// samtools' `bam_endpos`: the end (exclusive) of a record on its reference.
pub fn end_pos(pos: i32, flag: u16, cigar: &[u8]) -> i32 {
    let len = if flag & flag::UNMAPPED == 0 && !cigar.is_empty() {
        cigar_ref_len(cigar)
    } else {
        1
    };
    let len = if len == 0 { 1 } else { len };
    pos.saturating_add(len.min(i32::MAX as u32) as i32)
}

/// One raw BAM record (the bytes after `block_size`), parsed into its core and the
/// offsets of its parts. Every length is checked against the record's size.
#[derive(Debug)]
pub struct RawRecord<'a> {
    pub core: Core,
    pub name: &'a [u8],
    /// CIGAR, sequence, qualities and optional fields, as BAM encodes them.
    pub data: &'a [u8],
}

/// Parse raw BAM record bytes (`buf` without its `block_size`).
pub fn parse_raw(buf: &[u8]) -> io::Result<RawRecord<'_>> {
    let bad = |what: &str| fs_err(libc::EINVAL, format!("malformed BAM record: {what}"));
    if buf.len() < 32 {
        return Err(bad("shorter than its 32 fixed bytes"));
    }
    let i32_at = |o: usize| i32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
    let u16_at = |o: usize| u16::from_le_bytes(buf[o..o + 2].try_into().unwrap());
    let l_name = buf[8] as usize;
    let n_cigar = u16_at(12);
    let l_seq = i32_at(16);
    if l_seq < 0 {
        return Err(bad("negative sequence length"));
    }
    if l_name == 0 {
        return Err(bad("read name length 0"));
    }
    let name_end = 32 + l_name;
    if buf.len() < name_end {
        return Err(bad("read name past the record"));
    }
    let name = &buf[32..name_end - 1];
    let cigar_len = n_cigar as usize * 4;
    let seq_len = (l_seq as usize).div_ceil(2) + l_seq as usize;
    if buf.len() < name_end + cigar_len + seq_len {
        return Err(bad("CIGAR or sequence past the record"));
    }
    let data = &buf[name_end..];
    if data.len() > u32::MAX as usize {
        return Err(bad("record larger than 4 GiB"));
    }
    let pos = i32_at(4);
    let flag = u16_at(14);
    let core = Core {
        ref_id: i32_at(0),
        pos,
        end: end_pos(pos, flag, &data[..cigar_len]),
        mate_ref_id: i32_at(20),
        mate_pos: i32_at(24),
        tlen: i32_at(28),
        flag,
        mapq: buf[9],
        name_len: name.len() as u8,
        l_seq: l_seq as u32,
        n_cigar,
        _pad: 0,
        data_len: data.len() as u32,
        name: 0,
        data: 0,
        _pad2: 0,
    };
    Ok(RawRecord { core, name, data })
}

/// The BAM bytes (without `block_size`) of a record from its core, name and data: the
/// inverse of [`parse_raw`].
pub fn encode_raw(core: &Core, name: &[u8], data: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&core.ref_id.to_le_bytes());
    out.extend_from_slice(&core.pos.to_le_bytes());
    out.push(name.len() as u8 + 1);
    out.push(core.mapq);
    out.extend_from_slice(&reg2bin(core.pos, core.end).to_le_bytes());
    out.extend_from_slice(&core.n_cigar.to_le_bytes());
    out.extend_from_slice(&core.flag.to_le_bytes());
    out.extend_from_slice(&core.l_seq.to_le_bytes());
    out.extend_from_slice(&core.mate_ref_id.to_le_bytes());
    out.extend_from_slice(&core.mate_pos.to_le_bytes());
    out.extend_from_slice(&core.tlen.to_le_bytes());
    out.extend_from_slice(name);
    out.push(0);
    out.extend_from_slice(data);
}

/// The BAI bin of `[beg, end)` (SAM specification, section 5.3).
pub fn reg2bin(beg: i32, end: i32) -> u16 {
    let (beg, end) = (beg.max(0), (end - 1).max(0));
    let b = if beg >> 14 == end >> 14 {
        ((1 << 15) - 1) / 7 + (beg >> 14)
    } else if beg >> 17 == end >> 17 {
        ((1 << 12) - 1) / 7 + (beg >> 17)
    } else if beg >> 20 == end >> 20 {
        ((1 << 9) - 1) / 7 + (beg >> 20)
    } else if beg >> 23 == end >> 23 {
        ((1 << 6) - 1) / 7 + (beg >> 23)
    } else if beg >> 26 == end >> 26 {
        1 + (beg >> 26)
    } else {
        0
    };
    b as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_records_round_trip() {
        let cigar = [(100u32 << 4).to_le_bytes()].concat();
        let mut data = cigar.clone();
        data.extend_from_slice(&[0x12; 50]);
        data.extend_from_slice(&[30; 100]);
        let core = Core {
            ref_id: 1,
            pos: 1000,
            end: 1100,
            mate_ref_id: 1,
            mate_pos: 1200,
            tlen: 300,
            flag: 0x63,
            mapq: 60,
            name_len: 4,
            l_seq: 100,
            n_cigar: 1,
            data_len: data.len() as u32,
            ..Core::default()
        };
        let mut out = Vec::new();
        encode_raw(&core, b"r001", &data, &mut out);
        let r = parse_raw(&out).unwrap();
        assert_eq!(r.core, core);
        assert_eq!(r.name, b"r001");
        assert_eq!(r.data, &data[..]);
        assert!(parse_raw(&out[..40]).is_err());
        assert!(parse_raw(&out[..10]).is_err());
    }

    #[test]
    fn end_pos_is_samtools() {
        let c = [
            (50u32 << 4).to_le_bytes(),
            ((2u32 << 4) | 1).to_le_bytes(),
            ((3u32 << 4) | 2).to_le_bytes(),
        ]
        .concat();
        assert_eq!(end_pos(10, 0, &c), 63);
        assert_eq!(end_pos(10, flag::UNMAPPED, &c), 11);
        assert_eq!(end_pos(10, 0, &[]), 11);
    }

    #[test]
    fn headers_give_references() {
        let r = references("@HD\tVN:1.6\n@SQ\tSN:chr1\tLN:1000\n@SQ\tSN:chr2\tLN:20\n").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].name, "chr2");
        assert!(references("@SQ\tSN:x\n").is_err());
    }
}
