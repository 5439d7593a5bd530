//! SpaceJMP segments and address spaces as bytes (docs/FORMAT.md, "Segments and address
//! spaces"): the segment window, the header every segment starts with, the layout of the
//! heap inside a segment, and the file that names an address space's segments.
//!
//! A segment is a regular file of the store mapped at one virtual address forever, its
//! *base*. Its first page is its header ([`SegHeader`], then the commit sequence and the
//! named roots); its second page holds the state of its heap; the heap's chunks follow.
//! Pointers inside a segment are plain addresses, valid wherever the segment is mapped,
//! which is always at its base.

use crate::{align_up, bad, crc, le, Result};

/// The segment window: every segment lies in `[WINDOW_BASE, WINDOW_END)` (16 TiB to
/// 80 TiB), below a PIE executable's base (about 85 TiB with 47-bit addresses) and far
/// from `mmap`'s usual range near the top of the address space.
pub const WINDOW_BASE: u64 = 0x1000_0000_0000;
pub const WINDOW_END: u64 = 0x5000_0000_0000;

/// Segments start on 2 MiB boundaries (one PMD); segments of [`BIG`] or more on 1 GiB
/// ones (one PUD), so that moving their page tables is one entry.
pub const ALIGN: u64 = 2 << 20;
pub const BIG: u64 = 1 << 30;

/// The header page, the heap-state page, and the unit the heap hands out memory in.
pub const PAGE: u64 = 4096;
pub const CHUNK: u64 = 64 << 10;

/// The alignment of a segment of `len` bytes.
pub fn alignment(len: u64) -> u64 {
    if len >= BIG {
        BIG
    } else {
        ALIGN
    }
}

/// The address range a segment of `len` bytes occupies in the window: `len` rounded up
/// to its alignment.
pub fn reserved_len(len: u64) -> u64 {
    align_up(len, alignment(len))
}

/// The smallest segment: the header page, the heap page and one chunk of heap.
pub const MIN_LEN: u64 = 2 * CHUNK;

/// Segment flags.
pub mod flags {
    /// Switching into an address space with this segment takes its lock: the reader lock
    /// where it is read-only, the writer lock where it is writable.
    pub const LOCKABLE: u32 = 1;
    /// The segment may share addresses with other segments that allow it (address spaces
    /// that hold such segments are switched by moving page tables).
    pub const OVERLAP: u32 = 2;
    pub const ALL: u32 = LOCKABLE | OVERLAP;
}

/// Protections.
pub mod prot {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const RW: u32 = READ | WRITE;
}

pub const SEG_MAGIC: &[u8; 8] = b"CAIRNSJ\0";
pub const SEG_VERSION: u32 = 1;
/// Bytes of the fixed part of the header (crc-checked).
pub const SEG_HEADER_LEN: usize = 64;
/// The commit sequence: the number of commits the segment has had (u64, at this offset
/// of the header page; written by every commit).
pub const COMMIT_SEQ_OFF: u64 = 64;
/// A **staged commit** (one too large for a transaction of the log): the commit
/// sequence it makes (u64 at this offset of the header page; 0: none). Written by one
/// transaction once the segment's stage file ([`StageHeader`]) holds the whole commit:
/// that transaction is the commit point. While it is set, the segment's committed state
/// is the file with the staged runs laid over it; it is cleared (0) once they are copied
/// into the file.
pub const REDO_SEQ_OFF: u64 = 72;
/// The named roots: [`ROOTS`] entries of [`ROOT_LEN`] bytes from [`ROOTS_OFF`]: a name
/// length (u8, 0: free), the name (at most [`ROOT_NAME_MAX`] bytes), the address (u64 at
/// the entry's last 8 bytes).
pub const ROOTS_OFF: u64 = 128;
pub const ROOT_LEN: u64 = 64;
pub const ROOTS: u64 = 62;
pub const ROOT_NAME_MAX: usize = 55;
/// Where the heap's state starts (the second page).
pub const HEAP_STATE_OFF: u64 = PAGE;

