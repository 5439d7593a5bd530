//! Path parsing: store paths are absolute (`/a/b`) or relative to the root (`a/b`);
//! `.` and `..` are kept as components for the resolver (which knows each directory's
//! parent), empty components (`a//b`) are skipped, and a trailing `/` means the path must
//! name a directory.

use cairn_area::fs_err;
use cairn_format::NAME_MAX;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Longest path accepted, in bytes (`PATH_MAX` without the NUL).
pub const PATH_MAX: usize = 4095;

/// One path component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Comp {
    /// `.`
    Cur,
    /// `..`
    Parent,
    /// A name (1..=255 bytes, no `/`, no NUL).
    Name(Vec<u8>),
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Started with `/`. (Paths are resolved from the root either way; this matters for
    /// symlink targets, which are otherwise relative to the symlink's directory.)
    pub absolute: bool,
    pub comps: Vec<Comp>,
    /// Ended with `/` (after at least one component): the result must be a directory.
    pub trailing_slash: bool,
}

/// Parse `path` (bytes). `what` prefixes error messages ("open /a/b").
pub fn parse_bytes(path: &[u8], what: &str) -> io::Result<Parsed> {
    if path.is_empty() {
        return Err(fs_err(libc::ENOENT, format!("{what}: empty path")));
    }
    if path.len() > PATH_MAX {
        return Err(fs_err(
            libc::ENAMETOOLONG,
            format!("{what}: path longer than {PATH_MAX} bytes"),
        ));
    }
    if path.contains(&0) {
        return Err(fs_err(
            libc::EINVAL,
            format!("{what}: path contains a NUL byte"),
        ));
    }
    let mut comps = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" => {}
            b"." => comps.push(Comp::Cur),
            b".." => comps.push(Comp::Parent),
            n if n.len() > NAME_MAX => {
                return Err(fs_err(
                    libc::ENAMETOOLONG,
                    format!("{what}: component longer than {NAME_MAX} bytes"),
                ))
            }
            n => comps.push(Comp::Name(n.to_vec())),
        }
    }
    Ok(Parsed {
        absolute: path[0] == b'/',
        trailing_slash: path.len() > 1 && path[path.len() - 1] == b'/' && !comps.is_empty(),
        comps,
    })
}

/// Where the store's root appears in the processes' namespace (a prefix such as
/// `/cairn`), for the symbolic links and `..` that lead out of the store
/// (`Fs::set_link_root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRoot {
    names: Vec<Vec<u8>>,
}

