//! Log slots: the daemon-owned slot-table entry (A/B head records) and the
//! client-owned client page.
//!
//! Slot-table entry (128 bytes): copy A at 0, copy B at 48, each a `SlotHead` of 48
//! bytes with its own crc32c; the valid copy with the larger `gen` is current, and an
//! update always overwrites the other copy, so a torn update leaves the previous one.
//! At 96: `published_head` (u64, advisory copy of `head_lsn` that clients poll),
//! at 104: `owner_pid` (u64, informational), at 112: `lease_gen` (u64, incremented by
//! the daemon when it takes every lease of the slot's client away; LibFS loads it at the
//! start of every call), at 120: `owner_cred` (u64: the registered client's uid in the
//! low 32 bits, its gid in the high 32 bits; written and persisted before the slot is
//! activated, so that recovery after a daemon restart checks the log's permissions with
//! the credentials of the client that wrote it; 0 in entries written before the field
//! existed, which reads as root).

use crate::{crc, le};

/// Offset of the advisory published head in a slot-table entry.
pub const PUBLISHED_HEAD_OFF: u64 = 96;
/// Offset of the owner pid in a slot-table entry.
pub const OWNER_PID_OFF: u64 = 104;
/// Offset of the lease generation in a slot-table entry.
pub const LEASE_GEN_OFF: u64 = 112;
/// Offset of the owner's credentials (`uid | gid << 32`) in a slot-table entry.
pub const OWNER_CRED_OFF: u64 = 120;
/// Bytes of one head copy.
pub const HEAD_BYTES: usize = 48;

/// Client page fields (offsets within the client page, 8-byte atomic, untrusted).
pub mod client_page {
    /// Epoch the client is reading under; 0 when it is not reading shared structures.
    pub const READER_EPOCH: u64 = 0;
    /// Client's pid (informational).
    pub const PID: u64 = 8;
    /// Read hints (a lossy ring the client writes and the daemon reads): the number of
    /// hints the client wrote so far; hint `n` is at `HINT_BASE + (n % HINT_SLOTS) * 16`,
    /// two u64: inode number and file block of a read of lower-tier data.
    pub const HINT_HEAD: u64 = 16;
    /// Nonzero while more than half of the client's log is undigested: the daemon then
    /// publishes the client's digests in slices, so that a writer about to wait for room
    /// goes on soon, instead of in one batch, which lets more records be superseded.
    pub const PRESSURE: u64 = 24;
    pub const HINT_BASE: u64 = 64;
    pub const HINT_SLOTS: u64 = 252;
}

/// The durable state of a log slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotHead {
    /// Update counter: picks the newer of the two copies.
    pub gen: u64,
    /// Whether a client owns the slot (its log may hold undigested transactions).
    pub active: bool,
    /// Log sequence number (byte position, never wraps) of the first undigested byte.
    pub head_lsn: u64,
    /// Sequence number the transaction at `head_lsn` must carry.
    pub head_seq: u64,
    /// Incremented each time the slot is handed to a new client.
    pub slot_gen: u64,
}

impl SlotHead {
    pub fn encode(&self) -> [u8; HEAD_BYTES] {
        let mut b = [0u8; HEAD_BYTES];
        le::put_u64(&mut b, 0, self.gen);
        le::put_u64(&mut b, 8, self.active as u64);
        le::put_u64(&mut b, 16, self.head_lsn);
        le::put_u64(&mut b, 24, self.head_seq);
        le::put_u64(&mut b, 32, self.slot_gen);
        let c = crc(&b[..40]);
        le::put_u32(&mut b, 40, c);
        b
    }

    /// Decode one copy; `None` if its checksum or fields are invalid.
    pub fn decode(b: &[u8]) -> Option<SlotHead> {
        if b.len() < HEAD_BYTES || crc(&b[..40]) != le::u32(b, 40) || le::u64(b, 8) > 1 {
            return None;
        }
        Some(SlotHead {
            gen: le::u64(b, 0),
            active: le::u64(b, 8) == 1,
            head_lsn: le::u64(b, 16),
            head_seq: le::u64(b, 24),
            slot_gen: le::u64(b, 32),
        })
    }

    /// Pick the current head from the 96 bytes holding copies A and B. A never-written
    /// (all-zero) entry decodes as an inactive slot at position 0.
    pub fn current(entry: &[u8]) -> Option<(SlotHead, usize)> {
        let a = SlotHead::decode(&entry[..HEAD_BYTES]);
        let b = SlotHead::decode(&entry[HEAD_BYTES..2 * HEAD_BYTES]);
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.gen > a.gen { (b, 1) } else { (a, 0) }),
            (Some(a), None) => Some((a, 0)),
            (None, Some(b)) => Some((b, 1)),
            (None, None) => None,
        }
    }

    /// Offset (within the entry) where the next update must be written: the copy that is
    /// not current.
    pub fn next_copy_off(current_copy: usize) -> u64 {
        if current_copy == 0 {
            HEAD_BYTES as u64
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ab_picks_newest_valid() {
        let h1 = SlotHead {
            gen: 1,
            active: true,
            head_lsn: 64,
            head_seq: 2,
            slot_gen: 1,
        };
        let h2 = SlotHead {
            gen: 2,
            head_lsn: 128,
            head_seq: 3,
            ..h1
        };
        let mut e = [0u8; 96];
        e[..48].copy_from_slice(&h1.encode());
        e[48..].copy_from_slice(&h2.encode());
        assert_eq!(SlotHead::current(&e), Some((h2, 1)));
        e[60] ^= 1; // tear copy B
        assert_eq!(SlotHead::current(&e), Some((h1, 0)));
        assert_eq!(SlotHead::next_copy_off(0), 48);
        assert_eq!(SlotHead::current(&[0u8; 96]), None);
    }
}
