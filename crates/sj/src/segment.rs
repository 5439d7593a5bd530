//! A segment: its file in the store (the durable copy, changed only by commits) and its
//! *resident copy*, a file in `/dev/shm` that every attaching process maps at the
//! segment's base (docs/SPACEJMP.md, "Segments").
//!
//! The resident copy is made once, from the file, and stays until the segment is
//! evicted or removed: attaching a segment maps pages that are already there (2 MiB
//! folios where the kernel collapses them), instead of reading the file. The daemon
//! alone makes, refreshes and removes it (mode 0600, its own user's), and hands out
//! descriptors of it after checking the process's permission on the segment's file:
//! read-write to its owner and writers, read-only to readers
//! (`cairn::File::segment_object`). Commits change both: first the file (one transaction
//! of the store's log, durable), then the resident copy (publishing, under the segment's
//! writer lock and its journal, so that a writer dying half-way is repaired by the next
//! one: itself if it may write the segment, else through the daemon). The commit
//! sequence in both copies' header tells a stale resident copy from a current one.

use crate::control::Journal;
use crate::space::{open_named, Open};
use cairn::Fs;
use cairn_area::{fs_err, host};
use cairn_format::sj::{self, SegHeader, StageHeader};
use cairn_media::Mapping;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Bytes read from the file per step when the resident copy is built.
const FILL_STEP: usize = 1 << 20;

/// An open segment.
pub struct Segment {
    fs: Fs,
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
    /// The resident copy's first page, read-only: its commit sequence without a system
    /// call (the copy is never truncated, so the page stays).
    object_head: Mapping,
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
    host::object_path(uuid, host::SEGMENT_COPY_KIND, ino, gen)
}

/// The header of the segment file `f` (`EINVAL`: not a segment).
pub fn read_header(f: &cairn::File, path: &str) -> io::Result<SegHeader> {
    let mut b = [0u8; sj::SEG_HEADER_LEN];
    let n = f.read_at(&mut b, 0)?;
    if n < b.len() || b.iter().all(|&x| x == 0) {
        return Err(fs_err(
            libc::EINVAL,
            format!(
                "{path}: not a segment: it has no header (its creation did not finish; \
                 `cairn sj seg rm` removes it)"
            ),
        ));
    }
    SegHeader::decode(&b).map_err(|e| fs_err(libc::EINVAL, format!("{path}: {}", e.0)))
}

