//! `cairn fsck`: check a stopped store, and repair what can be repaired.
//!
//! What is checked (each finding is one line of [`FsckReport::problems`]):
//!
//! * the superblock and layout (decoding them opens the store) and the superblock's copy
//!   in the tier's last block (format version 4): when one is damaged, `--repair`
//!   rewrites it from the other; the lower tiers' headers (attaching them);
//! * the slots: after a clean stop no log holds undigested calls; otherwise the store
//!   needs recovery first (`--repair` does it, as a daemon start would), and each log's
//!   committed transactions waiting are counted (a note);
//! * from the root, every reachable inode: it decodes, it is not free, its directory
//!   entry names its kind, a directory has one name only (no cycle, no hard link) and
//!   its parent field names the directory holding it;
//! * every map against its tier: pointers in range, no block referenced twice (two
//!   files, or a file and a directory bucket); each inode's block count equals what its
//!   map holds;
//! * directories: every entry sits in the bucket its name hashes to, the entry count
//!   matches, names are unique;
//! * link counts: a file's equals the number of entries naming it, a directory's is two
//!   plus its subdirectories;
//! * no live inode is unreachable (an unlinked file still allocated after a clean stop,
//!   or a named file whose name was lost);
//! * the allocation state saved at the clean stop equals the references: no leaked block
//!   or inode, nothing referenced that is marked free (NVM blocks, inodes, lower-tier
//!   blocks);
//! * the lower tiers' segment tables: a segment holding referenced blocks was written;
//! * the extended-attribute journal: this store's, whole records (a torn last record and
//!   the sets of inodes that no longer exist are notes).
//!
//! `--repair` first recovers an unclean store, then fixes link counts in place; when the
//! only errors left are unreachable live inodes, names them `#<ino>` in `/lost+found`
//! (one transaction digested by the daemon's own code); and when the allocation state is
//! wrong, rebuilds it from the references (as a start after a crash does).

use crate::core::Core;
use crate::offline::lock_store;
use crate::store::alloc::Bitmap;
use crate::store::shared::Shared;
use crate::store::{dirhash, maptree, recovery};
use cairn_area::{Area, StoreDir};
use cairn_format::dir;
use cairn_format::inode::{Inode, Kind, INODE_BYTES};
use cairn_format::map::{entry_block, entry_tier};
use cairn_format::superblock::state;
use cairn_format::ROOT_INO;
use std::collections::HashMap;
use std::io;
use std::path::Path;

/// Options of [`fsck`].
#[derive(Default)]
pub struct FsckOptions {
    /// Repair what can be repaired.
    pub repair: bool,
    /// Called with (inodes visited, inodes in use at most) as the walk goes.
    pub progress: Option<Box<dyn Fn(u64, u64)>>,
}

/// What [`fsck`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FsckReport {
    /// Errors left.
    pub problems: Vec<String>,
    /// Errors corrected (`--repair`).
    pub repaired: Vec<String>,
    /// Facts worth knowing that are not errors.
    pub notes: Vec<String>,
    /// Reachable inodes, directories among them, NVM data blocks and lower-tier blocks
    /// referenced.
    pub inodes: u64,
    pub directories: u64,
    pub nvm_blocks: u64,
    pub tier_blocks: u64,
}

impl FsckReport {
    /// `e2fsck`'s exit status: 0 clean, 1 errors corrected, 4 errors left.
    pub fn exit_code(&self) -> i32 {
        if !self.problems.is_empty() {
            4
        } else if !self.repaired.is_empty() {
            1
        } else {
            0
        }
    }
}