/// The fixed part of a segment's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegHeader {
    pub flags: u32,
    /// Protections the segment allows (`prot::*`); an address space may grant less.
    pub prot: u32,
    pub base: u64,
    pub len: u64,
    /// The inode number of the segment's file when it was made (its id).
    pub ino: u64,
    pub created_ns: i64,
}

impl SegHeader {
    /// The header's 64 bytes: magic, version u32, flags u32, base, len, prot u32,
    /// pad u32, ino, created, reserved u32, crc32c of bytes 0..60 u32.
    pub fn encode(&self) -> [u8; SEG_HEADER_LEN] {
        let mut b = [0u8; SEG_HEADER_LEN];
        b[..8].copy_from_slice(SEG_MAGIC);
        le::put_u32(&mut b, 8, SEG_VERSION);
        le::put_u32(&mut b, 12, self.flags);
        le::put_u64(&mut b, 16, self.base);
        le::put_u64(&mut b, 24, self.len);
        le::put_u32(&mut b, 32, self.prot);
        le::put_u64(&mut b, 40, self.ino);
        le::put_i64(&mut b, 48, self.created_ns);
        let c = crc(&b[..60]);
        le::put_u32(&mut b, 60, c);
        b
    }

    /// Decode and validate (magic, version, crc, a base and length the window allows).
    pub fn decode(b: &[u8]) -> Result<SegHeader> {
        if b.len() < SEG_HEADER_LEN {
            return bad("segment header: too short");
        }
        if &b[..8] != SEG_MAGIC {
            return bad("not a segment (no segment header)");
        }
        let v = le::u32(b, 8);
        if v != SEG_VERSION {
            return bad(format!("segment header: unsupported version {v}"));
        }
        if crc(&b[..60]) != le::u32(b, 60) {
            return bad("segment header: checksum mismatch (damaged)");
        }
        let h = SegHeader {
            flags: le::u32(b, 12),
            base: le::u64(b, 16),
            len: le::u64(b, 24),
            prot: le::u32(b, 32),
            ino: le::u64(b, 40),
            created_ns: le::i64(b, 48),
        };
        check_range(h.base, h.len)?;
        if h.flags & !flags::ALL != 0 || h.prot & !prot::RW != 0 || h.prot & prot::READ == 0 {
            return bad("segment header: unknown flags or protections");
        }
        Ok(h)
    }
}

/// `Ok` when a segment of `len` bytes at `base` fits the window, aligned as
/// [`alignment`] says.
pub fn check_range(base: u64, len: u64) -> Result<()> {
    if len < MIN_LEN || !len.is_multiple_of(PAGE) {
        return bad(format!(
            "segment length {len:#x}: a multiple of 4 KiB, at least {MIN_LEN} bytes"
        ));
    }
    let end = base.checked_add(reserved_len(len));
    if base < WINDOW_BASE || end.is_none_or(|e| e > WINDOW_END) {
        return bad(format!(
            "segment {base:#x}+{len:#x} is outside the segment window \
             {WINDOW_BASE:#x}..{WINDOW_END:#x}"
        ));
    }
    if !base.is_multiple_of(alignment(len)) {
        return bad(format!(
            "segment base {base:#x} is not aligned to {:#x} (segments of 1 GiB or more are \
             1 GiB aligned, others 2 MiB)",
            alignment(len)
        ));
    }
    Ok(())
}

/// A named root's entry (`ROOT_LEN` bytes) for `name` and `addr`; `None` for a name that
/// is empty or longer than [`ROOT_NAME_MAX`].
pub fn encode_root(name: &[u8], addr: u64) -> Option<[u8; ROOT_LEN as usize]> {
    if name.is_empty() || name.len() > ROOT_NAME_MAX {
        return None;
    }
    let mut b = [0u8; ROOT_LEN as usize];
    b[0] = name.len() as u8;
    b[1..1 + name.len()].copy_from_slice(name);
    le::put_u64(&mut b, ROOT_LEN as usize - 8, addr);
    Some(b)
}

