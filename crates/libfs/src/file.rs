//! Open files: [`File`] and [`OpenOptions`], mirroring `std::fs`.
//!
//! Every write is one or more `WRITE` transactions, durable when the call returns, so
//! `sync_all`/`sync_data`/`flush` have nothing to do. Reads copy from the log ring (for
//! undigested data) or from the shared area straight into the caller's buffer.

use crate::fs::Inner;
use crate::{Fs, Metadata};
use cairn_area::fs_err;
use smallvec::SmallVec;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Options for opening a file, like `std::fs::OpenOptions`.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// All options off; mode `0o666` (before the umask).
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
        }
    }
    /// Open for reading.
    pub fn read(&mut self, v: bool) -> &mut Self {
        self.read = v;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, v: bool) -> &mut Self {
        self.write = v;
        self
    }
    /// Every write goes to the end of the file (implies write access).
    pub fn append(&mut self, v: bool) -> &mut Self {
        self.append = v;
        self
    }
    /// Truncate an existing file to 0 bytes.
    pub fn truncate(&mut self, v: bool) -> &mut Self {
        self.truncate = v;
        self
    }
    /// Create the file if it does not exist.
    pub fn create(&mut self, v: bool) -> &mut Self {
        self.create = v;
        self
    }
    /// Create the file; fail with `EEXIST` if it exists (even as a dangling symlink).
    pub fn create_new(&mut self, v: bool) -> &mut Self {
        self.create_new = v;
        self
    }
    /// Permission bits of a created file (the process umask is applied).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// Open `path` in `fs` with these options.
    pub fn open(&self, fs: &Fs, path: impl crate::Loc) -> io::Result<File> {
        let path = path.at();
        let writable = self.write || self.append;
        let invalid = |what: &str| {
            Err(fs_err(
                libc::EINVAL,
                format!("open {}: {what}", path.display()),
            ))
        };
        if !self.read && !writable {
            return invalid("neither read nor write access requested");
        }
        if (self.truncate || self.create || self.create_new) && !writable {
            return invalid("create or truncate without write access");
        }
        if self.truncate && self.append && !self.create_new {
            return invalid("truncate together with append");
        }
        let (ino, gen) = fs.inner.open_inode(
            path,
            self.read,
            writable,
            self.create || self.create_new,
            self.create_new,
            self.truncate,
            self.mode,
        )?;
        Ok(File {
            fs: fs.inner.clone(),
            ino,
            gen,
            read: self.read,
            write: writable,
            append: self.append,
            pos: AtomicU64::new(0),
            locks: crate::lock::FileLocks::default(),
        })
    }
}

impl OpenOptions {
    /// `open(dir, O_TMPFILE | …)`: a new regular file without a name in directory
    /// `dir`, with the mode set by [`OpenOptions::mode`] minus the umask. It needs write
    /// access (`write(true)`); it is freed when its last handle closes, unless it was
    /// given a name with [`File::link`]. `linkable: false` is `O_EXCL`: it never gets
    /// one.
    pub fn tmpfile(&self, fs: &Fs, dir: impl crate::Loc, linkable: bool) -> io::Result<File> {
        let dir = dir.at();
        if !self.write || self.append || self.truncate || self.create || self.create_new {
            return Err(fs_err(
                libc::EINVAL,
                format!(
                    "open {} (O_TMPFILE): write access and no create, truncate or append flag",
                    dir.display()
                ),
            ));
        }
        let (ino, gen) = fs.inner.create_tmpfile(dir, self.mode, linkable)?;
        Ok(File {
            fs: fs.inner.clone(),
            ino,
            gen,
            read: self.read,
            write: true,
            append: false,
            pos: AtomicU64::new(0),
            locks: crate::lock::FileLocks::default(),
        })
    }
}

