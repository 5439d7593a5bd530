//! Ingens' policy, as pure code: the 8-bit access history and its moving average
//! (hot pages), utilization-based promotion (a region is promoted only when it is well
//! populated, hottest first), and share-proportional fairness with an idleness penalty
//! (`M = S / (H·(f + τ(1 − f)))`, the objective `O = Σ (M_i − M̄)²`).
//! `../shared/reference/ingens.md` §2.

use serde::Serialize;

/// Bytes of a huge page (x86-64 PMD).
pub const HUGE: u64 = 2 << 20;
/// Base pages in a huge page.
pub const PAGES: u32 = 512;

/// Ingens' access history of a page or region: the last eight scan intervals (bit 0 the
/// latest: accessed or not) and their exponential moving average
/// `F_t = α·popcount(history) + (1 − α)·F_{t−1}` (eq. 3.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct History {
    pub bits: u8,
    pub ema: f64,
}

impl History {
    /// α of the moving average.
    pub const ALPHA: f64 = 0.4;
    /// A history at or above this average is hot (3/4 of the eight bits).
    pub const HOT: f64 = 6.0;

    /// One scan interval: accessed in it or not.
    pub fn observe(&mut self, accessed: bool) {
        self.bits = (self.bits << 1) | u8::from(accessed);
        self.ema = Self::ALPHA * self.bits.count_ones() as f64 + (1.0 - Self::ALPHA) * self.ema;
    }

    /// Frequently accessed.
    pub fn hot(&self) -> bool {
        self.ema >= Self::HOT
    }

    /// Not accessed for the whole history.
    pub fn idle(&self) -> bool {
        !self.hot()
    }
}

/// One 2 MiB-aligned region of a process's anonymous memory, as a scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Region {
    /// Virtual address (2 MiB aligned).
    pub start: u64,
    /// Base pages present (0..=512).
    pub present: u32,
    /// Mapped by a huge page already.
    pub huge: bool,
    pub history: History,
}

/// The base pages a region needs present before it is promoted, at `threshold` (a
/// fraction): Ingens' `weight ≥ threshold·512`, rounded up (at 0.9: 461).
pub fn needed_pages(threshold: f64) -> u32 {
    ((threshold * PAGES as f64).ceil() as u32).clamp(1, PAGES)
}

/// The regions worth promoting: not huge yet, at least `threshold` populated (a sparser
/// one would have its holes zero-filled by the kernel: bloat), hottest first, then the
/// fullest, then by address.
pub fn candidates(regions: &[Region], threshold: f64) -> Vec<usize> {
    let need = needed_pages(threshold);
    let mut v: Vec<usize> = (0..regions.len())
        .filter(|&i| !regions[i].huge && regions[i].present >= need)
        .collect();
    v.sort_by(|&a, &b| {
        let (x, y) = (&regions[a], &regions[b]);
        y.history
            .ema
            .total_cmp(&x.history.ema)
            .then(y.present.cmp(&x.present))
            .then(x.start.cmp(&y.start))
    });
    v
}

/// Ingens' promotion metric (eq. 3.2): a process's claim to the next huge page. `share`:
/// its priority S; `huge_bytes`: H, the memory huge pages back for it; `idle`: f, the
/// fraction of its huge pages that are idle; `tau`: τ in (0, 1], the idleness penalty
/// (1: ignored). A process with no huge page has an infinite claim.
pub fn metric(share: f64, huge_bytes: u64, idle: f64, tau: f64) -> f64 {
    if huge_bytes == 0 {
        return f64::INFINITY;
    }
    let f = idle.clamp(0.0, 1.0);
    share / (huge_bytes as f64 * (f + tau * (1.0 - f)))
}

/// Ingens' fairness objective (eq. 3.3): the spread of the metrics, `Σ (M_i − M̄)²`
/// over the processes with a finite metric, relative to `M̄²` so that it does not depend
/// on the unit of H (0: perfectly fair). Processes with no huge page yet count as
/// unserved: the objective is infinite while one of them has candidates.
pub fn objective(metrics: &[f64]) -> f64 {
    if metrics.iter().any(|m| m.is_infinite()) {
        return f64::INFINITY;
    }
    if metrics.len() < 2 {
        return 0.0;
    }
    let mean = metrics.iter().sum::<f64>() / metrics.len() as f64;
    if mean == 0.0 {
        return 0.0;
    }
    metrics.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (mean * mean)
}

