//! A trace-driven simulator of huge-page policies, for what a user-space daemon cannot
//! reach: the page-fault path, demotion, compaction that skips hot pages, and fairness
//! when contiguity is scarce (`cairn hugepaged simulate`).
//!
//! Physical memory is a buddy allocator of 4 KiB frames. Processes touch and free base
//! pages of 2 MiB regions ([`Ev`]); every `Tick` is one scan interval. The policies:
//!
//! * **Linux** (THP `always`, greedy): the first fault in an empty region takes a huge
//!   page when a free 2 MiB block exists (compacting synchronously when not, if memory
//!   is not too fragmented to try); freeing a base page of a huge page splits it at once;
//!   `khugepaged` scans 16 MiB of one process after another per interval (linearly: the
//!   first process is served first) and collapses any region with a page present
//!   (`max_ptes_none = 511`).
//! * **FreeBSD** (reservations): the first fault reserves a 2 MiB block and maps base
//!   pages from it; the region is promoted only when all 512 pages are present.
//! * **Ingens**: base pages at every fault; a region at least `threshold` populated is
//!   promoted asynchronously (hottest first, the process with the largest
//!   `S/(H·(f + τ(1−f)))` first, within a budget per interval); a freed base page only
//!   clears its bit, and a huge page is demoted (its free base pages given back) when
//!   its utilization falls below the threshold; compaction, when the
//!   fragmentation index passes 0.8, moves at most 100 MiB per interval and never a hot
//!   region's pages.
//!
//! Reported per interval: resident memory over pages in use (bloat), huge pages per
//! process, the fairness objective, the fragmentation index.

use crate::policy::{self, Claim, History, PAGES};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Order of a 2 MiB block (in 4 KiB frames).
pub const HUGE_ORDER: usize = 9;
const MAX_ORDER: usize = 10;

/// A buddy allocator of `frames` 4 KiB frames.
#[derive(Debug, Clone)]
pub struct Buddy {
    free: Vec<BTreeSet<u64>>,
    pub frames: u64,
    pub free_frames: u64,
}

impl Buddy {
    /// `frames` rounded down to whole blocks of the largest order, all free.
    pub fn new(frames: u64) -> Buddy {
        let top = 1u64 << MAX_ORDER;
        let frames = frames / top * top;
        let mut free = vec![BTreeSet::new(); MAX_ORDER + 1];
        for b in (0..frames).step_by(top as usize) {
            free[MAX_ORDER].insert(b);
        }
        Buddy {
            free,
            frames,
            free_frames: frames,
        }
    }

    /// A free block of `order` (its first frame), split from a larger one if needed.
    pub fn alloc(&mut self, order: usize) -> Option<u64> {
        let o = (order..=MAX_ORDER).find(|&o| !self.free[o].is_empty())?;
        let b = *self.free[o].iter().next().expect("non-empty");
        self.free[o].remove(&b);
        for k in (order..o).rev() {
            self.free[k].insert(b + (1 << k));
        }
        self.free_frames -= 1 << order;
        Some(b)
    }

    /// Take frame `f` if it is free (for compaction's target choice); whether it was.
    fn take(&mut self, f: u64) -> bool {
        for o in 0..=MAX_ORDER {
            let b = f & !((1u64 << o) - 1);
            if self.free[o].remove(&b) {
                // Give back the parts of the block other than `f`.
                let mut lo = b;
                for k in (0..o).rev() {
                    let half = lo + (1 << k);
                    if f >= half {
                        self.free[k].insert(lo);
                        lo = half;
                    } else {
                        self.free[k].insert(half);
                    }
                }
                self.free_frames -= 1;
                return true;
            }
        }
        false
    }

    /// Free the block of `order` at `b`, merging with its buddies.
    pub fn free(&mut self, mut b: u64, mut order: usize) {
        self.free_frames += 1 << order;
        while order < MAX_ORDER {
            let buddy = b ^ (1 << order);
            if !self.free[order].remove(&buddy) {
                break;
            }
            b = b.min(buddy);
            order += 1;
        }
        self.free[order].insert(b);
    }

    /// Whether frame `f` is free.
    fn is_free(&self, f: u64) -> bool {
        (0..=MAX_ORDER).any(|o| self.free[o].contains(&(f & !((1u64 << o) - 1))))
    }

