//! Unnamed files (`O_TMPFILE`): a regular file created without a name, which lives while
//! it is open and can be given a name later (`linkat` with `AT_EMPTY_PATH`,
//! [`crate::File::link`]) unless it was made unlinkable (`O_EXCL`).
//!
//! The client pins the new inode number with the daemon (`Request::Pin`) and logs its
//! `INODE_SET` with `nlink = 0` and no entry; the digest keeps an unlinked file its
//! creator pins, and checks its creation like any other. The last close sends `Unpin`,
//! and the daemon frees the inode unless it was linked meanwhile; if the client dies
//! first, the daemon drops its pins and frees it then. ARCHITECTURE.md, "Unnamed files".

use super::{At, Inner, Lease, Tx};
use crate::meta::now_ns;
use cairn_area::fs_err;
use cairn_format::inode::{Attrs, Kind};
use cairn_proto::Request;
use std::io;
use std::sync::atomic::Ordering;

impl Inner {
    /// Create an unnamed regular file in directory `dir` (write and search permission
    /// on it needed, as for a creation) with `perm` minus the umask; it is open once
    /// (the caller makes the `File`). `linkable`: it may be given a name later. Returns its
    /// inode and generation.
    pub(crate) fn create_tmpfile(
        &self,
        dir: At<'_>,
        perm: u32,
        linkable: bool,
    ) -> io::Result<(u64, u64)> {
        let op = format!("open {} (O_TMPFILE)", dir.display());
        self.run(|st| {
            let w = self.walk(st, dir, true, &op)?;
            let (d, kind) = w
                .found
                .ok_or_else(|| fs_err(libc::ENOENT, format!("{op}: no such directory")))?;
            if kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            let (_, pa) = self.check_parent_write(st, d, &op)?;
            let (ino, gen) = self.alloc_ino(st)?;
            st.leases.set(ino, Lease::Write);
            let undo = |st: &mut super::State| {
                st.drop_lease(ino);
                st.inodes.push(ino);
            };
            if let Err(e) = self.pin(st, ino) {
                undo(st);
                return Err(e);
            }
            let now = now_ns();
            // A setgid directory's group, when the caller may use it (the daemon checks
            // an unnamed file's group without a directory to inherit it from).
            let gid = if pa.perm & 0o2000 != 0 && self.cred().in_group(pa.gid) {
                pa.gid
            } else {
                self.cred().gid
            };
            let a = Attrs {
                kind: Kind::File,
                perm: perm & 0o7777 & !self.umask.load(Ordering::Relaxed),
                uid: self.cred().uid,
                gid,
                nlink: 0,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                ..Attrs::default()
            };
            let mut tx = Tx::default();
            tx.inode(ino, gen, a);
            if let Err(e) = self.commit(st, tx) {
                st.handles.unpinned(ino);
                let _ = self.request(
                    st,
                    &Request::Unpin {
                        ino,
                        tail_lsn: st.log.tail(),
                    },
                );
                undo(st);
                return Err(e);
            }
            st.handles.opened_unnamed(ino, linkable);
            Ok((ino, gen))
        })
    }
}