/// A root entry's name and address (`None`: a free entry).
pub fn decode_root(b: &[u8]) -> Option<(&[u8], u64)> {
    let n = *b.first()? as usize;
    if n == 0 || n > ROOT_NAME_MAX || b.len() < ROOT_LEN as usize {
        return None;
    }
    Some((&b[1..1 + n], le::u64(b, ROOT_LEN as usize - 8)))
}

/// The heap inside a segment (its state at [`HEAP_STATE_OFF`]; docs/FORMAT.md). Memory is
/// handed out in 64 KiB chunks: a *run* is one chunk cut into objects of one size class;
/// a *span* is one or more chunks holding one large object. Each starts with a
/// [`CHUNK_HEADER`]-byte header, so the header of any object is at its address rounded
/// down to a chunk (objects of a span start right after the header).
pub mod heap {
    pub const MAGIC: u64 = u64::from_le_bytes(*b"SJHEAP02");
    /// Offsets in the heap state.
    pub const MAGIC_OFF: u64 = 0;
    /// The first chunk never handed out (an offset from the base).
    pub const NEXT_CHUNK_OFF: u64 = 8;
    /// The end of the heap (the segment's length rounded down to a chunk).
    pub const END_OFF: u64 = 16;
    /// The first free span (an offset from the base; 0: none).
    pub const FREE_SPANS_OFF: u64 = 24;
    /// Bytes handed out (object sizes, rounded to their class) and objects live.
    pub const BYTES_OFF: u64 = 32;
    pub const OBJECTS_OFF: u64 = 40;
    /// Per size class (32 bytes each from here): the first free object (an address;
    /// 0: none), then the bump range `[bump, bump_end)` of the class's newest run.
    pub const CLASSES_OFF: u64 = 64;
    pub const CLASS_LEN: u64 = 32;
    /// Object sizes of the classes, four per doubling from 64 bytes (an object wastes
    /// at most a quarter of its size, and 16 bytes); larger objects get spans.
    pub const CLASSES: [u64; 24] = [
        16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896,
        1024, 1280, 1536, 1792, 2048,
    ];
    // The classes' state fits in the heap state page.
    const _: () = assert!(CLASSES_OFF + CLASSES.len() as u64 * CLASS_LEN <= super::PAGE);
    const _: () = assert!(CLASSES[0] == 16 && CLASSES[CLASSES.len() - 1] == 2048);

    /// The first chunk of the heap (chunk 0 holds the header and state pages).
    pub const FIRST_CHUNK: u64 = super::CHUNK;

    /// A chunk's header: magic u32, kind u32, class u32 (runs), pad u32, chunks u64
    /// (spans, free spans), next u64 (free spans: the next free span's offset).
    pub const CHUNK_HEADER: u64 = 64;
    pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"SJCK");
    pub const KIND_RUN: u32 = 1;
    pub const KIND_SPAN: u32 = 2;
    pub const KIND_FREE: u32 = 3;

    /// The class of an object of `n` bytes (`None`: a span).
    pub fn class_of(n: u64) -> Option<usize> {
        CLASSES.iter().position(|&c| n <= c)
    }
}

pub const VAS_MAGIC: &[u8; 8] = b"CAIRNVAS";
pub const VAS_VERSION: u32 = 1;
const VAS_HEADER: usize = 24;
const VAS_ENTRY: usize = 48;

/// One segment of an address space, as its file lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VasEntry {
    /// The segment's file: inode number and generation (a replaced file is not it).
    pub ino: u64,
    pub gen: u64,
    pub base: u64,
    pub len: u64,
    /// What the address space grants (`prot::*`).
    pub prot: u32,
    /// The segment's flags (`flags::*`), copied from its header.
    pub flags: u32,
    /// The segment's path in the store.
    pub path: String,
}

