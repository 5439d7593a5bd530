//! `cairn hugepaged`'s work, one interval at a time ([`Daemon::step`]): find the
//! watched processes, read each one's regions and accesses, then promote, fairly and
//! within the budget, the regions that are well populated, hottest first.

use crate::fmfi;
use crate::policy::{self, Budget, Claim, CpuBudget, History, Region, HUGE, PAGES};
use crate::scan::{Proc, Vma};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;
use std::time::Instant;

/// Which processes to watch.
#[derive(Debug, Clone)]
pub enum Targets {
    Pids(Vec<u32>),
    /// The processes of a cgroup (its `cgroup.procs`, read every interval).
    Cgroup(PathBuf),
    /// Every process with anonymous memory (but the daemon).
    All,
}

/// How the daemon behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// Promote a region once this fraction of its base pages is present (Ingens: 0.9).
    pub threshold: f64,
    /// Promotions per second at most, in MiB (a token bucket; the kernel copies each
    /// region in the daemon's context: 3–4 ms of its CPU per 2 MiB on this VM).
    pub rate_mib: f64,
    /// The daemon's CPU use at most, as a fraction of one core on average (its scans
    /// and the kernel's copies count; promotions wait while it is over).
    pub cpu: f64,
    /// τ of the promotion metric (idleness penalty; 1: none).
    pub tau: f64,
    /// Share of each process; one not listed gets its cgroup's ([`crate::cgroup`]),
    /// else `default_share`.
    pub shares: HashMap<u32, f64>,
    pub default_share: f64,
    /// A region the kernel refused to collapse is not tried again for this long (s): a
    /// process all of whose regions were refused gains nothing and waits as long.
    pub skip_secs: f64,
    /// Track accesses (`clear_refs` + `smaps`), for hotness and idleness.
    pub access: bool,
    /// Decide, report, but do not promote.
    pub dry_run: bool,
    /// Ask the kernel to compact memory when the fragmentation index passes 0.8 (at
    /// most once per `compact_every` s); off unless asked for.
    pub compact: bool,
    pub compact_every: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            threshold: 0.9,
            rate_mib: 256.0,
            cpu: 0.5,
            tau: 0.5,
            shares: HashMap::new(),
            default_share: 10_000.0,
            skip_secs: 120.0,
            access: true,
            dry_run: false,
            compact: false,
            compact_every: 5.0,
        }
    }
}

/// One watched process's state.
struct Watched {
    proc: Proc,
    /// Per region start: its access history.
    history: HashMap<u64, History>,
    regions: Vec<Region>,
    huge_bytes: u64,
    promotions: u64,
    failures: u64,
    /// Regions the kernel refused to collapse (by start), and until when they are left
    /// alone.
    refused: HashMap<u64, f64>,
    /// The share its cgroup's CPU weight gives it (read every interval).
    cgroup_share: Option<f64>,
    last_error: Option<String>,
}

/// What `cairn hugepaged status` shows of a process.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ProcStatus {
    pub pid: u32,
    pub share: f64,
    /// Regions by utilization: `[0]` under 10% of their base pages present, …, `[9]`
    /// 90% and more (not huge), and `[10]` huge already.
    pub regions: [u64; 11],
    pub huge_bytes: u64,
    /// Regions at the threshold, not huge yet (those the kernel refused lately left
    /// out): what waits for the budget.
    pub waiting: u64,
    pub promotions: u64,
    pub failures: u64,
    /// Fraction of its huge regions that are idle.
    pub idle: f64,
    /// Its promotion metric relative to the mean of the watched processes' finite ones
    /// (1: its fair share; `null` before its first huge page).
    pub fairness: Option<f64>,
    pub last_error: Option<String>,
}

