//! Traces of real processes for the simulator (`cairn hugepaged record`, then
//! `cairn hugepaged simulate --trace FILE`): at every interval, the daemon's own scanner
//! reads which base pages of each 2 MiB region are present and whether the region was
//! accessed; [`events`] turns the differences between intervals into the simulator's
//! [`Ev`]s (pages that appeared: touches; pages that went: frees; accessed regions: a
//! touch of a present page), one `Tick` per interval.
//!
//! The file holds one JSON [`Interval`] per line.

use crate::scan::{self, Proc};
use crate::sim::Ev;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::time::Instant;

/// One region as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionSnap {
    pub start: u64,
    /// Present base pages (bit `i % 64` of word `i / 64`).
    pub bits: [u64; 8],
    pub accessed: bool,
}

/// One process at one interval (regions with no page present left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcSnap {
    pub pid: u32,
    pub regions: Vec<RegionSnap>,
}

/// One interval: seconds since recording started, and each process still there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub t: f64,
    pub procs: Vec<ProcSnap>,
}

/// Records processes with the daemon's scanner.
pub struct Recorder {
    procs: BTreeMap<u32, Proc>,
    access: bool,
    started: Instant,
    /// Processes that went away, and why.
    pub gone: Vec<String>,
}

impl Recorder {
    /// Watch `pids` (an error if one cannot be watched); `access`: track accesses with
    /// `clear_refs` + `Referenced`.
    pub fn new(pids: &[u32], access: bool) -> io::Result<Recorder> {
        let procs = pids
            .iter()
            .map(|&p| Ok((p, Proc::open(p)?)))
            .collect::<io::Result<_>>()?;
        Ok(Recorder {
            procs,
            access,
            started: Instant::now(),
            gone: Vec::new(),
        })
    }

    /// Whether every recorded process has gone.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// This interval's snapshot (a process that exited is dropped and named in `gone`).
    pub fn snapshot(&mut self) -> Interval {
        let t = self.started.elapsed().as_secs_f64();
        let mut procs = Vec::new();
        let mut gone = Vec::new();
        for (&pid, p) in &self.procs {
            match snap(p, self.access) {
                Ok(regions) => procs.push(ProcSnap { pid, regions }),
                Err(e) => gone.push((pid, e.to_string())),
            }
        }
        for (pid, why) in gone {
            self.procs.remove(&pid);
            self.gone.push(why);
        }
        Interval { t, procs }
    }
}

fn snap(p: &Proc, access: bool) -> io::Result<Vec<RegionSnap>> {
    let vmas = p.vmas()?;
    let touched = if access {
        let r = p.referenced()?;
        p.clear_refs()?;
        r
    } else {
        Vec::new()
    };
    Ok(p.scan(&vmas)?
        .into_iter()
        .filter(|s| s.present > 0)
        .map(|s| RegionSnap {
            start: s.start,
            bits: s.bits,
            accessed: access && scan::accessed(&touched, s.start),
        })
        .collect())
}

/// Parse a trace file's text (one [`Interval`] per line).
pub fn parse(text: &str) -> Result<Vec<Interval>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// The simulator's events for a recorded trace: per interval and process, a touch of
/// every page that appeared, a free of every run of pages that went, a touch of one
/// present page of every accessed region that gained none; then a `Tick`. A page is
/// numbered by its address (address / 4096), so 2 MiB regions stay regions.
pub fn events(trace: &[Interval]) -> Vec<Ev> {
    let mut before: BTreeMap<(u32, u64), [u64; 8]> = BTreeMap::new();
    let mut ev = Vec::new();
    for iv in trace {
        let mut now: BTreeMap<(u32, u64), [u64; 8]> = BTreeMap::new();
        for p in &iv.procs {
            for r in &p.regions {
                let old = before.get(&(p.pid, r.start)).copied().unwrap_or([0; 8]);
                diff(p.pid, r.start, &old, &r.bits, r.accessed, &mut ev);
                now.insert((p.pid, r.start), r.bits);
            }
        }
        // Regions that emptied (or whose process exited) free what they had.
        for (&(pid, start), old) in &before {
            if !now.contains_key(&(pid, start)) {
                diff(pid, start, old, &[0; 8], false, &mut ev);
            }
        }
        before = now;
        ev.push(Ev::Tick);
    }
    ev
}

