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
//! crash inside step 3 leaves each inode either switched or not.
//!
//! Rounds into one tier run one at a time, except migration rounds: [`Migrator::migrate`]
//! keeps [`MIGRATE_DEPTH`] of them in flight, so that one round's copy is written while
//! the next one chooses and reads its blocks (a cluster, or a disk with a queue, is
//! never left idle between rounds). A round in flight keeps the blocks it copies from
//! the choice of the others (`Migrator::in_flight`); the switch's check of every entry
//! keeps any overlap with other rounds (a compaction of NVM, a digest) correct.
//!
//! This module runs the rounds and their policy; `super::select` chooses the blocks,
//! `super::copy` does steps 2 and 3, `super::recency` knows what is cold and what is hot.

use super::copy::{finish_round, read_moves, switch_maps, write_copy};
use super::recency::{drain_hints, select_hot};
use super::select::{select_cold, select_victims};
use crate::digest::parallel::CoreLock;
use crate::store::shared::{Shared, Work};
use crate::util::{eio, now_ns};
use cairn_format::map::{TIERS, TIER_NAMES};
use cairn_format::tier::SEG_WRITTEN_NS;
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use cairn_media::AlignedBuf;
use cairn_proto::MigrationStatus;
use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

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
pub(super) enum Dest {
    /// A segment of a lower tier, from its block `first`.
    Segment { seg: u64, first: u64 },
    /// NVM blocks allocated for the round (a promotion into NVM), one per move.
    Nvm(Vec<u64>),
}

/// Most blocks one promotion into NVM moves (4 MiB).
pub(crate) const PROMOTE_MAX: u64 = 1024;

/// Migration rounds one caller of [`Migrator::migrate`] keeps in flight.
pub(crate) const MIGRATE_DEPTH: usize = 2;

/// Runs rounds (rounds into different tiers overlap, and migration rounds into one
/// tier too) and reports those in flight.
#[derive(Debug, Default)]
pub(crate) struct Migrator {
    /// By target tier: migration rounds hold it shared, the others alone.
    running: [RwLock<()>; TIERS],
    /// The map entries (blocks) that migration rounds in flight copy: no other
    /// migration round chooses them.
    in_flight: Mutex<HashSet<u64>>,
    /// The rounds in flight, by round number.
    progress: Mutex<Vec<(u64, MigrationStatus)>>,
    /// Buffers of rounds that ended, for the next ones while rounds follow each other
    /// (a fresh buffer costs its page faults: about a fifth of a round's time into
    /// RADOS here); [`Migrator::trim`] lets them go.
    spare: Mutex<Vec<AlignedBuf>>,
    next_round: AtomicU64,
    /// By target tier: rounds into it failed (its device, or the cluster, failed):
    /// no round starts before the pause ends.
    paused: Mutex<[Option<Pause>; TIERS]>,
    /// Rung by [`Migrator::kick`]: the background policy should run now.
    kicked: crate::util::Doorbell,
}

/// A pause of the rounds into a tier after a failure: until `until`; the next failure
/// doubles `wait`, up to [`PAUSE_MAX`].
#[derive(Debug, Clone)]
struct Pause {
    until: std::time::Instant,
    wait: std::time::Duration,
    /// The failure's errno and message.
    why: (i32, String),
}

