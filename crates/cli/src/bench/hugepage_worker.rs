//! The process `cairn bench hugepage` measures TLB-bound speed in (`cairn bench
//! hugepage-worker`): it fills `--mib` of anonymous memory (a `Vec`, which glibc maps
//! with `mmap`: ordinary memory, as a program has it), says `ready` on stdout and waits
//! for a line on stdin; then, for `--seconds` each, it follows a chain of dependent
//! loads through the memory and makes random updates to it (GUPS), and prints what it
//! measured as one JSON line. With `--seconds 0` it only holds the memory until stdin
//! gives a line or closes (the fairness run's processes).

use super::Rng;
use crate::error::{CliError, CliResult};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::time::Instant;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Memory to fill, MiB (rounded down to a power of two)
    #[arg(long, default_value_t = 4096)]
    pub mib: u64,
    /// Seconds of each measurement (0: hold the memory only)
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
}

/// What the worker measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    /// Nanoseconds per load of the dependent chain.
    pub chase_ns: f64,
    /// Random 8-byte updates per second.
    pub gups_per_sec: f64,
    /// Its `AnonHugePages` when it started measuring.
    pub huge_bytes: u64,
    /// Whether its memory is marked `MADV_HUGEPAGE` (what greedy huge pages do).
    pub advised: bool,
    /// The machine's huge-page faults that fell back to base pages while it filled its
    /// memory (`/proc/vmstat` `thp_fault_fallback`: every process's, so only a sign).
    pub fault_fallbacks: u64,
}

/// Words per 64-byte line: the chain visits one line per load.
const LINE: usize = 8;

/// The chain's next line after line `i` of `lines` (a power of two): a full-period
/// linear congruential step, so that the chain visits every line once per cycle in an
/// order no prefetcher follows.
fn next_line(i: u64, lines: u64) -> u64 {
    i.wrapping_mul(0x5851_f42d_4c95_7f2d)
        .wrapping_add(0x1405_7b7e_f767_814f)
        & (lines - 1)
}

/// Run `f` in rounds until `secs` have passed; the number of rounds run.
fn for_seconds(secs: f64, mut f: impl FnMut()) -> (u64, f64) {
    let t = Instant::now();
    let mut rounds = 0u64;
    loop {
        f();
        rounds += 1;
        let e = t.elapsed().as_secs_f64();
        if e >= secs {
            return (rounds, e);
        }
    }
}

pub fn worker(a: &WorkerArgs) -> CliResult {
    let mib = a.mib.max(2);
    let bytes = 1u64 << (63 - (mib << 20).leading_zeros());
    let words = (bytes / 8) as usize;
    let lines = (words / LINE) as u64;
    let fallbacks = || cairn_media::huge::vmstat("thp_fault_fallback").unwrap_or(0);
    let fallbacks_before = fallbacks();
    let mut t = vec![0u64; words];
    // Every line holds the index of the chain's next line (and so every page is
    // touched, as a program that filled its memory).
    for i in 0..lines {
        t[i as usize * LINE] = next_line(i, lines);
    }
    let fault_fallbacks = fallbacks().saturating_sub(fallbacks_before);
    let advised =
        cairn_media::huge::huge_advised(0, t.as_ptr() as usize + t.len() * 4)?.unwrap_or(false);
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if a.seconds <= 0.0 || line.is_empty() {
        std::hint::black_box(&t);
        return Ok(());
    }
    let huge_bytes = super::proc_kb(0, "smaps_rollup", "AnonHugePages")?;
    const STEPS: u64 = 1 << 16;
    let mut at = 0u64;
    let (rounds, secs) = for_seconds(a.seconds, || {
        for _ in 0..STEPS {
            at = t[at as usize * LINE];
        }
    });
    std::hint::black_box(at);
    let chase_ns = secs * 1e9 / (rounds * STEPS) as f64;
    let mask = words as u64 - 1;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (rounds, secs) = for_seconds(a.seconds, || {
        for _ in 0..STEPS {
            let r = rng.next();
            t[(r & mask) as usize] ^= r;
        }
    });
    std::hint::black_box(&t);
    let m = Measured {
        chase_ns,
        gups_per_sec: (rounds * STEPS) as f64 / secs,
        huge_bytes,
        advised,
        fault_fallbacks,
    };
    writeln!(
        out,
        "{}",
        serde_json::to_string(&m).map_err(|e| CliError::new(e.to_string()))?
    )?;
    Ok(())
}