    /// The fragmentation index for 2 MiB blocks.
    pub fn fmfi(&self) -> f64 {
        if self.free_frames == 0 {
            return 0.0;
        }
        let usable: u64 = (HUGE_ORDER..=MAX_ORDER)
            .map(|o| (self.free[o].len() as u64) << o)
            .sum();
        (self.free_frames - usable) as f64 / self.free_frames as f64
    }
}

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Ev {
    /// Process `pid` touches base page `page` (a fault if not present, else an access).
    Touch { pid: u32, page: u64 },
    /// Process `pid` frees `pages` base pages from `page` (`MADV_DONTNEED`).
    Free { pid: u32, page: u64, pages: u64 },
    /// One scan interval passes.
    Tick,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Policy {
    Linux,
    FreeBsd,
    Ingens,
}

/// The simulated policies' parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Ingens' promotion threshold.
    pub threshold: f64,
    pub tau: f64,
    /// Ingens: promotions per interval; Linux: regions `khugepaged` scans per interval
    /// (16 MiB: 8).
    pub promote_per_tick: usize,
    pub scan_per_tick: usize,
    /// Compaction: pages moved per interval at most (100 MiB: 25,600).
    pub compact_pages: u64,
    pub shares: BTreeMap<u32, f64>,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            threshold: 0.9,
            tau: 0.5,
            promote_per_tick: 64,
            scan_per_tick: 8,
            compact_pages: 25_600,
            shares: BTreeMap::new(),
        }
    }
}

/// A 2 MiB region of a process.
#[derive(Debug, Clone)]
struct Region {
    /// Frame mapped at each base page (`NONE`: none). A huge page maps all 512, used
    /// or not.
    frames: Vec<u64>,
    /// Base pages the process uses (touched and not freed), and how many.
    used: Vec<bool>,
    present: u32,
    /// The huge frame block mapping it.
    huge: Option<u64>,
    /// FreeBSD: the reserved block its base pages come from.
    reserved: Option<u64>,
    history: History,
    accessed: bool,
}

impl Region {
    fn new() -> Region {
        Region {
            frames: vec![NONE; PAGES as usize],
            used: vec![false; PAGES as usize],
            present: 0,
            huge: None,
            reserved: None,
            history: History::default(),
            accessed: false,
        }
    }

    /// Frames it holds (a huge page or a reservation whole, else its base pages).
    fn resident(&self) -> u64 {
        if self.huge.is_some() || self.reserved.is_some() {
            PAGES as u64
        } else {
            self.frames.iter().filter(|&&f| f != NONE).count() as u64
        }
    }
}

/// One process.
#[derive(Debug, Clone, Default)]
struct Proc {
    regions: BTreeMap<u64, Region>,
}

impl Proc {
    /// Its regions as the policy sees them (the region number as the start).
    fn view(&self) -> Vec<policy::Region> {
        self.regions
            .iter()
            .map(|(&r, g)| policy::Region {
                start: r,
                present: g.present,
                huge: g.huge.is_some(),
                history: g.history,
            })
            .collect()
    }
}

/// Figures at one interval.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sample {
    pub tick: u64,
    /// Frames resident over base pages in use, minus one.
    pub bloat: f64,
    /// Huge pages per process (by pid order).
    pub huge: Vec<(u32, u64)>,
    pub objective: f64,
    pub fmfi: f64,
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub policy: Policy,
    pub samples: Vec<Sample>,
    pub faults: u64,
    pub huge_faults: u64,
    pub promotions: u64,
    pub demotions: u64,
    /// Pages compaction moved (synchronously in Linux's fault path, or in Ingens'
    /// background rounds).
    pub compacted_pages: u64,
}

/// The simulator.
pub struct Sim {
    pub policy: Policy,
    pub params: Params,
    pub mem: Buddy,
    procs: BTreeMap<u32, Proc>,
    /// Linux: `khugepaged`'s position (process, region).
    cursor: (u32, u64),
    tick: u64,
    /// Linux: direct compaction found no block in this interval.
    compaction_failed: bool,
    report: Report,
}

const NONE: u64 = u64::MAX;

