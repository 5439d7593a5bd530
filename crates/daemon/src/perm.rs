//! The trust domain and the digest's POSIX permission checks.
//!
//! *Trust domain.* Only clients the store trusts get a direct mapping of the NVM file:
//! root, the store owner (`owner_uid` in `cairn.toml`) and members of the optional
//! `trusted_gid`. The daemon checks the peer's `SO_PEERCRED` uid/gid and its supplementary
//! groups (`/proc/<pid>/status`) at `Register`/`Reattach`; mkfs gives the NVM file and the
//! slot lock files modes that let exactly the trust domain open them.
//!
//! *Permission checks.* Every record of a batch is checked, in log order, against the
//! credentials of the slot's client and a shadow of the state: the shared area before the
//! batch plus what the batch did before the record (`check_batch`). A violation makes the
//! batch malformed. Root bypasses every check. The rules (LibFS applies the same ones
//! before logging, `cairn::meta::Cred`):
//!
//! * `DIRENT_SET` that changes an entry of directory `D`: write and search permission on
//!   `D`; removing or replacing an entry of a sticky `D`: owner of the entry or of `D`.
//! * `INODE_SET` creating an inode: uid = the client's uid; gid = one of the client's
//!   groups, or the gid of a setgid directory the same transaction links it into; the
//!   setgid bit only with such a gid.
//! * `INODE_SET` of an existing inode: permission bits need the owner (and setting the
//!   setgid bit membership of the file's group), except that a writer may clear the
//!   setuid and setgid bits (as its write does on Linux); uid needs root; gid needs the owner and
//!   membership of the new group; size, atime and mtime need the owner or write permission
//!   (the daemon cannot tell "now" from an explicit time, nor a write through a descriptor
//!   opened before a `chmod`: the owner may always `chmod u+w` first, so allowing the owner
//!   gives no extra power); btime needs the owner; a directory's parent (a move to another
//!   directory) needs write permission on it; ctime needs the owner, write permission, or
//!   the inode being linked or unlinked by the same transaction.
//! * Link counts change only with the matching entries in the same transaction: a file's
//!   `nlink` change equals the entries naming it added minus removed, except that removals
//!   may leave it higher (an open file unlinked: LibFS frees it at its last close) and
//!   that such an orphan's `nlink = 0` needs the owner or write permission; a directory
//!   gets `2 + subdirectories`, goes to 0 only when its entry is removed, and never gets a
//!   second entry.
//! * `WRITE`: the owner or write permission.

use crate::store::shared::Shared;
use cairn_area::{fs_err, StoreConfig};
use cairn_format::inode::{Attrs, Kind};
use cairn_format::log::Record;
use cairn_format::slot::OWNER_CRED_OFF;
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;

pub(crate) use cairn_format::perm::{Cred, W, X};

/// The `Groups:` line of `/proc/<pid>/status` (empty if the process is gone).
fn proc_groups(pid: u32) -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    cairn_format::perm::groups_of_status(&s).unwrap_or_default()
}

/// A group id from a number or a group name (`/etc/group`).
pub fn resolve_group(name_or_gid: &str) -> io::Result<u32> {
    if let Ok(g) = name_or_gid.parse::<u32>() {
        return Ok(g);
    }
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    group
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[0] == name_or_gid)
                .then(|| f[2].parse().ok())
                .flatten()
        })
        .ok_or_else(|| {
            fs_err(
                libc::ENOENT,
                format!("no group named {name_or_gid:?} in /etc/group"),
            )
        })
}

/// A connected process's credentials: ids from `SO_PEERCRED`, supplementary groups
/// from /proc.
pub(crate) fn cred_of_process(pid: u32, uid: u32, gid: u32) -> Cred {
    Cred {
        uid,
        gid,
        groups: proc_groups(pid),
    }
}

/// A connected process's credentials now, as the kernel checks its file accesses (file
/// system uid and gid, supplementary groups), from `/proc/<pid>/status`: after it
/// changed them (`Request::Credentials`). `ESRCH` if the process is gone.
pub(crate) fn cred_now(pid: u32) -> io::Result<Cred> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| cairn_format::perm::cred_of_status(&s))
        .ok_or_else(|| {
            fs_err(
                libc::ESRCH,
                format!("credentials of pid {pid}: process gone"),
            )
        })
}

