//! The client's operation log ring: the mapping of its slot (client page + ring) and the
//! encoding of transactions straight into it.
//!
//! A transaction is copied into the ring with non-temporal stores, whole 64-byte lines at
//! line boundaries, and fenced once by the caller ([`cairn_media::fence`]); its crc32c
//! and sequence number are the commit mark. The `WRITE` fast path never builds the
//! transaction in a heap buffer: it encodes the 80-byte head on the stack, copies the
//! caller's data into the ring and computes the crc incrementally over head, data and
//! padding.

use cairn_area::fs_err;
use cairn_format::log::{
    encode_write_header, seal_wrap, set_txn_crc, txn_head, txn_len, write_txn_head, write_txn_len,
    Record, TXN_HEADER, TXN_MAGIC, WRITE_HEADER_LEN, WRITE_TXN_HEAD,
};
use cairn_format::slot::client_page;
use cairn_format::BLOCK_SIZE;
use cairn_media::Mapping;
use std::io;

/// Bytes before the first data byte of a `WRITE` transaction.
pub const WRITE_HEAD: usize = WRITE_TXN_HEAD;
/// Bytes of the wrap transaction LibFS writes (the scanner skips to the next lap).
pub const WRAP_LEN: u64 = 64;

static ZEROS: [u8; 128] = [0u8; 128];

/// The mapped slot: client page (one block) followed by the ring.
pub struct Ring {
    map: Mapping,
    bytes: u64,
}

impl Ring {
    /// Wrap the read-write mapping of a slot (client page + `ring_bytes` of ring).
    pub fn new(map: Mapping, ring_bytes: u64) -> Ring {
        Ring {
            map,
            bytes: ring_bytes,
        }
    }