/// Check (and with `repair`, repair) the store at `path`, whose daemon must be stopped.
///
/// Errors (an operational failure, `e2fsck`'s exit status 8): `EBUSY` when a daemon
/// serves the store, no store, an unreadable configuration, NVM file or tier, a
/// superblock that does not decode or a store of another format version.
pub fn fsck(path: &Path, opts: &FsckOptions) -> io::Result<FsckReport> {
    let store = StoreDir::new(path);
    let mut rep = FsckReport::default();
    {
        let _lock = lock_store(&store, "check it")?;
        if !check_superblock(&store, opts.repair, &mut rep)? {
            return Ok(rep);
        }
        let area = open(&store)?;
        if area.state_field(state::CLEAN)? != 1 {
            let dirty = dirty_slots(&area)?;
            if opts.repair {
                drop(area);
                recover_locked(&store)?;
                rep.repaired.push(format!(
                    "the store was not stopped cleanly: recovered ({} client logs replayed)",
                    dirty
                ));
            } else {
                rep.notes.push(format!(
                    "the store was not stopped cleanly ({dirty} client logs may hold undigested calls): the allocation state is not checked; `--repair`, or starting the daemon, recovers it"
                ));
            }
        }
    }
    let _lock = lock_store(&store, "check it")?;
    let area = open(&store)?;
    let clean = area.state_field(state::CLEAN)? == 1;
    let sh = Shared::new(
        area,
        crate::store::alloc::BlockAlloc::new(0, 0),
        crate::store::alloc::InodeAlloc::new(2),
    );
    let walk = walk_tree(&sh, opts, &mut rep)?;
    check_links(&sh, &walk, opts.repair && rep.problems.is_empty(), &mut rep)?;
    let (orphans, mut lost) = check_orphans(&sh, &walk, clean, &mut rep)?;
    if opts.repair && clean && !lost.is_empty() && rep.problems.len() == orphans as usize {
        // Only unreachable inodes left: give them names in /lost+found.
        drop(sh);
        lost.sort_unstable_by_key(|(ino, _)| *ino);
        link_into_lost_found(&store, &lost)?;
        drop(_lock);
        // Check again what the links made of the store.
        let mut again = fsck(path, &FsckOptions::default())?;
        rep.repaired.push(format!(
            "{orphans} unreachable inodes put into /lost+found ({} names, #<inode>)",
            lost.len()
        ));
        rep.repaired.append(&mut again.repaired);
        again.repaired = rep.repaired;
        return Ok(again);
    }
    check_xattrs(&store, &sh, &mut rep)?;
    check_segments(&sh, &walk, &mut rep)?;
    if !clean {
        for slot in 0..sh.layout.nslots {
            if sh.slot_head(slot)?.0.active {
                let n = crate::digest::pending_commits(&sh, slot)?;
                rep.notes.push(format!(
                    "slot {slot}: {n} committed transactions not digested yet (the next start, or `--repair`, applies them)"
                ));
            }
        }
    }
    if clean {
        check_slots(&sh, &mut rep)?;
        let wrong = check_allocation(&sh, &walk, &mut rep)?;
        if wrong && opts.repair {
            if orphans > 0 {
                rep.problems.push(format!(
                    "allocation state not rebuilt: it would free the {orphans} unreachable inodes"
                ));
            } else {
                // Rebuild it as a start after a crash does.
                sh.set_state(state::CLEAN, 0)?;
                drop(sh);
                recover_locked(&store)?;
                let n = rep.problems.len();
                rep.problems.retain(|p| !p.starts_with("allocation:"));
                rep.repaired.push(format!(
                    "allocation state rebuilt from the references ({} errors)",
                    n - rep.problems.len()
                ));
            }
        }
    }
    Ok(rep)
}