impl LinkRoot {
    /// `prefix`: absolute, at least one name, no `.` or `..` (else `None`).
    pub fn new(prefix: &[u8]) -> Option<LinkRoot> {
        let p = parse_bytes(prefix, "link root").ok()?;
        let names = p
            .comps
            .into_iter()
            .map(|c| match c {
                Comp::Name(n) => Some(n),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        (p.absolute && !names.is_empty()).then_some(LinkRoot { names })
    }

    /// If the components of an absolute path lie lexically under the root: those after
    /// it, the path inside the store (`.` components are skipped while matching).
    pub fn inside(&self, comps: &[Comp]) -> Option<Vec<Comp>> {
        let mut rest = comps.iter().filter(|c| **c != Comp::Cur);
        for want in &self.names {
            match rest.next() {
                Some(Comp::Name(n)) if n == want => {}
                _ => return None,
            }
        }
        Some(rest.cloned().collect())
    }

    /// The host directory that `..` at the store's root names: the prefix's parent.
    pub fn parent(&self) -> Vec<u8> {
        let mut p = Vec::new();
        for n in &self.names[..self.names.len() - 1] {
            p.push(b'/');
            p.extend_from_slice(n);
        }
        if p.is_empty() {
            p.push(b'/');
        }
        p
    }
}

/// The host path `base` followed by `rest` (in order) and, with `trailing_slash`, a `/`.
pub fn host_path<'a>(
    base: &[u8],
    rest: impl Iterator<Item = &'a Comp>,
    trailing_slash: bool,
) -> Vec<u8> {
    let mut p = base.to_vec();
    for c in rest {
        if p.last() != Some(&b'/') {
            p.push(b'/');
        }
        match c {
            Comp::Cur => p.push(b'.'),
            Comp::Parent => p.extend_from_slice(b".."),
            Comp::Name(n) => p.extend_from_slice(n),
        }
    }
    if trailing_slash && p.last() != Some(&b'/') {
        p.push(b'/');
    }
    p
}

/// Parse a `Path`.
pub fn parse(path: &Path, what: &str) -> io::Result<Parsed> {
    parse_bytes(path.as_os_str().as_bytes(), what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_area::errno_of;

    fn names(p: &Parsed) -> Vec<String> {
        p.comps
            .iter()
            .map(|c| match c {
                Comp::Cur => ".".into(),
                Comp::Parent => "..".into(),
                Comp::Name(n) => String::from_utf8_lossy(n).into_owned(),
            })
            .collect()
    }

    #[test]
    fn link_roots() {
        assert_eq!(LinkRoot::new(b"cairn"), None);
        assert_eq!(LinkRoot::new(b"/"), None);
        assert_eq!(LinkRoot::new(b"/a/../b"), None);
        let r = LinkRoot::new(b"/mnt//cairn/").unwrap();
        assert_eq!(r.parent(), b"/mnt");
        assert_eq!(LinkRoot::new(b"/cairn").unwrap().parent(), b"/");
        let comps = |p: &[u8]| parse_bytes(p, "t").unwrap().comps;
        let inside = |p: &[u8]| {
            r.inside(&comps(p))
                .map(|c| host_path(b"/", c.iter(), false))
        };
        assert_eq!(inside(b"/mnt/cairn/d/x"), Some(b"/d/x".to_vec()));
        assert_eq!(inside(b"/mnt/./cairn"), Some(b"/".to_vec()));
        assert_eq!(inside(b"/mnt/cairn2/x"), None);
        assert_eq!(inside(b"/mnt"), None);
        assert_eq!(
            inside(b"/mnt/../mnt/cairn"),
            None,
            "lexical: `..` is the host's"
        );
        let rest = comps(b"a/../b/./c");
        assert_eq!(host_path(b"/etc", rest.iter(), false), b"/etc/a/../b/./c");
        assert_eq!(host_path(b"/", rest[..1].iter(), true), b"/a/");
        assert_eq!(host_path(b"/tmp/d/", [].iter(), true), b"/tmp/d/");
    }

    #[test]
    fn components() {
        let p = parse_bytes(b"/a//b/./../c/", "t").unwrap();
        assert!(p.absolute && p.trailing_slash);
        assert_eq!(names(&p), ["a", "b", ".", "..", "c"]);
        let p = parse_bytes(b"x", "t").unwrap();
        assert!(!p.absolute && !p.trailing_slash);
        assert_eq!(names(&p), ["x"]);
        let p = parse_bytes(b"/", "t").unwrap();
        assert!(p.absolute && !p.trailing_slash && p.comps.is_empty());
        let p = parse_bytes(b"//", "t").unwrap();
        assert!(p.comps.is_empty() && !p.trailing_slash);
    }

    #[test]
    fn errors() {
        assert_eq!(errno_of(&parse_bytes(b"", "t").unwrap_err()), libc::ENOENT);
        let long = vec![b'a'; 256];
        assert_eq!(
            errno_of(&parse_bytes(&long, "t").unwrap_err()),
            libc::ENAMETOOLONG
        );
        assert!(parse_bytes(&long[..255], "t").is_ok());
        let very = "a/".repeat(2100);
        assert_eq!(
            errno_of(&parse_bytes(very.as_bytes(), "t").unwrap_err()),
            libc::ENAMETOOLONG
        );
        assert_eq!(
            errno_of(&parse_bytes(b"a\0b", "t").unwrap_err()),
            libc::EINVAL
        );
    }
}