/// A client known only by its uid and gid (recovery after a daemon restart): its
/// supplementary groups are those of the group database.
pub(crate) fn cred_of_user(uid: u32, gid: u32) -> Cred {
    Cred {
        gid,
        ..cairn_area::users::cred_of_user(uid)
    }
}

/// Who may map a store directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TrustDomain {
    pub owner_uid: u32,
    pub trusted_gid: Option<u32>,
}

impl TrustDomain {
    /// From `cairn.toml`; an older configuration without `owner_uid` names the owner of
    /// the NVM file.
    pub fn of(cfg: &StoreConfig) -> io::Result<TrustDomain> {
        Ok(TrustDomain {
            owner_uid: cfg.owner()?,
            trusted_gid: cfg.trusted_gid,
        })
    }

    pub fn admits(&self, c: &Cred) -> bool {
        c.is_root() || c.uid == self.owner_uid || self.trusted_gid.is_some_and(|g| c.in_group(g))
    }

    /// `EACCES` naming the mediated path for a client outside the domain.
    pub fn check(&self, c: &Cred, store: &Path) -> io::Result<()> {
        if self.admits(c) {
            return Ok(());
        }
        let group = self
            .trusted_gid
            .map_or_else(|| "none".to_string(), |g| g.to_string());
        Err(fs_err(
            libc::EACCES,
            format!(
                "uid {} is not in the trust domain of store {} (owner uid {}, group {group}): \
                 use the FUSE mount (`cairn mount`, coming with the FUSE front end) instead of \
                 a direct mapping",
                c.uid,
                store.display(),
                self.owner_uid
            ),
        ))
    }
}

/// Durably record `cred`'s uid and gid in `slot`'s slot-table entry.
pub(crate) fn persist_slot_cred(sh: &Shared, slot: u32, cred: &Cred) -> io::Result<()> {
    let off = (sh.layout.slot_entry_off(slot) + OWNER_CRED_OFF) as usize;
    sh.map()
        .store_u64(off, cred.uid as u64 | (cred.gid as u64) << 32)?;
    sh.map().persist(off, 8)
}

/// The credentials `slot`'s log is checked with: those of its registered client, else
/// (after a daemon restart) the uid and gid recorded in the slot-table entry.
pub(crate) fn slot_cred(sh: &Shared, slot: u32) -> io::Result<Cred> {
    if let Some(c) = sh.creds.get(&slot) {
        return Ok(c.clone());
    }
    let off = (sh.layout.slot_entry_off(slot) + OWNER_CRED_OFF) as usize;
    let v = sh.map().load_u64(off)?;
    Ok(cred_of_user(v as u32, (v >> 32) as u32))
}

/// Why a batch fails the permission checks.
pub(crate) enum Denial {
    Denied(String),
    Io(io::Error),
}

impl From<io::Error> for Denial {
    fn from(e: io::Error) -> Self {
        Denial::Io(e)
    }
}

fn eacces(msg: String) -> Denial {
    Denial::Denied(format!("permission denied (EACCES): {msg}"))
}

fn eperm(msg: String) -> Denial {
    Denial::Denied(format!("operation not permitted (EPERM): {msg}"))
}

fn describe(a: &Attrs) -> String {
    format!("mode {:04o}, uid {}, gid {}", a.perm, a.uid, a.gid)
}

/// The state a batch is checked against: the shared area plus the batch so far.
struct Shadow<'s, 'r> {
    sh: &'s Shared,
    /// Inodes the batch touched: `None` = free.
    attrs: HashMap<u64, Option<Attrs>>,
    /// Last live attributes of inodes the batch freed (entries of a directory removed
    /// after it was freed are checked against them).
    last_live: HashMap<u64, Attrs>,
    /// The client's slot.
    slot: u32,
    /// Inodes that became live inside the batch (a directory among them has no old
    /// entries).
    created: HashSet<u64>,
    entries: HashMap<(u64, &'r [u8]), Option<Entry>>,
}

/// A directory entry's target: inode number and kind.
type Entry = (u64, Kind);

impl<'r> Shadow<'_, 'r> {
    fn attrs(&mut self, ino: u64) -> Result<Option<Attrs>, Denial> {
        if let Some(a) = self.attrs.get(&ino) {
            return Ok(*a);
        }
        if !self.sh.layout.ino_valid(ino) {
            return Err(Denial::Denied(format!("inode number {ino} out of range")));
        }
        let i = self.sh.inode(ino)?;
        let a = (i.attrs.kind != Kind::Free).then_some(i.attrs);
        self.attrs.insert(ino, a);
        Ok(a)
    }