impl Segment {
    /// Open the segment at `path` (for writing if `write`: the store checks the caller's
    /// permission), with a descriptor of its resident copy from the daemon (read-write
    /// if `write`; the daemon builds a missing copy). `expect`: the inode number and
    /// generation the caller knows the segment by (`ESTALE` if the path now names
    /// another file).
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
        let (object, rw) = file.segment_object(false, write)?;
        if write && !rw {
            return Err(fs_err(
                libc::EACCES,
                format!("segment {path}: the daemon grants its resident copy read-only"),
            ));
        }
        // Marks it attached: the daemon does not drop a copy whose lock it cannot take.
        cairn_media::sys::flock_shared(&object, false)?;
        let object_head = Mapping::new(&object, 0, sj::PAGE as usize, false, false)?;
        Ok(Segment {
            object_head,
            fs: fs.clone(),
            ino,
            gen,
            path: path.to_string(),
            header,
            file,
            writable: write,
            object,
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

    /// The commit sequence of the file's committed state (a staged commit's, while one
    /// is pending) and of the resident copy.
    pub fn commit_seqs(&self) -> io::Result<(u64, u64)> {
        let (seq, redo) = file_seqs(&self.file)?;
        Ok((if redo != 0 { redo } else { seq }, self.object_seq()?))
    }

    /// The commit sequence of the resident copy (what a commit increments: the caller
    /// holds the writer lock, so it is the file's too).
    pub fn object_seq(&self) -> io::Result<u64> {
        self.object_head.load_u64(sj::COMMIT_SEQ_OFF as usize)
    }

    /// Copy the committed state (the file, and a pending staged commit laid over it)
    /// over `ranges` of the resident copy (all of it if empty): by this process if it
    /// may write the segment, else by the daemon.
    fn refresh(&self, staged: Option<&Staged>, ranges: &[(u64, u64)]) -> io::Result<()> {
        if !self.writable {
            if ranges.len() > cairn_proto::MAX_REFRESH_RANGES {
                return self.file.segment_refresh(&[]);
            }
            return self.file.segment_refresh(ranges);
        }
        let whole = [(0, self.len())];
        let ranges = if ranges.is_empty() {
            &whole[..]
        } else {
            ranges
        };
        for &(off, len) in ranges {
            let mut buf = vec![0u8; FILL_STEP.min(len as usize)];
            let mut at = off;
            while at < off + len {
                let n = buf.len().min((off + len - at) as usize);
                committed_at(&self.file, staged, &mut buf[..n], at)?;
                self.object.write_all_at(&buf[..n], at)?;
                at += n as u64;
            }
        }
        Ok(())
    }

    /// Make the resident copy the committed state again after a writer died (the caller
    /// holds the writer lock): the pages the journal lists, or all of it, and `more`
    /// ranges (a dead explicit-mode writer's undo entries, for a process that may not
    /// write the copy to roll them back). A staged commit the writer left is finished
    /// first (when this process may write the file).
    pub fn repair(&self, journal: Journal, pages: &[u64], more: &[(u64, u64)]) -> io::Result<()> {
        let staged = self.settle_staged()?;
        let mut ranges: Vec<(u64, u64)> = match journal {
            Journal::Clean | Journal::Undo => Vec::new(),
            Journal::Pages => (pages.iter())
                .filter(|&&p| p < self.len())
                .map(|&p| (p, sj::PAGE.min(self.len() - p)))
                .collect(),
            Journal::Whole => return self.refresh(staged.as_ref(), &[]),
        };
        ranges.extend(
            more.iter()
                .filter(|&&(o, l)| o.checked_add(l).is_some_and(|e| e <= self.len()) && l > 0),
        );
        if ranges.is_empty() {
            return Ok(());
        }
        self.refresh(staged.as_ref(), &ranges)
    }

    /// Finish a pending staged commit (when this process may write the file) and rebuild
    /// the resident copy if it is not the committed state (the caller holds the writer
    /// lock). Whether it rebuilt.
    pub fn resync(&self) -> io::Result<bool> {
        let staged = self.settle_staged()?;
        let (file, object) = self.commit_seqs()?;
        if file == object {
            return Ok(false);
        }
        self.refresh(staged.as_ref(), &[])?;
        Ok(true)
    }

    /// The staged commit the file's marker names, if one is pending.
    fn staged(&self) -> io::Result<Option<Staged>> {
        staged_of(&self.fs, &self.file, self.ino, self.gen, self.len())
    }

    /// Stage commit `seq` (`runs`: sorted, not overlapping, with their new bytes) in the
    /// segment's stage file, durable on return. Not committed: setting the marker (of
    /// every segment of the commit, in one transaction) is the commit point.
    pub fn stage(&self, seq: u64, runs: &[(u64, &[u8])]) -> io::Result<()> {
        let path = stage_path(self.ino, self.gen);
        let meta = self.file.metadata()?;
        let mode = meta.mode() & 0o7777;
        // The stage directory is shared and sticky, so anyone could have made this
        // name first, to change a staged commit under its writer. A file left there is
        // removed and a new one made; one this process may not remove is used only if
        // it is the segment owner's, root's or this user's, with the segment's mode.
        let f = match self.fs.remove_file(path.as_str()) {
            Err(e) if !matches!(cairn_area::errno_of(&e), libc::ENOENT) => {
                let old = self.fs.symlink_metadata(path.as_str())?;
                let euid = cairn_media::sys::ids().0;
                let owner_ok = [meta.uid(), 0, euid].contains(&old.uid());
                if !owner_ok || !old.is_file() || old.mode() & 0o7777 != mode {
                    return Err(fs_err(
                        libc::EACCES,
                        format!(
                            "{path}: a stage file of uid {} and mode {:o} that this process may not \
                             remove is in the way; its owner or root must remove it",
                            old.uid(),
                            old.mode() & 0o7777
                        ),
                    ));
                }
                open_named(&self.fs, "stage file", &path, Open::Write)?
            }
            _ => {
                let f = open_named(&self.fs, "stage file", &path, Open::Create(mode))?;
                // Whoever may read the segment may read its staged commit (the umask
                // does not narrow it).
                self.fs
                    .set_permissions(path.as_str(), cairn::Permissions::from_mode(mode))?;
                f
            }
        };
        let head = StageHeader {
            seq,
            ino: self.ino,
            gen: self.gen,
            runs: runs.iter().map(|&(o, d)| (o, d.len() as u64)).collect(),
        };
        let mut at = head.data_off();
        for &(o, d) in runs {
            f.write_at(&with_marker(o, d, seq), at)?;
            at += d.len() as u64;
        }
        f.write_at(&head.encode(), 0)?;
        Ok(())
    }

    /// Copy a staged commit's runs into the file (not atomic by itself: the marker
    /// stays set meanwhile, so a crash leaves the staged commit pending, to be finished
    /// again), then clear the marker. `runs` are the staged runs, from memory.
    pub fn apply_staged(&self, seq: u64, runs: &[(u64, &[u8])]) -> io::Result<()> {
        for (i, &(o, d)) in runs.iter().enumerate() {
            self.file.write_at(&with_marker(o, d, seq), o)?;
            if i == 0 {
                crate::space::crash_point("applying");
            }
        }
        self.clear_staged()
    }

    /// Clear the marker (the staged commit is in the file), then give the stage file's
    /// blocks back (best effort: a later staged commit overwrites it anyway).
    fn clear_staged(&self) -> io::Result<()> {
        self.file
            .write_runs_atomic(&[(sj::REDO_SEQ_OFF, &0u64.to_le_bytes())])?;
        let path = stage_path(self.ino, self.gen);
        if let Ok(f) = open_named(&self.fs, "stage file", &path, Open::Write) {
            let _ = f.set_len(0);
        }
        Ok(())
    }

    /// Finish a pending staged commit from the stage file if this process may write the
    /// segment (the caller holds the writer lock); the staged commit still pending (one
    /// this process may not finish: readers lay it over the file).
    pub fn settle_staged(&self) -> io::Result<Option<Staged>> {
        let Some(st) = self.staged()? else {
            return Ok(None);
        };
        if !self.writable {
            return Ok(Some(st));
        }
        let mut at = st.head.data_off();
        for &(o, l) in &st.head.runs {
            let mut done = 0;
            while done < l {
                let n = (FILL_STEP as u64).min(l - done) as usize;
                let mut buf = vec![0u8; n];
                read_exact(&st.file, &mut buf, at + done)?;
                self.file.write_at(&buf, o + done)?;
                done += n as u64;
            }
            at += l;
        }
        self.clear_staged()?;
        Ok(None)
    }
}

/// The shared directory of stage files.
pub const STAGE_DIR: &str = "/.sj/stage";

/// The stage file of segment (`ino`, `gen`) in the store.
pub fn stage_path(ino: u64, gen: u64) -> String {
    format!("{STAGE_DIR}/{ino}-{gen}")
}

/// A pending staged commit, read back from its stage file.
pub struct Staged {
    file: cairn::File,
    head: StageHeader,
}

impl Staged {
    /// Lay the staged runs over `buf`, the segment's bytes from `off`.
    fn overlay(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.head
            .overlay(off, buf, &mut |b, at| read_exact(&self.file, b, at))
    }
}

fn read_exact(f: &cairn::File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], off + done as u64)?;
        if n == 0 {
            return Err(fs_err(libc::EINVAL, "stage file: cut short"));
        }
        done += n;
    }
    Ok(())
}

