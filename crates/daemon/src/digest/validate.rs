//! Validation of a plan against the shared area: nothing is written before the whole
//! batch is known to be valid, so a malformed batch leaves the shared area untouched.

use super::{InodePlan, Life, PErr, Plan};
use crate::store::dirhash::NameChange;
use crate::store::shared::Shared;
use cairn_format::inode::{Inode, Kind};
use cairn_format::ROOT_INO;
use std::collections::HashMap;
use std::io;

/// The validated, applicable form of a plan.
pub(super) struct Checked<'p> {
    pub(super) dir_changes: HashMap<u64, Vec<NameChange<'p>>>,
    pub(super) survivors: Vec<bool>,
}

pub(super) fn validate<'p>(
    sh: &Shared,
    slot: u32,
    plan: &mut Plan<'p>,
) -> Result<Checked<'p>, PErr> {
    let mut survivors = vec![false; plan.nrec];
    check_inodes(sh, slot, plan, &mut survivors)?;
    let mut others = HashMap::new();
    let names = check_dirents(sh, plan, &mut survivors, &mut others)?;
    check_freed_dirs(sh, plan, &names.freed_dirs)?;
    for dir in names.touched_dirs {
        if let std::collections::btree_map::Entry::Vacant(v) = plan.inodes.entry(dir) {
            v.insert(InodePlan::new(base_of(sh, &mut others, dir)?));
        }
    }
    Ok(Checked {
        dir_changes: names.dir_changes,
        survivors,
    })
}

/// The inodes the batch sets or frees: well formed, not another client's, never the
/// root replaced or freed. Marks the records that survive.
fn check_inodes(
    sh: &Shared,
    slot: u32,
    plan: &Plan<'_>,
    survivors: &mut [bool],
) -> Result<(), PErr> {
    for (&ino, p) in &plan.inodes {
        match p.life {
            Life::Live => {
                if let Some(b) = &p.bad {
                    return Err(PErr::Bad(b.clone()));
                }
                if p.created {
                    if let Some(s) = sh.inodes.reserved_by(ino) {
                        if s != slot {
                            return Err(PErr::Bad(format!(
                                "inode {ino} is reserved by the client of slot {s}"
                            )));
                        }
                    }
                }
                if ino == ROOT_INO && (p.created || p.attrs.kind != Kind::Dir) {
                    return Err(PErr::Bad("the root directory cannot be replaced".into()));
                }
                if let Some(r) = p.set_rec {
                    survivors[r] = true;
                }
                if let Some(r) = p.attr_rec {
                    survivors[r] = true;
                }
                for piece in p.pending.pieces().values() {
                    survivors[piece.rec] = true;
                }
            }
            Life::Free if p.bad.is_some() => {
                // Never live in this batch (a `Freed` one may be a replay: tolerated).
                return Err(PErr::Bad(p.bad.clone().unwrap_or_default()));
            }
            _ => {
                if ino == ROOT_INO {
                    return Err(PErr::Bad("the root directory cannot be freed".into()));
                }
                if p.base_live {
                    if let Some(r) = p.set_rec {
                        survivors[r] = true;
                    }
                }
            }
        }
    }
    Ok(())
}

/// An inode the batch does not change, as the shared area has it (read once).
fn base_of(sh: &Shared, others: &mut HashMap<u64, Inode>, ino: u64) -> io::Result<Inode> {
    if let Some(i) = others.get(&ino) {
        return Ok(*i);
    }
    let i = sh.inode(ino)?;
    others.insert(ino, i);
    Ok(i)
}

/// The name changes of a batch, by directory.
struct Names<'p> {
    /// In directories that stay live.
    dir_changes: HashMap<u64, Vec<NameChange<'p>>>,
    /// In directories the batch frees.
    freed_dirs: HashMap<u64, Vec<NameChange<'p>>>,
    /// Directories the batch does not set but changes entries of.
    touched_dirs: Vec<u64>,
}

/// Every `DIRENT_SET`: in a directory, naming a live inode of the kind it says. Marks the
/// records that survive.
fn check_dirents<'p>(
    sh: &Shared,
    plan: &Plan<'p>,
    survivors: &mut [bool],
    others: &mut HashMap<u64, Inode>,
) -> Result<Names<'p>, PErr> {
    let mut names = Names {
        dir_changes: HashMap::new(),
        freed_dirs: HashMap::new(),
        touched_dirs: Vec::new(),
    };
    for (&(dir, name), &(ino, kind, idx)) in &plan.dirents {
        let change = NameChange { name, ino, kind };
        match plan.inodes.get(&dir) {
            Some(p) if p.life == Life::Live => {
                if p.attrs.kind != Kind::Dir {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET in inode {dir}, not a directory"
                    )));
                }
            }
            Some(p) => {
                if p.base_live && p.base.attrs.kind == Kind::Dir {
                    names.freed_dirs.entry(dir).or_default().push(change);
                }
                continue;
            }
            None => {
                let b = base_of(sh, others, dir)?;
                if b.attrs.kind != Kind::Dir {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET in inode {dir}, a {:?}, not a directory",
                        b.attrs.kind
                    )));
                }
                names.touched_dirs.push(dir);
            }
        }
        if ino != 0 {
            let target = match plan.inodes.get(&ino) {
                Some(p) if p.life == Life::Live => Some(p.attrs.kind),
                Some(_) => None,
                None => Some(base_of(sh, others, ino)?.attrs.kind).filter(|k| *k != Kind::Free),
            };
            match target {
                None => {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET names inode {ino}, which is free"
                    )))
                }
                Some(k) if k != kind => {
                    return Err(PErr::Bad(format!(
                        "DIRENT_SET names inode {ino} as a {kind:?}, it is a {k:?}"
                    )))
                }
                _ => {}
            }
        }
        survivors[idx] = true;
        names.dir_changes.entry(dir).or_default().push(change);
    }
    Ok(names)
}

/// A directory freed by the batch must end up empty.
fn check_freed_dirs(
    sh: &Shared,
    plan: &Plan<'_>,
    freed_dirs: &HashMap<u64, Vec<NameChange<'_>>>,
) -> Result<(), PErr> {
    for (&ino, p) in &plan.inodes {
        if p.life != Life::Live && p.base_live && p.base.attrs.kind == Kind::Dir {
            let mut n = p.base.dir_entries as i64;
            for c in freed_dirs.get(&ino).map(|v| &v[..]).unwrap_or(&[]) {
                let had = sh.area.dir_lookup(&p.base, c.name)?.is_some();
                n += (c.ino != 0) as i64 - had as i64;
            }
            if n != 0 {
                return Err(PErr::Bad(format!(
                    "directory {ino} is freed with {n} entries left"
                )));
            }
        }
    }
    Ok(())
}
