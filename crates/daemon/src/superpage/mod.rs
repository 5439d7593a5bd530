//! Superpages in the NVM tier (SCMFS) managed by Ingens' rules (ARCHITECTURE.md,
//! "Superpages").
//!
//! A 2 MiB-aligned range of a regular file (file blocks `512·r .. 512·r + 512`) lives
//! either in 4 KiB blocks (a leaf node of its map) or in one superpage extent: 512
//! consecutive NVM blocks, 2 MiB aligned within the NVM file, named by one level-2 map
//! entry (`cairn_format::map::HUGE_FLAG`). Every mapping of the NVM file is 2 MiB
//! aligned (`cairn_media::Mapping::new`) and extents are collapsed into huge folios
//! (`cairn_media::Mapping::collapse`), so the kernel maps them with PMDs.
//!
//! * **Placement at digest** (`digest::apply`): a range that holds nothing yet and that a
//!   digest fills to the promotion threshold goes straight into a free extent (no copy
//!   later). Writes into an extent are made in place, in the extent (the log is the redo
//!   record: a crash before the digest's end repeats them). Holes punched in an extent
//!   are zeroed in place and the range becomes a demotion candidate.
//! * **Promotion** ([`promote`]; Ingens' utilization-based promotion): in the background,
//!   a range at least `superpage_promote_pct` (90%) populated in NVM is copied into a
//!   free extent without the core lock, made durable, collapsed, and switched by one
//!   copy-on-write map update if the range did not change meanwhile (its leaf node is
//!   still the one copied: nodes and data are copy-on-write, and the round holds the
//!   epoch so nothing it read is reused); the old blocks are freed after the epoch, as
//!   in migration. A crash before the switch leaves the extent unreferenced (free at the
//!   rebuild).
//! * **Demotion** ([`demote`]; Ingens' deferred demotion): an extent whose blocks hold
//!   data for fewer than `superpage_demote_pct` (50%) of them (all-zero blocks and
//!   blocks past the file's end hold none) becomes a leaf node pointing into it, and
//!   the empty blocks are freed. No data moves.
//! * Promotion and demotion run at most `superpage_rate_mib` per second.

pub(crate) mod compact;

use crate::digest::parallel::CoreLock;
use crate::store::maptree;
use crate::store::shared::{Shared, Work};
use cairn_format::inode::{Inode, Kind};
use cairn_format::map::{huge_entry, is_huge, HUGE_BLOCKS, HUGE_BYTES};
use cairn_format::superblock::state;
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use cairn_proto::SuperpageStatus;
use std::collections::{BTreeSet, HashMap};
use std::io;

/// Superpage state of the daemon (DRAM), in [`Shared`].
#[derive(Debug, Default)]
pub(crate) struct Superpages {
    /// Whether ranges are placed in and promoted to extents.
    pub enabled: bool,
    /// Why not, when not.
    pub off_reason: Option<String>,
    /// Why the kernel does not back extents with huge pages, when it does not.
    pub kernel_refusal: Option<String>,
    /// Promotion threshold and demotion threshold, in blocks of a range.
    pub promote_blocks: u64,
    pub demote_blocks: u64,
    /// Ranges (inode, range number) a digest wrote in 4 KiB blocks: promotion
    /// candidates.
    pub candidates: BTreeSet<(u64, u64)>,
    /// Ranges in extents that lost data (holes punched): demotion candidates.
    pub sparse: BTreeSet<(u64, u64)>,
    /// Whether every file was looked at for candidates since the daemon started.
    pub scanned: bool,
    /// Counts in-place writes into extents; `inplace[ino]` is its value at the last one
    /// into inode `ino` (a copy of an extent taken before that is stale: migration).
    pub inplace_seq: u64,
    pub inplace: HashMap<u64, u64>,
    /// The last placement or promotion found no free extent (compaction may help).
    pub short: bool,
    /// Ranges that qualified for promotion when no extent was free: candidates again
    /// once one is.
    pub waiting: BTreeSet<(u64, u64)>,
    /// Extents a digest filled, to be collapsed into huge folios by the background pass.
    pub to_collapse: Vec<u64>,
    /// Extents being collapsed now (taken from `to_collapse`).
    pub collapsing: u64,
    /// Wakes the background pass (Ingens' fault handler waking Promote-kth): digests
    /// that add candidates ring it.
    pub wake: std::sync::Arc<crate::util::Doorbell>,
    /// Held by a promotion from its allocation of an extent to its switch, so that the
    /// daemon does not stop (and save that extent as in use) in between.
    pub gate: std::sync::Arc<std::sync::Mutex<()>>,
    /// Persistent counters (daemon state block, [`state::SUPERPAGES`]).
    pub promotions: u64,
    pub demotions: u64,
    pub bytes_promoted: u64,
    pub bytes_compacted: u64,
    /// Extents digests filled directly (no promotion needed).
    pub placed: u64,
    /// Collapses the kernel refused since the daemon started.
    pub collapse_failures: u64,
}

