//! Map objects (ARCHITECTURE.md, "Shared mappings"): the host shared-memory file every
//! shared mapping of a Cairn file maps. The daemon alone creates and removes them (mode
//! 0600, its own user's) and hands a client a descriptor to one only after checking the
//! client's permission on the file with the credentials the kernel reported for it:
//! read-write for the owner or a writer, read-only for a reader. So the kernel, not
//! convention, keeps a client from writing the map object of a file it may not write
//! (a read-only descriptor cannot be mapped writable, and the object cannot be opened
//! by name).
//!
//! The client writes an object's changes back into the file through its own log, under
//! the file's write lease, as it writes any data (`cairn::fs::mapobj`).

use crate::core::Core;
use crate::util::einval;
use cairn_area::{fs_err, host};
use cairn_format::inode::{Inode, Kind};
use cairn_format::perm::R;
use cairn_media::sys;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes copied per step when an object is filled from its file.
const FILL_STEP: usize = 256 << 10;

impl Core {
    fn map_object_path(&self, ino: u64, gen: u64) -> PathBuf {
        host::object_path(&self.sh.area.superblock().uuid, host::MAP_KIND, ino, gen)
    }

    /// Check that `ino`/`gen` is a regular file the client of `slot` holds a lease on
    /// and may use: the inode and whether it may have a read-write descriptor of one of
    /// the file's host objects (`write` asked, and it owns or may write the file); else
    /// read-only if it owns or may read it, else `EACCES`. `what` names the object in
    /// errors.
    pub(crate) fn object_grant(
        &self,
        slot: u32,
        ino: u64,
        gen: u64,
        write: bool,
        what: &str,
    ) -> io::Result<(Inode, bool)> {
        if !self.sh.layout.ino_valid(ino) {
            return Err(einval(format!("{what}: inode number {ino} out of range")));
        }
        if !self.leases.held_by(ino, slot) {
            return Err(einval(format!(
                "{what} of inode {ino}: this client holds no lease on it"
            )));
        }
        let inode = self.sh.inode(ino)?;
        if inode.attrs.kind != Kind::File || inode.generation != gen {
            return Err(fs_err(
                libc::ESTALE,
                format!("{what} of inode {ino}: not that regular file any more"),
            ));
        }
        let cred = crate::perm::slot_cred(&self.sh, slot)?;
        let a = &inode.attrs;
        let writable = write && cred.owns_or_writes(a);
        if !writable && !cred.owns(a) && !cred.may(a, R) {
            return Err(fs_err(
                libc::EACCES,
                format!(
                    "{what} of inode {ino}: uid {} may not read the file (mode {:04o}, uid {}, gid {})",
                    cred.uid, a.perm, a.uid, a.gid
                ),
            ));
        }
        Ok((inode, writable))
    }

    /// A descriptor of the map object of file `ino`/`gen` for the client of `slot`
    /// (`Request::MapObject`), made from the file first if it has none and `create`
    /// (the client holds the write lease). Read-write if `write` and the client owns or
    /// may write the file; else read-only, if it owns or may read it. Returns the
    /// descriptor and whether it is read-write. The client's records were digested.
    pub(crate) fn map_object(
        &mut self,
        slot: u32,
        ino: u64,
        gen: u64,
        write: bool,
        create: bool,
    ) -> io::Result<(File, bool)> {
        let (inode, writable) = self.object_grant(slot, ino, gen, write, "map object")?;
        let path = self.map_object_path(ino, gen);
        let nvm = self.cfg.nvm_path.clone();
        match host::open_daemon_object(&path, &nvm, writable) {
            Ok(f) => return Ok((f, writable)),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(fs_err(
                    libc::ENOENT,
                    format!("map object of inode {ino}: the file has none"),
                ))
            }
            Err(e) => return Err(e),
        }
        if !self.leases.writes(ino, slot) {
            return Err(einval(format!(
                "map object of inode {ino}: making one needs the file's write lease"
            )));
        }
        self.fill_object(&inode, &path)?;
        Ok((host::open_daemon_object(&path, &nvm, writable)?, writable))
    }

    /// Make the map object of `inode` at `path`: filled from the file under a temporary
    /// name, then renamed into place (a crash leaves no half-filled object; `cairn stop`
    /// removes the temporary one of a dead daemon).
    fn fill_object(&self, inode: &Inode, path: &Path) -> io::Result<()> {
        let tmp = PathBuf::from(format!("{}.new-{}", path.display(), std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let f = host::create_private_object(&tmp)?;
        let filled = (|| -> io::Result<()> {
            let size = inode.attrs.size;
            f.set_len(size)?;
            let mut buf = vec![0u8; FILL_STEP];
            let mut pos = 0;
            while pos < size {
                let n = ((size - pos) as usize).min(FILL_STEP);
                let got = self.sh.area.read_file(inode, pos, &mut buf[..n])?;
                buf[got..n].fill(0);
                if buf[..n].iter().any(|&b| b != 0) {
                    f.write_all_at(&buf[..n], pos)?;
                }
                pos += n as u64;
            }
            sys::renameat2(&tmp, path, libc::RENAME_NOREPLACE)
        })();
        if let Err(e) = filled {
            let _ = std::fs::remove_file(&tmp);
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(fs_err(
                    cairn_area::errno_of(&e).max(1),
                    format!("cannot make the map object {}: {e}", path.display()),
                ));
            }
        }
        Ok(())
    }

    /// Remove the map object of `ino`/`gen` if nobody maps it (`Request::MapRemove`):
    /// the client of `slot` holds the write lease and wrote it back. `EBUSY` if a
    /// process still maps it (holds its shared `flock`).
    pub(crate) fn map_remove(&self, slot: u32, ino: u64, gen: u64) -> io::Result<()> {
        if !self.sh.layout.ino_valid(ino) || !self.leases.writes(ino, slot) {
            return Err(einval(format!(
                "map object of inode {ino}: removing it needs the file's write lease"
            )));
        }
        let path = self.map_object_path(ino, gen);
        let f = match host::open_daemon_object(&path, &self.cfg.nvm_path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        match sys::flock_exclusive(&f, true) {
            Ok(()) => std::fs::remove_file(&path),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(fs_err(
                libc::EBUSY,
                format!("map object of inode {ino}: still mapped"),
            )),
            Err(e) => Err(e),
        }
    }
}
