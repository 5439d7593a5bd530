//! The operation log: a ring of transactions in the client's slot. Positions are log
//! sequence numbers (LSNs): byte positions that only grow; the ring offset is
//! `lsn % ring_bytes`. Every transaction starts on a 64-byte boundary and never straddles
//! the end of the ring: when it would, a `WRAP` transaction fills the rest of the lap.
//!
//! Transaction header (32 bytes): magic u32 "CNTX", version u16, kind u16 (1 commit,
//! 2 wrap), seq u64, len u32 (whole transaction, multiple of 64), nrec u32,
//! reserved u32 (0), crc u32. The crc32c covers bytes 0..28 and 32..len (records and zero
//! padding). A transaction is committed iff its magic, version, expected seq, length and
//! crc are all right: this is the commit record, written and persisted with the rest.
//!
//! Records (each a multiple of 8 bytes): type u16, flags u16 (0), len u32, then:
//! * `INODE_SET` (type 1, 96 bytes): ino, generation, kind u8 + 3 pad, perm u32, uid u32,
//!   gid u32, nlink, size, atime, mtime, ctime, btime, parent (directories) or device
//!   number (device nodes).
//! * `WRITE` (type 2): ino, offset, size-after, mtime-after (also the ctime), data_len u32,
//!   pad u32, data padded to 8.
//! * `DIRENT_SET` (type 3): dir, ino (0 = remove), kind u8, name_len u8, 6 pad, name
//!   padded to 8.
//! * `PUNCH` (type 4, 40 bytes, format version 3): ino, offset, len, mtime-after (also
//!   the ctime): bytes `[offset, offset + len)` of the file become a hole (read as zeros;
//!   whole blocks in the range are freed). The size does not change.

use crate::inode::{Attrs, Kind};
use crate::{bad, crc, le, valid_name, Result, MAX_FILE_SIZE};

pub const TXN_MAGIC: u32 = 0x5854_4E43; // "CNTX"
pub const TXN_VERSION: u16 = 1;
pub const TXN_HEADER: usize = 32;
pub const TXN_ALIGN: u64 = 64;
pub const KIND_COMMIT: u16 = 1;
pub const KIND_WRAP: u16 = 2;

pub const REC_INODE_SET: u16 = 1;
pub const REC_WRITE: u16 = 2;
pub const REC_DIRENT_SET: u16 = 3;
pub const REC_PUNCH: u16 = 4;

pub const INODE_SET_LEN: usize = 96;
pub const WRITE_HEADER_LEN: usize = 48;
pub const DIRENT_HEADER_LEN: usize = 32;
pub const PUNCH_LEN: usize = 40;

/// One decoded record, borrowing names and data from the transaction bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    InodeSet {
        ino: u64,
        generation: u64,
        attrs: Attrs,
    },
    Write {
        ino: u64,
        offset: u64,
        size: u64,
        mtime: i64,
        data: &'a [u8],
    },
    DirentSet {
        dir: u64,
        name: &'a [u8],
        ino: u64,
        kind: Kind,
    },
    Punch {
        ino: u64,
        offset: u64,
        len: u64,
        mtime: i64,
    },
}

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