/// What the chooser knows of a watched process.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub pid: u32,
    pub share: f64,
    pub huge_bytes: u64,
    /// Fraction of its huge pages that are idle.
    pub idle: f64,
    /// Regions it could have promoted now (a process that gains nothing, all its
    /// regions huge or refused, has none and is passed over).
    pub candidates: usize,
}

/// The process to serve next (Ingens' fair promotion): the largest metric among those
/// with candidates; ties to the lower pid.
pub fn choose(claims: &[Claim], tau: f64) -> Option<u32> {
    claims
        .iter()
        .filter(|c| c.candidates > 0)
        .map(|c| (metric(c.share, c.huge_bytes, c.idle, tau), c.pid))
        .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, pid)| pid)
}

/// A rate budget (a token bucket): `rate` units per second, at most `burst` saved up.
#[derive(Debug, Clone)]
pub struct Budget {
    pub rate: f64,
    pub burst: f64,
    tokens: f64,
    last: f64,
}

impl Budget {
    pub fn new(rate: f64, burst: f64) -> Budget {
        Budget {
            rate,
            burst,
            tokens: burst,
            last: 0.0,
        }
    }

    /// Take `n` units at time `now` (s) if the budget has them.
    pub fn take(&mut self, n: f64, now: f64) -> bool {
        self.tokens = (self.tokens + (now - self.last).max(0.0) * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }
}

/// The daemon's CPU budget: `fraction` of a core on average, with at most `burst` CPU
/// seconds saved up; what it used beyond is owed, and nothing is promoted until it is
/// paid back.
#[derive(Debug, Clone)]
pub struct CpuBudget {
    pub fraction: f64,
    pub burst: f64,
    tokens: f64,
    last_now: f64,
    last_cpu: f64,
}

impl CpuBudget {
    pub fn new(fraction: f64, burst: f64) -> CpuBudget {
        CpuBudget {
            fraction,
            burst,
            tokens: burst,
            last_now: 0.0,
            last_cpu: 0.0,
        }
    }

