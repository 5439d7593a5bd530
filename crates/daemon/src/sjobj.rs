//! The host objects of SpaceJMP segments (docs/SPACEJMP.md, "Who may write what"): a
//! segment's *resident copy* (`cairn-<uuid>.sj-<ino>-<gen>`), which every attaching
//! process maps, and its explicit-mode *undo log* (`….sj-undo-<ino>-<gen>`). As with map
//! objects (`crate::mapobj`), the daemon alone creates and removes them (mode 0600, its
//! own user's) and hands out descriptors after checking the client's permission on the
//! segment's file with the credentials the kernel reported: read-write to its owner and
//! writers, read-only to readers. So a process that may only read a segment cannot
//! change what the other processes attached to it see.
//!
//! The daemon builds a missing resident copy from the segment's committed state (the
//! file, a pending staged commit laid over it, its marker left out), and refreshes
//! ranges of it for a reader that repairs a dead writer's work (`Request::SjRefresh`).
//! Writers publish their commits into the copy themselves, through their read-write
//! descriptor, as before.

use crate::core::Core;
use crate::util::einval;
use cairn_area::{fs_err, host};
use cairn_format::inode::{Inode, Kind};
use cairn_format::sj::{self, SegHeader, StageHeader};
use cairn_media::sys;
use std::fs::File;
use std::io;
use std::path::PathBuf;

/// Bytes copied per step (and per hold of the core lock) when a copy is built.
pub(crate) const FILL_STEP: usize = 1 << 20;

/// A segment's committed state, as the daemon reads it: the segment file and a pending
/// staged commit (its stage file's inode and head).
pub(crate) struct Committed {
    ino: u64,
    gen: u64,
    pub(crate) len: u64,
    staged: Option<(u64, StageHeader)>,
}

/// What `SjObject` found.
pub(crate) enum SjOpen {
    /// The object and whether the descriptor is read-write.
    Ready(File, bool),
    /// The resident copy is missing: build it ([`start_copy`], [`Core::sj_fill`] step
    /// by step, [`finish_copy`]), then open it (read-write if `writable`).
    Build {
        committed: Committed,
        path: PathBuf,
        nvm: PathBuf,
        writable: bool,
    },
}

impl Core {
    fn sj_object_path(&self, undo: bool, ino: u64, gen: u64) -> PathBuf {
        let kind = if undo {
            host::SEGMENT_UNDO_KIND
        } else {
            host::SEGMENT_COPY_KIND
        };
        host::object_path(&self.sh.area.superblock().uuid, kind, ino, gen)
    }