/// An address space's file: magic, version u32, count u32, crc32c of the entries u32,
/// length u32 (of the whole encoding: bytes after it are ignored, so the file can be
/// rewritten in place, longer or shorter); then per entry ino, gen, base, len, prot u32,
/// flags u32, path length u32, pad u32, the path padded to 8 bytes.
pub fn encode_vas(entries: &[VasEntry]) -> Vec<u8> {
    let mut b = vec![0u8; VAS_HEADER];
    for e in entries {
        let at = b.len();
        let path = e.path.as_bytes();
        b.resize(at + VAS_ENTRY + align_up(path.len() as u64, 8) as usize, 0);
        le::put_u64(&mut b, at, e.ino);
        le::put_u64(&mut b, at + 8, e.gen);
        le::put_u64(&mut b, at + 16, e.base);
        le::put_u64(&mut b, at + 24, e.len);
        le::put_u32(&mut b, at + 32, e.prot);
        le::put_u32(&mut b, at + 36, e.flags);
        le::put_u32(&mut b, at + 40, path.len() as u32);
        b[at + VAS_ENTRY..at + VAS_ENTRY + path.len()].copy_from_slice(path);
    }
    b[..8].copy_from_slice(VAS_MAGIC);
    le::put_u32(&mut b, 8, VAS_VERSION);
    le::put_u32(&mut b, 12, entries.len() as u32);
    let c = crc(&b[VAS_HEADER..]);
    le::put_u32(&mut b, 16, c);
    let n = b.len() as u32;
    le::put_u32(&mut b, 20, n);
    b
}

/// Decode and validate an address space's file.
pub fn decode_vas(b: &[u8]) -> Result<Vec<VasEntry>> {
    if b.len() < VAS_HEADER || &b[..8] != VAS_MAGIC {
        return bad("not an address space (no VAS header)");
    }
    let v = le::u32(b, 8);
    if v != VAS_VERSION {
        return bad(format!("address space: unsupported version {v}"));
    }
    let n = le::u32(b, 20) as usize;
    if n < VAS_HEADER || n > b.len() {
        return bad("address space: bad length");
    }
    let b = &b[..n];
    if crc(&b[VAS_HEADER..]) != le::u32(b, 16) {
        return bad("address space: checksum mismatch (damaged)");
    }
    let count = le::u32(b, 12) as usize;
    let mut out = Vec::new();
    let mut at = VAS_HEADER;
    for _ in 0..count {
        if b.len() < at + VAS_ENTRY {
            return bad("address space: truncated entry");
        }
        let plen = le::u32(b, at + 40) as usize;
        let end = at + VAS_ENTRY + align_up(plen as u64, 8) as usize;
        if plen == 0 || plen > 4096 || b.len() < end {
            return bad("address space: bad path length");
        }
        let path = std::str::from_utf8(&b[at + VAS_ENTRY..at + VAS_ENTRY + plen])
            .map_err(|_| crate::FormatError("address space: a path is not UTF-8".into()))?;
        let e = VasEntry {
            ino: le::u64(b, at),
            gen: le::u64(b, at + 8),
            base: le::u64(b, at + 16),
            len: le::u64(b, at + 24),
            prot: le::u32(b, at + 32),
            flags: le::u32(b, at + 36),
            path: path.to_string(),
        };
        check_range(e.base, e.len)?;
        if e.prot & !prot::RW != 0 || e.prot & prot::READ == 0 || e.flags & !flags::ALL != 0 {
            return bad("address space: unknown protections or flags");
        }
        out.push(e);
        at = end;
    }
    if at != b.len() {
        return bad("address space: trailing bytes");
    }
    Ok(out)
}

pub const STAGE_MAGIC: &[u8; 8] = b"SJSTAGE1";
pub const STAGE_HEADER_LEN: usize = 64;
/// The most runs a stage file lists (a commit has at most one per 4 KiB page it
/// changed, and a segment is at most the window's 64 TiB: bounded well below).
pub const STAGE_MAX_RUNS: u64 = 1 << 24;