impl Superpages {
    /// The state for a store: `version5` says whether its format allows extents.
    pub(crate) fn new(sh: &Shared, cfg: &cairn_area::StoreConfig, version5: bool) -> Superpages {
        let f = |k: usize| sh.area.state_field(state::SUPERPAGES + 8 * k).unwrap_or(0);
        let off_reason = if !version5 {
            Some(format!(
                "the store's format version ({}) predates superpages (5)",
                sh.area.superblock().version
            ))
        } else if !cfg.superpages {
            Some("off in cairn.toml (superpages = false)".into())
        } else if sh.blocks.extent_capacity() == 0 {
            Some("the NVM tier's data region holds no whole 2 MiB extent".into())
        } else {
            None
        };
        // At least one block: 0% promotes any range holding data.
        let pct = |p: u32| (HUGE_BLOCKS * p.min(100) as u64).div_ceil(100).max(1);
        Superpages {
            enabled: off_reason.is_none(),
            off_reason,
            kernel_refusal: cairn_media::huge::refusal(),
            promote_blocks: pct(cfg.superpage_promote_pct),
            demote_blocks: (HUGE_BLOCKS * cfg.superpage_demote_pct.min(100) as u64) / 100,
            promotions: f(0),
            demotions: f(1),
            bytes_promoted: f(2),
            bytes_compacted: f(3),
            placed: f(4),
            ..Default::default()
        }
    }

    /// A digest wrote file blocks `fblks` of `ino` in 4 KiB blocks.
    pub(crate) fn note_written(&mut self, ino: u64, fblks: impl Iterator<Item = u64>) {
        if !self.enabled {
            return;
        }
        let mut last = u64::MAX;
        let mut added = false;
        for fb in fblks {
            let r = fb / HUGE_BLOCKS;
            if r != last {
                added |= self.candidates.insert((ino, r));
                last = r;
            }
        }
        if added {
            self.wake.ring();
        }
    }

    /// Range `r` of `ino`, an extent, may hold data in too few blocks: check it.
    pub(crate) fn note_sparse(&mut self, ino: u64, r: u64) {
        if self.sparse.insert((ino, r)) {
            self.wake.ring();
        }
    }

    /// A digest writes into an extent of `ino` in place.
    pub(crate) fn note_inplace(&mut self, ino: u64) {
        self.inplace_seq += 1;
        self.inplace.insert(ino, self.inplace_seq);
    }

    /// Whether `ino` was written in place after the sequence number `since`.
    pub(crate) fn written_in_place_since(&self, ino: u64, since: u64) -> bool {
        self.inplace.get(&ino).is_some_and(|&s| s > since)
    }
}

impl Shared {
    /// A free superpage extent for `w` (its 512 blocks are `w`'s allocations), or
    /// `None` when there is none, or when taking one would leave less than a sixteenth
    /// of the tier (and two extents) free: an extent's blocks that hold no data yet
    /// must not use up the space promised to clients' logs (credits, which count 4 KiB
    /// blocks).
    pub(crate) fn alloc_extent(&mut self, w: &mut Work) -> Option<u64> {
        let floor = 3 * HUGE_BLOCKS + self.blocks.capacity() / 16;
        if self.blocks.free_count() < floor {
            return None;
        }
        let first = self.blocks.alloc_extent()?;
        w.allocated.extend(first..first + HUGE_BLOCKS);
        Some(first)
    }