/// The first pause after a failed round, and the longest.
const PAUSE_MIN: std::time::Duration = std::time::Duration::from_secs(1);
const PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(30);

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
    pub(crate) fn pause(&self) -> Vec<std::sync::RwLockWriteGuard<'_, ()>> {
        // Rounds take one of these at a time, so taking all in order cannot deadlock.
        self.running
            .iter()
            .map(|m| m.write().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    /// A buffer of at least `len` bytes for a round's copy: a spare one if it is
    /// large enough.
    fn buffer(&self, len: usize) -> AlignedBuf {
        let mut spare = lock(&self.spare);
        match spare.iter().position(|b| b.len() >= len) {
            Some(i) => spare.swap_remove(i),
            None => AlignedBuf::zeroed(len),
        }
    }

    /// Keep a round's buffer for the next round, unless a device's thread still holds
    /// it (a write given up on).
    fn give_back(&self, buf: cairn_area::SharedBuf) {
        if let Ok(b) = std::sync::Arc::try_unwrap(buf) {
            let mut spare = lock(&self.spare);
            if spare.len() < MIGRATE_DEPTH {
                spare.push(b);
            }
        }
    }

    /// Let the spare buffers go while no round runs (the policy's threads, between
    /// their ticks).
    pub(crate) fn trim(&self) {
        if lock(&self.progress).is_empty() {
            lock(&self.spare).clear();
        }
    }

    /// The oldest round in flight, if any.
    pub(crate) fn progress(&self) -> Option<MigrationStatus> {
        lock(&self.progress).first().map(|(_, p)| p.clone())
    }

    /// Whether rounds into tier `to` are paused after a failure (they resume by
    /// themselves once the pause ends).
    pub(crate) fn paused(&self, to: u8) -> bool {
        let p = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        p[to as usize]
            .as_ref()
            .is_some_and(|p| std::time::Instant::now() < p.until)
    }

    /// Why rounds into `to` are paused, while they are: errno and message.
    pub(crate) fn failure(&self, to: u8) -> Option<(i32, String)> {
        let p = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        p[to as usize]
            .as_ref()
            .filter(|p| std::time::Instant::now() < p.until)
            .map(|p| p.why.clone())
    }

    /// A round into `to` ended: a failure pauses the next ones (longer after each
    /// failure in a row), a success ends the pause. A failure while a pause already
    /// runs (another round in flight failed first) leaves that pause as it is.
    fn round_ended(&self, to: u8, failed: Option<&io::Error>) {
        let mut p = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut p[to as usize];
        let now = std::time::Instant::now();
        *slot = match (failed, slot.take()) {
            (None, _) => None,
            (Some(_), Some(prev)) if now < prev.until => Some(prev),
            (Some(e), prev) => {
                let wait = prev.map_or(PAUSE_MIN, |p| (p.wait * 2).min(PAUSE_MAX));
                tracing::warn!(
                    "rounds into the {} tier paused for {} s",
                    TIER_NAMES[to as usize],
                    wait.as_secs()
                );
                Some(Pause {
                    until: now + wait,
                    wait,
                    why: (cairn_area::errno_of(e), cairn_area::error::message(e)),
                })
            }
        };
    }

    /// The tier a round of `kind` from `from` writes to (`None`: there is none).
    fn target(core: &CoreLock, kind: RoundKind, from: u8) -> Option<u8> {
        let l = core.serial().sh.layout;
        match kind {
            RoundKind::Migrate | RoundKind::Evacuate => l.below(from),
            RoundKind::Clean | RoundKind::Compact => Some(from),
            RoundKind::Promote => l.above(from),
        }
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
        let Some((to, running)) = Self::target(core, kind, from)
            .and_then(|to| Some((to, self.running.get(to as usize)?)))
        else {
            return Err(eio(format!(
                "a {kind:?} round from the {} tier has no tier to go to",
                TIER_NAMES[(from as usize).min(TIERS - 1)]
            )));
        };
        if self.paused(to) {
            return Ok(0);
        }
        let _shared;
        let _alone;
        if kind == RoundKind::Migrate {
            _shared = running.read().unwrap_or_else(|e| e.into_inner());
        } else {
            _alone = running.write().unwrap_or_else(|e| e.into_inner());
        }
        let Some((dest, moves, (epoch, since))) = self.prepare(core, kind, from, to, needed)?
        else {
            return Ok(0);
        };
        // A migration round's blocks, kept from the others' choice by `prepare`, are
        // given back when it ends.
        let claimed = (kind == RoundKind::Migrate).then(|| InFlight {
            migrator: self,
            entries: moves.iter().map(|m| m.old).collect(),
        });
        let kind_name = match kind {
            RoundKind::Migrate => "migrate",
            RoundKind::Clean => "clean",
            RoundKind::Promote => "promote",
            RoundKind::Evacuate => "evacuate",
            RoundKind::Compact => "compact",
        };
        let id = self.next_round.fetch_add(1, Ordering::Relaxed);
        lock(&self.progress).push((
            id,
            MigrationStatus {
                kind: kind_name.into(),
                from: TIER_NAMES[from as usize].into(),
                to: TIER_NAMES[to as usize].into(),
                bytes_done: 0,
                bytes_planned: bytes(moves.len() as u64),
            },
        ));
        let r = self.copy_and_switch(core, (id, kind), (from, to), &dest, &moves, since);
        lock(&self.progress).retain(|(i, _)| *i != id);
        self.round_ended(to, r.as_ref().err());
        finish_round(core, to, epoch, &dest, &r);
        drop(claimed);
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
            RoundKind::Migrate => select_cold(sh, from, want, &lock(&self.in_flight)),
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
        if kind == RoundKind::Migrate {
            let mut set = lock(&self.in_flight);
            for m in &moves {
                // The choice excluded every block in flight.
                assert!(set.insert(m.old), "block {:#x} chosen twice", m.old);
            }
        }
        let epoch = sh.epoch();
        sh.held_epochs.push(epoch);
        Ok(Some((dest, moves, (epoch, sh.superpages.inplace_seq))))
    }

    /// Phases 2 and 3 of a round. Returns the blocks moved and, for NVM destinations,
    /// the new blocks that were published.
    fn copy_and_switch(
        &self,
        core: &CoreLock,
        (id, kind): (u64, RoundKind),
        (from, to): (u8, u8),
        dest: &Dest,
        moves: &[Move],
        since: u64,
    ) -> io::Result<(u64, HashSet<u64>)> {
        // Phase 2: read every block, write them to the destination and make them durable.
        let area = core.serial().sh.area.clone();
        let len = moves.len() * BLOCK_SIZE;
        let mut buf = self.buffer(len);
        read_moves(&area, moves, &mut buf[..len])?;
        let buf = std::sync::Arc::new(buf);
        write_copy(&area, to, dest, (&buf, len))?;
        self.give_back(buf);
        if let Some((_, p)) = lock(&self.progress).iter_mut().find(|(i, _)| *i == id) {
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
        let below = core.serial().sh.layout.below(to).is_some();
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
        let (to, segment) = {
            let c = core.serial();
            let Some(to) = c.sh.layout.below(from) else {
                return 0;
            };
            (
                to,
                c.sh.tier(to).map_or(1, |t| t.geom.segment_blocks.max(1)),
            )
        };
        // Each round is claimed (a segment's worth) before it starts, so that the
        // rounds in flight together move no more than a segment past `max`.
        let (claimed, moved) = (AtomicU64::new(0), AtomicU64::new(0));
        let worker = || {
            while claimed.fetch_add(segment, Ordering::Relaxed) < max {
                if !self.room_in(core, to) {
                    break;
                }
                let n = self.run(core, RoundKind::Migrate, from);
                if n == 0 {
                    break;
                }
                moved.fetch_add(n, Ordering::Relaxed);
            }
        };
        let depth = MIGRATE_DEPTH.min(max.div_ceil(segment) as usize);
        let ctx = crate::util::ThreadCtx::current();
        std::thread::scope(|s| {
            for _ in 1..depth {
                // Without a thread, the rounds run one at a time.
                let _ = std::thread::Builder::new()
                    .name("cairn-migrate".into())
                    .spawn_scoped(s, || {
                        let _log = ctx.enter();
                        worker()
                    });
            }
            worker();
        });
        moved.into_inner()
    }

    /// Move NVM's coldest data down while `short` says NVM lacks space (a client waits
    /// for it): one round at a time, each started only if the rounds before (this
    /// caller's or the background's) did not free enough.
    pub(crate) fn free_nvm(&self, core: &CoreLock, short: &dyn Fn(&mut crate::core::Core) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let Some(below) = core.serial().sh.layout.below(0) else {
            return;
        };
        loop {
            if !short(&mut core.serial()) {
                return;
            }
            let moved = self.room_in(core, below)
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
        let (high, low, below, free) = {
            let c = core.serial();
            (
                c.cfg.migrate_high_pct.clamp(1, 100) as u64,
                c.cfg.migrate_low_pct.clamp(0, 99) as u64,
                c.sh.layout.below(from),
                c.sh.tier(from).map(|t| t.free_segments()),
            )
        };
        let mut worked = false;
        if let Some(below) = below {
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
                    TIER_NAMES[below as usize],
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
            if !spare && self.room_in(core, below) {
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
            let hot = c.sh.recency.has_hot(from);
            let Some(above) = c.sh.layout.above(from).filter(|_| hot) else {
                return false;
            };
            (
                above,
                promotion_room(&c.sh, above, limit.clamp(1, 100) as u64),
            )
        };
        let (above, room) = room;
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
                TIER_NAMES[above as usize]
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The blocks a migration round in flight copies ([`Migrator::in_flight`]), given back
/// when the round ends, whichever way.
struct InFlight<'m> {
    migrator: &'m Migrator,
    entries: Vec<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut set = lock(&self.migrator.in_flight);
        for e in &self.entries {
            set.remove(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_of(m: &Migrator, to: u8) -> Option<std::time::Duration> {
        lock(&m.paused)[to as usize].as_ref().map(|p| p.wait)
    }

    #[test]
    fn rounds_failing_together_pause_once_and_a_success_ends_the_pause() {
        let m = Migrator::default();
        let e = io::Error::from_raw_os_error(libc::ETIMEDOUT);
        m.round_ended(3, Some(&e));
        assert!(m.paused(3) && !m.paused(1));
        assert_eq!(m.failure(3).map(|f| f.0), Some(libc::ETIMEDOUT));
        // The other round in flight fails too, while the pause runs: still the first.
        m.round_ended(3, Some(&e));
        assert_eq!(wait_of(&m, 3), Some(PAUSE_MIN));
        // A round started after the pause fails again: twice as long.
        lock(&m.paused)[3].as_mut().unwrap().until = std::time::Instant::now();
        m.round_ended(3, Some(&e));
        assert_eq!(wait_of(&m, 3), Some(PAUSE_MIN * 2));
        m.round_ended(3, None);
        assert!(!m.paused(3) && m.failure(3).is_none() && wait_of(&m, 3).is_none());
    }
}