/// The daemon's state as `status` shows it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Default)]
pub struct Status {
    pub pid: u32,
    pub intervals: u64,
    pub uptime_secs: f64,
    /// CPU time the daemon used, and as a fraction of one core over its uptime.
    pub cpu_secs: f64,
    pub cpu_fraction: f64,
    /// Passes whose promotions stopped because the daemon was over its CPU budget.
    pub cpu_limited: u64,
    /// Anonymous memory watched (bytes of the regions scanned).
    pub watched_bytes: u64,
    pub fmfi: f64,
    pub compactions: u64,
    pub objective: f64,
    pub dry_run: bool,
    pub processes: Vec<ProcStatus>,
    /// Processes that went away or could not be watched, with the reason.
    pub dropped: Vec<String>,
}

pub struct Daemon {
    pub cfg: Config,
    targets: Targets,
    watched: BTreeMap<u32, Watched>,
    budget: Budget,
    cpu: CpuBudget,
    started: Instant,
    intervals: u64,
    compactions: u64,
    last_compact: f64,
    /// Passes that stopped promoting for the CPU budget.
    cpu_limited: u64,
    dropped: Vec<String>,
}

/// CPU seconds this process has used (user + system), from `/proc/self/stat`.
pub fn cpu_secs() -> f64 {
    stat_cpu_secs("/proc/self/stat")
}

/// CPU seconds the calling thread has used (the daemon's budget counts its own work,
/// not that of other threads of a program that embeds it).
fn thread_cpu_secs() -> f64 {
    stat_cpu_secs("/proc/thread-self/stat")
}

