//! The undo log of an explicit-mode writer (docs/SPACEJMP.md, "Commit modes").
//!
//! In explicit mode a writer stores straight into the resident copy, after declaring the
//! bytes it will change (`tx_add`): their old contents go to this log first, or, for a
//! declaration of a page or more ([`FROM_FILE_MIN`]), only where they are: the segment
//! file holds them (the transaction's writer lock keeps every other commit out), and
//! copying them cost a 1,024-page commit a third of its time. A commit logs the new
//! bytes in the store and empties the log; an abort, or the next writer after this one
//! died, copies the old bytes back, newest first, then copies the ranges kept without
//! their bytes from the file (a process that may only read the segment has the daemon
//! copy every range from the file instead). The log is a host object the daemon makes
//! and hands out (read-write to writers only), `/dev/shm/cairn-<uuid>.sj-undo-<ino>-<gen>`:
//! a count, the bytes used, then entries (offset u64, length u64 with bit 63 set when
//! the bytes are not kept, then the bytes padded to 8, if kept). An entry counts once
//! the count covers it, which is stored after the entry is whole.

use cairn_area::fs_err;
use cairn_media::Mapping;
use std::fs::File;
use std::io;
use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};

/// The most an explicit transaction may declare, with the entries' headers.
pub const CAPACITY: usize = 64 << 20;
/// Declarations of at least this many bytes keep no bytes in the log: they are
/// restored from the segment file.
pub const FROM_FILE_MIN: usize = 4096;
/// The length word's flag of an entry that keeps no bytes.
const FROM_FILE: u64 = 1 << 63;
const HEADER: usize = 64;
const COUNT: usize = 0;
const USED: usize = 8;

/// An entry: offset, length, and the old bytes if the log keeps them.
type Entry = (u64, u64, Option<Vec<u8>>);

pub struct UndoLog {
    map: Mapping,
    /// Whether this process may write it (a writer of the segment).
    writable: bool,
    path: String,
}

impl std::fmt::Debug for UndoLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UndoLog")
            .field("segment", &self.path)
            .finish()
    }
}

impl UndoLog {
    /// The undo log of segment file `seg` (at `path`), for a writer: made by the daemon
    /// if missing.
    pub fn open(seg: &cairn::File, path: &str) -> io::Result<UndoLog> {
        let (f, writable) = seg.segment_object(true, true)?;
        if !writable {
            return Err(fs_err(
                libc::EACCES,
                format!("segment {path}: its undo log is granted read-only"),
            ));
        }
        if f.metadata()?.len() < CAPACITY as u64 {
            f.set_len(CAPACITY as u64)?;
        }
        Self::map(&f, true, path)
    }

    /// The undo log of segment file `seg` (`ino`/`gen` of the store with `uuid`), if one
    /// was ever made and sized (one still being made by [`UndoLog::open`] holds no
    /// entries yet): read-write if `write` and the daemon grants it, else read-only. No
    /// log, the common case, costs a `stat` (asking the daemon would make one for a
    /// writer).
    pub fn open_existing(
        seg: &cairn::File,
        (uuid, ino, gen): (&[u8; 16], u64, u64),
        path: &str,
        write: bool,
    ) -> io::Result<Option<UndoLog>> {
        if !cairn_area::host::object_path(uuid, cairn_area::host::SEGMENT_UNDO_KIND, ino, gen)
            .exists()
        {
            return Ok(None);
        }
        let (f, writable) = match seg.segment_object(true, write) {
            Ok(r) => r,
            Err(e) if cairn_area::errno_of(&e) == libc::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        };
        if f.metadata()?.len() < CAPACITY as u64 {
            return Ok(None);
        }
        Self::map(&f, writable, path).map(Some)
    }

    fn map(f: &File, writable: bool, path: &str) -> io::Result<UndoLog> {
        Ok(UndoLog {
            map: Mapping::new(f, 0, CAPACITY, writable, false)?,
            writable,
            path: path.to_string(),
        })
    }

    /// Whether this process may write it.
    pub fn writable(&self) -> bool {
        self.writable
    }

    fn count(&self) -> io::Result<u64> {
        Ok(self.map.atomic_u64(COUNT)?.load(SeqCst))
    }

    /// Whether it holds entries.
    pub fn is_empty(&self) -> bool {
        self.count().unwrap_or(0) == 0
    }

    /// Record that the bytes at `off` were `old` before this transaction changes them
    /// (copied once, straight from the caller's slice: the resident copy, under the
    /// writer lock). `ENOSPC` past [`CAPACITY`].
    pub fn record(&self, off: u64, old: &[u8]) -> io::Result<()> {
        let len = old.len();
        let (at, total) = self.place(16 + len.div_ceil(8) * 8)?;
        self.write_head(at, off, len as u64)?;
        self.map.write(at + 16, old)?;
        self.map
            .write(at + 16 + len, &[0u8; 8][..total - 16 - len])?;
        self.count_entry(at + total)
    }

