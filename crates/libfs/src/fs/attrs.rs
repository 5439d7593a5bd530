//! Attributes: metadata, permissions, owners, times, the setuid/setgid bits a write
//! clears, size (`set_len`) and punched holes.

use super::{At, Inner, State, Tx};
use crate::meta::{now_ns, Cred, Metadata};
use cairn_area::fs_err;
use cairn_format::inode::{Attrs, Kind};
use cairn_format::MAX_FILE_SIZE;
use cairn_media::sys;
use std::io;

impl Inner {
    pub(crate) fn metadata(&self, p: At<'_>) -> io::Result<Metadata> {
        let op = format!("metadata {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, true, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.metadata_of(st, ino)
        })
    }

    pub(crate) fn symlink_metadata(&self, p: At<'_>) -> io::Result<Metadata> {
        let op = format!("symlink_metadata {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.metadata_of(st, ino)
        })
    }

    pub(crate) fn set_permissions(&self, p: At<'_>, mode: u32) -> io::Result<()> {
        let op = format!("set_permissions {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, true, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.chattr(st, ino, &op, |cred, a| {
                if !cred.owns(a) {
                    return Err(fs_err(libc::EPERM, format!("{op}: not the owner")));
                }
                a.perm = mode & 0o7777;
                if !cred.is_root() && !cred.in_group(a.gid) {
                    a.perm &= !0o2000;
                }
                Ok(())
            })
        })
    }

    /// `chown`: a new owner needs root; a new group needs root, or the owner and
    /// membership of the group. A regular file loses its setuid bit, and its setgid bit
    /// if group-executable (as on Linux); `None` keeps a field.
    pub(crate) fn set_owner(
        &self,
        p: At<'_>,
        follow: bool,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        let op = format!("set_owner {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, follow, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.chattr(st, ino, &op, |cred, a| {
                let uid_change = uid.is_some_and(|u| u != a.uid);
                let gid_change = gid.is_some_and(|g| g != a.gid);
                if uid_change && !cred.is_root() {
                    return Err(fs_err(
                        libc::EPERM,
                        format!("{op}: only root changes the owner"),
                    ));
                }
                if gid_change
                    && !cred.is_root()
                    && !(cred.owns(a) && gid.is_some_and(|g| cred.in_group(g)))
                {
                    return Err(fs_err(
                        libc::EPERM,
                        format!("{op}: not the owner, or not a member of the group"),
                    ));
                }
                if (uid.is_some() || gid.is_some()) && a.kind == Kind::File {
                    a.perm &= !0o4000;
                    if a.perm & 0o010 != 0 {
                        a.perm &= !0o2000;
                    }
                }
                if let Some(u) = uid {
                    a.uid = u;
                }
                if let Some(g) = gid {
                    a.gid = g;
                }
                Ok(())
            })
        })
    }

    /// Set the access and/or modification time. `touch`: both to now (`utimensat` with
    /// NULL times), which the owner or anyone with write permission may do (else
    /// `EACCES`); other times are the owner's (else `EPERM`), as Linux.
    pub(crate) fn set_times(
        &self,
        p: At<'_>,
        follow: bool,
        atime: Option<i64>,
        mtime: Option<i64>,
        touch: bool,
    ) -> io::Result<()> {
        let op = format!("set_times {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, follow, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            if atime.is_none() && mtime.is_none() {
                return Ok(());
            }
            self.chattr(st, ino, &op, |cred, a| {
                if touch && !cred.owns_or_writes(a) {
                    return Err(fs_err(
                        libc::EACCES,
                        format!("{op}: neither the owner nor a writer"),
                    ));
                }
                if !touch && !cred.owns(a) {
                    return Err(fs_err(libc::EPERM, format!("{op}: not the owner")));
                }
                if let Some(t) = atime {
                    a.atime = t;
                }
                if let Some(t) = mtime {
                    a.mtime = t;
                }
                Ok(())
            })
        })
    }

    /// Change attributes of `ino` (ctime = now) in one transaction.
    pub(super) fn chattr(
        &self,
        st: &mut State,
        ino: u64,
        _op: &str,
        f: impl FnOnce(&Cred, &mut Attrs) -> io::Result<()>,
    ) -> io::Result<()> {
        self.need(st, ino, true)?;
        let (gen, mut a) = self.attrs(st, ino)?;
        f(&self.cred(), &mut a)?;
        a.ctime = now_ns();
        let mut tx = Tx::default();
        tx.inode(ino, gen, a);
        self.commit(st, tx)?;
        Ok(())
    }

    /// Clear the setuid and setgid bits a write or truncate by this client removes
    /// (`Cred::privs_to_kill`), in a transaction of its own; whether it did.
    pub(super) fn kill_privs(&self, st: &mut State, ino: u64, a: &Attrs) -> io::Result<bool> {
        // Without a set-user-ID or set-group-ID bit there is nothing to kill (and no need
        // to read the credentials, a shared lock, on every write).
        if a.perm & cairn_format::perm::SET_ID_BITS == 0 {
            return Ok(false);
        }
        let kill = self.cred().privs_to_kill(a);
        if kill == 0 {
            return Ok(false);
        }
        self.chattr(st, ino, "write", |_, a| {
            a.perm &= !kill;
            Ok(())
        })?;
        Ok(true)
    }

    /// Truncate or extend `ino` to `size` (one transaction).
    pub(crate) fn set_len(&self, st: &mut State, ino: u64, size: u64) -> io::Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(fs_err(libc::EFBIG, "set_len: beyond the largest file size"));
        }
        self.need(st, ino, true)?;
        let (_, a) = self.attrs(st, ino)?;
        if a.kind != Kind::File {
            return Err(fs_err(libc::EINVAL, "set_len: not a regular file"));
        }
        self.kill_privs(st, ino, &a)?;
        let (gen, mut a) = self.attrs(st, ino)?;
        let now = now_ns();
        let from = a.size.min(size);
        a.size = size;
        a.mtime = now;
        a.ctime = now;
        let mut tx = Tx::default();
        tx.inode(ino, gen, a);
        tx.zero.push((ino, from, MAX_FILE_SIZE));
        self.commit(st, tx)?;
        if let Some(o) = st.objs.get(&ino) {
            // Mappings past the new end fault (`SIGBUS`), as on Linux.
            o.set_len(size)
                .map_err(|e| fs_err(libc::EIO, format!("truncate the map object: {e}")))?;
        }
        Ok(())
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` (`zero_size: None`) or `ZERO_RANGE`
    /// (`Some(extend)`: with `extend`, a range past the end grows the file): bytes
    /// `[off, off + len)` read as zeros from now on, and the digest frees the whole
    /// blocks among them. The size never shrinks.
    pub(crate) fn punch(
        &self,
        st: &mut State,
        ino: u64,
        off: u64,
        len: u64,
        zero_size: Option<bool>,
    ) -> io::Result<()> {
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| fs_err(libc::EFBIG, "fallocate: beyond the largest file size"))?;
        if len == 0 {
            return Err(fs_err(libc::EINVAL, "fallocate: empty range"));
        }
        self.need(st, ino, true)?;
        let (gen, mut a) = self.attrs(st, ino)?;
        match a.kind {
            Kind::File => {}
            Kind::Dir => return Err(fs_err(libc::EISDIR, "fallocate: is a directory")),
            _ => return Err(fs_err(libc::ENODEV, "fallocate: not a regular file")),
        }
        let now = now_ns();
        let mut tx = Tx::default();
        let in_file = end.min(a.size);
        if off < in_file {
            tx.punch = Some((ino, off, in_file - off, now));
            tx.zero.push((ino, off, in_file));
        }
        a.mtime = now;
        a.ctime = now;
        if zero_size == Some(true) && end > a.size {
            tx.zero.push((ino, a.size, end));
            a.size = end;
        }
        tx.inode(ino, gen, a);
        self.commit(st, tx)?;
        if let Some(o) = st.objs.get(&ino) {
            // A shared mapping sees the zeros at once.
            let mut r = Ok(());
            if off < in_file {
                r = sys::discard(o, off, in_file - off);
            }
            if r.is_ok() && a.size > in_file {
                r = o.set_len(a.size);
            }
            r.map_err(|e| fs_err(libc::EIO, format!("fallocate: the map object: {e}")))?;
        }
        Ok(())
    }
}