impl Record<'_> {
    /// Encoded length of the record.
    pub fn encoded_len(&self) -> usize {
        match self {
            Record::InodeSet { .. } => INODE_SET_LEN,
            Record::Write { data, .. } => WRITE_HEADER_LEN + pad8(data.len()),
            Record::DirentSet { name, .. } => DIRENT_HEADER_LEN + pad8(name.len()),
            Record::Punch { .. } => PUNCH_LEN,
        }
    }

    /// Encode into `out[..encoded_len()]` (which must be zeroed or will be overwritten).
    pub fn encode_into(&self, out: &mut [u8]) {
        let len = self.encoded_len();
        let out = &mut out[..len];
        match self {
            Record::InodeSet {
                ino,
                generation,
                attrs: a,
            } => {
                encode_inode_set(out, *ino, *generation, a);
            }
            Record::Write {
                ino,
                offset,
                size,
                mtime,
                data,
            } => {
                encode_write_header(out, *ino, *offset, *size, *mtime, data.len());
                out[WRITE_HEADER_LEN..WRITE_HEADER_LEN + data.len()].copy_from_slice(data);
                out[WRITE_HEADER_LEN + data.len()..].fill(0);
            }
            Record::DirentSet {
                dir,
                name,
                ino,
                kind,
            } => {
                put_rec_header(out, REC_DIRENT_SET, len);
                le::put_u64(out, 8, *dir);
                le::put_u64(out, 16, *ino);
                out[24] = *kind as u8;
                out[25] = name.len() as u8;
                out[26..32].fill(0);
                out[32..32 + name.len()].copy_from_slice(name);
                out[32 + name.len()..].fill(0);
            }
            Record::Punch {
                ino,
                offset,
                len: n,
                mtime,
            } => {
                put_rec_header(out, REC_PUNCH, len);
                le::put_u64(out, 8, *ino);
                le::put_u64(out, 16, *offset);
                le::put_u64(out, 24, *n);
                le::put_i64(out, 32, *mtime);
            }
        }
    }

    /// Data-region blocks a record may need when digested, for space credits: the 4 KiB
    /// blocks a `WRITE` touches, the partial blocks at the ends of a `PUNCH` (rewritten
    /// with zeros); 0 for metadata records (served from the metadata reserve).
    pub fn charge(&self) -> u64 {
        match self {
            Record::Write { offset, data, .. } => write_charge(*offset, data.len() as u64),
            Record::Punch { offset, len, .. } => punch_charge(*offset, *len),
            _ => 0,
        }
    }
}

/// Blocks touched by a write of `len` bytes at `offset`.
pub fn write_charge(offset: u64, len: u64) -> u64 {
    if len == 0 {
        0
    } else {
        (offset + len).div_ceil(4096) - offset / 4096
    }
}

/// Blocks a punch of `len` bytes at `offset` may rewrite: its partial end blocks.
pub fn punch_charge(offset: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    let end = offset + len;
    let (first, last) = (offset / 4096, (end - 1) / 4096);
    let head = !offset.is_multiple_of(4096);
    let tail = !end.is_multiple_of(4096);
    if first == last {
        (head || tail) as u64
    } else {
        head as u64 + tail as u64
    }
}

fn put_rec_header(out: &mut [u8], ty: u16, len: usize) {
    le::put_u16(out, 0, ty);
    le::put_u16(out, 2, 0);
    le::put_u32(out, 4, len as u32);
}

/// Encode an `INODE_SET` record into `out[..96]`.
pub fn encode_inode_set(out: &mut [u8], ino: u64, generation: u64, a: &Attrs) {
    put_rec_header(out, REC_INODE_SET, INODE_SET_LEN);
    le::put_u64(out, 8, ino);
    le::put_u64(out, 16, generation);
    out[24] = a.kind as u8;
    out[25..28].fill(0);
    le::put_u32(out, 28, a.perm);
    le::put_u32(out, 32, a.uid);
    le::put_u32(out, 36, a.gid);
    le::put_u64(out, 40, a.nlink);
    le::put_u64(out, 48, a.size);
    le::put_i64(out, 56, a.atime);
    le::put_i64(out, 64, a.mtime);
    le::put_i64(out, 72, a.ctime);
    le::put_i64(out, 80, a.btime);
    le::put_u64(out, 88, a.slot());
}

/// Encode a `WRITE` record header into `out[..48]` (the data follows, padded to 8).
pub fn encode_write_header(out: &mut [u8], ino: u64, offset: u64, size: u64, mtime: i64, n: usize) {
    put_rec_header(out, REC_WRITE, WRITE_HEADER_LEN + pad8(n));
    le::put_u64(out, 8, ino);
    le::put_u64(out, 16, offset);
    le::put_u64(out, 24, size);
    le::put_i64(out, 32, mtime);
    le::put_u32(out, 40, n as u32);
    le::put_u32(out, 44, 0);
}