    fn set(&mut self, ino: u64, a: Option<Attrs>) {
        if a.is_none() {
            if let Some(Some(old)) = self.attrs.get(&ino) {
                self.last_live.insert(ino, *old);
            }
        }
        self.attrs.insert(ino, a);
    }

    /// Attributes of a directory for checking an entry change in it.
    fn dir_attrs(&mut self, dir: u64) -> Result<Option<Attrs>, Denial> {
        let a = self
            .attrs(dir)?
            .or_else(|| self.last_live.get(&dir).copied());
        Ok(a.filter(|a| a.kind == Kind::Dir))
    }

    fn entry(&mut self, dir: u64, name: &'r [u8]) -> Result<Option<Entry>, Denial> {
        if let Some(e) = self.entries.get(&(dir, name)) {
            return Ok(*e);
        }
        let e = if self.created.contains(&dir) {
            None
        } else if !self.sh.layout.ino_valid(dir) {
            return Err(Denial::Denied(format!(
                "DIRENT_SET in directory {dir}: out of range"
            )));
        } else {
            let d = self.sh.inode(dir)?;
            if d.attrs.kind == Kind::Dir {
                self.sh.area.dir_lookup(&d, name)?
            } else {
                None
            }
        };
        self.entries.insert((dir, name), e);
        Ok(e)
    }
}

/// What one transaction did to link counts, for the end-of-transaction checks.
#[derive(Default)]
struct TxnLinks {
    /// Attributes before the transaction's first `INODE_SET` of each inode it sets.
    first_pre: HashMap<u64, Option<Attrs>>,
    /// Entries naming the inode added / removed by the transaction.
    adds: HashMap<u64, i64>,
    removes: HashMap<u64, i64>,
    /// Per directory: subdirectory entries added minus removed.
    subdirs: HashMap<u64, i64>,
    /// Inodes named (as new or old target) by an entry change.
    named: HashSet<u64>,
    /// Directories (with their attributes at the time) that link each inode.
    linked_in: HashMap<u64, Vec<Attrs>>,
    /// Inodes created by the transaction: (gid, perm, kind) to check against `linked_in`.
    created: Vec<(u64, u32, u32, Kind)>,
    /// Inodes whose ctime changed without owner or write permission.
    ctime_only: Vec<u64>,
}