    /// Persist the superpage counters.
    pub(crate) fn persist_superpage_counters(&self) -> io::Result<()> {
        let sp = &self.superpages;
        let off = BLOCK_SIZE + state::SUPERPAGES;
        for (k, v) in [
            sp.promotions,
            sp.demotions,
            sp.bytes_promoted,
            sp.bytes_compacted,
            sp.placed,
        ]
        .into_iter()
        .enumerate()
        {
            self.map().store_u64(off + 8 * k, v)?;
        }
        self.map().persist(off, 40)
    }
}

/// Back the extents at `firsts` with huge folios (`MADV_COLLAPSE` through the daemon's
/// mapping; the bytes do not change, so no lock is needed). Returns the refusals.
fn collapse(area: &cairn_area::Area, firsts: &[u64]) -> u64 {
    let mut failed = 0;
    for &first in firsts {
        if let Err(e) = area
            .map()
            .collapse((first * BLOCK_SIZE_U64) as usize, HUGE_BYTES as usize)
        {
            if failed == 0 {
                tracing::debug!("the kernel did not collapse the extent at block {first}: {e}");
            }
            failed += 1;
        }
    }
    failed
}

/// Collapse `firsts` without the core lock and count the refusals.
fn collapse_unlocked(core: &CoreLock, firsts: &[u64]) {
    let (area, refused) = {
        let c = core.serial();
        (c.sh.area.clone(), c.sh.superpages.kernel_refusal.is_some())
    };
    if refused || firsts.is_empty() {
        return;
    }
    let failed = collapse(&area, firsts);
    if failed > 0 {
        let mut c = core.serial();
        if c.sh.superpages.collapse_failures == 0 {
            tracing::info!(
                "the kernel did not collapse {failed} superpage extent(s); they keep 4 KiB pages"
            );
        }
        c.sh.superpages.collapse_failures += failed;
    }
}

/// The level-2 entry of range `r` of `inode` (0: none).
fn range_entry(sh: &Shared, inode: &Inode, r: u64) -> io::Result<u64> {
    Ok(sh.area.range_entry(inode, r * HUGE_BLOCKS)?.unwrap_or(0))
}

/// What a promotion copies: the range's leaf node and its 512 entries.
pub(crate) struct Plan {
    ino: u64,
    generation: u64,
    range: u64,
    leaf: u64,
    entries: Vec<u64>,
    first: u64,
    epoch: u64,
}

/// Phase 1 of a promotion, under the core lock: whether range `r` of `ino` qualifies
/// (a regular file, in 4 KiB blocks, all of them in NVM, at least the threshold
/// populated), and if so a free extent and the epoch hold.
pub(crate) fn plan_promotion(sh: &mut Shared, ino: u64, r: u64) -> io::Result<Option<Plan>> {
    let Ok(inode) = sh.inode(ino) else {
        return Ok(None);
    };
    if inode.attrs.kind != Kind::File {
        return Ok(None);
    }
    let leaf = range_entry(sh, &inode, r)?;
    if leaf == 0 || is_huge(leaf) {
        return Ok(None);
    }
    let leaf = sh.check_ptr(leaf, "map node")?;
    let entries = sh.read_node(leaf)?.to_vec();
    let present = entries.iter().filter(|&&e| e != 0).count() as u64;
    let lower = entries
        .iter()
        .any(|&e| e != 0 && cairn_format::map::entry_tier(e) != 0);
    if lower || present < sh.superpages.promote_blocks {
        return Ok(None);
    }
    let mut w = Work::default();
    let Some(first) = sh.alloc_extent(&mut w) else {
        sh.superpages.short = true;
        sh.superpages.waiting.insert((ino, r));
        return Ok(None);
    };
    sh.superpages.short = false;
    let epoch = sh.epoch();
    sh.held_epochs.push(epoch);
    Ok(Some(Plan {
        ino,
        generation: inode.generation,
        range: r,
        leaf,
        entries,
        first,
        epoch,
    }))
}

/// Promote range `r` of `ino` into a superpage extent if it qualifies. Returns whether
/// it was promoted.
pub(crate) fn promote(core: &CoreLock, ino: u64, r: u64) -> io::Result<bool> {
    let gate = core.serial().sh.superpages.gate.clone();
    let _promoting = gate.lock().unwrap_or_else(|e| e.into_inner());
    let plan = {
        let mut c = core.serial();
        if c.stopped || !c.sh.superpages.enabled {
            return Ok(false);
        }
        plan_promotion(&mut c.sh, ino, r)?
    };
    let Some(p) = plan else { return Ok(false) };
    let copied = copy_promotion(&core.serial().sh.area.clone(), &p);
    finish_promotion(core, p, copied)
}