/// Length of a commit transaction holding records of `payload` bytes.
pub fn txn_len(payload: usize) -> usize {
    crate::align_up((TXN_HEADER + payload) as u64, TXN_ALIGN) as usize
}

/// Length of a `WRITE` transaction carrying `n` data bytes (one record).
pub fn write_txn_len(n: usize) -> usize {
    txn_len(WRITE_HEADER_LEN + pad8(n))
}

/// Write the header of a transaction of `len` bytes into `h[..32]`, the crc field left
/// zero: the crc covers `h[..28]` and every byte after the header ([`seal_txn`], or
/// [`write_txn_head`] for one whose data is written elsewhere).
fn put_txn_header(h: &mut [u8], kind: u16, seq: u64, len: usize, nrec: u32) {
    debug_assert!(len.is_multiple_of(TXN_ALIGN as usize) && len >= TXN_HEADER);
    le::put_u32(h, 0, TXN_MAGIC);
    le::put_u16(h, 4, TXN_VERSION);
    le::put_u16(h, 6, kind);
    le::put_u64(h, 8, seq);
    le::put_u32(h, 16, len as u32);
    le::put_u32(h, 20, nrec);
    le::put_u32(h, 24, 0);
    le::put_u32(h, 28, 0);
}

/// Fill in the header of the transaction occupying all of `txn` (records already in
/// `txn[32..]`, padding zeroed) and compute its crc.
pub fn seal_txn(txn: &mut [u8], kind: u16, seq: u64, nrec: u32) {
    let len = txn.len();
    put_txn_header(txn, kind, seq, len, nrec);
    let c = crate::crc_append(crc(&txn[..28]), &txn[TXN_HEADER..]);
    le::put_u32(txn, 28, c);
}

/// The header of a commit transaction of `len` bytes holding `nrec` records that the
/// caller writes elsewhere, and the crc over its first 28 bytes: the caller continues it
/// over every byte after the header ([`crate::crc_append`]) and stores it with
/// [`set_txn_crc`].
pub fn txn_head(seq: u64, len: usize, nrec: u32) -> ([u8; TXN_HEADER], u32) {
    let mut h = [0u8; TXN_HEADER];
    put_txn_header(&mut h, KIND_COMMIT, seq, len, nrec);
    let c = crc(&h[..28]);
    (h, c)
}

/// Store the transaction crc `c` into header `h` ([`txn_head`]).
pub fn set_txn_crc(h: &mut [u8], c: u32) {
    le::put_u32(h, 28, c);
}

/// Bytes before the first data byte of a one-record `WRITE` transaction.
pub const WRITE_TXN_HEAD: usize = TXN_HEADER + WRITE_HEADER_LEN;

/// The transaction header and `WRITE` record header of a one-record `WRITE` transaction
/// carrying `data` (written after them by the caller, then as many zero bytes as the
/// second value says), with the crc over all of it filled in.
pub fn write_txn_head(
    seq: u64,
    ino: u64,
    offset: u64,
    size: u64,
    mtime: i64,
    data: &[u8],
) -> ([u8; WRITE_TXN_HEAD], usize) {
    static ZEROS: [u8; TXN_ALIGN as usize] = [0; TXN_ALIGN as usize];
    let len = write_txn_len(data.len());
    let mut h = [0u8; WRITE_TXN_HEAD];
    put_txn_header(&mut h, KIND_COMMIT, seq, len, 1);
    encode_write_header(&mut h[TXN_HEADER..], ino, offset, size, mtime, data.len());
    let pad = len - WRITE_TXN_HEAD - data.len();
    let mut c = crate::crc_append(crc(&h[..28]), &h[TXN_HEADER..]);
    c = crate::crc_append(c, data);
    c = crate::crc_append(c, &ZEROS[..pad]);
    le::put_u32(&mut h, 28, c);
    (h, pad)
}