/// The head of a segment's **stage file** (`/.sj/stage/<ino>-<gen>`): a commit too large
/// for one transaction of the log, staged before its commit point. Bytes: magic
/// `SJSTAGE1`, the commit sequence it makes u64, the segment's inode number u64 and
/// generation u64, the number of runs u64, reserved u64 (0), reserved u32 (0), crc32c
/// u32 of bytes 0..60 and of the run table; at 64, the run table: (offset, length) u64
/// pairs in the segment, sorted and not overlapping; from [`StageHeader::data_off`] (the
/// table's end rounded up to 4 KiB) the runs' bytes, back to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageHeader {
    pub seq: u64,
    pub ino: u64,
    pub gen: u64,
    pub runs: Vec<(u64, u64)>,
}

impl StageHeader {
    /// Bytes of the head and table for `nruns` runs.
    pub fn table_end(nruns: u64) -> u64 {
        STAGE_HEADER_LEN as u64 + 16 * nruns
    }

    /// Where the runs' bytes start.
    pub fn data_off(&self) -> u64 {
        align_up(Self::table_end(self.runs.len() as u64), PAGE)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::table_end(self.runs.len() as u64) as usize];
        b[..8].copy_from_slice(STAGE_MAGIC);
        le::put_u64(&mut b, 8, self.seq);
        le::put_u64(&mut b, 16, self.ino);
        le::put_u64(&mut b, 24, self.gen);
        le::put_u64(&mut b, 32, self.runs.len() as u64);
        for (i, &(o, l)) in self.runs.iter().enumerate() {
            le::put_u64(&mut b, STAGE_HEADER_LEN + 16 * i, o);
            le::put_u64(&mut b, STAGE_HEADER_LEN + 16 * i + 8, l);
        }
        let c = stage_crc(&b);
        le::put_u32(&mut b, 60, c);
        b
    }

    /// The number of runs the head `b` (at least [`STAGE_HEADER_LEN`] bytes) announces,
    /// to read the whole table.
    pub fn runs_in(b: &[u8]) -> Result<u64> {
        if b.len() < STAGE_HEADER_LEN || &b[..8] != STAGE_MAGIC {
            return bad("not a stage file");
        }
        let n = le::u64(b, 32);
        if n > STAGE_MAX_RUNS {
            return bad(format!("stage file: {n} runs"));
        }
        Ok(n)
    }

    /// Decode and validate the head and table `b` for segment (`ino`, `gen`) of `len`
    /// bytes.
    pub fn decode(b: &[u8], ino: u64, gen: u64, len: u64) -> Result<StageHeader> {
        let n = Self::runs_in(b)?;
        let end = Self::table_end(n) as usize;
        if b.len() < end {
            return bad("stage file: run table cut short");
        }
        if le::u32(b, 60) != stage_crc(&b[..end]) {
            return bad("stage file: checksum mismatch");
        }
        let h = StageHeader {
            seq: le::u64(b, 8),
            ino: le::u64(b, 16),
            gen: le::u64(b, 24),
            runs: (0..n as usize)
                .map(|i| {
                    (
                        le::u64(b, STAGE_HEADER_LEN + 16 * i),
                        le::u64(b, STAGE_HEADER_LEN + 16 * i + 8),
                    )
                })
                .collect(),
        };
        if (h.ino, h.gen) != (ino, gen) {
            return bad("stage file: of another segment");
        }
        let mut at = 0;
        for &(o, l) in &h.runs {
            if o < at || l == 0 || o.checked_add(l).is_none_or(|e| e > len) {
                return bad("stage file: runs out of order or outside the segment");
            }
            at = o + l;
        }
        Ok(h)
    }
}