fn stat_cpu_secs(path: &str) -> f64 {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    // After the command name's closing parenthesis: fields 3.. ; utime and stime are
    // fields 14 and 15, in clock ticks (100 per second on Linux).
    let rest = s.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

impl Daemon {
    pub fn new(cfg: Config, targets: Targets) -> Daemon {
        let budget = Budget::new(cfg.rate_mib, cfg.rate_mib.max(2.0));
        // Up to four seconds' worth saved (two default intervals).
        let cpu = CpuBudget::new(cfg.cpu, cfg.cpu * 4.0);
        Daemon {
            cfg,
            targets,
            watched: BTreeMap::new(),
            budget,
            cpu,
            started: Instant::now(),
            intervals: 0,
            compactions: 0,
            last_compact: f64::NEG_INFINITY,
            cpu_limited: 0,
            dropped: Vec::new(),
        }
    }

    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn drop_proc(&mut self, pid: u32, why: String) {
        self.watched.remove(&pid);
        if self.dropped.len() >= 64 {
            self.dropped.remove(0);
        }
        self.dropped.push(why);
    }

    /// The pids to watch now.
    fn target_pids(&self) -> io::Result<Vec<u32>> {
        let me = std::process::id();
        Ok(match &self.targets {
            Targets::Pids(p) => p.clone(),
            Targets::Cgroup(dir) => std::fs::read_to_string(dir.join("cgroup.procs"))
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("{}: {e}", dir.join("cgroup.procs").display()),
                    )
                })?
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .filter(|&p| p != me)
                .collect(),
            Targets::All => std::fs::read_dir("/proc")?
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|&p| p != me)
                .collect(),
        })
    }

    /// One interval: refresh the set of processes, scan each, promote.
    pub fn step(&mut self) -> io::Result<()> {
        self.intervals += 1;
        let pids = self.target_pids()?;
        // Processes gone from the targets, or exited.
        let gone: Vec<u32> = self
            .watched
            .keys()
            .copied()
            .filter(|p| !pids.contains(p))
            .collect();
        for p in gone {
            self.drop_proc(p, format!("process {p}: no longer a target (it exited)"));
        }
        for &p in &pids {
            if self.watched.contains_key(&p) {
                continue;
            }
            match Proc::open(p) {
                Ok(proc) => {
                    self.watched.insert(
                        p,
                        Watched {
                            proc,
                            history: HashMap::new(),
                            regions: Vec::new(),
                            huge_bytes: 0,
                            promotions: 0,
                            failures: 0,
                            refused: HashMap::new(),
                            cgroup_share: None,
                            last_error: None,
                        },
                    );
                }
                // With --all, kernel threads and processes that exit meanwhile are not
                // worth a line each.
                Err(e) if !matches!(self.targets, Targets::All) => {
                    let why = e.to_string();
                    if !self.dropped.contains(&why) {
                        self.drop_proc(p, why);
                    }
                }
                Err(_) => {}
            }
        }
        let pids: Vec<u32> = self.watched.keys().copied().collect();
        for p in pids {
            let mut r = self.scan(p);
            if r.is_err() && self.reopen_after_exec(p) {
                r = self.scan(p);
            }
            if let Err(e) = r {
                self.drop_proc(p, e.to_string());
            }
        }
        self.maybe_compact();
        self.promote();
        Ok(())
    }

    /// Process `p`'s `pagemap` was opened on the address space it had then; after an
    /// `exec` it reads nothing. Open the new one (forgetting what was known of the old
    /// image) and say so; false if the process cannot be opened (it exited).
    fn reopen_after_exec(&mut self, p: u32) -> bool {
        let Ok(proc) = Proc::open(p) else {
            return false;
        };
        let w = self.watched.get_mut(&p).expect("watched");
        w.proc = proc;
        w.history.clear();
        w.refused.clear();
        w.regions.clear();
        w.last_error = Some(format!(
            "process {p}: a new address space (exec): watched anew"
        ));
        true
    }

    /// Read process `p`'s regions and accesses.
    fn scan(&mut self, p: u32) -> io::Result<()> {
        let access = self.cfg.access;
        let w = self.watched.get_mut(&p).expect("watched");
        let vmas: Vec<Vma> = w.proc.vmas()?;
        w.cgroup_share = crate::cgroup::share(p);
        let touched: Vec<(u64, u64, u64)> = if access {
            let r = w.proc.referenced()?;
            w.proc.clear_refs()?;
            r
        } else {
            Vec::new()
        };
        let seen = w.proc.scan(&vmas)?;
        w.huge_bytes = w.proc.huge_bytes()?;
        let mut history = HashMap::with_capacity(seen.len());
        w.regions = seen
            .iter()
            .map(|s| {
                let mut h = w.history.get(&s.start).copied().unwrap_or_default();
                if access {
                    h.observe(crate::scan::accessed(&touched, s.start));
                }
                history.insert(s.start, h);
                Region {
                    start: s.start,
                    present: s.present,
                    huge: s.huge,
                    history: h,
                }
            })
            .collect();
        w.history = history;
        Ok(())
    }

    fn idle(w: &Watched) -> f64 {
        let huge: Vec<&Region> = w.regions.iter().filter(|r| r.huge).collect();
        if huge.is_empty() {
            return 0.0;
        }
        huge.iter().filter(|r| r.history.idle()).count() as f64 / huge.len() as f64
    }

    fn share(&self, pid: u32) -> f64 {
        self.cfg
            .shares
            .get(&pid)
            .copied()
            .or_else(|| self.watched.get(&pid)?.cgroup_share)
            .unwrap_or(self.cfg.default_share)
    }

    fn maybe_compact(&mut self) {
        if !self.cfg.compact || self.cfg.dry_run {
            return;
        }
        let now = self.now();
        if now - self.last_compact < self.cfg.compact_every {
            return;
        }
        if fmfi::current().is_ok_and(|f| f > 0.8)
            && std::fs::write("/proc/sys/vm/compact_memory", "1").is_ok()
        {
            self.compactions += 1;
            self.last_compact = now;
        }
    }

    /// The starts of `w`'s regions to promote, best first: at the threshold, not huge,
    /// and not refused lately.
    fn waiting(w: &Watched, threshold: f64, now: f64) -> Vec<u64> {
        policy::candidates(&w.regions, threshold)
            .into_iter()
            .map(|i| w.regions[i].start)
            .filter(|s| w.refused.get(s).is_none_or(|&until| until <= now))
            .collect()
    }

    /// Promote while the budget lasts: each time the process with the largest claim,
    /// its best candidate.
    fn promote(&mut self) {
        let now = self.now();
        for w in self.watched.values_mut() {
            w.refused.retain(|_, until| *until > now);
        }
        let mut queues: HashMap<u32, Vec<u64>> = self
            .watched
            .iter()
            .map(|(&p, w)| {
                let mut c = Self::waiting(w, self.cfg.threshold, now);
                c.reverse();
                (p, c)
            })
            .collect();
        loop {
            let now = self.now();
            let claims: Vec<Claim> = self
                .watched
                .iter()
                .map(|(&p, w)| Claim {
                    pid: p,
                    share: self.share(p),
                    huge_bytes: w.huge_bytes,
                    idle: Self::idle(w),
                    candidates: queues.get(&p).map_or(0, Vec::len),
                })
                .collect();
            let Some(pid) = policy::choose(&claims, self.cfg.tau) else {
                break;
            };
            if !self.cpu.allows(thread_cpu_secs(), now) {
                self.cpu_limited += 1;
                break;
            }
            if !self.budget.take((HUGE >> 20) as f64, now) {
                break;
            }
            let start = queues
                .get_mut(&pid)
                .and_then(Vec::pop)
                .expect("a candidate");
            let w = self.watched.get_mut(&pid).expect("watched");
            let ok = if self.cfg.dry_run {
                true
            } else {
                match w.proc.collapse(start) {
                    Ok(()) => true,
                    Err(e) => {
                        w.failures += 1;
                        w.last_error = Some(e.to_string());
                        w.refused.insert(start, now + self.cfg.skip_secs);
                        false
                    }
                }
            };
            if ok {
                w.promotions += 1;
                w.huge_bytes += HUGE;
                if let Some(r) = w.regions.iter_mut().find(|r| r.start == start) {
                    r.huge = true;
                    r.present = PAGES;
                }
            }
        }
    }

    pub fn status(&self) -> Status {
        let tau = self.cfg.tau;
        let metrics: Vec<(u32, f64)> = self
            .watched
            .iter()
            .map(|(&p, w)| {
                (
                    p,
                    policy::metric(self.share(p), w.huge_bytes, Self::idle(w), tau),
                )
            })
            .collect();
        let finite: Vec<f64> = metrics
            .iter()
            .map(|m| m.1)
            .filter(|m| m.is_finite())
            .collect();
        let mean = if finite.is_empty() {
            0.0
        } else {
            finite.iter().sum::<f64>() / finite.len() as f64
        };
        let uptime = self.now();
        let cpu = cpu_secs();
        Status {
            pid: std::process::id(),
            intervals: self.intervals,
            uptime_secs: uptime,
            cpu_secs: cpu,
            cpu_fraction: if uptime > 0.0 { cpu / uptime } else { 0.0 },
            cpu_limited: self.cpu_limited,
            watched_bytes: self
                .watched
                .values()
                .map(|w| w.regions.len() as u64 * HUGE)
                .sum(),
            fmfi: fmfi::current().unwrap_or(0.0),
            compactions: self.compactions,
            objective: policy::objective(&finite),
            dry_run: self.cfg.dry_run,
            processes: self
                .watched
                .iter()
                .map(|(&p, w)| {
                    let mut regions = [0u64; 11];
                    for r in &w.regions {
                        let i = if r.huge {
                            10
                        } else {
                            (r.present as usize * 10 / PAGES as usize).min(9)
                        };
                        regions[i] += 1;
                    }
                    let m = metrics.iter().find(|x| x.0 == p).map_or(0.0, |x| x.1);
                    ProcStatus {
                        pid: p,
                        share: self.share(p),
                        regions,
                        huge_bytes: w.huge_bytes,
                        waiting: Self::waiting(w, self.cfg.threshold, uptime).len() as u64,
                        promotions: w.promotions,
                        failures: w.failures,
                        idle: Self::idle(w),
                        fairness: (m.is_finite() && mean > 0.0).then(|| m / mean),
                        last_error: w.last_error.clone(),
                    }
                })
                .collect(),
            dropped: self.dropped.clone(),
        }
    }
}