/// Fill `txn` (at least 64 bytes, a multiple of 64) as a wrap transaction.
pub fn seal_wrap(txn: &mut [u8], seq: u64) {
    txn[TXN_HEADER..].fill(0);
    seal_txn(txn, KIND_WRAP, seq, 0);
}

/// A transaction found by `scan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRef {
    pub lsn: u64,
    pub seq: u64,
    pub len: usize,
    pub kind: u16,
    pub nrec: u32,
}

/// Why a scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Reached the end of the bytes given (or the limit).
    End,
    /// The bytes at `lsn` are not a committed transaction with the expected sequence:
    /// a torn or never-written tail, or (if the client claimed more) a malformed log.
    Invalid { lsn: u64, why: String },
}

/// Result of scanning a log range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    pub txns: Vec<TxnRef>,
    /// LSN and sequence number just after the last valid transaction.
    pub end_lsn: u64,
    pub end_seq: u64,
    pub stop: Stop,
}

/// Scan transactions in `buf`, where `buf[i]` holds the log byte at LSN `base_lsn + i`
/// (the caller has linearised the ring), starting at `base_lsn` with sequence `seq`.
/// `ring_bytes` tells where laps end (for wrap transactions).
pub fn scan(buf: &[u8], base_lsn: u64, seq: u64, ring_bytes: u64) -> Scan {
    let mut off = 0usize;
    let mut seq = seq;
    let mut txns = Vec::new();
    let stop = loop {
        let lsn = base_lsn + off as u64;
        if off == buf.len() {
            break Stop::End;
        }
        match check_txn(&buf[off..], seq, lsn, ring_bytes) {
            Ok((len, kind, nrec)) => {
                txns.push(TxnRef {
                    lsn,
                    seq,
                    len,
                    kind,
                    nrec,
                });
                seq += 1;
                if kind == KIND_WRAP {
                    let next_lap = (lsn / ring_bytes + 1) * ring_bytes;
                    let skip = (next_lap - lsn) as usize;
                    if off + skip > buf.len() {
                        off = buf.len();
                        // A wrap at the very end of the given bytes: the caller's range ends
                        // inside the skipped part, which is fine only if it ends at the lap.
                        break Stop::End;
                    }
                    off += skip;
                } else {
                    off += len;
                }
            }
            Err(why) => break Stop::Invalid { lsn, why },
        }
    };
    let end_lsn = base_lsn + off as u64;
    Scan {
        txns,
        end_lsn,
        end_seq: seq,
        stop,
    }
}

fn check_txn(
    b: &[u8],
    seq: u64,
    lsn: u64,
    ring_bytes: u64,
) -> std::result::Result<(usize, u16, u32), String> {
    let (len, kind, nrec) = check_header(b, seq, lsn, ring_bytes)?;
    if len > b.len() {
        return Err(format!("bad transaction length {len}"));
    }
    check_crc(&b[..len])?;
    Ok((len, kind, nrec))
}

/// Check the header of the transaction at `lsn` (at least [`TXN_HEADER`] bytes of it
/// in `b`): magic, version, sequence number `seq`, length (a multiple of 64 within the
/// lap), kind, reserved field. Returns its length, kind and number of records. The
/// checksum is [`check_crc`]'s.
pub fn check_header(
    b: &[u8],
    seq: u64,
    lsn: u64,
    ring_bytes: u64,
) -> std::result::Result<(usize, u16, u32), String> {
    if b.len() < TXN_HEADER {
        return Err("truncated header".into());
    }
    if le::u32(b, 0) != TXN_MAGIC {
        return Err("no transaction magic".into());
    }
    if le::u16(b, 4) != TXN_VERSION {
        return Err("unsupported transaction version".into());
    }
    let got_seq = le::u64(b, 8);
    if got_seq != seq {
        return Err(format!("sequence {got_seq}, expected {seq}"));
    }
    let len = le::u32(b, 16) as usize;
    let kind = le::u16(b, 6);
    let nrec = le::u32(b, 20);
    let lap_left = ring_bytes - lsn % ring_bytes;
    if len < 64 || !len.is_multiple_of(64) || len as u64 > lap_left {
        return Err(format!("bad transaction length {len}"));
    }
    if kind != KIND_COMMIT && kind != KIND_WRAP {
        return Err(format!("bad transaction kind {kind}"));
    }
    if le::u32(b, 24) != 0 {
        return Err("reserved header field not zero".into());
    }
    Ok((len, kind, nrec))
}

