//! Open files: opening an inode (permission checks, truncation, the open count) and the
//! last close (an unlinked file's `nlink = 0`, unpinning).

use super::{At, CreateOpts, Inner};
use crate::conn::response_error;
use crate::meta::{R, W};
use cairn_area::fs_err;
use cairn_format::inode::Kind;
use cairn_proto::{Request, Response};
use std::io;
use std::sync::atomic::Ordering;

impl Inner {
    /// Open (and maybe create) a file; returns its inode and generation. Checks access for `read` /
    /// `write`; `trunc` truncates an existing file to 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_inode(
        &self,
        p: At<'_>,
        read: bool,
        write: bool,
        create: bool,
        create_new: bool,
        trunc: bool,
        mode: u32,
    ) -> io::Result<(u64, u64)> {
        let op = format!("open {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, !create_new, &op)?;
            let (ino, gen) = match (w.found, &w.name) {
                (Some((ino, kind)), _) => {
                    if create_new {
                        return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
                    }
                    // `O_TRUNC` asks for write access, even with `O_RDONLY` (Linux).
                    if kind == Kind::Dir && (write || trunc) {
                        return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
                    }
                    let (gen, a) = self.attrs(st, ino)?;
                    let want = if read { R } else { 0 } | if write { W } else { 0 };
                    if !self.cred().may(&a, want) {
                        return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
                    }
                    if !kind.has_data() && kind != Kind::Dir {
                        return Err(fs_err(
                            libc::ENXIO,
                            format!("{op}: a FIFO, socket or device node (Fs::open_special)"),
                        ));
                    }
                    if trunc && kind == Kind::File && a.size > 0 {
                        self.set_len(st, ino, 0)?;
                    }
                    (ino, gen)
                }
                (None, Some(name)) => {
                    if !create {
                        return Err(fs_err(
                            libc::ENOENT,
                            format!("{op}: no such file or directory"),
                        ));
                    }
                    if w.trailing_slash {
                        return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
                    }
                    let ino = self.create_in(
                        st,
                        w.parent,
                        name,
                        CreateOpts {
                            kind: Kind::File,
                            perm: mode & !self.umask.load(Ordering::Relaxed),
                            rdev: 0,
                        },
                        None,
                        &op,
                    )?;
                    (ino, self.attrs_held(st, ino)?.0)
                }
                (None, None) => unreachable!("a missing entry has a name"),
            };
            st.handles.opened(ino);
            Ok((ino, gen))
        })
    }

    /// A `File` handle of `ino` was closed.
    pub(crate) fn close(&self, ino: u64) {
        let _ = self.run(|st| {
            let Some(last) = st.handles.closing(ino) else {
                return Ok(());
            };
            if last.pinned {
                // Unlinked while open (here or by another process), or unnamed: the
                // daemon frees it once nobody has it open (after digesting our records
                // about it).
                let req = Request::Unpin {
                    ino,
                    tail_lsn: st.log.tail(),
                };
                match self.request(st, &req) {
                    Ok(Response::Ok) => {}
                    Ok(r) => return Err(response_error("unpin", r)),
                    Err(e) => return Err(e),
                }
                st.handles.unpinned(ino);
            }
            st.handles.closed(ino);
            Ok(())
        });
    }
}