/// The file's commit sequence and staged-commit marker.
fn file_seqs(file: &cairn::File) -> io::Result<(u64, u64)> {
    let mut b = [0u8; 16];
    file.read_at(&mut b, sj::COMMIT_SEQ_OFF)?;
    Ok((
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
    ))
}

/// The staged commit the marker of segment file `file` names, if any. `EINVAL` when the
/// marker is set and its stage file is missing or damaged (the committed state cannot
/// be known: the segment is damaged).
fn staged_of(
    fs: &Fs,
    file: &cairn::File,
    ino: u64,
    gen: u64,
    len: u64,
) -> io::Result<Option<Staged>> {
    let (_, redo) = file_seqs(file)?;
    if redo == 0 {
        return Ok(None);
    }
    let path = stage_path(ino, gen);
    let sf = open_named(fs, "stage file", &path, Open::Read)?;
    let sm = sf.metadata()?;
    trusted_stage(fs, &path, &sm, &file.metadata()?)?;
    let size = sm.len();
    let head = StageHeader::load(
        &mut |b, at| read_exact(&sf, b, at),
        size,
        (ino, gen, len),
        redo,
    )
    .map_err(|e| fs_err(libc::EINVAL, format!("{e} ({path})")))?;
    Ok(Some(Staged { file: sf, head }))
}