/// Check the crc32c of the whole transaction `txn` (its header says the length).
pub fn check_crc(txn: &[u8]) -> std::result::Result<(), String> {
    let c = crate::crc_append(crc(&txn[..28]), &txn[TXN_HEADER..]);
    if c != le::u32(txn, 28) {
        return Err("checksum mismatch (torn or corrupt transaction)".into());
    }
    Ok(())
}

/// The fields of a `WRITE` record of `rec_len` bytes from its first
/// [`WRITE_HEADER_LEN`] bytes `h`, checked as [`records`] checks them: `(ino, offset,
/// size, mtime, data length)`. The data follows the header.
pub fn decode_write_head(h: &[u8], rec_len: usize) -> Result<(u64, u64, u64, i64, usize)> {
    if h.len() < WRITE_HEADER_LEN || rec_len < WRITE_HEADER_LEN {
        return bad("WRITE: short");
    }
    let n = le::u32(h, 40) as usize;
    if WRITE_HEADER_LEN + pad8(n) != rec_len || le::u32(h, 44) != 0 {
        return bad("WRITE: data length does not match the record");
    }
    let offset = le::u64(h, 16);
    let size = le::u64(h, 24);
    if offset
        .checked_add(n as u64)
        .is_none_or(|e| e > MAX_FILE_SIZE || e > size.max(offset))
        && n > 0
    {
        return bad("WRITE: range beyond the file size or the maximum");
    }
    if size > MAX_FILE_SIZE {
        return bad("WRITE: size too large");
    }
    Ok((le::u64(h, 8), offset, size, le::i64(h, 32), n))
}

/// Decode the records of a checked commit transaction (`txn` = its `len` bytes).
pub fn records(txn: &[u8], nrec: u32) -> Result<Vec<Record<'_>>> {
    if txn.len() < TXN_HEADER {
        return bad("transaction shorter than its header");
    }
    let mut out = Vec::with_capacity((nrec as usize).min(txn.len() / 8));
    let mut off = TXN_HEADER;
    for _ in 0..nrec {
        let (ty, len) = record_header(txn, off, txn.len())?;
        let r = &txn[off..off + len];
        out.push(decode_record(ty, r)?);
        off += len;
    }
    if txn[off..].iter().any(|&b| b != 0) {
        return bad("non-zero bytes after the last record");
    }
    Ok(out)
}

/// The type and length of the record at `off` of a transaction of `txn_len` bytes (`b`
/// holds its first `off + 8` bytes at least): the length a multiple of 8, at least 8,
/// within the transaction; the reserved field zero.
fn record_header(b: &[u8], off: usize, txn_len: usize) -> Result<(u16, usize)> {
    if off + 8 > txn_len || off + 8 > b.len() {
        return bad("record runs past its transaction");
    }
    let len = le::u32(b, off + 4) as usize;
    if len < 8 || !len.is_multiple_of(8) || off + len > txn_len || le::u16(b, off + 2) != 0 {
        return bad(format!("record at +{off}: bad length {len}"));
    }
    Ok((le::u16(b, off), len))
}

/// The `WRITE` of a one-record transaction of `txn_len` bytes from the transaction's
/// first [`WRITE_TXN_HEAD`] bytes `head` (its header and the record's), checked as
/// [`records`] checks it: `(ino, offset, size, mtime, data length)`; the data follows
/// the head. For a reader that leaves the data where it is.
pub fn one_write_head(head: &[u8], txn_len: usize) -> Result<(u64, u64, u64, i64, usize)> {
    let (ty, len) = record_header(head, TXN_HEADER, txn_len)?;
    if ty != REC_WRITE {
        return bad("not a WRITE record");
    }
    decode_write_head(&head[TXN_HEADER..], len)
}

