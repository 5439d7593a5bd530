//! The pool file's format (docs/KV.md): pure encode and decode, no I/O.
//!
//! The pool is a sequence of segments of [`SEGMENT_BYTES`], 2 MiB aligned in the file.
//! Segment 0 holds the pool header in its first 4 KiB and the in-place journal's slots
//! after it (a record an in-place update is writing: redone at recovery if the update
//! was cut short). Every other segment is free
//! (its header's sequence number is 0) or holds records appended after its header:
//!
//! * segment header (64 bytes): magic `KVSG`, version, the segment's sequence number (a
//!   pool-wide counter, new each time the segment is opened for appending), crc;
//! * record (8-byte aligned): magic `KVR1`, length, version (pool-wide, newest wins),
//!   key length, value length, kind (value or tombstone), crc of the segment's sequence
//!   number, the header and the bytes; then the key and the value, zero-padded to 8.
//!
//! A record is valid only under the sequence number of the segment it is in, so records
//! left from an earlier use of a segment are never read as new ones.

/// Bytes of a segment (a huge page).
pub const SEGMENT_BYTES: u64 = 2 << 20;
/// Bytes of a segment header.
pub const SEGMENT_HEADER: u64 = 64;
/// Bytes of a record header.
pub const RECORD_HEADER: u64 = 32;
/// Longest key.
pub const MAX_KEY: usize = 64 << 10;
/// Longest value that fits a segment with the longest key.
pub const MAX_VALUE: usize = (SEGMENT_BYTES - SEGMENT_HEADER - RECORD_HEADER) as usize - MAX_KEY;

const POOL_MAGIC: &[u8; 8] = b"CAIRNKV\0";
const POOL_VERSION: u32 = 1;
const SEGMENT_MAGIC: u32 = 0x4753_564b; // "KVSG"
const RECORD_MAGIC: u32 = 0x3152_564b; // "KVR1"

/// What a record says about its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Value = 1,
    Tombstone = 2,
}

/// A format error: what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad(pub String);

fn bad<T>(m: impl Into<String>) -> Result<T, Bad> {
    Err(Bad(m.into()))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// The pool header (segment 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolHeader {
    pub segments: u64,
    pub uuid: [u8; 16],
}