    /// A descriptor of segment `ino`/`gen`'s resident copy (or with `undo` its undo
    /// log) for the client of `slot` (`Request::SjObject`): read-write if `write` and
    /// it owns or may write the file, else read-only if it may read it. A missing undo
    /// log is made empty (for a writer only); a missing copy is to be built.
    pub(crate) fn sj_object(
        &self,
        slot: u32,
        ino: u64,
        gen: u64,
        undo: bool,
        write: bool,
    ) -> io::Result<SjOpen> {
        let what = if undo { "undo log" } else { "resident copy" };
        let (inode, writable) = self.object_grant(slot, ino, gen, write, what)?;
        let path = self.sj_object_path(undo, ino, gen);
        let nvm = &self.cfg.nvm_path;
        match host::open_daemon_object(&path, nvm, writable) {
            Ok(f) => return Ok(SjOpen::Ready(f, writable)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if undo {
            if !writable {
                return Err(fs_err(
                    libc::ENOENT,
                    format!("segment inode {ino}: no undo log (only a writer makes one)"),
                ));
            }
            return match host::create_private_object(&path) {
                Ok(f) => Ok(SjOpen::Ready(f, true)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(SjOpen::Ready(
                    host::open_daemon_object(&path, nvm, true)?,
                    true,
                )),
                Err(e) => Err(e),
            };
        }
        Ok(SjOpen::Build {
            committed: self.sj_committed(ino, &inode)?,
            path,
            nvm: nvm.clone(),
            writable,
        })
    }

    /// Where segment `inode`'s committed state is: its length from its header, and a
    /// pending staged commit if its marker is set.
    fn sj_committed(&self, ino: u64, inode: &Inode) -> io::Result<Committed> {
        let gen = inode.generation;
        let mut h = [0u8; sj::SEG_HEADER_LEN];
        let n = self.sh.area.read_file(inode, 0, &mut h)?;
        let header = SegHeader::decode(&h[..n])
            .map_err(|e| einval(format!("segment inode {ino}: {}", e.0)))?;
        if inode.attrs.size < header.len {
            return Err(einval(format!(
                "segment inode {ino}: damaged (file shorter than the segment)"
            )));
        }
        let mut m = [0u8; 8];
        self.sh.area.read_file(inode, sj::REDO_SEQ_OFF, &mut m)?;
        let redo = u64::from_le_bytes(m);
        let staged = if redo == 0 {
            None
        } else {
            let (stage_dir, stage_ino, stage) = self.stage_inode(ino, gen)?.ok_or_else(|| {
                einval(format!(
                    "damaged segment inode {ino}: its staged commit {redo} has no stage file"
                ))
            })?;
            // Whoever owns the shared stage directory may have replaced it (the client
            // checks the same: `cairn_sj::segment`).
            let file = cairn_area::users::StageFile {
                dir_owner: stage_dir.attrs.uid,
                store_owner: self.cfg.owner()?,
                owner: stage.attrs.uid,
                perm: stage.attrs.perm,
            };
            cairn_area::users::stage_trusted(file, &inode.attrs)
            .map_err(|why| {
                einval(format!(
                    "damaged segment inode {ino}: the stage file of its staged commit {redo} is not trusted: {why}"
                ))
            })?;
            let mut read = |b: &mut [u8], at: u64| read_exact(self, &stage, b, at);
            let size = stage.attrs.size;
            let head = StageHeader::load(&mut read, size, (ino, gen, header.len), redo)
                .map_err(|e| einval(format!("segment inode {ino}: {e}")))?;
            Some((stage_ino, head))
        };
        Ok(Committed {
            ino,
            gen,
            len: header.len,
            staged,
        })
    }

    /// The stage directory and the stage file of segment `ino`/`gen`
    /// (`/.sj/stage/<ino>-<gen>`, its inode number and inode), if it exists.
    fn stage_inode(&self, ino: u64, gen: u64) -> io::Result<Option<(Inode, u64, Inode)>> {
        let mut at = cairn_format::ROOT_INO;
        let mut d = self.sh.inode(at)?;
        let mut parent = d;
        let name = format!("{ino}-{gen}");
        for part in [".sj", "stage", name.as_str()] {
            if d.attrs.kind != Kind::Dir {
                return Ok(None);
            }
            match self.sh.area.dir_lookup(&d, part.as_bytes())? {
                Some((i, _)) => {
                    at = i;
                    parent = d;
                    d = self.sh.inode(i)?;
                }
                None => return Ok(None),
            }
        }
        Ok((d.attrs.kind == Kind::File).then_some((parent, at, d)))
    }

    /// `buf` filled with segment `c`'s committed bytes from `off` (zeros past the
    /// file's end; the marker left out). The inodes are read again at every step: a
    /// migration between tiers may have moved their blocks meanwhile.
    pub(crate) fn sj_fill(&self, c: &Committed, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let inode = self.sh.inode(c.ino)?;
        if inode.attrs.kind != Kind::File || inode.generation != c.gen {
            return Err(fs_err(
                libc::ESTALE,
                format!("segment inode {}: removed meanwhile", c.ino),
            ));
        }
        let got = self.sh.area.read_file(&inode, off, buf)?;
        buf[got..].fill(0);
        if let Some((stage_ino, head)) = &c.staged {
            let stage = self.sh.inode(*stage_ino)?;
            let mut read = |b: &mut [u8], at: u64| read_exact(self, &stage, b, at);
            head.overlay(off, buf, &mut read)?;
        }
        sj::clear_marker(off, buf);
        Ok(())
    }

    /// Check a `SjRefresh` of segment `ino`/`gen` by the client of `slot` (it may read
    /// the segment and holds a lease on it): the segment's committed state, and the
    /// resident copy, opened read-write.
    pub(crate) fn sj_refresh_start(
        &self,
        slot: u32,
        ino: u64,
        gen: u64,
    ) -> io::Result<(Committed, File)> {
        let (inode, _) = self.object_grant(slot, ino, gen, false, "resident copy")?;
        let path = self.sj_object_path(false, ino, gen);
        let f = host::open_daemon_object(&path, &self.cfg.nvm_path, true)?;
        Ok((self.sj_committed(ino, &inode)?, f))
    }

    /// Remove segment `ino`/`gen`'s resident copy (and with `undo` its undo log) for
    /// the client of `slot` (`Request::SjDrop`): the segment's file is gone (or is not
    /// that file any more), or the client owns or may write it and nobody has the copy
    /// attached (the daemon takes its `flock` exclusively; attached processes hold it
    /// shared): else `EBUSY`.
    pub(crate) fn sj_drop(&self, slot: u32, ino: u64, gen: u64, undo: bool) -> io::Result<()> {
        if !self.sh.layout.ino_valid(ino) {
            return Err(einval(format!("segment: inode number {ino} out of range")));
        }
        let inode = self.sh.inode(ino)?;
        let gone =
            inode.attrs.kind != Kind::File || inode.generation != gen || inode.attrs.nlink == 0;
        if !gone {
            let cred = crate::perm::slot_cred(&self.sh, slot)?;
            if !cred.owns_or_writes(&inode.attrs) {
                return Err(fs_err(
                    libc::EACCES,
                    format!(
                        "segment inode {ino}: dropping its resident copy needs the owner or \
                         write permission"
                    ),
                ));
            }
        }
        let nvm = &self.cfg.nvm_path;
        let copy = self.sj_object_path(false, ino, gen);
        match host::open_daemon_object(&copy, nvm, false) {
            Ok(f) => match sys::flock_exclusive(&f, true) {
                Ok(()) => std::fs::remove_file(&copy)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(fs_err(
                        libc::EBUSY,
                        format!("segment inode {ino}: its resident copy is attached"),
                    ))
                }
                Err(e) => return Err(e),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if undo {
            match std::fs::remove_file(self.sj_object_path(true, ino, gen)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// `buf` filled from file `inode` at `at` (`EINVAL` if it ends first).
fn read_exact(core: &Core, inode: &Inode, buf: &mut [u8], at: u64) -> io::Result<()> {
    let got = core.sh.area.read_file(inode, at, buf)?;
    if got < buf.len() {
        return Err(einval("a segment's stage file is cut short"));
    }
    Ok(())
}

/// Make the file for a resident copy of `len` bytes next to `path` (under
/// `….new-<daemon pid>-<n>`, `n` counting the daemon's builds, which may run at once;
/// the sweep of a later daemon removes one a crash left).
pub(crate) fn start_copy(path: &std::path::Path, len: u64) -> io::Result<(File, PathBuf)> {
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = PathBuf::from(format!("{}.new-{}-{n}", path.display(), std::process::id()));
    let f = host::create_private_object(&tmp)?;
    // All of it in memory now (it is pinned, as SpaceJMP's segments are).
    if let Err(e) = sys::fallocate(&f, len) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok((f, tmp))
}

/// Collapse a filled copy into 2 MiB folios where the kernel allows (a refusal leaves
/// 4 KiB pages), then name it (`RENAME_NOREPLACE`: a copy built meanwhile by another
/// request wins, and this one goes).
pub(crate) fn finish_copy(
    f: &File,
    tmp: &std::path::Path,
    path: &std::path::Path,
    len: u64,
) -> io::Result<()> {
    const HUGE: u64 = 2 << 20;
    let whole = len / HUGE * HUGE;
    if whole > 0 {
        if let Ok(m) = cairn_media::Mapping::new(f, 0, whole as usize, true, false) {
            let mut at = 0;
            while at < whole && m.collapse(at as usize, HUGE as usize).is_ok() {
                at += HUGE;
            }
        }
    }
    match sys::renameat2(tmp, path, libc::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(tmp);
            if e.kind() == io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}