impl StageHeader {
    /// Read and check the stage file of segment (`ino`, `gen`, `len` bytes) whose marker
    /// names commit `redo`, with `read(buf, at)` filling `buf` from the stage file (an
    /// error if it is shorter) and `size` its size (a run table it cannot hold is not
    /// read: nothing is allocated by what the file claims). Both the segment's users and
    /// the daemon (which builds resident copies) read staged commits this way.
    pub fn load(
        read: &mut dyn FnMut(&mut [u8], u64) -> std::io::Result<()>,
        size: u64,
        (ino, gen, len): (u64, u64, u64),
        redo: u64,
    ) -> std::io::Result<StageHeader> {
        let damaged = |why: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("damaged segment: its staged commit {redo}: {why}"),
            )
        };
        let mut head = vec![0u8; STAGE_HEADER_LEN];
        read(&mut head, 0)?;
        let n = Self::runs_in(&head).map_err(|e| damaged(e.0))?;
        if Self::table_end(n) > size {
            return Err(damaged(format!("{n} runs in a file of {size} bytes")));
        }
        let mut table = vec![0u8; Self::table_end(n) as usize];
        read(&mut table, 0)?;
        let h = Self::decode(&table, ino, gen, len).map_err(|e| damaged(e.0))?;
        if h.seq != redo {
            return Err(damaged(format!("it stages commit {}", h.seq)));
        }
        Ok(h)
    }

    /// Lay the staged runs over `buf`, the segment's bytes from `off`, reading the
    /// stage file with `read(buf, at)`.
    pub fn overlay(
        &self,
        off: u64,
        buf: &mut [u8],
        read: &mut dyn FnMut(&mut [u8], u64) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let end = off + buf.len() as u64;
        let mut at = self.data_off();
        for &(o, l) in &self.runs {
            let (s, e) = (o.max(off), (o + l).min(end));
            if s < e {
                read(
                    &mut buf[(s - off) as usize..(e - off) as usize],
                    at + (s - o),
                )?;
            }
            at += l;
        }
        Ok(())
    }
}

/// Zero the staged-commit marker ([`REDO_SEQ_OFF`]) where `buf`, the segment's bytes
/// from `off`, covers it: a resident copy never carries the marker.
pub fn clear_marker(off: u64, buf: &mut [u8]) {
    let (m, end) = (REDO_SEQ_OFF, REDO_SEQ_OFF + 8);
    let (s, e) = (m.max(off), end.min(off + buf.len() as u64));
    if s < e {
        buf[(s - off) as usize..(e - off) as usize].fill(0);
    }
}