    /// Bytes in the ring.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn off(&self, lsn: u64) -> usize {
        BLOCK_SIZE + (lsn % self.bytes) as usize
    }

    /// Copy a whole encoded transaction to `lsn` (no fence) with non-temporal stores: no
    /// read of the ring's lines first and no write-back, the caller's fence drains them.
    /// Transactions are whole 64-byte lines at line boundaries, so even a small one
    /// fills its lines: three lines and a fence took about 100 ns on the development VM
    /// against 170 ns for plain stores, `clwb` and the fence (a SpaceJMP commit of one
    /// 8-byte store: p50 741-761 -> 691 ns).
    pub fn put_txn(&self, lsn: u64, txn: &[u8]) -> io::Result<()> {
        self.map.write_nt(self.off(lsn), txn)
    }

    /// Encode a `WRITE` transaction at `lsn` and write it back (no fence). Returns its
    /// length. Without `sealed` its magic is left zero: the daemon seals it (`Commit`).
    #[allow(clippy::too_many_arguments)]
    pub fn put_write(
        &self,
        lsn: u64,
        seq: u64,
        ino: u64,
        offset: u64,
        size: u64,
        mtime: i64,
        data: &[u8],
        sealed: bool,
    ) -> io::Result<usize> {
        let n = data.len();
        let len = write_txn_len(n);
        let off = self.off(lsn);
        // Every line of the transaction is written whole with non-temporal stores (no
        // read of the ring's lines, no write-back; the caller's fence drains them):
        // `off` is 64-byte aligned and `len` a multiple of 64.
        debug_assert!(off.is_multiple_of(64) && len.is_multiple_of(64) && len >= 128);
        // 1. The data after the head's two lines: its whole lines straight from the
        //    caller's buffer, the last one (data and padding) from the stack.
        let first = (128 - WRITE_HEAD).min(n);
        let whole = first + (n - first) / 64 * 64;
        self.map.write_nt(off + 128, &data[first..whole])?;
        let rest = len - 128 - (whole - first);
        if rest > 0 {
            debug_assert_eq!(rest, 64);
            let mut line = [0u8; 64];
            line[..n - whole].copy_from_slice(&data[whole..]);
            self.map.write_nt(off + len - 64, &line)?;
        }
        // 2. The crc (while those stores drain), then the head's two lines: the
        //    transaction's head, the first bytes of the data, zeros.
        let (head, _) = write_txn_head(seq, ino, offset, size, mtime, data);
        let mut lines = [0u8; 128];
        lines[..WRITE_HEAD].copy_from_slice(&head);
        lines[WRITE_HEAD..WRITE_HEAD + first].copy_from_slice(&data[..first]);
        if !sealed {
            lines[..4].fill(0);
        }
        self.map.write_nt(off, &lines)?;
        Ok(len)
    }

    /// Encode a transaction of the `WRITE` records `recs` at `lsn` straight into the ring
    /// and write it back (no fence): record heads from the stack, the callers' data
    /// copied with non-temporal stores, the crc computed along, the transaction's head
    /// last. A large multi-record write (a SpaceJMP commit of many pages) is then
    /// copied once, not encoded into a buffer first. Without `sealed` its magic is left
    /// zero (the daemon seals it). Returns its length.
    pub fn put_writes(
        &self,
        lsn: u64,
        seq: u64,
        recs: &[Record<'_>],
        sealed: bool,
    ) -> io::Result<usize> {
        let len = txn_len(recs.iter().map(Record::encoded_len).sum());
        let off = self.off(lsn);
        let (mut head, mut c) = txn_head(seq, len, recs.len() as u32);
        let mut at = off + TXN_HEADER;
        for r in recs {
            let &Record::Write {
                ino,
                offset,
                size,
                mtime,
                data,
            } = r
            else {
                return Err(fs_err(libc::EINVAL, "put_writes: not a WRITE record"));
            };
            let mut h = [0u8; WRITE_HEADER_LEN];
            encode_write_header(&mut h, ino, offset, size, mtime, data.len());
            let pad = &ZEROS[..r.encoded_len() - WRITE_HEADER_LEN - data.len()];
            for piece in [&h[..], data, pad] {
                self.map.write_nt(at, piece)?;
                c = cairn_format::crc_append(c, piece);
                at += piece.len();
            }
        }
        let pad = &ZEROS[..off + len - at];
        self.map.write_nt(at, pad)?;
        set_txn_crc(&mut head, cairn_format::crc_append(c, pad));
        if !sealed {
            head[..4].fill(0);
        }
        self.map.write_nt(off, &head)?;
        Ok(len)
    }

    /// Whether the transaction at `lsn` carries its magic (was sealed).
    pub fn is_sealed(&self, lsn: u64) -> io::Result<bool> {
        let mut m = [0u8; 4];
        self.map.read(self.off(lsn), &mut m)?;
        Ok(u32::from_le_bytes(m) == TXN_MAGIC)
    }

    /// Write a 64-byte wrap transaction at `lsn` and write it back (no fence).
    pub fn put_wrap(&self, lsn: u64, seq: u64) -> io::Result<()> {
        let mut t = [0u8; WRAP_LEN as usize];
        seal_wrap(&mut t, seq);
        self.put_txn(lsn, &t)
    }

    /// Copy log bytes at `lsn` (which must not cross the end of the ring) into `buf`.
    pub fn read(&self, lsn: u64, buf: &mut [u8]) -> io::Result<()> {
        self.map.read(self.off(lsn), buf)
    }

    /// Publish the epoch this client reads the shared area under (0: not reading).
    pub fn set_reader_epoch(&self, e: u64) -> io::Result<()> {
        self.map.store_u64(client_page::READER_EPOCH as usize, e)
    }

    /// Tell the daemon whether more than half of the log is undigested
    /// (`client_page::PRESSURE`).
    pub fn set_pressure(&self, on: bool) -> io::Result<()> {
        self.map
            .store_u64(client_page::PRESSURE as usize, u64::from(on))
    }

    /// Tell the daemon that this client read file block `fblk` of `ino` from a lower
    /// tier (the hint ring of the client page; old hints are overwritten when the daemon
    /// is behind). The caller serializes hints (the state lock).
    pub fn hint(&self, ino: u64, fblk: u64) -> io::Result<()> {
        let n = self.map.load_u64(client_page::HINT_HEAD as usize)?;
        let off = client_page::HINT_BASE + (n % client_page::HINT_SLOTS) * 16;
        self.map.store_u64(off as usize, ino)?;
        self.map.store_u64(off as usize + 8, fblk)?;
        self.map.store_u64(client_page::HINT_HEAD as usize, n + 1)
    }

    /// Write the owner pid into the client page.
    pub fn set_pid(&self, pid: u32) -> io::Result<()> {
        self.map.store_u64(client_page::PID as usize, pid as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::log::{build_txn, records, scan, Record};

    #[test]
    fn fast_write_encoding_equals_build_txn() {
        for n in [0usize, 1, 7, 8, 9, 63, 64, 100, 1024, 4096, 5000] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            let (head, pad) = write_txn_head(42, 9, 100, 100 + n as u64, 77, &data);
            let mut t = head.to_vec();
            t.extend_from_slice(&data);
            t.extend(std::iter::repeat_n(0u8, pad));
            let want = build_txn(
                42,
                &[Record::Write {
                    ino: 9,
                    offset: 100,
                    size: 100 + n as u64,
                    mtime: 77,
                    data: &data,
                }],
            );
            assert_eq!(t, want, "n = {n}");
            let s = scan(&t, 0, 42, 1 << 20);
            assert_eq!(s.txns.len(), 1);
            assert_eq!(records(&t, 1).unwrap().len(), 1);
        }
    }
}
