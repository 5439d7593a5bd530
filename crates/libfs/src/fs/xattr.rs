//! Extended attributes: each call goes to the daemon, which keeps them in its journal
//! (ARCHITECTURE.md, "Extended attributes").

use super::{At, Inner};
use cairn_area::fs_err;
use cairn_format::inode::Kind;
use cairn_proto::{Request, Response, XattrOp};
use std::io;

impl Inner {
    /// An extended-attribute call on the file `p` names (its symlink itself unless
    /// `follow`): answered by the daemon, which keeps attributes (ARCHITECTURE.md,
    /// "Extended attributes"), once this client holds a lease on the inode and its own
    /// records are digested, so the daemon checks the caller against current attributes.
    pub(crate) fn xattr(&self, p: At<'_>, follow: bool, op: XattrOp) -> io::Result<Response> {
        let what = match &op {
            XattrOp::Get { .. } => "getxattr",
            XattrOp::List => "listxattr",
            XattrOp::Set { .. } => "setxattr",
            XattrOp::Remove { .. } => "removexattr",
        };
        let opname = format!("{what} {}", p.display());
        // The name is checked as Linux does: its length before the path is looked up,
        // its namespace after (a call on an inode looks nothing up).
        let name = match &op {
            XattrOp::Get { name } | XattrOp::Set { name, .. } | XattrOp::Remove { name } => {
                Some(name.as_slice())
            }
            XattrOp::List => None,
        };
        let bad_name = |n: i32| {
            let shown = String::from_utf8_lossy(name.unwrap_or_default()).into_owned();
            let why = match n {
                libc::ERANGE => "the name is empty or longer than 255 bytes",
                libc::EINVAL => "the name has no part after its namespace",
                _ => "Cairn stores user., trusted. and security. attributes only",
            };
            fs_err(n, format!("{opname} {shown}: {why}"))
        };
        let check_ns = || match name.map(cairn_format::xattr::namespace) {
            Some(Err(n)) => Err(bad_name(n)),
            _ => Ok(()),
        };
        if name.is_some_and(|n| n.is_empty() || n.len() > cairn_format::xattr::NAME_MAX) {
            return Err(bad_name(libc::ERANGE));
        }
        if p.is_inode() {
            check_ns()?;
        }
        self.run(|st| {
            let w = self.walk(st, p, follow, &opname)?;
            let (ino, _) = Self::need_found(&w, &opname)?;
            check_ns()?;
            let (gen, attrs) = self.attrs(st, ino)?;
            let reads = matches!(op, XattrOp::Get { .. } | XattrOp::List);
            if reads {
                // Reads (the kernel asks for `security.capability` before every write
                // through the mount) do not digest, and most never reach the daemon: an
                // inode not digested yet has no attributes (setting one digests first),
                // nor has one the daemon has not flagged. For a flagged one the daemon
                // checks with the published attributes, which must then be ours.
                let shared = self.area.read_inode(ino)?;
                if shared.generation != gen || shared.attrs.kind == Kind::Free || !shared.xattrs {
                    return match (&op, name.map(cairn_format::xattr::namespace)) {
                        (XattrOp::Get { .. }, Some(Ok(ns))) => {
                            let n = cairn_format::xattr::check(
                                &self.cred(),
                                &attrs,
                                ns,
                                cairn_format::xattr::Access::Get,
                            )
                            .err()
                            .unwrap_or(libc::ENODATA);
                            let why = match n {
                                libc::ENODATA => "no such attribute",
                                _ => "permission denied",
                            };
                            Err(fs_err(n, format!("{opname}: {why}")))
                        }
                        _ => Ok(Response::XattrNames(Vec::new())),
                    };
                }
                let a = &shared.attrs;
                if (a.perm, a.uid, a.gid) != (attrs.perm, attrs.uid, attrs.gid) {
                    self.digest_wait(st)?;
                }
            } else if !st.log.digested() {
                self.digest_wait(st)?;
            }
            let r = self.request(
                st,
                &Request::Xattr {
                    ino,
                    op: op.clone(),
                },
            )?;
            match r {
                Response::Error { errno, message } => {
                    Err(fs_err(errno, format!("{}: {message}", p.display())))
                }
                r => Ok(r),
            }
        })
    }
}