/// crc32c of a stage head and table, its crc field (bytes 60..64) left out.
fn stage_crc(b: &[u8]) -> u32 {
    let c = crate::crc(&b[..60]);
    crate::crc_append(c, &b[64..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stage_header_roundtrip_and_damage() {
        let h = StageHeader {
            seq: 9,
            ino: 42,
            gen: 3,
            runs: vec![(64, 16), (4096, 8192), (1 << 20, 4096)],
        };
        let b = h.encode();
        assert_eq!(StageHeader::runs_in(&b).unwrap(), 3);
        assert_eq!(StageHeader::decode(&b, 42, 3, 2 << 20).unwrap(), h);
        assert_eq!(h.data_off(), 4096);
        assert!(
            StageHeader::decode(&b, 42, 4, 2 << 20).is_err(),
            "another segment"
        );
        assert!(
            StageHeader::decode(&b, 42, 3, 1 << 20).is_err(),
            "past the end"
        );
        assert!(StageHeader::decode(&b[..b.len() - 1], 42, 3, 2 << 20).is_err());
        for i in [0, 9, 33, 70, b.len() - 1] {
            let mut d = b.clone();
            d[i] ^= 1;
            assert!(StageHeader::decode(&d, 42, 3, 2 << 20).is_err(), "byte {i}");
        }
        let unsorted = StageHeader {
            runs: vec![(4096, 10), (0, 10)],
            ..h
        };
        assert!(StageHeader::decode(&unsorted.encode(), 42, 3, 2 << 20).is_err());
    }

    fn header() -> SegHeader {
        SegHeader {
            flags: flags::LOCKABLE,
            prot: prot::RW,
            base: WINDOW_BASE + BIG,
            len: BIG,
            ino: 42,
            created_ns: 7,
        }
    }

    #[test]
    fn header_roundtrip_and_damage() {
        let h = header();
        let b = h.encode();
        assert_eq!(SegHeader::decode(&b).unwrap(), h);
        let mut d = b;
        d[20] ^= 1;
        assert!(SegHeader::decode(&d).unwrap_err().0.contains("checksum"));
        assert!(SegHeader::decode(&[0u8; 64]).is_err());
    }

    #[test]
    fn ranges_follow_the_window_and_alignment() {
        assert!(check_range(WINDOW_BASE, 2 << 20).is_ok());
        assert!(check_range(WINDOW_BASE + (2 << 20), 4 << 20).is_ok());
        // 1 GiB and more: 1 GiB aligned.
        assert!(check_range(WINDOW_BASE + (2 << 20), BIG).is_err());
        assert!(check_range(WINDOW_BASE + BIG, BIG).is_ok());
        assert!(check_range(WINDOW_BASE - ALIGN, ALIGN).is_err());
        assert!(check_range(WINDOW_END - ALIGN, 4 << 20).is_err());
        assert!(check_range(WINDOW_BASE, 0).is_err());
        assert!(check_range(WINDOW_BASE, 4097).is_err());
        assert!(check_range(u64::MAX - 4095, 1 << 20).is_err());
        assert_eq!(reserved_len(4096 * 33), ALIGN);
        assert_eq!(reserved_len(BIG + 1), 2 * BIG);
    }

    #[test]
    fn roots() {
        let e = encode_root(b"list", 0x1234).unwrap();
        assert_eq!(decode_root(&e), Some((&b"list"[..], 0x1234)));
        assert!(encode_root(b"", 1).is_none());
        assert!(encode_root(&[b'a'; 56], 1).is_none());
        assert_eq!(decode_root(&[0u8; 64]), None);
    }

    #[test]
    fn vas_roundtrip() {
        let v = vec![
            VasEntry {
                ino: 5,
                gen: 1,
                base: WINDOW_BASE,
                len: 4 << 20,
                prot: prot::READ,
                flags: 0,
                path: "/.sj/seg/a".into(),
            },
            VasEntry {
                ino: 9,
                gen: 3,
                base: WINDOW_BASE + BIG,
                len: BIG,
                prot: prot::RW,
                flags: flags::LOCKABLE,
                path: "/data/big segment".into(),
            },
        ];
        let b = encode_vas(&v);
        assert_eq!(decode_vas(&b).unwrap(), v);
        // Bytes after the encoding (a longer file rewritten shorter) are ignored.
        let mut longer = b.clone();
        longer.extend_from_slice(&[0xee; 40]);
        assert_eq!(decode_vas(&longer).unwrap(), v);
        assert_eq!(decode_vas(&encode_vas(&[])).unwrap(), vec![]);
        let mut d = b.clone();
        d[30] ^= 4;
        assert!(decode_vas(&d).is_err());
    }

    proptest! {
        /// The decoders never panic, whatever the bytes.
        #[test]
        fn decoders_take_any_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = SegHeader::decode(&b);
            let _ = decode_vas(&b);
            let _ = decode_root(&b);
        }

        /// Any VAS file with a valid checksum over damaged entries still decodes or fails
        /// cleanly.
        #[test]
        fn vas_with_fixed_crc(mut b in proptest::collection::vec(any::<u8>(), 24..300)) {
            b[..8].copy_from_slice(VAS_MAGIC);
            b[8..12].copy_from_slice(&VAS_VERSION.to_le_bytes());
            let n = b.len() as u32;
            b[20..24].copy_from_slice(&n.to_le_bytes());
            let c = crc(&b[24..]);
            b[16..20].copy_from_slice(&c.to_le_bytes());
            let _ = decode_vas(&b);
        }
    }
}
