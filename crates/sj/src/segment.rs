//! A segment: its file in the store (the durable copy, changed only by commits) and its
//! *resident copy*, a file in `/dev/shm` that every attaching process maps at the
//! segment's base (docs/SPACEJMP.md, "Segments").
//!
//! The resident copy is made once, from the file, and stays until the segment is
//! evicted or removed: attaching a segment maps pages that are already there (2 MiB
//! folios where the kernel collapses them), instead of reading the file. Commits change
//! both: first the file (one transaction of the store's log, durable), then the resident
//! copy (publishing, under the segment's writer lock and its journal, so that a writer
//! dying half-way is repaired by the next one). The commit sequence in both copies' header
//! tells a stale resident copy from a current one.

use crate::control::Journal;
use crate::space::{open_named, Open};
use cairn::Fs;
use cairn_area::{fs_err, host};
use cairn_format::sj::{self, SegHeader};
use cairn_media::Mapping;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bytes read from the file per step when the resident copy is built.
const FILL_STEP: usize = 1 << 20;

/// An open segment.
pub struct Segment {
    pub ino: u64,
    pub gen: u64,
    /// Its path in the store.
    pub path: String,
    pub header: SegHeader,
    /// The segment's file (open for writing when this process may write it).
    pub file: cairn::File,
    pub writable: bool,
    /// The resident copy.
    pub object: File,
    pub object_path: PathBuf,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("path", &self.path)
            .field("ino", &self.ino)
            .field("base", &format_args!("{:#x}", self.header.base))
            .field("len", &self.header.len)
            .finish()
    }
}

/// The resident copy's path: `/dev/shm/cairn-<uuid>.sj-<ino>-<gen>`.
pub fn object_path(uuid: &[u8; 16], ino: u64, gen: u64) -> PathBuf {
    host::object_path(uuid, "sj", ino, gen)
}

/// The header of the segment file `f` (`EINVAL`: not a segment).
pub fn read_header(f: &cairn::File, path: &str) -> io::Result<SegHeader> {
    let mut b = [0u8; sj::SEG_HEADER_LEN];
    let n = f.read_at(&mut b, 0)?;
    if n < b.len() {
        return Err(fs_err(
            libc::EINVAL,
            format!("{path}: not a segment (too short)"),
        ));
    }
    SegHeader::decode(&b).map_err(|e| fs_err(libc::EINVAL, format!("{path}: {}", e.0)))
}

fn read_u64(f: &impl FileExt, off: u64) -> io::Result<u64> {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, off)?;
    Ok(u64::from_le_bytes(b))
}

impl Segment {
    /// Open the segment at `path` (for writing if `write`: the store checks the caller's
    /// permission), with its resident copy (made if missing; rebuilt if it is not the
    /// file's current state, `rebuild_ok` permitting: the caller then holds the
    /// segment's writer lock). `expect`: the inode number and generation the caller
    /// knows the segment by (`ESTALE` if the path now names another file).
    pub fn open(
        fs: &Fs,
        path: &str,
        write: bool,
        expect: Option<(u64, u64)>,
    ) -> io::Result<Segment> {
        let file = open_named(fs, "segment", path, Open::rw(write))?;
        let meta = file.metadata()?;
        let (ino, gen) = (meta.ino(), meta.generation());
        if let Some(want) = expect {
            if want != (ino, gen) {
                return Err(fs_err(
                    libc::ESTALE,
                    format!("segment {path} was removed or replaced since it was added"),
                ));
            }
        }
        let header = read_header(&file, path)?;
        if meta.len() < header.len {
            return Err(fs_err(
                libc::EINVAL,
                format!("{path}: damaged segment (file shorter than the segment)"),
            ));
        }
        let object_path = object_path(&fs.uuid(), ino, gen);
        let object = match open_object(&object_path)? {
            Some(o) => o,
            None => build_object(fs, &file, &object_path, header.len)?,
        };
        Ok(Segment {
            ino,
            gen,
            path: path.to_string(),
            header,
            file,
            writable: write,
            object,
            object_path,
        })
    }

    pub fn base(&self) -> u64 {
        self.header.base
    }

    pub fn len(&self) -> u64 {
        self.header.len
    }

    pub fn is_empty(&self) -> bool {
        self.header.len == 0
    }

    /// Whether it may share addresses with other segments that allow it (parked while
    /// one of those is placed).
    pub fn may_overlap(&self) -> bool {
        self.header.flags & sj::flags::OVERLAP != 0
    }

    pub fn lockable(&self) -> bool {
        self.header.flags & sj::flags::LOCKABLE != 0
    }

    /// The commit sequence in the file and in the resident copy.
    pub fn commit_seqs(&self) -> io::Result<(u64, u64)> {
        let mut b = [0u8; 8];
        self.file.read_at(&mut b, sj::COMMIT_SEQ_OFF)?;
        Ok((
            u64::from_le_bytes(b),
            read_u64(&self.object, sj::COMMIT_SEQ_OFF)?,
        ))
    }

