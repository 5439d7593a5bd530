//! Directories: linear hashing over bucket blocks. A directory's map holds, at file block
//! `b`, the first block of bucket `b`; a bucket may chain overflow blocks through `next`
//! (absolute block numbers). The bucket count is `2^level + split`; name `n` lives in
//! bucket `bucket_of(hash(n), level, split)`. When the entry count exceeds
//! `SPLIT_LOAD * buckets` the daemon splits bucket `split` into `split` and
//! `split + 2^level`.
//!
//! Bucket block (4 KiB): magic u32 "CDIR", version u16, reserved u16, count u32,
//! used u32 (bytes of entries), next u64, reserved u64, then packed entries
//! `ino u64 | kind u8 | name_len u8 | name`. Buckets are written out of place only, so
//! they cannot be torn and carry no checksum; decoding validates every field.

use crate::inode::Kind;
use crate::{bad, le, valid_name, Result, BLOCK_SIZE};

pub const BUCKET_MAGIC: u32 = 0x5249_4443; // "CDIR"
pub const BUCKET_VERSION: u16 = 1;
pub const BUCKET_HEADER: usize = 32;
/// Average entries per bucket above which a bucket is split.
pub const SPLIT_LOAD: u64 = 40;

/// The name hash: FNV-1a 64 followed by the splitmix64 finaliser.
pub fn hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in name {
        h ^= c as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Bucket of a hash under linear hashing with `level` and `split`.
pub fn bucket_of(h: u64, level: u8, split: u64) -> u64 {
    let low = if level >= 63 {
        h
    } else {
        h & ((1u64 << level) - 1)
    };
    if low < split {
        if level + 1 >= 64 {
            h
        } else {
            h & ((1u64 << (level + 1)) - 1)
        }
    } else {
        low
    }
}

/// Number of buckets.
pub fn bucket_count(level: u8, split: u64) -> u64 {
    (1u64 << level) + split
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Kind,
}

impl Entry {
    /// Encoded size of the entry.
    pub fn size(&self) -> usize {
        10 + self.name.len()
    }
}

/// One decoded bucket block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketBlock {
    pub entries: Vec<Entry>,
    pub next: u64,
}

/// Bytes available for entries in one block.
pub const BUCKET_SPACE: usize = BLOCK_SIZE - BUCKET_HEADER;

impl BucketBlock {
    /// Encode; the entries must fit (`BUCKET_SPACE`).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE];
        le::put_u32(&mut b, 0, BUCKET_MAGIC);
        le::put_u16(&mut b, 4, BUCKET_VERSION);
        le::put_u32(&mut b, 8, self.entries.len() as u32);
        le::put_u64(&mut b, 16, self.next);
        let mut off = BUCKET_HEADER;
        for e in &self.entries {
            le::put_u64(&mut b, off, e.ino);
            b[off + 8] = e.kind as u8;
            b[off + 9] = e.name.len() as u8;
            b[off + 10..off + 10 + e.name.len()].copy_from_slice(&e.name);
            off += e.size();
        }
        assert!(off <= BLOCK_SIZE, "bucket overflow");
        le::put_u32(&mut b, 12, (off - BUCKET_HEADER) as u32);
        b
    }

    /// Decode and validate one block.
    pub fn decode(b: &[u8]) -> Result<BucketBlock> {
        if b.len() < BLOCK_SIZE || le::u32(b, 0) != BUCKET_MAGIC {
            return bad("directory bucket: bad magic");
        }
        if le::u16(b, 4) != BUCKET_VERSION {
            return bad("directory bucket: unsupported version");
        }
        let count = le::u32(b, 8) as usize;
        let used = le::u32(b, 12) as usize;
        if used > BUCKET_SPACE {
            return bad("directory bucket: bad length");
        }
        // Room for what the block can hold (an entry takes 11 bytes or more), not for
        // what a corrupt count claims.
        let mut entries = Vec::with_capacity(count.min(BUCKET_SPACE / 11));
        let mut off = BUCKET_HEADER;
        let end = BUCKET_HEADER + used;
        while off < end {
            if off + 10 > end {
                return bad("directory bucket: truncated entry");
            }
            let ino = le::u64(b, off);
            let Some(kind) = Kind::from_u8(b[off + 8]).filter(|k| *k != Kind::Free) else {
                return bad("directory bucket: bad entry kind");
            };
            let n = b[off + 9] as usize;
            if off + 10 + n > end || !valid_name(&b[off + 10..off + 10 + n]) || ino == 0 {
                return bad("directory bucket: bad entry");
            }
            entries.push(Entry {
                name: b[off + 10..off + 10 + n].to_vec(),
                ino,
                kind,
            });
            off += 10 + n;
        }
        if entries.len() != count {
            return bad("directory bucket: count mismatch");
        }
        Ok(BucketBlock {
            entries,
            next: le::u64(b, 16),
        })
    }
}