    /// Record that the `len` bytes at `off` are about to change, their old contents to
    /// be restored from the segment file (which holds them: nothing else commits while
    /// the transaction holds the writer lock).
    pub fn record_range(&self, off: u64, len: u64) -> io::Result<()> {
        if len & FROM_FILE != 0 {
            return Err(fs_err(libc::EINVAL, "undo: range too long"));
        }
        let (at, total) = self.place(16)?;
        self.write_head(at, off, len | FROM_FILE)?;
        self.count_entry(at + total)
    }

    /// Where the next entry of `total` bytes goes. `ENOSPC` past [`CAPACITY`].
    #[inline]
    fn place(&self, total: usize) -> io::Result<(usize, usize)> {
        let used = self.map.atomic_u64(USED)?.load(SeqCst) as usize;
        let at = used.max(HEADER);
        if at + total > CAPACITY {
            return Err(fs_err(
                libc::ENOSPC,
                format!(
                    "an explicit transaction may declare at most {} MiB in pieces under \
                     {FROM_FILE_MIN} bytes: commit more often",
                    CAPACITY >> 20
                ),
            ));
        }
        Ok((at, total))
    }

    #[inline]
    fn write_head(&self, at: usize, off: u64, word: u64) -> io::Result<()> {
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&off.to_le_bytes());
        head[8..].copy_from_slice(&word.to_le_bytes());
        self.map.write(at, &head)
    }

    /// The entry ending at `end` is whole: it counts.
    #[inline]
    fn count_entry(&self, end: usize) -> io::Result<()> {
        // One writer (the holder of the writer lock): stores in order suffice.
        self.map.atomic_u64(USED)?.store(end as u64, Release);
        let count = self.map.atomic_u64(COUNT)?;
        count.store(count.load(Acquire) + 1, Release);
        Ok(())
    }

    /// The entries, oldest first: offset, length, and the old bytes if kept.
    fn entries(&self) -> io::Result<Vec<Entry>> {
        let n = self.count()?;
        let mut out = Vec::new();
        let mut at = HEADER;
        for _ in 0..n {
            let off = self.map.load_u64(at)?;
            let word = self.map.load_u64(at + 8)?;
            let (len, kept) = (word & !FROM_FILE, word & FROM_FILE == 0);
            let stored = if kept { len as usize } else { 0 };
            if at + 16 + stored > CAPACITY {
                return Err(fs_err(
                    libc::EIO,
                    format!("the undo log of segment {}: damaged entry", self.path),
                ));
            }
            let old = if kept {
                let mut b = vec![0u8; stored];
                self.map.read(at + 16, &mut b)?;
                Some(b)
            } else {
                None
            };
            out.push((off, len, old));
            at += 16 + stored.div_ceil(8) * 8;
        }
        Ok(out)
    }

    /// Every range the entries cover: `(offset, length)`, oldest first.
    pub fn ranges(&self) -> io::Result<Vec<(u64, u64)>> {
        Ok(self
            .entries()?
            .into_iter()
            .map(|(o, l, _)| (o, l))
            .collect())
    }

    /// Put the kept old bytes back into `object`, newest first; the ranges whose bytes
    /// must come from the segment file, for the caller to copy after (the file holds
    /// what preceded the transaction, so they go last, over any kept bytes).
    pub fn roll_back(&self, object: &File) -> io::Result<Vec<(u64, u64)>> {
        use std::os::unix::fs::FileExt;
        let mut from_file = Vec::new();
        for (off, len, old) in self.entries()?.iter().rev() {
            match old {
                Some(old) => object.write_all_at(old, *off)?,
                None => from_file.push((*off, *len)),
            }
        }
        Ok(from_file)
    }

    /// Forget every entry.
    pub fn clear(&self) -> io::Result<()> {
        self.map.atomic_u64(COUNT)?.store(0, Release);
        self.map.atomic_u64(USED)?.store(HEADER as u64, Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Kept bytes go back newest first (the oldest, what preceded the transaction, last);
    /// ranges kept without their bytes are handed back for the caller to copy from the
    /// segment file.
    #[test]
    fn kept_bytes_roll_back_newest_first_and_file_ranges_are_returned() {
        let f = tempfile::tempfile_in("/dev/shm").unwrap();
        f.set_len(CAPACITY as u64).unwrap();
        let u = UndoLog::map(&f, true, "test").unwrap();
        let object = tempfile::tempfile().unwrap();
        object.set_len(16384).unwrap();
        u.record(100, b"old1").unwrap();
        u.record_range(8192, 4096).unwrap();
        u.record(100, b"mid!").unwrap();
        object.write_all_at(b"new!", 100).unwrap();
        assert_eq!(u.ranges().unwrap(), vec![(100, 4), (8192, 4096), (100, 4)]);
        assert_eq!(u.roll_back(&object).unwrap(), vec![(8192, 4096)]);
        let mut b = [0u8; 4];
        object.read_exact_at(&mut b, 100).unwrap();
        assert_eq!(&b, b"old1");
        u.clear().unwrap();
        assert!(u.is_empty() && u.ranges().unwrap().is_empty());
        assert!(u.record_range(0, FROM_FILE).is_err());
    }
}