/// An open file of a Cairn store.
///
/// Like a Unix file descriptor: reading a handle opened without read access, or writing
/// one opened without write access, fails with `EBADF`. The position is shared by `Read`,
/// `Write` and `Seek` (also through `&File`); `read_at`/`write_at` do not use it. Writes
/// on an append handle always go to the end of the file (also `write_at`, as on Linux).
#[derive(Debug)]
pub struct File {
    fs: Arc<Inner>,
    ino: u64,
    /// The inode's generation when it was opened (names its lock file).
    gen: u64,
    read: bool,
    write: bool,
    append: bool,
    pos: AtomicU64,
    /// Its descriptor of the inode's lock file (OFD and flock owner).
    locks: crate::lock::FileLocks,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("store", &self.store_dir())
            .finish()
    }
}

impl File {
    /// Open an existing file for reading.
    pub fn open(fs: &Fs, path: impl crate::Loc) -> io::Result<File> {
        OpenOptions::new().read(true).open(fs, path)
    }

    /// Create a file (or truncate an existing one) for writing.
    pub fn create(fs: &Fs, path: impl crate::Loc) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(fs, path)
    }

    /// Inode number of the open file.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// What `lock.rs` needs: the client, inode, generation, lock descriptor.
    pub(crate) fn lock_parts(&self) -> (&Inner, u64, u64, &crate::lock::FileLocks) {
        (&self.fs, self.ino, self.gen, &self.locks)
    }

    /// Read and write access.
    pub(crate) fn access(&self) -> (bool, bool) {
        (self.read, self.write)
    }

    /// Read at `offset` without moving the position; returns the bytes read (0 at or
    /// beyond the end).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if !self.read {
            return Err(fs_err(libc::EBADF, "read: file not open for reading"));
        }
        self.fs
            .run(|st| self.fs.read_data(st, self.ino, offset, buf))
    }

    /// Write all of `buf` at `offset` (at the end for an append handle) without moving
    /// the position; durable when it returns. Returns `buf.len()`.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if !self.write {
            return Err(fs_err(libc::EBADF, "write: file not open for writing"));
        }
        let pos = (!self.append).then_some(offset);
        let (_, n) = self
            .fs
            .run(|st| self.fs.write_data(st, self.ino, pos, buf))?;
        Ok(n)
    }

    /// Write `runs` (offset, bytes; not overlapping) as **one** transaction: after any
    /// crash, all of them are in the file or none is; durable when it returns. `E2BIG`
    /// when they do not fit in one transaction (a quarter of the log).
    pub fn write_runs_atomic(&self, runs: &[(u64, &[u8])]) -> io::Result<()> {
        if !self.write {
            return Err(fs_err(libc::EBADF, "write: file not open for writing"));
        }
        let runs: Vec<(u64, u64, &[u8])> = runs.iter().map(|&(o, d)| (self.ino, o, d)).collect();
        self.fs.run(|st| self.fs.write_runs(st, &runs))
    }

    /// Write runs of several files of one store as **one** transaction (see
    /// [`File::write_runs_atomic`]): `(file, offset, bytes)`; every file open for
    /// writing, all of the same `Fs`.
    pub fn write_files_atomic(runs: &[(&File, u64, &[u8])]) -> io::Result<()> {
        let Some(first) = runs.first() else {
            return Ok(());
        };
        for (f, ..) in runs {
            if !f.write {
                return Err(fs_err(libc::EBADF, "write: file not open for writing"));
            }
            if !Arc::ptr_eq(&f.fs, &first.0.fs) {
                return Err(fs_err(libc::EXDEV, "write: files of different clients"));
            }
        }
        let r: SmallVec<[(u64, u64, &[u8]); 8]> =
            runs.iter().map(|&(f, o, d)| (f.ino, o, d)).collect();
        first.0.fs.run(|st| first.0.fs.write_runs(st, &r))
    }

    /// The largest payload [`File::write_runs_atomic`] takes in one transaction (a
    /// quarter of this client's log, less the headers of `runs` records).
    pub fn atomic_write_limit(&self, runs: usize) -> usize {
        let quarter = self.fs.area.layout().ring_bytes() / 4;
        (quarter as usize).saturating_sub(64 + runs * (cairn_format::log::WRITE_HEADER_LEN + 8))
    }

    /// Append all of `buf` at the true end of the file, whatever the handle's append
    /// flag (`O_APPEND` set later with `fcntl`); durable when it returns. Returns the new
    /// end of the file.
    pub fn append(&self, buf: &[u8]) -> io::Result<u64> {
        if !self.write {
            return Err(fs_err(libc::EBADF, "write: file not open for writing"));
        }
        let (end, _) = self
            .fs
            .run(|st| self.fs.write_data(st, self.ino, None, buf))?;
        Ok(end)
    }

    /// For mapping `pages` 4 KiB pages from `off` (a multiple of 4096) in place: per page
    /// the offset of its digested data in the NVM tier file ([`Fs::nvm_path`]), or `None`
    /// for a page to read instead. If any page is given, the blocks are pinned until
    /// [`File::map_unpin`] with the returned epoch (reclamation waits meanwhile).
    pub fn map_plan(&self, off: u64, pages: usize) -> io::Result<(Vec<Option<u64>>, Option<u64>)> {
        if !self.read {
            return Err(fs_err(libc::EACCES, "mmap: file not open for reading"));
        }
        self.fs.run(|st| self.fs.map_plan(st, self.ino, off, pages))
    }

    /// Whether the handle was opened for reading.
    pub(crate) fn readable(&self) -> bool {
        self.read
    }

    /// The file system this handle belongs to.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.fs
    }

    /// The runs of a [`File::map_plan`] plan that can be mapped in place: `(first page,
    /// end page, NVM offset of the first)` for each maximal run of pages whose data lies
    /// at consecutive offsets.
    pub fn in_place_runs(plan: &[Option<u64>]) -> Vec<(usize, usize, u64)> {
        const PAGE: u64 = 4096;
        let mut runs = Vec::new();
        let mut i = 0;
        while i < plan.len() {
            let Some(start) = plan[i] else {
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < plan.len() && plan[j] == Some(start + (j - i) as u64 * PAGE) {
                j += 1;
            }
            runs.push((i, j, start));
            i = j;
        }
        runs
    }

    /// The mapping pinned at epoch `e` by [`File::map_plan`] is gone.
    pub fn map_unpin(&self, e: u64) -> io::Result<()> {
        self.fs.run(|st| self.fs.map_unpin(st, e))
    }

    /// Attach to the file's map object, creating it if needed (`docs/ARCHITECTURE.md`,
    /// "Shared mappings"): the host shared-memory file that every `MAP_SHARED` mapping of
    /// this file, in every process, maps at the file's offsets. Used by the shim's
    /// `mmap`; the Rust API's mapping is [`File::map_mut`]. Give it back with
    /// [`File::map_release`]. `ENOTSUP` while the file is in shared-write mode.
    pub fn map_object(&self) -> io::Result<Arc<crate::MapObject>> {
        if !self.read {
            return Err(fs_err(libc::EACCES, "mmap: file not open for reading"));
        }
        self.fs.map_attach(self.ino, self.write)
    }

    /// A read-only descriptor of `obj` for a read-only shared mapping, holding the lock
    /// that marks the object mapped (`mprotect` cannot make such a mapping writable).
    pub fn map_read_only(&self, obj: &crate::MapObject) -> io::Result<std::fs::File> {
        self.fs.map_read_only(obj)
    }

    /// `msync`: log the pages of `[off, off + len)` of the map object that differ from
    /// the file (durable when it returns; readers through any path see them).
    pub fn map_sync(&self, obj: &crate::MapObject, off: u64, len: u64) -> io::Result<()> {
        self.fs.map_sync(obj, off, len)
    }

    /// A mapping of `obj` is gone (`munmap`; write it back first with
    /// [`File::map_sync`]). The process's last one folds the object if no other process
    /// maps it.
    pub fn map_release(&self, obj: Arc<crate::MapObject>) -> io::Result<()> {
        self.fs.map_release(obj)
    }

    /// A descriptor of the resident copy of this segment file (crate `cairn-sj`), or
    /// with `undo` of its undo log, from the daemon: read-write if `write` and the
    /// daemon found that this process may write the file (the second value says which),
    /// else read-only. The daemon builds a missing copy from the file's committed state.
    pub fn segment_object(&self, undo: bool, write: bool) -> io::Result<(std::fs::File, bool)> {
        self.fs.sj_object(self.ino, undo, write)
    }

    /// Have the daemon copy this segment file's committed state over `ranges` (byte
    /// offset, length) of its resident copy, or all of it if `ranges` is empty: the
    /// repair of a dead writer's work by a process that may only read the segment.
    pub fn segment_refresh(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.fs.sj_refresh(self.ino, ranges)
    }

    /// A shared, writable mapping of `len` bytes from `off` (a multiple of 4096): the
    /// Rust API's `mmap(MAP_SHARED, PROT_READ | PROT_WRITE)`. Every process mapping the
    /// file sees the others' stores at once and they survive the death of the process
    /// that made them; [`crate::MapMut::flush`] (or dropping the mapping) makes them
    /// durable and visible to `read`. Needs a handle open for reading and writing. Pages
    /// past the end of the file fault (`SIGBUS`), as with `mmap`.
    pub fn map_mut(&self, off: u64, len: usize) -> io::Result<crate::MapMut> {
        if !self.read || !self.write {
            return Err(fs_err(
                libc::EACCES,
                "map_mut: the file must be open for reading and writing",
            ));
        }
        crate::MapMut::new(self.fs.clone(), self.ino, off, len)
    }

    /// Truncate or extend the file to `size` bytes (extension reads as zeros).
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        if !self.write {
            return Err(fs_err(libc::EINVAL, "set_len: file not open for writing"));
        }
        self.fs.run(|st| self.fs.set_len(st, self.ino, size))
    }

    /// `fallocate(2)` with Linux's `mode` rules: 0 extends the size to `off + len` (space
    /// is not reserved ahead: blocks are allocated when data is digested),
    /// `FALLOC_FL_KEEP_SIZE` alone does nothing, `FALLOC_FL_PUNCH_HOLE` (which needs
    /// `KEEP_SIZE`) is [`File::punch_hole`], `FALLOC_FL_ZERO_RANGE` (with or without
    /// `KEEP_SIZE`) is [`File::zero_range`]; other modes are `EOPNOTSUPP`, a negative
    /// offset or a length ≤ 0 `EINVAL`, an end past the largest file `EFBIG`.
    pub fn fallocate(&self, mode: i32, off: i64, len: i64) -> io::Result<()> {
        use libc::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH};
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        if off < 0 || len <= 0 {
            return Err(fs_err(libc::EINVAL, "fallocate: bad offset or length"));
        }
        if !self.write {
            return Err(fs_err(libc::EBADF, "fallocate: file not open for writing"));
        }
        let (off, len) = (off as u64, len as u64);
        let end = off
            .checked_add(len)
            .filter(|&e| e <= cairn_format::MAX_FILE_SIZE)
            .ok_or_else(|| fs_err(libc::EFBIG, "fallocate: beyond the largest file size"))?;
        match mode {
            0 => {
                if end > self.metadata()?.len() {
                    self.set_len(end)?;
                }
                Ok(())
            }
            KEEP => Ok(()),
            m if m == PUNCH | KEEP => self.punch_hole(off, len),
            m if m == ZERO || m == ZERO | KEEP => self.zero_range(off, len, m & KEEP != 0),
            m if m & PUNCH != 0 && m & !(PUNCH | KEEP) == 0 => Err(fs_err(
                libc::EOPNOTSUPP,
                "fallocate: FALLOC_FL_PUNCH_HOLE needs FALLOC_FL_KEEP_SIZE",
            )),
            _ => Err(fs_err(
                libc::EOPNOTSUPP,
                "fallocate: only modes 0, KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE are supported on Cairn",
            )),
        }
    }

    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`: bytes `[off, off + len)`
    /// read as zeros, and the whole 4 KiB blocks among them are freed when the daemon
    /// digests the call (`SEEK_HOLE` sees them at once). The size does not change; a
    /// range past the end does nothing there.
    pub fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        if !self.write {
            return Err(fs_err(libc::EBADF, "fallocate: file not open for writing"));
        }
        self.fs
            .run(|st| self.fs.punch(st, self.ino, off, len, None))
    }

    /// `fallocate(FALLOC_FL_ZERO_RANGE)`: bytes `[off, off + len)` read as zeros, and
    /// without `keep_size` a range past the end extends the file. Cairn frees the whole
    /// blocks in the range as for [`File::punch_hole`] (blocks are allocated when data is
    /// written, never ahead), so `st_blocks` drops where ext4's would not.
    pub fn zero_range(&self, off: u64, len: u64, keep_size: bool) -> io::Result<()> {
        if !self.write {
            return Err(fs_err(libc::EBADF, "fallocate: file not open for writing"));
        }
        self.fs
            .run(|st| self.fs.punch(st, self.ino, off, len, Some(!keep_size)))
    }

    /// `linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH)`: give this file another name
    /// (for an unnamed file from [`OpenOptions::tmpfile`], its first). `ENOENT` if the
    /// file was removed (or is unnamed and not linkable), `EEXIST` if `path` exists.
    pub fn link(&self, path: impl crate::Loc) -> io::Result<()> {
        self.fs.hard_link(crate::At::inode(self.ino), path.at())
    }

    /// `lseek(SEEK_DATA)`: the first offset at or after `off` inside a 4 KiB block that
    /// holds data (`ENXIO` if none, or if `off` is at or beyond the end).
    pub fn next_data(&self, off: u64) -> io::Result<u64> {
        self.fs.run(|st| self.fs.seek_data(st, self.ino, off, true))
    }

    /// `lseek(SEEK_HOLE)`: the first offset at or after `off` inside a hole (a 4 KiB
    /// block never written, or zeroed by a truncation), or the file's size (`ENXIO` if
    /// `off` is at or beyond the end).
    pub fn next_hole(&self, off: u64) -> io::Result<u64> {
        self.fs
            .run(|st| self.fs.seek_data(st, self.ino, off, false))
    }

    /// Metadata of the open file (`nlink` 0 once it was unlinked).
    pub fn metadata(&self) -> io::Result<Metadata> {
        self.fs.run(|st| self.fs.metadata_of(st, self.ino))
    }

    /// Every call is durable when it returns; what is left are stores into shared
    /// mappings of the file ([`File::map_mut`], `mmap` through the shim) not written back
    /// yet: they are, as Linux's `fsync` writes back a file's mapped pages.
    pub fn sync_all(&self) -> io::Result<()> {
        self.fs.sync_object(self.ino)
    }

    /// As [`File::sync_all`].
    pub fn sync_data(&self) -> io::Result<()> {
        self.sync_all()
    }

    fn read_pos(&self, buf: &mut [u8]) -> io::Result<usize> {
        let pos = self.pos.load(Ordering::Acquire);
        let n = self.read_at(buf, pos)?;
        self.pos.store(pos + n as u64, Ordering::Release);
        Ok(n)
    }

    fn write_pos(&self, buf: &[u8]) -> io::Result<usize> {
        if !self.write {
            return Err(fs_err(libc::EBADF, "write: file not open for writing"));
        }
        let (end, n) = self.fs.run(|st| {
            let pos = (!self.append).then(|| self.pos.load(Ordering::Acquire));
            self.fs.write_data(st, self.ino, pos, buf)
        })?;
        self.pos.store(end, Ordering::Release);
        Ok(n)
    }

    fn seek_pos(&self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(n) => {
                self.pos.store(n, Ordering::Release);
                return Ok(n);
            }
            SeekFrom::Current(d) => (self.pos.load(Ordering::Acquire), d),
            SeekFrom::End(d) => (self.metadata()?.len(), d),
        };
        let new = base
            .0
            .checked_add_signed(base.1)
            .ok_or_else(|| fs_err(libc::EINVAL, "seek: to a negative or overflowing position"))?;
        self.pos.store(new, Ordering::Release);
        Ok(new)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        crate::lock::on_close(&self.fs, self.ino, self.gen);
        self.fs.close(self.ino);
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_pos(buf)
    }
}

impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_pos(buf)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_pos(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_pos(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.seek_pos(pos)
    }
}

impl Seek for &File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.seek_pos(pos)
    }
}