    /// The commit sequence of the resident copy (what a commit increments: the caller
    /// holds the writer lock, so it is the file's too).
    pub fn object_seq(&self) -> io::Result<u64> {
        read_u64(&self.object, sj::COMMIT_SEQ_OFF)
    }

    /// Copy `[off, off + len)` of the file into the resident copy.
    pub fn refresh(&self, off: u64, len: u64) -> io::Result<()> {
        let mut buf = vec![0u8; FILL_STEP.min(len as usize)];
        let mut at = off;
        while at < off + len {
            let n = buf.len().min((off + len - at) as usize);
            let got = self.file.read_at(&mut buf[..n], at)?;
            buf[got..n].fill(0);
            self.object.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Make the resident copy the file's committed state again after a writer died
    /// (the caller holds the writer lock): the pages the journal lists, or all of it.
    /// An explicit-mode writer's undo log is applied by the caller.
    pub fn repair(&self, journal: Journal, pages: &[u64]) -> io::Result<()> {
        match journal {
            Journal::Clean | Journal::Undo => Ok(()),
            Journal::Pages => {
                for &p in pages {
                    if p < self.len() {
                        self.refresh(p, sj::PAGE.min(self.len() - p))?;
                    }
                }
                Ok(())
            }
            Journal::Whole => self.refresh(0, self.len()),
        }
    }

    /// Rebuild the resident copy if it is not the file's state (the caller holds the
    /// writer lock). Whether it did.
    pub fn resync(&self) -> io::Result<bool> {
        let (file, object) = self.commit_seqs()?;
        if file == object {
            return Ok(false);
        }
        self.refresh(0, self.len())?;
        Ok(true)
    }

    /// Bytes the resident copy holds in memory.
    pub fn resident_bytes(&self) -> u64 {
        self.object.metadata().map_or(0, |m| m.blocks() * 512)
    }
}

fn open_object(path: &Path) -> io::Result<Option<File>> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_err(
            cairn_area::errno_of(&e),
            format!("the resident copy {}: {e}", path.display()),
        )),
    }
}

/// Make the resident copy of `file` (`len` bytes) at `path`: filled from the file,
/// collapsed into 2 MiB folios where the kernel allows, then renamed into place (a
/// process that loses the race uses the winner's).
fn build_object(fs: &Fs, file: &cairn::File, path: &Path, len: u64) -> io::Result<File> {
    let tmp = path.with_extension(format!(
        "{}.new-{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    let ctx = |e: io::Error, what: &str| {
        fs_err(
            cairn_area::errno_of(&e),
            format!("{what} the resident copy {}: {e}", path.display()),
        )
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| ctx(e, "creating"))?;
    let r = (|| -> io::Result<()> {
        host::share_with_store(&f, fs.nvm_path())?;
        // All of it in memory now (it is pinned, as SpaceJMP's segments are).
        cairn_media::sys::fallocate(&f, len).map_err(|e| ctx(e, "allocating"))?;
        let mut buf = vec![0u8; FILL_STEP];
        let mut at = 0u64;
        while at < len {
            let n = buf.len().min((len - at) as usize);
            let got = file.read_at(&mut buf[..n], at)?;
            buf[got..n].fill(0);
            if buf[..n].iter().any(|&b| b != 0) {
                f.write_all_at(&buf[..n], at)
                    .map_err(|e| ctx(e, "filling"))?;
            }
            at += n as u64;
        }
        collapse(&f, len);
        Ok(())
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    match cairn_media::sys::renameat2(&tmp, path, libc::RENAME_NOREPLACE) {
        Ok(()) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&tmp);
            open_object(path)?.ok_or_else(|| fs_err(libc::ENOENT, "the resident copy vanished"))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(ctx(e, "naming"))
        }
    }
}

/// Back the resident copy with 2 MiB folios (`MADV_COLLAPSE` through a temporary
/// mapping), as far as the kernel allows; a refusal leaves 4 KiB pages.
fn collapse(f: &File, len: u64) {
    const HUGE: u64 = 2 << 20;
    let whole = len / HUGE * HUGE;
    if whole == 0 {
        return;
    }
    if let Ok(m) = Mapping::new(f, 0, whole as usize, true, false) {
        let mut at = 0;
        while at < whole {
            if m.collapse(at as usize, HUGE as usize).is_err() {
                break;
            }
            at += HUGE;
        }
    }
}

/// Remove a segment's resident copy (and any left over from a build).
pub fn remove_object(uuid: &[u8; 16], ino: u64, gen: u64) {
    let p = object_path(uuid, ino, gen);
    let _ = std::fs::remove_file(&p);
    let prefix = format!(
        "{}.new-",
        p.file_name().unwrap_or_default().to_string_lossy()
    );
    for q in host::list(uuid) {
        if q.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        {
            let _ = std::fs::remove_file(q);
        }
    }
}