impl Sim {
    pub fn new(policy: Policy, params: Params, frames: u64) -> Sim {
        Sim {
            policy,
            params,
            mem: Buddy::new(frames),
            procs: BTreeMap::new(),
            cursor: (0, 0),
            tick: 0,
            compaction_failed: false,
            report: Report {
                policy,
                samples: Vec::new(),
                faults: 0,
                huge_faults: 0,
                promotions: 0,
                demotions: 0,
                compacted_pages: 0,
            },
        }
    }

    /// Pin `frames` scattered frames (memory other processes hold, not movable): every
    /// `stride`-th frame, so that no free 2 MiB block remains where they are.
    pub fn pin_scattered(&mut self, stride: u64, count: u64) {
        let mut n = 0;
        let mut f = 0;
        while n < count && f < self.mem.frames {
            if self.mem.take(f) {
                n += 1;
            }
            f += stride;
        }
    }

    fn region(&mut self, pid: u32, r: u64) -> &mut Region {
        self.procs
            .entry(pid)
            .or_default()
            .regions
            .entry(r)
            .or_insert_with(Region::new)
    }

    /// Apply one event.
    pub fn step(&mut self, e: Ev) {
        match e {
            Ev::Touch { pid, page } => self.touch(pid, page),
            Ev::Free { pid, page, pages } => {
                for p in page..page + pages {
                    self.free_page(pid, p);
                }
            }
            Ev::Tick => self.tick(),
        }
    }

    fn touch(&mut self, pid: u32, page: u64) {
        let (r, i) = (page / PAGES as u64, (page % PAGES as u64) as usize);
        let policy = self.policy;
        let reg = self.region(pid, r);
        reg.accessed = true;
        if reg.used[i] {
            return;
        }
        if reg.frames[i] != NONE {
            // Mapped already (a huge page's zero-filled part): no fault.
            reg.used[i] = true;
            reg.present += 1;
            return;
        }
        let empty = reg.present == 0 && reg.huge.is_none();
        let unreserved = reg.reserved.is_none();
        self.report.faults += 1;
        match policy {
            Policy::Linux if empty => {
                let block = self.mem.alloc(HUGE_ORDER).or_else(|| {
                    // Direct compaction in the fault, for one block (not again in this
                    // interval once it found none).
                    if !self.compaction_failed {
                        self.compact(PAGES as u64, false);
                        self.compaction_failed =
                            self.mem.free[HUGE_ORDER..].iter().all(BTreeSet::is_empty);
                    }
                    self.mem.alloc(HUGE_ORDER)
                });
                if let Some(b) = block {
                    self.report.huge_faults += 1;
                    let reg = self.region(pid, r);
                    reg.huge = Some(b);
                    for (k, f) in reg.frames.iter_mut().enumerate() {
                        *f = b + k as u64;
                    }
                    reg.used[i] = true;
                    reg.present = 1;
                    return;
                }
            }
            Policy::FreeBsd if empty && unreserved => {
                if let Some(b) = self.mem.alloc(HUGE_ORDER) {
                    self.region(pid, r).reserved = Some(b);
                }
            }
            _ => {}
        }
        let reg = self.region(pid, r);
        if let Some(b) = reg.reserved {
            reg.frames[i] = b + i as u64;
            reg.used[i] = true;
            reg.present += 1;
            if reg.present == PAGES {
                reg.huge = Some(b);
                reg.reserved = None;
                self.report.promotions += 1;
            }
            return;
        }
        let Some(f) = self.mem.alloc(0) else {
            return; // out of memory: the touch fails
        };
        let reg = self.region(pid, r);
        reg.frames[i] = f;
        reg.used[i] = true;
        reg.present += 1;
    }

    fn free_page(&mut self, pid: u32, page: u64) {
        let (r, i) = (page / PAGES as u64, (page % PAGES as u64) as usize);
        let (policy, threshold) = (self.policy, self.params.threshold);
        let Some(reg) = self.procs.get_mut(&pid).and_then(|p| p.regions.get_mut(&r)) else {
            return;
        };
        if !reg.used[i] {
            return;
        }
        reg.used[i] = false;
        reg.present -= 1;
        if reg.huge.is_some() {
            // Linux and FreeBSD split at once; Ingens only clears the bit, and demotes
            // once the region is under the promotion threshold (the sources give no
            // value; this one bounds bloat by the same 10%).
            if policy != Policy::Ingens || (reg.present as f64) < threshold * PAGES as f64 {
                self.demote(pid, r);
            }
        } else if reg.reserved.is_some() {
            // The frame stays reserved; the reservation goes back when it empties.
            reg.frames[i] = NONE;
            if reg.present == 0 {
                let b = reg.reserved.take().expect("reserved");
                self.mem.free(b, HUGE_ORDER);
            }
        } else {
            let f = std::mem::replace(&mut reg.frames[i], NONE);
            self.mem.free(f, 0);
        }
    }