/// Check a batch (`txn_ends`: the record index just past each transaction) against the
/// credentials of its client. Root passes everything. `replay`: a crashed daemon may
/// have applied part of this batch already (its entries but not yet the inodes, or the
/// reverse), so link counts cannot be compared with entry changes and that rule is
/// skipped; every other rule still holds.
pub(crate) fn check_batch(
    sh: &Shared,
    slot: u32,
    cred: &Cred,
    recs: &[Record<'_>],
    txn_ends: &[usize],
    replay: bool,
) -> Result<(), Denial> {
    if cred.is_root() {
        return Ok(());
    }
    let mut s = Shadow {
        sh,
        slot,
        attrs: HashMap::new(),
        last_live: HashMap::new(),
        created: HashSet::new(),
        entries: HashMap::new(),
    };
    let mut start = 0;
    for &end in txn_ends {
        check_txn(&mut s, cred, &recs[start..end], replay)?;
        start = end;
    }
    Ok(())
}

fn check_txn<'r>(
    s: &mut Shadow<'_, 'r>,
    c: &Cred,
    recs: &[Record<'r>],
    replay: bool,
) -> Result<(), Denial> {
    let mut t = TxnLinks::default();
    for r in recs {
        match *r {
            Record::InodeSet { ino, attrs: n, .. } => check_inode_set(s, c, ino, n, &mut t)?,
            Record::Write {
                ino, size, mtime, ..
            } => write_data(s, c, ino, Some(size), mtime)?,
            Record::Punch { ino, mtime, .. } => write_data(s, c, ino, None, mtime)?,
            Record::DirentSet {
                dir,
                name,
                ino,
                kind,
            } => check_dirent(s, c, dir, name, ino, kind, &mut t)?,
        }
    }
    check_whole(c, &t)?;
    if replay {
        return Ok(());
    }
    check_links(s, c, &t)
}

/// An `INODE_SET` of `ino` with attributes `n`: a creation (by its owner; a device by
/// root only), or an update (`check_update`); a freeing is for the link-count rule.
fn check_inode_set<'r>(
    s: &mut Shadow<'_, 'r>,
    c: &Cred,
    ino: u64,
    n: Attrs,
    t: &mut TxnLinks,
) -> Result<(), Denial> {
    let u = c.uid;
    let pre = s.attrs(ino)?;
    t.first_pre.entry(ino).or_insert(pre);
    // An unnamed file (`O_TMPFILE`) is created with no link: checked as any
    // creation.
    let unnamed = pre.is_none() && s.sh.pinned_by(ino, s.slot);
    match pre {
        _ if n.nlink == 0 && !unnamed => {} // freeing: the link-count rule decides
        None => {
            if n.uid != u {
                return Err(eperm(format!(
                    "uid {u} may not create inode {ino} owned by uid {}",
                    n.uid
                )));
            }
            if n.kind.is_device() && !c.is_root() {
                return Err(eperm(format!(
                    "uid {u} may not create device node {ino}: only root may"
                )));
            }
            t.created.push((ino, n.gid, n.perm, n.kind));
            s.created.insert(ino);
        }
        Some(o) => check_update(c, ino, &o, &n, t)?,
    }
    s.set(ino, (n.nlink > 0).then_some(n));
    Ok(())
}

/// A `DIRENT_SET` of `name` in `dir` to `ino` (0: removed): write and search permission
/// on the directory, the sticky bit's owner rule; counted for the link-count rule.
fn check_dirent<'r>(
    s: &mut Shadow<'_, 'r>,
    c: &Cred,
    dir: u64,
    name: &'r [u8],
    ino: u64,
    kind: Kind,
    t: &mut TxnLinks,
) -> Result<(), Denial> {
    let u = c.uid;
    let old = s.entry(dir, name)?;
    if old.map_or(0, |o| o.0) == ino {
        return Ok(()); // no change (a replay, or removing a missing name)
    }
    // A change in a non-directory is a structural error (validation).
    let Some(d) = s.dir_attrs(dir)? else {
        return Ok(());
    };
    if !c.may(&d, W | X) {
        return Err(eacces(format!(
            "uid {u} may not change entry {:?} of directory {dir} ({})",
            String::from_utf8_lossy(name),
            describe(&d)
        )));
    }
    if let Some((victim, vkind)) = old {
        if d.perm & 0o1000 != 0 && !c.owns(&d) {
            let va = s
                .attrs(victim)?
                .or_else(|| s.last_live.get(&victim).copied());
            if !matches!(va, Some(v) if v.uid == u) {
                return Err(eperm(format!(
                    "uid {u} may not remove or replace entry {:?} of sticky directory {dir} ({}): it owns neither",
                    String::from_utf8_lossy(name),
                    describe(&d)
                )));
            }
        }
        *t.removes.entry(victim).or_default() += 1;
        t.named.insert(victim);
        if vkind == Kind::Dir {
            *t.subdirs.entry(dir).or_default() -= 1;
        }
    }
    if ino != 0 {
        *t.adds.entry(ino).or_default() += 1;
        t.named.insert(ino);
        t.linked_in.entry(ino).or_default().push(d);
        if kind == Kind::Dir {
            *t.subdirs.entry(dir).or_default() += 1;
        }
    }
    s.entries
        .insert((dir, name), (ino != 0).then_some((ino, kind)));
    Ok(())
}

