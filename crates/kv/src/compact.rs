//! Compaction: cost-benefit selection of closed segments, copying their current records
//! to a compaction head, retiring them until no reader can be in them; and the
//! background threads that run it when the free segments fall below the trigger.

use crate::format::{
    encode_record, record_len, record_valid, Kind, RECORD_HEADER, SEGMENT_BYTES, SEGMENT_HEADER,
};
use crate::head::Head;
use crate::log::{lock, seg_of, Core, RESERVE};
use crate::pool::Pool;
use crate::store::KvError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Segments at least this full are not worth copying.
const FULL_ENOUGH: f64 = 0.98;

impl Core {
    /// [`Core::reclaim`], waiting up to 100 ms for readers to leave the epochs that
    /// hold retired segments back; whether any was freed.
    pub fn reclaim_waiting(&self) -> bool {
        let deadline = Instant::now() + Duration::from_millis(100);
        loop {
            if self.reclaim() {
                return true;
            }
            if self.epochs.retired().is_empty() || Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Free the segments compaction retired that no reader can still be in; whether any
    /// was.
    pub fn reclaim(&self) -> bool {
        let mut retired = self.epochs.retired();
        let quiet = retired.take_quiescent();
        let any = !quiet.is_empty();
        let mut free = self.segs.free_list();
        for q in quiet {
            let s = q.item();
            // Its header erased (durably), its records are nothing to a recovery: no
            // tombstone has to stay for them.
            let off = Pool::seg_off(s);
            let erased = self
                .pool
                .map
                .zero(off, SEGMENT_HEADER as usize)
                .and_then(|()| self.persist(off as u64, SEGMENT_HEADER))
                .is_ok();
            free.put(q, erased, self.now_ms());
        }
        self.release_cold(&mut free, crate::log::RELEASE_AFTER);
        any
    }

    /// Close a log head that has become the oldest segment while tombstones wait for
    /// it: a tombstone is needed while a segment older than it may hold what it
    /// deletes, and a head is never compacted, so with no more writes on that head (its
    /// thread runs on the other CPU, or compaction has nothing more to copy) they would
    /// stay for ever. Closed, it is a candidate like any other. Compaction's head needs
    /// a free segment left for the copies; a writer's, segments to spare (in a full
    /// pool its room is worth more: a deletion needs room for its tombstone). (Lock
    /// order: compaction's head, then a writer's; writers never take compaction's head
    /// while holding theirs.)
    fn close_pinning_head(&self, comp: &mut Head) {
        let (_, oldest, _) = self.segs.oldest();
        let close = |h: &mut Head| h.close(&self.segs);
        if oldest == 0 {
            return;
        }
        if comp.seg() as usize == oldest {
            if self.free_count() >= 1 && self.segs.pins_tombstones(comp.seq()) {
                close(comp);
            }
            return;
        }
        if self.free_count() <= self.heads.writers().len() + RESERVE + 1 {
            return;
        }
        for h in self.heads.writers() {
            let Ok(mut g) = h.try_lock() else { continue };
            if g.seg() as usize == oldest && self.segs.pins_tombstones(g.seq()) {
                close(&mut g);
            }
        }
    }

    /// One compaction round (rounds are serialized): the closed segments with the
    /// best cost-benefit (`(1 − u)·age / (1 + u)`, u = live bytes / segment), at most
    /// `max` of them; their current records copied to a compaction head (durable
    /// before anything else changes), the index switched key by key under each key's
    /// lock (a writer that got there first wins), the emptied segments retired until no
    /// reader can be in them. Returns the segments gained: emptied, less those the
    /// compaction head took.
    pub fn compact(&self, max: usize) -> Result<usize, KvError> {
        let mut head = self.heads.compactor();
        // Between processes, rounds are serialized by the region's lock; what a
        // compaction killed in the middle of a round held (its claims) is given up.
        let _round = self.region.shared.then(|| Round::start(self));
        // The head keeps its segment from round to round (a new one each round would
        // leave the rest of the last one unused), unless most of what it copied there
        // has died since (then it is closed, and can be a candidate) and a free
        // segment remains for the copies (closing the head with the last one gone
        // would leave compaction nowhere to copy to).
        if head.is_open() && self.segs.live(head.seg()) * 2 < head.used() && self.free_count() >= 1
        {
            head.close(&self.segs);
        }
        self.close_pinning_head(&mut head);
        self.reclaim();
        self.region
            .compaction_rounds()
            .fetch_add(1, Ordering::Relaxed);
        let now = self.region.version().load(Ordering::Relaxed);
        let oldest = self.segs.oldest();
        // Under the free list's lock: heads are taken from it under the same lock.
        let mut chosen = self.segs.free_list().choose(max, |s| {
            let u = self.segs.needed(s, oldest) as f64 / SEGMENT_BYTES as f64;
            let age = now.saturating_sub(self.segs.born(s)) as f64 + 1.0;
            (u < FULL_ENOUGH).then_some((1.0 - u) * age / (1.0 + u))
        });
        // Nothing worth copying, yet the garbage is above its bound: tombstones that
        // pin each other (two segments, each holding tombstones written after the other
        // was opened: a writer's thread moved between CPUs, so between heads, in the
        // middle of its deletions) count as needed in both, which are then too full to
        // choose, for ever. Moving the oldest segment's records (tombstones included) to
        // compaction's head, newer than every horizon, frees the others' tombstones;
        // each such move makes the oldest segment newer, so they end.
        let (_, at, _) = oldest;
        if chosen.is_empty()
            && at != 0
            && self.compactor.over_garbage(|| self.garbage())
            && self.segs.pins_tombstones(self.segs.seq(at as u64))
        {
            chosen = self
                .segs
                .free_list()
                .choose(1, |s| (s == at as u64).then_some(1.0));
        }
        let rolls = self.region.compaction_rolls().load(Ordering::Relaxed);
        let mut emptied: usize = 0;
        let mut result = Ok(());
        for &s in &chosen {
            // Only a segment whose live bytes fit the room left for copies (the head's
            // and the free segments'): a copy cut short by a full pool frees nothing and
            // would spend the last free segment, leaving no room to compact into.
            let room = head.room() + self.free_count() as u64 * (SEGMENT_BYTES - SEGMENT_HEADER);
            if result.is_err() || self.segs.live(s) > room {
                self.segs.unclaim(s);
                continue;
            }
            match self.compact_segment(&mut head, s) {
                Ok(false) => {
                    // Records the walk could not reach are still current: the segment
                    // stays (and can be chosen again).
                    self.segs.unclaim(s);
                    self.region
                        .compaction_errors()
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(true) => {
                    self.segs.check_emptied(s);
                    self.epochs.retire(s);
                    self.region
                        .compacted_segments()
                        .fetch_add(1, Ordering::Relaxed);
                    emptied += 1;
                    // Free at once if no reader can be in it: the next copies can go there.
                    self.reclaim();
                }
                Err(e) => {
                    // The segment keeps what was not moved (no room left for the copies:
                    // `Full`); it can be chosen again.
                    self.segs.unclaim(s);
                    result = Err(e);
                }
            }
        }
        match result {
            // What the round gained: segments emptied less those its head took (moving
            // a segment's records into a new one, as records too large to pack better
            // would be, frees nothing: counted as progress, it kept compaction copying
            // the same data round after round in a full pool).
            Ok(()) | Err(KvError::Full) => Ok(emptied.saturating_sub(
                (self.region.compaction_rolls().load(Ordering::Relaxed) - rolls) as usize,
            )),
            Err(e) => Err(e),
        }
    }

    /// Copy segment `s`'s current records to a compaction head; whether it holds
    /// nothing current any more (its live bytes are down to 0: the walk reached every
    /// record). A segment not emptied must not be retired.
    fn compact_segment(&self, head: &mut Head, s: u64) -> Result<bool, KvError> {
        let seq = self.segs.seq(s);
        // The oldest incarnation of any other segment that may hold records.
        let oldest = match self.segs.oldest() {
            (_, at, next) if at == s as usize => next,
            (first, _, _) => first,
        };
        let base = Pool::seg_off(s) as u64;
        let mut off = self.segs.swept(s).max(SEGMENT_HEADER);
        // Up to what its head wrote (a head killed in the middle of an append leaves a
        // record past it, which no index entry names).
        let written = self.segs.written(s);
        while off + RECORD_HEADER <= written {
            let loc = base + off;
            // The record may be rewritten by an in-place update until its key's lock is
            // held: the walk takes from it unlocked only what such updates keep (the
            // magic, the lengths, the key; a header caught in the middle of a rewrite
            // is read again) and everything else under the lock.
            let mut tries = 0;
            let rh = loop {
                match self.header_at(loc) {
                    Ok(rh) => break Some(rh),
                    Err(_) if tries < 100 => {
                        tries += 1;
                        std::thread::yield_now();
                    }
                    Err(_) => break None,
                }
            };
            let Some(rh) = rh else { break };
            let key = self
                .pool
                .map
                .bytes((loc + RECORD_HEADER) as usize, rh.key_len)?;
            let h = self.index.key_hash(key);
            let _pin = self.epochs.pin();
            let g = self.index.lock_key(h);
            let rh = match self.header_at(loc) {
                Ok(rh)
                    if record_valid(
                        seq,
                        &rh,
                        self.pool.map.bytes(loc as usize, rh.len as usize)?,
                    ) =>
                {
                    rh
                }
                _ => break,
            };
            off += rh.len;
            let value = self.value_at(loc, &rh)?;
            let live = match rh.kind {
                Kind::Value => {
                    let is_key = |l: u64| self.key_is(l, key);
                    if self.index.get_locked(&g, h, &is_key) != Some(loc) {
                        self.segs.sweep_to(s, off);
                        continue;
                    }
                    // The copy is tight: an in-place update by a shorter value left
                    // slack in the allocation.
                    let tight = record_len(rh.key_len, rh.value_len);
                    let new = self.append_to(head, tight, true, &|sq| {
                        encode_record(sq, rh.version, Kind::Value, key, value)
                    })?;
                    self.index
                        .set(&g, h, &is_key, new)
                        .map_err(|()| KvError::IndexFull)?;
                    true
                }
                Kind::Tombstone => {
                    drop(g);
                    // Kept while a segment opened before it (other than this one) may
                    // still hold an older record of the key.
                    let horizon = u64::from_le_bytes(value.try_into().unwrap_or([0; 8]));
                    let needed = oldest < horizon;
                    if needed {
                        let at = self.append_to(head, rh.len, true, &|sq| {
                            encode_record(sq, rh.version, Kind::Tombstone, key, value)
                        })?;
                        self.segs.note_tombstone(seg_of(at), rh.len, horizon);
                    }
                    needed
                }
            };
            self.segs
                .unlive(s, rh.len, if live { "moved" } else { "tombstone dropped" });
            self.segs.sweep_to(s, off);
            if live {
                self.region
                    .compacted_bytes()
                    .fetch_add(rh.len, Ordering::Relaxed);
            }
        }
        if off >= written && self.region.shared {
            // Walked whole: nothing in it is current. Live bytes left are those of
            // writers killed between an index switch and the count (each change of a
            // live count follows the switch it stands for).
            let left = self.segs.clear_live(s);
            if left != 0 {
                self.region.repaired().fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(self.segs.live(s) == 0)
    }

    /// Put right what processes that are gone held (a shared store): their heads
    /// closed, their claims given up (`FreeList::reap`).
    pub fn reap(&self) {
        if self.region.shared {
            let gone = self.segs.free_list().reap(self.now_ms());
            self.region
                .deaths()
                .fetch_add(gone as u64, Ordering::Relaxed);
            if gone > 0 {
                // A writer killed while it held a key's lock may have changed the index
                // and not the key count (both change under that lock): count again.
                self.index
                    .count_locked(|n| self.region.keys().store(n, Ordering::Relaxed));
            }
        }
    }

    /// This process lets go of a shared store that others go on with (its threads
    /// stopped, no call running): its heads closed (closed segments others compact),
    /// the segments its compaction emptied freed if no reader can be in them, else
    /// given up (nothing in them is current: the next round empties them at no cost).
    pub fn leave(&self) {
        let writers = self.heads.writers().iter().map(lock);
        for mut h in std::iter::once(self.heads.compactor()).chain(writers) {
            if h.is_open() {
                h.close(&self.segs);
            }
        }
        self.reclaim();
        for s in self.epochs.retired().abandon() {
            self.segs.unclaim(s);
        }
    }

    /// Whether no compaction round runs now (in any process).
    pub fn compaction_idle(&self) -> bool {
        self.heads.compactor_idle() && self.region.compactor().is_free()
    }
}

/// When this process's compaction runs, and its thread's bell: the policy (compact
/// while fewer than `trigger` of the usable segments are free, or more than
/// `max_garbage` of the closed segments' bytes is dead) and what it keeps warm (with a
/// garbage bound, the `warm` segments freed last keep their memory). Its invariants: the
/// trigger is a fraction (0 to 1), the bound a fraction below 1, and `warm` covers every
/// head at once (at least one).
pub(crate) struct Compactor {
    trigger: f64,
    max_garbage: Option<f64>,
    warm: usize,
    /// Set: there is work (or the store closes); the thread waits on the condition.
    bell: (Mutex<bool>, Condvar),
    stop: AtomicBool,
}

impl Compactor {
    pub fn new(trigger: f64, max_garbage: Option<f64>, warm: usize) -> Compactor {
        assert!(
            (0.0..=1.0).contains(&trigger),
            "compaction trigger {trigger}"
        );
        assert!(
            max_garbage.is_none_or(|g| (0.0..1.0).contains(&g)),
            "garbage bound {max_garbage:?}"
        );
        assert!(warm >= 1, "no segment kept warm");
        Compactor {
            trigger,
            max_garbage,
            warm,
            bell: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// Whether compaction is wanted with `free` of `usable` segments free and `garbage`
    /// (the dead fraction of the closed segments' bytes, asked only when bounded).
    pub fn wanted(&self, free: usize, usable: u64, garbage: impl FnOnce() -> f64) -> bool {
        (free as f64) < self.trigger * usable as f64 || self.over_garbage(garbage)
    }

    /// Whether the dead bytes are above the bound (never without one).
    pub fn over_garbage(&self, garbage: impl FnOnce() -> f64) -> bool {
        self.max_garbage.is_some_and(|g| garbage() > g)
    }

    /// The segments freed last that keep their memory, if freed segments hand theirs
    /// back at all (only under a garbage bound: without one the pool's size bounds the
    /// memory, and free segments wait for the log to take them again).
    pub fn keeps_warm(&self) -> Option<usize> {
        self.max_garbage.map(|_| self.warm)
    }

    /// Wake the compaction thread.
    pub fn ring(&self) {
        *lock(&self.bell.0) = true;
        self.bell.1.notify_all();
    }

    /// Wait until rung or for `at_most`; whether it was rung (and unring it).
    fn wait(&self, at_most: Duration) -> bool {
        let mut rung = lock(&self.bell.0);
        if !*rung && !self.stopping() {
            rung = self
                .bell
                .1
                .wait_timeout(rung, at_most)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        std::mem::replace(&mut *rung, false)
    }

    /// The store closes: the thread ends (rung so that it sees it now).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.ring();
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// A compaction round of a shared store: the region's compaction lock, held until it
/// drops.
struct Round<'c>(&'c Core);

impl<'c> Round<'c> {
    fn start(core: &'c Core) -> Round<'c> {
        core.region.compactor().lock();
        core.reap();
        Round(core)
    }
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        self.0.region.compactor().unlock();
    }
}

/// The body of a background compaction thread: compact while the free segments are
/// below the trigger (or the garbage above its bound) and compaction empties some;
/// otherwise sleep until a head that takes a segment rings, or for 100 ms. Each pass
/// also reclaims what readers have left, hands back the memory of segments free for
/// long enough, and collapses the segments heads took back into huge folios.
pub(crate) fn run(core: Arc<Core>) {
    // Rounds in a row that gained no whole segment while compaction was wanted. At high
    // utilization a few such rounds still add up (the head's room carries over); after
    // eight (a pool full of live data that packs no better), wait longer each time, up
    // to 3.2 s, until a writer rings.
    let mut fruitless = 0u32;
    let mut last_reap = Instant::now();
    while !core.compactor.stopping() {
        let mut worked = false;
        if core.wants_compaction() {
            match core.compact(3) {
                Ok(n) => worked = n > 0,
                Err(_) => {
                    core.region
                        .compaction_errors()
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            fruitless = if worked { 0 } else { fruitless + 1 };
        }
        core.reclaim();
        core.collapse_fresh();
        if core.region.shared && last_reap.elapsed() >= Duration::from_secs(1) {
            core.reap();
            last_reap = Instant::now();
        }
        if worked || (fruitless > 0 && fruitless < 8) {
            continue;
        }
        let at_most = Duration::from_millis(100 << fruitless.saturating_sub(8).min(5));
        if core.compactor.wait(at_most) {
            fruitless = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Compactor;
    use std::time::Duration;

    #[test]
    fn the_policy_says_when_compaction_is_wanted() {
        let c = Compactor::new(0.2, None, 4);
        assert!(c.wanted(1, 10, || 0.0));
        assert!(!c.wanted(2, 10, || unreachable!("no bound: garbage is not asked")));
        assert_eq!(c.keeps_warm(), None);
        let c = Compactor::new(0.2, Some(0.05), 4);
        assert!(c.wanted(5, 10, || 0.06) && !c.wanted(5, 10, || 0.05));
        assert_eq!(c.keeps_warm(), Some(4));
    }

    #[test]
    fn a_ring_is_heard_once_and_stopping_ends_the_wait() {
        let c = Compactor::new(0.2, None, 1);
        c.ring();
        assert!(c.wait(Duration::from_secs(10)), "rung");
        assert!(!c.wait(Duration::from_millis(1)), "heard once");
        c.stop();
        assert!(c.stopping() && c.wait(Duration::from_secs(10)));
    }

    #[test]
    #[should_panic(expected = "compaction trigger")]
    fn a_trigger_past_one_is_caught() {
        Compactor::new(1.5, None, 1);
    }

    #[test]
    #[should_panic(expected = "garbage bound")]
    fn a_garbage_bound_of_one_is_caught() {
        Compactor::new(0.2, Some(1.0), 1);
    }
}
