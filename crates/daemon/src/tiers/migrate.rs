//! Moves across the tiers (Strata's "migrate": NVM → SSD → HDD in whole segments, and
//! hot data back up).
//!
//! Every move is a *round* of one [`RoundKind`] (migration of the coldest chunks,
//! evacuation or cleaning of victim segments, promotion of chunks clients read often)
//! that moves file blocks into one free segment of a lower tier, or, for a promotion
//! into NVM, into newly allocated NVM blocks:
//!
//! 1. under the core lock (serial): take the destination, choose the blocks to move,
//!    bump a segment's generation in its NVM segment-table entry, and hold the current
//!    epoch so that no block retired from now on is freed (or trimmed) while it is being
//!    copied;
//! 2. without the lock: read the blocks and write the segment with one sequential write,
//!    then `fdatasync` it (NVM blocks: non-temporal stores and a fence);
//! 3. under the core lock: for every block whose map entry still names the copied block
//!    (a digest may have replaced it meanwhile: the newest copy wins), switch the entry
//!    to the new copy out of place (map nodes copied, written back, fenced) and publish
//!    the inode; retire the old blocks (freed after the epoch) and release the hold.
//!
//! A crash before step 3 leaves the segment unreferenced (the rebuild finds it free); a
//! crash inside step 3 leaves each inode either switched or not. Recency is kept in DRAM
//! only (as in Strata): per tier, the last time each chunk (1 MiB in NVM, 4 MiB in SSD)
//! was written by a digest or moved into the tier.

use crate::digest::parallel::CoreLock;
use crate::store::maptree;
use crate::store::shared::{Shared, Work};
use crate::util::{eio, now_ns};
use cairn_format::inode::{Inode, Kind};
use cairn_format::map::{entry_block, entry_tier, tier_entry, TIER_NAMES};
use cairn_format::tier::SEG_WRITTEN_NS;
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use cairn_proto::MigrationStatus;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::Mutex;

/// When each chunk of file data was last used, per tier (a logical clock), and how
/// often clients read the chunks of the lower tiers (their hints).
#[derive(Debug)]
pub(crate) struct Recency {
    /// Chunk size per tier, in blocks (`recency_grain_nvm_kib`, `recency_grain_ssd_kib`
    /// in `cairn.toml`: 1 MiB in NVM, 4 MiB below by default).
    grains: [u64; 3],
    tick: u64,
    last: HashMap<(u8, u64, u64), u64>,
    /// (tier, inode, chunk) -> (reads hinted, time of the last one in ns).
    reads: HashMap<(u8, u64, u64), (u32, i64)>,
    /// Per slot: how many of its hints were consumed.
    tails: HashMap<u32, u64>,
}

/// Reads of a lower-tier chunk (within [`HEAT_WINDOW_NS`] of each other) that make it
/// worth promoting.
pub(crate) const PROMOTE_READS: u32 = 4;
/// A chunk not read for this long starts counting again (30 s).
const HEAT_WINDOW_NS: i64 = 30_000_000_000;

/// Consume the read hints the clients of `slots` wrote into their client pages since
/// the last call (`cairn_format::slot::client_page`). Hints are untrusted: each names an
/// inode and a file block, and counts only if that block of a live regular file is in a
/// lower tier now. A client that wrote more hints than its ring holds lost the oldest.
pub(crate) fn drain_hints(sh: &mut Shared, slots: &[u32]) {
    use cairn_format::slot::client_page::{HINT_BASE, HINT_HEAD, HINT_SLOTS};
    let now = now_ns();
    for &slot in slots {
        let cp = sh.layout.client_page_off(slot) as usize;
        let Ok(head) = sh.map().load_u64(cp + HINT_HEAD as usize) else {
            continue;
        };
        let tail = sh.recency.tails.get(&slot).copied().unwrap_or(0);
        // A reset client page (new client) starts again from 0.
        let tail = if head < tail { 0 } else { tail };
        let from = tail.max(head.saturating_sub(HINT_SLOTS));
        for n in from..head {
            let off = cp + (HINT_BASE + (n % HINT_SLOTS) * 16) as usize;
            let (Ok(ino), Ok(fblk)) = (sh.map().load_u64(off), sh.map().load_u64(off + 8)) else {
                continue;
            };
            if !sh.layout.ino_valid(ino) || !sh.inodes.is_used(ino) {
                continue;
            }
            let Ok(inode) = sh.inode(ino) else { continue };
            if inode.attrs.kind != Kind::File {
                continue;
            }
            let Ok(Some(e)) = sh.area.block_of(&inode, fblk) else {
                continue;
            };
            let tier = entry_tier(e);
            if tier == 0 {
                continue;
            }
            let r = sh
                .recency
                .reads
                .entry((tier, ino, fblk / sh.recency.grain(tier)))
                .or_insert((0, now));
            if now - r.1 > HEAT_WINDOW_NS {
                r.0 = 0;
            }
            *r = (r.0.saturating_add(1), now);
            sh.recency.touch(tier, ino, fblk, fblk);
        }
        sh.recency.tails.insert(slot, head);
    }
}