/// The superblock (block 0) against its copy. False when block 0 is damaged and was not
/// restored (the report says so; nothing else can be checked without it). An error when
/// neither decodes: not a store, or not one this version reads.
fn check_superblock(store: &StoreDir, repair: bool, rep: &mut FsckReport) -> io::Result<bool> {
    use cairn_format::superblock::{copy_block_of, stored_version, Superblock, FORMAT_VERSION};
    use cairn_format::BLOCK_SIZE;
    let cfg = store.load_config()?;
    let file = crate::core::open_nvm(store, &cfg)?;
    let len = file.metadata()?.len();
    if len < 2 * BLOCK_SIZE as u64 {
        return Err(cairn_area::fs_err(
            libc::EIO,
            format!("NVM file of {len} bytes is too small to be a Cairn tier"),
        ));
    }
    let map = cairn_media::Mapping::new(&file, 0, len as usize, repair, false)?;
    let block = |b: u64| -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; BLOCK_SIZE];
        map.read(b as usize * BLOCK_SIZE, &mut v)?;
        Ok(v)
    };
    let restore = |to: u64, bytes: &[u8]| -> io::Result<()> {
        map.write(to as usize * BLOCK_SIZE, bytes)?;
        map.persist(to as usize * BLOCK_SIZE, BLOCK_SIZE)
    };
    let primary = block(0)?;
    match Superblock::decode(&primary, len) {
        Ok(sb) if sb.layout.sb_copy == 0 => {
            rep.notes.push(
                "a store of format version 3 or older: it has no copy of the superblock".into(),
            );
        }
        Ok(sb) => {
            let at = sb.layout.sb_copy;
            if block(at)? != primary {
                let what = format!("the copy of the superblock in block {at} is damaged");
                if repair {
                    restore(at, &primary)?;
                    rep.repaired
                        .push(format!("{what}: rewritten from the superblock"));
                } else {
                    rep.problems.push(what);
                }
            }
        }
        // A store of a newer version: its copy is of that version too.
        Err(e) if stored_version(&primary).is_some_and(|v| v > FORMAT_VERSION) => {
            return Err(cairn_area::fs_err(libc::EIO, e.to_string()));
        }
        Err(e) => {
            let at = copy_block_of(len);
            let copy = block(at)?;
            match Superblock::decode_copy(&copy, len) {
                Ok(_) => {
                    let what = format!("the superblock (block 0) is damaged: {e}");
                    if repair {
                        restore(0, &copy)?;
                        rep.repaired
                            .push(format!("{what}: restored from its copy in block {at}"));
                    } else {
                        rep.problems.push(format!(
                            "{what}; its copy in block {at} is intact (`--repair` restores it); nothing else was checked"
                        ));
                        return Ok(false);
                    }
                }
                // Neither decodes: an operational error, as opening the store gives.
                _ => {
                    return Err(cairn_area::fs_err(
                        libc::EIO,
                        format!("{e} (and no intact copy in block {at})"),
                    ))
                }
            }
        }
    }
    Ok(true)
}

/// Open the store's NVM tier (writable, for repairs) and its lower tiers (read only).
fn open(store: &StoreDir) -> io::Result<Area> {
    let cfg = store.load_config()?;
    let file = crate::core::open_nvm(store, &cfg)?;
    let mut area = Area::open(&file, true)?;
    area.attach_logs(&cfg.nvm_path, true)?;
    let remote = crate::tiers::remote::open(&cfg, area.superblock(), false)?;
    area.attach_tiers(
        [cfg.ssd_path.as_deref(), cfg.hdd_path.as_deref()],
        remote.map(|t| Box::new(t) as _),
        false,
    )?;
    Ok(area)
}

/// Recovery while the caller holds the daemon lock.
fn recover_locked(store: &StoreDir) -> io::Result<()> {
    let _log = crate::util::logging_to(&store.daemon_log_path());
    tracing::info!("{}", "fsck: recovery");
    let (mut core, _) = Core::open(store)?;
    core.shutdown()
}

fn dirty_slots(area: &Area) -> io::Result<u32> {
    let mut n = 0;
    for slot in 0..area.layout().nslots {
        if area.slot_head(slot)?.is_some_and(|(h, _)| h.active) {
            n += 1;
        }
    }
    Ok(n)
}

/// What the walk from the root found.
struct Walk {
    visited: Bitmap,
    /// Entries naming each inode; subdirectories of each directory.
    names: HashMap<u64, u64>,
    subdirs: HashMap<u64, u64>,
    nvm: Bitmap,
    /// Lower-tier blocks by tier number.
    tiers: HashMap<u8, Bitmap>,
}

