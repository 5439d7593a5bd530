//! Which paths belong to Cairn: pure functions over byte strings.
//!
//! A path is Cairn's when, read lexically (repeated slashes and `.` components ignored),
//! its first components are those of the prefix (default `/cairn`). The rest, which
//! LibFS resolves, is the path inside the store. Relative paths belong to Cairn when
//! the current directory (or the `*at` directory descriptor) is a Cairn directory, unless
//! their leading `..` components climb out of the prefix.

/// The components of an absolute or relative path, without empty and `.` ones.
fn comps(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    p.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// Write `p` in canonical prefix form into `out` (absolute, no trailing slash, not `/`
/// itself) without allocating; returns its length, or `None` if `p` is not usable as
/// a prefix (relative, `/`, `..` components, longer than `out`).
pub fn canonical_prefix(p: &[u8], out: &mut [u8]) -> Option<usize> {
    if !p.starts_with(b"/") || comps(p).any(|c| c == b"..") {
        return None;
    }
    let mut n = 0;
    for c in comps(p) {
        let end = n + 1 + c.len();
        if end > out.len() {
            return None;
        }
        out[n] = b'/';
        out[n + 1..end].copy_from_slice(c);
        n = end;
    }
    (n > 0).then_some(n)
}

/// If absolute `path` is under `prefix` (canonical), the path inside the store: `/` for
/// the prefix itself, else `/` followed by the rest of `path` as written (so that a
/// trailing slash stays, which matters for `ENOTDIR`).
pub fn strip_prefix<'a>(path: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    if !path.starts_with(b"/") {
        return None;
    }
    let mut rest = path;
    for want in comps(prefix) {
        // Skip slashes and `.` components, then match one component.
        loop {
            let t = rest.iter().position(|&b| b != b'/').unwrap_or(rest.len());
            rest = &rest[t..];
            if rest.starts_with(b"./") || rest == b"." {
                rest = &rest[1..];
            } else {
                break;
            }
        }
        let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
        if &rest[..end] != want {
            return None;
        }
        rest = &rest[end..];
    }
    if rest.is_empty() {
        Some(b"/")
    } else {
        Some(rest)
    }
}

/// Join a relative `path` to the absolute directory `dir` lexically (`..` removes a
/// component); the result is absolute and canonical (no `.`, `..` or repeated slashes).
pub fn join_lexical(dir: &[u8], path: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = if path.starts_with(b"/") {
        Vec::new()
    } else {
        comps(dir).collect()
    };
    for c in comps(path) {
        if c == b".." {
            parts.pop();
        } else {
            parts.push(c);
        }
    }
    if parts.is_empty() {
        return b"/".to_vec();
    }
    let mut out = Vec::new();
    for c in parts {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    out
}

/// Whether the leading `..` components of relative `path`, taken from the directory
/// `dir` (absolute, canonical, under `prefix`), climb above `prefix`.
pub fn climbs_out(dir: &[u8], path: &[u8], prefix: &[u8]) -> bool {
    let depth = comps(dir).count() as isize - comps(prefix).count() as isize;
    let mut d = depth;
    for c in comps(path) {
        if c == b".." {
            d -= 1;
            if d < 0 {
                return true;
            }
        } else {
            break;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(p: &[u8]) -> Option<Vec<u8>> {
        let mut buf = [0u8; 16];
        canonical_prefix(p, &mut buf).map(|n| buf[..n].to_vec())
    }

    #[test]
    fn prefixes() {
        assert_eq!(canon(b"/cairn/").unwrap(), b"/cairn");
        assert_eq!(canon(b"//mnt/./c").unwrap(), b"/mnt/c");
        assert!(canon(b"/").is_none());
        assert!(canon(b"cairn").is_none());
        assert!(canon(b"/a/../b").is_none());
        assert!(canon(b"/a-very-long-prefix-name").is_none());
    }

    #[test]
    fn strip() {
        let p = b"/cairn";
        assert_eq!(strip_prefix(b"/cairn", p), Some(&b"/"[..]));
        assert_eq!(strip_prefix(b"/cairn/", p), Some(&b"/"[..]));
        assert_eq!(strip_prefix(b"/cairn/a/b", p), Some(&b"/a/b"[..]));
        assert_eq!(strip_prefix(b"//cairn//a", p), Some(&b"//a"[..]));
        assert_eq!(strip_prefix(b"/./cairn/./a", p), Some(&b"/./a"[..]));
        assert_eq!(strip_prefix(b"/cairn/a/", p), Some(&b"/a/"[..]));
        assert_eq!(strip_prefix(b"/cairnx/a", p), None);
        assert_eq!(strip_prefix(b"/cair", p), None);
        assert_eq!(strip_prefix(b"/tmp/cairn", p), None);
        assert_eq!(strip_prefix(b"cairn/a", p), None);
        assert_eq!(strip_prefix(b"/", p), None);
        let p2 = b"/mnt/c";
        assert_eq!(strip_prefix(b"/mnt/c/x", p2), Some(&b"/x"[..]));
        assert_eq!(strip_prefix(b"/mnt/x", p2), None);
        assert_eq!(strip_prefix(b"/mnt", p2), None);
    }

    #[test]
    fn join() {
        assert_eq!(join_lexical(b"/cairn/a", b"b/./c"), b"/cairn/a/b/c");
        assert_eq!(join_lexical(b"/cairn/a", b"../.."), b"/");
        assert_eq!(join_lexical(b"/cairn/a", b"../../../x"), b"/x");
        assert_eq!(join_lexical(b"/cairn", b"/etc//x"), b"/etc/x");
        assert_eq!(join_lexical(b"/cairn", b""), b"/cairn");
    }

    #[test]
    fn climbing() {
        let p = b"/cairn";
        assert!(!climbs_out(b"/cairn/a", b"../x", p));
        assert!(climbs_out(b"/cairn/a", b"../../x", p));
        assert!(climbs_out(b"/cairn", b"..", p));
        assert!(!climbs_out(b"/cairn", b"x/../..", p)); // `..` after a name: LibFS's
        assert!(!climbs_out(b"/cairn", b"./x", p));
    }
}