/// The blocks of the chunks of tier `from` clients read most (at least
/// [`PROMOTE_READS`] times), at most `max`; their counts are forgotten.
fn select_hot(sh: &mut Shared, from: u8, max: u64) -> io::Result<Vec<Move>> {
    let now = now_ns();
    sh.recency.reads.retain(|_, v| now - v.1 <= HEAT_WINDOW_NS);
    let mut hot: Vec<(u32, u64, u64)> = sh
        .recency
        .reads
        .iter()
        .filter(|(k, v)| k.0 == from && v.0 >= PROMOTE_READS && now - v.1 <= HEAT_WINDOW_NS)
        .map(|(k, v)| (v.0, k.1, k.2))
        .collect();
    hot.sort_by(|a, b| b.cmp(a));
    let g = sh.recency.grain(from);
    let mut out = Vec::new();
    for (_, ino, chunk) in hot {
        if out.len() as u64 >= max {
            break;
        }
        sh.recency.reads.remove(&(from, ino, chunk));
        let range = chunk * g..(chunk + 1) * g;
        let v = leaves_of(sh, ino, &mut |fb, e| {
            range.contains(&fb) && entry_tier(e) == from
        })?;
        let room = (max - out.len() as u64) as usize;
        out.extend(
            v.into_iter()
                .take(room)
                .map(|(fblk, old)| Move { ino, fblk, old }),
        );
    }
    Ok(out)
}

/// Blocks tier `tier` can take by promotion without passing `limit_pct` of its capacity
/// (its low watermark; a lower tier: a segment or nothing).
fn promotion_room(sh: &Shared, tier: u8, limit_pct: u64) -> u64 {
    let (used, cap) = Migrator::usage(sh, tier);
    let room = (cap * limit_pct / 100).saturating_sub(used);
    match sh.tier(tier) {
        Some(t) if room < t.geom.segment_blocks => 0,
        Some(t) => t.geom.segment_blocks,
        None => room.min(PROMOTE_MAX),
    }
}

/// Fewest blocks worth a promotion round into NVM (64 KiB).
const PROMOTE_MIN: u64 = 16;

impl Default for Recency {
    fn default() -> Recency {
        Recency::new(1024, 4096)
    }
}

impl Recency {
    /// Chunks of `nvm_kib` in NVM and `lower_kib` in the lower tiers (at least 4 KiB).
    pub(crate) fn new(nvm_kib: u64, lower_kib: u64) -> Recency {
        let b = |kib: u64| (kib / 4).max(1);
        Recency {
            grains: [b(nvm_kib), b(lower_kib), b(lower_kib)],
            tick: 0,
            last: HashMap::new(),
            reads: HashMap::new(),
            tails: HashMap::new(),
        }
    }

    /// The chunk size of `tier`, in blocks.
    pub(crate) fn grain(&self, tier: u8) -> u64 {
        self.grains[tier.min(2) as usize]
    }

    /// File blocks `first..=last` of `ino` in `tier` were just used.
    pub(crate) fn touch(&mut self, tier: u8, ino: u64, first: u64, last: u64) {
        self.tick += 1;
        let g = self.grain(tier);
        for c in first / g..=last / g {
            self.last.insert((tier, ino, c), self.tick);
        }
    }

    pub(crate) fn get(&self, tier: u8, ino: u64, chunk: u64) -> u64 {
        self.last.get(&(tier, ino, chunk)).copied().unwrap_or(0)
    }
}

/// One block to move: file block `fblk` of `ino`, whose map entry was `old`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Move {
    pub ino: u64,
    pub fblk: u64,
    pub old: u64,
}

/// A prepared round: its destination, its moves, the epoch it holds and the in-place
/// sequence of superpage extents when it began.
type Prepared = (Dest, Vec<Move>, (u64, u64));

/// What a round does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundKind {
    /// The coldest data of `from` to the tier below.
    Migrate,
    /// The live blocks of `from`'s emptiest, oldest segments to a fresh segment of it.
    Clean,
    /// Data of `from` that clients read often to the tier above.
    Promote,
    /// The live blocks of `from`'s best segments (by cost-benefit) to the tier below,
    /// which frees those segments whatever their blocks' recency.
    Evacuate,
    /// NVM only: the 4 KiB blocks of its emptiest, coldest 2 MiB chunks to other NVM
    /// blocks, which frees whole superpage extents (`crate::superpage::compact`).
    Compact,
}

/// Where a round writes.
#[derive(Debug)]
enum Dest {
    /// A segment of a lower tier, from its block `first`.
    Segment { seg: u64, first: u64 },
    /// NVM blocks allocated for the round (a promotion into NVM), one per move.
    Nvm(Vec<u64>),
}

/// Most blocks one promotion into NVM moves (4 MiB).
pub(crate) const PROMOTE_MAX: u64 = 1024;

/// Every block of a regular file's map in the tier(s) `want` accepts, grouped by inode.
fn file_blocks(
    sh: &Shared,
    want: &mut dyn FnMut(u64) -> bool,
) -> io::Result<BTreeMap<u64, Vec<(u64, u64)>>> {
    let mut out = BTreeMap::new();
    for ino in 1..sh.layout.inode_count {
        if !sh.inodes.is_used(ino) {
            continue;
        }
        let v = leaves_of(sh, ino, &mut |_, e| want(e))?;
        if !v.is_empty() {
            out.insert(ino, v);
        }
    }
    Ok(out)
}