    /// Split a huge page into base pages; give back the frames of unused pages.
    fn demote(&mut self, pid: u32, r: u64) {
        let reg = self.region(pid, r);
        if reg.huge.take().is_none() {
            return;
        }
        let mut unused = Vec::new();
        for k in 0..PAGES as usize {
            if !reg.used[k] {
                unused.push(std::mem::replace(&mut reg.frames[k], NONE));
            }
        }
        for f in unused {
            self.mem.free(f, 0);
        }
        self.report.demotions += 1;
    }

    /// Promote region `r` of `pid` into a fresh 2 MiB block (its base frames given
    /// back); whether a block was found.
    fn promote(&mut self, pid: u32, r: u64) -> bool {
        let Some(b) = self.mem.alloc(HUGE_ORDER) else {
            return false;
        };
        let reg = self.region(pid, r);
        let old: Vec<u64> = reg.frames.iter().copied().filter(|&f| f != NONE).collect();
        for (k, f) in reg.frames.iter_mut().enumerate() {
            *f = b + k as u64;
        }
        reg.huge = Some(b);
        for f in old {
            self.mem.free(f, 0);
        }
        self.report.promotions += 1;
        true
    }

    /// Move base pages out of the 2 MiB blocks that are most nearly free until a block
    /// is free or `budget` pages moved; `skip_hot`: leave hot regions' pages in place.
    /// Only processes' base pages move (pinned frames do not). Returns pages moved.
    fn compact(&mut self, budget: u64, skip_hot: bool) -> u64 {
        // Owner of each frame held by a base page.
        let mut owner: BTreeMap<u64, (u32, u64, usize, bool)> = BTreeMap::new();
        for (&pid, p) in &self.procs {
            for (&r, reg) in &p.regions {
                if reg.huge.is_some() || reg.reserved.is_some() {
                    continue;
                }
                for (i, &f) in reg.frames.iter().enumerate() {
                    if f != NONE {
                        owner.insert(f, (pid, r, i, reg.history.hot()));
                    }
                }
            }
        }
        let block = 1u64 << HUGE_ORDER;
        let mut moved = 0;
        // Blocks by how few frames they hold, all of them movable.
        let mut blocks: Vec<(u64, u64)> = (0..self.mem.frames / block)
            .filter_map(|k| {
                let b = k * block;
                let mut used = 0;
                for f in b..b + block {
                    if self.mem.is_free(f) {
                        continue;
                    }
                    match owner.get(&f) {
                        Some(o) if !(skip_hot && o.3) => used += 1,
                        _ => return None,
                    }
                }
                (used > 0).then_some((used, b))
            })
            .collect();
        blocks.sort();
        for (used, b) in blocks {
            if moved + used > budget {
                break;
            }
            // Targets outside the block.
            let mut targets = Vec::new();
            let mut f = 0;
            while (targets.len() as u64) < used && f < self.mem.frames {
                if (f < b || f >= b + block) && self.mem.is_free(f) {
                    targets.push(f);
                }
                f += 1;
            }
            if (targets.len() as u64) < used {
                break;
            }
            let mut t = targets.into_iter();
            for src in b..b + block {
                if let Some(&(pid, r, i, _)) = owner.get(&src) {
                    let dst = t.next().expect("a target");
                    assert!(self.mem.take(dst));
                    self.region(pid, r).frames[i] = dst;
                    self.mem.free(src, 0);
                    moved += 1;
                }
            }
            if budget <= PAGES as u64 {
                break; // a fault's compaction wants one block
            }
        }
        self.report.compacted_pages += moved;
        moved
    }