impl PoolHeader {
    /// 64 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[0..8].copy_from_slice(POOL_MAGIC);
        b[8..12].copy_from_slice(&POOL_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&SEGMENT_BYTES.to_le_bytes());
        b[24..32].copy_from_slice(&self.segments.to_le_bytes());
        b[32..48].copy_from_slice(&self.uuid);
        let c = cairn_format::crc(&b[..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode and check against the pool file's length.
    pub fn decode(b: &[u8], file_len: u64) -> Result<PoolHeader, Bad> {
        if b.len() < 64 || &b[0..8] != POOL_MAGIC {
            return bad("not a Cairn key-value pool (bad magic)");
        }
        if cairn_format::crc(&b[..60]) != u32_at(b, 60) {
            return bad("pool header: checksum mismatch");
        }
        let v = u32_at(b, 8);
        if v != POOL_VERSION {
            return bad(format!("pool header: unsupported version {v}"));
        }
        if u64_at(b, 16) != SEGMENT_BYTES {
            return bad("pool header: unsupported segment size");
        }
        let segments = u64_at(b, 24);
        if segments < 2 || segments.saturating_mul(SEGMENT_BYTES) > file_len {
            return bad(format!(
                "pool header: {segments} segments do not fit a file of {file_len} bytes"
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[32..48]);
        Ok(PoolHeader { segments, uuid })
    }
}

/// A segment header: the sequence number it was opened under (0: free).
pub fn encode_segment_header(seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; SEGMENT_HEADER as usize];
    b[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    let c = cairn_format::crc(&b[..60]);
    b[60..64].copy_from_slice(&c.to_le_bytes());
    b
}

/// The sequence number of a segment header, `None` for a free or damaged one.
pub fn decode_segment_header(b: &[u8]) -> Option<u64> {
    if b.len() < SEGMENT_HEADER as usize
        || u32_at(b, 0) != SEGMENT_MAGIC
        || cairn_format::crc(&b[..60]) != u32_at(b, 60)
    {
        return None;
    }
    Some(u64_at(b, 8)).filter(|&s| s != 0)
}

/// Bytes a record of `key_len` and `value_len` takes in a segment.
pub fn record_len(key_len: usize, value_len: usize) -> u64 {
    (RECORD_HEADER + key_len as u64 + value_len as u64).next_multiple_of(8)
}

/// A decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: u64,
    pub version: u64,
    pub key_len: usize,
    pub value_len: usize,
    pub kind: Kind,
    pub crc: u32,
}

fn record_crc(seq: u64, head: &[u8], key: &[u8], value: &[u8]) -> u32 {
    let mut c = cairn_format::crc(&seq.to_le_bytes());
    c = cairn_format::crc_append(c, &head[..28]);
    c = cairn_format::crc_append(c, key);
    cairn_format::crc_append(c, value)
}

/// A whole record (header, key, value, padding) for a segment opened under `seq`.
pub fn encode_record(seq: u64, version: u64, kind: Kind, key: &[u8], value: &[u8]) -> Vec<u8> {
    encode_record_in(
        record_len(key.len(), value.len()),
        seq,
        version,
        kind,
        key,
        value,
    )
}

/// [`encode_record`] into an allocation of `len` bytes (at least the record's
/// [`record_len`], a multiple of 8: an in-place update of a record by a shorter value
/// keeps the allocation; the padding is zero).
pub fn encode_record_in(
    len: u64,
    seq: u64,
    version: u64,
    kind: Kind,
    key: &[u8],
    value: &[u8],
) -> Vec<u8> {
    let mut b = Vec::with_capacity(len as usize);
    encode_record_onto(&mut b, len, seq, version, kind, key, value);
    b
}

/// [`encode_record_in`] appended to `out` (records written together: a batch).
pub fn encode_record_onto(
    out: &mut Vec<u8>,
    len: u64,
    seq: u64,
    version: u64,
    kind: Kind,
    key: &[u8],
    value: &[u8],
) {
    let at = out.len();
    out.resize(at + len as usize, 0);
    encode_record_at(&mut out[at..], seq, version, kind, key, value);
}

/// [`encode_record_in`] into `b`, the record's whole allocation (its padding zeroed).
pub fn encode_record_at(
    b: &mut [u8],
    seq: u64,
    version: u64,
    kind: Kind,
    key: &[u8],
    value: &[u8],
) {
    let len = b.len();
    debug_assert!(len as u64 >= record_len(key.len(), value.len()) && len.is_multiple_of(8));
    b[RECORD_HEADER as usize + key.len() + value.len()..].fill(0);
    b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b[16..20].copy_from_slice(&(key.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&(value.len() as u32).to_le_bytes());
    b[24] = kind as u8;
    let c = record_crc(seq, &b[..RECORD_HEADER as usize], key, value);
    b[28..32].copy_from_slice(&c.to_le_bytes());
    let k = RECORD_HEADER as usize;
    b[k..k + key.len()].copy_from_slice(key);
    b[k + key.len()..k + key.len() + value.len()].copy_from_slice(value);
}

/// The header of the record at the start of `b` if it is one (magic, sizes within the
/// `room` bytes left in its segment; the crc is checked by [`record_valid`]).
pub fn decode_record_header(b: &[u8], room: u64) -> Option<RecordHeader> {
    if b.len() < RECORD_HEADER as usize || u32_at(b, 0) != RECORD_MAGIC {
        return None;
    }
    let len = u32_at(b, 4) as u64;
    let key_len = u32_at(b, 16) as usize;
    let value_len = u32_at(b, 20) as usize;
    let kind = match b[24] {
        1 => Kind::Value,
        2 => Kind::Tombstone,
        _ => return None,
    };
    if b[25..28] != [0, 0, 0]
        || key_len == 0
        || key_len > MAX_KEY
        || len < record_len(key_len, value_len)
        || !len.is_multiple_of(8)
        || len > room
    {
        return None;
    }
    Some(RecordHeader {
        len,
        version: u64_at(b, 8),
        key_len,
        value_len,
        kind,
        crc: u32_at(b, 28),
    })
}

/// Whether `rec` (the whole record, `h` its header) is intact under segment sequence
/// `seq`.
pub fn record_valid(seq: u64, h: &RecordHeader, rec: &[u8]) -> bool {
    let k = RECORD_HEADER as usize;
    rec.len() >= h.len as usize
        && record_crc(
            seq,
            &rec[..k],
            &rec[k..k + h.key_len],
            &rec[k + h.key_len..k + h.key_len + h.value_len],
        ) == h.crc
}

/// Where segment 0's in-place journal starts (after the pool header's page), its number
/// of slots, and the bytes of each (a slot: a 32-byte header, then a whole record).
pub const JOURNAL_START: u64 = 4096;
pub const JOURNAL_SLOTS: u64 = 16;
pub const JOURNAL_SLOT_BYTES: u64 = ((SEGMENT_BYTES - JOURNAL_START) / JOURNAL_SLOTS) & !63;
const JOURNAL_HEADER: u64 = 32;
/// The longest record an in-place update may write (it must fit a journal slot).
pub const JOURNAL_MAX_RECORD: u64 = JOURNAL_SLOT_BYTES - JOURNAL_HEADER;
const JOURNAL_MAGIC: u32 = 0x314a_564b; // "KVJ1"
const _: () = assert!(JOURNAL_START + JOURNAL_SLOTS * JOURNAL_SLOT_BYTES <= SEGMENT_BYTES);

/// A journal entry: the whole new record `record`, to be written at pool offset `target`
/// in the segment opened under `seg_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub target: u64,
    pub seg_seq: u64,
    pub record: Vec<u8>,
}

fn journal_crc(head: &[u8], record: &[u8]) -> u32 {
    cairn_format::crc_append(cairn_format::crc(&head[..24]), record)
}

/// A journal slot's bytes for an entry: 0 magic `KVJ1`, 4 record length, 8 target,
/// 16 segment sequence number, 24 crc32c of bytes 0..24 and the record, 28 zero,
/// 32 the record.
pub fn encode_journal(target: u64, seg_seq: u64, record: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; JOURNAL_HEADER as usize + record.len()];
    b[0..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(record.len() as u32).to_le_bytes());
    b[8..16].copy_from_slice(&target.to_le_bytes());
    b[16..24].copy_from_slice(&seg_seq.to_le_bytes());
    let c = journal_crc(&b, record);
    b[24..28].copy_from_slice(&c.to_le_bytes());
    b[JOURNAL_HEADER as usize..].copy_from_slice(record);
    b
}

/// The entry in a journal slot's bytes, if it holds a whole one.
pub fn decode_journal(b: &[u8]) -> Option<JournalEntry> {
    let h = JOURNAL_HEADER as usize;
    if b.len() < h || u32_at(b, 0) != JOURNAL_MAGIC {
        return None;
    }
    let len = u32_at(b, 4) as usize;
    if len as u64 > JOURNAL_MAX_RECORD || b.len() < h + len {
        return None;
    }
    let record = &b[h..h + len];
    (journal_crc(b, record) == u32_at(b, 24)).then(|| JournalEntry {
        target: u64_at(b, 8),
        seg_seq: u64_at(b, 16),
        record: record.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_header_roundtrip_and_damage() {
        let h = PoolHeader {
            segments: 33,
            uuid: [3; 16],
        };
        let b = h.encode();
        assert_eq!(PoolHeader::decode(&b, 33 * SEGMENT_BYTES).unwrap(), h);
        assert!(
            PoolHeader::decode(&b, 32 * SEGMENT_BYTES).is_err(),
            "short file"
        );
        for i in [0, 9, 20, 30, 40] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(
                PoolHeader::decode(&c, 33 * SEGMENT_BYTES).is_err(),
                "byte {i}"
            );
        }
    }

    #[test]
    fn segment_headers() {
        assert_eq!(decode_segment_header(&encode_segment_header(7)), Some(7));
        assert_eq!(decode_segment_header(&encode_segment_header(0)), None);
        assert_eq!(decode_segment_header(&[0u8; 64]), None);
        let mut b = encode_segment_header(9);
        b[10] ^= 1;
        assert_eq!(decode_segment_header(&b), None);
    }

    #[test]
    fn records_are_valid_only_whole_and_under_their_segment() {
        let r = encode_record(5, 42, Kind::Value, b"key", b"value!");
        assert_eq!(r.len() as u64, record_len(3, 6));
        assert_eq!(r.len() % 8, 0);
        let h = decode_record_header(&r, 1 << 20).unwrap();
        assert_eq!(
            (h.version, h.key_len, h.value_len, h.kind),
            (42, 3, 6, Kind::Value)
        );
        assert!(record_valid(5, &h, &r));
        assert!(
            !record_valid(6, &h, &r),
            "another incarnation of the segment"
        );
        let mut t = r.clone();
        t[RECORD_HEADER as usize + 4] ^= 1;
        assert!(!record_valid(5, &h, &t), "a torn value");
        assert!(
            decode_record_header(&r, 8).is_none(),
            "past the segment's end"
        );
        assert!(decode_record_header(&[0u8; 64], 1 << 20).is_none());
        // A shorter value in place keeps the allocation.
        let s = encode_record_in(r.len() as u64, 5, 44, Kind::Value, b"key", b"v");
        let h = decode_record_header(&s, 1 << 20).unwrap();
        assert_eq!((h.len, h.value_len), (r.len() as u64, 1));
        assert!(record_valid(5, &h, &s));
        let d = encode_record(5, 43, Kind::Tombstone, b"key", b"");
        let h = decode_record_header(&d, 1 << 20).unwrap();
        assert_eq!(h.kind, Kind::Tombstone);
        assert!(record_valid(5, &h, &d));
    }

    #[test]
    fn journal_entries_are_whole_or_nothing() {
        let rec = encode_record(5, 42, Kind::Value, b"key", b"value");
        let j = encode_journal(123 << 21 | 64, 77, &rec);
        let e = decode_journal(&j).unwrap();
        assert_eq!((e.target, e.seg_seq, &e.record), (123 << 21 | 64, 77, &rec));
        for i in [0, 5, 9, 17, 25, 40, j.len() - 1] {
            let mut t = j.clone();
            t[i] ^= 1;
            assert!(decode_journal(&t).is_none(), "byte {i}");
        }
        assert!(decode_journal(&j[..j.len() - 1]).is_none(), "cut short");
        assert!(decode_journal(&[0u8; 64]).is_none());
    }
}