    /// Account the CPU time used up to `cpu` (cumulative seconds) at time `now` (s);
    /// whether some budget is left.
    pub fn allows(&mut self, cpu: f64, now: f64) -> bool {
        let earned = (now - self.last_now).max(0.0) * self.fraction;
        self.tokens = (self.tokens + earned).min(self.burst) - (cpu - self.last_cpu).max(0.0);
        self.last_now = now;
        self.last_cpu = cpu;
        self.tokens > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_budget_owes_what_it_overspent() {
        let mut b = CpuBudget::new(0.5, 2.0);
        assert!(b.allows(0.0, 0.0));
        // Three CPU seconds in one: a second owed.
        assert!(!b.allows(3.0, 1.0));
        // Paid back at half a second per second: even at 3 s, positive at 3.5 s.
        assert!(!b.allows(3.0, 3.0));
        assert!(b.allows(3.0, 3.5));
        // Saving up stops at the burst.
        assert!(b.allows(3.0, 100.0));
        assert!(!b.allows(5.1, 100.0));
    }

    #[test]
    fn a_page_turns_hot_after_eight_busy_intervals_and_cold_after_four_idle() {
        // The reference notes' worked example (α = 0.4).
        let mut h = History::default();
        let mut hot_at = None;
        for i in 1..=10 {
            h.observe(true);
            if h.hot() && hot_at.is_none() {
                hot_at = Some(i);
            }
        }
        assert_eq!(hot_at, Some(8));
        let mut h = History {
            bits: 0xff,
            ema: 8.0,
        };
        let mut cold_at = None;
        for i in 1..=6 {
            h.observe(false);
            if !h.hot() && cold_at.is_none() {
                cold_at = Some(i);
            }
        }
        assert_eq!(cold_at, Some(4));
    }

    fn region(start: u64, present: u32, huge: bool, ema: f64) -> Region {
        Region {
            start,
            present,
            huge,
            history: History { bits: 0, ema },
        }
    }

    #[test]
    fn only_well_populated_regions_are_candidates_hottest_first() {
        assert_eq!(needed_pages(0.9), 461);
        assert_eq!(needed_pages(1.0), 512);
        assert_eq!(needed_pages(0.0), 1);
        let r = [
            region(0, 512, false, 1.0),
            region(HUGE, 460, false, 8.0), // under 90%: never
            region(2 * HUGE, 461, false, 7.0),
            region(3 * HUGE, 512, true, 8.0), // huge already
            region(4 * HUGE, 500, false, 7.0),
        ];
        assert_eq!(candidates(&r, 0.9), vec![4, 2, 0]);
        assert_eq!(candidates(&r, 0.5), vec![1, 4, 2, 0]);
    }

    #[test]
    fn the_metric_favours_fewer_and_busier_huge_pages() {
        let tau = 0.5;
        assert!(metric(10_000.0, 0, 0.0, tau).is_infinite());
        // Same share: fewer huge pages, higher claim.
        assert!(metric(1.0, HUGE, 0.0, tau) > metric(1.0, 2 * HUGE, 0.0, tau));
        // Same share and H: the idler one has the lower claim.
        assert!(metric(1.0, HUGE, 0.0, tau) > metric(1.0, HUGE, 1.0, tau));
        // τ = 1 ignores idleness.
        assert_eq!(metric(1.0, HUGE, 0.0, 1.0), metric(1.0, HUGE, 1.0, 1.0));
        // Twice the share, twice the claim.
        assert_eq!(
            metric(2.0, HUGE, 0.3, tau),
            2.0 * metric(1.0, HUGE, 0.3, tau)
        );
    }

    #[test]
    fn fair_promotion_converges_to_shares() {
        // Two processes with equal shares and plenty of candidates, and one with twice
        // the share; promotions one region at a time by the rule.
        let mut c = vec![
            Claim {
                pid: 1,
                share: 1.0,
                huge_bytes: 0,
                idle: 0.0,
                candidates: 1000,
            },
            Claim {
                pid: 2,
                share: 1.0,
                huge_bytes: 0,
                idle: 0.0,
                candidates: 1000,
            },
            Claim {
                pid: 3,
                share: 2.0,
                huge_bytes: 0,
                idle: 0.0,
                candidates: 1000,
            },
        ];
        for _ in 0..400 {
            let pid = choose(&c, 0.5).unwrap();
            let p = c.iter_mut().find(|x| x.pid == pid).unwrap();
            p.huge_bytes += HUGE;
            p.candidates -= 1;
        }
        let h: Vec<u64> = c.iter().map(|x| x.huge_bytes / HUGE).collect();
        assert_eq!(h, vec![100, 100, 200]);
        let m: Vec<f64> = c
            .iter()
            .map(|x| metric(x.share, x.huge_bytes, x.idle, 0.5))
            .collect();
        assert!(objective(&m) < 1e-9, "{m:?}");
    }

    #[test]
    fn idle_processes_wait() {
        let mut a = Claim {
            pid: 1,
            share: 1.0,
            huge_bytes: 10 * HUGE,
            idle: 1.0,
            candidates: 5,
        };
        let b = Claim {
            pid: 2,
            huge_bytes: 10 * HUGE,
            idle: 0.0,
            ..a.clone()
        };
        // Equal H: the busy one first (τ < 1), and both alike without the penalty.
        assert_eq!(choose(&[a.clone(), b.clone()], 0.25), Some(2));
        assert_eq!(choose(&[a.clone(), b.clone()], 1.0), Some(1));
        // One without candidates is passed over; none: nothing to choose.
        let b0 = Claim {
            candidates: 0,
            ..b.clone()
        };
        assert_eq!(choose(&[a.clone(), b0.clone()], 0.25), Some(1));
        a.candidates = 0;
        assert_eq!(choose(&[a, b0], 0.25), None);
    }

    #[test]
    fn the_objective_is_zero_when_fair() {
        assert_eq!(objective(&[]), 0.0);
        assert_eq!(objective(&[3.0, 3.0, 3.0]), 0.0);
        assert!(objective(&[1.0, 3.0]) > 0.0);
        assert!(objective(&[1.0, f64::INFINITY]).is_infinite());
        // Unit-free.
        assert!((objective(&[1.0, 3.0]) - objective(&[10.0, 30.0])).abs() < 1e-12);
    }

    #[test]
    fn the_budget_refills_at_its_rate() {
        let mut b = Budget::new(10.0, 20.0);
        assert!(b.take(20.0, 0.0));
        assert!(!b.take(1.0, 0.0));
        assert!(b.take(5.0, 0.5));
        assert!(!b.take(1.0, 0.5));
        // Never more than the burst saved up.
        assert!(!b.take(21.0, 100.0));
        assert!(b.take(20.0, 100.0));
    }
}