/// One record of type `ty`: one arm per record type, each checking its length and fields
/// (about 110 lines; FORMAT.md's record table in code).
fn decode_record(ty: u16, r: &[u8]) -> Result<Record<'_>> {
    match ty {
        REC_INODE_SET => {
            if r.len() != INODE_SET_LEN {
                return bad("INODE_SET: bad length");
            }
            let Some(kind) = Kind::from_u8(r[24]) else {
                return bad("INODE_SET: bad kind");
            };
            let perm = le::u32(r, 28);
            if perm & !0o7777 != 0 || r[25..28] != [0, 0, 0] {
                return bad("INODE_SET: bad mode");
            }
            let mut attrs = Attrs {
                kind,
                perm,
                uid: le::u32(r, 32),
                gid: le::u32(r, 36),
                nlink: le::u64(r, 40),
                size: le::u64(r, 48),
                atime: le::i64(r, 56),
                mtime: le::i64(r, 64),
                ctime: le::i64(r, 72),
                btime: le::i64(r, 80),
                ..Attrs::default()
            };
            attrs.set_slot(le::u64(r, 88));
            if attrs.size > MAX_FILE_SIZE {
                return bad("INODE_SET: size too large");
            }
            if attrs.size != 0 && !kind.has_data() && kind != Kind::Dir {
                return bad("INODE_SET: a special file with a size");
            }
            Ok(Record::InodeSet {
                ino: le::u64(r, 8),
                generation: le::u64(r, 16),
                attrs,
            })
        }
        REC_WRITE => {
            let (ino, offset, size, mtime, n) = decode_write_head(r, r.len())?;
            Ok(Record::Write {
                ino,
                offset,
                size,
                mtime,
                data: &r[WRITE_HEADER_LEN..WRITE_HEADER_LEN + n],
            })
        }
        REC_DIRENT_SET => {
            if r.len() < DIRENT_HEADER_LEN {
                return bad("DIRENT_SET: short");
            }
            let n = r[25] as usize;
            if DIRENT_HEADER_LEN + pad8(n) != r.len() || r[26..32].iter().any(|&b| b != 0) {
                return bad("DIRENT_SET: name length does not match the record");
            }
            let name = &r[32..32 + n];
            if !valid_name(name) {
                return bad("DIRENT_SET: invalid name");
            }
            let ino = le::u64(r, 16);
            let kind = match Kind::from_u8(r[24]) {
                Some(k) if (ino == 0) == (k == Kind::Free) => k,
                _ => return bad("DIRENT_SET: bad kind"),
            };
            Ok(Record::DirentSet {
                dir: le::u64(r, 8),
                name,
                ino,
                kind,
            })
        }
        REC_PUNCH => {
            if r.len() != PUNCH_LEN {
                return bad("PUNCH: bad length");
            }
            let (offset, len) = (le::u64(r, 16), le::u64(r, 24));
            if len == 0 || offset.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
                return bad("PUNCH: empty range or beyond the maximum file size");
            }
            Ok(Record::Punch {
                ino: le::u64(r, 8),
                offset,
                len,
                mtime: le::i64(r, 32),
            })
        }
        _ => bad(format!("unknown record type {ty}")),
    }
}