    fn tick(&mut self) {
        self.tick += 1;
        self.compaction_failed = false;
        for p in self.procs.values_mut() {
            for reg in p.regions.values_mut() {
                let a = std::mem::take(&mut reg.accessed);
                reg.history.observe(a);
            }
        }
        match self.policy {
            Policy::Linux => self.khugepaged(),
            Policy::FreeBsd => {}
            Policy::Ingens => {
                if self.mem.fmfi() > 0.8 {
                    self.compact(self.params.compact_pages, true);
                }
                self.promote_fairly();
            }
        }
        self.sample();
    }

    /// Linux: scan `scan_per_tick` regions from the cursor on, one process after
    /// another, collapsing any region with a page present.
    fn khugepaged(&mut self) {
        let all: Vec<(u32, u64)> = self
            .procs
            .iter()
            .flat_map(|(&p, pr)| pr.regions.keys().map(move |&r| (p, r)))
            .collect();
        if all.is_empty() {
            return;
        }
        let start = all.iter().position(|&x| x >= self.cursor).unwrap_or(0);
        for k in 0..self.params.scan_per_tick.min(all.len()) {
            let (pid, r) = all[(start + k) % all.len()];
            self.cursor = all[(start + k + 1) % all.len()];
            let reg = &self.procs[&pid].regions[&r];
            if reg.huge.is_none()
                && reg.reserved.is_none()
                && reg.present > 0
                && !self.promote(pid, r)
            {
                break;
            }
        }
    }

    /// Ingens: promote up to `promote_per_tick` regions at the threshold, each time for
    /// the process with the largest claim, its hottest candidate.
    fn promote_fairly(&mut self) {
        for _ in 0..self.params.promote_per_tick {
            let claims: Vec<Claim> = self
                .procs
                .iter()
                .map(|(&pid, p)| {
                    let regions = p.view();
                    let huge: Vec<&policy::Region> = regions.iter().filter(|x| x.huge).collect();
                    Claim {
                        pid,
                        share: self.params.shares.get(&pid).copied().unwrap_or(1.0),
                        huge_bytes: huge.len() as u64 * policy::HUGE,
                        idle: if huge.is_empty() {
                            0.0
                        } else {
                            huge.iter().filter(|x| x.history.idle()).count() as f64
                                / huge.len() as f64
                        },
                        candidates: policy::candidates(&regions, self.params.threshold).len(),
                    }
                })
                .collect();
            let Some(pid) = policy::choose(&claims, self.params.tau) else {
                return;
            };
            let regions = self.procs[&pid].view();
            let best = policy::candidates(&regions, self.params.threshold)[0];
            if !self.promote(pid, regions[best].start) {
                return;
            }
        }
    }

    fn sample(&mut self) {
        let (mut resident, mut used) = (0u64, 0u64);
        let mut huge = Vec::new();
        let mut metrics = Vec::new();
        for (&pid, p) in &self.procs {
            let mut h = 0;
            for reg in p.regions.values() {
                resident += reg.resident();
                used += reg.present as u64;
                h += u64::from(reg.huge.is_some());
            }
            huge.push((pid, h));
            // The fairness among the processes still using memory.
            if p.regions.values().any(|g| g.present > 0) {
                let share = self.params.shares.get(&pid).copied().unwrap_or(1.0);
                metrics.push(policy::metric(share, h * policy::HUGE, 0.0, 1.0));
            }
        }
        self.report.samples.push(Sample {
            tick: self.tick,
            bloat: if used == 0 {
                0.0
            } else {
                resident as f64 / used as f64 - 1.0
            },
            huge,
            objective: policy::objective(&metrics),
            fmfi: self.mem.fmfi(),
        });
    }

    /// Run a trace; the report.
    pub fn run(mut self, trace: impl IntoIterator<Item = Ev>) -> Report {
        for e in trace {
            self.step(e);
        }
        self.report
    }
}