/// The (file block, entry) leaves of regular file `ino` that `want` accepts (none if
/// it is not a readable regular file).
fn leaves_of(
    sh: &Shared,
    ino: u64,
    want: &mut dyn FnMut(u64, u64) -> bool,
) -> io::Result<Vec<(u64, u64)>> {
    let mut v = Vec::new();
    let Ok(inode) = sh.inode(ino) else {
        return Ok(v);
    };
    if inode.attrs.kind != Kind::File {
        return Ok(v);
    }
    maptree::walk(
        sh,
        inode.map_root,
        inode.map_height,
        &mut |_| {},
        &mut |fb, e| {
            if want(fb, e) {
                v.push((fb, e));
            }
        },
    )?;
    Ok(v)
}

/// The coldest blocks of tier `from`, at most `max`, whole chunks first. Forgets the
/// recency of chunks that no longer hold blocks there.
fn select_cold(sh: &mut Shared, from: u8, max: u64) -> io::Result<Vec<Move>> {
    let all = file_blocks(sh, &mut |e| entry_tier(e) == from)?;
    let g = sh.recency.grain(from);
    // (recency, inode, chunk, its blocks)
    type Chunk = (u64, u64, u64, Vec<(u64, u64)>);
    let mut chunks: Vec<Chunk> = Vec::new();
    for (ino, blocks) in all {
        let mut cur: Option<(u64, Vec<(u64, u64)>)> = None;
        for (fb, e) in blocks {
            match &mut cur {
                Some((c, v)) if *c == fb / g => v.push((fb, e)),
                _ => {
                    if let Some((c, v)) = cur.take() {
                        chunks.push((sh.recency.get(from, ino, c), ino, c, v));
                    }
                    cur = Some((fb / g, vec![(fb, e)]));
                }
            }
        }
        if let Some((c, v)) = cur {
            chunks.push((sh.recency.get(from, ino, c), ino, c, v));
        }
    }
    let seen: std::collections::HashSet<(u64, u64)> = chunks.iter().map(|c| (c.1, c.2)).collect();
    sh.recency
        .last
        .retain(|&(t, ino, c), _| t != from || seen.contains(&(ino, c)));
    chunks.sort_by_key(|c| (c.0, c.1, c.2));
    // NVM chunks are superpage extents or hold several (the grain is at least 2 MiB
    // with superpages, `Core::open`): an extent moves whole or not at all.
    let whole = from == 0 && sh.superpages.enabled;
    let mut out = Vec::new();
    for (_, ino, _, v) in chunks {
        if whole && !out.is_empty() && out.len() + v.len() > max as usize {
            continue;
        }
        for (fblk, old) in v {
            if out.len() as u64 >= max {
                return Ok(out);
            }
            out.push(Move { ino, fblk, old });
        }
    }
    Ok(out)
}

/// Victim segments of lower tier `tier` ([`pick_victims`]: `room` blocks to fill, at
/// least `min` victims) and the live blocks they hold.
fn select_victims(sh: &Shared, tier: u8, room: u64, min: usize) -> io::Result<Vec<Move>> {
    let Some(t) = sh.tier(tier) else {
        return Ok(Vec::new());
    };
    let now = now_ns().max(0) as u64;
    let cands: Vec<(u64, u64, f64)> = (1..t.geom.segments)
        .map(|s| {
            let off = sh.layout.seg_entry_off(tier, s) + SEG_WRITTEN_NS;
            let written = sh.map().load_u64(off as usize).unwrap_or(0);
            (s, t.seg_in_use(s), now.saturating_sub(written) as f64 / 1e9)
        })
        .collect();
    let victims: std::collections::HashSet<u64> =
        pick_victims(&cands, t.geom.segment_blocks, room, min)
            .into_iter()
            .collect();
    if victims.is_empty() {
        return Ok(Vec::new());
    }
    let geom = t.geom;
    let all = file_blocks(sh, &mut |e| {
        entry_tier(e) == tier && victims.contains(&geom.segment_of(entry_block(e)))
    })?;
    Ok(all
        .into_iter()
        .flat_map(|(ino, v)| {
            v.into_iter()
                .map(move |(fblk, old)| Move { ino, fblk, old })
        })
        .collect())
}