fn diff(pid: u32, start: u64, old: &[u64; 8], new: &[u64; 8], accessed: bool, ev: &mut Vec<Ev>) {
    let first = start / 4096;
    let bit = |b: &[u64; 8], i: usize| b[i / 64] >> (i % 64) & 1 == 1;
    let mut gained = false;
    let mut run: Option<(u64, u64)> = None;
    for i in 0..512usize {
        let (was, is) = (bit(old, i), bit(new, i));
        if is && !was {
            ev.push(Ev::Touch {
                pid,
                page: first + i as u64,
            });
            gained = true;
        }
        if was && !is {
            run = Some(run.map_or((first + i as u64, 1), |(p, n)| (p, n + 1)));
        } else if let Some((page, pages)) = run.take() {
            ev.push(Ev::Free { pid, page, pages });
        }
    }
    if let Some((page, pages)) = run {
        ev.push(Ev::Free { pid, page, pages });
    }
    if accessed && !gained {
        if let Some(i) = (0..512).find(|&i| bit(new, i)) {
            ev.push(Ev::Touch {
                pid,
                page: first + i as u64,
            });
        }
    }
}

/// The most base pages the trace's processes held at once.
pub fn peak_pages(trace: &[Interval]) -> u64 {
    trace
        .iter()
        .map(|iv| {
            iv.procs
                .iter()
                .flat_map(|p| &p.regions)
                .map(|r| r.bits.iter().map(|w| w.count_ones() as u64).sum::<u64>())
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(start: u64, pages: std::ops::Range<usize>, accessed: bool) -> RegionSnap {
        let mut bits = [0u64; 8];
        for i in pages {
            bits[i / 64] |= 1 << (i % 64);
        }
        RegionSnap {
            start,
            bits,
            accessed,
        }
    }

    #[test]
    fn differences_become_touches_frees_and_ticks() {
        const R: u64 = 2 << 20;
        let trace = vec![
            Interval {
                t: 0.0,
                procs: vec![ProcSnap {
                    pid: 7,
                    regions: vec![region(R, 0..3, true)],
                }],
            },
            Interval {
                t: 1.0,
                procs: vec![ProcSnap {
                    pid: 7,
                    // Page 1 freed, page 5 new, and an accessed region with nothing new.
                    regions: vec![region(R, 0..1, false), region(2 * R, 4..6, false)],
                }],
            },
            Interval {
                t: 2.0,
                procs: vec![ProcSnap {
                    pid: 7,
                    regions: vec![region(2 * R, 4..6, true)],
                }],
            },
        ];
        let p = 512; // first page of region R
        let e = events(&trace);
        let touch = |page| Ev::Touch { pid: 7, page };
        assert_eq!(
            e,
            vec![
                touch(p),
                touch(p + 1),
                touch(p + 2),
                Ev::Tick,
                Ev::Free {
                    pid: 7,
                    page: p + 1,
                    pages: 2
                },
                touch(2 * p + 4),
                touch(2 * p + 5),
                Ev::Tick,
                // Region R emptied; region 2R accessed: a touch of a present page.
                touch(2 * p + 4),
                Ev::Free {
                    pid: 7,
                    page: p,
                    pages: 1
                },
                Ev::Tick,
            ]
        );
        assert_eq!(peak_pages(&trace), 3);
        let text: String = trace
            .iter()
            .map(|i| serde_json::to_string(i).unwrap() + "\n")
            .collect();
        assert_eq!(parse(&text).unwrap(), trace);
        assert!(parse("{\"t\":1}\n").unwrap_err().starts_with("line 1:"));
    }
}