/// The checks that depend on the whole transaction: the group of each creation (one of
/// the creator's, or inherited from a setgid directory it is linked in), and a ctime-only
/// change allowed only to a file the transaction links or unlinks.
fn check_whole(c: &Cred, t: &TxnLinks) -> Result<(), Denial> {
    let u = c.uid;
    for &(ino, gid, perm, kind) in &t.created {
        let setgid_parent = t
            .linked_in
            .get(&ino)
            .is_some_and(|ds| ds.iter().any(|d| d.perm & 0o2000 != 0 && d.gid == gid));
        if !c.in_group(gid) && !setgid_parent {
            return Err(eperm(format!(
                "uid {u} may not create inode {ino} with gid {gid}: not one of its groups nor inherited from a setgid directory"
            )));
        }
        if perm & 0o2000 != 0 && !c.in_group(gid) && !(kind == Kind::Dir && setgid_parent) {
            return Err(eperm(format!(
                "uid {u} may not create inode {ino} setgid with gid {gid}, not one of its groups"
            )));
        }
    }
    for &ino in &t.ctime_only {
        if !t.named.contains(&ino) {
            return Err(eperm(format!(
                "uid {u} may not change the ctime of inode {ino}: neither owner nor writer, and not linked or unlinked by the same transaction"
            )));
        }
    }
    Ok(())
}

/// A `WRITE` (`size`: the size after it) or `PUNCH` of `ino`: owner or writer only.
fn write_data(
    s: &mut Shadow<'_, '_>,
    c: &Cred,
    ino: u64,
    size: Option<u64>,
    mtime: i64,
) -> Result<(), Denial> {
    // Data in a free inode or a directory is a structural error, reported by the
    // digest's validation.
    let Some(mut o) = s.attrs(ino)? else {
        return Ok(());
    };
    if o.kind == Kind::Dir {
        return Ok(());
    }
    if !c.owns_or_writes(&o) {
        return Err(eacces(format!(
            "uid {} may not write to inode {ino} ({})",
            c.uid,
            describe(&o)
        )));
    }
    if let Some(size) = size {
        o.size = size;
    }
    o.mtime = mtime;
    o.ctime = mtime;
    s.set(ino, Some(o));
    Ok(())
}

/// Field rules for an `INODE_SET` of a live inode (`o`: before, `n`: after).
fn check_update(c: &Cred, ino: u64, o: &Attrs, n: &Attrs, t: &mut TxnLinks) -> Result<(), Denial> {
    let u = c.uid;
    if c.is_root() || n.kind != o.kind {
        return Ok(()); // a kind change is a structural error (validation)
    }
    let owner = c.owns(o);
    let writer = c.owns_or_writes(o);
    let what = |f: &str| {
        format!(
            "uid {u} may not change the {f} of inode {ino} ({})",
            describe(o)
        )
    };
    if n.uid != o.uid {
        return Err(eperm(what("owner")));
    }
    if n.gid != o.gid && !(owner && c.in_group(n.gid)) {
        return Err(eperm(format!(
            "{} to {}: owner and member of the new group only",
            what("group"),
            n.gid
        )));
    }
    if n.perm != o.perm {
        // A writer may clear setuid and setgid (what a write by it does on Linux), and
        // nothing else.
        let only_cleared = n.perm & !0o6000 == o.perm & !0o6000 && n.perm & !o.perm == 0;
        if !(owner || (writer && only_cleared)) {
            return Err(eperm(what("permission bits")));
        }
        if n.perm & 0o2000 != 0 && !c.in_group(n.gid) {
            return Err(eperm(format!(
                "{}: setgid with a group it is not in",
                what("permission bits")
            )));
        }
    }
    if o.kind != Kind::Dir && n.size != o.size && !writer {
        return Err(eacces(what("size")));
    }
    if (n.atime != o.atime || n.mtime != o.mtime) && !writer {
        return Err(eperm(what("times")));
    }
    if n.btime != o.btime && !owner {
        return Err(eperm(what("creation time")));
    }
    if o.kind == Kind::Dir && n.parent != o.parent && !c.may(o, W) {
        return Err(eacces(format!(
            "uid {u} may not move directory {ino} to another directory ({}): no write permission on it",
            describe(o)
        )));
    }
    if n.ctime != o.ctime && !writer {
        t.ctime_only.push(ino);
    }
    Ok(())
}