/// Phase 2 of a promotion, without the lock: copy the range (holes as zeros) into the
/// extent and make it durable.
pub(crate) fn copy_promotion(area: &cairn_area::Area, p: &Plan) -> io::Result<()> {
    let mut buf = vec![0u8; BLOCK_SIZE];
    for (i, &e) in p.entries.iter().enumerate() {
        if e == 0 {
            buf.fill(0);
        } else {
            area.read_block(e, &mut buf)?;
        }
        area.map()
            .write_nt(((p.first + i as u64) * BLOCK_SIZE_U64) as usize, &buf)?;
    }
    cairn_media::fence();
    Ok(())
}

/// Phase 3 of a promotion, under the lock: switch the map if the range is still what
/// was copied, else give the extent back. Returns whether it switched.
pub(crate) fn finish_promotion(
    core: &CoreLock,
    p: Plan,
    copied: io::Result<()>,
) -> io::Result<bool> {
    let mut c = core.serial();
    let sh = &mut c.sh;
    if let Some(i) = sh.held_epochs.iter().position(|&e| e == p.epoch) {
        sh.held_epochs.swap_remove(i);
    }
    let give_back = |sh: &mut Shared| {
        for b in p.first..p.first + HUGE_BLOCKS {
            sh.blocks.free(b);
        }
    };
    if let Err(e) = copied {
        give_back(sh);
        return Err(e);
    }
    let switched = (|| -> io::Result<bool> {
        if c.stopped {
            return Ok(false);
        }
        let sh = &mut c.sh;
        let Ok(old) = sh.inode(p.ino) else {
            return Ok(false);
        };
        if old.generation != p.generation
            || old.attrs.kind != Kind::File
            || range_entry(sh, &old, p.range)? != p.leaf
            || sh.read_node(p.leaf)?[..] != p.entries[..]
        {
            // Changed since the copy: a new leaf, or an append written into this one
            // in place (`maptree::append_leaf`).
            return Ok(false);
        }
        switch_map(
            sh,
            p.ino,
            &old,
            &[(p.range * HUGE_BLOCKS, huge_entry(p.first))],
        )?;
        sh.counters.shared_bytes_written += HUGE_BYTES;
        sh.superpages.promotions += 1;
        sh.superpages.bytes_promoted += HUGE_BYTES;
        sh.persist_superpage_counters()?;
        Ok(true)
    })();
    if !matches!(switched, Ok(true)) {
        give_back(&mut c.sh);
    } else if p.entries.iter().filter(|&&e| e != 0).count() < c.sh.superpages.demote_blocks as usize
    {
        // Promoted below the demotion threshold (a promotion threshold set under it).
        c.sh.superpages.sparse.insert((p.ino, p.range));
    }
    c.reclaim();
    drop(c);
    if matches!(switched, Ok(true)) {
        collapse_unlocked(core, &[p.first]);
    }
    switched
}

/// Publish `changes` to the map of inode `ino` (now `old`): one copy-on-write update,
/// written back and fenced, the inode published, the replaced blocks retired to the
/// epochs.
fn switch_map(sh: &mut Shared, ino: u64, old: &Inode, changes: &[(u64, u64)]) -> io::Result<()> {
    let mut w = Work::default();
    let r = match maptree::update(
        sh,
        &mut w,
        old.map_root,
        old.map_height,
        changes,
        u64::MAX,
        true,
    ) {
        Ok(r) => r,
        Err(e) => {
            sh.rollback(&w);
            return Err(e);
        }
    };
    cairn_media::fence();
    let new = Inode {
        map_root: r.root,
        map_height: r.height,
        blocks: (old.blocks as i64 + r.delta).max(0) as u64,
        ..*old
    };
    sh.write_inode(ino, &new)?;
    sh.counters.shared_bytes_written += w.bytes;
    sh.retire_and_advance(w.retired)
}

