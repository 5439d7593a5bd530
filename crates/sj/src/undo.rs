//! The undo log of an explicit-mode writer (docs/SPACEJMP.md, "Commit modes").
//!
//! In explicit mode a writer stores straight into the resident copy, after declaring the
//! bytes it will change (`tx_add`): their old contents go to this log first. A commit
//! logs the new bytes in the store and empties the log; an abort, or the next writer
//! after this one died, copies the old bytes back, newest first. The log is a host
//! object, `/dev/shm/cairn-<uuid>.sj-undo-<ino>-<gen>`: a count, the bytes used, then
//! entries (offset u64, length u64, the bytes padded to 8). An entry counts once the
//! count covers it, which is stored after the entry is whole.

use cairn_area::{fs_err, host};
use cairn_media::Mapping;
use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;

/// The most an explicit transaction may declare, with the entries' headers.
pub const CAPACITY: usize = 64 << 20;
const HEADER: usize = 64;
const COUNT: usize = 0;
const USED: usize = 8;

pub struct UndoLog {
    map: Mapping,
    path: PathBuf,
}

impl std::fmt::Debug for UndoLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UndoLog").field("path", &self.path).finish()
    }
}

impl UndoLog {
    /// The undo log of segment `ino`/`gen` of the store with `uuid` (made if missing,
    /// with the mode and group of the NVM file at `nvm`).
    pub fn open(uuid: &[u8; 16], ino: u64, gen: u64, nvm: &std::path::Path) -> io::Result<UndoLog> {
        let m = std::fs::metadata(nvm)?;
        let (f, path) = Self::open_file(uuid, ino, gen, nvm, Some(host::object_mode(m.mode())))?;
        // The store's trust domain, if this process made it (else it is the maker's).
        let _ = host::share_with_store(&f, nvm);
        if f.metadata()?.len() < CAPACITY as u64 {
            f.set_len(CAPACITY as u64)?;
        }
        let map = Mapping::new(&f, 0, CAPACITY, true, false)?;
        Ok(UndoLog { map, path })
    }

    /// The undo log of segment `ino`/`gen`, if one was ever made and sized (one still
    /// being made by [`UndoLog::open`] holds no entries yet).
    pub fn open_existing(
        uuid: &[u8; 16],
        ino: u64,
        gen: u64,
        nvm: &std::path::Path,
    ) -> io::Result<Option<UndoLog>> {
        let (f, path) = match Self::open_file(uuid, ino, gen, nvm, None) {
            Ok(r) => r,
            Err(e) if cairn_area::errno_of(&e) == libc::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        };
        if f.metadata()?.len() < CAPACITY as u64 {
            return Ok(None);
        }
        let map = Mapping::new(&f, 0, CAPACITY, true, false)?;
        Ok(Some(UndoLog { map, path }))
    }

    /// The log's file, made with `mode` if missing and `mode` is given; checked to be
    /// the store's (`nvm`: its NVM file) if it was there.
    fn open_file(
        uuid: &[u8; 16],
        ino: u64,
        gen: u64,
        nvm: &std::path::Path,
        mode: Option<u32>,
    ) -> io::Result<(File, PathBuf)> {
        let path = host::object_path(uuid, "sj-undo", ino, gen);
        let mut o = std::fs::OpenOptions::new();
        o.read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW);
        if let Some(mode) = mode {
            o.create(true).truncate(false).mode(mode);
        }
        let f = o.open(&path).map_err(|e| {
            fs_err(
                cairn_area::errno_of(&e),
                format!("the undo log {}: {e}", path.display()),
            )
        })?;
        host::check_object(&f, &path, nvm)?;
        Ok((f, path))
    }

    /// Remove the undo log of a segment (it is being removed).
    pub fn remove(uuid: &[u8; 16], ino: u64, gen: u64) {
        let _ = std::fs::remove_file(host::object_path(uuid, "sj-undo", ino, gen));
    }

    fn count(&self) -> io::Result<u64> {
        Ok(self.map.atomic_u64(COUNT)?.load(SeqCst))
    }

    /// Whether it holds entries.
    pub fn is_empty(&self) -> bool {
        self.count().unwrap_or(0) == 0
    }

    /// Record that the `old` bytes were at `off` before this transaction changes them.
    /// `ENOSPC` past [`CAPACITY`].
    pub fn record(&self, off: u64, old: &[u8]) -> io::Result<()> {
        let used = self.map.atomic_u64(USED)?.load(SeqCst) as usize;
        let at = used.max(HEADER);
        let len = 16 + old.len().div_ceil(8) * 8;
        if at + len > CAPACITY {
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
        head[8..].copy_from_slice(&(old.len() as u64).to_le_bytes());
        self.map.write(at, &head)?;
        self.map.write(at + 16, old)?;
        self.map
            .write(at + 16 + old.len(), &[0u8; 8][..len - 16 - old.len()])?;
        self.map.atomic_u64(USED)?.store((at + len) as u64, SeqCst);
        self.map.atomic_u64(COUNT)?.fetch_add(1, SeqCst);
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
                    format!("{}: damaged entry", self.path.display()),
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
        self.map.atomic_u64(COUNT)?.store(0, SeqCst);
        self.map.atomic_u64(USED)?.store(HEADER as u64, SeqCst);
        Ok(())
    }
}
