//! The undo log of an explicit-mode writer (docs/SPACEJMP.md, "Commit modes").
//!
//! In explicit mode a writer stores straight into the resident copy, after declaring the
//! bytes it will change (`tx_add`): their old contents go to this log first. A commit
//! logs the new bytes in the store and empties the log; an abort, or the next writer
//! after this one died, copies the old bytes back, newest first (a process that may
//! only read the segment has the daemon copy those ranges from the file instead). The
//! log is a host object the daemon makes and hands out (read-write to writers only),
//! `/dev/shm/cairn-<uuid>.sj-undo-<ino>-<gen>`: a count, the bytes used, then entries
//! (offset u64, length u64, the bytes padded to 8). An entry counts once the count
//! covers it, which is stored after the entry is whole.

use cairn_area::fs_err;
use cairn_media::Mapping;
use std::fs::File;
use std::io;
use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};

/// The most an explicit transaction may declare, with the entries' headers.
pub const CAPACITY: usize = 64 << 20;
const HEADER: usize = 64;
const COUNT: usize = 0;
const USED: usize = 8;

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
        let used = self.map.atomic_u64(USED)?.load(SeqCst) as usize;
        let at = used.max(HEADER);
        let total = 16 + len.div_ceil(8) * 8;
        if at + total > CAPACITY {
            return Err(fs_err(
                libc::ENOSPC,
                format!(
                    "an explicit transaction may declare at most {} MiB: commit more often",
                    CAPACITY >> 20
                ),
            ));
        }
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&off.to_le_bytes());
        head[8..].copy_from_slice(&(len as u64).to_le_bytes());
        self.map.write(at, &head)?;
        self.map.write(at + 16, old)?;
        self.map
            .write(at + 16 + len, &[0u8; 8][..total - 16 - len])?;
        // One writer (the holder of the writer lock): stores in order suffice.
        self.map
            .atomic_u64(USED)?
            .store((at + total) as u64, Release);
        let count = self.map.atomic_u64(COUNT)?;
        count.store(count.load(Acquire) + 1, Release);
        Ok(())
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let n = self.count()?;
        let mut out = Vec::new();
        let mut at = HEADER;
        for _ in 0..n {
            let off = self.map.load_u64(at)?;
            let len = self.map.load_u64(at + 8)? as usize;
            if len > CAPACITY || at + 16 + len > CAPACITY {
                return Err(fs_err(
                    libc::EIO,
                    format!("the undo log of segment {}: damaged entry", self.path),
                ));
            }
            let mut b = vec![0u8; len];
            self.map.read(at + 16, &mut b)?;
            out.push((off, b));
            at += 16 + len.div_ceil(8) * 8;
        }
        Ok(out)
    }

    /// Put the old bytes back into `object`, newest first.
    pub fn roll_back(&self, object: &File) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let entries = self.entries()?;
        for (off, old) in entries.iter().rev() {
            object.write_all_at(old, *off)?;
        }
        Ok(entries.len())
    }

    /// Forget every entry.
    pub fn clear(&self) -> io::Result<()> {
        self.map.atomic_u64(COUNT)?.store(0, Release);
        self.map.atomic_u64(USED)?.store(HEADER as u64, Release);
        Ok(())
    }
}