/// Demote range `r` of `ino` if it is an extent holding data in fewer blocks than the
/// demotion threshold (under the core lock: the blocks are read and the map switched in
/// one go, so no in-place write can come between). Returns whether it was demoted.
pub(crate) fn demote(sh: &mut Shared, ino: u64, r: u64) -> io::Result<bool> {
    let Ok(old) = sh.inode(ino) else {
        return Ok(false);
    };
    if old.attrs.kind != Kind::File {
        return Ok(false);
    }
    let e = range_entry(sh, &old, r)?;
    if !is_huge(e) {
        return Ok(false);
    }
    let first = sh.check_huge(e)?;
    let empty = empty_blocks(sh, &old, r, first)?;
    let used = HUGE_BLOCKS - empty.len() as u64;
    if used >= sh.superpages.demote_blocks {
        return Ok(false);
    }
    let base = r * HUGE_BLOCKS;
    let changes: Vec<(u64, u64)> = empty.iter().map(|&k| (base + k, 0)).collect();
    // Every empty block leaves the map (all of them: the range becomes a hole); the
    // split leaf points into the extent for the others.
    switch_map(sh, ino, &old, &changes)?;
    sh.superpages.demotions += 1;
    sh.persist_superpage_counters()?;
    Ok(true)
}

/// The blocks (0..512) of the extent at `first`, range `r` of `inode`, that hold no
/// data: past the file's end, or all zeros.
fn empty_blocks(sh: &Shared, inode: &Inode, r: u64, first: u64) -> io::Result<Vec<u64>> {
    let end = inode.attrs.size.div_ceil(BLOCK_SIZE_U64);
    let mut buf = vec![0u8; BLOCK_SIZE];
    let mut out = Vec::new();
    for k in 0..HUGE_BLOCKS {
        if r * HUGE_BLOCKS + k >= end {
            out.push(k);
            continue;
        }
        sh.area.read_block(first + k, &mut buf)?;
        if buf.iter().all(|&b| b == 0) {
            out.push(k);
        }
    }
    Ok(out)
}

/// Add every range of every regular file held in 4 KiB blocks to the promotion
/// candidates and every extent to the demotion checks (once after the daemon starts:
/// from then on digests name the ranges they write and punch).
fn scan_candidates(sh: &mut Shared) -> io::Result<()> {
    let mut found = Vec::new();
    for ino in 1..sh.layout.inode_count {
        if !sh.inodes.is_used(ino) {
            continue;
        }
        let Ok(inode) = sh.area.read_inode(ino) else {
            continue;
        };
        if inode.attrs.kind != Kind::File || inode.attrs.size < HUGE_BYTES / 2 {
            continue;
        }
        for r in 0..inode.attrs.size.div_ceil(HUGE_BYTES) {
            let e = range_entry(sh, &inode, r)?;
            if e != 0 {
                found.push((ino, r, is_huge(e)));
            }
        }
    }
    // Extents are checked for holes punched before the start (their candidacy for
    // demotion lives in DRAM only); ranges in 4 KiB blocks for promotion.
    for (ino, r, huge) in found {
        if huge {
            sh.superpages.sparse.insert((ino, r));
        } else {
            sh.superpages.candidates.insert((ino, r));
        }
    }
    sh.superpages.scanned = true;
    Ok(())
}

/// One background pass within `budget` bytes of work: collapse the extents digests
/// filled, demote what became sparse (a demotion check reads the extent: a quarter of
/// its size counted), promote candidates (a promotion copies 2 MiB; a candidate that
/// does not qualify costs 1/64 of that). The core lock is taken per step. Returns the
/// work done (0: nothing to do).
pub(crate) fn pass(core: &CoreLock, budget: u64) -> u64 {
    let fresh = {
        let mut c = core.serial();
        if c.stopped || !c.sh.superpages.enabled {
            return 0;
        }
        if !c.sh.superpages.scanned {
            if let Err(e) = scan_candidates(&mut c.sh) {
                tracing::warn!("looking for superpage candidates failed: {e}");
                c.sh.superpages.scanned = true;
            }
        }
        let room = c.sh.blocks.free_extents() > 0;
        let sp = &mut c.sh.superpages;
        if room && !sp.waiting.is_empty() {
            let mut w = std::mem::take(&mut sp.waiting);
            sp.candidates.append(&mut w);
        }
        let fresh = std::mem::take(&mut c.sh.superpages.to_collapse);
        c.sh.superpages.collapsing += fresh.len() as u64;
        fresh
    };
    let mut spent = fresh.len() as u64 * HUGE_BYTES / 8;
    collapse_unlocked(core, &fresh);
    core.serial().sh.superpages.collapsing -= fresh.len() as u64;
    spent += demote_pending(core, budget.saturating_sub(spent));
    while spent < budget {
        let Some((ino, r)) = core.serial().sh.superpages.candidates.pop_first() else {
            break;
        };
        match promote(core, ino, r) {
            Ok(true) => spent += HUGE_BYTES,
            Ok(false) => spent += HUGE_BYTES / 64,
            Err(e) => {
                spent += HUGE_BYTES / 64;
                tracing::warn!("promotion of inode {ino}, range {r} failed: {e}");
            }
        }
    }
    spent
}

