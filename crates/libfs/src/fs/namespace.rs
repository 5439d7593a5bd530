//! Namespace operations: create, remove, rename and exchange, hard and symbolic links,
//! listing a directory.

use super::resolve::Walk;
use super::{At, FromBytesExt, Inner, Lease, State, Tx};
use crate::meta::{now_ns, R, W, X};
use crate::path::{self, Comp};
use cairn_area::fs_err;
use cairn_format::inode::{Attrs, Kind};
use cairn_format::{LINK_MAX, ROOT_INO};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Options of the file-creating operations.
pub(crate) struct CreateOpts {
    pub kind: Kind,
    pub perm: u32,
    /// Device number (device nodes only).
    pub rdev: u64,
}

impl Inner {
    pub(super) fn check_parent_write(
        &self,
        st: &State,
        parent: u64,
        op: &str,
    ) -> io::Result<(u64, Attrs)> {
        self.need(st, parent, true)?;
        let (gen, pa) = self.attrs(st, parent)?;
        if pa.kind != Kind::Dir {
            return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
        }
        if !self.cred().may(&pa, W | X) {
            return Err(fs_err(
                libc::EACCES,
                format!("{op}: permission denied (no write access to the directory)"),
            ));
        }
        if pa.nlink == 0 {
            return Err(fs_err(libc::ENOENT, format!("{op}: directory was removed")));
        }
        Ok((gen, pa))
    }

    /// Create `name` in `parent` (which the caller resolved; the name does not exist).
    /// Returns the new inode number.
    pub(super) fn create_in(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
        o: CreateOpts,
        symlink_target: Option<&[u8]>,
        op: &str,
    ) -> io::Result<u64> {
        let (pgen, mut pa) = self.check_parent_write(st, parent, op)?;
        let (ino, gen) = self.alloc_ino(st)?;
        // Nobody else can name it before its entry is digested: its write lease is ours
        // (the daemon records it when it digests the creation).
        st.leases.set(ino, Lease::Write);
        let now = now_ns();
        let setgid = pa.perm & 0o2000 != 0;
        let mut perm = o.perm & 0o7777;
        if o.kind == Kind::Dir && setgid {
            perm |= 0o2000;
        }
        let a = Attrs {
            kind: o.kind,
            perm,
            uid: self.cred().uid,
            gid: if setgid { pa.gid } else { self.cred().gid },
            nlink: if o.kind == Kind::Dir { 2 } else { 1 },
            size: symlink_target.map_or(0, |t| t.len() as u64),
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            parent: if o.kind == Kind::Dir { parent } else { 0 },
            rdev: if o.kind.is_device() { o.rdev } else { 0 },
        };
        pa.mtime = now;
        pa.ctime = now;
        if o.kind == Kind::Dir {
            pa.nlink += 1;
        }
        let mut tx = Tx::default();
        tx.inode(ino, gen, a);
        if let Some(t) = symlink_target {
            tx.write = Some((ino, t.to_vec(), t.len() as u64, now));
        }
        tx.dirent(parent, name, ino, o.kind);
        tx.inode(parent, pgen, pa);
        if let Err(e) = self.commit(st, tx) {
            // Not created (a shared-write retry, or a failure): the number stays ours.
            st.drop_lease(ino);
            st.inodes.push(ino);
            return Err(e);
        }
        Ok(ino)
    }