/// Find `name` in one encoded bucket block without allocating: `(ino, kind)` if present,
/// plus the block's `next` pointer. Validates the block as `decode` does.
pub fn find_in_block(b: &[u8], name: &[u8]) -> Result<(Option<(u64, Kind)>, u64)> {
    if b.len() < BLOCK_SIZE || le::u32(b, 0) != BUCKET_MAGIC || le::u16(b, 4) != BUCKET_VERSION {
        return bad("directory bucket: bad magic or version");
    }
    let used = le::u32(b, 12) as usize;
    if used > BUCKET_SPACE {
        return bad("directory bucket: bad length");
    }
    let end = BUCKET_HEADER + used;
    let mut off = BUCKET_HEADER;
    while off < end {
        if off + 10 > end {
            return bad("directory bucket: truncated entry");
        }
        let n = b[off + 9] as usize;
        if off + 10 + n > end {
            return bad("directory bucket: bad entry");
        }
        if &b[off + 10..off + 10 + n] == name {
            let Some(kind) = Kind::from_u8(b[off + 8]).filter(|k| *k != Kind::Free) else {
                return bad("directory bucket: bad entry kind");
            };
            return Ok((Some((le::u64(b, off), kind)), le::u64(b, 16)));
        }
        off += 10 + n;
    }
    Ok((None, le::u64(b, 16)))
}

/// Split a bucket's entries into blocks that each fit, in order (the chain).
pub fn pack_chain(entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut chain = vec![Vec::new()];
    let mut used = 0;
    for e in entries {
        if used + e.size() > BUCKET_SPACE {
            chain.push(Vec::new());
            used = 0;
        }
        used += e.size();
        chain.last_mut().unwrap().push(e);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linear_hashing_addresses_every_bucket() {
        // With level 2 and split 1 there are 5 buckets: 0..4, and every hash maps into them.
        for h in 0..1000u64 {
            let b = bucket_of(h, 2, 1);
            assert!(b < bucket_count(2, 1));
            if h & 3 == 0 {
                assert!(b == 0 || b == 4);
            }
        }
    }

    proptest! {
        #[test]
        fn bucket_roundtrip(names in proptest::collection::vec("[a-z0-9._-]{1,40}", 0..60)) {
            let entries: Vec<Entry> = names.iter().filter(|n| valid_name(n.as_bytes()))
                .enumerate()
                .map(|(i, n)| Entry { name: n.as_bytes().to_vec(), ino: i as u64 + 2, kind: Kind::File })
                .collect();
            for part in pack_chain(entries.clone()) {
                let blk = BucketBlock { entries: part.clone(), next: 99 };
                prop_assert_eq!(BucketBlock::decode(&blk.encode()).unwrap(), blk);
            }
            if let Some(e) = entries.first() {
                let chain = pack_chain(entries.clone());
                let blk = BucketBlock { entries: chain[0].clone(), next: 0 }.encode();
                prop_assert_eq!(find_in_block(&blk, &e.name).unwrap().0, Some((e.ino, e.kind)));
                prop_assert_eq!(find_in_block(&blk, b"not-there/").unwrap().0, None);
            }
            let total: usize = pack_chain(entries.clone()).iter().map(|p| p.len()).sum();
            prop_assert_eq!(total, entries.len());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 4096)) {
            let _ = BucketBlock::decode(&bytes);
            let _ = find_in_block(&bytes, b"x");
        }
    }
}