/// Ingens' Redis experiment, scaled: `objects` objects of 8 KiB (two base pages each)
/// written in order, with an interval every `per_tick` objects; then 70% of them
/// deleted at random, of which the allocator gives back (`MADV_DONTNEED`) the pages of
/// `purged` (a fraction; jemalloc keeps much of what is freed); then `ticks` intervals.
pub fn redis_trace(objects: u64, per_tick: u64, purged: f64, ticks: u64, seed: u64) -> Vec<Ev> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut t = Vec::new();
    for o in 0..objects {
        t.push(Ev::Touch {
            pid: 1,
            page: 2 * o,
        });
        t.push(Ev::Touch {
            pid: 1,
            page: 2 * o + 1,
        });
        if (o + 1) % per_tick == 0 {
            t.push(Ev::Tick);
        }
    }
    for o in 0..objects {
        if rng.gen::<f64>() < 0.7 && rng.gen::<f64>() < purged {
            t.push(Ev::Free {
                pid: 1,
                page: 2 * o,
                pages: 2,
            });
        }
    }
    t.extend((0..ticks).map(|_| Ev::Tick));
    t
}

/// Fairness under scarce contiguity: a process (pid 9) holds `hog` fully used regions;
/// one frame of every other 2 MiB block is pinned (no free block is left); processes 1
/// and 2 fill `each` regions in turn (base pages: no block to fault a huge page into);
/// then process 9 exits, freeing `hog` blocks, fewer than the 2·`each` regions that
/// want one; then `ticks` intervals. Run with `frames` = (`hog` + `free_blocks`)·512.
pub fn fairness_trace(hog: u64, each: u64, ticks: u64) -> (Vec<Ev>, u64) {
    let mut t = Vec::new();
    for p in 0..hog * PAGES as u64 {
        t.push(Ev::Touch { pid: 9, page: p });
    }
    // The caller pins after these (see `fairness`).
    let split = t.len() as u64;
    for r in 0..each {
        for pid in [1, 2] {
            for k in 0..PAGES as u64 {
                t.push(Ev::Touch {
                    pid,
                    page: r * PAGES as u64 + k,
                });
            }
        }
    }
    t.push(Ev::Free {
        pid: 9,
        page: 0,
        pages: hog * PAGES as u64,
    });
    t.extend((0..ticks).map(|_| Ev::Tick));
    (t, split)
}

