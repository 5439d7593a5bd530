//! Path resolution: `At` (a path and the directory it starts from) walked component by
//! component, with permission checks, symlinks and leases on the directories it reads.

use super::{name_str, Inner, State, MAX_SYMLINKS};
use crate::meta::X;
use crate::path::{self, Comp};
use cairn_area::fs_err;
use cairn_format::inode::Kind;
use cairn_format::ROOT_INO;
use std::io;
use std::path::Path;

/// A path and the directory a relative path starts from (the `*at` calls): absolute
/// paths start at the root whatever `dir` is. An empty path names `dir` itself, which
/// may then be any inode (as `AT_EMPTY_PATH`): [`At::inode`].
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub dir: u64,
    pub path: &'a Path,
}

impl<'a> At<'a> {
    /// `path` from the root (relative paths too).
    pub fn root(path: &'a Path) -> At<'a> {
        At {
            dir: ROOT_INO,
            path,
        }
    }

    /// Inode `ino` itself (an empty path from it), for the calls that act on an
    /// existing inode: metadata, permissions, owner, times, `read_link`, opening it,
    /// the source of a hard link. Calls that create or remove a name refuse it
    /// (`ENOENT`, as an empty path does).
    pub fn inode(ino: u64) -> At<'static> {
        At {
            dir: ino,
            path: Path::new(""),
        }
    }

    /// Whether this names an inode itself (an empty path), not a name in a directory.
    pub fn is_inode(&self) -> bool {
        self.path.as_os_str().is_empty()
    }

    /// Whether the last component is `..` (trailing slashes aside).
    pub(super) fn ends_in_dotdot(&self) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let b = self.path.as_os_str().as_bytes();
        let end = b.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
        let b = &b[..end];
        b == b".." || b.ends_with(b"/..")
    }

    /// `ENOENT` for [`At::inode`] (the calls that create or remove a name).
    pub(super) fn named(&self, op: &str) -> io::Result<()> {
        if self.is_inode() {
            return Err(fs_err(libc::ENOENT, format!("{op}: empty path")));
        }
        Ok(())
    }

    /// For messages.
    pub fn display(&self) -> std::path::Display<'a> {
        self.path.display()
    }
}

/// The result of resolving a path.
pub(crate) struct Walk {
    /// Directory holding the last component.
    pub parent: u64,
    /// The last component's name (`None` for `/`, `.` or `..`).
    pub name: Option<Vec<u8>>,
    /// What the name refers to; `None`: it does not exist (the parent does).
    pub found: Option<(u64, Kind)>,
    /// The path ended with `/`.
    pub trailing_slash: bool,
}

impl Inner {
    /// Where the store's root appears in the processes' namespace, if set
    /// ([`crate::Fs::set_link_root`]).
    fn link_root(&self) -> Option<path::LinkRoot> {
        self.link_root
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Resolve `p` from the root. `follow_last`: follow a symlink in the last component
    /// (a trailing `/` always does). With a link root set, an absolute symbolic link to a
    /// path outside the store, or `..` at its root, ends the walk with
    /// [`cairn_area::error::elsewhere`]: the host path to go on with. One loop (about 115 lines) over the components: each
    /// step shares its state (the directory, the components left, the symlinks followed)
    /// and checks search permission and takes the directory's lease as it goes.
    pub(crate) fn walk(
        &self,
        st: &State,
        p: At<'_>,
        follow_last: bool,
        op: &str,
    ) -> io::Result<Walk> {
        if p.is_inode() {
            if !self.area.layout().ino_valid(p.dir) {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: inode number {} out of range", p.dir),
                ));
            }
            let (_, a) = self.attrs(st, p.dir)?;
            return Ok(Walk {
                parent: p.dir,
                name: None,
                found: Some((p.dir, a.kind)),
                trailing_slash: false,
            });
        }
        let parsed = path::parse(p.path, op)?;
        let trailing_slash = parsed.trailing_slash;
        let mut stack: Vec<Comp> = parsed.comps;
        stack.reverse();
        let mut cur = if parsed.absolute { ROOT_INO } else { p.dir };
        let mut parent = cur;
        let mut name: Option<Vec<u8>> = None;
        let mut kind = Kind::Dir;
        let mut links = 0u32;
        let cred = self.cred();
        while let Some(c) = stack.pop() {
            let is_last = stack.is_empty();
            // `cur` must be a searchable directory.
            let (_, da) = self.attrs(st, cur)?;
            if da.kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            if !cred.may(&da, X) {
                return Err(fs_err(
                    libc::EACCES,
                    format!("{op}: search permission denied"),
                ));
            }
            match c {
                Comp::Cur => {
                    parent = cur;
                    name = None;
                    kind = Kind::Dir;
                }
                Comp::Parent => {
                    if cur == ROOT_INO {
                        if let Some(r) = self.link_root() {
                            let host =
                                path::host_path(&r.parent(), stack.iter().rev(), trailing_slash);
                            return Err(cairn_area::error::elsewhere(host, op));
                        }
                    }
                    let up = if cur == ROOT_INO || da.parent == 0 {
                        ROOT_INO
                    } else {
                        da.parent
                    };
                    parent = up;
                    cur = up;
                    name = None;
                    kind = Kind::Dir;
                }
                Comp::Name(n) => match self.lookup(st, cur, &n)? {
                    None => {
                        if is_last {
                            return Ok(Walk {
                                parent: cur,
                                name: Some(n),
                                found: None,
                                trailing_slash,
                            });
                        }
                        return Err(fs_err(
                            libc::ENOENT,
                            format!("{op}: no such file or directory ({})", name_str(&n)),
                        ));
                    }
                    Some((ino, k)) => {
                        if k == Kind::Symlink && (!is_last || follow_last || trailing_slash) {
                            links += 1;
                            if links > MAX_SYMLINKS {
                                return Err(fs_err(
                                    libc::ELOOP,
                                    format!("{op}: too many levels of symbolic links"),
                                ));
                            }
                            let target = self.read_symlink(st, ino)?;
                            let t = path::parse_bytes(&target, op)?;
                            let mut comps = t.comps;
                            if t.absolute {
                                cur = ROOT_INO;
                                // Seen under a prefix, an absolute target is the
                                // processes' path: inside the store, or the host's.
                                if let Some(r) = self.link_root() {
                                    comps = r.inside(&comps).ok_or_else(|| {
                                        let host = path::host_path(
                                            &target,
                                            stack.iter().rev(),
                                            trailing_slash,
                                        );
                                        cairn_area::error::elsewhere(host, op)
                                    })?;
                                }
                            }
                            stack.extend(comps.into_iter().rev());
                            if stack.is_empty() {
                                // A target of "/" (or "/."-like): the root itself.
                                parent = ROOT_INO;
                                name = None;
                                kind = Kind::Dir;
                            }
                            continue;
                        }
                        parent = cur;
                        cur = ino;
                        kind = k;
                        name = Some(n);
                    }
                },
            }
        }
        if trailing_slash && kind != Kind::Dir {
            return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
        }
        Ok(Walk {
            parent,
            name,
            found: Some((cur, kind)),
            trailing_slash,
        })
    }

    pub(super) fn need_found(w: &Walk, op: &str) -> io::Result<(u64, Kind)> {
        w.found
            .ok_or_else(|| fs_err(libc::ENOENT, format!("{op}: no such file or directory")))
    }
}