/// Link counts change only with the matching entries of the same transaction.
fn check_links(s: &mut Shadow<'_, '_>, c: &Cred, t: &TxnLinks) -> Result<(), Denial> {
    let u = c.uid;
    let mut inos: Vec<u64> = t.first_pre.keys().copied().collect();
    inos.extend(t.adds.keys().chain(t.removes.keys()).copied());
    inos.sort_unstable();
    inos.dedup();
    for ino in inos {
        let now = s.attrs(ino)?;
        let pre = match t.first_pre.get(&ino) {
            Some(p) => *p,
            None => now,
        };
        let Some(kind) = now.or(pre).map(|a| a.kind) else {
            continue; // entries naming a free inode: a structural error (validation)
        };
        let n0 = pre.map_or(0, |a| a.nlink) as i64;
        let n1 = now.map_or(0, |a| a.nlink) as i64;
        let adds = t.adds.get(&ino).copied().unwrap_or(0);
        let removes = t.removes.get(&ino).copied().unwrap_or(0);
        let bad = |why: String| {
            Err(eperm(format!(
                "uid {u}: link count of inode {ino} from {n0} to {n1} does not match the transaction's entries ({adds} added, {removes} removed){why}"
            )))
        };
        if kind == Kind::Dir {
            if adds - removes > i64::from(pre.is_none()) {
                return bad(": a directory has exactly one entry".into());
            }
            if n1 == 0 {
                if n0 > 0 && removes <= adds {
                    return bad(": a directory is freed only with its entry".into());
                }
                continue;
            }
            let base = if pre.is_none() { 2 } else { n0 };
            let sub = t.subdirs.get(&ino).copied().unwrap_or(0);
            if n1 != base + sub {
                return bad(format!(
                    ": expected {} (subdirectories {sub:+})",
                    base + sub
                ));
            }
        } else {
            let (d, e) = (n1 - n0, adds - removes);
            let ok = d == e
                || (e < d && d <= 0)
                || (n1 == 0 && d < e && pre.is_some_and(|a| c.owns_or_writes(&a)));
            if !ok {
                return bad(String::new());
            }
        }
    }
    Ok(())
}

impl crate::core::Core {
    /// The credentials of a connecting process (`SO_PEERCRED` ids, groups from /proc),
    /// if the store trusts them; else `EACCES` naming the mediated path.
    pub(crate) fn admit(&self, pid: u32, uid: u32, gid: u32) -> io::Result<Cred> {
        let cred = cred_of_process(pid, uid, gid);
        TrustDomain::of(&self.cfg)?.check(&cred, &self.store.path)?;
        Ok(cred)
    }

    /// Whether the store trusts a connecting process, `EACCES` if not, as [`Self::admit`]
    /// but without its credentials: the owner and root are known by their uid alone, so
    /// only others cost a read of `/proc` (their groups).
    pub(crate) fn trusts(&self, pid: u32, uid: u32, gid: u32) -> io::Result<()> {
        let ids = Cred {
            uid,
            gid,
            groups: Vec::new(),
        };
        if TrustDomain::of(&self.cfg)?.admits(&ids) {
            return Ok(());
        }
        self.admit(pid, uid, gid).map(|_| ())
    }

    /// Make `cred` the credentials `slot`'s log is checked with (persisted first, so a
    /// later daemon recovers the log with them).
    pub(crate) fn set_slot_cred(&mut self, slot: u32, cred: Cred) -> io::Result<()> {
        persist_slot_cred(&self.sh, slot, &cred)?;
        self.sh.creds.insert(slot, cred);
        Ok(())
    }

    /// A process re-attaching to `slot` must be the user whose log it holds.
    pub(crate) fn check_reattach_cred(&self, slot: u32, cred: &Cred) -> io::Result<()> {
        let rec = slot_cred(&self.sh, slot)?;
        if rec.uid != cred.uid && !cred.is_root() {
            return Err(fs_err(
                libc::EPERM,
                format!(
                    "slot {slot} holds the log of uid {}, not of uid {}",
                    rec.uid, cred.uid
                ),
            ));
        }
        Ok(())
    }
}