/// Demote the pending sparse ranges that qualify, within `budget` (a check reads an
/// extent: a quarter of its size counted), the core lock taken per range; the work
/// done. Nothing once the store stopped (its allocation state is saved: the
/// power-failure simulator found a demotion that ran after a clean stop, leaking the
/// blocks it freed).
pub(crate) fn demote_pending(core: &CoreLock, budget: u64) -> u64 {
    let mut spent = 0;
    while spent < budget {
        let mut c = core.serial();
        if c.stopped {
            break;
        }
        let Some((ino, r)) = c.sh.superpages.sparse.pop_first() else {
            break;
        };
        spent += HUGE_BYTES / 4;
        if let Err(e) = demote(&mut c.sh, ino, r) {
            tracing::warn!("demotion of inode {ino}, range {r} failed: {e}");
        }
    }
    spent
}

/// `cairn status`' superpage figures: a walk of every regular file's map down to its
/// 2 MiB ranges (leaf blocks are not read).
pub(crate) fn status(sh: &Shared) -> SuperpageStatus {
    let sp = &sh.superpages;
    let mut extents = 0u64;
    let mut empty = 0u64;
    for ino in 1..sh.layout.inode_count {
        if !sh.inodes.is_used(ino) {
            continue;
        }
        let Ok(inode) = sh.area.read_inode(ino) else {
            continue;
        };
        if inode.attrs.kind != Kind::File || inode.map_height < 2 {
            continue;
        }
        let end = inode.attrs.size.div_ceil(BLOCK_SIZE_U64);
        for r in 0..end.div_ceil(HUGE_BLOCKS) {
            if let Ok(e) = range_entry(sh, &inode, r) {
                if is_huge(e) {
                    extents += 1;
                    empty += ((r + 1) * HUGE_BLOCKS).saturating_sub(end);
                    if sp.sparse.contains(&(ino, r)) {
                        let first = cairn_format::map::huge_first(e);
                        empty = empty.saturating_add(
                            empty_blocks(sh, &inode, r, first).map_or(0, |v| {
                                v.iter().filter(|&&k| r * HUGE_BLOCKS + k < end).count() as u64
                            }),
                        );
                    }
                }
            }
        }
    }
    let free_ext = sh.blocks.free_extents();
    let fmfi = compact::fmfi(sh);
    let bytes = extents * HUGE_BYTES;
    SuperpageStatus {
        enabled: sp.enabled,
        off_reason: sp.off_reason.clone(),
        huge_pages: sp.kernel_refusal.is_none(),
        huge_pages_refusal: sp.kernel_refusal.clone(),
        extent_bytes: bytes,
        extents_free: free_ext,
        extents_total: sh.blocks.extent_capacity(),
        promotions: sp.promotions,
        demotions: sp.demotions,
        bytes_promoted: sp.bytes_promoted,
        bytes_compacted: sp.bytes_compacted,
        placed: sp.placed,
        collapse_failures: sp.collapse_failures,
        fragmentation_index: fmfi,
        internal_fragmentation_bytes: empty * BLOCK_SIZE_U64,
        internal_fragmentation: if bytes == 0 {
            0.0
        } else {
            (empty * BLOCK_SIZE_U64) as f64 / bytes as f64
        },
        candidates: sp.candidates.len() as u64,
        collapse_pending: sp.to_collapse.len() as u64 + sp.collapsing,
    }
}