/// Build a whole commit transaction from records (used by tests and the slow paths;
/// the write fast path encodes straight into the ring).
pub fn build_txn(seq: u64, recs: &[Record<'_>]) -> Vec<u8> {
    let payload: usize = recs.iter().map(|r| r.encoded_len()).sum();
    let mut t = vec![0u8; txn_len(payload)];
    let mut off = TXN_HEADER;
    for r in recs {
        r.encode_into(&mut t[off..]);
        off += r.encoded_len();
    }
    seal_txn(&mut t, KIND_COMMIT, seq, recs.len() as u32);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attrs() -> Attrs {
        Attrs {
            kind: Kind::File,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 10,
            atime: 1,
            mtime: 2,
            ctime: 3,
            btime: 4,
            parent: 0,
            rdev: 0,
        }
    }

    #[test]
    fn punch_charge_counts_partial_end_blocks() {
        assert_eq!(punch_charge(0, 4096), 0);
        assert_eq!(punch_charge(0, 8192), 0);
        assert_eq!(punch_charge(1, 10), 1);
        assert_eq!(punch_charge(100, 8192), 2);
        assert_eq!(punch_charge(4096, 100), 1);
        assert_eq!(punch_charge(5, 0), 0);
    }

    #[test]
    fn roundtrip_and_scan() {
        let data = b"hello world";
        let recs = vec![
            Record::InodeSet {
                ino: 5,
                generation: 1,
                attrs: attrs(),
            },
            Record::DirentSet {
                dir: 1,
                name: b"f",
                ino: 5,
                kind: Kind::File,
            },
            Record::Write {
                ino: 5,
                offset: 0,
                size: 11,
                mtime: 9,
                data,
            },
            Record::Punch {
                ino: 5,
                offset: 3,
                len: 4,
                mtime: 10,
            },
        ];
        let t1 = build_txn(7, &recs);
        let t2 = build_txn(8, &recs[1..2]);
        let mut log = t1.clone();
        log.extend_from_slice(&t2);
        log.extend_from_slice(&[0u8; 64]);
        let s = scan(&log, 1000 * 4096, 7, 1 << 20);
        assert_eq!(s.txns.len(), 2);
        assert_eq!(s.end_seq, 9);
        assert!(matches!(s.stop, Stop::Invalid { .. }));
        assert_eq!(records(&t1, 4).unwrap(), recs);
        // A torn transaction is not committed.
        let mut torn = t1.clone();
        torn[40] ^= 1;
        assert_eq!(scan(&torn, 0, 7, 1 << 20).txns.len(), 0);
        // Wrong sequence is not committed.
        assert_eq!(scan(&t1, 0, 6, 1 << 20).txns.len(), 0);
    }

    #[test]
    fn wrap_skips_to_next_lap() {
        let ring = 4096u64;
        let mut buf = vec![0u8; 8192];
        let t = build_txn(
            1,
            &[Record::InodeSet {
                ino: 5,
                generation: 1,
                attrs: attrs(),
            }],
        );
        let start = 4096 - 64 - t.len();
        buf[start..start + t.len()].copy_from_slice(&t);
        seal_wrap(&mut buf[4096 - 64..4096], 2);
        let t3 = build_txn(
            3,
            &[Record::InodeSet {
                ino: 6,
                generation: 1,
                attrs: attrs(),
            }],
        );
        buf[4096..4096 + t3.len()].copy_from_slice(&t3);
        let s = scan(&buf[start..], start as u64, 1, ring);
        assert_eq!(s.txns.len(), 3);
        assert_eq!(s.txns[2].lsn, 4096);
    }

    #[test]
    fn write_charge_counts_blocks() {
        assert_eq!(write_charge(0, 0), 0);
        assert_eq!(write_charge(0, 1), 1);
        assert_eq!(write_charge(4095, 2), 2);
        assert_eq!(write_charge(4096, 8192), 2);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), nrec in 0u32..8) {
            let _ = scan(&bytes, 0, 0, 4096);
            let _ = records(&bytes, nrec);
            let mut t = bytes.clone();
            t.resize(crate::align_up(t.len().max(64) as u64, 64) as usize, 0);
            seal_txn(&mut t, KIND_COMMIT, 0, nrec);
            let s = scan(&t, 0, 0, 1 << 20);
            if s.txns.len() == 1 {
                let _ = records(&t, nrec);
            }
        }
    }
}