/// Run the fairness scenario under `policy`: `hog` blocks freed late, two processes
/// wanting `each` each, in `hog + free` blocks of memory.
pub fn fairness(policy: Policy, hog: u64, each: u64, free: u64, ticks: u64) -> Report {
    let (trace, split) = fairness_trace(hog, each, ticks);
    let mut sim = Sim::new(policy, Params::default(), (hog + free) * PAGES as u64);
    for (i, e) in trace.into_iter().enumerate() {
        if i as u64 == split {
            // One pinned frame in each block the hog does not hold.
            sim.pin_scattered(PAGES as u64, free);
        }
        sim.step(e);
    }
    sim.report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: Policy, frames: u64, trace: Vec<Ev>) -> Report {
        Sim::new(policy, Params::default(), frames).run(trace)
    }

    #[test]
    fn the_buddy_allocator_splits_and_merges() {
        let mut b = Buddy::new(4096);
        assert_eq!(b.frames, 4096);
        assert_eq!(b.fmfi(), 0.0);
        let x = b.alloc(0).unwrap();
        let h = b.alloc(HUGE_ORDER).unwrap();
        assert_eq!(b.free_frames, 4096 - 1 - 512);
        assert!(h.is_multiple_of(512) && h != x - x % 512);
        b.free(x, 0);
        b.free(h, HUGE_ORDER);
        assert_eq!(b.free_frames, 4096);
        assert_eq!(b.free[MAX_ORDER].len(), 4);
        // One frame taken in each 2 MiB block: no block left, all free memory unusable.
        for k in 0..8 {
            assert!(b.take(k * 512 + 7));
        }
        assert!(!b.take(7));
        assert_eq!(b.fmfi(), 1.0);
        assert!(b.alloc(HUGE_ORDER).is_none());
    }

    /// One page touched in each of 16 regions, then intervals.
    fn sparse() -> Vec<Ev> {
        let mut t: Vec<Ev> = (0..16)
            .map(|r| Ev::Touch {
                pid: 1,
                page: r * PAGES as u64,
            })
            .collect();
        t.extend((0..10).map(|_| Ev::Tick));
        t
    }

    #[test]
    fn sparse_memory_bloats_under_greedy_policies_only() {
        let frames = 64 * PAGES as u64;
        let l = run(Policy::Linux, frames, sparse());
        assert_eq!(l.huge_faults, 16);
        assert_eq!(l.samples.last().unwrap().bloat, 511.0);
        let f = run(Policy::FreeBsd, frames, sparse());
        // Reservations hold whole blocks, though nothing is promoted.
        assert_eq!(f.promotions, 0);
        assert_eq!(f.samples.last().unwrap().bloat, 511.0);
        let i = run(Policy::Ingens, frames, sparse());
        assert_eq!(i.promotions, 0);
        assert_eq!(i.samples.last().unwrap().bloat, 0.0);
    }

    fn fill(pid: u32, region: u64, pages: u64) -> impl Iterator<Item = Ev> {
        (0..pages).map(move |k| Ev::Touch {
            pid,
            page: region * PAGES as u64 + k,
        })
    }

    #[test]
    fn ingens_promotes_at_the_threshold_and_freebsd_only_when_full() {
        let frames = 64 * PAGES as u64;
        let mut t: Vec<Ev> = fill(1, 0, 460)
            .chain(fill(1, 1, 461))
            .chain(fill(1, 2, 512))
            .collect();
        t.push(Ev::Tick);
        let i = run(Policy::Ingens, frames, t.clone());
        assert_eq!(i.promotions, 2);
        assert_eq!(i.samples[0].huge, vec![(1, 2)]);
        // 51 zero-filled pages in region 1: 51 / 1433.
        assert!((i.samples[0].bloat - 51.0 / 1433.0).abs() < 1e-9);
        let f = run(Policy::FreeBsd, frames, t);
        assert_eq!(f.promotions, 1);
    }

    #[test]
    fn linux_demotes_at_once_and_ingens_defers() {
        let frames = 64 * PAGES as u64;
        let mut t: Vec<Ev> = fill(1, 0, 512).collect();
        t.push(Ev::Tick);
        // 10 pages freed: 98% used.
        t.push(Ev::Free {
            pid: 1,
            page: 0,
            pages: 10,
        });
        t.push(Ev::Tick);
        let l = run(Policy::Linux, frames, t.clone());
        assert_eq!((l.huge_faults, l.demotions), (1, 1));
        // khugepaged collapses it again at the next scan (max_ptes_none = 511).
        assert_eq!(l.samples[1].huge, vec![(1, 1)]);
        let i = run(Policy::Ingens, frames, t.clone());
        assert_eq!((i.promotions, i.demotions), (1, 0));
        // Freed down to 40%: under the threshold, demoted and given back.
        t.push(Ev::Free {
            pid: 1,
            page: 10,
            pages: 297,
        });
        t.push(Ev::Tick);
        let i = run(Policy::Ingens, frames, t);
        assert_eq!(i.demotions, 1);
        assert_eq!(i.samples.last().unwrap().bloat, 0.0);
        assert_eq!(i.samples.last().unwrap().huge, vec![(1, 0)]);
    }

    #[test]
    fn the_redis_experiment_bloats_linux_not_ingens() {
        // 4,096 objects of 8 KiB (32 MiB), 70% deleted, all their pages given back.
        let t = redis_trace(4096, 256, 1.0, 40, 7);
        let frames = 64 * PAGES as u64;
        let l = run(Policy::Linux, frames, t.clone());
        let i = run(Policy::Ingens, frames, t);
        let (lb, ib) = (
            l.samples.last().unwrap().bloat,
            i.samples.last().unwrap().bloat,
        );
        // About 30% of each region stays: Linux collapses them all again (bloat near
        // 1/0.3 − 1), Ingens demotes them and gives the holes back.
        assert!(lb > 2.0, "{lb}");
        assert!(ib < 0.01, "{ib}");
    }

    #[test]
    fn scarce_huge_pages_go_to_the_first_process_under_linux_and_evenly_under_ingens() {
        let l = fairness(Policy::Linux, 8, 7, 16, 5);
        assert_eq!(l.samples.last().unwrap().huge, vec![(1, 7), (2, 1), (9, 0)]);
        let i = fairness(Policy::Ingens, 8, 7, 16, 5);
        assert_eq!(i.samples.last().unwrap().huge, vec![(1, 4), (2, 4), (9, 0)]);
        assert!(i.samples.last().unwrap().objective < l.samples.last().unwrap().objective);
    }
}
