//! Whole-tree snapshots: everything observable about a tree, for comparison.

use crate::ops::{FsOps, Kind, Meta};
use std::collections::BTreeMap;
use std::io;

/// One node of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub meta: Meta,
    /// File contents, or the symlink target.
    pub content: Vec<u8>,
    /// Extended attributes in the `user.` namespace, by name.
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

fn xattrs_of(fs: &dyn FsOps, p: &str) -> io::Result<BTreeMap<String, Vec<u8>>> {
    let mut m = BTreeMap::new();
    for n in fs.list_xattr(p, false)? {
        let v = fs.get_xattr(p, &n, false)?;
        m.insert(n, v);
    }
    Ok(m)
}

/// Path → node for every node under a directory (the directory itself included).
pub type Snapshot = BTreeMap<String, Node>;

/// Walk `root` (a directory path inside `fs`) and record every node below it.
pub fn snapshot(fs: &dyn FsOps, root: &str) -> io::Result<Snapshot> {
    let mut s = Snapshot::new();
    let mut stack = vec![root.to_string()];
    while let Some(dir) = stack.pop() {
        let meta = fs.meta(&dir, false)?;
        s.insert(
            dir.clone(),
            Node {
                meta,
                content: Vec::new(),
                xattrs: xattrs_of(fs, &dir)?,
            },
        );
        for name in fs.list(&dir)? {
            let p = if dir.ends_with('/') {
                format!("{dir}{name}")
            } else {
                format!("{dir}/{name}")
            };
            let m = fs.meta(&p, false)?;
            match m.kind {
                Kind::Dir => stack.push(p),
                Kind::File => {
                    let content = fs.read_all(&p)?;
                    let xattrs = xattrs_of(fs, &p)?;
                    s.insert(
                        p,
                        Node {
                            meta: m,
                            content,
                            xattrs,
                        },
                    );
                }
                Kind::Symlink => {
                    let t = fs.read_link(&p)?;
                    let xattrs = xattrs_of(fs, &p)?;
                    s.insert(
                        p,
                        Node {
                            meta: m,
                            content: t.into_bytes(),
                            xattrs,
                        },
                    );
                }
            }
        }
    }
    Ok(s)
}

/// A readable description of how two snapshots differ (empty if equal).
pub fn diff(a: &Snapshot, b: &Snapshot) -> String {
    let mut out = String::new();
    for (k, v) in a {
        match b.get(k) {
            None => out += &format!("only in cairn: {k} {:?}\n", v.meta),
            Some(w) if w.meta != v.meta => {
                out += &format!("{k}: cairn {:?} vs reference {:?}\n", v.meta, w.meta)
            }
            Some(w) if w.xattrs != v.xattrs => {
                out += &format!(
                    "{k}: extended attributes cairn {:?} vs reference {:?}\n",
                    v.xattrs, w.xattrs
                )
            }
            Some(w) if w.content != v.content => {
                let first = v.content.iter().zip(&w.content).position(|(x, y)| x != y);
                out += &format!(
                    "{k}: contents differ (len {} vs {}, first difference at {:?})\n",
                    v.content.len(),
                    w.content.len(),
                    first
                )
            }
            _ => {}
        }
    }
    for (k, w) in b {
        if !a.contains_key(k) {
            out += &format!("only in reference: {k} {:?}\n", w.meta);
        }
    }
    out
}