/// The walk from the root: every reachable inode, its map and a directory's entries,
/// with the bitmaps of referenced blocks. One function (about 180 lines) because every
/// check shares the walk's state (the stack, the marks, the counts per inode) and runs
/// as the inode is reached.
fn walk_tree(sh: &Shared, opts: &FsckOptions, rep: &mut FsckReport) -> io::Result<Walk> {
    let l = sh.layout;
    let mut w = Walk {
        visited: Bitmap::new(l.inode_count),
        names: HashMap::new(),
        subdirs: HashMap::new(),
        nvm: Bitmap::new(l.data_start + l.data_blocks),
        tiers: sh
            .tiers
            .iter()
            .map(|t| (t.num, Bitmap::new(t.geom.blocks())))
            .collect(),
    };
    for (i, g) in l.tiers.iter().enumerate() {
        if g.present() {
            w.tiers
                .entry(i as u8 + 1)
                .or_insert_with(|| Bitmap::new(g.blocks()));
        }
    }
    let root = match sh.inode(ROOT_INO) {
        Ok(r) if r.attrs.kind == Kind::Dir => r,
        Ok(r) => {
            rep.problems.push(format!(
                "the root inode is a {:?}, not a directory",
                r.attrs.kind
            ));
            return Ok(w);
        }
        Err(e) => {
            rep.problems.push(format!("the root inode: {e}"));
            return Ok(w);
        }
    };
    w.visited.set(ROOT_INO);
    let mut stack = vec![(ROOT_INO, root, "/".to_string(), ROOT_INO)];
    let mut dups = 0u64;
    while let Some((ino, inode, path, parent)) = stack.pop() {
        rep.inodes += 1;
        if let Some(p) = &opts.progress {
            if rep.inodes.is_multiple_of(1024) {
                p(rep.inodes, l.inode_count);
            }
        }
        let mut owned = 0u64;
        let mut mark = |b: u64, w: &mut Walk| {
            owned += 1;
            let fresh = match entry_tier(b) {
                0 => mark_bit(&mut w.nvm, b),
                t => w
                    .tiers
                    .get_mut(&t)
                    .is_some_and(|m| mark_bit(m, entry_block(b))),
            };
            if !fresh {
                dups += 1;
            }
        };
        let mut nodes = Vec::new();
        let mut leaves = Vec::new();
        if let Err(e) = maptree::walk(
            sh,
            inode.map_root,
            inode.map_height,
            &mut |b| nodes.push(b),
            &mut |_, b| leaves.push(b),
        ) {
            rep.problems.push(format!("{path} (inode {ino}): map: {e}"));
            continue;
        }
        for b in nodes {
            mark(b, &mut w);
        }
        if inode.attrs.kind != Kind::Dir {
            for b in leaves {
                mark(b, &mut w);
            }
            if owned != inode.blocks {
                let unpublished = match sh.area.state_field(state::CLEAN)? {
                    1 => None,
                    _ => maptree::unpublished_append(sh, &inode)?,
                };
                match unpublished {
                    // A crash between an append's entries and its inode: the rebuild
                    // clears them and the replay appends again.
                    Some((_, set)) => rep.notes.push(format!(
                        "{path} (inode {ino}): {} map entries past the end of the file from an append the crash kept from being published (recovery clears them)",
                        set.len()
                    )),
                    None => rep.problems.push(format!(
                        "{path} (inode {ino}): block count {} but its map holds {owned}",
                        inode.blocks
                    )),
                }
            }
            continue;
        }
        rep.directories += 1;
        if ino != ROOT_INO && inode.attrs.parent != parent {
            rep.problems.push(format!(
                "{path} (inode {ino}): parent field {} but it is named in directory {parent}",
                inode.attrs.parent
            ));
        }
        let entries = match dirhash::entries(sh, &inode, &mut |b| mark(b, &mut w)) {
            Ok(e) => e,
            Err(e) => {
                rep.problems
                    .push(format!("{path} (inode {ino}): directory: {e}"));
                continue;
            }
        };
        if owned != inode.blocks {
            rep.problems.push(format!(
                "{path} (inode {ino}): block count {} but its map and buckets hold {owned}",
                inode.blocks
            ));
        }
        if entries.len() as u64 != inode.dir_entries {
            rep.problems.push(format!(
                "{path} (inode {ino}): entry count {} but it holds {}",
                inode.dir_entries,
                entries.len()
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (bucket, e) in entries {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let child_path = if path == "/" {
                format!("/{name}")
            } else {
                format!("{path}/{name}")
            };
            if !names.insert(e.name.clone()) {
                rep.problems.push(format!(
                    "{child_path}: the name appears twice in its directory"
                ));
            }
            if dir::bucket_of(dir::hash(&e.name), inode.dir_level, inode.dir_split) != bucket {
                rep.problems.push(format!(
                    "{child_path}: entry in bucket {bucket}, not the one its name hashes to"
                ));
            }
            if !l.ino_valid(e.ino) {
                rep.problems
                    .push(format!("{child_path}: names inode {} out of range", e.ino));
                continue;
            }
            let child = match sh.inode(e.ino) {
                Ok(c) => c,
                Err(err) => {
                    rep.problems
                        .push(format!("{child_path} (inode {}): {err}", e.ino));
                    continue;
                }
            };
            if child.attrs.kind == Kind::Free {
                rep.problems
                    .push(format!("{child_path}: names free inode {}", e.ino));
                continue;
            }
            if child.attrs.kind != e.kind {
                rep.problems.push(format!(
                    "{child_path}: entry says {:?}, inode {} is a {:?}",
                    e.kind, e.ino, child.attrs.kind
                ));
            }
            *w.names.entry(e.ino).or_default() += 1;
            if child.attrs.kind == Kind::Dir {
                *w.subdirs.entry(ino).or_default() += 1;
                if w.visited.get(e.ino) {
                    rep.problems.push(format!(
                        "{child_path}: directory inode {} has more than one name (a cycle or a hard link)",
                        e.ino
                    ));
                    continue;
                }
            } else if w.visited.get(e.ino) {
                continue;
            }
            w.visited.set(e.ino);
            stack.push((e.ino, child, child_path, ino));
        }
    }
    if dups > 0 {
        rep.problems
            .push(format!("{dups} blocks are referenced more than once"));
    }
    rep.nvm_blocks = w.nvm.count_ones();
    rep.tier_blocks = w.tiers.values().map(Bitmap::count_ones).sum();
    Ok(w)
}

/// Set bit `i`; false if it was set already or is out of range.
fn mark_bit(m: &mut Bitmap, i: u64) -> bool {
    if i >= m.len() || m.get(i) {
        return false;
    }
    m.set(i);
    true
}

fn check_links(sh: &Shared, w: &Walk, repair: bool, rep: &mut FsckReport) -> io::Result<()> {
    for ino in 1..sh.layout.inode_count {
        if !w.visited.get(ino) {
            continue;
        }
        let mut inode = sh.inode(ino)?;
        let want = if inode.attrs.kind == Kind::Dir {
            2 + w.subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            w.names.get(&ino).copied().unwrap_or(0)
        };
        if inode.attrs.nlink == want {
            continue;
        }
        let msg = format!(
            "inode {ino} ({:?}): link count {} but {want} names",
            inode.attrs.kind, inode.attrs.nlink
        );
        if repair {
            inode.attrs.nlink = want;
            sh.write_inode(ino, &inode)?;
            rep.repaired.push(format!("{msg}: set to {want}"));
        } else {
            rep.problems.push(msg);
        }
    }
    Ok(())
}

/// Live inodes nobody names; returns how many have links (nlink > 0), and those of them
/// no other unreachable directory names (what `/lost+found` would take).
fn check_orphans(
    sh: &Shared,
    w: &Walk,
    clean: bool,
    rep: &mut FsckReport,
) -> io::Result<(u64, Vec<(u64, Kind)>)> {
    let mut raw = [0u8; INODE_BYTES];
    let mut named = 0;
    let mut lost = Vec::new();
    let mut inside = std::collections::HashSet::new();
    for ino in 2..sh.layout.inode_count {
        if w.visited.get(ino) {
            continue;
        }
        sh.area.read_inode_raw(ino, &mut raw)?;
        if raw.iter().all(|&b| b == 0) {
            continue;
        }
        match Inode::decode(&raw) {
            Ok(i) if i.attrs.kind == Kind::Free => {}
            Ok(i) if i.attrs.nlink == 0 => {
                // Kept for a client that has it open; after a clean stop, none has.
                if clean {
                    rep.problems.push(format!(
                        "inode {ino}: unlinked {:?} still allocated after a clean stop",
                        i.attrs.kind
                    ));
                }
            }
            Ok(i) => {
                named += 1;
                rep.problems.push(format!(
                    "inode {ino}: {:?} with {} links is not reachable from the root",
                    i.attrs.kind, i.attrs.nlink
                ));
                if i.attrs.kind == Kind::Dir {
                    inside.extend(sh.area.dir_list(&i)?.into_iter().map(|e| e.ino));
                }
                lost.push((ino, i.attrs.kind));
            }
            Err(e) => rep
                .problems
                .push(format!("inode {ino}: does not decode: {e}")),
        }
    }
    lost.retain(|(ino, _)| !inside.contains(ino));
    Ok((named, lost))
}

/// Name each of `lost` (unreachable live inodes) `#<ino>` in `/lost+found`, making it if
/// needed: one transaction of a client registered as root, digested by the daemon's own
/// code (checked like any batch, except the link-count rule: the inodes keep their
/// counts, which had no names to match).
fn link_into_lost_found(store: &StoreDir, lost: &[(u64, Kind)]) -> io::Result<()> {
    use cairn_format::log::Record;
    let _log = crate::util::logging_to(&store.daemon_log_path());
    tracing::info!("{}", "fsck: putting unreachable inodes into /lost+found");
    let (mut core, _) = Core::open(store)?;
    let reg = core.register(std::process::id(), 0, 0, 0)?;
    let slot = reg.slot;
    let sh = &mut core.sh;
    let root = sh.inode(ROOT_INO)?;
    let names: Vec<Vec<u8>> = lost
        .iter()
        .map(|(ino, _)| format!("#{ino}").into_bytes())
        .collect();
    let subdirs = lost.iter().filter(|(_, k)| *k == Kind::Dir).count() as u64;
    let mut recs = Vec::new();
    let (lf, mut lf_attrs, lf_gen, fresh) = lost_found_dir(sh, &root, &reg.inodes)?;
    lf_attrs.nlink += subdirs;
    recs.push(Record::InodeSet {
        ino: lf,
        generation: lf_gen,
        attrs: lf_attrs,
    });
    if fresh {
        let mut r = root.attrs;
        r.nlink += 1;
        recs.push(Record::InodeSet {
            ino: ROOT_INO,
            generation: root.generation,
            attrs: r,
        });
        recs.push(Record::DirentSet {
            dir: ROOT_INO,
            name: b"lost+found",
            ino: lf,
            kind: Kind::Dir,
        });
    }
    let moved: Vec<Inode> = lost
        .iter()
        .map(|(ino, _)| sh.inode(*ino))
        .collect::<io::Result<_>>()?;
    // In use from now on, with their blocks, whatever the saved state said.
    for ((ino, _), inode) in lost.iter().zip(&moved) {
        sh.inodes.mark_used(*ino);
        for b in recovery::owned_blocks(sh, inode)? {
            recovery::mark_in_use(&mut sh.blocks, &mut sh.tiers, b);
        }
    }
    for (((ino, kind), name), inode) in lost.iter().zip(&names).zip(&moved) {
        if *kind == Kind::Dir {
            recs.push(Record::InodeSet {
                ino: *ino,
                generation: inode.generation,
                attrs: cairn_format::inode::Attrs {
                    parent: lf,
                    ..inode.attrs
                },
            });
        }
        recs.push(Record::DirentSet {
            dir: lf,
            name,
            ino: *ino,
            kind: *kind,
        });
    }
    let end = append_at_head(sh, slot, reg.head_lsn, reg.head_seq, &recs)?;
    sh.replaying.insert(slot);
    crate::digest::digest(sh, slot, crate::digest::Mode::Upto(end)).map_err(|e| {
        crate::util::eio(format!("/lost+found: the daemon refused the links: {e:?}"))
    })?;
    core.release(slot, None)?;
    core.shutdown()
}

/// `/lost+found`: the existing directory (inode, attributes, generation), or a new one
/// (mode 0700, the first of `inodes`, the numbers the daemon reserved for the repair).
fn lost_found_dir(
    sh: &Shared,
    root: &Inode,
    inodes: &[u64],
) -> io::Result<(u64, cairn_format::inode::Attrs, u64, bool)> {
    Ok(match sh.area.dir_lookup(root, b"lost+found")? {
        Some((ino, Kind::Dir)) => {
            let i = sh.inode(ino)?;
            (ino, i.attrs, i.generation, false)
        }
        Some(_) => {
            return Err(crate::util::eio(
                "/lost+found exists and is not a directory: move it away first",
            ))
        }
        None => {
            let ino = *inodes
                .first()
                .ok_or_else(|| crate::util::eio("no free inode for /lost+found"))?;
            let now = crate::util::now_ns();
            let attrs = cairn_format::inode::Attrs {
                kind: Kind::Dir,
                perm: 0o700,
                nlink: 2,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                parent: ROOT_INO,
                ..root.attrs
            };
            (ino, attrs, sh.inode(ino)?.generation + 1, true)
        }
    })
}

/// Write transaction `recs` into `slot`'s ring at its head (`head_lsn`, `head_seq`),
/// after a wrap if it does not fit in the lap, persisted. Returns the LSN after it.
fn append_at_head(
    sh: &Shared,
    slot: u32,
    head_lsn: u64,
    head_seq: u64,
    recs: &[cairn_format::log::Record<'_>],
) -> io::Result<u64> {
    use cairn_format::log;
    // The transaction at the slot's head (after a wrap if it does not fit in the lap).
    let ring = sh.layout.ring_bytes();
    let (mut lsn, mut seq) = (head_lsn, head_seq);
    let len = log::build_txn(seq, recs).len() as u64;
    if len > ring / 4 {
        return Err(crate::util::eio(format!(
            "{} records are too many for one transaction",
            recs.len()
        )));
    }
    let put = |lsn: u64, t: &[u8]| -> io::Result<()> {
        let (m, roff) = sh.area.slot_ring(slot);
        let off = roff + (lsn % ring) as usize;
        m.write(off, t)?;
        m.persist(off, t.len())
    };
    let left = ring - lsn % ring;
    if len > left {
        let mut w = vec![0u8; left as usize];
        log::seal_wrap(&mut w, seq);
        put(lsn, &w)?;
        lsn += left;
        seq += 1;
    }
    let txn = log::build_txn(seq, recs);
    put(lsn, &txn)?;
    let end = lsn + txn.len() as u64;
    Ok(end)
}

/// The lower tiers' segment tables: a segment holding referenced blocks was written (its
/// `gen` counts writes, clients key cached blocks by it) and not in the future (its age
/// drives cleaning).
fn check_segments(sh: &Shared, w: &Walk, rep: &mut FsckReport) -> io::Result<()> {
    let l = &sh.layout;
    let now = crate::util::now_ns() as u64;
    for (i, g) in l.tiers.iter().enumerate() {
        let t = i as u8 + 1;
        let (Some(refd), true) = (w.tiers.get(&t), g.present()) else {
            continue;
        };
        for seg in 1..g.segments {
            let first = seg * g.segment_blocks;
            if !(first..first + g.segment_blocks).any(|b| refd.get(b)) {
                continue;
            }
            let off = l.seg_entry_off(t, seg) as usize;
            let (gen, written) = (sh.map().load_u64(off)?, sh.map().load_u64(off + 8)?);
            if gen == 0 {
                rep.problems.push(format!(
                    "tier {t} segment {seg}: holds referenced blocks but its table says it was never written"
                ));
            } else if written > now + 86_400_000_000_000 {
                rep.notes.push(format!(
                    "tier {t} segment {seg}: written in the future by its table (cleaning takes it for young)"
                ));
            }
        }
    }
    Ok(())
}

/// The extended-attribute journal: of this store, whole records (a torn last one is a
/// change never acknowledged: a note), attribute sets of inodes that still exist (others
/// are dropped at the next compaction: a note). Read only: a start cuts a torn tail.
fn check_xattrs(store: &StoreDir, sh: &Shared, rep: &mut FsckReport) -> io::Result<()> {
    let path = store.xattr_path();
    let b = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if b.is_empty() {
        return Ok(());
    }
    let r = match crate::xattr::replay(&b) {
        Ok(r) if r.uuid == sh.area.superblock().uuid => r,
        Ok(_) => {
            rep.problems.push(format!(
                "{}: the extended-attribute journal of another store (a start moves it aside)",
                path.display()
            ));
            return Ok(());
        }
        Err(e) => {
            rep.problems.push(format!(
                "{}: not an extended-attribute journal: {e}",
                path.display()
            ));
            return Ok(());
        }
    };
    if r.whole < b.len() {
        rep.notes.push(format!(
            "{}: {} bytes after the last whole record (a change torn by a crash, never acknowledged; the next start cuts them)",
            path.display(),
            b.len() - r.whole
        ));
    }
    let stale = r
        .map
        .keys()
        .filter(|(ino, generation)| {
            !sh.layout.ino_valid(*ino)
                || sh.inode(*ino).map_or(true, |i| {
                    i.attrs.kind == Kind::Free || i.generation != *generation
                })
        })
        .count();
    if stale > 0 {
        rep.notes.push(format!(
            "{stale} attribute sets in the journal belong to inodes that no longer exist (dropped at its next compaction)"
        ));
    }
    Ok(())
}

fn check_slots(sh: &Shared, rep: &mut FsckReport) -> io::Result<()> {
    for slot in 0..sh.layout.nslots {
        match sh.area.slot_head(slot)? {
            Some((h, _)) if h.active => rep.problems.push(format!(
                "slot {slot}: still owned by a client after a clean stop"
            )),
            Some(_) => {}
            None => rep
                .problems
                .push(format!("slot {slot}: neither copy of its head decodes")),
        }
    }
    Ok(())
}

/// Compare the saved allocation state with the references; true if it is wrong.
fn check_allocation(sh: &Shared, w: &Walk, rep: &mut FsckReport) -> io::Result<bool> {
    let (blocks, inodes, tiers) = match recovery::load(&sh.area) {
        Ok(s) => s,
        Err(e) => {
            rep.problems
                .push(format!("allocation: the saved state does not load: {e}"));
            return Ok(true);
        }
    };
    let l = sh.layout;
    let mut wrong = false;
    let mut compare = |what: &str,
                       used: &dyn Fn(u64) -> bool,
                       range: std::ops::Range<u64>,
                       refd: &dyn Fn(u64) -> bool| {
        let (mut leaked, mut lost) = (0u64, 0u64);
        for i in range {
            match (used(i), refd(i)) {
                (true, false) => leaked += 1,
                (false, true) => lost += 1,
                _ => {}
            }
        }
        if leaked > 0 {
            rep.problems.push(format!(
                "allocation: {leaked} {what} marked in use but not referenced (leaked)"
            ));
            wrong = true;
        }
        if lost > 0 {
            rep.problems.push(format!(
                "allocation: {lost} {what} referenced but marked free"
            ));
            wrong = true;
        }
    };
    compare(
        "NVM data blocks",
        &|b| blocks.is_used(b),
        l.data_start..l.data_start + l.data_blocks,
        &|b| w.nvm.get(b),
    );
    compare("inodes", &|i| inodes.is_used(i), 2..l.inode_count, &|i| {
        w.visited.get(i)
    });
    for t in &tiers {
        let refd = w.tiers.get(&t.num);
        compare(
            &format!("tier {} blocks", t.num),
            &|b| t.is_used(b),
            t.geom.segment_blocks..t.geom.blocks(),
            &|b| refd.is_some_and(|m| m.get(b)),
        );
    }
    Ok(wrong)
}