/// `EINVAL` unless the stage file at `path` (metadata `sm`) may stand for what a writer
/// of the segment (metadata `seg`) wrote (`cairn_area::users::stage_trusted`: who made
/// the shared stage directory may replace a stage file a writer left pending; the
/// daemon checks the same).
fn trusted_stage(
    fs: &Fs,
    path: &str,
    sm: &cairn::Metadata,
    seg: &cairn::Metadata,
) -> io::Result<()> {
    let f = cairn_area::users::StageFile {
        dir_owner: fs.metadata(STAGE_DIR)?.uid(),
        store_owner: cairn_area::StoreDir::new(fs.store_dir())
            .load_config()?
            .owner()?,
        owner: sm.uid(),
        perm: sm.attrs().perm,
    };
    cairn_area::users::stage_trusted(f, seg.attrs()).map_err(|why| {
        fs_err(
            libc::EINVAL,
            format!(
                "damaged segment: its pending staged commit's file {path} is not trusted: {why}"
            ),
        )
    })
}

/// `buf` filled with the committed state from `off`: the file's bytes (zeros past its
/// end), a pending staged commit laid over them, and the marker itself left out (a
/// resident copy never carries it).
fn committed_at(
    file: &cairn::File,
    staged: Option<&Staged>,
    buf: &mut [u8],
    off: u64,
) -> io::Result<()> {
    let got = file.read_at(buf, off)?;
    buf[got..].fill(0);
    if let Some(st) = staged {
        st.overlay(off, buf)?;
    }
    sj::clear_marker(off, buf);
    Ok(())
}

/// A run's bytes as a staged commit writes them: with the marker (`seq`) where the run
/// covers it, so that copying the run into the file never clears the marker early.
fn with_marker(off: u64, data: &[u8], seq: u64) -> std::borrow::Cow<'_, [u8]> {
    let (m, end) = (sj::REDO_SEQ_OFF, sj::REDO_SEQ_OFF + 8);
    let (s, e) = (m.max(off), end.min(off + data.len() as u64));
    if s >= e {
        return std::borrow::Cow::Borrowed(data);
    }
    let mut v = data.to_vec();
    v[(s - off) as usize..(e - off) as usize]
        .copy_from_slice(&seq.to_le_bytes()[(s - m) as usize..(e - m) as usize]);
    std::borrow::Cow::Owned(v)
}