/// Victims among segments of `sb` blocks given as (segment, live blocks, age in
/// seconds): best cost-benefit first (Rosenblum and Ousterhout's `(1 − u) × age /
/// (1 + u)`, `u` the live fraction), as many as fit their live blocks into `room`
/// blocks (one segment of the tier they go to), and none unless at least `min`.
/// Cleaning compacts into the same tier (`room = sb`, `min = 2`: segments are written
/// once, so compacting one victim into one new segment gains nothing, and full
/// segments are no candidates); evacuation moves victims' blocks a tier down
/// (`min = 1`: any victim frees its segment). Empty segments are never victims.
fn pick_victims(cands: &[(u64, u64, f64)], sb: u64, room: u64, min: usize) -> Vec<u64> {
    let mut scored: Vec<(f64, u64, u64)> = cands
        .iter()
        .filter(|c| c.1 > 0 && c.1 <= room && (min < 2 || c.1 < sb))
        .map(|&(s, live, age)| {
            let u = live as f64 / sb as f64;
            ((1.0 - u) * (age + 1.0) / (1.0 + u), s, live)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut victims = Vec::new();
    let mut total = 0;
    for (_, s, live) in scored {
        if total + live <= room {
            victims.push(s);
            total += live;
        }
    }
    if victims.len() < min {
        victims.clear();
    }
    victims
}

/// Runs rounds (one at a time per target tier, so that a round into the SSD and one
/// into the HDD overlap) and reports those in flight.
#[derive(Debug, Default)]
pub(crate) struct Migrator {
    /// By target tier.
    running: [Mutex<()>; 3],
    /// By target tier.
    progress: Mutex<[Option<MigrationStatus>; 3]>,
    /// Rung by [`Migrator::kick`]: the background policy should run now.
    kicked: crate::util::Doorbell,
}

/// Bytes of `n` blocks.
fn bytes(n: u64) -> u64 {
    n * BLOCK_SIZE_U64
}

impl Migrator {
    /// Whether NVM is above the high watermark (with lower tiers): then the daemon
    /// wakes the background policy at once instead of at its next period.
    pub(crate) fn nvm_high(sh: &Shared, high_pct: u32) -> bool {
        let (used, cap) = Self::usage(sh, 0);
        !sh.tiers.is_empty() && used * 100 >= cap * high_pct as u64
    }

    /// Wake the background policy's threads.
    pub(crate) fn kick(&self) {
        self.kicked.ring();
    }

    /// Wait until kicked (after `seen`, the count a previous wait returned) or `period`
    /// passed; returns the kick count.
    pub(crate) fn wait(&self, seen: u64, period: std::time::Duration) -> u64 {
        self.kicked.wait(seen, period)
    }

    /// Wait for the rounds in flight and keep new ones from starting while the guards
    /// live.
    pub(crate) fn pause(&self) -> Vec<std::sync::MutexGuard<'_, ()>> {
        // Rounds take one of these at a time, so taking all in order cannot deadlock.
        self.running
            .iter()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    /// The round in flight, if any.
    pub(crate) fn progress(&self) -> Option<MigrationStatus> {
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().flatten().next().cloned()
    }

    fn set_progress(&self, to: u8, p: Option<MigrationStatus>) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())[to as usize] = p;
    }

    /// Run one round of `kind` from tier `from`: at most one segment of the target tier
    /// (a promotion into NVM: at most [`PROMOTE_MAX`] blocks of its free space), filled
    /// as far as there is data to move. Returns the blocks moved (0: nothing to move or
    /// no room).
    pub(crate) fn round(&self, core: &CoreLock, kind: RoundKind, from: u8) -> io::Result<u64> {
        self.round_when(core, kind, from, &|_| true)
    }

    /// [`Migrator::round`], if `needed` still says so once the round has the target
    /// tier to itself (a round that was in flight may have made it unnecessary).
    fn round_when(
        &self,
        core: &CoreLock,
        kind: RoundKind,
        from: u8,
        needed: &dyn Fn(&mut crate::core::Core) -> bool,
    ) -> io::Result<u64> {
        let to = match kind {
            RoundKind::Migrate | RoundKind::Evacuate => from + 1,
            RoundKind::Clean | RoundKind::Compact => from,
            RoundKind::Promote => from.wrapping_sub(1),
        };
        let Some(lock) = self.running.get(to as usize) else {
            return Err(eio(format!("no tier {to}")));
        };
        let _one = lock.lock().unwrap_or_else(|e| e.into_inner());
        let Some((dest, moves, (epoch, since))) = self.prepare(core, kind, from, to, needed)?
        else {
            return Ok(0);
        };
        let kind_name = match kind {
            RoundKind::Migrate => "migrate",
            RoundKind::Clean => "clean",
            RoundKind::Promote => "promote",
            RoundKind::Evacuate => "evacuate",
            RoundKind::Compact => "compact",
        };
        self.set_progress(
            to,
            Some(MigrationStatus {
                kind: kind_name.into(),
                from: TIER_NAMES[from as usize].into(),
                to: TIER_NAMES[to as usize].into(),
                bytes_done: 0,
                bytes_planned: bytes(moves.len() as u64),
            }),
        );
        let r = self.copy_and_switch(core, kind, (from, to), &dest, &moves, since);
        self.set_progress(to, None);
        finish_round(core, to, epoch, &dest, &r);
        r.map(|(n, _)| n)
    }

    /// Phase 1 of a round, under the core lock: unless the store stops or `needed` says
    /// no, the destination (a free segment of tier `to`, or NVM blocks), the moves (the
    /// data to copy), the epoch the round holds and the in-place sequence of superpage
    /// extents (`Superpages::inplace_seq`) now. `None`: nothing to do.
    fn prepare(
        &self,
        core: &CoreLock,
        kind: RoundKind,
        from: u8,
        to: u8,
        needed: &dyn Fn(&mut crate::core::Core) -> bool,
    ) -> io::Result<Option<Prepared>> {
        let mut c = core.serial();
        if c.stopped || !needed(&mut c) {
            return Ok(None);
        }
        let low = c.cfg.migrate_low_pct.clamp(1, 100) as u64;
        let room = c.available_credits().min(promotion_room(&c.sh, 0, low));
        let sh = &mut c.sh;
        let dest = if to == 0 {
            Dest::Nvm(Vec::new())
        } else {
            let Some(t) = sh.tier_mut(to) else {
                return Err(eio(format!(
                    "the store has no {} tier",
                    TIER_NAMES[to as usize]
                )));
            };
            let sb = t.geom.segment_blocks;
            // Migration keeps one segment back, so that cleaning can always proceed.
            let reserve = if kind == RoundKind::Clean { 0 } else { 1 };
            let Some(seg) = t.take_segment(reserve) else {
                return Ok(None);
            };
            Dest::Segment {
                seg,
                first: seg * sb,
            }
        };
        let want = match dest {
            // A compaction moves blocks within NVM (each old one is freed after it).
            Dest::Nvm(_) if kind == RoundKind::Compact => crate::superpage::compact::ROUND_MAX,
            Dest::Nvm(_) => room,
            Dest::Segment { .. } => sh.tier(to).map_or(0, |t| t.geom.segment_blocks),
        };
        let mut victims = Vec::new();
        let moves = match kind {
            // A whole segment's worth (segments are written once).
            RoundKind::Migrate => select_cold(sh, from, want),
            RoundKind::Clean => select_victims(sh, from, want, 2),
            RoundKind::Evacuate => select_victims(sh, from, want, 1),
            RoundKind::Promote => select_hot(sh, from, want),
            RoundKind::Compact => crate::superpage::compact::select(sh, want).map(|(m, v)| {
                victims = v;
                m
            }),
        };
        let release = |sh: &mut Shared, dest: &Dest| {
            if let (Dest::Segment { seg, .. }, Some(t)) = (dest, sh.tier_mut(to)) {
                t.release_segment(*seg);
            }
            sh.trim_empty_segments();
        };
        let moves = match moves {
            Ok(m) if !m.is_empty() => m,
            other => {
                release(sh, &dest);
                return other.map(|_| None);
            }
        };
        let dest = match dest {
            Dest::Nvm(_) => {
                // A compaction's copies go outside the chunks it empties.
                let held = crate::superpage::compact::hold_free(sh, &victims);
                let mut w = Work::default();
                let mut short = false;
                for _ in &moves {
                    if sh.alloc_block(&mut w).is_err() {
                        short = true;
                        break;
                    }
                }
                for b in held {
                    sh.blocks.free(b);
                }
                if short {
                    sh.rollback(&w);
                    return Ok(None);
                }
                Dest::Nvm(w.allocated)
            }
            Dest::Segment { seg, first } => {
                let off = sh.layout.seg_entry_off(to, seg) as usize;
                let gen = sh.map().load_u64(off)?;
                sh.map().store_u64(off, gen + 1)?;
                sh.map()
                    .store_u64(off + SEG_WRITTEN_NS as usize, now_ns().max(0) as u64)?;
                sh.map().persist(off, 16)?;
                Dest::Segment { seg, first }
            }
        };
        let epoch = sh.epoch();
        sh.held_epochs.push(epoch);
        Ok(Some((dest, moves, (epoch, sh.superpages.inplace_seq))))
    }

    /// Phases 2 and 3 of a round. Returns the blocks moved and, for NVM destinations,
    /// the new blocks that were published.
    fn copy_and_switch(
        &self,
        core: &CoreLock,
        kind: RoundKind,
        (from, to): (u8, u8),
        dest: &Dest,
        moves: &[Move],
        since: u64,
    ) -> io::Result<(u64, HashSet<u64>)> {
        // Phase 2: read every block, write them to the destination and make them durable.
        let area = core.serial().sh.area.clone();
        let buf = read_moves(&area, moves)?;
        write_copy(&area, to, dest, &buf)?;
        drop(buf);
        if let Some(p) =
            self.progress.lock().unwrap_or_else(|e| e.into_inner())[to as usize].as_mut()
        {
            p.bytes_done = p.bytes_planned;
        }
        // Phase 3: switch the entries that still name the copied blocks.
        let mut c = core.serial();
        if c.stopped {
            return Ok((0, Default::default()));
        }
        let used = switch_maps(&mut c.sh, to, dest, moves, since)?;
        let sh = &mut c.sh;
        let moved = used.len() as u64;
        let b = bytes(moved);
        match kind {
            RoundKind::Migrate | RoundKind::Evacuate => {
                sh.traffic[from as usize].bytes_migrated_down += b
            }
            RoundKind::Clean => sh.traffic[to as usize].bytes_cleaned += b,
            RoundKind::Promote => sh.traffic[to as usize].bytes_migrated_up += b,
            RoundKind::Compact => {
                sh.superpages.bytes_compacted += b;
                sh.persist_superpage_counters()?;
            }
        }
        sh.persist_traffic()?;
        Ok((moved, used))
    }

    /// Make tier `to` able to take a migration round (a free segment beyond the reserve):
    /// migrate its own coldest data further down, else clean it. False if neither helped.
    fn room_in(&self, core: &CoreLock, to: u8) -> bool {
        let has_room = |c: &CoreLock| {
            let mut c = c.serial();
            c.reclaim();
            c.sh.tier(to).is_some_and(|t| t.free_segments() > 1)
        };
        if has_room(core) {
            return true;
        }
        let below = core.serial().sh.tier(to + 1).is_some();
        if below && self.run(core, RoundKind::Migrate, to) > 0 && has_room(core) {
            return true;
        }
        // The coldest chunks are spread over segments that stay partly live: move whole
        // segments down instead, or compact them in place.
        if below && self.run(core, RoundKind::Evacuate, to) > 0 && has_room(core) {
            return true;
        }
        self.run(core, RoundKind::Clean, to);
        has_room(core)
    }

    /// A round, with failures logged (0 moved).
    fn run(&self, core: &CoreLock, kind: RoundKind, from: u8) -> u64 {
        match self.round(core, kind, from) {
            Ok(n) => {
                if n > 0 && matches!(kind, RoundKind::Clean | RoundKind::Evacuate) {
                    let free = core.serial().sh.tier(from).map_or(0, |t| t.free_segments());
                    tracing::info!(
                        "{} the {} tier: {} KiB moved, {free} segments free",
                        if kind == RoundKind::Clean {
                            "cleaned"
                        } else {
                            "evacuated"
                        },
                        TIER_NAMES[from as usize],
                        bytes(n) >> 10
                    );
                }
                n
            }
            Err(e) => {
                tracing::warn!(
                    "{kind:?} round from the {} tier failed: {e}",
                    TIER_NAMES[from as usize]
                );
                0
            }
        }
    }

    /// One compaction round of NVM (`RoundKind::Compact`). Returns the blocks moved.
    pub(crate) fn compact(&self, core: &CoreLock) -> u64 {
        self.run(core, RoundKind::Compact, 0)
    }

    /// One cleaning round on lower tier `t`, asked for by a client. Returns the blocks
    /// moved.
    pub(crate) fn clean(&self, core: &CoreLock, t: u8) -> u64 {
        self.run(core, RoundKind::Clean, t)
    }

    /// Move at least `max` blocks of the coldest data of `from` one tier down (in whole
    /// segments, so up to a segment more), making room below first when needed. Returns
    /// the blocks moved.
    pub(crate) fn migrate(&self, core: &CoreLock, from: u8, max: u64) -> u64 {
        let mut moved = 0;
        while moved < max {
            if !self.room_in(core, from + 1) {
                break;
            }
            let n = self.run(core, RoundKind::Migrate, from);
            if n == 0 {
                break;
            }
            moved += n;
        }
        moved
    }

    /// Move NVM's coldest data down while `short` says NVM lacks space (a client waits
    /// for it): one round at a time, each started only if the rounds before (this
    /// caller's or the background's) did not free enough.
    pub(crate) fn free_nvm(&self, core: &CoreLock, short: &dyn Fn(&mut crate::core::Core) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if !short(&mut core.serial()) {
                return;
            }
            let moved = self.room_in(core, 1)
                && match self.round_when(core, RoundKind::Migrate, 0, short) {
                    Ok(n) => n > 0,
                    Err(e) => {
                        tracing::warn!("migration for a waiting client failed: {e}");
                        false
                    }
                };
            if moved {
                continue;
            }
            // Nothing could move now. Rounds in flight hold back the blocks they and
            // others replaced; once they end there may be room: wait for them (a while),
            // else every tier is full.
            let busy = !core.serial().sh.held_epochs.is_empty();
            if !busy || std::time::Instant::now() >= deadline {
                let c = core.serial();
                let free: Vec<u64> = c.sh.tiers.iter().map(|t| t.free_segments()).collect();
                tracing::info!(
                    "no room for a waiting client: NVM {} blocks free, lower tiers' free \
                     segments {free:?}",
                    c.sh.blocks.free_count()
                );
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Blocks of tier `tier` in use and its capacity.
    pub(crate) fn usage(sh: &Shared, tier: u8) -> (u64, u64) {
        match tier {
            0 => (
                sh.blocks.capacity() - sh.blocks.free_count(),
                sh.blocks.capacity(),
            ),
            t => sh
                .tier(t)
                .map_or((0, 0), |t| (t.used_blocks(), t.capacity())),
        }
    }

    /// The background policy for tier `from`, run periodically by one thread per tier
    /// that has a tier below (so that the cascade overlaps): above the high watermark
    /// the tier moves its coldest data down to the low watermark; a lower tier also
    /// moves a segment down as soon as it has no free segment to spare beyond the one
    /// reserved for cleaning (so that the tier above never waits for it), and is
    /// cleaned when it has none beyond the reserved one. Returns whether it did work.
    pub(crate) fn tick(&self, core: &CoreLock, from: u8) -> bool {
        let promoted = self.promote_if_hot(core, from);
        let (high, low, has_below, free) = {
            let c = core.serial();
            (
                c.cfg.migrate_high_pct.clamp(1, 100) as u64,
                c.cfg.migrate_low_pct.clamp(0, 99) as u64,
                c.sh.tier(from + 1).is_some(),
                c.sh.tier(from).map(|t| t.free_segments()),
            )
        };
        let mut worked = false;
        if has_below {
            let (used, cap) = Self::usage(&core.serial().sh, from);
            let spare = free.is_none_or(|f| f > 2);
            if cap == 0 || (used * 100 < cap * high && spare) {
                return self.clean_if_starved(core, from) || promoted;
            }
            let goal = cap * low.min(high) / 100;
            let want = used.saturating_sub(goal).max(1);
            let n = self.migrate(core, from, want);
            if n > 0 {
                worked = true;
                let (after, _) = Self::usage(&core.serial().sh, from);
                tracing::info!(
                    "migrated {} MiB from the {} tier to the {} tier ({}% -> {}% used)",
                    bytes(n) >> 20,
                    TIER_NAMES[from as usize],
                    TIER_NAMES[from as usize + 1],
                    used * 100 / cap,
                    after * 100 / cap
                );
            }
            // A lower tier whose coldest chunks lie in segments that stay partly live
            // frees segments by moving whole ones down.
            let spare = {
                let mut c = core.serial();
                c.reclaim();
                c.sh.tier(from).is_none_or(|t| t.free_segments() > 2)
            };
            if !spare && self.room_in(core, from + 1) {
                worked |= self.run(core, RoundKind::Evacuate, from) > 0;
            }
        }
        self.clean_if_starved(core, from) || worked || promoted
    }

    /// Read hints first; then, for a lower tier whose data clients read often, one
    /// round moving the hottest of it up, into room the tier above has.
    fn promote_if_hot(&self, core: &CoreLock, from: u8) -> bool {
        let room = {
            let mut c = core.serial();
            let slots = c.reader_slots();
            drain_hints(&mut c.sh, &slots);
            // Promotions fill the tier above only up to its low watermark: above it,
            // its own migration would send them (or what they displace) straight back
            // down. Measured on `bench tiers`' Zipfian mix with the high watermark: NVM
            // moved 1.4 GiB down and 1.4 GiB up for 156 MiB written.
            let limit = c.cfg.migrate_low_pct;
            let hot =
                c.sh.recency
                    .reads
                    .iter()
                    .any(|(k, v)| k.0 == from && v.0 >= PROMOTE_READS);
            if from == 0 || !hot {
                return false;
            }
            promotion_room(&c.sh, from - 1, limit.clamp(1, 100) as u64)
        };
        // Only into room the tier above has below its high watermark: making room by
        // moving its coldest data down first costs a whole segment per promotion, and
        // churned the lower tiers under a scattered hot set (measured: the SSD wrote 15
        // bytes per byte the application wrote in `bench tiers`' Zipfian mix).
        if room < PROMOTE_MIN {
            return false;
        }
        let n = self.run(core, RoundKind::Promote, from);
        if n > 0 {
            tracing::info!(
                "promoted {} KiB read often from the {} tier to the {} tier",
                bytes(n) >> 10,
                TIER_NAMES[from as usize],
                TIER_NAMES[from as usize - 1]
            );
        }
        n > 0
    }

    /// Clean lower tier `t` if fewer than `clean_free_pct` of its segments are free, or
    /// none beyond the reserved one.
    fn clean_if_starved(&self, core: &CoreLock, t: u8) -> bool {
        let starved = {
            let c = core.serial();
            let pct = c.cfg.clean_free_pct.min(100) as u64;
            c.sh.tier(t).is_some_and(|ta| {
                let free = ta.free_segments();
                free <= 1 || free * 100 < ta.data_segments() * pct
            })
        };
        starved && self.run(core, RoundKind::Clean, t) > 0
    }
}

/// The blocks of a round's moves, read in order (one read per run of blocks consecutive
/// on a lower tier).
fn read_moves(area: &cairn_area::Area, moves: &[Move]) -> io::Result<cairn_media::AlignedBuf> {
    let mut buf = cairn_media::AlignedBuf::zeroed(moves.len() * BLOCK_SIZE);
    let mut i = 0;
    while i < moves.len() {
        let e = moves[i].old;
        if entry_tier(e) == 0 {
            area.read_leaf(e, &mut buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE])?;
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < moves.len() && moves[j].old == e + (j - i) as u64 {
            j += 1;
        }
        let at = entry_block(e) * BLOCK_SIZE_U64;
        area.read_tier_aligned(entry_tier(e), at, &mut buf[i * BLOCK_SIZE..j * BLOCK_SIZE])?;
        i = j;
    }
    Ok(buf)
}

/// Write a round's copy and make it durable: a segment in one go and `fdatasync`ed
/// (with direct I/O where the tier allows it), or NVM blocks with non-temporal stores
/// and a fence.
fn write_copy(area: &cairn_area::Area, to: u8, dest: &Dest, buf: &[u8]) -> io::Result<()> {
    let name = TIER_NAMES[to as usize];
    match dest {
        Dest::Segment { seg, first } => {
            let f = area
                .tier_direct(to)
                .or_else(|| area.tier_file(to))
                .ok_or_else(|| eio(format!("the {name} tier is not attached")))?;
            cairn_media::emulate::write(to, buf.len());
            cairn_media::file::write_all_at(f, buf, first * BLOCK_SIZE_U64)
                .and_then(|()| cairn_media::file::sync_data(f))
                .map_err(|e| eio(format!("write of segment {seg} of the {name} tier: {e}")))?;
        }
        Dest::Nvm(blocks) => {
            for (i, &b) in blocks.iter().enumerate() {
                let data = &buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                area.map().write_nt((b * BLOCK_SIZE_U64) as usize, data)?;
            }
            cairn_media::fence();
        }
    }
    Ok(())
}

/// Switch, file by file, the map entries that still name the blocks a round copied to
/// their copies (one copy-on-write map update and inode write each), then retire the
/// old blocks and advance the epoch. Blocks of superpage extents are written in place
/// by digests: those of a file written so after the round began (`since`, the
/// in-place sequence then) stay. Returns the new entries now in use.
fn switch_maps(
    sh: &mut Shared,
    to: u8,
    dest: &Dest,
    moves: &[Move],
    since: u64,
) -> io::Result<HashSet<u64>> {
    let new_entry = |i: usize| match dest {
        Dest::Segment { first, .. } => tier_entry(to, first + i as u64),
        Dest::Nvm(blocks) => blocks[i],
    };
    let mut by_ino: BTreeMap<u64, Vec<(usize, &Move)>> = BTreeMap::new();
    for (i, m) in moves.iter().enumerate() {
        by_ino.entry(m.ino).or_default().push((i, m));
    }
    let mut retired = Vec::new();
    let mut used = HashSet::new();
    for (ino, ms) in by_ino {
        let Ok(old) = sh.inode(ino) else { continue };
        if old.attrs.kind != Kind::File {
            continue;
        }
        let stale_extents = sh.superpages.written_in_place_since(ino, since);
        let mut changes = Vec::new();
        for &(i, m) in &ms {
            if sh.area.block_of(&old, m.fblk)? == Some(m.old)
                && !(stale_extents && sh.area.huge_of(&old, m.fblk)?.is_some())
            {
                changes.push((m.fblk, new_entry(i)));
            }
        }
        // The map update takes its changes in file order, once each (the rounds
        // choose blocks chunk by chunk, coldest or hottest first).
        changes.sort_unstable_by_key(|c| c.0);
        changes.dedup_by_key(|c| c.0);
        if changes.is_empty() {
            continue;
        }
        let mut w = Work::default();
        let r = match maptree::update(
            sh,
            &mut w,
            old.map_root,
            old.map_height,
            &changes,
            u64::MAX,
            true,
        ) {
            Ok(r) => r,
            Err(e) => {
                // No NVM block for a map node: this inode stays where it is.
                sh.rollback(&w);
                if cairn_area::errno_of(&e) == libc::ENOSPC {
                    continue;
                }
                return Err(e);
            }
        };
        cairn_media::fence();
        // Moving blocks one for one leaves the count alone, except where an extent is
        // split (its leaf node is new).
        let new = Inode {
            map_root: r.root,
            map_height: r.height,
            blocks: (old.blocks as i64 + r.delta).max(0) as u64,
            ..old
        };
        sh.write_inode(ino, &new)?;
        if to == 0 {
            // Data back in NVM may fill a range enough for a superpage extent.
            sh.superpages.note_written(ino, changes.iter().map(|c| c.0));
        }
        for &(f, e) in &changes {
            if let Some(t) = sh.tier_mut(to) {
                t.mark_used(entry_block(e));
            }
            used.insert(e);
            sh.recency.touch(to, ino, f, f);
        }
        sh.counters.shared_bytes_written += w.bytes;
        retired.extend(w.retired);
    }
    cairn_media::fence();
    sh.retire_and_advance(retired)?;
    Ok(used)
}

/// After a round: drop its epoch hold, give its destination segment back to the free
/// pool's bookkeeping or free the NVM blocks it did not publish, and reclaim what it
/// replaced (so that the caller sees the space; emptied segments are trimmed).
fn finish_round(
    core: &CoreLock,
    to: u8,
    epoch: u64,
    dest: &Dest,
    r: &io::Result<(u64, HashSet<u64>)>,
) {
    let mut c = core.serial();
    let sh = &mut c.sh;
    // Only this round's hold (another round may hold the same epoch).
    if let Some(i) = sh.held_epochs.iter().position(|&e| e == epoch) {
        sh.held_epochs.swap_remove(i);
    }
    match dest {
        Dest::Segment { seg, .. } => {
            if let Some(t) = sh.tier_mut(to) {
                t.release_segment(*seg);
            }
        }
        Dest::Nvm(blocks) => {
            // Blocks whose switch did not happen were never published.
            let unused: Vec<u64> = match r {
                Ok((_, used)) => blocks
                    .iter()
                    .filter(|b| !used.contains(b))
                    .copied()
                    .collect(),
                Err(_) => blocks.clone(),
            };
            for b in unused {
                sh.blocks.free(b);
            }
        }
    }
    // What the round replaced can go now that its hold is gone (so that the caller
    // sees the space), and emptied segments are trimmed.
    c.reclaim();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_by_cost_benefit_that_fit_one_segment() {
        // 100-block segments: (segment, live, age s).
        let c = [
            (1, 0, 50.0),   // empty: freed without cleaning
            (2, 100, 50.0), // full: nothing to gain
            (3, 10, 1.0),
            (4, 50, 100.0),
            (5, 30, 100.0),
            (6, 90, 1000.0),
        ];
        // Best first: 5 (30% live, old), then 6 (90% live but very old), 4, 3; 5 + 6 do
        // not fit in 100 blocks, 5 + 4 + 3 = 90 do.
        assert_eq!(pick_victims(&c, 100, 100, 2), vec![5, 4, 3]);
        // One that fits alone gains nothing by cleaning...
        let two = [(1, 60, 5.0), (2, 70, 5.0)];
        assert!(pick_victims(&two, 100, 100, 2).is_empty());
        // ...but evacuating it to the tier below frees its segment.
        assert_eq!(pick_victims(&two, 100, 100, 1), vec![1]);
        // Evacuation takes full segments too, and fills a bigger target segment.
        assert_eq!(pick_victims(&c, 100, 400, 1), vec![5, 6, 4, 3, 2]);
        assert!(pick_victims(&[], 100, 100, 2).is_empty());
        // Age breaks the tie between equal live fractions.
        assert_eq!(
            pick_victims(&[(1, 40, 1.0), (2, 40, 9.0)], 100, 100, 2),
            vec![2, 1]
        );
    }

    #[test]
    fn recency_chunks() {
        let mut r = Recency::new(1024, 4096);
        assert_eq!((r.grain(0), r.grain(1), r.grain(2)), (256, 1024, 1024));
        r.touch(0, 7, 0, 600);
        assert_eq!(r.get(0, 7, 2), r.get(0, 7, 0));
        assert_eq!(r.get(0, 7, 3), 0, "never used: the coldest");
        r.touch(0, 7, 300, 300);
        assert!(r.get(0, 7, 1) > r.get(0, 7, 0));
    }
}