    /// `mkdir(p, mode)`: the directory gets `mode & 0o7777` minus the umask.
    pub(crate) fn create_dir(&self, p: At<'_>, mode: u32) -> io::Result<()> {
        let op = format!("create_dir {}", p.display());
        p.named(&op)?;
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let Some(name) = w.name.filter(|_| w.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            let perm = mode & 0o7777 & !self.umask.load(Ordering::Relaxed);
            self.create_in(
                st,
                w.parent,
                &name,
                CreateOpts {
                    kind: Kind::Dir,
                    perm,
                    rdev: 0,
                },
                None,
                &op,
            )?;
            Ok(())
        })
    }

    pub(crate) fn create_dir_all(&self, p: At<'_>) -> io::Result<()> {
        let op = format!("create_dir_all {}", p.display());
        p.named(&op)?;
        let parsed = path::parse(p.path, &op)?;
        let mut prefix = PathBuf::from(if parsed.absolute { "/" } else { "." });
        for c in parsed.comps {
            match c {
                Comp::Cur => continue,
                Comp::Parent => prefix.push(".."),
                Comp::Name(n) => prefix.push(std::ffi::OsStr::from_bytes_ext(&n)),
            }
            let at = At {
                dir: p.dir,
                path: &prefix,
            };
            match self.create_dir(at, 0o777) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !self.metadata(at)?.is_dir() {
                        return Err(fs_err(
                            libc::EEXIST,
                            format!("{op}: {} exists and is not a directory", prefix.display()),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn read_dir_entries(&self, p: At<'_>) -> io::Result<Vec<(Vec<u8>, u64, Kind)>> {
        let op = format!("read_dir {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, true, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            let (_, a) = self.attrs(st, ino)?;
            if !self.cred().may(&a, R) {
                return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
            }
            self.list(st, ino)
        })
    }

    /// Drop one link of `ino` (post-state into `tx`), deferring `nlink = 0` of a
    /// file that is still open in this process to its last close.
    pub(super) fn unlink_inode(
        &self,
        st: &mut State,
        tx: &mut Tx,
        ino: u64,
        now: i64,
    ) -> io::Result<()> {
        self.need(st, ino, true)?;
        let (gen, mut a) = match tx.get(ino) {
            Some(x) => x,
            None => self.attrs(st, ino)?,
        };
        a.ctime = now;
        if a.kind == Kind::Dir {
            a.nlink = 0;
        } else {
            a.nlink = a.nlink.saturating_sub(1);
            if a.nlink == 0 && st.handles.is_open(ino) && !st.handles.is_pinned(ino) {
                // Open here: the daemon keeps it (unnamed, `nlink = 0`) until our last
                // close or our death, as it does for another process's open files.
                self.pin(st, ino)?;
            }
            if a.nlink == 0 && matches!(a.kind, Kind::Fifo | Kind::Socket) {
                tx.gone.push((a.kind, ino, gen));
            }
        }
        tx.inode(ino, gen, a);
        Ok(())
    }

    pub(super) fn touch_dir(
        &self,
        st: &State,
        tx: &mut Tx,
        dir: u64,
        now: i64,
        dlink: i64,
    ) -> io::Result<()> {
        self.need(st, dir, true)?;
        let (gen, mut a) = match tx.get(dir) {
            Some(x) => x,
            None => self.attrs(st, dir)?,
        };
        a.mtime = now;
        a.ctime = now;
        a.nlink = (a.nlink as i64 + dlink).max(0) as u64;
        tx.inode(dir, gen, a);
        Ok(())
    }

    pub(super) fn check_sticky(
        &self,
        st: &State,
        dir: u64,
        victim: u64,
        op: &str,
    ) -> io::Result<()> {
        let (_, da) = self.attrs(st, dir)?;
        let (_, va) = self.attrs(st, victim)?;
        if !self.cred().sticky_ok(&da, &va) {
            return Err(fs_err(
                libc::EPERM,
                format!("{op}: operation not permitted (sticky directory)"),
            ));
        }
        Ok(())
    }

    pub(crate) fn remove_file(&self, p: At<'_>) -> io::Result<()> {
        let op = format!("remove_file {}", p.display());
        p.named(&op)?;
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind == Kind::Dir {
                return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
            }
            let Some(name) = w.name else {
                return Err(fs_err(libc::ENOENT, format!("{op}: empty path")));
            };
            self.check_parent_write(st, w.parent, &op)?;
            self.check_sticky(st, w.parent, ino, &op)?;
            let now = now_ns();
            let mut tx = Tx::default();
            self.unlink_inode(st, &mut tx, ino, now)?;
            tx.dirent(w.parent, &name, 0, Kind::Free);
            self.touch_dir(st, &mut tx, w.parent, now, 0)?;
            self.commit(st, tx)?;
            Ok(())
        })
    }

    pub(crate) fn remove_dir(&self, p: At<'_>) -> io::Result<()> {
        let op = format!("remove_dir {}", p.display());
        p.named(&op)?;
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            if ino == ROOT_INO {
                return Err(fs_err(libc::EBUSY, format!("{op}: cannot remove the root")));
            }
            let Some(name) = w.name else {
                // Linux: `..` names a directory that holds at least this one.
                if p.ends_in_dotdot() {
                    return Err(fs_err(libc::ENOTEMPTY, format!("{op}: `..` is not empty")));
                }
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: invalid last component"),
                ));
            };
            self.check_parent_write(st, w.parent, &op)?;
            self.check_sticky(st, w.parent, ino, &op)?;
            if !self.dir_is_empty(st, ino)? {
                return Err(fs_err(
                    libc::ENOTEMPTY,
                    format!("{op}: directory not empty"),
                ));
            }
            let now = now_ns();
            let mut tx = Tx::default();
            self.unlink_inode(st, &mut tx, ino, now)?;
            tx.dirent(w.parent, &name, 0, Kind::Free);
            self.touch_dir(st, &mut tx, w.parent, now, -1)?;
            self.commit(st, tx)?;
            Ok(())
        })
    }

    pub(crate) fn remove_dir_all(&self, p: At<'_>) -> io::Result<()> {
        let m = self.symlink_metadata(p)?;
        if !m.is_dir() {
            if m.is_symlink() {
                return self.remove_file(p);
            }
            return Err(fs_err(
                libc::ENOTDIR,
                format!("remove_dir_all {}: not a directory", p.display()),
            ));
        }
        for (name, _, kind) in self.read_dir_entries(p)? {
            let child = p.path.join(std::ffi::OsStr::from_bytes_ext(&name));
            let child = At {
                dir: p.dir,
                path: &child,
            };
            if kind == Kind::Dir {
                self.remove_dir_all(child)?;
            } else {
                self.remove_file(child)?;
            }
        }
        self.remove_dir(p)
    }

    /// Whether `anc` is `dir` or one of its ancestors.
    pub(super) fn is_ancestor(&self, st: &State, anc: u64, mut dir: u64) -> io::Result<bool> {
        for _ in 0..100_000 {
            if dir == anc {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            let (_, a) = self.attrs(st, dir)?;
            dir = if a.parent == 0 { ROOT_INO } else { a.parent };
        }
        Err(fs_err(libc::ELOOP, "directory parent chain too long"))
    }

    /// `renameat2`: `noreplace` fails with `EEXIST` if `to` exists; `exchange` swaps two
    /// existing entries atomically (the two are exclusive).
    pub(crate) fn rename(
        &self,
        from: At<'_>,
        to: At<'_>,
        noreplace: bool,
        exchange: bool,
    ) -> io::Result<()> {
        let op = format!("rename {} -> {}", from.display(), to.display());
        from.named(&op)?;
        to.named(&op)?;
        if noreplace && exchange {
            return Err(fs_err(
                libc::EINVAL,
                format!("{op}: RENAME_NOREPLACE with RENAME_EXCHANGE"),
            ));
        }
        if exchange {
            return self.exchange(from, to, &op);
        }
        self.run(|st| {
            // The order of checks follows Linux (do_renameat2, vfs_rename), so that the same
            // call fails with the same errno: both parents, the source, the subtree traps,
            // then permissions and types.
            let wf = self.walk(st, from, false, &op)?;
            let wt = self.walk(st, to, false, &op)?;
            // `/`, `.` or `..` as either last component: EBUSY (EEXIST for a destination
            // with RENAME_NOREPLACE), as Linux's do_renameat2.
            let (Some(fname), Some(tname)) = (wf.name.clone(), wt.name.clone()) else {
                let errno = if wf.name.is_some() && noreplace {
                    libc::EEXIST
                } else {
                    libc::EBUSY
                };
                return Err(fs_err(
                    errno,
                    format!("{op}: `/`, `.` or `..` cannot be renamed"),
                ));
            };
            let (src, skind) = Self::need_found(&wf, &op)?;
            if self.check_rename(st, &wf, &wt, (src, skind), noreplace, &op)? {
                return Ok(()); // Same file: nothing to do (POSIX).
            }
            // Every write lease the transaction needs, before anything changes.
            self.need(st, src, true)?;
            if let Some((t, _)) = wt.found {
                self.need(st, t, true)?;
            }
            let now = now_ns();
            let mut tx = Tx::default();
            let moved_dir = skind == Kind::Dir && wf.parent != wt.parent;
            self.touch_dir(st, &mut tx, wf.parent, now, if moved_dir { -1 } else { 0 })?;
            self.touch_dir(st, &mut tx, wt.parent, now, if moved_dir { 1 } else { 0 })?;
            if let Some((t, tkind)) = wt.found {
                self.unlink_inode(st, &mut tx, t, now)?;
                if tkind == Kind::Dir {
                    self.touch_dir(st, &mut tx, wt.parent, now, -1)?;
                }
            }
            let (sgen, mut sa) = match tx.get(src) {
                Some(x) => x,
                None => self.attrs(st, src)?,
            };
            sa.ctime = now;
            if skind == Kind::Dir {
                sa.parent = wt.parent;
            }
            tx.inode(src, sgen, sa);
            tx.dirent(wf.parent, &fname, 0, Kind::Free);
            tx.dirent(wt.parent, &tname, src, skind);
            self.commit(st, tx)?;
            Ok(())
        })
    }

    /// The checks of a rename of `src` (of kind `skind`) from `wf` to `wt`, in Linux's
    /// order so that a call fails with the same errno: an existing destination under
    /// `RENAME_NOREPLACE`, trailing slashes, the subtree traps, same file (`Ok(true)`:
    /// nothing to do), permissions, sticky directories, types, emptiness.
    pub(super) fn check_rename(
        &self,
        st: &mut State,
        wf: &Walk,
        wt: &Walk,
        (src, skind): (u64, Kind),
        noreplace: bool,
        op: &str,
    ) -> io::Result<bool> {
        if noreplace && wt.found.is_some() {
            return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
        }
        if skind != Kind::Dir && (wt.trailing_slash || wf.trailing_slash) {
            return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
        }
        if skind == Kind::Dir && self.is_ancestor(st, src, wt.parent)? {
            return Err(fs_err(
                libc::EINVAL,
                format!("{op}: cannot move a directory into itself"),
            ));
        }
        if let Some((t, Kind::Dir)) = wt.found {
            if t != src && self.is_ancestor(st, t, wf.parent)? {
                return Err(fs_err(
                    libc::ENOTEMPTY,
                    format!("{op}: the destination is an ancestor of the source"),
                ));
            }
        }
        if wt.found.is_some_and(|(t, _)| t == src) {
            return Ok(true);
        }
        self.check_parent_write(st, wf.parent, op)?;
        self.check_parent_write(st, wt.parent, op)?;
        self.check_sticky(st, wf.parent, src, op)?;
        if let Some((t, tkind)) = wt.found {
            self.check_sticky(st, wt.parent, t, op)?;
            if skind == Kind::Dir {
                if tkind != Kind::Dir {
                    return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
                }
                if !self.dir_is_empty(st, t)? {
                    return Err(fs_err(
                        libc::ENOTEMPTY,
                        format!("{op}: directory not empty"),
                    ));
                }
            } else if tkind == Kind::Dir {
                return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
            }
        }
        if skind == Kind::Dir && wf.parent != wt.parent {
            let (_, sa) = self.attrs(st, src)?;
            if !self.cred().may(&sa, W) {
                return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
            }
        }
        Ok(false)
    }

    /// `RENAME_EXCHANGE`: swap the entries `a` and `b` (both must exist; they may be of
    /// different types) in one transaction.
    pub(super) fn exchange(&self, a: At<'_>, b: At<'_>, op: &str) -> io::Result<()> {
        self.run(|st| {
            let wa = self.walk(st, a, false, op)?;
            let wb = self.walk(st, b, false, op)?;
            let (Some(aname), Some(bname)) = (wa.name.clone(), wb.name.clone()) else {
                return Err(fs_err(libc::EINVAL, format!("{op}: invalid entry")));
            };
            let (ai, ak) = Self::need_found(&wa, op)?;
            let (bi, bk) = Self::need_found(&wb, op)?;
            // A directory cannot go below itself.
            if (ak == Kind::Dir && self.is_ancestor(st, ai, wb.parent)?)
                || (bk == Kind::Dir && self.is_ancestor(st, bi, wa.parent)?)
            {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: cannot move a directory into itself"),
                ));
            }
            if ai == bi {
                return Ok(());
            }
            self.check_parent_write(st, wa.parent, op)?;
            self.check_parent_write(st, wb.parent, op)?;
            self.check_sticky(st, wa.parent, ai, op)?;
            self.check_sticky(st, wb.parent, bi, op)?;
            // A directory moving to another parent rewrites its `..`.
            if wa.parent != wb.parent {
                for (i, k) in [(ai, ak), (bi, bk)] {
                    if k == Kind::Dir && !self.cred().may(&self.attrs(st, i)?.1, W) {
                        return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
                    }
                }
            }
            self.need(st, ai, true)?;
            self.need(st, bi, true)?;
            let now = now_ns();
            let mut tx = Tx::default();
            let dirs = |k: Kind| (k == Kind::Dir) as i64;
            let moved = wa.parent != wb.parent;
            let (da, db) = if moved {
                (dirs(bk) - dirs(ak), dirs(ak) - dirs(bk))
            } else {
                (0, 0)
            };
            self.touch_dir(st, &mut tx, wa.parent, now, da)?;
            self.touch_dir(st, &mut tx, wb.parent, now, db)?;
            for (i, k, parent) in [(ai, ak, wb.parent), (bi, bk, wa.parent)] {
                let (gen, mut attrs) = match tx.get(i) {
                    Some(x) => x,
                    None => self.attrs(st, i)?,
                };
                attrs.ctime = now;
                if k == Kind::Dir {
                    attrs.parent = parent;
                }
                tx.inode(i, gen, attrs);
            }
            tx.dirent(wa.parent, &aname, bi, bk);
            tx.dirent(wb.parent, &bname, ai, ak);
            self.commit(st, tx)?;
            Ok(())
        })
    }

    pub(crate) fn hard_link(&self, original: At<'_>, link: At<'_>) -> io::Result<()> {
        let op = format!("hard_link {} -> {}", link.display(), original.display());
        link.named(&op)?;
        self.run(|st| {
            let wo = self.walk(st, original, false, &op)?;
            let (ino, kind) = Self::need_found(&wo, &op)?;
            // Linux order (linkat): the new name must not exist, then permission, then the
            // directory check.
            let wl = self.walk(st, link, false, &op)?;
            let Some(name) = wl.name.filter(|_| wl.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            if wl.trailing_slash {
                return Err(fs_err(libc::ENOENT, format!("{op}: trailing slash")));
            }
            self.check_parent_write(st, wl.parent, &op)?;
            if kind == Kind::Dir {
                return Err(fs_err(
                    libc::EPERM,
                    format!("{op}: hard links to directories are not allowed"),
                ));
            }
            let (gen, mut a) = self.attrs(st, ino)?;
            // An unlinked file gets no name again, except an unnamed file made linkable
            // (`O_TMPFILE` without `O_EXCL`), as on Linux.
            if a.nlink == 0 && !st.handles.is_linkable_unnamed(ino) {
                return Err(fs_err(libc::ENOENT, format!("{op}: file was removed")));
            }
            if a.nlink >= LINK_MAX {
                return Err(fs_err(
                    libc::EMLINK,
                    format!("{op}: the file has {} links already", a.nlink),
                ));
            }
            let now = now_ns();
            a.nlink += 1;
            a.ctime = now;
            let mut tx = Tx::default();
            tx.inode(ino, gen, a);
            tx.dirent(wl.parent, &name, ino, kind);
            self.touch_dir(st, &mut tx, wl.parent, now, 0)?;
            self.commit(st, tx)?;
            st.handles.named(ino);
            Ok(())
        })
    }

    pub(crate) fn symlink(&self, target: &Path, link: At<'_>) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let op = format!("symlink {} -> {}", link.display(), target.display());
        link.named(&op)?;
        let t = target.as_os_str().as_bytes();
        if t.is_empty() {
            return Err(fs_err(libc::ENOENT, format!("{op}: empty target")));
        }
        if t.len() > path::PATH_MAX {
            return Err(fs_err(libc::ENAMETOOLONG, format!("{op}: target too long")));
        }
        if t.contains(&0) {
            return Err(fs_err(libc::EINVAL, format!("{op}: target contains NUL")));
        }
        self.run(|st| {
            let wl = self.walk(st, link, false, &op)?;
            let Some(name) = wl.name.filter(|_| wl.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            self.create_in(
                st,
                wl.parent,
                &name,
                CreateOpts {
                    kind: Kind::Symlink,
                    perm: 0o777,
                    rdev: 0,
                },
                Some(t),
                &op,
            )?;
            Ok(())
        })
    }

    pub(crate) fn read_link(&self, p: At<'_>) -> io::Result<PathBuf> {
        use std::os::unix::ffi::OsStringExt;
        let op = format!("read_link {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind != Kind::Symlink {
                return Err(fs_err(libc::EINVAL, format!("{op}: not a symbolic link")));
            }
            let t = self.read_symlink(st, ino)?;
            Ok(PathBuf::from(std::ffi::OsString::from_vec(t)))
        })
    }
}
